//! Wrappers that run one `RowOps` method on any backend: inputs uploaded, outputs poisoned with
//! NaN before the call (so an element a kernel skips fails the comparison) and downloaded after.
#![allow(dead_code)]

use crate::common::{down, poisoned, random_vec, up, CPU};
use gpu_core::nn::ElementwiseOps;
use gpu_core::nn::RowOps;
use gpu_core::Backend;

/// What every wrapper needs from a backend.
pub trait Rows: RowOps + ElementwiseOps {}
impl<B: RowOps + ElementwiseOps> Rows for B {}

pub fn up_u32<B: Backend>(b: &B, v: &[u32]) -> B::Buffer {
    b.upload(v).expect("upload u32")
}

pub fn softmax<B: Rows>(b: &B, x: &[f32], cols: usize) -> Vec<f32> {
    let mut o = poisoned(b, x.len());
    b.softmax_fwd(&up(b, x), &mut o, cols).unwrap();
    down(b, &o)
}

pub fn softmax_bwd<B: Rows>(b: &B, y: &[f32], dy: &[f32], cols: usize) -> Vec<f32> {
    let mut o = poisoned(b, y.len());
    b.softmax_bwd(&up(b, y), &up(b, dy), &mut o, cols).unwrap();
    down(b, &o)
}

pub fn log_softmax<B: Rows>(b: &B, x: &[f32], cols: usize) -> Vec<f32> {
    let mut o = poisoned(b, x.len());
    b.log_softmax_fwd(&up(b, x), &mut o, cols).unwrap();
    down(b, &o)
}

pub fn log_softmax_bwd<B: Rows>(b: &B, y: &[f32], dy: &[f32], cols: usize) -> Vec<f32> {
    let mut o = poisoned(b, y.len());
    b.log_softmax_bwd(&up(b, y), &up(b, dy), &mut o, cols)
        .unwrap();
    down(b, &o)
}

pub fn ce_fwd<B: Rows>(b: &B, x: &[f32], t: &[u32], cols: usize) -> Vec<f32> {
    let mut o = poisoned(b, t.len());
    b.cross_entropy_fwd(&up(b, x), &up_u32(b, t), &mut o, cols)
        .unwrap();
    down(b, &o)
}

pub fn ce_bwd<B: Rows>(b: &B, x: &[f32], t: &[u32], dl: &[f32], cols: usize) -> Vec<f32> {
    let mut o = poisoned(b, x.len());
    b.cross_entropy_bwd(&up(b, x), &up_u32(b, t), &up(b, dl), &mut o, cols)
        .unwrap();
    down(b, &o)
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
    b.layernorm_fwd(&xb, &wb, &bb, &mut y, &mut m, &mut r, cols, eps)
        .unwrap();
    (down(b, &y), down(b, &m), down(b, &r))
}

