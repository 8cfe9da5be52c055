//! The hybrid trainer on a small MLP (not the GPT: the trainer is generic): phase transitions,
//! predicted steps that change every parameter tensor, rollback on an injected NaN and on an
//! injected divergence, plain AdamW's own divergence as a typed error, and the controls.

use hybrid_trainer::hybrid::{
    HybridConfig, HybridError, HybridTrainer, Mode, Objective, Phase, StepReport, WorldModelSize,
};
use rand::{Rng, SeedableRng};
use tensor_ops::nn::{Linear, Module, ParamStore};
use tensor_ops::optim::AdamWParams;
use tensor_ops::{Device, Tensor};

const DEV: Device = Device::Cpu;

/// A 3-layer MLP regressing a fixed random target; batches drawn from the step.
struct Mlp {
    dev: Device,
    store: ParamStore,
    layers: Vec<Linear>,
    x: Vec<f32>,
    y: Vec<f32>,
    /// Steps whose loss is replaced by NaN, and steps whose loss is multiplied by 100.
    nan_at: Vec<u64>,
    /// `nan_at` fires once (a transient fault; the list is then spent) rather than at every
    /// visit.
    nan_once: bool,
    blow_at: Vec<u64>,
    /// Hold-out losses returned instead of the real one, by call index.
    holdout_override: Vec<(usize, f32)>,
    holdout_calls: usize,
}

const N: usize = 256;
const IN: usize = 8;
const BATCH: usize = 32;

impl Mlp {
    fn new(seed: u64) -> Mlp {
        Mlp::on(seed, DEV)
    }

    fn on(seed: u64, dev: Device) -> Mlp {
        let store = ParamStore::new(dev, seed);
        let dims = [IN, 32, 32, 1];
        let layers = (0..3)
            .map(|i| {
                store
                    .pp(format!("l{i}"))
                    .linear(dims[i], dims[i + 1], true)
                    .unwrap()
            })
            .collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 7);
        let x: Vec<f32> = (0..N * IN).map(|_| rng.random_range(-1.0..1.0)).collect();
        let y = (0..N)
            .map(|i| (x[i * IN..i * IN + IN].iter().sum::<f32>()).sin())
            .collect();
        Mlp {
            dev,
            store,
            layers,
            x,
            y,
            nan_at: vec![],
            nan_once: false,
            blow_at: vec![],
            holdout_override: vec![],
            holdout_calls: 0,
        }
    }

    fn loss_on(&self, rows: &[usize]) -> anyhow::Result<Tensor> {
        let xs: Vec<f32> = rows
            .iter()
            .flat_map(|&r| self.x[r * IN..r * IN + IN].to_vec())
            .collect();
        let ys: Vec<f32> = rows.iter().map(|&r| self.y[r]).collect();
        let mut h = Tensor::from_vec(xs, &[rows.len(), IN], self.dev)?;
        for (i, l) in self.layers.iter().enumerate() {
            h = l.forward(&h)?;
            if i < 2 {
                h = h.relu()?;
            }
        }
        let d = h.sub(&Tensor::from_vec(ys, &[rows.len(), 1], self.dev)?)?;
        Ok(d.mul(&d)?.mean_all()?)
    }
}

impl Objective for Mlp {
    fn train_loss(&mut self, step: u64) -> anyhow::Result<Tensor> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(step.wrapping_mul(0x9E37) ^ 11);
        let rows: Vec<usize> = (0..BATCH).map(|_| rng.random_range(0..N - 64)).collect();
        let l = self.loss_on(&rows)?;
        if self.nan_at.contains(&step) {
            if self.nan_once {
                self.nan_at = vec![u64::MAX];
            }
            return Ok(l.mul_scalar(f32::NAN)?);
        }
        if self.blow_at.contains(&step) {
            return Ok(l.mul_scalar(100.0)?.add_scalar(10.0)?);
        }
        Ok(l)
    }

    fn holdout_loss(&mut self) -> anyhow::Result<f32> {
        let call = self.holdout_calls;
        self.holdout_calls += 1;
        if let Some(&(_, v)) = self.holdout_override.iter().find(|o| o.0 == call) {
            return Ok(v);
        }
        let rows: Vec<usize> = (N - 64..N).collect();
        Ok(tensor_ops::no_grad(|| self.loss_on(&rows))?.item()?)
    }
}

