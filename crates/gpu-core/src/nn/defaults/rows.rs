//! Defaults of [`RowOps`](crate::nn::RowOps): the softmax family, cross-entropy, the norms and
//! RoPE as broadcast ops, reductions and gathers (f32, like the family). Against the CPU
//! (which accumulates in f64) they stay within a few f32 ulps of each output's scale per
//! step: the bounds of `tests/primitives_only.rs`.

use super::{f32_buf, flat_row_ids, ids_buf, map, read_u32, reduce, rsqrt, zip, zip_scalar};
use crate::backend::BufferInfo;
use crate::error::Result;
use crate::nn::elementwise::{Activation, BinaryKind as K, ReduceKind as R};
use crate::nn::primitives::{IdRows, Primitives};
use crate::nn::rows::{LayerNormBwdIn, RowBwdIn};
use crate::nn::BlockCopy;

/// `logsumexp` of each `cols`-wide row, `max + ln Σ exp(x − max)`: `[rows]`.
pub fn lse_rows<B: Primitives + ?Sized>(
    b: &B,
    x: &B::Buffer,
    rows: usize,
    cols: usize,
) -> Result<B::Buffer> {
    let m = reduce(b, R::Max, x, [rows, cols, 1])?;
    let s = zip(b, K::Sub, (x, &[rows, cols]), (&m, &[rows, 1]))?;
    let z = reduce(b, R::Sum, &map(b, Activation::Exp, &s)?, [rows, cols, 1])?;
    zip(
        b,
        K::Add,
        (&m, &[rows]),
        (&map(b, Activation::Log, &z)?, &[rows]),
    )
}

/// `softmax` of each row into `out`: `exp(x − max) / Σ exp(x − max)`.
pub fn softmax<B: Primitives + ?Sized>(
    b: &B,
    x: &B::Buffer,
    out: &mut B::Buffer,
    [rows, cols]: [usize; 2],
) -> Result<()> {
    let m = reduce(b, R::Max, x, [rows, cols, 1])?;
    let e = map(
        b,
        Activation::Exp,
        &zip(b, K::Sub, (x, &[rows, cols]), (&m, &[rows, 1]))?,
    )?;
    let z = reduce(b, R::Sum, &e, [rows, cols, 1])?;
    b.broadcast_binary(K::Div, &e, &[rows, cols], &z, &[rows, 1], out)
}

/// `x − logsumexp_row(x)` into `out`.
pub fn log_softmax<B: Primitives + ?Sized>(
    b: &B,
    x: &B::Buffer,
    out: &mut B::Buffer,
    [rows, cols]: [usize; 2],
) -> Result<()> {
    let lse = lse_rows(b, x, rows, cols)?;
    b.broadcast_binary(K::Sub, x, &[rows, cols], &lse, &[rows, 1], out)
}

/// `dx = y ∘ (dy − Σ_row(dy ∘ y))`.
pub fn softmax_bwd<B: Primitives + ?Sized>(
    b: &B,
    RowBwdIn { y, dy }: RowBwdIn<'_, B::Buffer>,
    dx: &mut B::Buffer,
    [rows, cols]: [usize; 2],
) -> Result<()> {
    let sh = [rows, cols];
    let dot = reduce(
        b,
        R::Sum,
        &zip(b, K::Mul, (dy, &sh), (y, &sh))?,
        [rows, cols, 1],
    )?;
    let diff = zip(b, K::Sub, (dy, &sh), (&dot, &[rows, 1]))?;
    b.broadcast_binary(K::Mul, y, &sh, &diff, &sh, dx)
}

/// `dx = dy − exp(y) · Σ_row(dy)`.
pub fn log_softmax_bwd<B: Primitives + ?Sized>(
    b: &B,
    RowBwdIn { y, dy }: RowBwdIn<'_, B::Buffer>,
    dx: &mut B::Buffer,
    [rows, cols]: [usize; 2],
) -> Result<()> {
    let sh = [rows, cols];
    let s = reduce(b, R::Sum, dy, [rows, cols, 1])?;
    let p = zip(
        b,
        K::Mul,
        (&map(b, Activation::Exp, y)?, &sh),
        (&s, &[rows, 1]),
    )?;
    b.broadcast_binary(K::Sub, dy, &sh, &p, &sh, dx)
}

