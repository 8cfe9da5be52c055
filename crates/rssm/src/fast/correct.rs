//! `W += (U·diag(S))·Vᵀ` with the f32 GEMM, in place: the fast path of
//! [`crate::correct::apply_tiled`], taken when a norm bound proves that no sum can overflow.
//!
//! The product is accumulated onto `W` in registers (`Epi::Acc`: the accumulators start from
//! `W`'s values), so it never exists beyond one register tile and `W` is read and written
//! once. A row-major contiguous `W` is updated in place; any other strides go through a
//! buffer of [`ROWS`] rows; a column-major `W` is handled as `Wᵀ += (V·diag(S))·Uᵀ`. Two
//! halves of the rows run on two threads.

use super::gemm::{nn_f32, Epi, Packed, Region};
use crate::lowrank::HostLowRank;
use ndarray::{Array1, Array2, ArrayViewMut2, Axis};

/// Rows of `W` per block.
const ROWS: usize = 32;

/// `w += (U·diag(S))·Vᵀ` with `u` `m × k`, `s` `[k]`, `v` `n × k` (already checked: shapes
/// match, `w` finite, and the sums bounded well inside the f32 range).
pub(crate) fn add_low_rank(w: ArrayViewMut2<'_, f32>, c: &HostLowRank) {
    let (u, s, v) = (&c.u, &c.s, &c.v);
    // Column-major (or column-contiguous) W: work on its transpose, whose rows are contiguous.
    if w.strides()[0] == 1 && w.strides()[1] != 1 && w.ncols() > 1 {
        rows_in_parallel(w.reversed_axes(), &scaled(v, s), &transposed(u));
    } else {
        rows_in_parallel(w, &scaled(u, s), &transposed(v));
    }
}

/// `a·diag(s)`, row-major.
fn scaled(a: &Array2<f32>, s: &Array1<f32>) -> Vec<f32> {
    let mut out = Vec::with_capacity(a.len());
    for row in a.rows() {
        out.extend(row.iter().zip(s).map(|(&x, &y)| x * y));
    }
    out
}

/// `aᵀ` (`k × rows`) packed as the right-hand matrix of the GEMM.
fn transposed(a: &Array2<f32>) -> Packed<f32> {
    let (rows, k) = a.dim();
    let region = Region {
        cols: rows,
        k: 0..k,
    };
    match a.as_slice() {
        Some(x) => Packed::new(k, &[region], |p, j| x[j * k + p], |_| 0.0),
        None => Packed::new(k, &[region], |p, j| a[(j, p)], |_| 0.0),
    }
}

/// `w += x·W` (`x` row-major `rows × k`), the rows split over two threads when there are
/// enough of them.
fn rows_in_parallel(w: ArrayViewMut2<'_, f32>, x: &[f32], wt: &Packed<f32>) {
    let m = w.nrows();
    if m >= 4 * ROWS && rayon::current_num_threads() > 1 {
        let mid = (m / 2).div_ceil(ROWS) * ROWS;
        let (top, bottom) = w.split_at(Axis(0), mid);
        let (xt, xb) = x.split_at(mid * wt.k());
        rayon::join(|| rows(top, xt, wt), || rows(bottom, xb, wt));
    } else {
        rows(w, x, wt);
    }
}

/// `w += x·W` on one thread: straight into `w` when it is one contiguous row-major block, else
/// through a buffer of [`ROWS`] rows.
fn rows(mut w: ArrayViewMut2<'_, f32>, x: &[f32], wt: &Packed<f32>) {
    let (m, n, k) = (w.nrows(), w.ncols(), wt.k());
    if let Some(out) = w.as_slice_mut() {
        nn_f32(x, k, m, wt, out, n, Epi::Acc);
        return;
    }
    let mut buf = vec![0.0f32; ROWS.min(m) * n];
    for (b, mut block) in w.axis_chunks_iter_mut(Axis(0), ROWS).enumerate() {
        let r = block.nrows();
        for (row, dst) in block.rows().into_iter().zip(buf.chunks_mut(n)) {
            match row.as_slice() {
                Some(src) => dst.copy_from_slice(src),
                None => dst.iter_mut().zip(row).for_each(|(d, &s)| *d = s),
            }
        }
        let xb = &x[b * ROWS * k..(b * ROWS + r) * k];
        nn_f32(xb, k, r, wt, &mut buf, n, Epi::Acc);
        for (mut row, src) in block.rows_mut().into_iter().zip(buf.chunks(n)) {
            match row.as_slice_mut() {
                Some(dst) => dst.copy_from_slice(src),
                None => row.iter_mut().zip(src).for_each(|(d, &s)| *d = s),
            }
        }
    }
}
