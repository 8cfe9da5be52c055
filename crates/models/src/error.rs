//! What loading or running a model can refuse.

use thiserror::Error;

use crate::config::ConfigError;
use crate::export::ExportError;
use crate::tokenizer::TokenizerError;
use crate::weights::WeightsError;

/// Why a model could not be loaded or run. A refused call changes nothing.
#[derive(Debug, Error)]
pub enum ModelError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Weights(#[from] WeightsError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Export(#[from] ExportError),
    #[error("tensor op failed: {0}")]
    Op(#[from] tensor_ops::GpuError),
    #[error("empty input: a forward pass needs at least one token")]
    EmptyInput,
    #[error("token id {id} at position {at} is outside the vocabulary of {vocab}")]
    TokenOutOfVocab { id: u32, at: usize, vocab: usize },
    #[error("{more} more positions do not fit: {have} held, the context is {context}")]
    ContextFull {
        have: usize,
        more: usize,
        context: usize,
    },
    #[error(
        "perplexity needs a context of at least 2 tokens (max_position_embeddings is {context})"
    )]
    ContextTooShort { context: usize },
    #[error("the batch's rows have {0} tokens in all, not a multiple of {1} rows")]
    RaggedBatch(usize, usize),
    #[error("bad sampling setting: {0}")]
    BadSampling(String),
    #[error("bad padding: {0}")]
    BadPadding(String),
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("cannot quantize: {0}")]
    Quant(String),
}
