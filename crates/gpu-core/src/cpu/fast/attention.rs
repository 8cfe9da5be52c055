//! Causal attention of one sequence in f32 (the fast mode's kernel; the formulas are those of
//! the f64 reference in `cpu/attention.rs`). The keys and values are transposed once per
//! sequence so that a row of scores `q_i·k_j` (j <= i) is a vector loop over `j`, and each
//! output row `Σ_j p_j v_j` a vector loop over the head width; every sum runs in a fixed order.

use super::math::exp;
use super::multiversion;

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

/// Outputs that one register block accumulates.
const B: usize = 16;

/// `Σ_i f(i)·row(i)[..B]` over `range` in four register chains (`i − start ≡ 0, 1, 2, 3 mod 4`,
/// each in order, a tail of fewer than four rows going to the first chains), combined as
/// `(c0 + c1) + (c2 + c3)`: four independent chains hide the latency of the adds.
#[inline(always)]
fn sum4<'x>(
    range: std::ops::Range<usize>,
    f: impl Fn(usize) -> f32,
    row: impl Fn(usize) -> &'x [f32],
    out: &mut [f32],
) {
    let (mut c0, mut c1, mut c2, mut c3) = ([0.0f32; B], [0.0f32; B], [0.0f32; B], [0.0f32; B]);
    let (start, len) = (range.start, range.len());
    for q in 0..len / 4 {
        let i = start + 4 * q;
        let (f0, f1, f2, f3) = (f(i), f(i + 1), f(i + 2), f(i + 3));
        let (r0, r1) = (&row(i)[..B], &row(i + 1)[..B]);
        let (r2, r3) = (&row(i + 2)[..B], &row(i + 3)[..B]);
        for l in 0..B {
            c0[l] += f0 * r0[l];
            c1[l] += f1 * r1[l];
            c2[l] += f2 * r2[l];
            c3[l] += f3 * r3[l];
        }
    }
    let tail = start + len / 4 * 4;
    for (k, i) in (tail..range.end).enumerate() {
        let (fi, r) = (f(i), &row(i)[..B]);
        let c = match k {
            0 => &mut c0,
            1 => &mut c1,
            _ => &mut c2,
        };
        for l in 0..B {
            c[l] += fi * r[l];
        }
    }
    for (l, o) in out[..B].iter_mut().enumerate() {
        *o = (c0[l] + c1[l]) + (c2[l] + c3[l]);
    }
}

/// As [`sum4`] for a block of `n < B` outputs, in one chain.
#[inline(always)]
fn sum1<'x>(
    range: std::ops::Range<usize>,
    f: impl Fn(usize) -> f32,
    row: impl Fn(usize) -> &'x [f32],
    out: &mut [f32],
) {
    out.fill(0.0);
    let n = out.len();
    for i in range {
        let fi = f(i);
        for (o, &r) in out.iter_mut().zip(&row(i)[..n]) {
            *o += fi * r;
        }
    }
}

/// How many scores row `i` computes: `i + 1` rounded up to whole register blocks (at most
/// `t`), so that every block takes the four-chain path; the scores past `i` are not used
/// (nothing is summed over them, so a non-finite key there changes nothing).
#[inline(always)]
fn padded(i: usize, t: usize) -> usize {
    ((i + 1).div_ceil(B) * B).min(t)
}

/// `s[j] = Σ_c a[c]·mt[c·t + j]` for `j < s.len()`, 16 outputs at a time held in registers.
#[inline(always)]
fn row_dots(a: &[f32], mt: &[f32], t: usize, s: &mut [f32]) {
    for (jb, sb) in s.chunks_mut(B).enumerate() {
        let j0 = jb * B;
        if sb.len() == B {
            sum4(0..a.len(), |c| a[c], |c| &mt[c * t + j0..], sb);
        } else {
            sum1(0..a.len(), |c| a[c], |c| &mt[c * t + j0..], sb);
        }
    }
}

