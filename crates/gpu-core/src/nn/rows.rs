//! Row-wise operations over `cols`-wide rows: softmax family, cross-entropy, normalisations,
//! RoPE and embeddings. Per-row statistics saved by a forward pass are `rows` long.

use crate::backend::BufferInfo;
use crate::dtype::DType;
use crate::error::{GpuError, Result};
use crate::nn::defaults::rows as D;
use crate::nn::primitives::{IdRows, Primitives};
use crate::ops::{check_elementwise, check_rows, require_f32, BufferInfoDyn};

/// Row-wise operations (the forward softmax and LayerNorm without saved statistics live in
/// [`crate::nn::ElementwiseOps`]).
pub trait RowOps: Primitives {
    /// `out = softmax(x)` over each `cols`-wide row (a row of all −inf gives NaN, as in PyTorch).
    fn softmax_fwd(&self, x: &Self::Buffer, out: &mut Self::Buffer, cols: usize) -> Result<()> {
        let rows = check_rows("softmax_fwd", x, out, cols)?;
        D::softmax(self, x, out, [rows, cols])
    }

    /// Softmax backward: `dx = y ∘ (dy − Σ_row(dy ∘ y))`, `y` the forward output.
    fn softmax_bwd(
        &self,
        input: RowBwdIn<'_, Self::Buffer>,
        dx: &mut Self::Buffer,
        cols: usize,
    ) -> Result<()> {
        let rows = input.check("softmax_bwd", dx, cols)?;
        D::softmax_bwd(self, input, dx, [rows, cols])
    }

    /// `out = x − logsumexp_row(x)`.
    fn log_softmax_fwd(&self, x: &Self::Buffer, out: &mut Self::Buffer, cols: usize) -> Result<()> {
        let rows = check_rows("log_softmax_fwd", x, out, cols)?;
        D::log_softmax(self, x, out, [rows, cols])
    }

    /// Log-softmax backward: `dx = dy − exp(y) · Σ_row(dy)`, `y` the forward output.
    fn log_softmax_bwd(
        &self,
        input: RowBwdIn<'_, Self::Buffer>,
        dx: &mut Self::Buffer,
        cols: usize,
    ) -> Result<()> {
        let rows = input.check("log_softmax_bwd", dx, cols)?;
        D::log_softmax_bwd(self, input, dx, [rows, cols])
    }

    /// Fused softmax + cross-entropy: `loss[r] = logsumexp(logits[r]) − logits[r, targets[r]]`.
    /// `targets` is u32 with `rows` entries, each `< cols` (else an error on the CPU; the CUDA
    /// kernel writes NaN for that row's loss).
    fn cross_entropy_fwd(
        &self,
        x: LogitsIn<'_, Self::Buffer>,
        loss: &mut Self::Buffer,
    ) -> Result<()> {
        let rows = x.check("cross_entropy_fwd", loss, None)?;
        D::cross_entropy(self, (x.logits, x.targets), loss, [rows, x.cols])
    }

    /// Cross-entropy backward: `dlogits[r] = (softmax(logits[r]) − onehot(targets[r])) · dloss[r]`.
    fn cross_entropy_bwd(
        &self,
        x: LogitsIn<'_, Self::Buffer>,
        dloss: &Self::Buffer,
        dlogits: &mut Self::Buffer,
    ) -> Result<()> {
        let rows = x.check("cross_entropy_bwd", dloss, Some(dlogits))?;
        let ins = (x.logits, x.targets, dloss);
        D::cross_entropy_bwd(self, ins, dlogits, [rows, x.cols])
    }

    /// LayerNorm forward with saved statistics: `y = (x − mean)·rstd·w + b`, biased variance,
    /// `rstd = 1/sqrt(var + eps)`; `mean` and `rstd` have one entry per row.
    /// `x`, `w`, `b` are the inputs; `y`, `mean`, `rstd` the outputs.
    fn layernorm_fwd(
        &self,
        (x, w, b): (&Self::Buffer, &Self::Buffer, &Self::Buffer),
        (y, mean, rstd): (&mut Self::Buffer, &mut Self::Buffer, &mut Self::Buffer),
        cols: usize,
        eps: f32,
    ) -> Result<()> {
        let rows = check_layernorm_fwd((x, w, b), (y, mean, rstd), cols, eps)?;
        D::layernorm(
            self,
            D::NormIn { x, w, rows, cols },
            b,
            (y, mean, rstd),
            eps,
        )
    }

