//! The GPT's training step and greedy decoding of the committed Hugging Face fixtures on wgpu
//! (`Device::Wgpu(0)`: on CI, Mesa's lavapipe) against the CPU backend.
//!
//! Training: the same model (both variants), batches and AdamW steps (gradient clipping on,
//! dropout 0.2 at every site with a fixed seed per step: the masks are the CPU's bit for bit,
//! the same counter hash) give the first step's gradients within 1e-4 norm-wise relative,
//! losses within 1e-4 relative and parameters after three steps within
//! `1e-4·scale + 1e-2·steps·lr` (as `primitives_only.rs`: wgpu sums in f32 where the CPU sums in
//! f64, and Adam normalises each gradient entry, so an entry with a small gradient moves by
//! `lr` times its relative error; 1% of a step allowed). The key bias (`c_attn.bias` columns
//! `n_embd..2·n_embd`) has an analytically zero gradient, so both backends step it by
//! Adam-normalised rounding noise of either sign: it is only required to stay within
//! `steps·lr` of zero on both.
//!
//! With bf16 mixed precision the same steps are compared with bf16's bounds (see
//! `wgpu_gpt_bf16_training_steps_match_the_cpu`).
//!
//! Decoding: the reference `CausalLm` (prompt logits, then greedy tokens through its KV cache)
//! and the fast `Engine` (f32: prefill, then greedy decode steps) give the CPU's greedy tokens
//! exactly (which are also `transformers`' greedy tokens, `expected.safetensors`), and prompt
//! logits within `REL · max|logit|` of the CPU's.
//!
//! The engine's other storages (bf16 weights and activations, int8/int4 projections under f32
//! or bf16) on wgpu against the exact reference `CausalLm` on the CPU (quantized as the engine
//! is), on `llama3`, with the bounds `engine.rs` derives for any f32 summation order: logits
//! within `rel · max|logit|`, `rel = 3e-4` with f32 activations and `0.07` with bf16 ones; with
//! f32 activations the greedy tokens are the reference's.
//!
//! Every test skips with `SKIP <test>: no wgpu adapter (<reason>)` where there is none, and
//! fails instead with `HYBRID_REQUIRE_WGPU=1`.

mod hf_fixture;
mod tiny_gpt;

use hf_fixture::{
    assert_decoding_matches_the_cpu, dir, expected, f32_engine, max_err,
    reference_logits_and_greedy, DECODE_NEW, DECODE_REL, STORAGES,
};
use models::gpt::{Dataset, Gpt, Variant};
use models::{CausalLm, Engine, EngineOptions};
use tensor_ops::{DType, Device, Precision};
use tiny_gpt::{assert_step_moves_only_the_batch_and_the_loss, clipped_adamw, tiny_config};

/// `Device::Wgpu` of adapter 0, or `None` after printing why the test is skipped.
fn wgpu(test: &str) -> Option<Device> {
    gpu_wgpu::testing::backend_or_skip(test).map(|b| Device::Wgpu(b.info().index))
}

/// AdamW steps taken, and their learning rate.
const STEPS: usize = 3;
const LR: f32 = 3e-3;

/// The first step's gradients, the losses of [`STEPS`] AdamW steps and the parameters after
/// them, each parameter by name.
struct Trained {
    losses: Vec<f32>,
    grads: Vec<Vec<f32>>,
    init: Vec<Vec<f32>>,
    params: Vec<(String, Vec<f32>)>,
}

fn train(variant: Variant, precision: Precision, dev: Device) -> Trained {
    let text = "the quick brown fox jumps over the lazy dog. ".repeat(40);
    let ds = Dataset::from_text(&text, 0.9).unwrap();
    let cfg = tiny_config(variant, ds.tokenizer.vocab_size(), 2, 32, 0.2);
    let mut model = Gpt::new(cfg, 7, dev).unwrap();
    model.set_precision(precision).unwrap();
    let mut opt = clipped_adamw(&model);
    let init = model
        .parameters()
        .iter()
        .map(|(_, t, _)| t.to_vec().unwrap())
        .collect();
    let mut rng = Dataset::rng(3);
    let (mut losses, mut grads) = (Vec::new(), Vec::new());
    for step in 0..STEPS as u64 {
        let (x, y) = ds.batch(false, 4, 16, &mut rng, dev).unwrap();
        assert_eq!(x.device(), dev);
        let loss = model.loss(&x, &y, Some(1000 + step)).unwrap();
        losses.push(loss.item().unwrap());
        let g = loss.backward().unwrap();
        if step == 0 {
            for (_, p, _) in model.parameters() {
                grads.push(g.get(&p).unwrap().to_vec().unwrap());
            }
        }
        opt.step(&g, LR).unwrap();
    }
    let params = model
        .parameters()
        .into_iter()
        .map(|(n, t, _)| {
            assert_eq!(t.device(), dev, "{n}");
            (n, t.to_vec().unwrap())
        })
        .collect();
    Trained {
        losses,
        grads,
        init,
        params,
    }
}

