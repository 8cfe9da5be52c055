//! The CLI as a user runs it.

mod common;

use assert_cmd::Command;
use common::{cli_err, cli_ok, loss_lines, Corpus};

#[test]
fn demo_runs_on_the_cpu_by_request() {
    let (text, _) = cli_ok(["--device", "cpu", "demo", "--size", "96"]);
    assert!(
        text.contains("2x2 matmul") && text.contains("GFLOP/s"),
        "{text}"
    );
}

#[test]
fn bad_cli_values_are_clear_errors() {
    for args in [
        vec!["--device", "tpu"],
        vec!["demo", "--size", "0"],
        vec!["demo", "--size", "abc"],
        vec![
            "parity-dump",
            "--model",
            "lstm",
            "--out",
            "unused.safetensors",
        ],
    ] {
        let err = cli_err(&args);
        assert!(err.contains("error"), "{args:?}: {err}");
    }
}

#[test]
fn bad_device_env_is_a_clear_error() {
    let out = Command::cargo_bin("hybrid-trainer")
        .unwrap()
        .env("HYBRID_DEVICE", "cuda:99")
        .args(["demo", "--size", "8"])
        .assert()
        .failure();
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(err.contains("cuda") || err.contains("CUDA"), "{err}");
}

/// Runs `train-gpt` on the CPU with a tiny model and `extra` flags; expects a clean failure
/// (exit status 1 from an error, not 134 from an abort or 101 from a panic) and returns stderr.
fn train_gpt_fails_cleanly(corpus: &Corpus, extra: &[&str]) -> String {
    let data = corpus.0.to_str().unwrap();
    let mut args = vec!["--device", "cpu", "train-gpt", "--data", data];
    args.extend([
        "--layers",
        "1",
        "--heads",
        "1",
        "--embd",
        "8",
        "--iters",
        "1",
        "--eval-iters",
        "1",
        "--sample",
        "0",
    ]);
    args.extend(extra);
    let out = Command::cargo_bin("hybrid-trainer")
        .unwrap()
        .args(&args)
        .assert()
        .failure();
    let output = out.get_output();
    let err = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(1), "{extra:?}: {err}");
    assert!(!err.contains("panicked"), "{extra:?}: {err}");
    err
}

/// [`train_gpt_fails_cleanly`] on a fresh corpus named `corpus`, with an error that says all
/// of `says`.
fn train_gpt_refuses(corpus: &str, extra: &[&str], says: &[&str]) {
    let err = train_gpt_fails_cleanly(&Corpus::new(corpus), extra);
    for s in says {
        assert!(err.contains(s), "{s:?} not in: {err}");
    }
}

/// `--batch 4294967295 --block 4294967295` aborted the process ("memory allocation of
/// 6597069765120 bytes failed", exit 134) building a position table for a context far longer
/// than the corpus: the context is now checked against the splits first.
#[test]
fn train_gpt_rejects_a_block_longer_than_the_corpus() {
    train_gpt_refuses(
        "long-block",
        &["--batch", "4294967295", "--block", "4294967295"],
        &["--block 4294967295", "split of"],
    );
}

/// A context that fits but a batch·block product no host can hold (about 1 TiB of token ids):
/// a typed out-of-memory error naming the flags, not an overflow panic or an abort.
#[test]
fn train_gpt_reports_a_batch_too_large_to_hold_as_an_error() {
    train_gpt_refuses(
        "huge-batch",
        &["--batch", "4294967295", "--block", "64"],
        &["--batch 4294967295 x --block 64", "out of"],
    );
}

/// The main job's flags for a tiny run (both arms) on `corpus` into `out`.
fn main_job_args<'a>(corpus: &'a str, out: &'a str) -> Vec<&'a str> {
    vec![
        "--device",
        "cpu",
        "--data",
        corpus,
        "--iters",
        "60",
        "--layers",
        "1",
        "--heads",
        "2",
        "--embd",
        "32",
        "--block",
        "16",
        "--batch",
        "4",
        "--warmup",
        "10",
        "--eval-interval",
        "10",
        "--eval-iters",
        "2",
        "--dropout",
        "0",
        "--quiet",
        "--out",
        out,
    ]
}

/// With no subcommand the binary runs the main job (here shortened by flags): AdamW, then the
/// hybrid, and a report with both runs side by side.
#[test]
fn no_subcommand_runs_the_main_job() {
    let corpus = Corpus::new("main-job");
    let out = std::env::temp_dir().join(format!("hybrid-job-main-{}", std::process::id()));
    let (text, _) = cli_ok(main_job_args(
        corpus.0.to_str().unwrap(),
        out.to_str().unwrap(),
    ));
    assert!(
        text.contains("expected time")
            && text.contains("== adamw ==")
            && text.contains("== hybrid =="),
        "{text}"
    );
    assert!(text.contains("target: AdamW's best val loss"), "{text}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    let modes: Vec<&str> = json["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["mode"].as_str().unwrap())
        .collect();
    assert_eq!(modes, ["adamw", "hybrid"]);
    assert!(json["runs"][1]["decisions"]
        .as_array()
        .is_some_and(|d| !d.is_empty()));
    assert!(
        json["rows"][0]["reached"]["backward"].as_u64().is_some(),
        "{json}"
    );
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        md.contains("| adamw |") && md.contains("| hybrid |"),
        "{md}"
    );
    let png = std::fs::read(out.join("report.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    for f in ["adamw.json", "hybrid.json"] {
        assert!(out.join(f).exists(), "{f}");
    }
    std::fs::remove_dir_all(&out).ok();
}

