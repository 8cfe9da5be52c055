//! The CLI as a user runs it.

use assert_cmd::Command;

#[test]
fn demo_runs_on_the_cpu_by_request() {
    let out = Command::cargo_bin("hybrid-trainer")
        .unwrap()
        .args(["--device", "cpu", "demo", "--size", "96"])
        .assert()
        .success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
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
        let out = Command::cargo_bin("hybrid-trainer")
            .unwrap()
            .args(&args)
            .assert()
            .failure();
        let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
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

/// A small corpus in a fresh temp file (removed on drop).
struct Corpus(std::path::PathBuf);

impl Corpus {
    fn new(test: &str) -> Corpus {
        let path =
            std::env::temp_dir().join(format!("hybrid-trainer-{test}-{}.txt", std::process::id()));
        std::fs::write(
            &path,
            "the quick brown fox jumps over the lazy dog. ".repeat(40),
        )
        .unwrap();
        Corpus(path)
    }
}

impl Drop for Corpus {
    fn drop(&mut self) {
        std::fs::remove_file(&self.0).ok();
    }
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

/// `--batch 4294967295 --block 4294967295` aborted the process ("memory allocation of
/// 6597069765120 bytes failed", exit 134) building a position table for a context far longer
/// than the corpus: the context is now checked against the splits first.
#[test]
fn train_gpt_rejects_a_block_longer_than_the_corpus() {
    let corpus = Corpus::new("long-block");
    let err = train_gpt_fails_cleanly(&corpus, &["--batch", "4294967295", "--block", "4294967295"]);
    assert!(
        err.contains("--block 4294967295") && err.contains("split of"),
        "{err}"
    );
}

/// A context that fits but a batch·block product no host can hold (about 1 TiB of token ids):
/// a typed out-of-memory error naming the flags, not an overflow panic or an abort.
#[test]
fn train_gpt_reports_a_batch_too_large_to_hold_as_an_error() {
    let corpus = Corpus::new("huge-batch");
    let err = train_gpt_fails_cleanly(&corpus, &["--batch", "4294967295", "--block", "64"]);
    assert!(
        err.contains("--batch 4294967295 x --block 64") && err.contains("out of"),
        "{err}"
    );
}
