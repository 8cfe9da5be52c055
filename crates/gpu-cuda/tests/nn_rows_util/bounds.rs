//! First-order error bounds of the f32 row kernels (`kernels/nn_rows.cu`) against the CPU
//! reference (`gpu_core`'s exact mode: f64, rounded once to f32), one bound per output element,
//! computed in f64 from the inputs. Each bound is the sum of the rounding errors of the kernel's
//! operations, each measured against the size of what that operation rounds (the terms of a
//! reduction, the operands of a subtraction that cancels), so a result that cancels to almost
//! nothing keeps a bound the size of its terms' rounding, and a wrong result (a term dropped, a
//! sign flipped, another row's statistics) exceeds it.
//!
//! Conventions, used by every derivation below:
//! - `u = 2^-24` (f32 unit roundoff): `+ − × /`, `sqrtf` and `fmaf` round once, with relative
//!   error <= u (nvcc's defaults: no `--use_fast_math`, no `-ftz`, IEEE division and square root);
//! - CUDA's `expf` errs by at most 2 ulp, a relative error <= 4u, and `expf(0) = 1` exactly (the
//!   reduced argument is 0 and `ex2(0) = 1`); `logf` errs by at most 1 ulp, <= 2u relative;
//!   `expf(a·(1+δ))` of an argument rounded by `|δ| <= u` errs by a further `|a|·u` relative;
//! - a reduction of `n` terms along a tree in which every term passes through at most `d`
//!   roundings errs by at most `γ_d·Σ|terms|`, `γ_d = d·u/(1 − d·u)`; `d` is [`row_depth`] for
//!   the row reductions and [`col_depth`] for the sums over rows;
//! - the reference's own error is its final rounding, `u·|want|` (its f64 arithmetic errs by
//!   ~2^-53 relative, far below every bound here);
//! - rounding into the subnormal range errs by up to 2^-150 absolute: every bound gets
//!   [`FLOOR`], and relative errors of a value that may be subnormal get `2^-150/|value|`;
//! - products of two first-order terms are dropped: every relative error here stays below 1e-2,
//!   so they are below 1% of the bound, and the bounds are multiplied by [`SECOND_ORDER`].
//!
//! The depth functions mirror the kernels' launch geometry (`row_shape` and `norm_bwd_grid` in
//! `crates/gpu-cuda/src/nn/rows.rs`); a change there must be made here too, or the bounds of
//! wide rows may come out too tight.

/// f32 unit roundoff, 2^-24.
pub const U: f64 = 1.0 / 16_777_216.0;
/// Half the smallest f32 subnormal, 2^-150: the absolute error of one rounding that underflows.
pub const TINY: f64 = 7.006_492_321_624_085e-46;
/// Absolute floor of every bound: a few roundings into the subnormal range (2^-146).
pub const FLOOR: f64 = 16.0 * TINY;
/// Covers the dropped second-order terms (see the module documentation).
pub const SECOND_ORDER: f64 = 1.01;

/// `γ_n = n·u/(1 − n·u)`: the relative error of a sum whose terms each pass through `n`
/// roundings.
pub fn gamma(n: usize) -> f64 {
    let nu = n as f64 * U;
    nu / (1.0 - nu)
}

/// `γ_n` of f64 arithmetic (`2^-53`).
pub(super) fn gamma64(n: usize) -> f64 {
    n as f64 * f64::EPSILON / 2.0
}

fn ceil_log2(n: usize) -> usize {
    n.max(1).next_power_of_two().trailing_zeros() as usize
}

/// The row group of a kernel for rows of `cols` columns: `(threads, V)`. A warp for rows of up to
/// 1024 columns, else a block of `next_pow2(⌈cols/16⌉)` threads clamped to [32, 512]
/// (`CudaBackend::row_shape`); chunks of `V = 4` columns when `cols % 4 == 0`, else 1.
pub fn row_group(cols: usize) -> (usize, usize) {
    let threads = if cols <= 1024 {
        32
    } else {
        cols.div_ceil(16).next_power_of_two().clamp(32, 512)
    };
    (threads, if cols.is_multiple_of(4) { 4 } else { 1 })
}