    /// LayerNorm backward: writes `dx` (`rows·cols`), `dw` and `db` (`cols`, summed over rows).
    fn layernorm_bwd(
        &self,
        input: LayerNormBwdIn<'_, Self::Buffer>,
        (dx, dw, db): (&mut Self::Buffer, &mut Self::Buffer, &mut Self::Buffer),
        cols: usize,
    ) -> Result<()> {
        let rows = input.check((dx, dw, db), cols)?;
        D::layernorm_bwd(self, input, (dx, dw, db), [rows, cols])
    }

    /// RMSNorm forward: `y = x·rstd·w`, `rstd = 1/sqrt(mean(x²) + eps)` saved per row.
    fn rmsnorm_fwd(
        &self,
        x: &Self::Buffer,
        w: &Self::Buffer,
        y: &mut Self::Buffer,
        rstd: &mut Self::Buffer,
        cols: usize,
        eps: f32,
    ) -> Result<()> {
        let rows = check_rmsnorm_fwd((x, w), (y, rstd), cols, eps)?;
        D::rmsnorm(self, D::NormIn { x, w, rows, cols }, (y, rstd), eps)
    }

    /// RMSNorm backward: writes `dx` and `dw` (summed over rows).
    fn rmsnorm_bwd(
        &self,
        input: RmsNormBwdIn<'_, Self::Buffer>,
        (dx, dw): (&mut Self::Buffer, &mut Self::Buffer),
        cols: usize,
    ) -> Result<()> {
        let rows = input.check((dx, dw), cols)?;
        let RmsNormBwdIn { x, w, rstd, dy } = input;
        let stats = D::NormStats {
            mean: None,
            rstd,
            dy,
        };
        D::norm_bwd(self, D::NormIn { x, w, rows, cols }, stats, (dx, dw, None))
    }

    /// Rotary position embedding on `x` of shape `[n, t, d]` (`n` = batch·heads, `d` even),
    /// rotate-half convention (Llama/GPT-NeoX): for `i < d/2`, with `θ = pos · base^(−2i/d)`,
    /// `pos = t_index`: `out[i] = x[i]·cos θ − x[i + d/2]·sin θ`,
    /// `out[i + d/2] = x[i + d/2]·cos θ + x[i]·sin θ`. `inverse` rotates by `−θ`, which is the
    /// backward.
    fn rope(
        &self,
        x: &Self::Buffer,
        out: &mut Self::Buffer,
        [n, t, d]: [usize; 3],
        (base, inverse): (f32, bool),
    ) -> Result<()> {
        check_rope(x, out, n, t, d, base)?;
        D::rope(self, x, out, [n, t, d], (base, inverse))
    }

    /// `out[r] = table[ids[r]]` for a `[vocab, dim]` table (`x.rows`) and u32 `ids`; an id
    /// `>= vocab` is an error on the CPU and a NaN row on CUDA.
    fn embedding_fwd(&self, x: IdRows<'_, Self::Buffer>, out: &mut Self::Buffer) -> Result<()> {
        self.gather_rows(x, out)
    }

    /// Embedding backward: `dtable` (`[vocab, dim]`) is overwritten with zeros, then
    /// `dtable[ids[r]] += dout[r]` for every row (atomic adds on CUDA); `x.rows` is `dout`.
    fn embedding_bwd(&self, x: IdRows<'_, Self::Buffer>, dtable: &mut Self::Buffer) -> Result<()> {
        self.scatter_add_rows(x, dtable)
    }
}

/// The inputs of a softmax-family backward ([`RowOps::softmax_bwd`],
/// [`RowOps::log_softmax_bwd`]).
#[derive(Debug)]
pub struct RowBwdIn<'a, Buf> {
    /// The forward's output, `[rows, cols]`.
    pub y: &'a Buf,
    /// The gradient of the output, `[rows, cols]`.
    pub dy: &'a Buf,
}

