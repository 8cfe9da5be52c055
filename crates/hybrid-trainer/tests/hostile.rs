//! The CLI tried as a hostile user would (issue 39): bad model directories, FIFOs and devices
//! in place of files, configs that would hang or exhaust memory. Each must be a clear error,
//! quickly; every run has a time limit, so a regression fails instead of hanging.

mod common;

use std::path::Path;
use std::time::Duration;

use assert_cmd::Command;
use common::{binary, fixture};

/// A copy of fixture `name` (its model files and expectations) in a fresh directory.
fn copy_fixture(name: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "expected.safetensors",
    ] {
        std::fs::copy(fixture(name).join(f), tmp.path().join(f)).unwrap();
    }
    tmp
}

fn mkfifo(path: &Path) {
    let _ = std::fs::remove_file(path);
    let ok = std::process::Command::new("mkfifo").arg(path).status();
    assert!(ok.unwrap().success());
}

/// Runs the CLI on the CPU with `args`, with a 60 s limit.
fn cli(args: &[&str]) -> assert_cmd::assert::Assert {
    Command::new(binary())
        .args(["--device", "cpu"])
        .args(args)
        .timeout(Duration::from_secs(60))
        .assert()
}

/// Runs the CLI on the CPU with `args`, which must fail within 60 s; its stderr.
fn cli_err(args: &[&str]) -> String {
    let out = cli(args).failure();
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(
        !err.is_empty(),
        "{args:?}: no message (killed by the time limit?)"
    );
    err
}

/// Runs the CLI on the CPU with `args`, which must succeed within 60 s; its stderr.
fn cli_ok(args: &[&str]) -> String {
    String::from_utf8_lossy(&cli(args).success().get_output().stderr).into_owned()
}

/// `experiment` for one run of W5 (AdamW, seed 1) on `data`, curves under `out`.
fn w5_adamw_seed1<'a>(data: &'a str, out: &'a str) -> [&'a str; 11] {
    [
        "experiment",
        "--workloads",
        "w5",
        "--arms",
        "adamw",
        "--seeds",
        "1",
        "--data",
        data,
        "--out",
        out,
    ]
}

/// A short text corpus written into `dir`.
fn small_corpus(dir: &Path) -> std::path::PathBuf {
    let data = dir.join("corpus.txt");
    std::fs::write(&data, "to be or not to be ".repeat(200)).unwrap();
    data
}

#[test]
fn a_bad_model_directory_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let f = file.display().to_string();
    let cases = [
        (
            "/nonexistent-model",
            "model directory /nonexistent-model does not exist",
        ),
        (f.as_str(), "is not a directory"),
        ("/dev/zero", "model directory /dev/zero is not a directory"),
    ];
    for (dir, says) in cases {
        for cmd in [
            &["generate", "--model", dir, "--prompt", "hi"][..],
            &["perplexity", "--model", dir, "--text", &f],
            &["check-hf", "--model", dir],
        ] {
            let err = cli_err(cmd);
            assert!(err.contains(says), "{cmd:?}: {err}");
            assert!(!err.contains("tokenizer.json"), "{cmd:?}: {err}");
        }
    }
}

#[test]
fn fifos_in_place_of_files_are_refused_not_read() {
    let tmp = copy_fixture("gpt2");
    let d = tmp.path().display().to_string();
    let text = tmp.path().join("text.fifo");
    mkfifo(&text);
    let t = text.display().to_string();
    let err = cli_err(&["perplexity", "--model", &d, "--text", &t]);
    assert!(
        err.contains(&format!("text {t} is not a regular file")),
        "{err}"
    );
    mkfifo(&tmp.path().join("expected.safetensors"));
    let err = cli_err(&["check-hf", "--model", &d]);
    assert!(
        err.contains("expected.safetensors is not a regular file"),
        "{err}"
    );
    mkfifo(&tmp.path().join("config.json"));
    let err = cli_err(&["generate", "--model", &d, "--prompt", "hi"]);
    assert!(err.contains("config.json is not a regular file"), "{err}");
}

#[test]
fn an_experiment_whose_runs_fail_exits_with_an_error() {
    // An empty corpus: every `train-gpt` run refuses it. The experiment used to print
    // "failed" per run and exit 0, so a script calling it went on as if the runs existed.
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("empty.txt");
    std::fs::write(&data, "").unwrap();
    let out = tmp.path().join("runs");
    let (data, out) = (data.to_str().unwrap(), out.to_str().unwrap());
    let err = cli_err(&w5_adamw_seed1(data, out));
    assert!(err.contains("1 of 1 runs failed"), "{err}");
    assert!(
        err.contains("W5 AdamW seed 1") || err.contains("seed 1"),
        "{err}"
    );
}