/// Roundings that any one term of a row reduction passes through: the thread visits chunks
/// `i, i + T, …` and adds their `V` columns in order (`k = V·⌈cols/(V·T)⌉` terms: at most `k`
/// roundings, the first one counted for `fmaf(a, b, 0)`), then the xor butterfly of the warp and,
/// in block mode, the butterfly over the warps' results. A butterfly over `L` used lanes (the
/// others hold the identity, added exactly) rounds at `⌈log2 L⌉` of its levels: at offset `o`
/// both halves hold used lanes only when `o < L`.
pub fn row_depth(cols: usize) -> usize {
    if cols == 0 {
        return 0;
    }
    let (threads, v) = row_group(cols);
    let chunks = cols / v;
    let lanes = chunks.min(threads);
    v * chunks.div_ceil(threads) + ceil_log2(lanes.min(32)) + ceil_log2(lanes.div_ceil(32))
}

/// Roundings that any one term of the norm backward's column sums (dw, db) passes through, for
/// `rows` rows on a GPU of `sms` multiprocessors (`None`: any order). `norm_bwd_grid` launches
/// `blocks = min(⌈rows/R⌉, sms·per_sm)` blocks of `R` groups (warp mode: `R = 4`, `per_sm = 8`;
/// block mode: `R = 1`, `per_sm = 1024/T`), group `g` of `G = R·blocks` accumulates rows
/// `g, g + G, …` (`⌈rows/G⌉` fmaf), a block adds its `R` groups' accumulators (`R − 1`), and
/// `norm_colsum_f32` adds the `blocks` partials, `⌈blocks/32⌉` per thread and then 32 in order.
/// Any summation tree of `rows` terms has depth below `rows`, which caps it.
pub fn col_depth(rows: usize, cols: usize, sms: Option<usize>) -> usize {
    let Some(sms) = sms else {
        return rows;
    };
    if rows == 0 {
        return 0;
    }
    let (threads, _) = row_group(cols);
    let (groups, per_sm) = if cols <= 1024 {
        (4, 8)
    } else {
        (1, (1024 / threads).max(1))
    };
    let blocks = rows.div_ceil(groups).min(sms.max(1) * per_sm);
    let chain = rows.div_ceil(blocks * groups);
    (chain + groups + blocks.div_ceil(32) + 31).min(rows)
}

/// The multiprocessor count of `b` when it is a [`gpu_cuda::CudaBackend`] (for [`col_depth`]).
pub fn sms_of<B: 'static>(b: &B) -> Option<usize> {
    let any: &dyn std::any::Any = b;
    any.downcast_ref::<gpu_cuda::CudaBackend>()
        .map(|c| c.info().multiprocessors.max(1) as usize)
}

/// `|g − w|` of element `i` when `w` is finite and `g` too (`Some`); `None` when `w` is NaN or
/// infinite and `g` propagates it exactly; else why they disagree (a non-finite `g` where `w`
/// is finite is a poisoned, unwritten element).
pub fn difference(i: usize, g: f32, w: f32) -> Result<Option<f64>, String> {
    if w.is_nan() || w.is_infinite() {
        if !(g.to_bits() == w.to_bits() || (w.is_nan() && g.is_nan())) {
            return Err(format!("[{i}]: got {g}, want {w}"));
        }
        return Ok(None);
    }
    if !g.is_finite() {
        return Err(format!("[{i}]: got {g}, want {w} (unwritten?)"));
    }
    Ok(Some((g as f64 - w as f64).abs()))
}

/// Why `got` fails its bounds, or `None`: NaN where `want` is NaN, the same infinity where `want`
/// is infinite (the propagation of NaN and inf is checked exactly), else finite (a poisoned,
/// unwritten element fails) and `|got − want| <= bound` elementwise.
pub fn bound_violation(got: &[f32], want: &[f32], bound: &[f64]) -> Option<String> {
    if got.len() != want.len() || bound.len() != want.len() {
        return Some(format!(
            "lengths: got {}, want {}, bound {}",
            got.len(),
            want.len(),
            bound.len()
        ));
    }
    for (i, ((&g, &w), &b)) in got.iter().zip(want).zip(bound).enumerate() {
        let d = match difference(i, g, w) {
            Err(e) => return Some(e),
            Ok(None) => continue,
            Ok(Some(d)) => d,
        };
        if d > b || b.is_nan() {
            return Some(format!(
                "[{i}]: got {g}, want {w}, diff {d:e} > bound {b:e} ({:.2}x)",
                d / b
            ));
        }
    }
    None
}

