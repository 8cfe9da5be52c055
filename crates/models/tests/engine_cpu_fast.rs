//! The fast engine on the CPU in the fast mode (`gpu_core::cpu::CpuMode::Fast`, what the
//! binaries choose): bf16 weights and int8/int4 projections kept compact, products summed in
//! f32 on all cores (`gpu_core::cpu::fast::linear`), against the reference `CausalLm` (in the
//! exact mode) and, in `gpu_*` tests, against the same engine on CUDA (skipped with a printed
//! reason where no GPU exists).
//!
//! Bounds (those of `engine.rs`, whose derivation holds for any f32 summation order): each
//! engine's logits are within `rel · max|logit|` of the exact function, `rel = 3e-4` with f32
//! activations and `0.07` with bf16 ones, quantized or not (the quantized engines from the same
//! dequantized values as the quantized reference). So the CPU and CUDA engines are within
//! `2 · rel · max|logit|` of each other. Greedy tokens: with f32 activations the CPU engine's
//! must be the reference's (as `engine.rs` asks of CUDA). Between CPU and CUDA a token may
//! differ only where the exact logits of the two choices are within `2 · rel · max|logit|`:
//! the first differing step is recomputed on the CPU (a prefill of the prompt and the tokens
//! before it, within `rel · max|logit|` of the exact logits itself) and the two tokens' logits
//! there must lie within `4 · rel · max|logit|`.

mod hf_fixture;

use gpu_core::cpu::{with_mode, CpuMode};
use gpu_cuda::testing::gpu_device_or_skip;
use hf_fixture::{dir, expected, max_err, reference_logits_and_greedy, STORAGES};
use models::{CausalLm, Engine, EngineOptions, QuantKind};
use tensor_ops::{DType, Device};

/// Every weight storage the engine has: dense f32, and `STORAGES` (f16 only on the CPU: the
/// engine refuses it on CUDA).
fn cases() -> impl Iterator<Item = (DType, Option<QuantKind>)> {
    std::iter::once((DType::F32, None)).chain(STORAGES)
}

/// Greedy tokens compared.
const NEW: usize = 12;

/// The bound relative to `max|logit|` of one engine against the exact function.
fn rel(dtype: DType) -> f32 {
    if dtype == DType::F32 {
        3e-4
    } else {
        0.07
    }
}

fn engine(name: &str, dev: Device, dtype: DType, quant: Option<QuantKind>) -> Engine {
    let opts = EngineOptions {
        dtype,
        batch: 1,
        capacity: 40,
        quant,
    };
    Engine::load(&dir(name), dev, opts).unwrap()
}

/// The prompt's logits `[t·vocab]` (f32) and [`NEW`] greedy tokens after it.
fn run(e: &mut Engine, ids: &[u32]) -> (Vec<f32>, Vec<u32>) {
    let prompt = [ids.to_vec()];
    let logits = e.prefill(&prompt, true).unwrap();
    let logits = logits.to_dtype(DType::F32).unwrap().to_vec().unwrap();
    let toks = e.generate_greedy(&prompt, NEW, &[], |_| {}).unwrap();
    (logits, toks[0].clone())
}

/// The reference's prompt logits and greedy tokens (exact mode), quantized as `quant` says.
fn reference(name: &str, ids: &[u32], quant: Option<QuantKind>) -> (Vec<f32>, Vec<u32>) {
    with_mode(CpuMode::Exact, || {
        let mut m = CausalLm::load(&dir(name), Device::Cpu).unwrap();
        if let Some(kind) = quant {
            m.quantize(kind).unwrap();
        }
        reference_logits_and_greedy(&m, ids, NEW)
    })
}

#[test]
fn engine_in_the_fast_cpu_mode_matches_the_reference() {
    for name in ["llama3", "qwen2"] {
        let exp = expected(name);
        for (dtype, quant) in cases() {
            let what = format!("{name} {dtype} {quant:?}, fast CPU mode");
            let (want, want_toks) = reference(name, &exp.ids, quant);
            let (got, toks) = with_mode(CpuMode::Fast, || {
                run(&mut engine(name, Device::Cpu, dtype, quant), &exp.ids)
            });
            let err = max_err(&what, &got, &want, rel(dtype));
            eprintln!("{what}: prompt logits max |diff| {err:e}");
            if dtype == DType::F32 {
                assert_eq!(toks, want_toks, "{what}: greedy tokens");
            }
        }
    }
}

/// Checks the CUDA engine's greedy tokens against the CPU's (see the module docs).
/// `rel` is the engines' bound against the exact logits.
fn check_tokens(
    what: &str,
    rel: f32,
    (cpu, cuda): (&[u32], &[u32]),
    recompute: impl Fn(&[u32]) -> Vec<f32>,
) {
    assert_eq!(cpu.len(), cuda.len(), "{what}: token counts");
    let Some(s) = cpu.iter().zip(cuda).position(|(a, b)| a != b) else {
        return;
    };
    let logits = recompute(&cpu[..s]);
    let (a, b) = (cpu[s] as usize, cuda[s] as usize);
    let scale = logits.iter().fold(0f32, |m, v| m.max(v.abs()));
    let gap = (logits[a] - logits[b]).abs();
    eprintln!("{what}: tokens differ at step {s} ({a} vs {b}), logit gap {gap:e}");
    assert!(
        gap <= 4.0 * rel * scale,
        "{what}: step {s} chose {a} on the CPU and {b} on CUDA, {gap:e} apart (scale {scale})"
    );
}

#[test]
fn gpu_engine_on_the_cpu_matches_cuda() {
    let Some(dev) = gpu_device_or_skip("gpu_engine_on_the_cpu_matches_cuda") else {
        return;
    };
    for name in ["llama3", "qwen2"] {
        let exp = expected(name);
        for (dtype, quant) in cases() {
            if quant == Some(QuantKind::F16) {
                let opts = EngineOptions {
                    dtype,
                    batch: 1,
                    capacity: 40,
                    quant,
                };
                let e = Engine::load(&dir(name), dev, opts).map(|_| ()).unwrap_err();
                assert!(matches!(e, models::ModelError::Unsupported(_)), "{e}");
                continue;
            }
            let what = format!("{name} {dtype} {quant:?}, CPU (fast mode) vs CUDA");
            let (cpu, cpu_toks) = with_mode(CpuMode::Fast, || {
                run(&mut engine(name, Device::Cpu, dtype, quant), &exp.ids)
            });
            let (cuda, cuda_toks) = run(&mut engine(name, dev, dtype, quant), &exp.ids);
            let err = max_err(&what, &cuda, &cpu, 2.0 * rel(dtype));
            eprintln!("{what}: prompt logits max |diff| {err:e}");
            check_tokens(&what, rel(dtype), (&cpu_toks, &cuda_toks), |before| {
                let ids: Vec<u32> = exp.ids.iter().chain(before).copied().collect();
                with_mode(CpuMode::Fast, || {
                    let mut e = engine(name, Device::Cpu, dtype, quant);
                    let l = e.prefill(&[ids], false).unwrap();
                    l.to_dtype(DType::F32).unwrap().to_vec().unwrap()
                })
            });
        }
    }
}