impl<Buf: BufferInfo> RowBwdIn<'_, Buf> {
    /// Checks the inputs with the output `dx` (every backend): `y`, `dy` and `dx` f32 of the
    /// same length, whole `cols`-wide rows; returns the number of rows.
    pub fn check(&self, op: &'static str, dx: &Buf, cols: usize) -> Result<usize> {
        check_rows_bwd(op, self.y, self.dy, dx, cols)
    }
}

arg_struct! {
    /// The inputs of a cross-entropy ([`RowOps::cross_entropy_fwd`],
    /// [`RowOps::cross_entropy_bwd`]): `cols`-wide rows of logits and one u32 class a row.
    pub struct LogitsIn<'a, Buf> {
        /// The logits, f32 `[rows, cols]`.
        pub logits: &'a Buf,
        /// The class of each row, u32 `[rows]`, each `< cols`.
        pub targets: &'a Buf,
        /// The number of classes.
        pub cols: usize,
    }
}

impl<Buf: BufferInfo> LogitsIn<'_, Buf> {
    /// Checks the inputs with the per-row buffer (the loss, or `dloss`) and, for the backward,
    /// `dlogits` ([`check_cross_entropy`], every backend); returns the number of rows.
    pub fn check(&self, op: &'static str, per_row: &Buf, dlogits: Option<&Buf>) -> Result<usize> {
        let dlogits = dlogits.map(|d| d as &dyn BufferInfoDyn);
        check_cross_entropy(op, self.logits, self.targets, per_row, dlogits, self.cols)
    }
}

/// The inputs of [`RowOps::layernorm_bwd`].
#[derive(Debug)]
pub struct LayerNormBwdIn<'a, Buf> {
    /// The forward's input, `[rows, cols]`.
    pub x: &'a Buf,
    /// The weight, `[cols]`.
    pub w: &'a Buf,
    /// The forward's saved mean of each row, `[rows]`.
    pub mean: &'a Buf,
    /// The forward's saved `1/sqrt(var + eps)` of each row, `[rows]`.
    pub rstd: &'a Buf,
    /// The gradient of the output, `[rows, cols]`.
    pub dy: &'a Buf,
}

impl<Buf: BufferInfo> LayerNormBwdIn<'_, Buf> {
    /// Checks the inputs with the outputs `dx`, `dw`, `db` (the backends' kernels): `x`, `dy`
    /// and `dx` f32 `rows·cols`, `w`, `dw`, `db` f32 `cols`, `mean` and `rstd` f32 `rows`;
    /// returns the number of rows.
    pub fn check(&self, (dx, dw, db): (&Buf, &Buf, &Buf), cols: usize) -> Result<usize> {
        const OP: &str = "layernorm_bwd";
        let params = [("w", self.w as _), ("dw", dw as _), ("db", db as _)];
        let stats = [("mean", self.mean as _), ("rstd", self.rstd as _)];
        let rows = check_norm(OP, self.x, dx, &params, &stats, cols)?;
        check_rows_bwd(OP, self.x, self.dy, dx, cols)?;
        Ok(rows)
    }
}

/// The inputs of [`RowOps::rmsnorm_bwd`].
#[derive(Debug)]
pub struct RmsNormBwdIn<'a, Buf> {
    /// The forward's input, `[rows, cols]`.
    pub x: &'a Buf,
    /// The weight, `[cols]`.
    pub w: &'a Buf,
    /// The forward's saved `1/sqrt(mean(x²) + eps)` of each row, `[rows]`.
    pub rstd: &'a Buf,
    /// The gradient of the output, `[rows, cols]`.
    pub dy: &'a Buf,
}

impl<Buf: BufferInfo> RmsNormBwdIn<'_, Buf> {
    /// Checks the inputs with the outputs `dx`, `dw` (every backend): `x`, `dy` and `dx` f32
    /// `rows·cols`, `w` and `dw` f32 `cols`, `rstd` f32 `rows`; returns the number of rows.
    pub fn check(&self, (dx, dw): (&Buf, &Buf), cols: usize) -> Result<usize> {
        const OP: &str = "rmsnorm_bwd";
        let params = [("w", self.w as _), ("dw", dw as _)];
        let rows = check_norm(OP, self.x, dx, &params, &[("rstd", self.rstd)], cols)?;
        check_rows_bwd(OP, self.x, self.dy, dx, cols)?;
        Ok(rows)
    }
}