/// Asserts [`bound_violation`] finds nothing.
pub fn check_bounded(what: &str, got: &[f32], want: &[f32], bound: &[f64]) {
    if let Some(e) = bound_violation(got, want, bound) {
        panic!("{what}{e}");
    }
}

/// The largest `|got − want| / bound` over the finite elements (how close a result came).
pub fn bound_ratio(got: &[f32], want: &[f32], bound: &[f64]) -> f64 {
    got.iter()
        .zip(want)
        .zip(bound)
        .filter(|((_, w), _)| w.is_finite())
        .map(|((&g, &w), &b)| (g as f64 - w as f64).abs() / b)
        .fold(0.0, f64::max)
}

/// Exact statistics of one row of logits: `m = max`, `s = Σ e^(a_j)` with `a_j = x_j − m`, and
/// over the entries below the max (`a_j < 0`, the only ones whose `expf` rounds), with weights
/// `w_j = e^(a_j)/s`: `wa = Σ w_j·|a_j|` and `w = Σ w_j`.
#[derive(Clone, Copy, Debug)]
struct Lse {
    m: f64,
    s: f64,
    wa: f64,
    w: f64,
}

impl Lse {
    fn of(xr: &[f32]) -> Lse {
        let m = xr.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        let (mut s, mut wa, mut w) = (0.0, 0.0, 0.0);
        for &v in xr {
            let a = v as f64 - m;
            let e = a.exp();
            s += e;
            if a < 0.0 && a > f64::NEG_INFINITY {
                wa += e * -a;
                w += e;
            }
        }
        Lse {
            m,
            s,
            wa: wa / s,
            w: w / s,
        }
    }

    /// `a_i = x_i − m` and `p_i = e^(a_i)/s` (0 for a masked `-inf`).
    fn a_p(&self, v: f32) -> (f64, f64) {
        let a = v as f64 - self.m;
        (a, (a.exp() / self.s))
    }

    /// Relative error of the two-pass softmax's row sum `Ŝ = Σ expf(fl(x_j − m))` (max exact):
    /// each term below the max errs by `|a_j|·u` (its rounded argument) `+ 4u` (`expf`), the max
    /// itself is exactly 1, and the additions by `γ_d`:
    /// `ε_S = u·Σ_{a_j<0} w_j·(|a_j| + 4) + γ_d`.
    fn eps_two_pass(&self, d: usize) -> f64 {
        U * (self.wa + 4.0 * self.w) + gamma(d)
    }

    /// Relative error of the online log-sum-exp's `Ŝ` (`lse_push`, `lse_merge`): a term below
    /// the max is pushed with its own `expf` (`|a_j|·u`-worth of rounded argument and 4u), and at
    /// each later step (at most `d`) its partial may be rescaled by `expf(m_old − m_new)` (4u, and
    /// u for the product); the rescaling arguments telescope to `m − x_j`, so all their roundings
    /// together are `|a_j|·u`. The partial holding the row's max is never rescaled (it is the
    /// larger side: `expf(0) = 1`). Additions as a sum, `γ_d`:
    /// `ε_S = u·Σ_{a_j<0} w_j·(|a_j| + 4 + 5d) + γ_d`.
    fn eps_online(&self, d: usize) -> f64 {
        U * (self.wa + (4.0 + 5.0 * d as f64) * self.w) + gamma(d)
    }
}

pub(super) fn rows_of(n: usize, cols: usize) -> usize {
    n.checked_div(cols).unwrap_or(0)
}

/// The bounds of an op on the whole rows of `x` (`cols` a row): `row(xr)` gives each element's
/// first-order bound, returned with the second-order factor and the floor applied.
fn row_bounds(x: &[f32], cols: usize, mut row: impl FnMut(&[f32]) -> Vec<f64>) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for xr in x.chunks(cols.max(1)).take(rows_of(x.len(), cols)) {
        out.extend(row(xr).into_iter().map(|b| SECOND_ORDER * b + FLOOR));
    }
    out
}