fn adamw() -> AdamWParams {
    AdamWParams {
        weight_decay: 0.01,
        max_grad_norm: Some(1.0),
        ..AdamWParams::default()
    }
}

/// A configuration that reaches predicted spans within a few dozen steps.
fn quick(mode: Mode) -> HybridConfig {
    HybridConfig {
        mode,
        warmup: 12,
        history: 6,
        rank: 2,
        context: 3,
        max_span: 3,
        full_between: 2,
        basis_every: 3,
        rssm_min_steps: 4,
        gate_disagreement: 1e6,
        gate_error: 1e6,
        holdout_every: 10,
        holdout_tolerance: 0.5,
        cooldown: 5,
        seed: 5,
        world: WorldModelSize {
            ensemble: 2,
            embed: 16,
            hidden: 16,
            latent: 4,
            head: 16,
        },
        ..HybridConfig::default()
    }
}

fn run(t: &mut HybridTrainer, m: &mut Mlp, steps: u64) -> Result<Vec<StepReport>, HybridError> {
    let mut out = Vec::new();
    while t.step_index() < steps {
        out.push(t.step(m, &|_| 3e-3)?);
        assert!(out.len() < 10 * steps as usize, "no progress");
    }
    Ok(out)
}

fn values(m: &Mlp) -> Vec<Vec<f32>> {
    m.store
        .params()
        .iter()
        .map(|p| p.tensor().to_vec().unwrap())
        .collect()
}

/// On every device (the CPU, then CUDA where present): the GpuAccelerator entry points run on
/// the model's device.
#[test]
fn phases_go_warmup_full_predict_correct_and_predicted_steps_move_every_tensor() {
    for dev in gpu_cuda::testing::devices("phases_go_warmup_full_predict_correct") {
        phases_on(dev);
    }
}

fn phases_on(dev: Device) {
    let mut m = Mlp::on(1, dev);
    let mut t = HybridTrainer::new(&m.store, adamw(), quick(Mode::Hybrid), 80).unwrap();
    assert_eq!(t.feature_width(), 24 + 5 * 6);
    let mut reports = Vec::new();
    let mut moved_all = false;
    while t.step_index() < 80 {
        let before = values(&m);
        let r = t.step(&mut m, &|_| 3e-3).unwrap();
        if r.phase == Phase::Predict {
            assert!(r.loss.is_none(), "no forward pass on a predicted step");
            let after = values(&m);
            let changed = before.iter().zip(&after).filter(|(a, b)| a != b).count();
            assert_eq!(
                changed,
                before.len(),
                "step {}: every tensor changes",
                r.step
            );
            moved_all = true;
        }
        reports.push(r);
    }
    let phases: Vec<Phase> = reports.iter().map(|r| r.phase).collect();
    assert!(phases[..12].iter().all(|&p| p == Phase::Warmup));
    assert!(phases.contains(&Phase::Full));
    assert!(moved_all, "some step was predicted: {phases:?}");
    // Every span ends in a correct step, and a span is at most max_span long.
    for (i, w) in phases.windows(2).enumerate() {
        if w[0] == Phase::Predict && w[1] != Phase::Predict {
            assert_eq!(w[1], Phase::Correct, "after step {i}");
        }
    }
    let longest = phases
        .split(|&p| p != Phase::Predict)
        .map(|s| s.len())
        .max()
        .unwrap();
    assert!(longest <= 3);
    let c = t.counters();
    assert_eq!(c.steps, 80);
    assert_eq!(c.backward_passes + c.predicted_steps, 80);
    assert!(c.predicted_steps > 0 && c.world_model_updates > 0);
    assert!(reports.iter().all(|r| r.loss.is_none_or(f32::is_finite)));
}

