//! Data-parallel training on two GPUs (`hybrid-trainer launch`, NCCL): the same loss curve as
//! one GPU with the same global batch; a rank that is killed, hangs or fails with an error
//! makes the other exit with a clear error within the stated time. These tests need two CUDA devices and skip (reported
//! on their own line by the GPU bundle) on machines with fewer.
//!
//! The binary is `$HYBRID_TRAINER_BIN` (the GPU bundle's `bin/hybrid-trainer`), else the one
//! cargo built for this test.

use gpu_cuda::testing::gpus_or_skip;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tensor_ops::dist::{BUCKET_ENV, PACK_ENV};

/// The tests share the two GPUs: one at a time.
static GPUS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn gpus() -> std::sync::MutexGuard<'static, ()> {
    GPUS.lock().unwrap_or_else(|p| p.into_inner())
}

fn binary() -> PathBuf {
    std::env::var_os("HYBRID_TRAINER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_hybrid-trainer")))
}

/// The embedded corpus, written once to a file for `--data`.
fn corpus() -> PathBuf {
    let path = std::env::temp_dir().join(format!("dp-corpus-{}.txt", std::process::id()));
    if !path.exists() {
        let text = trainer::corpus::default_corpus().expect("embedded corpus");
        std::fs::write(&path, text).expect("writing the corpus");
    }
    path
}

/// A free TCP port on the loopback interface for the rendezvous.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("binding port 0");
    l.local_addr().expect("local address").port()
}

/// A small GPT, fp32, no dropout: every difference between the runs is reduction order.
fn train_args(iters: u32, log_interval: u32, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = [
        "train-gpt",
        "--batch",
        "16",
        "--block",
        "64",
        "--layers",
        "2",
        "--heads",
        "4",
        "--embd",
        "128",
        "--dropout",
        "0",
        "--eval-interval",
        "100000",
        "--eval-iters",
        "2",
        "--sample",
        "0",
        "--warmup",
        "10",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.push("--iters".into());
    v.push(iters.to_string());
    v.push("--log-interval".into());
    v.push(log_interval.to_string());
    v.push("--data".into());
    v.push(corpus().display().to_string());
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// `hybrid-trainer launch --nproc-per-node 2 --master-port <free> --`, to be given the command.
fn launch_two() -> Command {
    let mut c = Command::new(binary());
    c.args(["launch", "--nproc-per-node", "2", "--master-port"])
        .arg(free_port().to_string())
        .arg("--");
    c
}

/// `iter N: loss X` lines of a run's output, in order.
fn losses(out: &str) -> Vec<(u32, f64)> {
    out.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("iter ")?;
            let (it, rest) = rest.split_once(": loss ")?;
            let loss = rest.split(',').next()?;
            Some((it.parse().ok()?, loss.parse().ok()?))
        })
        .collect()
}

/// Runs `cmd` to its end within `limit` (killed and reported after), echoing its output to
/// stderr as it comes; returns stdout and stderr together.
fn run(cmd: &mut Command, limit: Duration) -> String {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting hybrid-trainer");
    let rx = lines(&mut child);
    let mut seen = Vec::new();
    let until = Instant::now() + limit;
    let status = loop {
        while let Ok(l) = rx.recv_timeout(Duration::from_millis(20)) {
            eprintln!("  | {l}");
            seen.push(l);
        }
        if let Ok(Some(s)) = child.try_wait() {
            break Some(s);
        }
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
    };
    while let Ok(l) = rx.recv_timeout(Duration::from_millis(200)) {
        seen.push(l);
    }
    let text = seen.join("\n");
    match status {
        Some(s) => assert!(s.success(), "run failed ({s}):\n{text}"),
        None => panic!("run did not finish within {} s:\n{text}", limit.as_secs()),
    }
    text
}

