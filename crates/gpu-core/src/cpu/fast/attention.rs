//! Causal attention of one sequence in f32 (the fast mode's kernel; the formulas are those of
//! the f64 reference in `cpu/attention.rs`).
//!
//! The five products (scores, `P·V`, `dS·K`, `dSᵀ·Q`, `Pᵀ·dO`) are small register-blocked
//! GEMMs: a block of [`R`] output rows × [`W`] columns stays in registers while the reduction
//! index runs. Each output is one chain of fused multiply-adds in index order, so its value does
//! not depend on the blocking (block rows, tail rows and narrow column tails all sum the same
//! terms in the same order), nor on the instruction-set level: `f32::mul_add` rounds once at
//! every level (the FMA instruction with AVX2 / AVX-512, libm's correctly rounded `fmaf` on the
//! baseline). The keys and values are transposed once per sequence so that a row of scores is
//! a product of that form too.

use super::math::exp;
use super::multiversion;
use crate::cpu::attention::SeqDrop;
use std::ops::Range;

/// `dst[c·t + j] = src[j·d + c]`: a `[t, d]` matrix transposed to `[d, t]`.
#[inline(always)]
fn transpose(src: &[f32], dst: &mut [f32], t: usize, d: usize) {
    for (j, row) in src.chunks_exact(d).take(t).enumerate() {
        for (c, &x) in row.iter().enumerate() {
            dst[c * t + j] = x;
        }
    }
}

/// One sequence's backward inputs: `q`, `k`, `v`, `out`, `lse`, `dout`.
pub(crate) type SeqIn<'a> = (
    &'a [f32],
    &'a [f32],
    &'a [f32],
    &'a [f32],
    &'a [f32],
    &'a [f32],
);

/// Columns of a register block.
const W: usize = 16;
/// Rows of a register block.
const R: usize = 4;

/// Scratch floats that [`fwd_seq`] needs.
pub(crate) const fn fwd_scratch(t: usize, d: usize) -> usize {
    t * d + R * t
}

/// Scratch floats that [`bwd_seq`] needs.
pub(crate) const fn bwd_scratch(t: usize, d: usize) -> usize {
    2 * (t * d + t * t)
}

/// `acc[l] = a(x)·b(x)[l] + acc[l]` for `x` in `xs`, in order (one rounding each).
#[inline(always)]
fn fma_row<'x>(
    acc: &mut [f32],
    xs: Range<usize>,
    a: impl Fn(usize) -> f32,
    b: impl Fn(usize) -> &'x [f32],
) {
    let n = acc.len();
    for x in xs {
        let (ax, bx) = (a(x), &b(x)[..n]);
        for (o, &bv) in acc.iter_mut().zip(bx) {
            *o = ax.mul_add(bv, *o);
        }
    }
}

/// [`fma_row`] for the `N` rows of a block at once over the same `xs` (`a(r, x)` the factor of
/// row `r`), `W` columns each.
#[inline(always)]
fn fma_block<'x, const N: usize>(
    acc: &mut [[f32; W]; N],
    xs: Range<usize>,
    a: impl Fn(usize, usize) -> f32,
    b: impl Fn(usize) -> &'x [f32],
) {
    for x in xs {
        let bx: &[f32; W] = b(x)[..W].try_into().expect("W floats");
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let ar = a(r, x);
            for l in 0..W {
                acc_r[l] = ar.mul_add(bx[l], acc_r[l]);
            }
        }
    }
}

/// The terms that row `r` of a block sums, in order: `pre(r)`, then the rows' common range,
/// then `post(r)`.
struct Terms<P, Q> {
    pre: P,
    common: Range<usize>,
    post: Q,
}

