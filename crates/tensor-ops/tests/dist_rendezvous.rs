//! The TCP rendezvous and liveness channel of `tensor_ops::dist`, with "ranks" as threads on
//! 127.0.0.1 (no GPU).

mod ports;

use std::net::TcpListener;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};
use tensor_ops::dist::{DistEnv, DistError, Liveness, Rendezvous, ID_BYTES};

const T: Duration = Duration::from_secs(5);

/// A free port for this file's tests: 20000 to 31999, 24 apart per process.
fn free_port() -> u16 {
    ports::free_port_in(20000, 12000, 24)
}

fn env(rank: usize, world: usize, port: u16) -> DistEnv {
    DistEnv::on_localhost(rank, world, port)
}

fn id() -> [u8; ID_BYTES] {
    std::array::from_fn(|i| (i * 7 + 3) as u8)
}

/// Runs `f(rank)` on one thread per rank (the peers first, rank 0 `delay` later) and returns
/// the results in rank order.
fn group<R: Send + 'static>(
    world: usize,
    delay: Duration,
    f: impl Fn(usize) -> R + Send + Sync + Clone + 'static,
) -> Vec<R> {
    let mut handles: Vec<_> = (1..world)
        .map(|r| {
            let f = f.clone();
            thread::spawn(move || f(r))
        })
        .collect();
    thread::sleep(delay);
    let f0 = f.clone();
    handles.insert(0, thread::spawn(move || f0(0)));
    handles
        .into_iter()
        .map(|h| h.join().expect("rank thread"))
        .collect()
}

fn full_round(world: usize) {
    let port = free_port();
    let out = group(world, Duration::from_millis(250), move |r| {
        let mut rv = Rendezvous::connect(&env(r, world, port), T)?;
        assert_eq!((rv.rank(), rv.world_size()), (r, world));
        let got = rv.broadcast_id((r == 0).then(id), T)?;
        let gathered = rv.all_gather_u64(10 * r as u64 + 1, T)?;
        rv.barrier(T)?;
        let again = rv.all_gather_u64(u64::MAX - r as u64, T)?;
        let (tx, rx) = mpsc::channel();
        let live = rv.watch(move |e| {
            let _ = tx.send(e);
        });
        Ok::<_, DistError>((got, gathered, again, live, rx))
    });
    let mut lives = Vec::new();
    for (r, o) in out.into_iter().enumerate() {
        let (got, gathered, again, live, rx) = o.unwrap_or_else(|e| panic!("rank {r}: {e}"));
        assert_eq!(got, id(), "rank {r}");
        let want: Vec<u64> = (0..world as u64).map(|q| 10 * q + 1).collect();
        assert_eq!(gathered, want, "rank {r}");
        let want: Vec<u64> = (0..world as u64).map(|q| u64::MAX - q).collect();
        assert_eq!(again, want, "rank {r}");
        lives.push((live, rx));
    }
    // Clean goodbyes, the peers first and rank 0 last: nobody is reported lost.
    let rxs: Vec<_> = lives
        .into_iter()
        .rev()
        .map(|(live, rx)| {
            live.goodbye();
            rx
        })
        .collect();
    thread::sleep(Duration::from_millis(300));
    for rx in rxs {
        assert!(rx.try_recv().is_err());
    }
}

#[test]
fn one_rank_needs_no_sockets() {
    // The port is taken, but a group of one never binds it.
    let held = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let mut rv = Rendezvous::connect(&env(0, 1, port), T).unwrap();
    assert_eq!(rv.broadcast_id(Some(id()), T).unwrap(), id());
    assert_eq!(rv.all_gather_u64(42, T).unwrap(), vec![42]);
    rv.barrier(T).unwrap();
    assert!(matches!(
        rv.broadcast_id(None, T),
        Err(DistError::Rendezvous { .. })
    ));
    let live = rv.watch(|e| panic!("lost {e}"));
    assert!(!live.is_lost());
    live.goodbye();
}

#[test]
fn two_ranks_exchange_id_values_and_barrier() {
    full_round(2);
}