#[test]
fn a_fifo_in_place_of_a_curve_is_refused_or_skipped_not_read() {
    // The experiment reads the curves under --out: to skip runs already made, and for the
    // report. A FIFO there used to block the read forever.
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("runs");
    std::fs::create_dir_all(out.join("w5")).unwrap();
    let curve = out.join("w5").join("adamw-seed1.json");
    mkfifo(&curve);
    let data = small_corpus(tmp.path());
    let (data, o) = (data.to_str().unwrap(), out.to_str().unwrap());
    let run = w5_adamw_seed1(data, o);
    let err = cli_err(&run);
    let c = curve.display().to_string();
    assert!(
        err.contains(&format!("curve {c} is not a regular file")),
        "{err}"
    );
    let report = tmp.path().join("report.md");
    let r = report.to_str().unwrap();
    let err = cli_ok(&[&run[..], &["--report", r]].concat());
    assert!(
        err.contains(&format!("curve {c} is not a regular file")),
        "{err}"
    );
    assert!(report.exists());
}

#[test]
fn a_fifo_or_device_as_an_output_is_refused_not_opened() {
    // Opening a FIFO for writing blocks until a reader comes: outputs are checked first.
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("out.fifo");
    mkfifo(&fifo);
    let f = fifo.display().to_string();
    let out = tmp.path().join("runs");
    let o = out.to_str().unwrap();
    let err = cli_err(&[
        "experiment",
        "--workloads",
        "w5",
        "--out",
        o,
        "--report",
        &f,
    ]);
    assert!(
        err.contains(&format!("report {f} is not a regular file")),
        "{err}"
    );
    let data = small_corpus(tmp.path());
    let d = data.to_str().unwrap();
    std::fs::create_dir_all(&out).unwrap();
    let report = out.join("report.md");
    mkfifo(&report);
    let err = cli_err(&["--out", o, "--data", d]);
    let r = report.display().to_string();
    assert!(
        err.contains(&format!("report {r} is not a regular file")),
        "{err}"
    );
    for curve in [f.as_str(), "/dev/null"] {
        let err = cli_err(&["train-gpt", "--data", d, "--curve", curve]);
        assert!(
            err.contains(&format!("curve {curve} is not a regular file")),
            "{err}"
        );
    }
}

#[test]
fn a_lying_curve_is_named_and_left_out_of_the_report() {
    // A curve whose evaluations run backwards (hand-edited, or two files spliced) used to be
    // costed at its first listed evaluation below the target: its last step's. A curve of
    // another seed, mode or rate than its name's would be counted as that run. The committed
    // curves are compiled in: the GPU bundle runs this binary with no source tree beside it.
    let text = include_str!("../../../docs/results-curves/issue41/w5/adamw-seed1.json");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("runs");
    std::fs::create_dir_all(out.join("w5")).unwrap();
    let mut reversed: serde_json::Value = serde_json::from_str(text).unwrap();
    reversed["evals"].as_array_mut().unwrap().reverse();
    let seed1 = out.join("w5").join("adamw-seed1.json");
    std::fs::write(&seed1, reversed.to_string()).unwrap();
    let seed2 = out.join("w5").join("adamw-seed2.json");
    std::fs::write(&seed2, text).unwrap();
    // Seed 3 as it was written: the only run the report may count.
    let seed3 = out.join("w5").join("adamw-seed3.json");
    let adamw3 = include_str!("../../../docs/results-curves/issue41/w5/adamw-seed3.json");
    std::fs::write(&seed3, adamw3).unwrap();
    // Another arm's runs under this arm's names: H41's seed 4, AdamW's seed 1 as AdamW at 2×.
    let seed4 = out.join("w5").join("adamw-seed4.json");
    let hybrid4 = include_str!("../../../docs/results-curves/issue41/w5/hybrid-seed4.json");
    std::fs::write(&seed4, hybrid4).unwrap();
    let double = out.join("w5").join("adamwdouble-seed1.json");
    std::fs::write(&double, text).unwrap();
    let report = tmp.path().join("report.md");
    let (o, r) = (out.to_str().unwrap(), report.to_str().unwrap());
    let args = [
        "experiment",
        "--workloads",
        "w5",
        "--arms",
        "adamw,adamw-double",
        "--out",
        o,
    ];
    let err = cli_ok(&[&args[..], &["--report", r]].concat());
    let named = |p: &Path, why: &str| err.contains(&format!("{}: {why}", p.display()));
    assert!(named(&seed1, "evaluation 1: iter"), "{err}");
    assert!(named(&seed2, "its seed is 1, its name says 2"), "{err}");
    assert!(
        named(&seed4, "its mode is hybrid, adamw runs adamw"),
        "{err}"
    );
    assert!(
        named(&double, "its rate is 1e-3, adamw-x2 runs 2e-3"),
        "{err}"
    );
    let md = std::fs::read_to_string(&report).unwrap();
    let row = md
        .lines()
        .find(|l| l.starts_with("| adamw |"))
        .unwrap_or_else(|| panic!("{md}"));
    assert!(row.contains("| 1/1 |"), "{row}");
}
