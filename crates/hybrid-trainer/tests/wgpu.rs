//! The CLI on wgpu (`--device wgpu`; on CI, Mesa's lavapipe): a short `train-gpt` run of a tiny
//! model gives the CPU's losses, `generate` prints `transformers`' greedy text for committed
//! Hugging Face fixtures, and the matmul demo checks itself against the CPU. Each test
//! skips with `SKIP <test>: no wgpu adapter (<reason>)` where there is none, and fails instead
//! with `HYBRID_REQUIRE_WGPU=1`.

mod common;

use common::{cli_err, cli_ok, generate_args, loss_lines, prompt_and_greedy_text, Corpus};

/// Whether a wgpu adapter exists (else the skip is reported).
fn has_wgpu(test: &str) -> bool {
    gpu_wgpu::testing::backend_or_skip(test).is_some()
}

/// `iter N: loss X` of `train-gpt`'s output, in order.
fn logged_losses(out: &str) -> Vec<(u32, f32)> {
    loss_lines(out)
        .into_iter()
        .filter_map(|(it, loss)| Some((it, loss.parse().ok()?)))
        .collect()
}

/// A number field of the `summary {json}` line.
fn summary_field(out: &str, key: &str) -> f64 {
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("summary "))
        .unwrap_or_else(|| panic!("no summary line in {out}"));
    let json: serde_json::Value = serde_json::from_str(line).unwrap();
    json[key]
        .as_f64()
        .unwrap_or_else(|| panic!("summary has no number {key}: {line}"))
}

/// `train-gpt` on `device` with a one-layer GPT for 6 steps (and `extra` flags); its stdout.
fn train_gpt(device: &str, data: &str, extra: &[&str]) -> String {
    let mut args = common::tiny_gpt(device, data);
    args.extend([
        "--batch",
        "4",
        "--iters",
        "6",
        "--warmup",
        "2",
        "--dropout",
        "0.1",
        "--log-interval",
        "1",
        "--eval-interval",
        "3",
        "--eval-iters",
        "2",
        "--sample",
        "24",
    ]);
    cli_ok(args.iter().chain(extra)).0
}

/// `train-gpt --device wgpu --precision bf16` gives the CPU's bf16 run within bf16's bounds
/// (`models`' `tests/wgpu.rs` derives them): each logged and final loss within 2⁻⁸ relative.
#[test]
fn train_gpt_bf16_on_wgpu_matches_the_cpu() {
    const T: &str = "train_gpt_bf16_on_wgpu_matches_the_cpu";
    if !has_wgpu(T) {
        return;
    }
    let corpus = Corpus::new("wgpu-train-bf16");
    let data = corpus.0.to_str().unwrap();
    let bf16 = ["--precision", "bf16"];
    let (cpu, gpu) = (
        train_gpt("cpu", data, &bf16),
        train_gpt("wgpu", data, &bf16),
    );
    assert!(gpu.contains("on wgpu:0, bf16"), "{gpu}");
    let (lc, lg) = (logged_losses(&cpu), logged_losses(&gpu));
    assert_eq!(lg.len(), 6, "{gpu}");
    let close = |a: f64, b: f64| a.is_finite() && (a - b).abs() <= b.abs() / 256.0;
    for ((it, a), (_, b)) in lg.iter().zip(&lc) {
        assert!(
            close(*a as f64, *b as f64),
            "iteration {it}: wgpu {a}, cpu {b}"
        );
    }
    for key in ["final_train_loss", "final_val_loss"] {
        let (a, b) = (summary_field(&gpu, key), summary_field(&cpu, key));
        assert!(close(a, b), "{key}: wgpu {a}, cpu {b}");
    }
}

/// `train-gpt --device wgpu` trains a one-layer GPT for 6 steps (dropout on, clipping, two
/// evaluations) with each optimizer (AdamW, Schedule-Free AdamW, Prodigy) and gives the CPU's
/// run: each logged loss within 2e-4 (they are printed to 4 decimals; the runs agree to ~1e-6
/// relative, `models`' `tests/wgpu.rs`) and the final train and validation losses within 1e-4
/// relative, with the same sampled text.
#[test]
fn train_gpt_on_wgpu_matches_the_cpu() {
    const T: &str = "train_gpt_on_wgpu_matches_the_cpu";
    if !has_wgpu(T) {
        return;
    }
    let corpus = Corpus::new("wgpu-train");
    let data = corpus.0.to_str().unwrap();
    for optimizer in ["adamw", "schedule-free", "prodigy"] {
        let extra = ["--optimizer", optimizer];
        let (cpu, gpu) = (
            train_gpt("cpu", data, &extra),
            train_gpt("wgpu", data, &extra),
        );
        println!("{optimizer}:\n{gpu}");
        assert!(gpu.contains("on wgpu:0"), "{gpu}");
        assert!(gpu.contains("\"device\":\"wgpu:0\""), "{gpu}");
        compare_runs(optimizer, &cpu, &gpu);
    }
}

/// The checks of [`train_gpt_on_wgpu_matches_the_cpu`] on one pair of runs.
fn compare_runs(optimizer: &str, cpu: &str, gpu: &str) {
    let (lc, lg) = (logged_losses(cpu), logged_losses(gpu));
    assert_eq!(
        lg.iter().map(|l| l.0).collect::<Vec<_>>(),
        (0..6).collect::<Vec<_>>()
    );
    for ((it, a), (_, b)) in lg.iter().zip(&lc) {
        assert!(
            a.is_finite() && (a - b).abs() <= 2e-4,
            "{optimizer} iteration {it}: wgpu {a}, cpu {b}"
        );
    }
    for key in ["final_train_loss", "final_val_loss"] {
        let (a, b) = (summary_field(gpu, key), summary_field(cpu, key));
        assert!(
            (a - b).abs() <= 1e-4 * b.abs(),
            "{optimizer} {key}: wgpu {a}, cpu {b}"
        );
    }
    let sample = |s: &str| {
        let l: Vec<&str> = s.lines().collect();
        let i = l
            .iter()
            .position(|x| *x == "--- sample ---")
            .expect("a sample");
        l[i + 1].to_string()
    };
    // Temperature 0.8, top-k 20, the same seed: the same draws, so the same text (a token could
    // differ only where a draw fell within the logits' ~1e-6 difference of a boundary).
    assert_eq!(sample(gpu), sample(cpu), "{optimizer}: the sampled text");
}