#[test]
fn four_ranks_exchange_id_values_and_barrier() {
    full_round(4);
}

#[test]
fn a_missing_peer_is_a_timeout_for_rank_0_and_the_others() {
    let port = free_port();
    let limit = Duration::from_millis(700);
    let started = Instant::now();
    // World of 3; rank 2 never comes. Rank 1 would wait longer than rank 0.
    let out = group(2, Duration::ZERO, move |r| {
        let limit = if r == 0 { limit } else { 4 * limit };
        Rendezvous::connect(&env(r, 3, port), limit).map(|_| ())
    });
    let took = started.elapsed();
    assert!(took < Duration::from_millis(2500), "{took:?}");
    match &out[0] {
        Err(e @ DistError::Timeout { what, .. }) => {
            assert!(what.contains("[2]"), "{e}");
            assert!(e.to_string().contains("0.7 s"), "{e}");
        }
        other => panic!("rank 0: {other:?}"),
    }
    // Rank 1 hears of rank 0's failure instead of waiting out its own time.
    match &out[1] {
        Err(e @ DistError::Rendezvous { .. }) => {
            assert!(e.to_string().contains("timed out"), "{e}")
        }
        other => panic!("rank 1: {other:?}"),
    }
}

#[test]
fn a_peer_without_rank_0_times_out() {
    let port = free_port();
    let started = Instant::now();
    let r = Rendezvous::connect(&env(1, 2, port), Duration::from_millis(600));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(550) && took < Duration::from_millis(2000),
        "{took:?}"
    );
    match r {
        Err(e @ DistError::Timeout { .. }) => {
            assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}")
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("connected to nobody"),
    }
}

#[test]
fn a_wrong_world_size_fails_both_sides() {
    let port = free_port();
    let out = group(2, Duration::ZERO, move |r| {
        let world = if r == 0 { 2 } else { 3 };
        Rendezvous::connect(&env(r, world, port), T).map(|_| ())
    });
    for (r, o) in out.iter().enumerate() {
        match o {
            Err(e @ DistError::Rendezvous { .. }) => {
                assert!(e.to_string().contains("WORLD_SIZE=3"), "rank {r}: {e}")
            }
            other => panic!("rank {r}: {other:?}"),
        }
    }
}

#[test]
fn a_duplicate_rank_fails_every_side() {
    let port = free_port();
    // Threads 1 and 2 both claim rank 1 of 3.
    let out = group(3, Duration::from_millis(200), move |t| {
        let r = t.min(1);
        Rendezvous::connect(&env(r, 3, port), T).map(|_| ())
    });
    for (t, o) in out.iter().enumerate() {
        match o {
            Err(e @ DistError::Rendezvous { .. }) => {
                assert!(
                    e.to_string().contains("two processes have RANK=1"),
                    "thread {t}: {e}"
                )
            }
            other => panic!("thread {t}: {other:?}"),
        }
    }
}