#[test]
fn a_refusing_gate_keeps_every_step_full() {
    let mut m = Mlp::new(2);
    let cfg = HybridConfig {
        gate_error: 0.0,
        ..quick(Mode::Hybrid)
    };
    let mut t = HybridTrainer::new(&m.store, adamw(), cfg, 60).unwrap();
    let r = run(&mut t, &mut m, 60).unwrap();
    assert!(r.iter().all(|r| r.phase != Phase::Predict));
    assert_eq!(t.counters().backward_passes, 60);
    // The world model was scored on full steps all along.
    assert!(r.iter().any(|r| r.update_error.is_some()));
}

#[test]
fn an_injected_nan_after_a_predicted_step_rolls_back_and_the_run_finishes() {
    let mut m = Mlp::new(3);
    m.nan_once = true;
    let mut t = HybridTrainer::new(&m.store, adamw(), quick(Mode::Hybrid), 80).unwrap();
    let mut reports = Vec::new();
    while t.step_index() < 80 {
        let r = t
            .step(&mut m, &|_| 3e-3)
            .unwrap_or_else(|e| panic!("{e} after {reports:?}"));
        if r.phase == Phase::Predict && m.nan_at.is_empty() {
            // A transient NaN at whichever full step comes next.
            m.nan_at = (r.step + 1..r.step + 5).collect();
        }
        reports.push(r);
    }
    let rb: Vec<&StepReport> = reports.iter().filter(|r| r.rollback.is_some()).collect();
    assert_eq!(rb.len(), 1, "{rb:?}");
    assert!(rb[0].rollback.as_ref().unwrap().contains("NaN"), "{rb:?}");
    assert_eq!(t.counters().rollbacks, 1);
    // The step index went back to the good snapshot and the run went on to the end, with
    // finite weights.
    assert!(t.counters().steps > 80);
    assert!(values(&m).iter().flatten().all(|v| v.is_finite()));
    assert_eq!(t.step_index(), 80);
}

#[test]
fn an_injected_divergence_at_a_correct_step_rolls_back() {
    let mut m = Mlp::new(4);
    let mut t = HybridTrainer::new(&m.store, adamw(), quick(Mode::Hybrid), 200).unwrap();
    let mut blown = false;
    let mut rolled = false;
    while t.step_index() < 120 {
        let r = t.step(&mut m, &|_| 3e-3).unwrap();
        if r.phase == Phase::Predict && !blown {
            // Blow up whatever step comes next (a predicted or the correct step); only a
            // correct step's loss is checked, so blow up the next four.
            m.blow_at = (r.step + 1..r.step + 5).collect();
            blown = true;
        }
        if let Some(reason) = &r.rollback {
            assert!(reason.contains("trajectory"), "{reason}");
            rolled = true;
            m.blow_at.clear();
        }
    }
    assert!(blown && rolled);
}

#[test]
fn a_held_out_regression_after_predicted_steps_rolls_back() {
    let mut m = Mlp::new(6);
    // The third held-out check (step 30) reports a loss 10x the best.
    m.holdout_override = vec![(2, 1e3)];
    let cfg = HybridConfig {
        warmup: 8,
        ..quick(Mode::Hybrid)
    };
    let mut t = HybridTrainer::new(&m.store, adamw(), cfg, 60).unwrap();
    let r = run(&mut t, &mut m, 60).unwrap();
    let predicted_before_30 = r.iter().any(|r| r.step < 30 && r.phase == Phase::Predict);
    let rolled = r
        .iter()
        .any(|r| r.rollback.as_ref().is_some_and(|s| s.contains("held-out")));
    assert_eq!(rolled, predicted_before_30, "{r:?}");
}

#[test]
fn plain_adamw_divergence_is_a_typed_error_not_a_rollback_loop() {
    let mut m = Mlp::new(7);
    m.nan_at = vec![5];
    let mut t = HybridTrainer::new(&m.store, adamw(), quick(Mode::Hybrid), 40).unwrap();
    let e = run(&mut t, &mut m, 40).unwrap_err();
    assert!(matches!(e, HybridError::Diverged { step: 5, .. }), "{e}");
    let mut m = Mlp::new(7);
    m.nan_at = vec![5];
    let mut t = HybridTrainer::new(&m.store, adamw(), quick(Mode::Baseline), 40).unwrap();
    assert!(matches!(
        run(&mut t, &mut m, 40),
        Err(HybridError::Diverged { step: 5, .. })
    ));
}

