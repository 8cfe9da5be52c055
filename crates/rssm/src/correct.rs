//! `W += U·diag(S)·Vᵀ` in place, one tile of the product at a time: the CPU path of the
//! accelerator's `apply_corrections`.

use crate::error::AcceleratorError;
use crate::lowrank::{HostLowRank, LowRank};
use nalgebra::DMatrix;
use ndarray::ArrayViewMut2;

/// The side of the square tiles [`apply_tiled`] uses by default.
pub const TILE: usize = 64;

const ENTRY: &str = "apply_corrections";

/// Adds `c = U·diag(S)·Vᵀ` to `w` in place. The product is formed one `tile × tile` block at a
/// time (a block of `U·diag(S)`'s rows times a block of `V`'s rows, accumulated in f64 and
/// added to `w`'s f32 values with one rounding), so at most one tile of it exists at once.
///
/// Errors, before `w` is touched: shapes that disagree (`w` must be `m × n` for factors of
/// `(m, n)`), a zero tile, NaN or Inf in `w` (the sum would silently be NaN), a sum that
/// overflows f32 (checked by a dry run whenever a norm bound says it could).
pub fn apply_tiled(
    mut w: ArrayViewMut2<'_, f32>,
    c: &LowRank,
    tile: usize,
) -> Result<(), AcceleratorError> {
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
    if w.iter().any(|x| !x.is_finite()) {
        return Err(AcceleratorError::NonFinite {
            entry: ENTRY,
            what: "the weights",
        });
    }
    // Cauchy–Schwarz: |(U·diag(S)·Vᵀ)ᵢⱼ| <= max_i ‖(U·diag(S))ᵢ‖ · max_j ‖Vⱼ‖. When the sum may
    // leave the f32 range (the bound is finite: f32 values squared fit f64), a dry run checks
    // every result before anything is written.
    let bound = c.entry_bound()? + w.iter().fold(0.0f64, |a, &x| a.max(f64::from(x.abs())));
    let h = c.host()?;
    if bound >= f64::from(f32::MAX) / 2.0 {
        tiles(&mut w, &h, tile, false)?;
    }
    tiles(&mut w, &h, tile, true)
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
