//! `hybrid-trainer launch` with the hidden `dist-selftest` as the children's command: the
//! launcher, the torch.distributed environment, the TCP rendezvous and the liveness channel
//! across real processes, without a GPU.

#[path = "../../tensor-ops/tests/ports/mod.rs"]
mod ports;

use assert_cmd::Command;
use std::time::{Duration, Instant};

/// A free port for the launcher's tests: 10000 to 18999, 16 apart per process.
fn free_port() -> u16 {
    ports::free_port_in(10000, 9000, 16)
}

/// The variables a surrounding launcher or test run might have set, which no test inherits.
const INHERITED: [&str; 9] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "HYBRID_TRAINER_LAUNCHED",
    "HYBRID_DIST_SELFTEST",
    "HYBRID_DEVICE",
];

/// The binary: `$HYBRID_TRAINER_BIN` in the GPU bundle, else cargo's.
fn binary() -> std::path::PathBuf {
    std::env::var_os("HYBRID_TRAINER_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_BIN_EXE_hybrid-trainer")))
}

/// The binary with none of the [`INHERITED`] variables.
fn cmd() -> Command {
    let mut c = Command::new(binary());
    for v in INHERITED {
        c.env_remove(v);
    }
    c.timeout(Duration::from_secs(60));
    c
}

/// Runs `c`, which must fail with `needle` in its stderr; returns the stderr.
fn refused(c: &mut Command, needle: &str) -> String {
    let out = c.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{c:?} succeeded: {err}");
    assert!(err.contains(needle), "{c:?}: {err}");
    err
}

/// `launch --nproc N --master-port PORT -- COMMAND`.
fn launch_argv(nproc: u32, port: &str, command: &str) -> Vec<String> {
    let n = nproc.to_string();
    [
        "launch",
        "--nproc",
        &n,
        "--master-port",
        port,
        "--",
        command,
    ]
    .map(String::from)
    .to_vec()
}

/// `launch` with these flags and `dist-selftest`; returns (exit code, stdout, stderr, seconds).
fn launch(flags: &[&str], fault: Option<&str>) -> (Option<i32>, String, String, f64) {
    let port = free_port().to_string();
    let mut c = cmd();
    c.args(["launch", "--master-port", &port])
        .args(flags)
        .args(["--", "dist-selftest"])
        // The launcher must override this.
        .env("NCCL_NVLS_ENABLE", "1");
    if let Some(f) = fault {
        c.env("HYBRID_DIST_SELFTEST", f);
    }
    let started = Instant::now();
    let out = c.output().expect("run the launcher");
    let secs = started.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    println!("--- stdout\n{stdout}--- stderr\n{stderr}--- {secs:.2} s");
    (out.status.code(), stdout, stderr, secs)
}

/// Asserts that the output `text` holds `part`, showing the whole output otherwise.
fn has(text: &str, part: &str) {
    assert!(text.contains(part), "{text}");
}

#[test]
fn two_processes_meet_and_exit_cleanly() {
    let (code, out, err, _) = launch(&["--nproc", "2"], None);
    assert_eq!(code, Some(0), "{err}");
    for r in 0..2 {
        assert!(
            out.contains(&format!("rank {r} of 2 ok [0, 1] (local rank {r} of 2")),
            "{out}"
        );
    }
    assert_eq!(out.matches("NCCL_NVLS_ENABLE=0").count(), 2, "{out}");
    has(&err, "launch: rank 0: exit code 0, rank 1: exit code 0");
}

#[test]
fn four_processes_with_the_long_flag() {
    let (code, out, err, _) = launch(&["--nproc-per-node", "4"], None);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.matches(" of 4 ok [0, 1, 2, 3]").count(), 4, "{out}");
}

#[test]
fn a_dying_rank_is_noticed_by_the_others_and_its_code_returned() {
    let (code, out, err, secs) = launch(&["--nproc", "3"], Some("exit-rank1"));
    assert_eq!(code, Some(3), "{out}{err}");
    has(&out, "rank 0: rank 1 was lost");
    // Rank 2 hears it from rank 0.
    assert!(
        out.contains("rank 2: rank 1 was lost") && out.contains("(reported by rank 0)"),
        "{out}"
    );
    has(&err, "launch: rank 1 exited with exit code 3");
    assert!(secs < 10.0, "{secs} s");
}

