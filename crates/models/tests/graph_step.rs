//! The captured GPT training step (`GraphedStep`, on `tensor_ops::graph`): replays give the
//! eager step's bits (loss, gradient norm, every parameter) over several steps with dropout,
//! clipping and a changing learning rate, on both GPT variants; bad calls are typed errors that
//! change nothing; the CPU refuses the captured step with a typed error (tensor-ops'
//! `graph_step.rs` tests the graphs of plain tensor code). Tests named `gpu_*` skip with a
//! printed reason where no GPU exists.

mod graph_common;

use graph_common::{
    assert_same_parameters, at_most_twice, bits, config, cpu_model, gpu_dataset, gpu_setup,
    step_twins,
};
use models::gpt::{Dataset, Gpt, GraphedStep, Variant};
use rand::{rngs::StdRng, Rng, SeedableRng};
use tensor_ops::graph::capture;
use tensor_ops::optim::{AdamW, AdamWParams};
use tensor_ops::{Device, GpuError, Precision, Tensor};

fn hp() -> AdamWParams {
    AdamWParams {
        beta1: 0.9,
        beta2: 0.99,
        eps: 1e-8,
        weight_decay: 0.1,
        // Small enough that the clip coefficient is below 1 in the first steps.
        max_grad_norm: Some(0.5),
    }
}

#[test]
fn gpu_graphed_gpt_steps_give_the_eager_steps_bits() {
    let test = "gpu_graphed_gpt_steps_give_the_eager_steps_bits";
    let Some((dev, seed, _, vocab)) = gpu_setup(test) else {
        return;
    };
    let (batch, block) = (3, 16);
    assert!(
        2 * vocab >= batch * block,
        "the corpus has too few distinct characters"
    );
    let runs = [Variant::Gpt2, Variant::Llama]
        .into_iter()
        .flat_map(|v| [Precision::Fp32, Precision::Bf16].map(|p| (v, p)));
    for (variant, precision) in runs {
        let mut cfg = config(variant, vocab, 32);
        if precision == Precision::Bf16 {
            // Head dimension 64: the bf16 tensor-core attention (other widths compute
            // attention in f32).
            (cfg.n_embd, cfg.n_head) = (128, 2);
        }
        let mut eager = Gpt::new(cfg, seed, dev).unwrap();
        let mut graphed = Gpt::new(cfg, seed, dev).unwrap();
        eager.set_precision(precision).unwrap();
        graphed.set_precision(precision).unwrap();
        let mut opt_e = eager.store().adamw(hp()).unwrap();
        let mut opt_g = graphed.store().adamw(hp()).unwrap();
        let step = GraphedStep::capture(&graphed, &mut opt_g, batch, block).unwrap();
        // Capturing ran nothing and counted no step.
        assert_eq!(opt_g.steps(), 0);
        assert_eq!(
            bits(&graphed.parameters()[0].1),
            bits(&eager.parameters()[0].1)
        );
        let mut r = StdRng::seed_from_u64(seed ^ 1);
        for it in 0..5u32 {
            let (x, y) = at_most_twice(&mut r, vocab, batch * block);
            let lr = 1e-3 * (1.0 + it as f32) * r.random_range(0.5f32..2.0);
            let drop_seed: u64 = r.random();
            step_twins(
                (&eager, &mut opt_e),
                (&step, &mut opt_g),
                (&x, &y, [batch, block]),
                (drop_seed, lr),
                &format!("{variant:?} {precision} step {it} (seed {seed})"),
            );
        }
        assert_eq!(opt_e.steps(), opt_g.steps());
        let label = format!("{variant:?} {precision}");
        assert_same_parameters(&eager, &graphed, &label, seed);
        // The moments too (the next step depends on them).
        let (me, ve) = opt_e.moments();
        let (mg, vg) = opt_g.moments();
        for i in 0..me.len() {
            assert_eq!(bits(&me[i]), bits(&mg[i]), "{variant:?} m[{i}]");
            assert_eq!(bits(&ve[i]), bits(&vg[i]), "{variant:?} v[{i}]");
        }
        assert!(step.memory_stats().bytes_cached > 0);
    }
}

