//! Wrappers that run one `RowOps` method on any backend: inputs uploaded, outputs poisoned with
//! NaN before the call (so an element a kernel skips fails the comparison) and downloaded after.
#![allow(dead_code)]

use crate::common::{down, poisoned, random_vec, run_op, up, CPU};
use gpu_core::nn::rows::{LayerNormBwdIn, LogitsIn, RmsNormBwdIn, RowBwdIn};
use gpu_core::nn::RowOps;
use gpu_core::nn::{ElementwiseOps, IdRows};
use gpu_core::Backend;

mod bounds;
mod bounds_norm;
pub use bounds::*;
pub use bounds_norm::*;

/// What every wrapper needs from a backend (`'static`: [`sms_of`] looks for a CUDA backend).
pub trait Rows: RowOps + ElementwiseOps + 'static {}
impl<B: RowOps + ElementwiseOps + 'static> Rows for B {}

pub fn up_u32<B: Backend>(b: &B, v: &[u32]) -> B::Buffer {
    b.upload(v).expect("upload u32")
}

pub fn softmax<B: Rows>(b: &B, x: &[f32], cols: usize) -> Vec<f32> {
    run_op(b, [x], x.len(), |[x], o| b.softmax_fwd(x, o, cols))
}

pub fn softmax_bwd<B: Rows>(b: &B, y: &[f32], dy: &[f32], cols: usize) -> Vec<f32> {
    run_op(b, [y, dy], y.len(), |[y, dy], o| {
        b.softmax_bwd(RowBwdIn { y, dy }, o, cols)
    })
}

pub fn log_softmax<B: Rows>(b: &B, x: &[f32], cols: usize) -> Vec<f32> {
    run_op(b, [x], x.len(), |[x], o| b.log_softmax_fwd(x, o, cols))
}

pub fn log_softmax_bwd<B: Rows>(b: &B, y: &[f32], dy: &[f32], cols: usize) -> Vec<f32> {
    run_op(b, [y, dy], y.len(), |[y, dy], o| {
        b.log_softmax_bwd(RowBwdIn { y, dy }, o, cols)
    })
}

pub fn ce_fwd<B: Rows>(b: &B, x: &[f32], t: &[u32], cols: usize) -> Vec<f32> {
    run_op(b, [x], t.len(), |[x], o| {
        b.cross_entropy_fwd(LogitsIn::new(x, &up_u32(b, t), cols), o)
    })
}

pub fn ce_bwd<B: Rows>(b: &B, x: &[f32], t: &[u32], dl: &[f32], cols: usize) -> Vec<f32> {
    run_op(b, [x, dl], x.len(), |[x, dl], o| {
        b.cross_entropy_bwd(LogitsIn::new(x, &up_u32(b, t), cols), dl, o)
    })
}

/// LayerNorm forward: `(y, mean, rstd)`.
pub fn ln_fwd<B: Rows>(
    b: &B,
    x: &[f32],
    w: &[f32],
    bias: &[f32],
    cols: usize,
    eps: f32,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let rows = x.len() / cols;
    let (mut y, mut m, mut r) = (poisoned(b, x.len()), poisoned(b, rows), poisoned(b, rows));
    let (xb, wb, bb) = (up(b, x), up(b, w), up(b, bias));
    b.layernorm_fwd((&xb, &wb, &bb), (&mut y, &mut m, &mut r), cols, eps)
        .unwrap();
    (down(b, &y), down(b, &m), down(b, &r))
}

/// The host inputs of a norm's backward, rows of `cols`: the forward's input `x` and weight
/// `w`, its saved statistics (`mean` is LayerNorm's, empty for RMSNorm, which saves only
/// `rstd`) and the output gradient `dy`.
#[derive(Clone, Copy, Debug)]
pub struct NormBwd<'a> {
    pub x: &'a [f32],
    pub w: &'a [f32],
    pub mean: &'a [f32],
    pub rstd: &'a [f32],
    pub dy: &'a [f32],
    pub cols: usize,
}

impl<'a> NormBwd<'a> {
    /// LayerNorm's backward inputs, with the saved `(mean, rstd)`.
    pub fn layernorm(
        (x, w): (&'a [f32], &'a [f32]),
        (mean, rstd): (&'a [f32], &'a [f32]),
        dy: &'a [f32],
        cols: usize,
    ) -> Self {
        NormBwd {
            x,
            w,
            mean,
            rstd,
            dy,
            cols,
        }
    }

