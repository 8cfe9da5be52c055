//! `W += U·diag(S)·Vᵀ` in place, one tile of the product at a time: the CPU path of the
//! accelerator's `apply_corrections`.

use crate::error::AcceleratorError;
use crate::lowrank::{HostLowRank, LowRank};
use nalgebra::DMatrix;
use ndarray::ArrayViewMut2;

/// The side of the square tiles [`apply_tiled`] uses by default.
pub const TILE: usize = 64;

const ENTRY: &str = "apply_corrections";

/// Adds `c = U·diag(S)·Vᵀ` to `w` in place, without ever holding more than one tile of the
/// product.
///
/// When the norm bound below proves that no partial sum can leave the f32 range (always, but
/// for weights or factors near `f32::MAX`), the fast path runs: the f32 GEMM of
/// [`crate::fast`] accumulates `(U·diag(S))·Vᵀ` onto `w` one register tile at a time (the
/// sums are rounded in f32: a few ulps of `|w| + Σ_r |u·s·v|`). Otherwise the exact path runs:
/// one `tile × tile` block at a time (a block of `U·diag(S)`'s rows times a block of `V`'s
/// rows, accumulated in f64 and added to `w`'s f32 values with one rounding), after a dry run
/// that checks every sum.
///
/// Errors, before `w` is touched: shapes that disagree (`w` must be `m × n` for factors of
/// `(m, n)`), a zero tile, NaN or Inf in `w` (the sum would silently be NaN), a sum that
/// overflows f32.
pub fn apply_tiled(
    w: ArrayViewMut2<'_, f32>,
    c: &LowRank,
    tile: usize,
) -> Result<(), AcceleratorError> {
    let large = w.len() >= 1 << 16;
    let run = move || {
        let mut w = w;
        let safe = check(&w, c, tile)?;
        let c = c.host()?;
        if safe && crate::fast::add_low_rank(w.view_mut(), &c) {
            return Ok(());
        }
        exact(w, &c, tile, true)
    };
    if !large || rayon::current_thread_index().is_some() {
        return run();
    }
    // A large `w` is scanned and updated in halves on two threads (`rayon::join`, twice).
    // Run from outside rayon's pool, each join would hand its work to the pool and sleep
    // until it is done; run inside the pool (a scope's body runs on a worker), the joins
    // share it between two workers awake: one hand-over per call instead of one per join.
    let mut out = Ok(());
    rayon::scope(|_| out = run());
    out
}

/// [`apply_tiled`] always on the exact f64 path (the reference engine's).
pub(crate) fn apply_tiled_exact(
    w: ArrayViewMut2<'_, f32>,
    c: &LowRank,
    tile: usize,
) -> Result<(), AcceleratorError> {
    let safe = check(&w, c, tile)?;
    exact(w, &c.host()?, tile, !safe)
}

/// The checks of [`apply_tiled`]; `Ok(true)` when no sum can overflow f32.
fn check(w: &ArrayViewMut2<'_, f32>, c: &LowRank, tile: usize) -> Result<bool, AcceleratorError> {
    let (m, n) = c.shape();
    if w.dim() != (m, n) {
        return Err(AcceleratorError::Shape {
            entry: ENTRY,
            what: "weights",
            expected: format!("[{m}, {n}] (the correction's shape)"),
            got: w.shape().to_vec(),
        });
    }
    if tile == 0 {
        return Err(AcceleratorError::InvalidArgument {
            entry: ENTRY,
            reason: "the tile size must be positive".into(),
        });
    }
    let max_bits = max_abs_bits(w);
    if max_bits >= 0x7f80_0000 {
        return Err(AcceleratorError::NonFinite {
            entry: ENTRY,
            what: "the weights",
        });
    }
    // Cauchy–Schwarz: every partial sum of wᵢⱼ + Σ_r uᵢᵣ·sᵣ·vⱼᵣ is at most
    // |wᵢⱼ| + ‖(U·diag(S))ᵢ‖·‖Vⱼ‖. Below half of f32::MAX, rounding (a factor
    // (1 + 2⁻²⁴)^(k+1)) cannot reach f32::MAX: nothing overflows. The factors' part is
    // `LowRank::entry_bound`, computed once per correction and cached: for CPU factors the
    // same f64 sums of squares as ever (f32 values squared fit f64); for factors on a GPU the
    // device reduction, within a relative k·2⁻²⁴ of them, which the factor 2 absorbs.
    let bound = c.entry_bound()? + f64::from(f32::from_bits(max_bits));
    Ok(bound < f64::from(f32::MAX) / 2.0)
}

/// The largest `|wᵢⱼ|` as bits (`>= 0x7f80_0000` when `w` holds NaN or Inf): one read of
/// `w` (in two halves on two threads when `w` is one block of memory of 64 Ki values or more).
fn max_abs_bits(w: &ArrayViewMut2<'_, f32>) -> u32 {
    match w.as_slice_memory_order() {
        Some(x) => crate::fast::max_abs_bits(x),
        None => w.rows().into_iter().fold(0, |a, r| match r.as_slice() {
            Some(x) => a.max(crate::fast::max_abs_bits(x)),
            None => r.iter().fold(a, |a, x| a.max(x.to_bits() & 0x7fff_ffff)),
        }),
    }
}

/// The exact path: the tiles written, after a dry run that checks every sum when `dry`.
fn exact(
    mut w: ArrayViewMut2<'_, f32>,
    c: &HostLowRank,
    tile: usize,
    dry: bool,
) -> Result<(), AcceleratorError> {
    if dry {
        tiles(&mut w, c, tile, false)?;
    }
    tiles(&mut w, c, tile, true)
}

/// Forms the product tile by tile; adds each tile to `w` when `write`, else only checks that
/// every sum is finite in f32.
fn tiles(
    w: &mut ArrayViewMut2<'_, f32>,
    c: &HostLowRank,
    tile: usize,
    write: bool,
) -> Result<(), AcceleratorError> {
    let (m, n) = c.shape();
    let k = c.rank();
    let (u, s, v) = (&c.u, &c.s, &c.v);
    let mut block = DMatrix::<f64>::zeros(tile.min(m), tile.min(n));
    for r0 in (0..m).step_by(tile) {
        let rows = tile.min(m - r0);
        // This row block of U·diag(S): rows × k.
        let us = DMatrix::from_fn(rows, k, |i, r| f64::from(u[(r0 + i, r)]) * f64::from(s[r]));
        for c0 in (0..n).step_by(tile) {
            let cols = tile.min(n - c0);
            let vb = DMatrix::from_fn(cols, k, |j, r| f64::from(v[(c0 + j, r)]));
            let mut t = block.view_mut((0, 0), (rows, cols));
            t.gemm(1.0, &us, &vb.transpose(), 0.0);
            for i in 0..rows {
                for j in 0..cols {
                    let x = &mut w[(r0 + i, c0 + j)];
                    let sum = (f64::from(*x) + t[(i, j)]) as f32;
                    if !sum.is_finite() {
                        return Err(AcceleratorError::NonFinite {
                            entry: ENTRY,
                            what: "the corrected weights (the sum overflows f32)",
                        });
                    }
                    if write {
                        *x = sum;
                    }
                }
            }
        }
    }
    Ok(())
}