#[test]
fn controls_predict_at_their_fraction_and_apply_what_they_say() {
    for (mode, moves) in [
        (Mode::SkipFreeze { fraction: 0.25 }, false),
        (Mode::ReapplyLast { fraction: 0.25 }, true),
    ] {
        let mut m = Mlp::new(8);
        let mut t = HybridTrainer::new(&m.store, adamw(), quick(mode), 52).unwrap();
        let mut predicted = 0;
        while t.step_index() < 52 {
            let before = values(&m);
            let r = t.step(&mut m, &|_| 3e-3).unwrap();
            if r.phase == Phase::Predict {
                predicted += 1;
                assert_eq!(values(&m) != before, moves, "{mode:?}");
            }
        }
        assert_eq!(
            predicted, 10,
            "{mode:?}: a quarter of the 40 steps after warm-up"
        );
        assert_eq!(t.counters().backward_passes, 42);
        assert!(t.timings().adamw > 0.0, "{mode:?}: full steps are timed");
        assert_eq!(t.timings().overhead(), 0.0, "{mode:?}: no predictor");
    }
}

#[test]
fn a_bad_config_is_a_typed_error() {
    let m = Mlp::new(9);
    for cfg in [
        HybridConfig {
            context: 9,
            history: 4,
            ..quick(Mode::Hybrid)
        },
        HybridConfig {
            rank: 0,
            ..quick(Mode::Hybrid)
        },
        HybridConfig {
            gate_error: f32::NAN,
            ..quick(Mode::Hybrid)
        },
        quick(Mode::SkipFreeze { fraction: 1.5 }),
    ] {
        let e = HybridTrainer::new(&m.store, adamw(), cfg, 10)
            .err()
            .unwrap();
        assert!(matches!(e, HybridError::Config { .. }), "{e}");
    }
}

fn bits(m: &Mlp) -> Vec<u32> {
    values(m).iter().flatten().map(|v| v.to_bits()).collect()
}

/// Interrupting a run at any step (in a predicted span, at its correct step, after a
/// rollback) and resuming from the checkpoint in a fresh process-like setup (new model, new
/// trainer) gives the run that would have happened: the same weights, bit for bit, and the
/// same per-step losses and phases.
#[test]
fn resume_from_a_checkpoint_continues_bit_for_bit() {
    for dev in gpu_cuda::testing::devices("resume_from_a_checkpoint_continues_bit_for_bit") {
        resume_on(dev);
    }
}

fn resume_on(dev: Device) {
    const STEPS: u64 = 60;
    let straight = |m: &mut Mlp| {
        let mut t = HybridTrainer::new(&m.store, adamw(), quick(Mode::Hybrid), STEPS).unwrap();
        let r = run(&mut t, m, STEPS).unwrap();
        (r, t.counters().clone())
    };
    let mut a = Mlp::on(10, dev);
    let (ra, ca) = straight(&mut a);
    assert!(ra.iter().any(|r| r.phase == Phase::Predict));
    let dir = std::env::temp_dir().join(format!("hybrid-resume-{}-{dev}", std::process::id()));
    for cut in [20u64, 27, 33, 41] {
        let mut b = Mlp::on(10, dev);
        let mut t = HybridTrainer::new(&b.store, adamw(), quick(Mode::Hybrid), STEPS).unwrap();
        let mut rb = run(&mut t, &mut b, cut).unwrap();
        t.save(&dir).unwrap();
        drop(t);
        // A fresh model (other initial weights) and trainer, then the checkpoint.
        let mut c = Mlp::on(99, dev);
        c.x = b.x.clone();
        c.y = b.y.clone();
        let mut t = HybridTrainer::new(&c.store, adamw(), quick(Mode::Hybrid), STEPS).unwrap();
        t.load(&dir).unwrap();
        assert_eq!(t.step_index(), cut);
        rb.extend(run(&mut t, &mut c, STEPS).unwrap());
        assert_eq!(bits(&c), bits(&a), "cut at {cut}");
        let key = |r: &StepReport| (r.step, r.phase, r.loss.map(f32::to_bits));
        assert_eq!(
            rb.iter().map(key).collect::<Vec<_>>(),
            ra.iter().map(key).collect::<Vec<_>>(),
            "cut at {cut}"
        );
        assert_eq!(t.counters(), &ca);
    }
    // A checkpoint of another layout is refused, leaving the trainer untouched.
    let other = ParamStore::new(dev, 1);
    other.pp("x").linear(3, 3, true).unwrap();
    let mut t = HybridTrainer::new(&other, adamw(), quick(Mode::Hybrid), STEPS).unwrap();
    let before: Vec<Vec<f32>> = other
        .params()
        .iter()
        .map(|p| p.tensor().to_vec().unwrap())
        .collect();
    assert!(matches!(t.load(&dir), Err(HybridError::Checkpoint(_))));
    let after: Vec<Vec<f32>> = other
        .params()
        .iter()
        .map(|p| p.tensor().to_vec().unwrap())
        .collect();
    assert_eq!(before, after);
    std::fs::remove_dir_all(&dir).ok();
}