copy_refs!(RowBwdIn, LayerNormBwdIn, RmsNormBwdIn);

// ---------------------------------------------------------------------------------------------
// Argument checks shared by every backend, so the CPU reference and the CUDA kernels reject
// exactly the same inputs. Each returns the number of rows.
// ---------------------------------------------------------------------------------------------

/// Errors unless `dtype` is u32 (token ids, class targets).
pub fn require_u32(op: &'static str, dtype: DType) -> Result<()> {
    require_dtype(op, DType::U32, dtype)
}

/// Errors ([`GpuError::DTypeMismatch`]) unless `got` is `expected`.
pub fn require_dtype(op: &'static str, expected: DType, got: DType) -> Result<()> {
    if got == expected {
        Ok(())
    } else {
        Err(GpuError::DTypeMismatch { op, expected, got })
    }
}

/// Errors unless `buf` holds exactly `want` elements (`name` names it in the error).
pub fn check_len(op: &'static str, name: &str, buf: &impl BufferInfo, want: usize) -> Result<()> {
    crate::ops::check_count(op, name, buf.len(), want)
}

/// Errors unless `buf` is f32 with exactly `want` elements (`what` names it in the error).
pub fn require_f32_len(
    op: &'static str,
    what: &str,
    buf: &dyn BufferInfoDyn,
    want: usize,
) -> Result<()> {
    require_f32(op, buf.dtype_dyn())?;
    crate::ops::check_count(op, what, buf.len_dyn(), want)
}

/// Checks `eps` of a normalisation: finite and `> 0`.
pub fn check_eps(op: &'static str, eps: f32) -> Result<()> {
    if eps.is_finite() && eps > 0.0 {
        Ok(())
    } else {
        Err(GpuError::invalid(
            op,
            format!("eps must be finite and > 0, got {eps}"),
        ))
    }
}

/// Checks a row-wise backward with two `cols`-wide inputs (`y`, `dy`) and one output (`dx`),
/// all f32 of the same length.
pub fn check_rows_bwd(
    op: &'static str,
    y: &dyn BufferInfoDyn,
    dy: &dyn BufferInfoDyn,
    dx: &dyn BufferInfoDyn,
    cols: usize,
) -> Result<usize> {
    let rows = check_rows(op, y, dx, cols)?;
    check_elementwise(op, &[y, dy], dx)?;
    Ok(rows)
}

/// Checks cross-entropy's arguments: `logits` f32 `rows·cols`, `targets` u32 `rows`, `per_row`
/// (the loss, or `dloss`) f32 `rows`, and for the backward `dlogits` of the logits' length.
pub fn check_cross_entropy(
    op: &'static str,
    logits: &dyn BufferInfoDyn,
    targets: &dyn BufferInfoDyn,
    per_row: &dyn BufferInfoDyn,
    dlogits: Option<&dyn BufferInfoDyn>,
    cols: usize,
) -> Result<usize> {
    let rows = check_rows(op, logits, dlogits.unwrap_or(logits), cols)?;
    require_u32(op, targets.dtype_dyn())?;
    if targets.len_dyn() != rows {
        return Err(GpuError::shape(
            op,
            format!("targets of {rows} entries"),
            targets.len_dyn(),
        ));
    }
    require_f32_len(op, "per-row loss", per_row, rows)?;
    Ok(rows)
}

/// Checks a normalisation's row buffers (`x`, and `out` of the same length), its `cols`-long
/// parameters and its `rows`-long statistics; returns the number of rows.
pub fn check_norm(
    op: &'static str,
    x: &dyn BufferInfoDyn,
    out: &dyn BufferInfoDyn,
    params: &[(&str, &dyn BufferInfoDyn)],
    stats: &[(&str, &dyn BufferInfoDyn)],
    cols: usize,
) -> Result<usize> {
    let rows = check_rows(op, x, out, cols)?;
    for &(what, p) in params {
        require_f32_len(op, what, p, cols)?;
    }
    for &(what, s) in stats {
        require_f32_len(op, what, s, rows)?;
    }
    Ok(rows)
}

