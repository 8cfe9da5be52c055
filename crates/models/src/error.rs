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
    /// A row of logits with a NaN or a +∞, or with no finite value (all −∞): no token to
    /// choose (greedy or sampled) and no probability to score by. A −∞ among finite logits
    /// only masks its token.
    #[error("the model produced non-finite logits (NaN/inf) {0}: its weights may be corrupt")]
    NonFiniteLogits(LogitsAt),
    #[error("bad sampling setting: {0}")]
    BadSampling(String),
    #[error("bad padding: {0}")]
    BadPadding(String),
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("cannot quantize: {0}")]
    Quant(String),
}

/// Where a row of non-finite logits came from ([`ModelError::NonFiniteLogits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsAt {
    /// Generation: choosing new token `step` (0: the first after the prompt) of batch row `row`.
    Step { step: usize, row: usize },
    /// Scoring a text: predicting its token at `position` (from 1; the first is not predicted).
    Position(usize),
    /// A row given to [`crate::Sampler::sample`] directly.
    Row,
}

impl std::fmt::Display for LogitsAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LogitsAt::Step { step, row } => write!(f, "at step {step} (row {row})"),
            LogitsAt::Position(p) => write!(f, "predicting token {p} of the text"),
            LogitsAt::Row => write!(f, "in the row to sample"),
        }
    }
}