/// The flat positions `r·cols + targets[r]` as a u32 buffer (targets read on the host).
fn target_ids<B: Primitives + ?Sized>(
    b: &B,
    op: &'static str,
    targets: &B::Buffer,
    cols: usize,
) -> Result<B::Buffer> {
    ids_buf(b, &flat_row_ids(op, &read_u32(b, targets)?, cols)?)
}

/// `loss[r] = logsumexp(logits[r]) − logits[r, targets[r]]`.
pub fn cross_entropy<B: Primitives + ?Sized>(
    b: &B,
    (logits, targets): (&B::Buffer, &B::Buffer),
    loss: &mut B::Buffer,
    [rows, cols]: [usize; 2],
) -> Result<()> {
    let ids = target_ids(b, "cross_entropy_fwd", targets, cols)?;
    let mut picked = f32_buf(b, rows)?;
    b.gather_rows(IdRows::new(&ids, logits, 1), &mut picked)?;
    let lse = lse_rows(b, logits, rows, cols)?;
    b.broadcast_binary(K::Sub, &lse, &[rows], &picked, &[rows], loss)
}

/// `dlogits[r] = (softmax(logits[r]) − onehot(targets[r])) · dloss[r]`.
pub fn cross_entropy_bwd<B: Primitives + ?Sized>(
    b: &B,
    (logits, targets, dloss): (&B::Buffer, &B::Buffer, &B::Buffer),
    dlogits: &mut B::Buffer,
    [rows, cols]: [usize; 2],
) -> Result<()> {
    let ids = target_ids(b, "cross_entropy_bwd", targets, cols)?;
    let mut ones = f32_buf(b, rows)?;
    b.fill(&mut ones, 1.0)?;
    let mut onehot = f32_buf(b, rows * cols)?;
    b.scatter_add_rows(IdRows::new(&ids, &ones, 1), &mut onehot)?;
    let mut p = f32_buf(b, rows * cols)?;
    softmax(b, logits, &mut p, [rows, cols])?;
    let sh = [rows, cols];
    let diff = zip(b, K::Sub, (&p, &sh), (&onehot, &sh))?;
    b.broadcast_binary(K::Mul, &diff, &sh, dloss, &[rows, 1], dlogits)
}

/// The norms' inputs: `x` `[rows, cols]`, the weight `w` `[cols]` (and LayerNorm's bias).
pub struct NormIn<'a, B: Primitives + ?Sized> {
    pub x: &'a B::Buffer,
    pub w: &'a B::Buffer,
    pub rows: usize,
    pub cols: usize,
}

/// `rstd = 1/sqrt(mean_row(c²) + eps)` of centred (or raw) rows `c`, into `rstd` `[rows]`.
fn rstd_of<B: Primitives + ?Sized>(
    b: &B,
    c: &B::Buffer,
    [rows, cols]: [usize; 2],
    eps: f32,
    rstd: &mut B::Buffer,
) -> Result<()> {
    let sq = zip(b, K::Mul, (c, &[c.len()]), (c, &[c.len()]))?;
    let ms = reduce(b, R::Mean, &sq, [rows, cols, 1])?;
    b.cast(&rsqrt(b, &zip_scalar(b, K::Add, &ms, eps)?)?, rstd)
}

/// LayerNorm forward: `y = (x − mean)·rstd·w + bias`, saving `mean` and `rstd`.
pub fn layernorm<B: Primitives + ?Sized>(
    b: &B,
    n: NormIn<'_, B>,
    bias: &B::Buffer,
    (y, mean, rstd): (&mut B::Buffer, &mut B::Buffer, &mut B::Buffer),
    eps: f32,
) -> Result<()> {
    let (rows, cols) = (n.rows, n.cols);
    let sh = [rows, cols];
    b.reduce_axis(R::Mean, n.x, rows, cols, 1, mean)?;
    let c = zip(b, K::Sub, (n.x, &sh), (&*mean, &[rows, 1]))?;
    rstd_of(b, &c, sh, eps, rstd)?;
    let xhat = zip(b, K::Mul, (&c, &sh), (&*rstd, &[rows, 1]))?;
    let scaled = zip(b, K::Mul, (&xhat, &sh), (n.w, &[cols]))?;
    b.broadcast_binary(K::Add, &scaled, &sh, bias, &[cols], y)
}

