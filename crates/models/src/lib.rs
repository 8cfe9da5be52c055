//! Hugging Face causal LMs for inference (issue 30): `config.json` parsed into a typed
//! [`ModelConfig`], safetensors weights memory-mapped and checked against it, `tokenizer.json`,
//! and the Llama family and GPT-2 run with a KV cache on `tensor_ops` (CPU or CUDA); the
//! project's own GPT exported as a GPT-2 or Llama model directory ([`export_hf`]).
//!
//! Each architecture is one folder of [`arch`] (`arch/llama/`, `arch/gpt2/`) holding its f32
//! reference forward and its fast forward with its weights; the building blocks they share are
//! `layers` (the reference's) and [`arch::fast`] (the fast forwards'). Two runners sit on
//! them: [`CausalLm`] (`lm.rs`, the f32 reference, through the crate's `ReferenceModel`
//! trait) and the fast [`Engine`] (`engine/`: cache, slots, CUDA graphs, sampler), generic over
//! [`DecoderModel`] (a `Box<dyn DecoderModel>`); the one `match` on the architecture is
//! `arch`'s loaders. The
//! project's GPT itself is [`gpt`]: the trainable model (GPT-2 or Llama style) on `tensor_ops`'
//! module layer, its char-level tokenizer and data loading, and its CUDA-graph training step
//! and loss.

pub mod arch;
pub mod cache;
pub mod config;
pub mod engine;
pub mod error;
pub mod expected;
pub mod export;
pub mod gpt;
mod layers;
pub mod lm;
pub mod logits;
pub mod quant;
pub mod sample;
pub mod tokenizer;
pub mod weights;

pub use arch::DecoderModel;
pub use cache::KvCache;
pub use config::{
    check_model_dir, Architecture, ConfigError, Gpt2Activation, LayerWindows, ModelConfig,
    RopeScaling,
};
pub use engine::{perplexity_windows, Engine, EngineOptions};
pub use error::{LogitsAt, ModelError};
pub use expected::{expected_iter, expected_tensors, ExpectedTensor};
pub use export::{export_gpt2, export_hf, export_llama, ExportError};
pub use lm::CausalLm;
pub use logits::{FastLogits, LogitsEngine};
pub use quant::{QuantKind, Quantized};
pub use sample::{Sampler, Sampling};
pub use tokenizer::{Tokenizer, TokenizerError};
pub use weights::{Checkpoint, WeightsError};
