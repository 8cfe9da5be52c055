//! Hugging Face checkpoints for LLM inference (issue 30), CPU-side groundwork only.
//! Parses `config.json` into a typed [`ModelConfig`], memory-maps and validates the safetensors
//! weights against the tensor list the config implies, and loads `tokenizer.json`.

pub mod config;
pub mod expected;
pub mod tokenizer;
pub mod weights;

pub use config::{Architecture, ConfigError, ModelConfig, RopeScaling};
pub use expected::{expected_tensors, ExpectedTensor};
pub use tokenizer::{Tokenizer, TokenizerError};
pub use weights::{Checkpoint, WeightsError};
