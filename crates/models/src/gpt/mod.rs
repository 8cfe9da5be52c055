//! A config-driven GPT: GPT-2 style (LayerNorm, GELU, learned positions, tied head) or
//! Llama style (RMSNorm, RoPE, SwiGLU), built on the module layer ([`tensor_ops::nn`]), with a
//! char-level tokenizer, batches, evaluation, generation and safetensors checkpoints.
//! Parameter names follow nanoGPT's, so a PyTorch model loads the same file.

mod blocks;
mod data;
mod graph_loss;
mod graph_step;
mod io;
mod model;

pub use blocks::EPS as NORM_EPS;
pub use data::{CharTokenizer, Dataset};
pub use graph_loss::GraphedLoss;
pub use graph_step::GraphedStep;
pub use model::{Gpt, GptConfig, Variant};