/// `o[c] = Σ_j w(j)·x[j·d + c]` over the rows `j` in `rows`, 16 outputs at a time held in
/// registers.
#[inline(always)]
fn weighted_rows(
    o: &mut [f32],
    rows: std::ops::Range<usize>,
    w: impl Fn(usize) -> f32,
    x: &[f32],
    d: usize,
) {
    for (cb, ob) in o.chunks_mut(B).enumerate() {
        let c0 = cb * B;
        if ob.len() == B {
            sum4(rows.clone(), &w, |j| &x[j * d + c0..], ob);
        } else {
            sum1(rows.clone(), &w, |j| &x[j * d + c0..], ob);
        }
    }
}

/// Forward of one sequence: `q`, `k`, `v`, `out` are `[t, d]`, `lse` is `[t]`; `scratch` holds
/// at least `t·d + t` floats.
#[inline(always)]
fn fwd_body(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
    lse: &mut [f32],
    dims: (usize, usize, f32),
    scratch: &mut [f32],
) {
    let (t, d, scale) = dims;
    let (kt, s) = scratch.split_at_mut(t * d);
    transpose(k, kt, t, d);
    for i in 0..t {
        row_dots(&q[i * d..(i + 1) * d], kt, t, &mut s[..padded(i, t)]);
        let s = &mut s[..=i];
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
        let o = &mut out[i * d..(i + 1) * d];
        weighted_rows(o, 0..i + 1, |j| s[j], v, d);
        let inv = 1.0 / sum;
        for oc in o.iter_mut() {
            *oc *= inv;
        }
        lse[i] = max + sum.ln();
    }
}

/// Backward of one sequence (the formulas of `AttentionOps::causal_attention_bwd`): `dq`, `dk`,
/// `dv` are overwritten; `scratch` holds at least `2·t·d + 2·t·t` floats. First each row `i`
/// of `P` and `dS·scale` and `dq_i`; then each `dk_j`, `dv_j` from column `j` of those.
#[inline(always)]
fn bwd_body(
    x: SeqIn<'_>,
    grads: (&mut [f32], &mut [f32], &mut [f32]),
    dims: (usize, usize, f32),
    scratch: &mut [f32],
) {
    let (q, k, v, out, lse, dout) = x;
    let (dq, dk, dv) = grads;
    let (t, d, scale) = dims;
    let (kt, rest) = scratch.split_at_mut(t * d);
    let (vt, rest) = rest.split_at_mut(t * d);
    let (pm, rest) = rest.split_at_mut(t * t);
    let dsm = &mut rest[..t * t];
    transpose(k, kt, t, d);
    transpose(v, vt, t, d);
    for i in 0..t {
        let row = i * d..(i + 1) * d;
        let (qi, doi) = (&q[row.clone()], &dout[row.clone()]);
        let delta = super::rows::sum2(doi, &out[row.clone()], |a, b| a * b);
        let w = padded(i, t);
        row_dots(qi, kt, t, &mut pm[i * t..i * t + w]);
        row_dots(doi, vt, t, &mut dsm[i * t..i * t + w]);
        let (p, ds) = (&mut pm[i * t..=i * t + i], &mut dsm[i * t..=i * t + i]);
        for (pj, dsj) in p.iter_mut().zip(ds.iter_mut()) {
            *pj = exp(scale * *pj - lse[i]);
            // dS·scale, the factor of both dq and dk.
            *dsj = scale * (*pj * (*dsj - delta));
        }
        let ds = &*ds;
        weighted_rows(&mut dq[row], 0..i + 1, |j| ds[j], k, d);
    }
    for j in 0..t {
        let row = j * d..(j + 1) * d;
        weighted_rows(&mut dv[row.clone()], j..t, |i| pm[i * t + j], dout, d);
        weighted_rows(&mut dk[row], j..t, |i| dsm[i * t + j], q, d);
    }
}

multiversion!(
    /// Causal attention forward of one sequence (see [`fwd_body`]).
    pub(crate) fn fwd_seq(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        out: &mut [f32],
        lse: &mut [f32],
        dims: (usize, usize, f32),
        scratch: &mut [f32],
    ) => fwd_body
);

multiversion!(
    /// Causal attention backward of one sequence (see [`bwd_body`]).
    pub(crate) fn bwd_seq(
        x: SeqIn<'_>,
        grads: (&mut [f32], &mut [f32], &mut [f32]),
        dims: (usize, usize, f32),
        scratch: &mut [f32],
    ) => bwd_body
);
