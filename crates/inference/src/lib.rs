//! `inference`: the Hugging Face causal-LM commands of the `hybrid-trainer` CLI, beside the
//! `models` crate whose two engines they drive (the f32 reference `CausalLm` and the fast
//! `Engine`): `generate`, `perplexity`, `export-hf`, `check-hf` and `bench-generate`.

pub mod bench_generate;
pub mod check_hf;
pub mod generate;
pub mod generate_fast;
pub mod nonfinite;