    /// RMSNorm's backward inputs, with the saved `rstd`.
    pub fn rmsnorm(
        (x, w): (&'a [f32], &'a [f32]),
        rstd: &'a [f32],
        dy: &'a [f32],
        cols: usize,
    ) -> Self {
        Self::layernorm((x, w), (&[], rstd), dy, cols)
    }
}

/// LayerNorm backward: `(dx, dw, db)`.
pub fn ln_bwd<B: Rows>(b: &B, i: NormBwd) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let cols = i.cols;
    let (mut dx, mut dw, mut db) = (poisoned(b, i.x.len()), poisoned(b, cols), poisoned(b, cols));
    let [x, w, mean, rstd, dy] = &[i.x, i.w, i.mean, i.rstd, i.dy].map(|v| up(b, v));
    let ins = LayerNormBwdIn {
        x,
        w,
        mean,
        rstd,
        dy,
    };
    b.layernorm_bwd(ins, (&mut dx, &mut dw, &mut db), cols)
        .unwrap();
    (down(b, &dx), down(b, &dw), down(b, &db))
}

/// RMSNorm forward: `(y, rstd)`.
pub fn rms_fwd<B: Rows>(
    b: &B,
    x: &[f32],
    w: &[f32],
    cols: usize,
    eps: f32,
) -> (Vec<f32>, Vec<f32>) {
    let (mut y, mut r) = (poisoned(b, x.len()), poisoned(b, x.len() / cols));
    b.rmsnorm_fwd(&up(b, x), &up(b, w), &mut y, &mut r, cols, eps)
        .unwrap();
    (down(b, &y), down(b, &r))
}

/// RMSNorm backward: `(dx, dw)` (`i.mean` unused).
pub fn rms_bwd<B: Rows>(b: &B, i: NormBwd) -> (Vec<f32>, Vec<f32>) {
    let (mut dx, mut dw) = (poisoned(b, i.x.len()), poisoned(b, i.cols));
    let [x, w, rstd, dy] = &[i.x, i.w, i.rstd, i.dy].map(|v| up(b, v));
    b.rmsnorm_bwd(RmsNormBwdIn { x, w, rstd, dy }, (&mut dx, &mut dw), i.cols)
        .unwrap();
    (down(b, &dx), down(b, &dw))
}

pub fn rope<B: Rows>(
    b: &B,
    x: &[f32],
    n: usize,
    t: usize,
    d: usize,
    base: f32,
    inverse: bool,
) -> Vec<f32> {
    run_op(b, [x], x.len(), |[x], o| {
        b.rope(x, o, [n, t, d], (base, inverse))
    })
}

pub fn emb_fwd<B: Rows>(b: &B, ids: &[u32], table: &[f32], dim: usize) -> Vec<f32> {
    run_op(b, [table], ids.len() * dim, |[table], o| {
        b.embedding_fwd(IdRows::new(&up_u32(b, ids), table, dim), o)
    })
}

pub fn emb_bwd<B: Rows>(b: &B, ids: &[u32], dout: &[f32], vocab: usize, dim: usize) -> Vec<f32> {
    run_op(b, [dout], vocab * dim, |[dout], o| {
        b.embedding_bwd(IdRows::new(&up_u32(b, ids), dout, dim), o)
    })
}

/// Tolerances of a comparison: elementwise `|got − want| <= rtol·|want| + atol·max|want|`, and
/// the norm-wise relative error `‖got − want‖ / ‖want‖ < norm`. For RoPE, the embedding and the
/// gradient checks; the row ops of `nn_rows` are checked against derived per-element bounds
/// ([`check_bounded`] and the bound functions of `bounds.rs`).
#[derive(Clone, Copy, Debug)]
pub struct Tol {
    pub rtol: f64,
    pub atol: f64,
    pub norm: f64,
}

/// Exact algorithms in f32 against the f64 reference.
pub const EXACT: Tol = Tol {
    rtol: 1e-5,
    atol: 1e-6,
    norm: 1e-5,
};

/// Sums over rows (reassociated, or atomics in any order).
pub const SUMS: Tol = Tol {
    rtol: 1e-4,
    atol: 1e-5,
    norm: 1e-5,
};

/// Asserts `got` matches `want` under `tol` (see [`tol_violation`]).
pub fn check(what: &str, got: &[f32], want: &[f32], tol: Tol) {
    if let Some(e) = tol_violation(got, want, tol) {
        panic!("{what}{e}");
    }
}