/// Checks [`RowOps::layernorm_fwd`]'s inputs `(x, w, b)` and outputs `(y, mean, rstd)` (every
/// backend): `x` and `y` f32 `rows·cols`, `w` and `b` f32 `cols`, `mean` and `rstd` f32 `rows`,
/// then `eps` ([`check_eps`]); returns the number of rows.
pub fn check_layernorm_fwd<Buf: BufferInfo>(
    (x, w, b): (&Buf, &Buf, &Buf),
    (y, mean, rstd): (&Buf, &Buf, &Buf),
    cols: usize,
    eps: f32,
) -> Result<usize> {
    const OP: &str = "layernorm_fwd";
    let params = [("w", w as _), ("b", b as _)];
    let rows = check_norm(OP, x, y, &params, &[("mean", mean), ("rstd", rstd)], cols)?;
    check_eps(OP, eps)?;
    Ok(rows)
}

/// Checks [`RowOps::rmsnorm_fwd`]'s inputs `(x, w)` and outputs `(y, rstd)` (every backend): `x`
/// and `y` f32 `rows·cols`, `w` f32 `cols`, `rstd` f32 `rows`, then `eps` ([`check_eps`]);
/// returns the number of rows.
pub fn check_rmsnorm_fwd<Buf: BufferInfo>(
    (x, w): (&Buf, &Buf),
    (y, rstd): (&Buf, &Buf),
    cols: usize,
    eps: f32,
) -> Result<usize> {
    const OP: &str = "rmsnorm_fwd";
    let rows = check_norm(OP, x, y, &[("w", w)], &[("rstd", rstd)], cols)?;
    check_eps(OP, eps)?;
    Ok(rows)
}

/// Checks RoPE's arguments: `x` and `out` f32 of `n·t·d`, `d` even and non-zero, `n`, `t`, `d`
/// each below 2^32, `base` finite and `> 0`.
pub fn check_rope(
    x: &dyn BufferInfoDyn,
    out: &dyn BufferInfoDyn,
    n: usize,
    t: usize,
    d: usize,
    base: f32,
) -> Result<()> {
    const OP: &str = "rope";
    if d == 0 || !d.is_multiple_of(2) {
        return Err(GpuError::InvalidShape {
            op: OP,
            reason: format!("head dim must be even and > 0, got {d}"),
        });
    }
    if [n, t, d].iter().any(|&v| v > u32::MAX as usize) {
        return Err(GpuError::InvalidShape {
            op: OP,
            reason: format!("dims [{n}, {t}, {d}] must each be below 2^32"),
        });
    }
    let len = n
        .checked_mul(t)
        .and_then(|v| v.checked_mul(d))
        .ok_or_else(|| GpuError::InvalidShape {
            op: OP,
            reason: format!("[{n}, {t}, {d}] overflows usize"),
        })?;
    if !(base.is_finite() && base > 0.0) {
        return Err(GpuError::invalid(
            OP,
            format!("base must be finite and > 0, got {base}"),
        ));
    }
    require_f32_len(OP, "x", x, len)?;
    require_f32_len(OP, "out", out, len)
}

/// Checks an embedding's arguments: u32 `ids` (`rows` of them), an f32 `[vocab, dim]` table
/// (or its gradient) and f32 `rows·dim` activations (`out`, or `dout`); returns
/// `(rows, vocab)`.
pub fn check_embedding(
    op: &'static str,
    ids: &dyn BufferInfoDyn,
    table: &dyn BufferInfoDyn,
    acts: &dyn BufferInfoDyn,
    dim: usize,
) -> Result<(usize, usize)> {
    require_u32(op, ids.dtype_dyn())?;
    require_f32(op, table.dtype_dyn())?;
    if dim == 0 {
        return Err(GpuError::InvalidShape {
            op,
            reason: "embeddings must have at least one dimension".into(),
        });
    }
    let vocab = crate::ops::whole_rows(op, table.len_dyn(), dim, || {
        format!("a [vocab, {dim}] table")
    })?;
    let rows = ids.len_dyn();
    let len = rows
        .checked_mul(dim)
        .ok_or_else(|| GpuError::InvalidShape {
            op,
            reason: format!("{rows} rows of {dim} overflow usize"),
        })?;
    require_f32_len(op, "activations", acts, len)?;
    Ok((rows, vocab))
}
