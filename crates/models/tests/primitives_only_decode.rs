//! Greedy decoding of the committed Hugging Face fixtures (`tests/fixtures/hf`) on
//! `gpu_core::testing::PrimitivesOnly` (the CPU's primitives, every other op from its default
//! body, `tensor_ops::with_primitives_only`) against the CPU backend, with f32 weights and
//! activations: the reference `CausalLm` (prompt logits, then greedy tokens through its KV
//! cache) and the fast `Engine` (prefill, then greedy decode steps).
//!
//! Bounds: the greedy tokens must be the CPU backend's exactly; the prompt logits within
//! `REL · max|logit|` of the CPU backend's. `REL = 1e-5`: the defaults sum in f32 where the CPU
//! reference sums in f64, and their norms take `1/sqrt` as `exp(−ln(v)/2)`, a few ulps per op
//! over a few layers of width ≤ 64 (measured: under 1e-6 relative, printed). The tokens are
//! also `transformers`' greedy tokens (`expected.safetensors`); the engines' own bound
//! against the exact function (`engine.rs`) is 3e-4.

mod hf_fixture;

use hf_fixture::{dir, expected, max_err, reference_logits_and_greedy};
use models::{CausalLm, Engine, EngineOptions};
use tensor_ops::{with_primitives_only, DType, Device};

/// Greedy tokens compared.
const NEW: usize = 12;

/// The logits' bound relative to `max|logit|` (see the module docs).
const REL: f32 = 1e-5;

/// Fixtures decoded: each Llama variant (tied embeddings, q/k/v biases, sliding windows) and
/// GPT-2.
const NAMES: [&str; 5] = ["llama3", "llama-tied", "qwen2", "mistral-sw", "gpt2"];

/// The reference's prompt logits and greedy tokens.
fn reference(name: &str, ids: &[u32]) -> (Vec<f32>, Vec<u32>) {
    let m = CausalLm::load(&dir(name), Device::Cpu).unwrap();
    reference_logits_and_greedy(&m, ids, NEW)
}

/// The fast engine's (f32) prompt logits and greedy tokens.
fn engine(name: &str, ids: &[u32]) -> (Vec<f32>, Vec<u32>) {
    let opts = EngineOptions {
        dtype: DType::F32,
        batch: 1,
        capacity: 40,
        quant: None,
    };
    let mut e = Engine::load(&dir(name), Device::Cpu, opts).unwrap();
    let prompt = [ids.to_vec()];
    let logits = e.prefill(&prompt, true).unwrap().to_vec().unwrap();
    let toks = e.generate_greedy(&prompt, NEW, &[], |_| {}).unwrap();
    (logits, toks[0].clone())
}

type Run = fn(&str, &[u32]) -> (Vec<f32>, Vec<u32>);

#[test]
fn greedy_decoding_on_primitives_only_matches_the_cpu() {
    let runs: [(&str, Run); 2] = [("CausalLm", reference), ("Engine", engine)];
    for name in NAMES {
        let exp = expected(name);
        let (ids, hf) = (&exp.ids, &exp.greedy[exp.ids.len()..][..NEW]);
        for (what, run) in runs {
            let what = format!("{name} {what} f32, primitives-only vs CPU");
            let (want, want_toks) = run(name, ids);
            let (got, toks) = with_primitives_only(|| run(name, ids));
            let err = max_err(&what, &got, &want, REL);
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            eprintln!(
                "{what}: prompt logits max |diff| {err:e} ({:e} of max|logit|), tokens {toks:?}",
                err / scale
            );
            assert_eq!(toks, want_toks, "{what}: greedy tokens");
            assert_eq!(toks, hf, "{what}: transformers' greedy tokens");
        }
    }
}