/// 50 steps on 2 GPUs with global batch 16 (8 a rank, gradients averaged by NCCL) against 50
/// steps on 1 GPU with batch 16. The only difference is the order of fp32 sums: the loss is a
/// mean of two half-batch means instead of one mean, and each gradient likewise. At step 0
/// the parameters are equal, so the losses differ by rounding alone (relative 2^-24 times the
/// few hundred terms of a mean: below 1e-5), plus the log's rounding to 4 decimals (each side
/// at most 5e-5 off: 1e-4 between them). Later steps also carry the rounding of earlier
/// updates; AdamW at these rates moves the loss by ~1e-2 a step, and the bound 2e-3 (absolute,
/// on losses near 2.5–4.2) is a tenth of that: a wrong gradient average (a sum instead of a
/// mean, a rank's shard missing, ranks out of step) shifts the curve by far more from the
/// first steps on.
#[test]
fn multigpu_data_parallel_matches_one_gpu() {
    let test = "multigpu_data_parallel_matches_one_gpu";
    if gpus_or_skip(test, 2).is_none() {
        return;
    }
    let _gpus = gpus();
    let one = run(
        Command::new(binary())
            .arg("--device")
            .arg("cuda:0")
            .args(train_args(50, 1, &[])),
        Duration::from_secs(90),
    );
    // The default (small gradients packed into one buffer, 25 MiB buckets: here one), and
    // each gradient its own collective in 1 MiB buckets (two, the first overlapping the pass).
    for (setting, env) in [
        ("default", vec![]),
        (
            "unpacked, 1 MiB buckets",
            vec![(PACK_ENV, "0"), (BUCKET_ENV, "1")],
        ),
    ] {
        let two = run(
            launch_two()
                .envs(env.iter().copied())
                .args(train_args(50, 1, &[])),
            Duration::from_secs(90),
        );
        assert!(two.contains("data parallel: 2 ranks"), "{two}");
        assert!(two.contains("parameters identical on all 2 ranks"), "{two}");
        let (a, b) = (losses(&one), losses(&two));
        assert_eq!(a.len(), 50, "one GPU logged {} steps:\n{one}", a.len());
        assert_eq!(b.len(), 50, "two GPUs logged {} steps:\n{two}", b.len());
        let mut worst = 0.0f64;
        for ((ia, la), (ib, lb)) in a.iter().zip(&b) {
            assert_eq!(ia, ib);
            let d = (la - lb).abs();
            worst = worst.max(d);
            let bound = if *ia == 0 {
                1e-5 * la.abs() + 1e-4
            } else {
                2e-3
            };
            assert!(
                d <= bound,
                "{setting}, step {ia}: 1 GPU {la}, 2 GPUs {lb} (|d| {d:e} > {bound:e})"
            );
        }
        eprintln!(
            "{test} ({setting}): largest |loss difference| over 50 steps {worst:.3e}; first {:.5} / {:.5}, last {:.5} / {:.5}",
            a[0].1, b[0].1, a[49].1, b[49].1
        );
    }
}

/// A run that goes on until stopped (logging every 10 steps), with a step timeout and a
/// checkpoint every `interval` steps into `ck`.
fn endless_args(timeout_secs: u32, ck: &str, interval: u32) -> Vec<String> {
    train_args(
        1_000_000,
        10,
        &[
            "--dist-timeout-secs",
            &timeout_secs.to_string(),
            "--checkpoint",
            ck,
            "--checkpoint-interval",
            &interval.to_string(),
        ],
    )
}

/// Starts rank `rank` of 2 directly (as a launcher would), output piped.
fn spawn_rank(rank: usize, port: &str, args: &[String]) -> Child {
    let mut cmd = Command::new(binary());
    cmd.args(args)
        .env("RANK", rank.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("WORLD_SIZE", "2")
        .env("LOCAL_WORLD_SIZE", "2")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port)
        .env("NCCL_NVLS_ENABLE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(path) = hybrid_trainer::launch::nccl_library_path() {
        cmd.env("LD_LIBRARY_PATH", path);
    }
    cmd.spawn().expect("starting a rank")
}

/// Lines of a child's stdout and stderr, as they come.
fn lines(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().expect("piped stdout");
    let err = child.stderr.take().expect("piped stderr");
    let tx2 = tx.clone();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx2.send(l);
        }
    });
    rx
}