/// `out[r·stride + c] = Σ_x a(r, x)·b(x)[c]` for the `N` rows `r` of a block and the columns
/// `c < cols`, over the terms `terms` (see [`Terms`]); `b(x)` is a row of at least `cols`
/// floats.
#[inline(always)]
fn product<'x, const N: usize>(
    cols: usize,
    terms: &Terms<impl Fn(usize) -> Range<usize>, impl Fn(usize) -> Range<usize>>,
    a: impl Fn(usize, usize) -> f32 + Copy,
    b: impl Fn(usize) -> &'x [f32] + Copy,
    (out, stride): (&mut [f32], usize),
) {
    let mut c0 = 0;
    while c0 + W <= cols {
        let bc = move |x: usize| &b(x)[c0..];
        let mut acc = [[0.0f32; W]; N];
        for (r, acc_r) in acc.iter_mut().enumerate() {
            fma_row(acc_r, (terms.pre)(r), |x| a(r, x), bc);
        }
        fma_block(&mut acc, terms.common.clone(), a, bc);
        for (r, acc_r) in acc.iter_mut().enumerate() {
            fma_row(acc_r, (terms.post)(r), |x| a(r, x), bc);
            out[r * stride + c0..r * stride + c0 + W].copy_from_slice(acc_r);
        }
        c0 += W;
    }
    if c0 < cols {
        let bc = move |x: usize| &b(x)[c0..];
        for r in 0..N {
            let o = &mut out[r * stride + c0..r * stride + cols];
            o.fill(0.0);
            let ar = |x: usize| a(r, x);
            fma_row(o, (terms.pre)(r), ar, bc);
            fma_row(o, terms.common.clone(), ar, bc);
            fma_row(o, (terms.post)(r), ar, bc);
        }
    }
}

/// How many scores row `i` computes: `i + 1` rounded up to whole register blocks (at most
/// `t`); the scores past `i` are not used (nothing is summed over them, so a non-finite key
/// there changes nothing).
#[inline(always)]
fn padded(i: usize, t: usize) -> usize {
    ((i + 1).div_ceil(W) * W).min(t)
}

fn none(_: usize) -> Range<usize> {
    0..0
}

/// The rows `0..N` of `x` `[t, d]` times `mt` `[d, t]` (a transposed matrix) into `s` (rows of
/// `t`), the columns below `cols`.
#[inline(always)]
fn row_dots<const N: usize>(
    x: &[f32],
    mt: &[f32],
    (t, d): (usize, usize),
    cols: usize,
    s: &mut [f32],
) {
    let terms = Terms {
        pre: none,
        common: 0..d,
        post: none,
    };
    product::<N>(cols, &terms, |r, c| x[r * d + c], |c| &mt[c * t..], (s, t));
}

/// Softmax of row `i` (its scores `s[..=i]`, unscaled) in place, unnormalised: returns
/// `(1 / Σ, lse)`.
#[inline(always)]
fn softmax_row(s: &mut [f32], scale: f32) -> (f32, f32) {
    let mut max = f32::NEG_INFINITY;
    for sj in s.iter_mut() {
        *sj *= scale;
        // NaN scores are skipped here (as f64::max does in the reference) and come back
        // through exp below.
        max = if *sj > max { *sj } else { max };
    }
    for sj in s.iter_mut() {
        *sj = exp(*sj - max);
    }
    let sum = super::rows::sum2(s, s, |p, _| p);
    (1.0 / sum, max + sum.ln())
}