/// LayerNorm backward: `(dx, dw, db)`.
pub fn ln_bwd<B: Rows>(
    b: &B,
    x: &[f32],
    w: &[f32],
    mean: &[f32],
    rstd: &[f32],
    dy: &[f32],
    cols: usize,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (mut dx, mut dw, mut db) = (poisoned(b, x.len()), poisoned(b, cols), poisoned(b, cols));
    let ins = [up(b, x), up(b, w), up(b, mean), up(b, rstd), up(b, dy)];
    b.layernorm_bwd(
        &ins[0], &ins[1], &ins[2], &ins[3], &ins[4], &mut dx, &mut dw, &mut db, cols,
    )
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

/// RMSNorm backward: `(dx, dw)`.
pub fn rms_bwd<B: Rows>(
    b: &B,
    x: &[f32],
    w: &[f32],
    rstd: &[f32],
    dy: &[f32],
    cols: usize,
) -> (Vec<f32>, Vec<f32>) {
    let (mut dx, mut dw) = (poisoned(b, x.len()), poisoned(b, cols));
    let ins = [up(b, x), up(b, w), up(b, rstd), up(b, dy)];
    b.rmsnorm_bwd(&ins[0], &ins[1], &ins[2], &ins[3], &mut dx, &mut dw, cols)
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
    let mut o = poisoned(b, x.len());
    b.rope(&up(b, x), &mut o, n, t, d, base, inverse).unwrap();
    down(b, &o)
}

pub fn emb_fwd<B: Rows>(b: &B, ids: &[u32], table: &[f32], dim: usize) -> Vec<f32> {
    let mut o = poisoned(b, ids.len() * dim);
    b.embedding_fwd(&up_u32(b, ids), &up(b, table), &mut o, dim)
        .unwrap();
    down(b, &o)
}

pub fn emb_bwd<B: Rows>(b: &B, ids: &[u32], dout: &[f32], vocab: usize, dim: usize) -> Vec<f32> {
    let mut o = poisoned(b, vocab * dim);
    b.embedding_bwd(&up_u32(b, ids), &up(b, dout), &mut o, dim)
        .unwrap();
    down(b, &o)
}

/// Tolerances of a comparison: elementwise `|got − want| <= rtol·|want| + atol·max|want|`, and
/// the norm-wise relative error `‖got − want‖ / ‖want‖ < norm`.
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

/// Asserts `got` matches `want` under `tol`: NaN where `want` is NaN, the same infinity where
/// `want` is infinite, else finite (a poisoned, unwritten element fails) and within tolerance.
pub fn check(what: &str, got: &[f32], want: &[f32], tol: Tol) {
    check_scaled(what, got, want, tol, 0.0);
}

/// [`check`] with `atol` relative to `max(scale, max|want|)`: for outputs that cancel, `scale` is
/// the size of the terms that cancel (an f32 kernel's error is relative to those).
pub fn check_scaled(what: &str, got: &[f32], want: &[f32], tol: Tol, scale: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want
        .iter()
        .filter(|w| w.is_finite())
        .fold(scale, |m, &w| m.max(w.abs() as f64));
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if w.is_nan() || w.is_infinite() {
            assert!(
                g.to_bits() == w.to_bits() || (w.is_nan() && g.is_nan()),
                "{what}[{i}]: got {g}, want {w}"
            );
            continue;
        }
        assert!(g.is_finite(), "{what}[{i}]: got {g}, want {w} (unwritten?)");
        let d = (g as f64 - w as f64).abs();
        assert!(
            d <= tol.rtol * (w as f64).abs() + tol.atol * scale.max(1e-30),
            "{what}[{i}]: got {g}, want {w}, diff {d:e} (max |want| {scale:e})"
        );
        num += d * d;
        den += (w as f64) * (w as f64);
    }
    // Norm-wise too, the error is measured against the size of the cancelling terms
    // (`scale` per element), not against a result that cancellation made tiny.
    let den = if scale > 0.0 {
        den.max(scale * scale * got.len() as f64)
    } else {
        den
    };
    if den > 0.0 {
        let rel = (num / den).sqrt();
        assert!(
            rel < tol.norm,
            "{what}: norm-wise error {rel:e} >= {:e}",
            tol.norm
        );
    }
}

