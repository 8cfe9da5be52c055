//! `train-gpt --ema-decay` on the CPU: the average is the host-computed average of the weights
//! the run went through, keeping and evaluating it changes nothing in training, a resume goes
//! on with it, and the flag's misuses are refused.

mod common;

use common::parse_args;
use gpu_core::Device;
use std::path::Path;
use trainer::tensor_file::{read_tensors, HostTensors};
use trainer::train_args::TrainArgs;
use trainer::train_curve::RunCurve;
use trainer::train_gpt::run_with_curve;

/// A 1-layer GPT × 32 at a high rate (each step moves the weights visibly), dropout on.
fn args(extra: &[&str]) -> Result<TrainArgs, clap::Error> {
    parse_args(
        "ema",
        "--layers 1 --heads 2 --embd 32 --block 16 --batch 4 \
         --warmup 2 --lr 1e-2 --min-lr 1e-3 --dropout 0.1 --eval-iters 2 --sample 0 \
         --log-interval 1000 --eval-splits val --eval-fixed --seed 11",
        extra,
    )
}

fn run(extra: &[&str]) -> anyhow::Result<RunCurve> {
    run_with_curve(Device::Cpu, &args(extra).unwrap()).map(|r| r.1)
}

fn tensors(path: &Path) -> HostTensors {
    read_tensors(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// After each of 6 steps (checkpoints at every step) the average equals the f64 host average
/// of the checkpointed weights, started at the initial weights, with the decay's warm-up
/// (0.1, 2/11, 1/4, then D = 0.3): within 1e-6 + 1e-5·|value| per element. A wrong update
/// weight or order misses by about 0.1 of a step's change (the steps move weights by ~1e-3
/// and more at this rate: checked too).
#[test]
fn the_average_is_the_host_average_of_the_weights() {
    let dir = tempfile::tempdir().unwrap();
    let init = dir.path().join("init.safetensors");
    run(&["--iters", "0", "--save", init.to_str().unwrap()]).unwrap();
    let ck = dir.path().join("ck");
    let c = run(&[
        "--iters",
        "6",
        "--eval-interval",
        "100",
        "--ema-decay",
        "0.3",
        "--checkpoint",
        ck.to_str().unwrap(),
        "--checkpoint-interval",
        "1",
    ])
    .unwrap();
    let rec = c.ema.expect("the curve records the average");
    assert_eq!((rec.decay, rec.updates), (0.3, 6));
    let mut host: std::collections::HashMap<String, Vec<f64>> = tensors(&init)
        .into_iter()
        .map(|(k, (_, v))| (k, v.into_iter().map(f64::from).collect()))
        .collect();
    let mut moved = 0.0f64;
    for k in 1..=6u32 {
        let sub = ck.join(format!("iter-{k:07}"));
        let w = tensors(&sub.join("model.safetensors"));
        let ema = tensors(&sub.join("ema.safetensors"));
        assert_eq!(ema.len(), host.len());
        let t = (k - 1) as f64;
        let d = 0.3f64.min((1.0 + t) / (10.0 + t));
        for (name, h) in host.iter_mut() {
            let (_, wv) = &w[name];
            let (_, ev) = &ema[name];
            for ((h, &x), &e) in h.iter_mut().zip(wv).zip(ev) {
                moved = moved.max((x as f64 - *h).abs());
                *h = d * *h + (1.0 - d) * x as f64;
                let bound = 1e-6 + 1e-5 * h.abs();
                assert!(
                    (e as f64 - *h).abs() <= bound,
                    "step {k}, {name}: {e} vs {h}"
                );
            }
        }
    }
    assert!(moved > 1e-3, "the weights hardly moved: {moved}");
}

/// 30 steps with evaluations every 10: with `--ema-decay` the training curve (every loss,
/// counter and rate, bit for bit) and the final weights (byte for byte) are the run's without
/// it; only `ema_val` is added, finite, and it differs from `val` (it is another model).
#[test]
fn evaluating_the_average_does_not_change_training() {
    let dir = tempfile::tempdir().unwrap();
    let (plain, with) = (dir.path().join("a.st"), dir.path().join("b.st"));
    let base = ["--iters", "30", "--eval-interval", "10"];
    let a = run(&[&base[..], &["--save", plain.to_str().unwrap()]].concat()).unwrap();
    let b = run(&[
        &base[..],
        &["--save", with.to_str().unwrap(), "--ema-decay", "0.9"],
    ]
    .concat())
    .unwrap();
    assert_eq!(a.evals.len(), 4);
    assert_eq!(a.evals.len(), b.evals.len());
    for (x, y) in a.evals.iter().zip(&b.evals) {
        assert_eq!(
            (x.iter, x.backward, x.forward),
            (y.iter, y.backward, y.forward)
        );
        assert_eq!(x.val.to_bits(), y.val.to_bits(), "iteration {}", x.iter);
        assert_eq!(x.lr.to_bits(), y.lr.to_bits());
        assert!(x.ema_val.is_nan() && y.ema_val.is_finite(), "{y:?}");
    }
    // At iteration 0 the average is the initial weights: the same loss.
    assert_eq!(b.evals[0].ema_val.to_bits(), b.evals[0].val.to_bits());
    assert!(
        b.evals[1..].iter().any(|e| e.ema_val != e.val),
        "{:?}",
        b.evals
    );
    assert!(a.ema.is_none() && b.ema.is_some());
    assert_eq!(
        std::fs::read(&plain).unwrap(),
        std::fs::read(&with).unwrap()
    );
}

/// A run resumed from its iteration-10 checkpoint goes on with the average: the same
/// evaluations of the weights and of the average at 20 as the uninterrupted run, bit for bit.
/// Resuming it without the flag, with another decay, or a checkpoint without an average with
/// the flag, is refused.
#[test]
fn a_resume_keeps_the_average() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let ck = ck.to_str().unwrap();
    let base = [
        "--iters",
        "20",
        "--eval-interval",
        "10",
        "--ema-decay",
        "0.8",
    ];
    let full = run(&[
        &base[..],
        &["--checkpoint", ck, "--checkpoint-interval", "10"],
    ]
    .concat())
    .unwrap();
    let mid = dir.path().join("ck").join("iter-0000010");
    let mid = mid.to_str().unwrap();
    let resumed = run(&[&base[..], &["--resume", mid]].concat()).unwrap();
    assert_eq!(full.evals.len(), 3);
    assert_eq!(resumed.evals.len(), 3);
    for (x, y) in full.evals.iter().zip(&resumed.evals) {
        assert_eq!(x.iter, y.iter);
        assert_eq!(x.val.to_bits(), y.val.to_bits(), "iteration {}", x.iter);
        assert_eq!(
            x.ema_val.to_bits(),
            y.ema_val.to_bits(),
            "iteration {}",
            x.iter
        );
    }
    assert_eq!(resumed.ema.unwrap().updates, 20);
    let err = run(&["--iters", "20", "--resume", mid]).unwrap_err();
    assert!(
        format!("{err:#}").contains("with its --ema-decay"),
        "{err:#}"
    );
    let other = [&base[..4], &["--ema-decay", "0.5", "--resume", mid]].concat();
    let err = run(&other).unwrap_err();
    assert!(format!("{err:#}").contains("decay 0.8"), "{err:#}");
    let plain = dir.path().join("plain");
    let plain = plain.to_str().unwrap();
    run(&["--iters", "10", "--checkpoint", plain]).unwrap();
    let err = run(&[&base[..], &["--resume", plain]].concat()).unwrap_err();
    assert!(format!("{err:#}").contains("keeps no average"), "{err:#}");
}

/// The flag's misuses: a decay outside (0, 1) is a parse error; the hybrid and Schedule-Free
/// AdamW refuse it before training.
#[test]
fn the_flag_refuses_what_it_cannot_do() {
    for bad in ["1", "0", "-0.5", "nan", "1.5", "x"] {
        assert!(args(&["--ema-decay", bad]).is_err(), "{bad}");
    }
    let with_ema = |more: &[&str]| run(&[&["--iters", "2", "--ema-decay", "0.9"], more].concat());
    for (more, why) in [
        (["--mode", "hybrid"], "rollbacks"),
        (["--optimizer", "schedule-free"], "Schedule-Free"),
    ] {
        let err = with_ema(&more).unwrap_err();
        assert!(format!("{err:#}").contains(why), "{err:#}");
    }
    let c = with_ema(&["--optimizer", "prodigy"]).unwrap();
    assert!(c.evals.iter().all(|e| e.ema_val.is_finite()));
}
