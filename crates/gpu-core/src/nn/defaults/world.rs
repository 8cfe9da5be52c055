//! Defaults of [`WorldOps`](crate::nn::WorldOps), all device compositions of the primitives
//! (and `RowOps::layernorm_fwd`, itself defaulted from them): the largest magnitude as two max
//! reductions, the low-rank correction as a scaled product added in a temporary, and the
//! rollout as one GRU step, head and decoder after another (a few dozen primitive calls per
//! step and member, where CUDA's fused kernel makes one launch of the whole rollout).
//!
//! Accuracy against the f64 reference (`rssm::reference`): every product is an f32 matmul and
//! every row statistic an f32 reduction, so each output carries the f32 rounding of a few
//! chained layers, as the CUDA kernel's does (`rssm/tests` state the bound).

use super::{f32_buf, map, zip, zip_same, zip_scalar};
use crate::backend::{Backend, BufferInfo};
use crate::dtype::DType;
use crate::error::{GpuError, Result};
use crate::nn::elementwise::{Activation, BinaryKind as K, ReduceKind as R};
use crate::nn::primitives::Primitives;
use crate::nn::rows::RowOps;
use crate::nn::world::{LowRankFactors, LowRankOutcome, RolloutCall, RolloutDims};
use crate::nn::BlockCopy;
use crate::ops::MatmulSpec;

/// The largest `|x|` as `max(max x, max −x)` (NaN-propagating maxima), read on the host.
pub fn max_abs<B: Primitives + ?Sized>(b: &B, x: &B::Buffer) -> Result<f32> {
    if x.dtype() != DType::F32 {
        return Err(GpuError::invalid(
            "max_abs",
            format!("needs f32, got {}", x.dtype()),
        ));
    }
    let n = x.len();
    if n == 0 {
        return Ok(0.0);
    }
    // `[x; −x]`, both maxima in one reduction and one read.
    let neg = zip_scalar(b, K::Mul, x, -1.0)?;
    let mut both = f32_buf(b, 2 * n)?;
    b.copy_blocks(x, &mut both, BlockCopy::run(0, 0, n))?;
    b.copy_blocks(&neg, &mut both, BlockCopy::run(0, n, n))?;
    let v = b.download::<f32>(&super::reduce(b, R::Max, &both, [2, n, 1])?)?;
    Ok(if v[0].is_nan() || v[1].is_nan() {
        f32::NAN
    } else {
        v[0].max(v[1])
    })
}

/// `w += U·diag(S)·Vᵀ`, the sum formed and checked in a temporary first.
pub fn low_rank_add<B: Primitives + ?Sized>(
    b: &B,
    w: &mut B::Buffer,
    f: LowRankFactors<'_, B::Buffer>,
) -> Result<LowRankOutcome> {
    f.check(w)?;
    if !max_abs(b, w)?.is_finite() {
        return Ok(LowRankOutcome::NonFiniteWeights);
    }
    let (m, n, k) = (f.m, f.n, f.k);
    let us = zip(b, K::Mul, (f.u, &[m, k]), (f.s, &[k]))?;
    let mut p = f32_buf(b, m * n)?;
    let spec = MatmulSpec {
        trans_b: true,
        ..MatmulSpec::new(m, n, k)
    };
    b.matmul(spec, &us, f.v, &mut p)?;
    let sum = zip_same(b, K::Add, w, &p)?;
    if !max_abs(b, &sum)?.is_finite() {
        return Ok(LowRankOutcome::NonFiniteSum);
    }
    b.cast(&sum, w)?;
    Ok(LowRankOutcome::Written)
}

/// `y = x·Wᵀ + bias` for `x` `[rows, in]`, `W` `[o, in]`: a new `[rows, o]` buffer.
fn linear<B: Primitives + ?Sized>(
    b: &B,
    x: &B::Buffer,
    (w, bias): (&B::Buffer, &B::Buffer),
    [rows, input, o]: [usize; 3],
) -> Result<B::Buffer> {
    let mut y = f32_buf(b, rows * o)?;
    let spec = MatmulSpec {
        trans_b: true,
        ..MatmulSpec::new(rows, o, input)
    };
    b.matmul(spec, x, w, &mut y)?;
    zip(b, K::Add, (&y, &[rows, o]), (bias, &[o]))
}