/// The forward of the `N` rows from `i0` (see [`fwd_body`]); `kt` is `k` transposed.
#[inline(always)]
fn fwd_rows<const N: usize>(
    i0: usize,
    (q, kt, v): (&[f32], &[f32], &[f32]),
    (out, lse): (&mut [f32], &mut [f32]),
    (t, d, scale): (usize, usize, f32),
    s: &mut [f32],
    drop: Option<SeqDrop>,
) {
    row_dots::<N>(&q[i0 * d..], kt, (t, d), padded(i0 + N - 1, t), s);
    let mut inv = [0.0f32; N];
    for (r, inv_r) in inv.iter_mut().enumerate() {
        let i = i0 + r;
        (*inv_r, lse[i]) = softmax_row(&mut s[r * t..=r * t + i], scale);
        // Dropout after the softmax's sum: P·V takes the masked, rescaled probabilities.
        if let Some(dr) = drop {
            for (j, sj) in s[r * t..=r * t + i].iter_mut().enumerate() {
                *sj *= dr.factor_f32(i, j, t);
            }
        }
    }
    let s = &*s;
    let pv = Terms {
        pre: none,
        common: 0..i0 + 1,
        post: |r: usize| i0 + 1..i0 + r + 1,
    };
    let o = &mut out[i0 * d..(i0 + N) * d];
    product::<N>(d, &pv, |r, j| s[r * t + j], |j| &v[j * d..], (&mut *o, d));
    for (orow, &inv_r) in o.chunks_exact_mut(d).zip(&inv) {
        for oc in orow {
            *oc *= inv_r;
        }
    }
}

/// Forward of one sequence: `qkv` holds `q`, `k`, `v` and `outs` `out` (`[t, d]` each) and
/// `lse` (`[t]`); `scratch` holds at least [`fwd_scratch`] floats; `drop`: the attention
/// dropout (the formulas of the f64 reference `cpu::attention::fwd_seq_f64`).
#[inline(always)]
fn fwd_body(
    (q, k, v): (&[f32], &[f32], &[f32]),
    (out, lse): (&mut [f32], &mut [f32]),
    dims: (usize, usize, f32),
    scratch: &mut [f32],
    drop: Option<SeqDrop>,
) {
    let (t, d, _) = dims;
    let (kt, s) = scratch.split_at_mut(t * d);
    transpose(k, kt, t, d);
    let mut i0 = 0;
    while i0 + R <= t {
        fwd_rows::<R>(i0, (q, kt, v), (&mut *out, &mut *lse), dims, s, drop);
        i0 += R;
    }
    for i in i0..t {
        fwd_rows::<1>(i, (q, kt, v), (&mut *out, &mut *lse), dims, s, drop);
    }
}

/// Step 1 of the backward for the `N` rows from `i0`: their rows of `P` (in `pm`) and
/// `dS·scale` (in `dsm`), and `dq`.
#[inline(always)]
fn bwd_rows<const N: usize>(
    i0: usize,
    x: SeqIn<'_>,
    (kt, vt): (&[f32], &[f32]),
    dq: &mut [f32],
    (t, d, scale): (usize, usize, f32),
    (pm, dsm): (&mut [f32], &mut [f32]),
    drop: Option<SeqDrop>,
) {
    let (q, k, _, out, lse, dout) = x;
    let w = padded(i0 + N - 1, t);
    row_dots::<N>(&q[i0 * d..], kt, (t, d), w, &mut pm[i0 * t..]);
    row_dots::<N>(&dout[i0 * d..], vt, (t, d), w, &mut dsm[i0 * t..]);
    for i in i0..i0 + N {
        let row = i * d..(i + 1) * d;
        let delta = super::rows::sum2(&dout[row.clone()], &out[row], |a, b| a * b);
        let (p, ds) = (&mut pm[i * t..=i * t + i], &mut dsm[i * t..=i * t + i]);
        match drop {
            None => {
                for (pj, dsj) in p.iter_mut().zip(ds.iter_mut()) {
                    *pj = exp(scale * *pj - lse[i]);
                    // dS·scale, the factor of both dq and dk.
                    *dsj = scale * (*pj * (*dsj - delta));
                }
            }
            // dP = f·dout_i·v_j; pm keeps the dropped P·f, the factor of dout in dv.
            Some(dr) => {
                for (j, (pj, dsj)) in p.iter_mut().zip(ds.iter_mut()).enumerate() {
                    let f = dr.factor_f32(i, j, t);
                    *pj = exp(scale * *pj - lse[i]);
                    *dsj = scale * (*pj * (*dsj * f - delta));
                    *pj *= f;
                }
            }
        }
    }
    let dsm = &*dsm;
    let terms = Terms {
        pre: none,
        common: 0..i0 + 1,
        post: |r: usize| i0 + 1..i0 + r + 1,
    };
    let a = |r: usize, j: usize| dsm[(i0 + r) * t + j];
    product::<N>(d, &terms, a, |j| &k[j * d..], (&mut dq[i0 * d..], d));
}