/// The matmul demo on wgpu: round trip, the 2×2 product, and the product against f64 dot
/// products and against the CPU backend (it fails itself past 1e-5). An adapter index that
/// does not exist is a clean error naming wgpu.
#[test]
fn demo_runs_on_wgpu_and_checks_itself_against_the_cpu() {
    const T: &str = "demo_runs_on_wgpu_and_checks_itself_against_the_cpu";
    if !has_wgpu(T) {
        return;
    }
    let (out, _) = cli_ok(["--device", "wgpu", "demo", "--size", "64"]);
    assert!(out.contains("device: wgpu:0"), "{out}");
    assert!(
        out.contains("2x2 matmul") && out.contains("vs CPU"),
        "{out}"
    );
    // HYBRID_DEVICE names it as well as --device does.
    let out = assert_cmd::Command::new(common::binary())
        .env("HYBRID_DEVICE", "wgpu:0")
        .args(["demo", "--size", "16"])
        .assert()
        .success();
    let out = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert!(
        out.contains("device wgpu:0 (HYBRID_DEVICE=wgpu:0)"),
        "{out}"
    );
    let err = cli_err(["--device", "wgpu:63", "demo", "--size", "8"]);
    assert!(
        err.contains("adapter 63 does not exist") && !err.contains("panicked"),
        "{err}"
    );
}

/// `generate --device wgpu` with the reference engine and the fast one (f32) prints the
/// 16 greedy tokens `transformers` computed for the fixture (`expected.safetensors`).
#[test]
fn generate_on_wgpu_prints_transformers_greedy_text() {
    const T: &str = "generate_on_wgpu_prints_transformers_greedy_text";
    if !has_wgpu(T) {
        return;
    }
    for name in ["llama3", "gpt2"] {
        let (d, text, want) = prompt_and_greedy_text(name);
        let base = generate_args("wgpu", &d, &text, "16");
        for engine in [&[][..], &["--engine", "fast", "--dtype", "f32"][..]] {
            let (stdout, stderr) = cli_ok(base.iter().chain(&["--ignore-eos"]).chain(engine));
            assert!(
                stdout.ends_with(&format!("{want}\n")),
                "{name} {engine:?}: {stdout:?} does not end with {want:?}"
            );
            assert!(
                stderr.contains("16 new tokens"),
                "{name} {engine:?}: {stderr}"
            );
            assert!(
                stdout.starts_with("device wgpu:0 (--device)"),
                "{name} {engine:?}: {stdout}"
            );
        }
    }
}

/// `train-gpt --checkpoint` on wgpu, then `--resume` from its iteration-3 checkpoint on wgpu,
/// continues the run bit for bit (the same logged losses at iterations 3–5, the same final
/// evaluation in full); resumed on the CPU, the same checkpoint gives the wgpu run's losses
/// within the cross-device bounds of `train_gpt_on_wgpu_matches_the_cpu`.
#[test]
fn train_gpt_checkpoints_on_wgpu_resume_on_wgpu_and_the_cpu() {
    const T: &str = "train_gpt_checkpoints_on_wgpu_resume_on_wgpu_and_the_cpu";
    if !has_wgpu(T) {
        return;
    }
    let corpus = Corpus::new("wgpu-ckpt");
    let data = corpus.0.to_str().unwrap();
    let dir = std::env::temp_dir().join(format!("train-gpt-wgpu-ckpt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ck = dir.to_str().unwrap();
    let full = train_gpt(
        "wgpu",
        data,
        &["--checkpoint", ck, "--checkpoint-interval", "3"],
    );
    let mid = dir.join("iter-0000003");
    let mid = mid.to_str().unwrap();
    let resumed = train_gpt("wgpu", data, &["--resume", mid]);
    let on_cpu = train_gpt("cpu", data, &["--resume", mid]);
    std::fs::remove_dir_all(&dir).ok();
    assert!(resumed.contains("resumed from"), "{resumed}");
    let (a, b) = (logged_losses(&full), logged_losses(&resumed));
    assert_eq!(b.iter().map(|l| l.0).collect::<Vec<_>>(), vec![3, 4, 5]);
    assert_eq!(b[..], a[3..], "the resumed wgpu run's losses");
    for key in ["final_train_loss", "final_val_loss"] {
        let (x, y) = (summary_field(&resumed, key), summary_field(&full, key));
        assert_eq!(x.to_bits(), y.to_bits(), "{key}: resumed {x}, full {y}");
    }
    let c = logged_losses(&on_cpu);
    assert_eq!(c.len(), 3, "{on_cpu}");
    for ((it, x), (_, y)) in c.iter().zip(&a[3..]) {
        assert!((x - y).abs() <= 2e-4, "iteration {it}: cpu {x}, wgpu {y}");
    }
    let (x, y) = (
        summary_field(&on_cpu, "final_val_loss"),
        summary_field(&full, "final_val_loss"),
    );
    assert!(
        (x - y).abs() <= 1e-4 * y.abs(),
        "final_val_loss: cpu {x}, wgpu {y}"
    );
}