/// [`row_bounds`] of an op on the rows of `a` and `b` together (a backward: the forward's
/// output and the output gradient), `row(ar, br)` giving each element's first-order bound.
fn row_pair_bounds(
    a: &[f32],
    b: &[f32],
    cols: usize,
    mut row: impl FnMut(&[f32], &[f32]) -> Vec<f64>,
) -> Vec<f64> {
    let mut out = Vec::with_capacity(a.len());
    for (ar, br) in a.chunks(cols.max(1)).zip(b.chunks(cols.max(1))) {
        out.extend(row(ar, br).into_iter().map(|b| SECOND_ORDER * b + FLOOR));
    }
    out
}

/// Softmax forward, `y_i = e^(a_i)/S`. The kernel: `m` exact (a max), `Ŝ` with relative error
/// `ε_S` ([`Lse::eps_two_pass`]), `inv = fl(1/Ŝ)` (+u), `y_i = fl(expf(fl(x_i − m))·inv)`
/// (`|a_i|·u + 4u` for `a_i < 0`, +u for the product); the reference adds u:
/// `|ŷ_i − y_i| <= y_i·(u·(|a_i| + 4·[a_i<0] + 3) + ε_S)`.
pub fn softmax_fwd_bound(x: &[f32], cols: usize) -> Vec<f64> {
    let d = row_depth(cols);
    row_bounds(x, cols, |xr| {
        let st = Lse::of(xr);
        let eps = st.eps_two_pass(d);
        let elem = |&v: &f32| {
            let (a, p) = st.a_p(v);
            if p > 0.0 {
                p * (U * (-a + if a < 0.0 { 4.0 } else { 0.0 } + 3.0) + eps)
            } else {
                0.0
            }
        };
        xr.iter().map(elem).collect()
    })
}

/// Softmax backward, `dx_i = y_i·(dy_i − dot)`, `dot = Σ_j y_j·dy_j`, from the f32 inputs `y` and
/// `dy` (given to both sides exactly: here `y` carries no error). The kernel: `dot` by `fmaf`
/// (products exact) and the group sum, `|dôt − dot| <= γ_d·P` with `P = Σ_j |y_j·dy_j|`; then
/// `fl(y_i·fl(dy_i − dôt))`, two roundings of `y_i·(dy_i − dot)`; the reference adds one:
/// `|dx̂_i − dx_i| <= |y_i|·(3u·|dy_i − dot| + γ_d·P)`. When `dy_i ≈ dot` the output cancels to
/// nothing, and what is left is the `γ_d·P` of the dot product, the size of the cancelling terms.
pub fn softmax_bwd_bound(y: &[f32], dy: &[f32], cols: usize) -> Vec<f64> {
    let g = gamma(row_depth(cols));
    row_pair_bounds(y, dy, cols, |yr, dyr| {
        let dot: f64 = yr.iter().zip(dyr).map(|(&a, &b)| a as f64 * b as f64).sum();
        let p: f64 = yr
            .iter()
            .zip(dyr)
            .map(|(&a, &b)| (a as f64 * b as f64).abs())
            .sum();
        let elem =
            |(&a, &b): (&f32, &f32)| (a as f64).abs() * (3.0 * U * (b as f64 - dot).abs() + g * p);
        yr.iter().zip(dyr).map(elem).collect()
    })
}

/// Log-softmax forward, `o_i = a_i − ln S`. The kernel: online `(m, Ŝ)` (`ε_S`,
/// [`Lse::eps_online`]), `ls = logf(Ŝ)` (`ln S + ε_S`, and 2u·ln S for `logf`),
/// `fl(fl(x_i − m) − ls)` (u·|a_i|, u·|o_i|); the reference adds u·|o_i|:
/// `|ô_i − o_i| <= u·|a_i| + ε_S + 2u·ln S + 2u·|o_i|`.
pub fn log_softmax_fwd_bound(x: &[f32], cols: usize) -> Vec<f64> {
    let d = row_depth(cols);
    row_bounds(x, cols, |xr| {
        let st = Lse::of(xr);
        let (eps, ln_s) = (st.eps_online(d), st.s.ln());
        let elem = |&v: &f32| {
            let a = v as f64 - st.m;
            if a.is_finite() {
                U * a.abs() + eps + 2.0 * U * ln_s + 2.0 * U * (a - ln_s).abs()
            } else {
                0.0 // −inf in, −inf out: compared exactly
            }
        };
        xr.iter().map(elem).collect()
    })
}