/// RMSNorm forward: `y = x·rstd·w`, saving `rstd`.
pub fn rmsnorm<B: Primitives + ?Sized>(
    b: &B,
    n: NormIn<'_, B>,
    (y, rstd): (&mut B::Buffer, &mut B::Buffer),
    eps: f32,
) -> Result<()> {
    let sh = [n.rows, n.cols];
    rstd_of(b, n.x, sh, eps, rstd)?;
    let xhat = zip(b, K::Mul, (n.x, &sh), (&*rstd, &[n.rows, 1]))?;
    b.broadcast_binary(K::Mul, &xhat, &sh, n.w, &[n.cols], y)
}

/// The saved statistics of a norm backward (`mean` only for LayerNorm).
pub struct NormStats<'a, B: Primitives + ?Sized> {
    pub mean: Option<&'a B::Buffer>,
    pub rstd: &'a B::Buffer,
    pub dy: &'a B::Buffer,
}

/// [`RowOps::layernorm_bwd`](crate::nn::RowOps::layernorm_bwd) of checked inputs (`rows` of
/// `cols`): [`norm_bwd`] with the saved mean.
pub fn layernorm_bwd<B: Primitives + ?Sized>(
    b: &B,
    input: LayerNormBwdIn<'_, B::Buffer>,
    (dx, dw, db): (&mut B::Buffer, &mut B::Buffer, &mut B::Buffer),
    [rows, cols]: [usize; 2],
) -> Result<()> {
    let (x, w) = (input.x, input.w);
    let stats = NormStats {
        mean: Some(input.mean),
        rstd: input.rstd,
        dy: input.dy,
    };
    norm_bwd(b, NormIn { x, w, rows, cols }, stats, (dx, dw, Some(db)))
}

/// LayerNorm/RMSNorm backward: with `x̂ = (x − mean)·rstd` (no mean for RMSNorm) and
/// `g = dy·w`: `dx = rstd·(g − [mean_row(g)] − x̂·mean_row(g·x̂))`, `dw = Σ_rows dy·x̂`, and
/// LayerNorm's `db = Σ_rows dy`.
pub fn norm_bwd<B: Primitives + ?Sized>(
    b: &B,
    n: NormIn<'_, B>,
    s: NormStats<'_, B>,
    (dx, dw, db): (&mut B::Buffer, &mut B::Buffer, Option<&mut B::Buffer>),
) -> Result<()> {
    let (rows, cols) = (n.rows, n.cols);
    let (sh, col) = ([rows, cols], [rows, 1]);
    let c = match s.mean {
        Some(m) => zip(b, K::Sub, (n.x, &sh), (m, &col))?,
        None => zip_scalar(b, K::Add, n.x, 0.0)?,
    };
    let xhat = zip(b, K::Mul, (&c, &sh), (s.rstd, &col))?;
    let dyx = zip(b, K::Mul, (s.dy, &sh), (&xhat, &sh))?;
    b.reduce_axis(R::Sum, &dyx, 1, rows, cols, dw)?;
    if let Some(db) = db {
        b.reduce_axis(R::Sum, s.dy, 1, rows, cols, db)?;
    }
    let g = zip(b, K::Mul, (s.dy, &sh), (n.w, &[cols]))?;
    let gx = reduce(
        b,
        R::Mean,
        &zip(b, K::Mul, (&g, &sh), (&xhat, &sh))?,
        [rows, cols, 1],
    )?;
    let mut inner = zip(
        b,
        K::Sub,
        (&g, &sh),
        (&zip(b, K::Mul, (&xhat, &sh), (&gx, &col))?, &sh),
    )?;
    if s.mean.is_some() {
        let gm = reduce(b, R::Mean, &g, [rows, cols, 1])?;
        inner = zip(b, K::Sub, (&inner, &sh), (&gm, &col))?;
    }
    b.broadcast_binary(K::Mul, &inner, &sh, s.rstd, &col, dx)
}