/// Columns `from..from + cols` of a `[rows, width]` buffer, as a new `[rows, cols]` one.
fn columns<B: Primitives + ?Sized>(
    b: &B,
    x: &B::Buffer,
    [rows, width]: [usize; 2],
    (from, cols): (usize, usize),
) -> Result<B::Buffer> {
    let mut out = f32_buf(b, rows * cols)?;
    b.copy_blocks(
        x,
        &mut out,
        BlockCopy {
            src_offset: from,
            src_stride: width,
            dst_offset: 0,
            dst_stride: cols,
            outer: rows,
            len: cols,
        },
    )?;
    Ok(out)
}

/// `[x | y]` column-wise for `x` `[rows, a]`, `y` `[rows, c]`.
fn hcat<B: Primitives + ?Sized>(
    b: &B,
    (x, a): (&B::Buffer, usize),
    (y, c): (&B::Buffer, usize),
    rows: usize,
) -> Result<B::Buffer> {
    let mut out = f32_buf(b, rows * (a + c))?;
    b.copy_blocks(
        x,
        &mut out,
        BlockCopy {
            src_offset: 0,
            src_stride: a,
            dst_offset: 0,
            dst_stride: a + c,
            outer: rows,
            len: a,
        },
    )?;
    b.copy_blocks(
        y,
        &mut out,
        BlockCopy {
            src_offset: 0,
            src_stride: c,
            dst_offset: a,
            dst_stride: a + c,
            outer: rows,
            len: c,
        },
    )?;
    Ok(out)
}

/// One member's weights, each its own buffer.
struct Member<B: Backend + ?Sized> {
    w_ih: B::Buffer,
    w_hh: B::Buffer,
    b_ih: B::Buffer,
    b_hh: B::Buffer,
    /// Prior, posterior, decoder: `[fc.W, fc.b, norm.γ, norm.β, out.W, out.b]`.
    heads: Vec<[B::Buffer; 6]>,
}

impl<B: Primitives + RowOps + ?Sized> Member<B> {
    /// Member `k`'s tensors, copied out of the packed weights.
    fn unpack(b: &B, d: &RolloutDims, weights: &B::Buffer, k: usize) -> Result<Member<B>> {
        let mut at = k * d.member_len();
        let mut parts = Vec::new();
        for len in d.member_layout() {
            let mut t = f32_buf(b, len)?;
            b.copy_blocks(weights, &mut t, BlockCopy::run(at, 0, len))?;
            parts.push(t);
            at += len;
        }
        let mut it = parts.into_iter();
        let mut next = || {
            it.next()
                .ok_or_else(|| GpuError::invalid("rssm_rollout", "layout"))
        };
        let (w_ih, w_hh, b_ih, b_hh) = (next()?, next()?, next()?, next()?);
        let mut heads = Vec::new();
        for _ in 0..3 {
            heads.push([next()?, next()?, next()?, next()?, next()?, next()?]);
        }
        Ok(Member {
            w_ih,
            w_hh,
            b_ih,
            b_hh,
            heads,
        })
    }

    /// PyTorch's GRU cell on `z` `[rows, S]` and `h` `[rows, H]`: `h' = n + u∘(h − n)`.
    fn gru(&self, b: &B, d: &RolloutDims, z: &B::Buffer, h: &B::Buffer) -> Result<B::Buffer> {
        let (rows, hd) = (d.batch, d.hidden);
        let gi = linear(b, z, (&self.w_ih, &self.b_ih), [rows, d.latent, 3 * hd])?;
        let gh = linear(b, h, (&self.w_hh, &self.b_hh), [rows, hd, 3 * hd])?;
        let gate = |g: &B::Buffer, i: usize| columns(b, g, [rows, 3 * hd], (i * hd, hd));
        let r = map(
            b,
            Activation::Sigmoid,
            &zip_same(b, K::Add, &gate(&gi, 0)?, &gate(&gh, 0)?)?,
        )?;
        let u = map(
            b,
            Activation::Sigmoid,
            &zip_same(b, K::Add, &gate(&gi, 1)?, &gate(&gh, 1)?)?,
        )?;
        let rn = zip_same(b, K::Mul, &r, &gate(&gh, 2)?)?;
        let n = map(
            b,
            Activation::Tanh,
            &zip_same(b, K::Add, &gate(&gi, 2)?, &rn)?,
        )?;
        let diff = zip_same(b, K::Sub, h, &n)?;
        zip_same(b, K::Add, &n, &zip_same(b, K::Mul, &u, &diff)?)
    }

