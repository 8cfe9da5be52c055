//! The optimisers against PyTorch: `scripts/optim_reference.py` ran `torch.optim.AdamW`,
//! `schedulefree.AdamWScheduleFree` and `prodigyopt.Prodigy` (twice: decoupled decay; coupled
//! decay with bias correction) for 20 steps in float64 and wrote the committed fixture
//! `tests/fixtures/optim_reference.json`; here the same gradients (`g = p − target + 0.1·noise`,
//! formed in f64 from our f32 parameters) go through our optimisers on the CPU in exact mode
//! (f64 per element, one rounding per stored value), with the same learning-rate change after
//! step 10, Schedule-Free's eval/train swap there and its `x` at the end.
//!
//! Bound: every stored value is rounded to f32 once per step (relative 2^-24 ≈ 6e-8), and the
//! hyper-parameters and step scalars are f32 here, f64 there (the fixture uses f32-representable
//! hyper-parameters, so only derived scalars such as `sqrt(β2)` differ, by ≤ 6e-8 relative).
//! Over 20 steps of contracting updates (`|p| ≤ 2`) that gives well under 1e-6 absolute; the
//! test allows `2e-6 · (1 + |want|)` and prints the largest difference seen (about 1.2e-7 for
//! AdamW and Schedule-Free AdamW). Prodigy's `d` comes from `Σ⟨g, p0 − p⟩`, which f32 storage
//! resolves poorly while the steps are ~`d0`: PyTorch's own float32 run moves away from its
//! float64 one by `f32_spread` (recorded in the fixture: 4e-5 and 3e-3 at steps 10 and 20 for
//! the decoupled run), so Prodigy is allowed that spread on top, and `d` the distance of
//! PyTorch's float32 `d` from its float64 one (plus 1e-6 relative).

use std::collections::HashMap;
use tensor_ops::optim::{
    AdamW, AdamWParams, Optimizer, Prodigy, ProdigyParams, ScheduleFreeAdamW, ScheduleFreeParams,
};
use tensor_ops::{Device, Gradients, Tensor};

const FIXTURE: &str = include_str!("fixtures/optim_reference.json");
const NAMES: [&str; 2] = ["w", "b"];
const SHAPES: [&[usize]; 2] = [&[4, 3], &[3]];

/// The script's `noise`: a value in [-1, 1) with 24 significant bits from a 32-bit hash.
fn noise(step: u64, tensor: u64, i: u64) -> f64 {
    let mut x = (step * 1000003 + tensor * 10007 + i * 7919 + 12345) as u32;
    x ^= x >> 16;
    x = x.wrapping_mul(0x7FEB352D);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846CA68B);
    x ^= x >> 16;
    ((x >> 8) as f64 - (1u64 << 23) as f64) / (1u64 << 23) as f64
}

fn fixture() -> serde_json::Value {
    serde_json::from_str(FIXTURE).expect("the committed fixture parses")
}

fn f64s(v: &serde_json::Value) -> Vec<f64> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|x| x.as_f64().expect("a number"))
        .collect()
}

fn hp(run: &serde_json::Value, key: &str) -> f32 {
    run["hp"][key].as_f64().expect("a hyper-parameter") as f32
}

/// `[beta1, beta2, eps, weight_decay]` of run `run`: the hyper-parameters every Adam-style
/// optimiser here takes.
fn adam_hp(run: &serde_json::Value) -> [f32; 4] {
    ["beta1", "beta2", "eps", "weight_decay"].map(|key| hp(run, key))
}

/// The Adam-style hyper-parameters `$ty` of run `$run`: [`adam_hp`]'s four, then the given
/// fields (and `..rest` when given).
macro_rules! adam_params {
    ($ty:ident, $run:expr, { $($field:ident: $value:expr),* $(,)? } $(, ..$rest:expr)?) => {{
        let [beta1, beta2, eps, weight_decay] = adam_hp($run);
        $ty {
            beta1,
            beta2,
            eps,
            weight_decay,
            $($field: $value,)*
            $(..$rest)?
        }
    }};
}

/// The parameters with their weight-decay flags: `w` decays, `b` does not.
fn decay_flags(ps: &[Tensor]) -> Vec<(Tensor, bool)> {
    vec![(ps[0].clone(), true), (ps[1].clone(), false)]
}

/// The initial parameters (leaves with gradients) on the CPU.
fn params(fx: &serde_json::Value) -> Vec<Tensor> {
    (0..2)
        .map(|t| {
            let vals: Vec<f32> = f64s(&fx["init"][NAMES[t]])
                .iter()
                .map(|&x| x as f32)
                .collect();
            let p = Tensor::from_vec(vals, SHAPES[t], Device::Cpu).unwrap();
            p.requires_grad_().unwrap()
        })
        .collect()
}

/// Gradients `p − target + 0.1·noise(step)` (in f64, rounded to f32), through `Σ p ∘ g`.
fn grads(ps: &[Tensor], step: u64) -> Gradients {
    let mut loss: Option<Tensor> = None;
    for (t, p) in ps.iter().enumerate() {
        let g: Vec<f32> = (p.to_vec().unwrap().iter().enumerate())
            .map(|(i, &x)| {
                let (t, i) = (t as u64, i as u64);
                (x as f64 - noise(200000, t, i) + 0.1 * noise(step, t, i)) as f32
            })
            .collect();
        let g = Tensor::from_vec(g, p.shape(), Device::Cpu).unwrap();
        let term = p.mul(&g).unwrap().sum_all().unwrap();
        loss = Some(match loss {
            None => term,
            Some(l) => l.add(&term).unwrap(),
        });
    }
    loss.unwrap().backward().unwrap()
}