/// With `predicted_forward`, a predicted step runs a forward pass (no backward): its loss is
/// reported and counted.
#[test]
fn predicted_steps_with_a_forward_pass_report_their_loss() {
    let mut m = Mlp::new(11);
    let cfg = HybridConfig {
        predicted_forward: true,
        ..quick(Mode::Hybrid)
    };
    let mut t = HybridTrainer::new(&m.store, adamw(), cfg, 60).unwrap();
    let r = run(&mut t, &mut m, 60).unwrap();
    let predicted: Vec<&StepReport> = r.iter().filter(|r| r.phase == Phase::Predict).collect();
    assert!(!predicted.is_empty());
    assert!(predicted.iter().all(|r| r.loss.is_some_and(f32::is_finite)));
    let c = t.counters();
    assert_eq!(c.backward_passes + c.predicted_steps, 60);
    // Every step ran a forward pass, plus the held-out checks.
    assert!(c.forward_passes >= 60, "{c:?}");
}

#[test]
fn a_store_without_parameters_is_a_typed_error() {
    let empty = ParamStore::new(DEV, 1);
    let e = HybridTrainer::new(&empty, adamw(), quick(Mode::Hybrid), 10)
        .err()
        .unwrap();
    assert!(
        matches!(e, HybridError::Config { field: "store", .. }),
        "{e}"
    );
}

/// A damaged checkpoint (unreadable JSON, a truncated tensor file, a missing directory) is a
/// typed error, and the trainer and the weights are left as they were.
#[test]
fn a_damaged_checkpoint_is_refused_without_a_trace() {
    let mut m = Mlp::new(12);
    let mut t = HybridTrainer::new(&m.store, adamw(), quick(Mode::Hybrid), 40).unwrap();
    run(&mut t, &mut m, 30).unwrap();
    let dir = std::env::temp_dir().join(format!("hybrid-damaged-{}", std::process::id()));
    t.save(&dir).unwrap();
    run(&mut t, &mut m, 35).unwrap();
    let (before, step) = (values(&m), t.step_index());
    let tensors = dir.join("trainer.safetensors");
    let full = std::fs::read(&tensors).unwrap();
    std::fs::write(&tensors, &full[..full.len() / 2]).unwrap();
    assert!(matches!(t.load(&dir), Err(HybridError::Checkpoint(_))));
    std::fs::write(&tensors, &full).unwrap();
    std::fs::write(dir.join("trainer.json"), "{ not json").unwrap();
    assert!(matches!(t.load(&dir), Err(HybridError::Checkpoint(_))));
    assert!(matches!(
        t.load(&dir.join("missing")),
        Err(HybridError::Checkpoint(_))
    ));
    assert_eq!(values(&m), before);
    assert_eq!(t.step_index(), step);
    // The trainer still works after the refusals.
    run(&mut t, &mut m, 40).unwrap();
    std::fs::remove_dir_all(&dir).ok();
}
