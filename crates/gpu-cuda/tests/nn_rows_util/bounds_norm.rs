//! First-order error bounds of the f32 LayerNorm and RMSNorm kernels (`kernels/nn_rows.cu`),
//! forward and backward, one bound per output element; the conventions are [`super::bounds`]'.

use super::bounds::*;
use super::NormBwd;

/// Exact statistics of a row for the norms: `n`, `μ = Σx/n`, `var = Σ(x − μ)²/n`,
/// `mean_abs = Σ|x|/n`, `dev0 = Σ|x − x_0|/n` (the f64 path's shifted sum), `ms = Σx²/n`.
#[derive(Clone, Copy, Debug)]
struct RowStats {
    n: f64,
    mu: f64,
    var: f64,
    mean_abs: f64,
    dev0: f64,
    ms: f64,
}

impl RowStats {
    fn of(xr: &[f32]) -> RowStats {
        let n = xr.len() as f64;
        let mu = xr.iter().map(|&v| v as f64).sum::<f64>() / n;
        let var = xr.iter().map(|&v| (v as f64 - mu).powi(2)).sum::<f64>() / n;
        let mean_abs = xr.iter().map(|&v| (v as f64).abs()).sum::<f64>() / n;
        let x0 = xr[0] as f64;
        let dev0 = xr.iter().map(|&v| (v as f64 - x0).abs()).sum::<f64>() / n;
        let ms = xr.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / n;
        RowStats {
            n,
            mu,
            var,
            mean_abs,
            dev0,
            ms,
        }
    }
}

/// Bounds of LayerNorm's forward outputs: `(y, mean, rstd)`.
pub struct LnFwdBounds {
    pub y: Vec<f64>,
    pub mean: Vec<f64>,
    pub rstd: Vec<f64>,
}