#[test]
fn gpu_bad_graphed_steps_are_typed_errors_that_change_nothing() {
    let test = "gpu_bad_graphed_steps_are_typed_errors_that_change_nothing";
    let Some((dev, _, vocab)) = gpu_dataset(test) else {
        return;
    };
    let model = Gpt::new(config(Variant::Gpt2, vocab, 32), 7, dev).unwrap();
    let mut opt = model.store().adamw(hp()).unwrap();
    let step = GraphedStep::capture(&model, &mut opt, 2, 8).unwrap();
    let before: Vec<Vec<u32>> = model.parameters().iter().map(|p| bits(&p.1)).collect();
    let ok = vec![1u32; 16];
    let mut bad_id = ok.clone();
    bad_id[9] = vocab as u32;
    let mut other = model.store().adamw(hp()).unwrap();
    let cases: Vec<(&str, GpuError)> = vec![
        (
            "short x",
            step.step(&mut opt, &ok[..15], &ok, 1, 1e-3).unwrap_err(),
        ),
        (
            "id past the vocabulary",
            step.step(&mut opt, &ok, &bad_id, 1, 1e-3).unwrap_err(),
        ),
        (
            "NaN lr",
            step.step(&mut opt, &ok, &ok, 1, f32::NAN).unwrap_err(),
        ),
        (
            "negative lr",
            step.step(&mut opt, &ok, &ok, 1, -1.0).unwrap_err(),
        ),
        (
            "another optimiser",
            step.step(&mut other, &ok, &ok, 1, 1e-3).unwrap_err(),
        ),
    ];
    for (what, e) in &cases {
        eprintln!("{test}: {what}: {e}");
    }
    assert!(cases[1].1.to_string().contains("token id"));
    // Empty batches cannot be captured.
    for (b, t) in [(0, 8), (2, 0), (usize::MAX, 2)] {
        assert!(
            GraphedStep::capture(&model, &mut opt, b, t).is_err(),
            "{b} x {t}"
        );
    }
    assert_eq!(opt.steps(), 0);
    let after: Vec<Vec<u32>> = model.parameters().iter().map(|p| bits(&p.1)).collect();
    assert_eq!(before, after, "a refused step changed the parameters");
    // A capture that reads back to the host fails with a typed error and leaves the stream
    // usable.
    let t = Tensor::from_vec(vec![1.0f32; 4], &[4], dev).unwrap();
    let e = capture(dev, || t.mul_scalar(2.0)?.item()).unwrap_err();
    eprintln!("{test}: read-back inside a capture: {e}");
    assert_eq!(t.mul_scalar(2.0).unwrap().to_vec().unwrap(), vec![2.0; 4]);
    // Then a good step runs.
    step.step(&mut opt, &ok, &ok, 1, 1e-3).unwrap();
    assert!(step.loss().item().unwrap().is_finite());
    assert_eq!(opt.steps(), 1);
}

/// The captured GPT step and the scheduled AdamW step it replays are refused on the CPU
/// (the graph and device-offset refusals themselves are tensor-ops' `graph_step.rs`).
#[test]
fn graphed_steps_are_refused_on_the_cpu() {
    let (ds, model) = cpu_model(Variant::Gpt2);
    let mut opt: AdamW = model.store().adamw(hp()).unwrap();
    let e = GraphedStep::capture(&model, &mut opt, 2, 8).unwrap_err();
    assert!(e.to_string().contains("CUDA"), "{e}");
    let sched =
        Tensor::from_vec(opt.next_schedule(1e-3).unwrap().to_vec(), &[3], Device::Cpu).unwrap();
    let (x, y) = ds
        .batch(false, 2, 8, &mut Dataset::rng(3), Device::Cpu)
        .unwrap();
    let grads = model.loss(&x, &y, None).unwrap().backward().unwrap();
    let e = opt.step_scheduled(&grads, &sched).unwrap_err();
    assert!(e.to_string().contains("CUDA"), "{e}");
    assert_eq!(opt.steps(), 0);
}

/// The schedule a replay reads is the eager step's scalars, and `next_schedule` refuses what
/// `step` refuses.
#[test]
fn the_next_schedule_is_the_eager_steps_scalars() {
    let (_, model) = cpu_model(Variant::Gpt2);
    let mut opt = model.store().adamw(hp()).unwrap();
    let s1 = opt.next_schedule(2e-3).unwrap();
    let cfg = gpu_core::nn::AdamWConfig {
        lr: 2e-3,
        beta1: 0.9,
        beta2: 0.99,
        eps: 1e-8,
        step: 1,
    };
    assert_eq!(s1, gpu_core::nn::optim::adamw_schedule(cfg));
    opt.count_replayed_step().unwrap();
    let s2 = opt.next_schedule(2e-3).unwrap();
    assert_eq!(
        s2,
        gpu_core::nn::optim::adamw_schedule(gpu_core::nn::AdamWConfig { step: 2, ..cfg })
    );
    assert!(s2[1] < s1[1], "the bias correction shrinks the step size");
    assert!(opt.next_schedule(f32::NAN).is_err());
    assert!(opt.next_schedule(f32::INFINITY).is_err());
}
