//! `W += U·diag(S)·Vᵀ` with an f32 GEMM, in place: the fast path of
//! [`crate::correct::apply_tiled`], taken when a norm bound proves that no sum can overflow.
//!
//! On CPUs with AVX-512 (the usual case), a kernel for this one shape (`k` small, `W` large
//! and updated in place):
//! - `U·diag(S)` is formed once per call (row-major; checked finite), `Vᵀ` packed into
//!   column panels of [`NC`] lanes, `k × NC` each (zero past `n`); the rows of `U·diag(S)`
//!   are read as scalar broadcasts;
//! - each `MR × NC` tile of the product is summed in 16 registers over `k`, then added to
//!   `W`'s values with one rounding each (`w + Σ_r (u·s)·v`, the sum rounded in f32), masked
//!   loads and stores for a partial last panel;
//! - `W` is walked one block of [`MR`] rows at a time, panel by panel: each row is read and
//!   written once, as a stream. Rows need only be contiguous (any row stride: a sub-block
//!   view is updated in place); a column-major `W` is handled as `Wᵀ += (V·diag(S))·Uᵀ`, and
//!   only a `W` with neither stride 1 goes through a copy of [`MR`] rows at a time;
//! - the packing and the rows are split in two halves on two threads.
//!
//! Elsewhere (or with `HYBRID_SIMD` capping the level) the engine's generic GEMM
//! ([`gpu_core::cpu::fast::packed::nn`], `Epi::Acc`) does the same sum.

use super::simd::{level, Level};
use crate::lowrank::HostLowRank;
use gpu_core::cpu::fast::packed::{nn, Epi, Packed, Region};
use ndarray::{Array2, ArrayViewMut2, Axis};

/// Rows of `W` per tile.
const MR: usize = 8;
/// Columns of `W` per tile (a panel of `B`): two AVX-512 registers.
const NC: usize = 32;

/// `w += (U·diag(S))·Vᵀ` with `u` `m × k`, `s` `[k]`, `v` `n × k` (already checked: shapes
/// match, `w` finite, and the sums bounded well inside the f32 range). Returns false, with
/// nothing written, when `U·diag(S)` itself overflows f32 (possible when `V`'s rows are
/// short: the norm bound covers the products and sums, not this factor).
pub(crate) fn add_low_rank(w: ArrayViewMut2<'_, f32>, c: &HostLowRank) -> bool {
    let (u, s, v) = (&c.u, &c.s, &c.v);
    // A column-major W (unit row stride): work on its transpose, whose rows are contiguous.
    let (w, a, b) = if w.strides()[1] != 1 && w.strides()[0] == 1 {
        (w.reversed_axes(), v, u)
    } else {
        (w, u, v)
    };
    let (a, s) = (a.as_standard_layout(), s.as_standard_layout());
    let (a, s) = (
        a.as_slice().expect("standard"),
        s.as_slice().expect("standard"),
    );
    let mut x = super::take_buffer();
    x.clear();
    x.resize(a.len(), 0.0);
    for (xr, ar) in x.chunks_exact_mut(s.len()).zip(a.chunks_exact(s.len())) {
        for ((x, &a), &s) in xr.iter_mut().zip(ar).zip(s) {
            *x = a * s;
        }
    }
    // The largest |x| as bits (a reduction that vectorizes): Inf and NaN sort above the rest.
    let finite = x.iter().fold(0, |m, v| m.max(v.to_bits() & 0x7fff_ffff)) < 0x7f80_0000;
    if finite && cfg!(target_arch = "x86_64") && level() == Level::Avx512 {
        run(w, &x, b);
    } else if finite {
        generic::rows_in_parallel(w, &x, &generic::transposed(b));
    }
    super::give_buffer(x);
    finite
}

/// `w += x·bᵀ` (`x` row-major, `b.ncols()` columns) with the AVX-512 kernel.
fn run(w: ArrayViewMut2<'_, f32>, x: &[f32], b: &Array2<f32>) {
    let (m, n) = w.dim();
    let k = b.ncols();
    let b = b.as_standard_layout();
    let b = b.as_slice().expect("standard layout");
    let panels = n.div_ceil(NC);
    let mut bp = super::take_buffer();
    bp.clear();
    bp.resize(panels * k * NC, 0.0);
    if m >= 4 * MR && rayon::current_num_threads() > 1 {
        // Halves on whole panels and whole blocks of rows.
        let (b0, b1) = bp.split_at_mut(panels.div_ceil(2) * k * NC);
        rayon::join(|| pack(b0, b, k, 0), || pack(b1, b, k, panels.div_ceil(2)));
        let mid = m.div_ceil(MR).div_ceil(2) * MR;
        let (top, bottom) = w.split_at(Axis(0), mid);
        let (x0, x1) = x.split_at(mid * k);
        rayon::join(|| rows(top, x0, &bp, k), || rows(bottom, x1, &bp, k));
    } else {
        pack(&mut bp, b, k, 0);
        rows(w, x, &bp, k);
    }
    super::give_buffer(bp);
}