#[test]
fn losing_rank_0_stops_the_others() {
    let (code, out, err, secs) = launch(&["--nproc", "2"], Some("exit-rank0"));
    assert_eq!(code, Some(3), "{out}{err}");
    has(&out, "rank 1: rank 0 was lost");
    assert!(secs < 10.0, "{secs} s");
}

#[test]
fn ranks_that_ignore_a_loss_are_killed_after_the_grace_period() {
    let (code, out, err, secs) = launch(
        &["--nproc", "2", "--grace-secs", "1"],
        Some("exit-rank1-deaf"),
    );
    assert_eq!(code, Some(3), "{out}{err}");
    has(&out, "rank 0: rank 1 was lost");
    has(
        &err,
        "rank 0 still runs 1 s after rank 1 failed; killing it",
    );
    has(&err, "rank 0: killed after the grace period");
    assert!(secs < 10.0, "{secs} s");
}

#[test]
fn failing_children_give_their_exit_code() {
    let port = free_port().to_string();
    let out = cmd()
        .args(launch_argv(2, &port, "no-such-command"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    has(&err, "launch: rank 0: exit code 2, rank 1: exit code 2");
}

#[test]
fn bad_launcher_flags_are_clear_errors() {
    for (args, needle) in [
        (vec!["launch", "--nproc", "0", "--", "run"], "nproc"),
        (vec!["launch", "--nproc", "two", "--", "run"], "nproc"),
        (vec!["launch", "--nproc", "2"], "COMMAND"),
        (vec!["launch", "--", "run"], "nproc-per-node"),
        (
            vec!["launch", "--nproc", "2", "--nnodes", "0", "--", "run"],
            "nnodes",
        ),
        (
            vec![
                "launch",
                "--nproc",
                "2",
                "--nnodes",
                "2",
                "--node-rank",
                "2",
                "--",
                "run",
            ],
            "--node-rank 2 is not below --nnodes 2",
        ),
        (
            vec!["launch", "--nproc", "2", "--master-port", "0", "--", "run"],
            "master-port",
        ),
        (
            vec![
                "launch",
                "--nproc",
                "2",
                "--master-addr",
                "a b",
                "--",
                "run",
            ],
            "MASTER_ADDR",
        ),
        (
            vec![
                "launch", "--nproc", "2", "--", "launch", "--nproc", "2", "--", "run",
            ],
            "runs `launch` again",
        ),
        (
            vec![
                "launch",
                "--nproc",
                "4000000000",
                "--nnodes",
                "4000000000",
                "--",
                "run",
            ],
            "too many processes",
        ),
        (
            vec!["--device", "cpu", "launch", "--nproc", "2", "--", "run"],
            "after `--`",
        ),
    ] {
        let err = refused(cmd().args(&args), needle);
        // Nothing was started.
        assert!(!err.contains("launch: ranks"), "{args:?}: {err}");
    }
}

#[test]
fn a_launched_process_cannot_launch() {
    refused(
        cmd()
            .env("HYBRID_TRAINER_LAUNCHED", "1")
            .args(["launch", "--nproc", "1", "--", "run"]),
        "launches do not nest",
    );
}

#[test]
fn the_selftest_needs_the_environment() {
    refused(cmd().arg("dist-selftest"), "hybrid-trainer launch");
}

#[test]
fn data_parallel_runs_refuse_the_cpu() {
    let dist = [
        ("WORLD_SIZE", "2"),
        ("RANK", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29999"),
    ];
    let cpu = "data-parallel runs need one GPU per process";
    refused(
        cmd()
            .envs(dist)
            .args(["--device", "cpu", "demo", "--size", "8"]),
        cpu,
    );
    refused(
        cmd()
            .envs(dist)
            .env("HYBRID_DEVICE", "cpu")
            .args(["demo", "--size", "8"]),
        cpu,
    );
    // A malformed environment is an error naming the variable.
    refused(
        cmd()
            .envs(dist)
            .env("RANK", "x")
            .args(["--device", "cpu", "demo", "--size", "8"]),
        "RANK: \"x\"",
    );
    // So is a malformed gradient-bucket setting, before any device is looked at.
    for (var, value) in [
        ("HYBRID_BUCKET_MIB", "0"),
        ("HYBRID_PACK_BELOW_KIB", "lots"),
    ] {
        refused(
            cmd()
                .envs(dist)
                .env(var, value)
                .args(["--device", "cpu", "demo", "--size", "8"]),
            &format!("{var}: \"{value}\""),
        );
    }
}

/// The all-reduce benchmark checks its sizes before it joins (or waits for) a job.
#[test]
fn allreduce_bench_refuses_bad_sizes_first() {
    for sizes in ["0", "16385", "1,0"] {
        refused(
            cmd().args(["--device", "cpu", "allreduce-bench", "--sizes-mib", sizes]),
            "is not in 1..=16384",
        );
    }
}

/// `--device cuda:K` given to every rank of a node would put them all on one GPU: refused
/// (before any device is touched) unless K is the rank's own LOCAL_RANK.
#[test]
fn ranks_of_one_node_refuse_a_shared_gpu() {
    let mut c = cmd();
    c.envs([
        ("WORLD_SIZE", "2"),
        ("LOCAL_WORLD_SIZE", "2"),
        ("RANK", "1"),
        ("LOCAL_RANK", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29999"),
    ])
    .args(["--device", "cuda:0", "demo", "--size", "8"]);
    refused(&mut c, "they would share one GPU");
}

#[test]
fn the_pip_wheels_nccl_is_put_on_the_library_path_when_the_loader_lacks_one() {
    if std::process::Command::new("python3")
        .arg("-V")
        .output()
        .is_err()
    {
        println!("no python3: skipped");
        return;
    }
    let root = std::env::temp_dir().join(format!("ht-launch-pip-{}", std::process::id()));
    let lib = root.join("nvidia").join("nccl").join("lib");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::write(root.join("nvidia").join("nccl").join("__init__.py"), "").unwrap();
    std::fs::write(lib.join("libnccl.so.2"), "").unwrap();
    let port = free_port().to_string();
    let out = cmd()
        .env("PYTHONPATH", &root)
        .args(launch_argv(1, &port, "dist-selftest"))
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&root);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // On a machine whose loader finds libnccl by itself, the launcher leaves the path alone;
    // elsewhere it must have put the (fake) wheel's library on it.
    let line = format!(
        "the pip wheel's {} (behind a libnccl.so link) first in LD_LIBRARY_PATH",
        lib.join("libnccl.so.2").display()
    );
    let loader_lacks_nccl = gpu_cuda::nccl::available().is_err();
    assert_eq!(err.contains(&line), loader_lacks_nccl, "{err}");
    println!("{err}");
}

/// Whether process `pid` is gone (or a zombie nobody has reaped yet).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the field after the command name's closing parenthesis.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

/// Killing the launcher (SIGKILL: it gets no chance to clean up) takes its ranks down with it
/// (SIGTERM through PR_SET_PDEATHSIG) instead of leaving them running unsupervised: here they
/// would otherwise wait 20 s for a loss that never comes.
#[test]
fn the_ranks_die_with_the_launcher() {
    use std::io::{BufRead, BufReader};
    let port = free_port().to_string();
    let mut c = std::process::Command::new(binary());
    for v in INHERITED {
        c.env_remove(v);
    }
    let mut launcher = c
        .env("HYBRID_DIST_SELFTEST", "exit-rank9")
        .args(launch_argv(2, &port, "dist-selftest"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the launcher");
    let out = BufReader::new(launcher.stdout.take().expect("piped"));
    let mut pids = Vec::new();
    for line in out.lines().map_while(Result::ok) {
        if let Some(pid) = line.split("pid ").nth(1) {
            pids.push(pid.trim_end_matches(')').parse::<u32>().expect("a pid"));
        }
        if pids.len() == 2 {
            break;
        }
    }
    assert_eq!(pids.len(), 2, "both ranks report their pid");
    launcher.kill().expect("killing the launcher");
    let _ = launcher.wait();
    let t0 = Instant::now();
    while !pids.iter().all(|&p| gone(p)) && t0.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        pids.iter().all(|&p| gone(p)),
        "ranks {pids:?} still run {:.1} s after the launcher was killed",
        t0.elapsed().as_secs_f64()
    );
    println!(
        "ranks gone {:.2} s after the launcher",
        t0.elapsed().as_secs_f64()
    );
}
