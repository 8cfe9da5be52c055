//! Non-finite logits with their cause named (issue 39, item 3): when `generate`, `perplexity`
//! or `check-hf` meet [`ModelError::NonFiniteLogits`], the model directory's weights are
//! scanned once ([`models::weights::first_non_finite`]) and the first tensor holding a NaN or
//! an infinity is named, or the weights are said to be finite (the activations overflowed).
//! Nothing is scanned on the normal path.

use std::path::Path;

use models::weights::{first_non_finite, NonFiniteTensor};
use models::{LogitsAt, ModelError, WeightsError};
use thiserror::Error;

use crate::check_hf::CheckHfError;

/// Non-finite logits and what in the checkpoint made them.
#[derive(Debug, Error)]
#[error("{logits}; {cause}")]
pub struct NonFiniteRun {
    /// Always [`ModelError::NonFiniteLogits`].
    pub logits: ModelError,
    pub cause: NonFiniteCause,
}

/// What the scan of the weights found.
#[derive(Debug, Error)]
pub enum NonFiniteCause {
    #[error("the first non-finite weight: {0}")]
    Tensor(NonFiniteTensor),
    #[error("every weight is finite: the activations overflowed")]
    Finite,
    #[error("the weights could not be scanned for non-finite values: {0}")]
    Unscanned(WeightsError),
}

/// The error of non-finite logits `at` from the model of `dir`, its cause named.
pub fn named(dir: &Path, at: LogitsAt) -> NonFiniteRun {
    let cause = match first_non_finite(dir) {
        Ok(Some(t)) => NonFiniteCause::Tensor(t),
        Ok(None) => NonFiniteCause::Finite,
        Err(e) => NonFiniteCause::Unscanned(e),
    };
    NonFiniteRun {
        logits: ModelError::NonFiniteLogits(at),
        cause,
    }
}

/// `e` with its cause named ([`named`]) when it is non-finite logits (a [`ModelError`], or
/// `check-hf`'s [`CheckHfError::Model`]) from the model of `dir`; any other error unchanged.
pub fn name_the_cause(dir: &Path, e: anyhow::Error) -> anyhow::Error {
    let at = match (e.downcast_ref(), e.downcast_ref()) {
        (Some(ModelError::NonFiniteLogits(at)), _)
        | (_, Some(CheckHfError::Model(ModelError::NonFiniteLogits(at)))) => *at,
        _ => return e,
    };
    named(dir, at).into()
}