/// Packs panels `q0..` of `bᵀ` into `out`, `k × NC` each: `out[p·NC + j] =
/// b[(q0 + q)·NC + j][p]`, zero past `b`'s rows (`b` row-major, `k` columns).
fn pack(out: &mut [f32], b: &[f32], k: usize, q0: usize) {
    for (q, panel) in out.chunks_exact_mut(k * NC).enumerate() {
        let rows = b.chunks_exact(k).skip((q0 + q) * NC).take(NC);
        for (j, row) in rows.enumerate() {
            for (p, &x) in row.iter().enumerate() {
                panel[p * NC + j] = x;
            }
        }
    }
}

/// `w += a·B` (`a` row-major, `k` columns; `bp` packed) on one thread: in place when `w`'s
/// rows are contiguous, else through a copy of [`MR`] rows at a time.
fn rows(mut w: ArrayViewMut2<'_, f32>, a: &[f32], bp: &[f32], k: usize) {
    let (m, n) = w.dim();
    let in_place = w.strides()[1] == 1 || n <= 1;
    let blocks = w.axis_chunks_iter_mut(Axis(0), MR).zip(a.chunks(MR * k));
    if in_place {
        blocks.for_each(|(block, a)| block_rows(block, a, bp, k));
        return;
    }
    let mut buf = Array2::<f32>::zeros((MR.min(m), n));
    for (mut block, a) in blocks {
        let mut tmp = buf.slice_mut(ndarray::s![..block.nrows(), ..]);
        tmp.assign(&block);
        block_rows(tmp.view_mut(), a, bp, k);
        block.assign(&tmp);
    }
}