#[test]
fn a_port_in_use_is_a_clear_error() {
    let held = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    println!("port {port}");
    match Rendezvous::connect(&env(0, 2, port), T) {
        Err(e @ DistError::Rendezvous { .. }) => {
            let text = e.to_string();
            assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
            assert!(text.contains("MASTER_PORT"), "{text}");
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("bound a port in use"),
    }
}

/// A group of `world` watched ranks: each rank's Liveness and its on_lost reports.
fn watched(world: usize) -> Vec<(Liveness, mpsc::Receiver<DistError>)> {
    let port = free_port();
    group(world, Duration::ZERO, move |r| {
        let mut rv = Rendezvous::connect(&env(r, world, port), T).expect("connect");
        rv.barrier(T).expect("barrier");
        let (tx, rx) = mpsc::channel();
        (rv.watch(move |e| tx.send(e).expect("report")), rx)
    })
}

fn expect_lost(rx: &mpsc::Receiver<DistError>, rank: usize, within: Duration, who: &str) -> String {
    match rx.recv_timeout(within) {
        Ok(DistError::PeerLost { rank: r, reason }) => {
            assert_eq!(r, rank, "{who}: {reason}");
            reason
        }
        other => panic!("{who}: {other:?}"),
    }
}

#[test]
fn a_peer_that_drops_its_liveness_is_reported_lost_everywhere() {
    let mut g = watched(3);
    let started = Instant::now();
    let (live2, _rx2) = g.pop().unwrap();
    drop(live2);
    let (live1, rx1) = g.pop().unwrap();
    let (live0, rx0) = g.pop().unwrap();
    let reason = expect_lost(&rx0, 2, Duration::from_secs(2), "rank 0");
    assert!(reason.contains("without goodbye"), "{reason}");
    let reason = expect_lost(&rx1, 2, Duration::from_secs(2), "rank 1");
    assert!(reason.contains("reported by rank 0"), "{reason}");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(live0.is_lost() && live1.is_lost());
    // Exactly once.
    thread::sleep(Duration::from_millis(300));
    assert!(rx0.try_recv().is_err() && rx1.try_recv().is_err());
    live1.goodbye();
    live0.goodbye();
}

#[test]
fn a_peer_that_drops_its_rendezvous_before_watching_is_reported_lost() {
    let port = free_port();
    let mut out = group(2, Duration::ZERO, move |r| {
        Rendezvous::connect(&env(r, 2, port), T).expect("connect")
    });
    let rv1 = out.pop().unwrap();
    let rv0 = out.pop().unwrap();
    let (tx, rx) = mpsc::channel();
    let live0 = rv0.watch(move |e| tx.send(e).expect("report"));
    drop(rv1);
    expect_lost(&rx, 1, Duration::from_secs(2), "rank 0");
    drop(live0);
}

#[test]
fn losing_rank_0_is_reported_by_the_peers() {
    let mut g = watched(3);
    let (live0, _rx0) = g.remove(0);
    drop(live0);
    for (i, (live, rx)) in g.into_iter().enumerate() {
        let reason = expect_lost(&rx, 0, Duration::from_secs(2), &format!("rank {}", i + 1));
        assert!(reason.contains("without goodbye"), "{reason}");
        live.goodbye();
    }
}

#[test]
fn goodbye_is_never_a_loss_whoever_leaves_first() {
    let mut g = watched(3);
    // Rank 0 leaves first; the peers keep watching for a while, then leave too.
    let (live0, rx0) = g.remove(0);
    live0.goodbye();
    thread::sleep(Duration::from_millis(400));
    for (live, rx) in g {
        assert!(rx.try_recv().is_err());
        assert!(!live.is_lost());
        live.goodbye();
    }
    assert!(rx0.try_recv().is_err());
}

#[test]
fn a_peer_lost_during_a_collective_fails_it_everywhere() {
    let port = free_port();
    let started = Instant::now();
    let out = group(3, Duration::ZERO, move |r| {
        let mut rv = Rendezvous::connect(&env(r, 3, port), T)?;
        if r == 2 {
            return Ok(vec![]); // leaves without joining the gather
        }
        rv.all_gather_u64(r as u64, T)
    });
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    match &out[0] {
        Err(DistError::PeerLost { rank: 2, .. }) => {}
        other => panic!("rank 0: {other:?}"),
    }
    match &out[1] {
        Err(e @ DistError::Rendezvous { .. }) => assert!(e.to_string().contains("rank 2"), "{e}"),
        other => panic!("rank 1: {other:?}"),
    }
}

#[test]
fn mismatched_collectives_are_errors_not_hangs() {
    let port = free_port();
    let out = group(2, Duration::ZERO, move |r| {
        let mut rv = Rendezvous::connect(&env(r, 2, port), T)?;
        let limit = Duration::from_secs(2);
        if r == 0 {
            rv.barrier(limit)
        } else {
            rv.all_gather_u64(1, limit).map(|_| ())
        }
    });
    for (r, o) in out.iter().enumerate() {
        assert!(
            matches!(o, Err(DistError::Rendezvous { .. })),
            "rank {r}: {o:?}"
        );
    }
}