/// The GPU lock and a free port for a test of two ranks, or `None` where there are fewer than
/// two GPUs (the skip printed).
fn two_ranks(test: &str) -> Option<(std::sync::MutexGuard<'static, ()>, String)> {
    gpus_or_skip(test, 2)?;
    Some((gpus(), free_port().to_string()))
}

/// Ranks 0 and 1 running `args` on `port`, each with the receiver of its output lines (both
/// spawned before either's output is read).
fn spawn_pair(port: &str, args: &[String]) -> [(Child, mpsc::Receiver<String>); 2] {
    let mut r0 = spawn_rank(0, port, args);
    let mut r1 = spawn_rank(1, port, args);
    let (rx0, rx1) = (lines(&mut r0), lines(&mut r1));
    [(r0, rx0), (r1, rx1)]
}

/// Waits for a line containing `what` (collecting everything seen) until `limit`.
fn wait_for(
    rx: &mpsc::Receiver<String>,
    what: &str,
    limit: Duration,
    seen: &mut Vec<String>,
) -> bool {
    let until = Instant::now() + limit;
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(l) => {
                let hit = l.contains(what);
                seen.push(l);
                if hit {
                    return true;
                }
            }
            Err(_) => return false,
        }
    }
    false
}

/// Waits for `child` to exit within `limit`; kills it after.
fn exit_within(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// Both ranks train; once rank 0 has logged step 20, rank 1 is killed (SIGKILL) or frozen
/// (SIGSTOP). Rank 0 must exit with status 75 and say why within the stated time: a killed
/// rank closes its rendezvous connection, which rank 0 notices at once (bound: 30 s, for the
/// abort and the exit); a frozen one keeps it open, so rank 0's step does not complete and
/// its watchdog fires after `--dist-timeout-secs 10` (bound: 10 s + 10 s for NCCL's abort +
/// 10 s of slack).
fn a_lost_rank_stops_the_other(test: &str, freeze: bool) {
    let Some((_gpus, port)) = two_ranks(test) else {
        return;
    };
    let ck = std::env::temp_dir().join(format!("dp-ckpt-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&ck);
    let ck_s = ck.display().to_string();
    let args = endless_args(10, &ck_s, 10);
    let [(mut r0, rx0), (mut r1, _rx1)] = spawn_pair(&port, &args);
    let mut seen = Vec::new();
    let started = wait_for(&rx0, "iter 20:", Duration::from_secs(120), &mut seen);
    if !started {
        let _ = r0.kill();
        let _ = r1.kill();
        panic!("{test}: rank 0 never reached step 20:\n{}", seen.join("\n"));
    }
    let pid = r1.id().to_string();
    let t0 = Instant::now();
    if freeze {
        let ok = Command::new("kill").args(["-STOP", &pid]).status();
        assert!(ok.is_ok_and(|s| s.success()), "kill -STOP {pid}");
    } else {
        r1.kill().expect("killing rank 1");
    }
    let limit = Duration::from_secs(30);
    let status = exit_within(&mut r0, limit);
    let took = t0.elapsed();
    let _ = r1.kill();
    let _ = r1.wait();
    while let Ok(l) = rx0.recv_timeout(Duration::from_millis(200)) {
        seen.push(l);
    }
    let log = seen.join("\n");
    let Some(status) = status else {
        panic!(
            "{test}: rank 0 still ran {} s after rank 1 was lost:\n{log}",
            limit.as_secs()
        );
    };
    assert_eq!(
        status.code(),
        Some(75),
        "{test}: rank 0 exited with {status}:\n{log}"
    );
    let why = if freeze {
        "has not completed"
    } else {
        "rank 1 was lost"
    };
    assert!(
        log.contains(why),
        "{test}: rank 0 did not say '{why}':\n{log}"
    );
    // The checkpoint written before the failure resumes on one GPU.
    let latest =
        std::fs::read_to_string(ck.join("latest")).expect("a checkpoint before the failure");
    let at: u32 = latest
        .trim()
        .trim_start_matches("iter-")
        .parse()
        .expect("iter-N");
    let resumed = run(
        Command::new(binary())
            .args(["--device", "cuda:0"])
            .args(train_args(at + 5, 1, &["--resume", &ck_s])),
        Duration::from_secs(120),
    );
    assert!(
        resumed.contains(&format!("at iteration {at} (written by 2 rank(s), now 1)")),
        "{resumed}"
    );
    let steps: Vec<u32> = losses(&resumed).iter().map(|p| p.0).collect();
    assert_eq!(steps, (at..at + 5).collect::<Vec<_>>(), "{resumed}");
    let _ = std::fs::remove_dir_all(&ck);
    eprintln!(
        "{test}: rank 0 exited with 75 {:.1} s after rank 1 was {}",
        took.as_secs_f64(),
        if freeze { "frozen" } else { "killed" }
    );
}

#[test]
fn multigpu_a_killed_rank_stops_the_other() {
    a_lost_rank_stops_the_other("multigpu_a_killed_rank_stops_the_other", false);
}

#[test]
fn multigpu_a_hung_rank_stops_the_other() {
    a_lost_rank_stops_the_other("multigpu_a_hung_rank_stops_the_other", true);
}

/// Rank 0 fails with an error of its own: its checkpoint directory is a file, so writing the
/// checkpoint at step 30 fails. It exits with that error, leaving the group as a crash would
/// (no goodbye), so rank 1 reports rank 0 lost and exits with 75 at once: within 15 s of rank
/// 0's exit (NCCL's abort takes up to 3 s), far below the `--dist-timeout-secs 120` after which
/// its watchdog alone would have stopped it.
#[test]
fn multigpu_a_rank_failing_with_an_error_stops_the_other() {
    const TEST: &str = "multigpu_a_rank_failing_with_an_error_stops_the_other";
    let Some((_gpus, port)) = two_ranks(TEST) else {
        return;
    };
    let ck = std::env::temp_dir().join(format!("dp-ckpt-file-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&ck);
    std::fs::write(&ck, "a file, not a directory").expect("writing the blocking file");
    let ck_s = ck.display().to_string();
    let args = endless_args(120, &ck_s, 30);
    let [(mut r0, rx0), (mut r1, rx1)] = spawn_pair(&port, &args);
    let s0 = exit_within(&mut r0, Duration::from_secs(120));
    let t0 = Instant::now();
    let s1 = exit_within(&mut r1, Duration::from_secs(15));
    let took = t0.elapsed();
    let _ = std::fs::remove_file(&ck);
    let drain = |rx: mpsc::Receiver<String>| {
        let mut v = Vec::new();
        while let Ok(l) = rx.recv_timeout(Duration::from_millis(200)) {
            v.push(l);
        }
        v.join("\n")
    };
    let (log0, log1) = (drain(rx0), drain(rx1));
    let Some(s0) = s0 else {
        let _ = r1.kill();
        panic!("{TEST}: rank 0 did not fail within 120 s:\n{log0}");
    };
    assert!(
        !s0.success() && s0.code() != Some(75),
        "{TEST}: rank 0 exited with {s0}, expected its own error:\n{log0}"
    );
    assert!(
        log0.contains("writing a checkpoint"),
        "{TEST}: rank 0 failed for another reason:\n{log0}"
    );
    let Some(s1) = s1 else {
        panic!("{TEST}: rank 1 still ran 15 s after rank 0 failed:\n{log1}");
    };
    assert_eq!(
        s1.code(),
        Some(75),
        "{TEST}: rank 1 exited with {s1}:\n{log1}"
    );
    assert!(
        log1.contains("rank 0 was lost"),
        "{TEST}: rank 1 did not say 'rank 0 was lost':\n{log1}"
    );
    eprintln!(
        "{TEST}: rank 1 exited with 75 {:.1} s after rank 0 failed with its error",
        took.as_secs_f64()
    );
}
