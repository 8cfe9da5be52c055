//! Fused causal self-attention.

use crate::backend::Backend;
use crate::error::Result;

/// Causal scaled-dot-product attention over `n` = batch·heads independent sequences.
///
/// `q`, `k`, `v`, `out` are `[n, t, d]`; `lse` is `[n, t]`, the log-sum-exp of each query's
/// scaled, masked scores, saved for the backward. `scale` is usually `1/sqrt(d)`.
/// `out[i] = Σ_{j<=i} softmax_j(scale·q_i·k_j) v_j`.
pub trait AttentionOps: Backend {
    fn causal_attention_fwd(
        &self,
        q: &Self::Buffer,
        k: &Self::Buffer,
        v: &Self::Buffer,
        out: &mut Self::Buffer,
        lse: &mut Self::Buffer,
        n: usize,
        t: usize,
        d: usize,
        scale: f32,
    ) -> Result<()>;

    /// Gradients of q, k and v, given the forward's `out` and `lse` and the output gradient.
    fn causal_attention_bwd(
        &self,
        q: &Self::Buffer,
        k: &Self::Buffer,
        v: &Self::Buffer,
        out: &Self::Buffer,
        lse: &Self::Buffer,
        dout: &Self::Buffer,
        dq: &mut Self::Buffer,
        dk: &mut Self::Buffer,
        dv: &mut Self::Buffer,
        n: usize,
        t: usize,
        d: usize,
        scale: f32,
    ) -> Result<()>;
}
