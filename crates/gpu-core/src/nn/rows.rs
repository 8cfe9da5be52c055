//! Row-wise operations over `cols`-wide rows: softmax family, cross-entropy, normalisations,
//! RoPE and embeddings. Per-row statistics saved by a forward pass are `rows` long.

use crate::backend::Backend;
use crate::error::Result;

/// Row-wise operations (the forward softmax and LayerNorm without saved statistics live in
/// [`crate::KernelOps`]).
pub trait RowOps: Backend {
    /// Softmax backward: `dx = y ∘ (dy − Σ_row(dy ∘ y))`, `y` the forward output.
    fn softmax_bwd(
        &self,
        y: &Self::Buffer,
        dy: &Self::Buffer,
        dx: &mut Self::Buffer,
        cols: usize,
    ) -> Result<()>;

    /// `out = x − logsumexp_row(x)`.
    fn log_softmax_fwd(&self, x: &Self::Buffer, out: &mut Self::Buffer, cols: usize) -> Result<()>;

    /// Log-softmax backward: `dx = dy − exp(y) · Σ_row(dy)`, `y` the forward output.
    fn log_softmax_bwd(
        &self,
        y: &Self::Buffer,
        dy: &Self::Buffer,
        dx: &mut Self::Buffer,
        cols: usize,
    ) -> Result<()>;

    /// Fused softmax + cross-entropy: `loss[r] = logsumexp(logits[r]) − logits[r, targets[r]]`.
    /// `targets` is u32 with `rows` entries, each `< cols` (else an error on the CPU; the CUDA
    /// kernel writes NaN for that row's loss).
    fn cross_entropy_fwd(
        &self,
        logits: &Self::Buffer,
        targets: &Self::Buffer,
        loss: &mut Self::Buffer,
        cols: usize,
    ) -> Result<()>;

    /// Cross-entropy backward: `dlogits[r] = (softmax(logits[r]) − onehot(targets[r])) · dloss[r]`.
    fn cross_entropy_bwd(
        &self,
        logits: &Self::Buffer,
        targets: &Self::Buffer,
        dloss: &Self::Buffer,
        dlogits: &mut Self::Buffer,
        cols: usize,
    ) -> Result<()>;

    /// LayerNorm forward with saved statistics: `y = (x − mean)·rstd·w + b`, biased variance,
    /// `rstd = 1/sqrt(var + eps)`; `mean` and `rstd` have one entry per row.
    fn layernorm_fwd(
        &self,
        x: &Self::Buffer,
        w: &Self::Buffer,
        b: &Self::Buffer,
        y: &mut Self::Buffer,
        mean: &mut Self::Buffer,
        rstd: &mut Self::Buffer,
        cols: usize,
        eps: f32,
    ) -> Result<()>;

    /// LayerNorm backward: writes `dx` (`rows·cols`), `dw` and `db` (`cols`, summed over rows).
    fn layernorm_bwd(
        &self,
        x: &Self::Buffer,
        w: &Self::Buffer,
        mean: &Self::Buffer,
        rstd: &Self::Buffer,
        dy: &Self::Buffer,
        dx: &mut Self::Buffer,
        dw: &mut Self::Buffer,
        db: &mut Self::Buffer,
        cols: usize,
    ) -> Result<()>;

    /// RMSNorm forward: `y = x·rstd·w`, `rstd = 1/sqrt(mean(x²) + eps)` saved per row.
    fn rmsnorm_fwd(
        &self,
        x: &Self::Buffer,
        w: &Self::Buffer,
        y: &mut Self::Buffer,
        rstd: &mut Self::Buffer,
        cols: usize,
        eps: f32,
    ) -> Result<()>;

    /// RMSNorm backward: writes `dx` and `dw` (summed over rows).
    fn rmsnorm_bwd(
        &self,
        x: &Self::Buffer,
        w: &Self::Buffer,
        rstd: &Self::Buffer,
        dy: &Self::Buffer,
        dx: &mut Self::Buffer,
        dw: &mut Self::Buffer,
        cols: usize,
    ) -> Result<()>;

    /// Rotary position embedding on `x` of shape `[n, t, d]` (`n` = batch·heads, `d` even),
    /// rotate-half convention (Llama/GPT-NeoX): for `i < d/2`, with `θ = pos · base^(−2i/d)`,
    /// `pos = t_index`: `out[i] = x[i]·cos θ − x[i + d/2]·sin θ`,
    /// `out[i + d/2] = x[i + d/2]·cos θ + x[i]·sin θ`. `inverse` rotates by `−θ`, which is the
    /// backward.
    fn rope(
        &self,
        x: &Self::Buffer,
        out: &mut Self::Buffer,
        n: usize,
        t: usize,
        d: usize,
        base: f32,
        inverse: bool,
    ) -> Result<()>;

    /// `out[r] = table[ids[r]]` for a `[vocab, dim]` table and u32 `ids`; an id `>= vocab` is an
    /// error on the CPU and a NaN row on CUDA.
    fn embedding_fwd(
        &self,
        ids: &Self::Buffer,
        table: &Self::Buffer,
        out: &mut Self::Buffer,
        dim: usize,
    ) -> Result<()>;

    /// Embedding backward: `dtable` (`[vocab, dim]`) is overwritten with zeros, then
    /// `dtable[ids[r]] += dout[r]` for every row (atomic adds on CUDA).
    fn embedding_bwd(
        &self,
        ids: &Self::Buffer,
        dout: &Self::Buffer,
        dtable: &mut Self::Buffer,
        dim: usize,
    ) -> Result<()>;
}