/// Relative bounds of a training comparison: the losses (each), and the first gradients
/// (norm-wise).
struct Bounds {
    loss: f32,
    grad: f64,
    /// Per element (`None`: `1e-4·scale + 1e-2·steps·lr`, module docs), or norm-wise on each
    /// parameter's movement from its initial value.
    moved: Option<f64>,
}

#[test]
fn wgpu_gpt_training_steps_match_the_cpu() {
    const T: &str = "wgpu_gpt_training_steps_match_the_cpu";
    let Some(dev) = wgpu(T) else { return };
    let bounds = Bounds {
        loss: 1e-4,
        grad: 1e-4,
        moved: None,
    };
    for variant in [Variant::Gpt2, Variant::Llama] {
        check_training(variant, Precision::Fp32, dev, &bounds);
    }
}

/// bf16 mixed precision (`set_precision(Bf16)`: bf16 matmuls and activations, f32 master
/// weights, norms, softmax, loss and AdamW) against the CPU's reference of the same roundings.
/// Both round the same values at the same points; only an f32 sum order differs (~1e-6
/// relative), so a rounding lands on the neighbouring bf16 value only where its input lies that
/// close to a midpoint, moving that element by one bf16 ulp (2⁻⁸ relative). Bounds: losses
/// within 2⁻⁸ relative, first gradients within 2⁻⁶ norm-wise, and each parameter's movement
/// over the steps within 2⁻⁴ norm-wise of the CPU's. Parameters are not compared element by
/// element: Adam normalises each gradient entry, so a flipped rounding in a small entry can
/// change its step by up to a whole `lr`. (Measured on lavapipe: losses within 2e-5, gradients
/// within 1.1e-3, movements within 4.3e-3.)
#[test]
fn wgpu_gpt_bf16_training_steps_match_the_cpu() {
    const T: &str = "wgpu_gpt_bf16_training_steps_match_the_cpu";
    let Some(dev) = wgpu(T) else { return };
    let bounds = Bounds {
        loss: 1.0 / 256.0,
        grad: 1.0 / 64.0,
        moved: Some(1.0 / 16.0),
    };
    for variant in [Variant::Gpt2, Variant::Llama] {
        check_training(variant, Precision::Bf16, dev, &bounds);
    }
}

fn check_training(variant: Variant, precision: Precision, dev: Device, bounds: &Bounds) {
    let want = train(variant, precision, Device::Cpu);
    let got = train(variant, precision, dev);
    println!(
        "{variant:?} {precision}: losses {:?} on {dev} (cpu {:?})",
        got.losses, want.losses
    );
    for (a, b) in got.losses.iter().zip(&want.losses) {
        assert!(
            (a - b).abs() <= bounds.loss * b.abs(),
            "{variant:?} {precision} loss {a} vs {b}"
        );
    }
    assert!(got.losses.iter().all(|l| l.is_finite()));
    assert_eq!(got.params.len(), want.params.len());
    let mut worst = 0f64;
    for (i, (g, w)) in got.grads.iter().zip(&want.grads).enumerate() {
        let e = gpu_cuda::testing::rel_err(g, w);
        let name = &want.params[i].0;
        // The key bias's gradient is rounding noise around zero on both (module docs).
        if !name.ends_with("c_attn.bias") {
            worst = worst.max(e);
            assert!(
                e < bounds.grad,
                "{variant:?} {precision} {name}: first gradient rel err {e:e}"
            );
        }
    }
    println!("{variant:?} {precision}: first gradients within {worst:e} norm-wise");
    if let Some(bound) = bounds.moved {
        check_movement(variant, precision, (&got, &want), bound);
        return;
    }
    let steps = STEPS as f32;
    for ((name, g), (_, w)) in got.params.iter().zip(&want.params) {
        let scale = w.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            if name.ends_with("c_attn.bias") && (32..64).contains(&i) {
                let lim = steps * LR;
                assert!(a.abs() <= lim && b.abs() <= lim, "{name}: {a}, {b}");
                continue;
            }
            assert!(
                (a - b).abs() <= 1e-4 * scale + 1e-2 * steps * LR,
                "{variant:?} {precision} {name}[{i}]: {a} vs {b}"
            );
        }
    }
}

/// Each parameter's movement over the steps (final − initial) within `bound` norm-wise of the
/// CPU's, the key bias's zero-gradient part left out (module docs).
fn check_movement(
    variant: Variant,
    precision: Precision,
    (got, want): (&Trained, &Trained),
    bound: f64,
) {
    let mut worst = 0f64;
    for (k, ((name, g), (_, w))) in got.params.iter().zip(&want.params).enumerate() {
        let keep = |i: &usize| !(name.ends_with("c_attn.bias") && (32..64).contains(i));
        let moved = |fin: &[f32]| -> Vec<f32> {
            (0..fin.len())
                .filter(keep)
                .map(|i| fin[i] - want.init[k][i])
                .collect()
        };
        assert_eq!(got.init[k], want.init[k], "{name}: the same initial values");
        let e = gpu_cuda::testing::rel_err(&moved(g), &moved(w));
        worst = worst.max(e);
        assert!(
            e <= bound,
            "{variant:?} {precision} {name}: movement rel err {e:e}"
        );
    }
    println!("{variant:?} {precision}: movements within {worst:e} norm-wise");
}