/// LayerNorm forward, `y_i = x̂_i·w_i + b_i`, `x̂_i = (x_i − μ)·r`, `r = 1/sqrt(var + eps)`.
/// The kernel takes a row's statistics in f32 (the fast path) unless they fail its trust test
/// (`var32 >= 2^-20·μ̂²` and `var32 <= 1e37`), and then in f64 (`layernorm_fwd_row_exact`);
/// the bound is that of the f32 path, which covers the f64 path too, except for rows that
/// certainly fail the test (their exact `var` is far below `2^-20·μ²`, or above 1e37), which
/// get the f64 path's much smaller bound (constant rows: `y = b` exactly).
/// - Mean, f32 path: `fl(fl(Σx)/n)`, `Δμ = γ_d·mean|x| + u·|μ|` (the sum is bounded by the size
///   of its terms: a row holding ±FLT_MAX cancels to a small mean); f64 path: the shifted sum
///   `K + Σ(x − K)/n` with `K = x_0` (`γ64·Σ|x − x_0|/n` and two f64 roundings of `μ`; none
///   for a constant row, whose shifted terms are exact zeros) rounded to f32 (u·|μ|) and kept as
///   `hi + lo` for `x̂` (`lo` rounded: u·|μ − fl32(μ)|); both plus 2^-149 (a subnormal mean).
///   Bound: the saved mean's error (f32 path `Δμ`; f64 path its f64 error and the rounding to
///   f32, u·|μ|) and the reference's rounding, u·|μ|.
/// - rstd, f32 path: `var32 = fl(Σ fmaf(x − μ̂)²/n)` is the variance about `μ̂`,
///   `var + (μ̂ − μ)²`, each square off by 2u, the sum by `γ_d`, the division by u; then
///   `fl(1/sqrtf(fl(var32 + eps)))`: the square root halves the relative error of `var + eps`
///   (the addition's rounding included), then `sqrtf` and the division round once each.
///   `ε_r = ½·(((3u + γ_d)·var + Δμ²)/(var + eps) + u) + 2u`; f64
///   path: `u + (d + 3)(n + 1)·2^-51` (the shifted variance loses at most a factor `n + 1`);
///   both plus 2^-150/r (a subnormal rstd, rows of ±FLT_MAX). Bound `r·(ε_r + u)`.
/// - y: `fmaf(fl(fl(x_i − μ̂)·r̂), w_i, b_i)` (the f64 path's `(x − hi) − lo` rounds once more):
///   `|x̂̂_i − x̂_i| <= r·(Δμ + 2u·|x_i − μ|) + |x̂_i|·(ε_r + u)`, times `|w_i|`, then u·|y_i| for
///   the fmaf and u·|y_i| for the reference. `r·Δμ` is the row's conditioning: `|x|·r`.
pub fn layernorm_fwd_bounds(x: &[f32], w: &[f32], b: &[f32], cols: usize, eps: f32) -> LnFwdBounds {
    let d = row_depth(cols);
    let (g, eps) = (gamma(d), eps as f64);
    let rows = rows_of(x.len(), cols);
    let mut out = LnFwdBounds {
        y: Vec::with_capacity(x.len()),
        mean: Vec::with_capacity(rows),
        rstd: Vec::with_capacity(rows),
    };
    for xr in x.chunks(cols.max(1)).take(rows) {
        let st = RowStats::of(xr);
        let r = 1.0 / (st.var + eps).sqrt();
        let dmu32 = g * st.mean_abs + U * st.mu.abs() + 2.0 * TINY;
        let er32 = 0.5 * ((3.0 * U + g) * st.var + dmu32 * dmu32) / (st.var + eps) + 2.5 * U;
        let lo = (st.mu - st.mu as f32 as f64).abs();
        // A constant row sums exact zeros: its f64 mean is exactly x_0.
        let shifted = if st.dev0 > 0.0 {
            gamma64(d + 2) * st.dev0 + gamma64(2) * st.mu.abs()
        } else {
            0.0
        };
        let dmu64 = shifted + U * lo + 2.0 * TINY;
        let er64 = U + (d as f64 + 3.0) * (st.n + 1.0) * f64::EPSILON * 2.0;
        // The f32 path is certainly not taken when the largest var32 stays below the smallest
        // threshold 2^-20·μ̂² (products rounded, or underflowing: a subnormal mean's threshold
        // is 0, and such a row may take either path), or the smallest var32 exceeds 1e37.
        let var32_hi = (st.var + dmu32 * dmu32) * (1.0 + 4.0 * U + g) + (d + 2) as f64 * TINY;
        let mu_lo = (st.mu.abs() - dmu32).max(0.0);
        let thr_lo = mu_lo * mu_lo * 9.5367431640625e-7 * (1.0 - 3.0 * U) - 2.0 * TINY;
        let f64_only = var32_hi < thr_lo || st.var * (1.0 - 4.0 * U - g) > 1.001e37;
        let (dmu, mean_round, er) = if f64_only {
            (dmu64, 2.0 * U * st.mu.abs(), er64)
        } else {
            (dmu32, U * st.mu.abs(), er32)
        };
        let er = er + TINY / r;
        out.mean.push(SECOND_ORDER * (dmu + mean_round) + FLOOR);
        out.rstd.push(SECOND_ORDER * r * (er + U) + FLOOR);
        for ((&v, &wv), &bv) in xr.iter().zip(w).zip(b) {
            let c = v as f64 - st.mu;
            let xh = c * r;
            let y = xh * wv as f64 + bv as f64;
            let e_xh = r * (dmu + 2.0 * U * c.abs()) + xh.abs() * (er + U);
            let bound = (wv as f64).abs() * e_xh + 2.0 * U * y.abs();
            out.y.push(SECOND_ORDER * bound + FLOOR);
        }
    }
    out
}

/// Bounds of LayerNorm's backward outputs: `(dx, dw, db)`.
pub struct LnBwdBounds {
    pub dx: Vec<f64>,
    pub dw: Vec<f64>,
    pub db: Vec<f64>,
}

