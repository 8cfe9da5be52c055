//! The perplexity of a text through the fast engine, with [`crate::CausalLm::perplexity`]'s
//! windows and token accounting: windows of the model's context overlapping by one token, so
//! every token but the first is predicted once, each window a fresh prefill of all positions.
//! The engine's logits (f32 or bf16, on its device) come to the host as f32; the log-softmax
//! and the sum of the negative log-likelihoods are computed there in f64.

use std::ops::Range;

use super::Engine;
use crate::error::{LogitsAt, ModelError};
use crate::sample::usable;

impl Engine {
    /// The perplexity of `ids`: `exp` of the mean negative log-likelihood of each token after
    /// the first, windows of the model's context (`max_position_embeddings`) long, as
    /// [`crate::CausalLm::perplexity`] computes it. The engine must have batch 1 and room for
    /// one window (capacity at least the context, or `ids.len()` when shorter); fewer than two
    /// tokens are [`ModelError::EmptyInput`]; a row of logits with a NaN or a +∞, or no finite
    /// value, is [`ModelError::NonFiniteLogits`] at the position it predicts. The caches are overwritten (a later generation
    /// starts with its own prefill anyway).
    pub fn perplexity(&mut self, ids: &[u32]) -> Result<f64, ModelError> {
        if ids.len() < 2 {
            return Err(ModelError::EmptyInput);
        }
        let opts = self.options();
        if opts.batch != 1 {
            return Err(ModelError::Unsupported(format!(
                "perplexity on an engine of batch {} (it takes batch 1)",
                opts.batch
            )));
        }
        let ctx = self.config().max_position_embeddings;
        let vocab = self.config().vocab_size;
        perplexity_windows(ids.len(), ctx)?;
        let window = ctx.min(ids.len());
        if window > opts.capacity {
            return Err(ModelError::ContextFull {
                have: 0,
                more: window,
                context: opts.capacity,
            });
        }
        let (mut nll, mut n) = (0f64, 0usize);
        for range in perplexity_windows(ids.len(), ctx)? {
            let start = range.start;
            let w = &ids[range];
            let logits = self
                .prefill(&[w.to_vec()], true)?
                .to_dtype(tensor_ops::DType::F32)?
                .to_vec()?;
            for (i, &next) in w[1..].iter().enumerate() {
                let row = &logits[i * vocab..(i + 1) * vocab];
                if !usable(row) {
                    let at = LogitsAt::Position(start + i + 1);
                    return Err(ModelError::NonFiniteLogits(at));
                }
                nll -= log_softmax_at(row, next as usize);
                n += 1;
            }
        }
        Ok((nll / n as f64).exp())
    }
}

/// The windows perplexity scores `len` tokens in, for a context of `context` tokens: each at
/// most `context` long, the next starting at the last token of the one before, so every token
/// but the first is predicted once. A context under 2 tokens predicts nothing per window (and
/// would never advance): [`ModelError::ContextTooShort`].
pub fn perplexity_windows(len: usize, context: usize) -> Result<Vec<Range<usize>>, ModelError> {
    if context < 2 {
        return Err(ModelError::ContextTooShort { context });
    }
    let mut out = Vec::new();
    let mut start = 0;
    while start + 1 < len {
        let end = start.saturating_add(context).min(len);
        out.push(start..end);
        start = end - 1;
    }
    Ok(out)
}

/// `log softmax(row)[at]` in f64: `row[at] − max − ln Σ exp(row − max)`.
fn log_softmax_at(row: &[f32], at: usize) -> f64 {
    let max = row
        .iter()
        .fold(f64::NEG_INFINITY, |m, &x| m.max(f64::from(x)));
    let sum: f64 = row.iter().map(|&x| (f64::from(x) - max).exp()).sum();
    f64::from(row[at]) - max - sum.ln()
}