/// A training step on wgpu moves only the batch in and the loss out through the tensor layer
/// (`transfer_stats`: the same budget as on CUDA, `gpu.rs`), after a warm-up step. gpu-core's
/// host fallbacks inside ops (clipping's norm, for one) copy below the tensor layer and are
/// not counted here.
#[test]
fn wgpu_training_step_moves_only_the_batch_and_the_loss() {
    const T: &str = "wgpu_training_step_moves_only_the_batch_and_the_loss";
    let Some(dev) = wgpu(T) else { return };
    let text = "It was the best of times, it was the worst of times. ".repeat(20);
    let ds = Dataset::from_text(&text, 0.9).unwrap();
    let cfg = tiny_config(Variant::Gpt2, ds.tokenizer.vocab_size(), 1, 16, 0.1);
    let model = Gpt::new(cfg, 1, dev).unwrap();
    let mut opt = clipped_adamw(&model);
    assert_step_moves_only_the_batch_and_the_loss(&model, &mut opt, &ds, 16);
}

/// Greedy tokens compared.
const NEW: usize = DECODE_NEW;

/// The prompt logits' bound relative to `max|logit|`: the defaults' f32 chains against the
/// CPU's f64 sums, a few ulps per op over a few layers of width ≤ 64 (measured on lavapipe:
/// printed by the test).
const REL: f32 = DECODE_REL;

#[test]
fn wgpu_greedy_decoding_of_hf_fixtures_matches_the_cpu() {
    const T: &str = "wgpu_greedy_decoding_of_hf_fixtures_matches_the_cpu";
    let Some(dev) = wgpu(T) else { return };
    assert_decoding_matches_the_cpu(&dev.to_string(), |run, name, ids| run(name, ids, dev));
}

/// The engines' bound against the exact logits, relative to `max|logit|` (module docs).
fn rel(dtype: DType) -> f32 {
    if dtype == DType::F32 {
        3e-4
    } else {
        0.07
    }
}

#[test]
fn wgpu_engine_storages_match_the_reference() {
    const T: &str = "wgpu_engine_storages_match_the_reference";
    let Some(dev) = wgpu(T) else { return };
    // One fixture (lavapipe is slow): each storage's code path is the same for every Llama
    // variant; the variants themselves are covered in f32 above.
    let name = "llama3";
    let exp = expected(name);
    for (dtype, quant) in STORAGES {
        let what = format!("{name} {dtype} {quant:?} engine on {dev} vs the reference");
        let (want, want_toks) = {
            let mut m = CausalLm::load(&dir(name), Device::Cpu).unwrap();
            if let Some(kind) = quant {
                m.quantize(kind).unwrap();
            }
            reference_logits_and_greedy(&m, &exp.ids, NEW)
        };
        let opts = EngineOptions {
            dtype,
            batch: 1,
            capacity: 40,
            quant,
        };
        let mut e = Engine::load(&dir(name), dev, opts).unwrap();
        let prompt = [exp.ids.clone()];
        let logits = e.prefill(&prompt, true).unwrap();
        assert_eq!(logits.device(), dev);
        let got = logits.to_dtype(DType::F32).unwrap().to_vec().unwrap();
        let toks = e.generate_greedy(&prompt, NEW, &[], |_| {}).unwrap();
        let err = max_err(&what, &got, &want, rel(dtype));
        eprintln!(
            "{what}: prompt logits max |diff| {err:e}, tokens {:?}",
            toks[0]
        );
        if dtype == DType::F32 {
            assert_eq!(toks[0], want_toks, "{what}: greedy tokens");
        }
    }
}

/// Batched decoding on wgpu: the f32 `Engine` with two prompts of different lengths (left
/// padding masked) gives the CPU engine's last-token logits of each row within
/// `REL · max|logit|` and its greedy tokens row by row.
#[test]
fn wgpu_batched_engine_matches_the_cpu() {
    const T: &str = "wgpu_batched_engine_matches_the_cpu";
    let Some(dev) = wgpu(T) else { return };
    let prompts = [
        (0..9).map(|i| (i * 7 + 3) % 96).collect::<Vec<u32>>(),
        (0..4).map(|i| (i * 11 + 1) % 96).collect(),
    ];
    for name in ["llama3", "gpt2"] {
        let run = |d: Device| {
            let mut e = f32_engine(name, d, 2, 32);
            let logits = e.prefill(&prompts, false).unwrap();
            assert_eq!(logits.device(), d);
            let logits = logits.to_vec().unwrap();
            let toks = e.generate_greedy(&prompts, NEW, &[], |_| {}).unwrap();
            (logits, toks)
        };
        let (want, want_toks) = run(Device::Cpu);
        let (got, toks) = run(dev);
        let what = format!("{name} batched f32 Engine, {dev} vs CPU");
        let err = max_err(&what, &got, &want, REL);
        eprintln!("{what}: last-token logits max |diff| {err:e}, tokens {toks:?}");
        assert_eq!(toks.len(), 2);
        assert_eq!(toks, want_toks, "{what}: greedy tokens of each row");
    }
}