/// Log-softmax backward, `dx_i = dy_i − e^(y_i)·s`, `s = Σ_j dy_j`, from the f32 inputs. The
/// kernel: `ŝ` by the group sum (`γ_d·Σ|dy_j|`), `fmaf(−expf(y_i), ŝ, dy_i)` (4u·e^(y_i)·|s| for
/// `expf`, one rounding u·|dx_i|); the reference adds u·|dx_i|:
/// `|dx̂_i − dx_i| <= e^(y_i)·(4u·|s| + γ_d·Σ|dy_j|) + 2u·|dx_i|`.
pub fn log_softmax_bwd_bound(ly: &[f32], dy: &[f32], cols: usize) -> Vec<f64> {
    let g = gamma(row_depth(cols));
    row_pair_bounds(ly, dy, cols, |yr, dyr| {
        let s: f64 = dyr.iter().map(|&v| v as f64).sum();
        let sa: f64 = dyr.iter().map(|&v| (v as f64).abs()).sum();
        let elem = |(&a, &b): (&f32, &f32)| {
            let e = (a as f64).exp();
            let dx = b as f64 - e * s;
            e * (4.0 * U * s.abs() + g * sa) + 2.0 * U * dx.abs()
        };
        yr.iter().zip(dyr).map(elem).collect()
    })
}

/// Cross-entropy forward, `loss = (m − x_t) + ln S` (a logsumexp minus the target's logit: a
/// confident, correct row cancels to a tiny loss, and the error is that of the cancelling
/// terms). The kernel: online `(m, Ŝ)` (`ε_S`, [`Lse::eps_online`]),
/// `fl(fl(m − x_t) + logf(Ŝ))`: u·|m − x_t|, `ε_S` and 2u·ln S through `logf`, u·loss; the
/// reference adds u·loss: `|l̂ − l| <= u·|m − x_t| + ε_S + 2u·ln S + 2u·l`.
/// Rows with a target out of range get a NaN bound (their loss is NaN on both sides).
pub fn cross_entropy_fwd_bound(x: &[f32], t: &[u32], cols: usize) -> Vec<f64> {
    let d = row_depth(cols);
    x.chunks(cols.max(1))
        .zip(t)
        .map(|(xr, &t)| {
            let Some(&xt) = xr.get(t as usize) else {
                return f64::NAN;
            };
            let st = Lse::of(xr);
            let (mt, ln_s) = (st.m - xt as f64, st.s.ln());
            let b = U * mt.abs() + st.eps_online(d) + 2.0 * U * ln_s + 2.0 * U * (mt + ln_s);
            SECOND_ORDER * b + FLOOR
        })
        .collect()
}

/// Cross-entropy backward, `dl_i = g·(p_i − [i = t])`, `p_i = e^(a_i)/S`. The kernel: online
/// `(m, Ŝ)` (`ε_S`), `inv = fl(1/Ŝ)` (+u), `p̂_i = fl(expf(fl(x_i − m))·inv)` (`|a_i|·u + 4u`
/// for `a_i < 0`, +u), `p̂_t − 1` (u·|p_t − 1|), `·g` (u); the reference adds u:
/// `|dl̂_i − dl_i| <= |g|·(p_i·(u·|a_i| + 4u·[a_i<0] + 2u + ε_S) + 3u·|p_i − [i = t]|)`.
/// At the target of a confident row `p_t − 1` cancels, and what is left is `p_t·ε_S`: the
/// softmax's error, the size of the terms that cancel.
pub fn cross_entropy_bwd_bound(x: &[f32], t: &[u32], dl: &[f32], cols: usize) -> Vec<f64> {
    let d = row_depth(cols);
    let mut out = Vec::with_capacity(x.len());
    for ((xr, &t), &g) in x.chunks(cols.max(1)).zip(t).zip(dl) {
        let st = Lse::of(xr);
        let eps = st.eps_online(d);
        for (i, &v) in xr.iter().enumerate() {
            let (a, p) = st.a_p(v);
            let q = p - if i == t as usize { 1.0 } else { 0.0 };
            let own = if p > 0.0 {
                p * (U * -a + if a < 0.0 { 4.0 * U } else { 0.0 } + 2.0 * U + eps)
            } else {
                0.0
            };
            let b = (g as f64).abs() * (own + 3.0 * U * q.abs());
            out.push(SECOND_ORDER * b + FLOOR);
        }
    }
    out
}