/// Why `got` fails `tol`, or `None`: NaN where `want` is NaN, the same infinity where `want` is
/// infinite, else finite (a poisoned, unwritten element fails) and within tolerance.
pub fn tol_violation(got: &[f32], want: &[f32], tol: Tol) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!(": length {} != {}", got.len(), want.len()));
    }
    let scale = want
        .iter()
        .filter(|w| w.is_finite())
        .fold(0.0f64, |m, &w| m.max(w.abs() as f64));
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let d = match difference(i, g, w) {
            Err(e) => return Some(e),
            Ok(None) => continue,
            Ok(Some(d)) => d,
        };
        if d > tol.rtol * (w as f64).abs() + tol.atol * scale.max(1e-30) {
            return Some(format!(
                "[{i}]: got {g}, want {w}, diff {d:e} (max |want| {scale:e})"
            ));
        }
        num += d * d;
        den += (w as f64) * (w as f64);
    }
    // Norm-wise against the larger of ‖want‖ and max|want|·sqrt(n).
    let den = den.max(scale * scale * got.len() as f64);
    if den > 0.0 {
        let rel = (num / den).sqrt();
        if rel >= tol.norm {
            return Some(format!(": norm-wise error {rel:e} >= {:e}", tol.norm));
        }
    }
    None
}

/// LayerNorm and RMSNorm of rows `x` on backend `b` against the CPU reference, forward and
/// backward (random weights, bias and output gradient; the backward is fed the CPU's saved
/// statistics), each output within its derived per-element bound: [`layernorm_fwd_bounds`]
/// (the mean bounded by the size of its terms, y by the row's conditioning `|x|·rstd`),
/// [`layernorm_bwd_bounds`] (dx by the size of its cancelling terms, dw and db, sums over rows
/// that may cancel, by the size of theirs), [`rmsnorm_fwd_bounds`], [`rmsnorm_bwd_bounds`].
pub fn norm_check<B: Rows>(
    b: &B,
    what: &str,
    rng: &mut rand::rngs::StdRng,
    x: &[f32],
    cols: usize,
) {
    let eps = 1e-5;
    let (w, bias) = (random_vec(rng, cols, 2.0), random_vec(rng, cols, 1.0));
    let dy = random_vec(rng, x.len(), 1.0);
    let rows = x.len() / cols.max(1);
    let cd = col_depth(rows, cols, sms_of(b));

    let (y, mean, rstd) = ln_fwd(&CPU, x, &w, &bias, cols, eps);
    let (gy, gm, gr) = ln_fwd(b, x, &w, &bias, cols, eps);
    let bd = layernorm_fwd_bounds(x, &w, &bias, cols, eps);
    check_bounded(&format!("{what} layernorm y"), &gy, &y, &bd.y);
    check_bounded(&format!("{what} layernorm mean"), &gm, &mean, &bd.mean);
    check_bounded(&format!("{what} layernorm rstd"), &gr, &rstd, &bd.rstd);
    let ln = NormBwd::layernorm((x, &w), (&mean, &rstd), &dy, cols);
    let (dx, dw, db) = ln_bwd(&CPU, ln);
    let (gdx, gdw, gdb) = ln_bwd(b, ln);
    let bd = layernorm_bwd_bounds(ln, cd);
    check_bounded(&format!("{what} layernorm dx"), &gdx, &dx, &bd.dx);
    check_bounded(&format!("{what} layernorm dw"), &gdw, &dw, &bd.dw);
    check_bounded(&format!("{what} layernorm db"), &gdb, &db, &bd.db);

    let (y, rstd) = rms_fwd(&CPU, x, &w, cols, eps);
    let (gy, gr) = rms_fwd(b, x, &w, cols, eps);
    let bd = rmsnorm_fwd_bounds(x, &w, cols, eps);
    check_bounded(&format!("{what} rmsnorm y"), &gy, &y, &bd.y);
    check_bounded(&format!("{what} rmsnorm rstd"), &gr, &rstd, &bd.rstd);
    let rms = NormBwd::rmsnorm((x, &w), &rstd, &dy, cols);
    let (dx, dw) = rms_bwd(&CPU, rms);
    let (gdx, gdw) = rms_bwd(b, rms);
    let bd = rmsnorm_bwd_bounds(rms, cd);
    check_bounded(&format!("{what} rmsnorm dx"), &gdx, &dx, &bd.dx);
    check_bounded(&format!("{what} rmsnorm dw"), &gdw, &dw, &bd.dw);
}