/// One block of at most [`MR`] rows (each contiguous; `a` their rows of `U`) against every
/// panel.
fn block_rows(mut block: ArrayViewMut2<'_, f32>, a: &[f32], bp: &[f32], k: usize) {
    let (r, n) = block.dim();
    assert!(r <= MR && a.len() == r * k && bp.len() == n.div_ceil(NC) * k * NC);
    let mut out: [&mut [f32]; MR] = Default::default();
    for (o, row) in out.iter_mut().zip(block.rows_mut()) {
        *o = row.into_slice().expect("rows with unit stride");
    }
    // A partial block repeats its last row of `U` (the extra sums are not stored).
    let x: [&[f32]; MR] = std::array::from_fn(|i| &a[i.min(r - 1) * k..][..k]);
    for (q, b) in bp.chunks_exact(k * NC).enumerate() {
        let c0 = q * NC;
        let cols = NC.min(n - c0);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `add_low_rank` calls `run` only when `level()` is Avx512, i.e. after
        // `is_x86_feature_detected!` found avx512f. The slices' lengths are as `tile`
        // requires: `x` rows of `k`, `b` `k × NC`, rows of `out` empty or `n >= c0 + cols`
        // long (all `n`: one block of `W`).
        unsafe {
            avx512::tile(&x, b, &mut out, c0, cols);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{MR, NC};
    use std::arch::x86_64::*;

    /// `out[i][c0 + j] += Σ_p x[i][p]·b[p·NC + j]` for `j < cols` and the non-empty rows of
    /// `out`: the `MR × NC` sums in 16 registers, then one masked read and write of `out`.
    ///
    /// # Safety
    /// The CPU must have avx512f; every `x[i]` has `k = b.len() / NC` values; `cols <= NC`;
    /// each row of `out` is empty or at least `c0 + cols` long.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile(
        x: &[&[f32]; MR],
        b: &[f32],
        out: &mut [&mut [f32]; MR],
        c0: usize,
        cols: usize,
    ) {
        let k = b.len() / NC;
        let xp: [*const f32; MR] = std::array::from_fn(|i| x[i].as_ptr());
        let bp = b.as_ptr();
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        for p in 0..k {
            // SAFETY: p < k: `b` holds k·NC values and each `x[i]` k values (the contract).
            let (b0, b1) = unsafe {
                (
                    _mm512_loadu_ps(bp.add(p * NC)),
                    _mm512_loadu_ps(bp.add(p * NC + 16)),
                )
            };
            for i in 0..MR {
                // SAFETY: as above.
                let xi = _mm512_set1_ps(unsafe { *xp[i].add(p) });
                acc[i][0] = _mm512_fmadd_ps(xi, b0, acc[i][0]);
                acc[i][1] = _mm512_fmadd_ps(xi, b1, acc[i][1]);
            }
        }
        for (row, sums) in out.iter_mut().zip(&acc) {
            if row.is_empty() {
                continue;
            }
            for (h, &sum) in sums.iter().enumerate() {
                let lanes = cols.saturating_sub(16 * h).min(16);
                if lanes == 0 {
                    continue;
                }
                let mask = (u32::MAX >> (32 - lanes)) as __mmask16;
                // SAFETY: `row` is at least c0 + cols long (the contract) and the mask
                // covers only columns c0 + 16h + l < c0 + cols; masked-off lanes are neither
                // read nor written.
                unsafe {
                    let dst = row.as_mut_ptr().add(c0 + 16 * h);
                    let w = _mm512_maskz_loadu_ps(mask, dst);
                    _mm512_mask_storeu_ps(dst, mask, _mm512_add_ps(w, sum));
                }
            }
        }
    }
}

/// The path on CPUs without AVX-512: the engine's GEMM with `Epi::Acc`.
mod generic {
    use super::*;

    /// Rows of `W` per block.
    const ROWS: usize = 32;

    /// `aᵀ` (`k × rows`) packed as the right-hand matrix of the GEMM.
    pub(super) fn transposed(a: &Array2<f32>) -> Packed<f32> {
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

    /// `w += x·W` (`x` row-major `rows × k`), the rows split over two threads when there
    /// are enough of them.
    pub(super) fn rows_in_parallel(w: ArrayViewMut2<'_, f32>, x: &[f32], wt: &Packed<f32>) {
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

    /// `w += x·W` on one thread: straight into `w` when it is one contiguous row-major
    /// block, else through a buffer of [`ROWS`] rows.
    fn rows(mut w: ArrayViewMut2<'_, f32>, x: &[f32], wt: &Packed<f32>) {
        let (m, n, k) = (w.nrows(), w.ncols(), wt.k());
        if let Some(out) = w.as_slice_mut() {
            nn(x, k, m, wt, out, n, Epi::Acc);
            return;
        }
        let mut buf = Array2::<f32>::zeros((ROWS.min(m), n));
        for (b, mut block) in w.axis_chunks_iter_mut(Axis(0), ROWS).enumerate() {
            let mut tmp = buf.slice_mut(ndarray::s![..block.nrows(), ..]);
            tmp.assign(&block);
            let out = tmp.as_slice_mut().expect("a standard-layout buffer");
            nn(&x[b * ROWS * k..], k, block.nrows(), wt, out, n, Epi::Acc);
            block.assign(&tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array1;

    fn lr(m: usize, n: usize, k: usize) -> HostLowRank {
        let f = |i: usize, j: usize, q: usize| (((i * q + j * 7 + 3) % 17) as f32 - 8.0) / 8.0;
        HostLowRank {
            u: Array2::from_shape_fn((m, k), |(i, j)| f(i, j, 5)),
            s: Array1::from_shape_fn(k, |i| 1.0 + i as f32),
            v: Array2::from_shape_fn((n, k), |(i, j)| f(i, j, 3)),
        }
    }

    #[test]
    fn every_layout_and_odd_shape_matches_the_dense_sum() {
        for (m, n, k) in [
            (1, 1, 1),
            (7, 33, 3),
            (70, 65, 5),
            (257, 31, 2),
            (9, 200, 32),
        ] {
            let c = lr(m, n, k);
            let w0 = Array2::from_shape_fn((m, n), |(i, j)| ((i + 2 * j) % 5) as f32);
            let want = &w0 + &c.to_dense();
            let check = |got: &Array2<f32>| {
                let e = (got - &want).iter().fold(0.0f32, |a, x| a.max(x.abs()));
                assert!(e < 1e-4, "{m}x{n} rank {k}: {e}");
            };
            let mut w = w0.clone();
            assert!(add_low_rank(w.view_mut(), &c));
            check(&w);
            let mut t = w0.t().to_owned();
            assert!(add_low_rank(t.view_mut().reversed_axes(), &c));
            check(&t.t().to_owned());
            // Neither stride 1: every other column of a wider array.
            let mut wide = Array2::<f32>::zeros((m, 2 * n));
            wide.slice_mut(ndarray::s![.., ..;2]).assign(&w0);
            assert!(add_low_rank(wide.slice_mut(ndarray::s![.., ..;2]), &c));
            check(&wide.slice(ndarray::s![.., ..;2]).to_owned());
            assert!(wide.slice(ndarray::s![.., 1..;2]).iter().all(|&x| x == 0.0));
        }
    }

    #[test]
    fn an_overflowing_u_times_s_is_left_to_the_exact_path() {
        // ‖U·diag(S)‖·‖V‖ = 1e20 passes the norm bound, but u·s = 1e60 is not an f32.
        let (m, n) = (40, 3);
        let u = Array2::from_elem((m, 1), 1e30f32);
        let (s, v) = (
            Array1::from_elem(1, 1e30f32),
            Array2::from_elem((n, 1), 1e-40f32),
        );
        let host = HostLowRank {
            u: u.clone(),
            s: s.clone(),
            v: v.clone(),
        };
        let mut w = Array2::<f32>::ones((m, n));
        assert!(!add_low_rank(w.view_mut(), &host));
        assert!(w.iter().all(|&x| x == 1.0));
        let c = crate::LowRank::new(u, s, v).unwrap();
        crate::correct::apply_tiled(w.view_mut(), &c, 64).unwrap();
        let big = f64::from(1e30f32);
        let want = (1.0 + big * big * f64::from(1e-40f32)) as f32;
        assert!(w.iter().all(|&x| x == want), "{w:?} vs {want}");
    }
}
