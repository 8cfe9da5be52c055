//! What needs the wire format: fake peers that speak it by hand.

use super::wire::{hello, read_frame, write_frame, Tag};
use super::*;
use std::sync::mpsc;

fn rank0(port: u16) -> std::thread::JoinHandle<Result<Rendezvous, DistError>> {
    let env = DistEnv::on_localhost(0, 2, port);
    std::thread::spawn(move || Rendezvous::connect(&env, Duration::from_secs(5)))
}

/// A free port (the listener is gone when this returns) and rank 0 of two listening there.
#[allow(clippy::type_complexity)]
fn fake_peer_of_rank0() -> (
    TcpStream,
    std::thread::JoinHandle<Result<Rendezvous, DistError>>,
    u16,
) {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    println!("port {port}");
    let h = rank0(port);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => return (s, h, port),
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("rank 0 never listened: {e}"),
        }
    }
}

#[test]
fn a_silent_peer_is_lost_when_its_heartbeat_stops() {
    let (mut s, h, _) = fake_peer_of_rank0();
    let deadline = Instant::now() + Duration::from_secs(5);
    write_frame(&mut s, Tag::Hello, &hello(1, 2), deadline).unwrap();
    assert_eq!(read_frame(&mut s, deadline).unwrap().0, Tag::Ack);
    let rv = h.join().unwrap().unwrap();
    let (tx, rx) = mpsc::channel();
    let started = Instant::now();
    let live = rv.watch_with_timeout(Duration::from_millis(400), move |e| tx.send(e).unwrap());
    // Rank 0's heartbeats arrive; ours never do.
    assert_eq!(read_frame(&mut s, deadline).unwrap().0, Tag::Heartbeat);
    match rx.recv_timeout(Duration::from_secs(3)) {
        Ok(DistError::PeerLost { rank: 1, reason }) => {
            assert!(reason.contains("no heartbeat for 0.4 s"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(350) && took < Duration::from_secs(2),
        "{took:?}"
    );
    assert!(live.is_lost());
}

#[test]
fn a_stranger_fails_the_rendezvous_clearly() {
    let (mut s, h, _) = fake_peer_of_rank0();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut bad = hello(1, 2);
    bad[0] = b'X';
    write_frame(&mut s, Tag::Hello, &bad, deadline).unwrap();
    let (tag, msg) = read_frame(&mut s, deadline).unwrap();
    assert_eq!(tag, Tag::Error);
    let msg = String::from_utf8_lossy(&msg).into_owned();
    assert!(
        msg.contains("not a hybrid-trainer rendezvous peer"),
        "{msg}"
    );
    match h.join().unwrap() {
        Err(e @ DistError::Rendezvous { .. }) => assert!(e.to_string().contains(&msg), "{e}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("accepted a stranger"),
    }
}

#[test]
fn a_connection_that_closes_before_its_hello_is_ignored() {
    let (s, h, port) = fake_peer_of_rank0();
    drop(s);
    // The real rank 1 then joins as usual.
    let env1 = DistEnv::on_localhost(1, 2, port);
    let mut rv1 = Rendezvous::connect(&env1, Duration::from_secs(5)).unwrap();
    let mut rv0 = h.join().unwrap().unwrap();
    let t = Duration::from_secs(5);
    let peer = std::thread::spawn(move || rv1.all_gather_u64(7, t));
    assert_eq!(rv0.all_gather_u64(3, t).unwrap(), vec![3, 7]);
    assert_eq!(peer.join().unwrap().unwrap(), vec![3, 7]);
}