/// Step 2 of the backward for the `N` rows of `dk`, `dv` from `j0`: `dv_j = Σ_{i≥j} P_ij dO_i`,
/// `dk_j = Σ_{i≥j} dS_ij q_i`, each in increasing `i`.
#[inline(always)]
fn bwd_cols<const N: usize>(
    j0: usize,
    (q, dout): (&[f32], &[f32]),
    (dk, dv): (&mut [f32], &mut [f32]),
    (t, d): (usize, usize),
    (pm, dsm): (&[f32], &[f32]),
) {
    let terms = Terms {
        pre: |r: usize| j0 + r..j0 + N - 1,
        common: j0 + N - 1..t,
        post: none,
    };
    let (rows, out) = (|i: usize| &dout[i * d..], (&mut dv[j0 * d..], d));
    product::<N>(d, &terms, |r, i| pm[i * t + j0 + r], rows, out);
    let (rows, out) = (|i: usize| &q[i * d..], (&mut dk[j0 * d..], d));
    product::<N>(d, &terms, |r, i| dsm[i * t + j0 + r], rows, out);
}

/// Backward of one sequence (the formulas of `AttentionOps::causal_attention_bwd`): `dq`, `dk`,
/// `dv` are overwritten; `scratch` holds at least [`bwd_scratch`] floats. First each row `i`
/// of `P` and `dS·scale` and `dq_i`; then each `dk_j`, `dv_j` from column `j` of those.
#[inline(always)]
fn bwd_body(
    x: SeqIn<'_>,
    grads: (&mut [f32], &mut [f32], &mut [f32]),
    dims: (usize, usize, f32),
    scratch: &mut [f32],
    drop: Option<SeqDrop>,
) {
    let (q, k, v, _, _, dout) = x;
    let (dq, dk, dv) = grads;
    let (t, d, _) = dims;
    let (kt, rest) = scratch.split_at_mut(t * d);
    let (vt, rest) = rest.split_at_mut(t * d);
    let (pm, rest) = rest.split_at_mut(t * t);
    let dsm = &mut rest[..t * t];
    transpose(k, kt, t, d);
    transpose(v, vt, t, d);
    let mut i0 = 0;
    while i0 + R <= t {
        bwd_rows::<R>(i0, x, (kt, vt), dq, dims, (pm, dsm), drop);
        i0 += R;
    }
    for i in i0..t {
        bwd_rows::<1>(i, x, (kt, vt), dq, dims, (pm, dsm), drop);
    }
    let (pm, dsm) = (&*pm, &*dsm);
    let mut j0 = 0;
    while j0 + R <= t {
        bwd_cols::<R>(j0, (q, dout), (dk, dv), (t, d), (pm, dsm));
        j0 += R;
    }
    for j in j0..t {
        bwd_cols::<1>(j, (q, dout), (dk, dv), (t, d), (pm, dsm));
    }
}

multiversion!(
    /// Causal attention forward of one sequence (see [`fwd_body`]).
    pub(crate) fn fwd_seq(
        qkv: (&[f32], &[f32], &[f32]),
        outs: (&mut [f32], &mut [f32]),
        dims: (usize, usize, f32),
        scratch: &mut [f32],
        drop: Option<SeqDrop>,
    ) => fwd_body
);

multiversion!(
    /// Causal attention backward of one sequence (see [`bwd_body`]).
    pub(crate) fn bwd_seq(
        x: SeqIn<'_>,
        grads: (&mut [f32], &mut [f32], &mut [f32]),
        dims: (usize, usize, f32),
        scratch: &mut [f32],
        drop: Option<SeqDrop>,
    ) => bwd_body
);
