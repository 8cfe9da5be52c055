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