/// Named records to compare with the fixture.
type Records = Vec<(&'static str, HashMap<&'static str, Vec<f32>>)>;

fn values(ps: &[Tensor]) -> HashMap<&'static str, Vec<f32>> {
    NAMES
        .iter()
        .zip(ps)
        .map(|(n, p)| (*n, p.to_vec().unwrap()))
        .collect()
}

/// Compares `got` with a fixture record, allowing `2e-6·(1 + |want|) + spread`; returns the
/// largest difference.
fn compare(
    what: &str,
    got: &HashMap<&str, Vec<f32>>,
    want: &serde_json::Value,
    spread: f64,
) -> f64 {
    let mut worst = 0.0f64;
    for n in NAMES {
        for (i, (&g, w)) in got[n].iter().zip(f64s(&want[n])).enumerate() {
            let diff = (g as f64 - w).abs();
            assert!(
                diff <= 2e-6 * (1.0 + w.abs()) + spread,
                "{what} {n}[{i}]: got {g}, PyTorch {w} (diff {diff:e})"
            );
            worst = worst.max(diff);
        }
    }
    worst
}

/// Runs 20 steps with the fixture's learning rates; `switch` runs after step 10 and `end`
/// after step 20 (each returns records to compare). Returns the largest difference.
fn replay(
    name: &str,
    opt: &mut dyn Optimizer,
    ps: &[Tensor],
    switch: &mut dyn FnMut(&mut dyn Optimizer) -> Records,
) -> f64 {
    let fx = fixture();
    let run = &fx["runs"][name];
    let lrs = f64s(&run["lr"]);
    let mut worst = 0.0f64;
    for (k, &lr) in lrs.iter().enumerate() {
        let g = grads(ps, k as u64);
        opt.step(&g, lr as f32).unwrap();
        let records = match k + 1 {
            10 => {
                let mut r = vec![("after_10", values(ps))];
                r.extend(switch(opt));
                r
            }
            20 => vec![("after_20", values(ps))],
            _ => vec![],
        };
        for (key, got) in records {
            let spread = run["f32_spread"][key].as_f64().unwrap_or(0.0);
            worst = worst.max(compare(&format!("{name} {key}"), &got, &run[key], spread));
        }
    }
    assert_eq!(opt.steps(), 20);
    worst
}

fn no_switch(_: &mut dyn Optimizer) -> Records {
    vec![]
}

#[test]
fn adamw_matches_torch() {
    let fx = fixture();
    let run = &fx["runs"]["adamw"];
    let ps = params(&fx);
    let hp = adam_params!(AdamWParams, run, { max_grad_norm: None });
    let mut opt = AdamW::new(decay_flags(&ps), hp).unwrap();
    let worst = replay("adamw", &mut opt, &ps, &mut no_switch);
    println!("adamw: largest difference from PyTorch {worst:e}");
}

#[test]
fn schedule_free_adamw_matches_the_schedulefree_package() {
    let fx = fixture();
    let run = &fx["runs"]["schedule_free"];
    let ps = params(&fx);
    let hp = adam_params!(ScheduleFreeParams, run, {
        warmup_steps: run["hp"]["warmup_steps"].as_u64().unwrap() as u32,
        r: hp(run, "r"),
        weight_lr_power: hp(run, "weight_lr_power"),
        max_grad_norm: None,
    });
    let flags = decay_flags(&ps);
    let mut opt = ScheduleFreeAdamW::new(flags, hp).unwrap();
    let p2 = ps.clone();
    let mut swap = move |o: &mut dyn Optimizer| {
        o.eval_params().unwrap();
        let x = values(&p2);
        o.train_params().unwrap();
        vec![("x_at_10", x)]
    };
    let mut worst = replay("schedule_free", &mut opt, &ps, &mut swap);
    opt.eval_params().unwrap();
    worst = worst.max(compare(
        "schedule_free x_at_20",
        &values(&ps),
        &run["x_at_20"],
        0.0,
    ));
    println!("schedule-free: largest difference from the package {worst:e}");
}

fn prodigy_case(name: &str) {
    let fx = fixture();
    let run = &fx["runs"][name];
    let ps = params(&fx);
    let hp = adam_params!(ProdigyParams, run, {
        d0: hp(run, "d0"),
        decouple: run["hp"]["decouple"].as_bool().unwrap(),
        use_bias_correction: run["hp"]["use_bias_correction"].as_bool().unwrap(),
    }, ..Default::default());
    let flags = decay_flags(&ps);
    let mut opt = Prodigy::new(flags, hp).unwrap();
    let worst = replay(name, &mut opt, &ps, &mut no_switch);
    let (d, want) = (opt.d().unwrap(), run["d"].as_f64().unwrap());
    let d_spread = (run["d_f32"].as_f64().unwrap() - want).abs();
    assert!(
        (d - want).abs() <= 1e-6 * want + d_spread,
        "{name}: d {d}, the package's {want}"
    );
    println!("{name}: largest difference from the package {worst:e}; d {d} vs {want}");
}

#[test]
fn prodigy_matches_the_prodigyopt_package() {
    prodigy_case("prodigy");
}

#[test]
fn prodigy_with_coupled_decay_and_bias_correction_matches_the_package() {
    prodigy_case("prodigy_coupled_bc");
}