    /// Head `i` (0 prior, 1 posterior, 2 decoder): `out(relu(LayerNorm(fc(x))))`.
    fn head(&self, b: &B, d: &RolloutDims, i: usize, x: &B::Buffer) -> Result<B::Buffer> {
        let [fw, fb, g, beta, ow, ob] = &self.heads[i];
        let (rows, p) = (d.batch, d.head);
        let input = [d.hidden, d.hidden + d.embed, d.hidden + d.latent][i];
        let o = [2 * d.latent, 2 * d.latent, d.out][i];
        let y = linear(b, x, (fw, fb), [rows, input, p])?;
        let mut normed = f32_buf(b, rows * p)?;
        let (mut mean, mut rstd) = (f32_buf(b, rows)?, f32_buf(b, rows)?);
        b.layernorm_fwd((&y, g, beta), (&mut normed, &mut mean, &mut rstd), p, d.eps)?;
        let act = map(b, Activation::Relu, &normed)?;
        linear(b, &act, (ow, ob), [rows, p, o])
    }
}

/// The rollout: per member, filter along the posterior means, roll along the prior means,
/// decode every imagined step into `out`; then the ensemble mean and disagreement.
pub fn rssm_rollout<B: Primitives + RowOps + ?Sized>(
    b: &B,
    d: &RolloutDims,
    c: RolloutCall<'_, B::Buffer>,
) -> Result<()> {
    d.check_call(&c)?;
    let (rows, t, s, e) = (d.batch, d.context, d.latent, d.embed);
    let embeds: Vec<B::Buffer> = (0..t)
        .map(|i| {
            let mut x = f32_buf(b, rows * e)?;
            b.copy_blocks(
                c.embeds,
                &mut x,
                BlockCopy {
                    src_offset: i * e,
                    src_stride: t * e,
                    dst_offset: 0,
                    dst_stride: e,
                    outer: rows,
                    len: e,
                },
            )?;
            Ok(x)
        })
        .collect::<Result<_>>()?;
    let mean_of = |x: &B::Buffer| columns(b, x, [rows, 2 * s], (0, s));
    for k in 0..d.members {
        let m = Member::unpack(b, d, c.weights, k)?;
        let mut h = f32_buf(b, rows * d.hidden)?;
        b.fill(&mut h, 0.0)?;
        let mut z = f32_buf(b, rows * s)?;
        b.fill(&mut z, 0.0)?;
        for x in &embeds {
            h = m.gru(b, d, &z, &h)?;
            z = mean_of(&m.head(b, d, 1, &hcat(b, (&h, d.hidden), (x, e), rows)?)?)?;
        }
        for n in 0..d.steps {
            h = m.gru(b, d, &z, &h)?;
            z = mean_of(&m.head(b, d, 0, &h)?)?;
            let y = m.head(b, d, 2, &hcat(b, (&h, d.hidden), (&z, s), rows)?)?;
            let at = (k * rows * d.steps + n) * d.out;
            b.copy_blocks(
                &y,
                c.out,
                BlockCopy {
                    src_offset: 0,
                    src_stride: d.out,
                    dst_offset: at,
                    dst_stride: d.steps * d.out,
                    outer: rows,
                    len: d.out,
                },
            )?;
        }
    }
    let cells = rows * d.steps * d.out;
    b.reduce_axis(R::Mean, c.out, 1, d.members, cells, c.mean)?;
    let dev = zip(b, K::Sub, (c.out, &[d.members, cells]), (c.mean, &[cells]))?;
    let sq = zip_same(b, K::Mul, &dev, &dev)?;
    let mut var = f32_buf(b, cells)?;
    b.reduce_axis(R::Mean, &sq, 1, d.members, cells, &mut var)?;
    b.reduce_axis(R::Mean, &var, rows * d.steps, d.out, 1, c.disagreement)
}