/// LayerNorm backward from the f32 inputs (`mean`, `rstd` as saved; `x̂_i = (x_i − μ)·r`,
/// `g_i = dy_i·w_i`, all exact in f64): `dx_i = r·(g_i − m1 − x̂_i·m2)` with `m1 = Σg/n` and
/// `m2 = Σg·x̂/n`, which cancels (its terms are `g_i`, `m1`, `x̂_i·m2`).
/// - The kernel's `x̂` rounds twice (`fl(fl(x − μ)·r)`: 2u·|x̂|), `g` once (u·|g|).
///   `m1 = fl(Σĝ/n)`: `E1 = (u + γ_d)·Σ|g|/n + u·|m1|`; `m2 = fl(Σ fmaf(ĝ, x̂̂)/n)`:
///   `E2 = (3u + γ_d)·Σ|g·x̂|/n + u·|m2|`.
/// - `fl(r·fl(fl(ĝ_i − m̂1) − fl(x̂̂_i·m̂2)))`: `r·(u·|g_i| + E1 + u·|g_i − m1| + 3u·|x̂_i·m2|
///   + |x̂_i|·E2 + u·|inner_i|) + u·|dx_i|`, and u·|dx_i| for the reference.
/// - dw_c = Σ_rows dy·x̂ by fmaf over `D = col_depth` roundings, `x̂` off by 2u:
///   `(2u + γ_D)·Σ|dy·x̂| + u·|dw_c|`; db_c = Σ dy: `γ_D·Σ|dy| + u·|db_c|`.
pub fn layernorm_bwd_bounds(input: NormBwd, col_depth: usize) -> LnBwdBounds {
    let (x, w, mean, rstd, dy, cols) = (
        input.x, input.w, input.mean, input.rstd, input.dy, input.cols,
    );
    let g = gamma(row_depth(cols));
    let n = cols as f64;
    let rows = rows_of(x.len(), cols);
    let mut dx = Vec::with_capacity(x.len());
    let (mut tw, mut tb) = (vec![0.0f64; cols], vec![0.0f64; cols]);
    let (mut sw, mut sb) = (vec![0.0f64; cols], vec![0.0f64; cols]);
    for r in 0..rows {
        let (xr, dyr) = (&x[r * cols..][..cols], &dy[r * cols..][..cols]);
        let (mu, rs) = (mean[r] as f64, rstd[r] as f64);
        let xh = |i: usize| (xr[i] as f64 - mu) * rs;
        let gi = |i: usize| dyr[i] as f64 * w[i] as f64;
        let (mut s1, mut a1, mut s2, mut a2) = (0.0, 0.0, 0.0, 0.0);
        for i in 0..cols {
            let (gv, xv) = (gi(i), xh(i));
            s1 += gv;
            a1 += gv.abs();
            s2 += gv * xv;
            a2 += (gv * xv).abs();
            tw[i] += (dyr[i] as f64 * xv).abs();
            tb[i] += (dyr[i] as f64).abs();
            sw[i] += dyr[i] as f64 * xv;
            sb[i] += dyr[i] as f64;
        }
        let (m1, m2) = (s1 / n, s2 / n);
        let e1 = (U + g) * a1 / n + U * m1.abs();
        let e2 = (3.0 * U + g) * a2 / n + U * m2.abs();
        for i in 0..cols {
            let (gv, xv) = (gi(i), xh(i));
            let inner = gv - m1 - xv * m2;
            let inner_err = U * (gv.abs() + (gv - m1).abs() + 3.0 * (xv * m2).abs() + inner.abs())
                + e1
                + xv.abs() * e2;
            let bound = rs * inner_err + 2.0 * U * (rs * inner).abs();
            dx.push(SECOND_ORDER * bound + FLOOR);
        }
    }
    let gc = gamma(col_depth);
    let dw = (0..cols)
        .map(|c| SECOND_ORDER * ((2.0 * U + gc) * tw[c] + U * sw[c].abs()) + FLOOR)
        .collect();
    let db = (0..cols)
        .map(|c| SECOND_ORDER * (gc * tb[c] + U * sb[c].abs()) + FLOOR)
        .collect();
    LnBwdBounds { dx, dw, db }
}

/// Bounds of RMSNorm's forward outputs: `(y, rstd)`.
pub struct RmsFwdBounds {
    pub y: Vec<f64>,
    pub rstd: Vec<f64>,
}

