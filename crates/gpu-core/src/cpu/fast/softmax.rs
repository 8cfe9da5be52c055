//! Cross-entropy forward and backward of whole rows in f32 (the fast mode's kernels; the
//! formulas are the f64 reference's in `cpu/rows.rs`): the row's max, `Σ exp(x − max)` with the
//! polynomial [`exp`] summed over 16 lanes in a fixed order ([`sum2`]), and libm's `ln` once
//! per row. Every level computes the same bits.

use super::math::exp;
use super::multiversion;
use super::rows::sum2;

/// The max of a row. NaN entries are skipped (as `f64::max` does in the reference); they make
/// the sums below NaN, and a row of `-inf` gives a NaN sum, as the reference.
#[inline(always)]
fn row_max(x: &[f32]) -> f32 {
    let mut max = f32::NEG_INFINITY;
    for &v in x {
        max = if v > max { v } else { max };
    }
    max
}

/// `(max, Σ_c exp(x_c − max))` of a row.
#[inline(always)]
fn max_sumexp(x: &[f32]) -> (f32, f32) {
    let max = row_max(x);
    (max, sum2(x, x, |v, _| exp(v - max)))
}

/// `loss[r] = (max − x[r, t_r]) + ln Σ_c exp(x[r, c] − max)` for the rows of `cols` logits.
#[inline(always)]
fn cross_entropy_fwd_body(x: &[f32], targets: &[u32], loss: &mut [f32], cols: usize) {
    let rows = x.chunks_exact(cols).zip(targets).zip(loss.iter_mut());
    for ((xr, &t), l) in rows {
        let (max, sum) = max_sumexp(xr);
        *l = (max - xr[t as usize]) + sum.ln();
    }
}

/// `dx[r, c] = (exp(x[r, c] − max) / Σ − [c = t_r])·dloss[r]`.
#[inline(always)]
fn cross_entropy_bwd_body(x: &[f32], targets: &[u32], dloss: &[f32], dx: &mut [f32], cols: usize) {
    let rows = x.chunks_exact(cols).zip(dx.chunks_exact_mut(cols));
    for (((xr, dr), &t), &g) in rows.zip(targets).zip(dloss) {
        // The exponentials once, into dx; summed there in max_sumexp's order (the same bits).
        let max = row_max(xr);
        for (o, &v) in dr.iter_mut().zip(xr.iter()) {
            *o = exp(v - max);
        }
        let sum = sum2(dr, dr, |e, _| e);
        let t = t as usize;
        for (c, o) in dr.iter_mut().enumerate() {
            let one = if c == t { 1.0 } else { 0.0 };
            *o = (*o / sum - one) * g;
        }
    }
}

multiversion!(
    /// Cross-entropy forward of whole rows (see [`cross_entropy_fwd_body`]); every target
    /// must be `< cols`.
    pub(crate) fn cross_entropy_fwd(
        x: &[f32],
        targets: &[u32],
        loss: &mut [f32],
        cols: usize,
    ) => cross_entropy_fwd_body
);

multiversion!(
    /// Cross-entropy backward of whole rows (see [`cross_entropy_bwd_body`]); every target
    /// must be `< cols`.
    pub(crate) fn cross_entropy_bwd(
        x: &[f32],
        targets: &[u32],
        dloss: &[f32],
        dx: &mut [f32],
        cols: usize,
    ) => cross_entropy_bwd_body
);