/// LayerNorm and RMSNorm of rows `x` on backend `b` against the CPU reference, forward and
/// backward (random weights, bias and output gradient; the backward is fed the CPU's saved
/// statistics). Bounds:
/// - LayerNorm's mean: a sum in f32 of at most ~150 terms per thread plus a tree of at most 10
///   levels errs by ≤ 160·2^-24·mean|x| < 1e-5·mean|x| (the size of its terms; a row holding
///   ±FLT_MAX cancels to a small mean);
/// - LayerNorm's y: x̂ = (x − mean)·rstd inherits that error and the rounding of x − mean, so it
///   is bounded relative to (|x| + |mean|)·rstd·|w|, the row's conditioning (a row of 2.5s with
///   one −2.5 has std 0.035 and |x|·rstd ≈ 70);
/// - rstd and RMSNorm's forward within [`EXACT`]; dx, which cancels (`rstd·(g − mean(g) −
///   x̂·mean(g·x̂))`, g = dy·w), within [`SUMS`] of the cancelling terms' size rstd·max|g|; dw and
///   db, sums over rows, within [`SUMS`] of the size of their terms.
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

    let (y, mean, rstd) = ln_fwd(&CPU, x, &w, &bias, cols, eps);
    let (gy, gm, gr) = ln_fwd(b, x, &w, &bias, cols, eps);
    let rows = x.chunks(cols.max(1));
    let mean_abs = rows
        .clone()
        .map(|r| r.iter().map(|v| v.abs() as f64).sum::<f64>() / cols as f64)
        .fold(0.0f64, f64::max);
    let conditioning = rows
        .enumerate()
        .flat_map(|(r, xr)| {
            let (m, s) = (mean[r].abs() as f64, rstd[r] as f64);
            xr.iter()
                .zip(&w)
                .map(move |(&v, &wv)| (v.abs() as f64 + m) * s * wv.abs() as f64)
        })
        .fold(0.0f64, f64::max);
    let ten = Tol {
        rtol: 1e-5,
        atol: 1e-5,
        norm: 1e-5,
    };
    check_scaled(&format!("{what} layernorm y"), &gy, &y, ten, conditioning);
    check_scaled(&format!("{what} layernorm mean"), &gm, &mean, ten, mean_abs);
    check(&format!("{what} layernorm rstd"), &gr, &rstd, EXACT);
    let g_max = dy
        .iter()
        .enumerate()
        .fold(0.0f64, |m, (i, &d)| m.max((d * w[i % cols]).abs() as f64));
    let term = |rstd: &[f32]| g_max * rstd.iter().fold(0.0f64, |m, &r| m.max(r as f64));
    let (dx, dw, db) = ln_bwd(&CPU, x, &w, &mean, &rstd, &dy, cols);
    let (gdx, gdw, gdb) = ln_bwd(b, x, &w, &mean, &rstd, &dy, cols);
    check_scaled(
        &format!("{what} layernorm dx"),
        &gdx,
        &dx,
        SUMS,
        term(&rstd),
    );
    // dw and db are sums over rows that may cancel (an outlier row against the others): bounded
    // by the size of their terms, max over columns of Σ_rows |dy·x̂| (and Σ_rows |dy|).
    let col_terms = |f: &dyn Fn(usize, usize) -> f64| -> f64 {
        let rows = x.len() / cols.max(1);
        (0..cols)
            .map(|c| (0..rows).map(|r| f(r, c).abs()).sum::<f64>())
            .fold(0.0f64, f64::max)
    };
    let ln_xhat = |r: usize, c: usize| (x[r * cols + c] as f64 - mean[r] as f64) * rstd[r] as f64;
    let dw_terms = col_terms(&|r, c| dy[r * cols + c] as f64 * ln_xhat(r, c));
    let db_terms = col_terms(&|r, c| dy[r * cols + c] as f64);
    check_scaled(&format!("{what} layernorm dw"), &gdw, &dw, SUMS, dw_terms);
    check_scaled(&format!("{what} layernorm db"), &gdb, &db, SUMS, db_terms);

    let (y, rstd) = rms_fwd(&CPU, x, &w, cols, eps);
    let (gy, gr) = rms_fwd(b, x, &w, cols, eps);
    check(&format!("{what} rmsnorm y"), &gy, &y, EXACT);
    check(&format!("{what} rmsnorm rstd"), &gr, &rstd, EXACT);
    let (dx, dw) = rms_bwd(&CPU, x, &w, &rstd, &dy, cols);
    let (gdx, gdw) = rms_bwd(b, x, &w, &rstd, &dy, cols);
    check_scaled(&format!("{what} rmsnorm dx"), &gdx, &dx, SUMS, term(&rstd));
    let dw_terms =
        col_terms(&|r, c| dy[r * cols + c] as f64 * x[r * cols + c] as f64 * rstd[r] as f64);
    check_scaled(&format!("{what} rmsnorm dw"), &gdw, &dw, SUMS, dw_terms);
}
