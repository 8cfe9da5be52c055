//! Greedy decoding of the committed Hugging Face fixtures (`tests/fixtures/hf`) on
//! `gpu_core::testing::PrimitivesOnly` (the CPU's primitives, every other op from its default
//! body, `tensor_ops::with_primitives_only`) against the CPU backend, with f32 weights and
//! activations: the reference `CausalLm` (prompt logits, then greedy tokens through its KV
//! cache) and the fast `Engine` (prefill, then greedy decode steps).
//!
//! Bounds: the greedy tokens must be the CPU backend's exactly; the prompt logits within
//! `REL · max|logit|` of the CPU backend's. `REL = 1e-5` (`hf_fixture::DECODE_REL`): the
//! defaults sum in f32 where the CPU reference sums in f64, and their norms take `1/sqrt` as
//! `exp(−ln(v)/2)`, a few ulps per op over a few layers of width ≤ 64 (measured: under 1e-6
//! relative, printed). The tokens are also `transformers`' greedy tokens
//! (`expected.safetensors`); the engines' own bound against the exact function (`engine.rs`)
//! is 3e-4.

mod hf_fixture;

use hf_fixture::assert_decoding_matches_the_cpu;
use tensor_ops::with_primitives_only;

#[test]
fn greedy_decoding_on_primitives_only_matches_the_cpu() {
    assert_decoding_matches_the_cpu("primitives-only", |run, name, ids| {
        with_primitives_only(|| run(name, ids, tensor_ops::Device::Cpu))
    });
}