/// RoPE (rotate-half): the cos and sin tables `[t, d/2]` of `θ = pos·base^(−2i/d)` computed in
/// f64 on the host and rounded (they depend on the sizes only), the halves split with
/// `copy_blocks`, rotated with broadcast ops and written back. Within 2 ulps of `|x|`.
pub fn rope<B: Primitives + ?Sized>(
    b: &B,
    x: &B::Buffer,
    out: &mut B::Buffer,
    [n, t, d]: [usize; 3],
    (base, inverse): (f32, bool),
) -> Result<()> {
    let h = d / 2;
    let (mut cos, mut sin) = (Vec::with_capacity(t * h), Vec::with_capacity(t * h));
    for pos in 0..t {
        for i in 0..h {
            let theta = pos as f64 * (base as f64).powf(-2.0 * i as f64 / d as f64);
            cos.push(theta.cos() as f32);
            sin.push(if inverse { -theta.sin() } else { theta.sin() } as f32);
        }
    }
    let (cos, sin) = (b.upload(&cos)?, b.upload(&sin)?);
    let rows = n * t;
    let half = |off: usize| -> Result<B::Buffer> {
        let mut o = f32_buf(b, rows * h)?;
        b.copy_blocks(
            x,
            &mut o,
            BlockCopy {
                src_offset: off,
                src_stride: d,
                dst_offset: 0,
                dst_stride: h,
                outer: rows,
                len: h,
            },
        )?;
        Ok(o)
    };
    let (x1, x2) = (half(0)?, half(h)?);
    let (sh, tab) = ([n, t, h], [t, h]);
    let rot = |a: &B::Buffer, c: K, bb: &B::Buffer| -> Result<B::Buffer> {
        let ac = zip(b, K::Mul, (a, &sh), (&cos, &tab))?;
        let bs = zip(b, K::Mul, (bb, &sh), (&sin, &tab))?;
        zip(b, c, (&ac, &sh), (&bs, &sh))
    };
    let (o1, o2) = (rot(&x1, K::Sub, &x2)?, rot(&x2, K::Add, &x1)?);
    b.copy_blocks(
        &o1,
        out,
        BlockCopy {
            src_offset: 0,
            src_stride: h,
            dst_offset: 0,
            dst_stride: d,
            outer: rows,
            len: h,
        },
    )?;
    b.copy_blocks(
        &o2,
        out,
        BlockCopy {
            src_offset: 0,
            src_stride: h,
            dst_offset: h,
            dst_stride: d,
            outer: rows,
            len: h,
        },
    )
}

/// The fused residual add and RMSNorm of decoding: `sum = x + y` (f32), `normed` its
/// RMSNorm times `w`, rounded once to `normed`'s dtype.
pub fn add_rms_norm<B: Primitives + ?Sized>(
    b: &B,
    (x, y, w): (&B::Buffer, Option<&B::Buffer>, &B::Buffer),
    (sum, normed): (&mut B::Buffer, &mut B::Buffer),
    cols: usize,
    eps: f32,
) -> Result<()> {
    let rows = crate::nn::decode::check_add_rms_norm(x, y, w, sum, normed, cols, eps)?;
    match y {
        Some(y) => {
            let y = super::widen(b, y)?;
            b.broadcast_binary(K::Add, x, &[x.len()], &y, &[y.len()], sum)?
        }
        None => b.cast(x, sum)?,
    }
    let mut rstd = f32_buf(b, rows)?;
    let mut out = f32_buf(b, rows * cols)?;
    rmsnorm(
        b,
        NormIn {
            x: &*sum,
            w,
            rows,
            cols,
        },
        (&mut out, &mut rstd),
        eps,
    )?;
    b.cast(&out, normed)
}

/// SwiGLU of a packed `[rows, 2i]` gate/up projection: the halves split with `copy_blocks`,
/// `silu(gate)·up` in f32, rounded once to `out`'s dtype.
pub fn swiglu_packed<B: Primitives + ?Sized>(
    b: &B,
    gu: &B::Buffer,
    out: &mut B::Buffer,
    i: usize,
) -> Result<()> {
    let rows = crate::nn::decode::check_swiglu_packed(gu, out, i)?;
    let gu = super::widen(b, gu)?;
    let half = |off: usize| -> Result<B::Buffer> {
        let mut o = f32_buf(b, rows * i)?;
        b.copy_blocks(
            &gu,
            &mut o,
            BlockCopy {
                src_offset: off,
                src_stride: 2 * i,
                dst_offset: 0,
                dst_stride: i,
                outer: rows,
                len: i,
            },
        )?;
        Ok(o)
    };
    let gate = map(b, Activation::Silu, &half(0)?)?;
    let prod = zip(b, K::Mul, (&gate, &[rows * i]), (&half(i)?, &[rows * i]))?;
    b.cast(&prod, out)
}