/// `run` is the main job too, and refuses bad sizes with a clean error (exit 1).
#[test]
fn the_main_job_refuses_bad_flags_cleanly() {
    let corpus = Corpus::new("main-job-bad");
    let out = std::env::temp_dir().join(format!("hybrid-job-main-bad-{}", std::process::id()));
    let (data, o) = (corpus.0.to_str().unwrap(), out.to_str().unwrap());
    for (flag, value, says) in [
        ("--iters", "0", "--iters"),
        ("--block", "100000", "longer than the corpus"),
        ("--dropout", "1.5", "--dropout"),
    ] {
        let mut args = main_job_args(data, o);
        let at = args.iter().position(|a| *a == flag).unwrap();
        args[at + 1] = value;
        args.insert(2, "run");
        let r = Command::cargo_bin("hybrid-trainer")
            .unwrap()
            .args(&args)
            .assert()
            .code(1);
        let err = String::from_utf8_lossy(&r.get_output().stderr).into_owned();
        assert!(
            err.contains(says) && !err.contains("panicked"),
            "{flag}: {err}"
        );
    }
    std::fs::remove_dir_all(&out).ok();
}

/// `iter N: loss X` lines of `train-gpt`'s output, by iteration.
fn logged_losses(out: &str) -> std::collections::BTreeMap<u32, String> {
    loss_lines(out)
        .into_iter()
        .map(|(it, loss)| (it, loss.to_string()))
        .collect()
}

/// `train-gpt --checkpoint` then `--resume` from its iteration-10 checkpoint continues the run
/// bit for bit on one device, with each optimizer: the same losses at iterations 10–19 and the
/// same final evaluation (printed in full by the summary). A checkpoint of another run's shape,
/// or of another optimizer, is refused.
#[test]
fn train_gpt_resumes_from_a_checkpoint_bit_for_bit() {
    for optimizer in ["adamw", "schedule-free", "prodigy"] {
        resumes_bit_for_bit(optimizer);
    }
}

fn resumes_bit_for_bit(optimizer: &str) {
    let corpus = Corpus::new("ckpt");
    let dir =
        std::env::temp_dir().join(format!("train-gpt-ckpt-{optimizer}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let data = corpus.0.to_str().unwrap();
    let ck = dir.to_str().unwrap();
    let mut base = common::tiny_gpt("cpu", data);
    base.extend([
        "--iters",
        "20",
        "--warmup",
        "5",
        "--log-interval",
        "1",
        "--eval-interval",
        "100",
        "--eval-iters",
        "2",
        "--sample",
        "0",
        "--optimizer",
        optimizer,
    ]);
    let run = |extra: &[&str]| cli_ok(base.iter().chain(&["--batch", "4"]).chain(extra)).0;
    let full = run(&["--checkpoint", ck, "--checkpoint-interval", "10"]);
    assert!(full.contains("checkpoint"), "{full}");
    let mid = dir.join("iter-0000010");
    let resumed = run(&["--resume", mid.to_str().unwrap()]);
    assert!(resumed.contains("resumed from"), "{resumed}");
    let (a, b) = (logged_losses(&full), logged_losses(&resumed));
    assert_eq!(
        b.keys().copied().collect::<Vec<_>>(),
        (10..20).collect::<Vec<_>>()
    );
    for (it, loss) in &b {
        assert_eq!(Some(loss), a.get(it), "iteration {it}");
    }
    let summary = |s: &str| {
        let l = s
            .lines()
            .find(|l| l.starts_with("summary"))
            .unwrap_or_else(|| panic!("no summary line in:\n{s}"));
        let v: serde_json::Value = serde_json::from_str(&l["summary ".len()..]).unwrap();
        (v["final_train_loss"].clone(), v["final_val_loss"].clone())
    };
    assert_eq!(summary(&full), summary(&resumed));
    // The newest checkpoint (iteration 20) of a run with another global batch: refused.
    let err = cli_err(base.iter().chain(&["--batch", "8", "--resume", ck]));
    assert!(err.contains("--batch (global) 4"), "{err}");
    // The same checkpoint into another optimizer: refused by name.
    let other = if optimizer == "adamw" {
        "prodigy"
    } else {
        "adamw"
    };
    let mut args: Vec<&str> = base.to_vec();
    let at = args.len() - 1;
    args[at] = other;
    let err = cli_err(args.iter().chain(&["--batch", "4", "--resume", ck]));
    assert!(
        err.contains("this run's optimizer is"),
        "{optimizer}: {err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
