//! Defaults of [`AttentionOps`](crate::nn::AttentionOps): attention materialised, `[n, t, t]`
//! scores from batched matmuls, the causal mask as a broadcast `[t, t]` of 0 and −inf (built
//! on the host: it depends on `t` only), the softmax from `lse`. f32 throughout: against the
//! CPU reference within `~t·2^-24` relative of the outputs' scale. With attention dropout
//! ([`AttnDropout`]) the probabilities go through [`Primitives::dropout`]: the flat index of
//! entry `(s, i, j)` of the `[n, t, t]` array is the mask's index, so the mask is the CPU
//! reference's bit for bit.

use super::{f32_buf, map, reduce, rows::lse_rows, zip, zip_scalar};
use crate::backend::BufferInfo;
use crate::error::Result;
use crate::nn::attention::AttnDropout;
use crate::nn::elementwise::{Activation, BinaryKind as K, ReduceKind as R};
use crate::nn::primitives::Primitives;
use crate::ops::MatmulSpec;

/// The sizes of an attention call: `n` sequences of `t` tokens, head width `d`, the scale,
/// and the attention dropout (`None`: none).
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    pub n: usize,
    pub t: usize,
    pub d: usize,
    pub scale: f32,
    pub drop: Option<AttnDropout>,
}

impl Dims {
    /// Without dropout.
    pub fn plain(n: usize, t: usize, d: usize, scale: f32) -> Dims {
        Dims {
            n,
            t,
            d,
            scale,
            drop: None,
        }
    }
}

/// `x` `[n, t, t]` through the dropout `d` (the mask's index is the flat index).
fn drop_of<B: Primitives + ?Sized>(b: &B, x: &B::Buffer, d: AttnDropout) -> Result<B::Buffer> {
    let mut out = f32_buf(b, x.len())?;
    b.dropout(x, d.p, d.seed, &mut out)?;
    Ok(out)
}

/// `x` through the dropout of `s` (passed through without one).
fn dropped<B: Primitives + ?Sized>(b: &B, x: B::Buffer, s: Dims) -> Result<B::Buffer> {
    match s.drop {
        Some(d) => drop_of(b, &x, d),
        None => Ok(x),
    }
}

/// The forward's inputs `q`, `k`, `v` `[n, t, d]`.
pub struct Qkv<'a, B: Primitives + ?Sized> {
    pub q: &'a B::Buffer,
    pub k: &'a B::Buffer,
    pub v: &'a B::Buffer,
}

/// A batched product `op(a)·op(b)` of `m × n` into a new buffer.
fn mm<B: Primitives + ?Sized>(
    b: &B,
    (a, ta): (&B::Buffer, bool),
    (x, tb): (&B::Buffer, bool),
    [batch, m, n, k]: [usize; 4],
) -> Result<B::Buffer> {
    let mut c = f32_buf(b, batch * m * n)?;
    let spec = MatmulSpec {
        batch,
        m,
        n,
        k,
        trans_a: ta,
        trans_b: tb,
    };
    b.matmul(spec, a, x, &mut c)?;
    Ok(c)
}

/// The scaled, causally masked scores `scale·q·kᵀ + mask`, `[n, t, t]`.
fn scores<B: Primitives + ?Sized>(b: &B, x: &Qkv<'_, B>, s: Dims) -> Result<B::Buffer> {
    let (n, t, d) = (s.n, s.t, s.d);
    let raw = mm(b, (x.q, false), (x.k, true), [n, t, t, d])?;
    let scaled = zip_scalar(b, K::Mul, &raw, s.scale)?;
    let mask: Vec<f32> = (0..t * t)
        .map(|e| {
            if e % t > e / t {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    zip(
        b,
        K::Add,
        (&scaled, &[n, t, t]),
        (&b.upload(&mask)?, &[t, t]),
    )
}

/// `P = exp(scores − lse)`, the probabilities, `[n, t, t]`.
fn probs<B: Primitives + ?Sized>(
    b: &B,
    s: &B::Buffer,
    lse: &B::Buffer,
    dims: Dims,
) -> Result<B::Buffer> {
    let (n, t) = (dims.n, dims.t);
    map(
        b,
        Activation::Exp,
        &zip(b, K::Sub, (s, &[n * t, t]), (lse, &[n * t, 1]))?,
    )
}

/// Forward: `lse` of the masked scores, `out = P·v`.
pub fn forward<B: Primitives + ?Sized>(
    b: &B,
    x: Qkv<'_, B>,
    (out, lse): (&mut B::Buffer, &mut B::Buffer),
    s: Dims,
) -> Result<()> {
    if s.n * s.t == 0 {
        return Ok(());
    }
    let sc = scores(b, &x, s)?;
    b.cast(&lse_rows(b, &sc, s.n * s.t, s.t)?, lse)?;
    let p = dropped(b, probs(b, &sc, lse, s)?, s)?;
    let spec = MatmulSpec {
        batch: s.n,
        m: s.t,
        n: s.d,
        k: s.t,
        trans_a: false,
        trans_b: false,
    };
    b.matmul(spec, &p, x.v, out)
}

/// The backward's saved tensors and output gradient.
pub struct Saved<'a, B: Primitives + ?Sized> {
    pub out: &'a B::Buffer,
    pub lse: &'a B::Buffer,
    pub dout: &'a B::Buffer,
}

/// Backward: `P` recomputed from `lse`, `P' = dropout(P)` (`P` without dropout);
/// `dv = P'ᵀ·dout`, `dP = dropout(dout·vᵀ)` (the same mask and factor),
/// `dS = P∘(dP − Σ_row dout∘out)` (`Σ_row dout∘out = Σ_j P∘dP`), `dq = scale·dS·k`,
/// `dk = scale·dSᵀ·q`.
pub fn backward<B: Primitives + ?Sized>(
    b: &B,
    x: Qkv<'_, B>,
    g: Saved<'_, B>,
    (dq, dk, dv): (&mut B::Buffer, &mut B::Buffer, &mut B::Buffer),
    s: Dims,
) -> Result<()> {
    let (n, t, d) = (s.n, s.t, s.d);
    if n * t == 0 {
        return Ok(());
    }
    let p = probs(b, &scores(b, &x, s)?, g.lse, s)?;
    let kept = s.drop.map(|d| drop_of(b, &p, d)).transpose()?;
    let pv = kept.as_ref().unwrap_or(&p);
    b.cast(&mm(b, (pv, true), (g.dout, false), [n, t, d, t])?, dv)?;
    let dp = dropped(b, mm(b, (g.dout, false), (x.v, true), [n, t, t, d])?, s)?;
    let od = zip(b, K::Mul, (g.dout, &[n * t, d]), (g.out, &[n * t, d]))?;
    let di = reduce(b, R::Sum, &od, [n * t, d, 1])?;
    let centred = zip(b, K::Sub, (&dp, &[n * t, t]), (&di, &[n * t, 1]))?;
    let ds = zip(b, K::Mul, (&p, &[n * t * t]), (&centred, &[n * t * t]))?;
    let ds = zip_scalar(b, K::Mul, &ds, s.scale)?;
    b.cast(&mm(b, (&ds, false), (x.k, false), [n, t, d, t])?, dq)?;
    b.cast(&mm(b, (&ds, true), (x.q, false), [n, t, d, t])?, dk)
}