/// RMSNorm forward, `r = 1/sqrt(Σx²/n + eps)`, `y_i = x_i·r·w_i`. The kernel sums `x²` in f64
/// (`V` accumulators, then the group: `γ64_(d+3)`), takes the root and reciprocal in f64 and
/// rounds `r` once to f32, as the reference does: `ε_r = u + (d + 8)·2^-53 + 2^-150/r` each, so
/// rstd is bounded by `r·(2u + (d + 8)·2^-53) + 2^-149`. `y_i = fl(fl(x_i·r̂)·w_i)`: `ε_r + 2u`,
/// and u for the reference: `|y_i|·(ε_r + 3u)`.
pub fn rmsnorm_fwd_bounds(x: &[f32], w: &[f32], cols: usize, eps: f32) -> RmsFwdBounds {
    let d = row_depth(cols);
    let rows = rows_of(x.len(), cols);
    let mut out = RmsFwdBounds {
        y: Vec::with_capacity(x.len()),
        rstd: Vec::with_capacity(rows),
    };
    for xr in x.chunks(cols.max(1)).take(rows) {
        let st = RowStats::of(xr);
        let r = 1.0 / (st.ms + eps as f64).sqrt();
        let f64_err = gamma64(d + 8);
        out.rstd
            .push(SECOND_ORDER * (r * (2.0 * U + f64_err) + 2.0 * TINY) + FLOOR);
        let er = U + f64_err + TINY / r;
        for (&v, &wv) in xr.iter().zip(w) {
            let y = v as f64 * r * wv as f64;
            out.y.push(SECOND_ORDER * y.abs() * (er + 3.0 * U) + FLOOR);
        }
    }
    out
}

/// Bounds of RMSNorm's backward outputs: `(dx, dw)`.
pub struct RmsBwdBounds {
    pub dx: Vec<f64>,
    pub dw: Vec<f64>,
}

/// RMSNorm backward from the f32 inputs (`x̂_i = x_i·r`, `g_i = dy_i·w_i`, exact in f64):
/// `dx_i = r·(g_i − x̂_i·c)`, `c = Σg·x̂/n`, which cancels (terms `g_i` and `x̂_i·c`).
/// - The kernel's `c = fl(Σ fmaf(fl(dy·w), fl(x·r))/n)`: `E_c = (2u + γ_d)·Σ|g·x̂|/n + u·|c|`.
/// - `fl(r·fmaf(−fl(x_i·r), ĉ, fl(dy_i·w_i)))`: `r·(u·|g_i| + |x̂_i|·(E_c + u·|c|) +
///   u·|inner_i|) + u·|dx_i|`, and u·|dx_i| for the reference.
/// - dw_c = Σ_rows dy·x̂ by fmaf over `D = col_depth` roundings, `x̂` off by u:
///   `(u + γ_D)·Σ|dy·x̂| + u·|dw_c|`.
pub fn rmsnorm_bwd_bounds(input: NormBwd, col_depth: usize) -> RmsBwdBounds {
    let (x, w, rstd, dy, cols) = (input.x, input.w, input.rstd, input.dy, input.cols);
    let g = gamma(row_depth(cols));
    let n = cols as f64;
    let rows = rows_of(x.len(), cols);
    let mut dx = Vec::with_capacity(x.len());
    let (mut tw, mut sw) = (vec![0.0f64; cols], vec![0.0f64; cols]);
    for r in 0..rows {
        let (xr, dyr) = (&x[r * cols..][..cols], &dy[r * cols..][..cols]);
        let rs = rstd[r] as f64;
        let (mut s, mut a) = (0.0, 0.0);
        for i in 0..cols {
            let (gv, xv) = (dyr[i] as f64 * w[i] as f64, xr[i] as f64 * rs);
            s += gv * xv;
            a += (gv * xv).abs();
            tw[i] += (dyr[i] as f64 * xv).abs();
            sw[i] += dyr[i] as f64 * xv;
        }
        let c = s / n;
        let ec = (2.0 * U + g) * a / n + U * c.abs();
        for i in 0..cols {
            let (gv, xv) = (dyr[i] as f64 * w[i] as f64, xr[i] as f64 * rs);
            let inner = gv - xv * c;
            let inner_err = U * gv.abs() + xv.abs() * (ec + U * c.abs()) + U * inner.abs();
            let bound = rs * inner_err + 2.0 * U * (rs * inner).abs();
            dx.push(SECOND_ORDER * bound + FLOOR);
        }
    }
    let gc = gamma(col_depth);
    let dw = (0..cols)
        .map(|c| SECOND_ORDER * ((U + gc) * tw[c] + U * sw[c].abs()) + FLOOR)
        .collect();
    RmsBwdBounds { dx, dw }
}
