//! An f32 mirror of the row kernels of `kernels/nn_rows.cu` on the CPU, and the tests that need
//! no GPU: the bounds of `nn_rows_util/bounds.rs` must admit what the kernels compute and reject
//! what a wrong kernel computes.
//!
//! The mirror runs each kernel's operations in the kernel's order: each of the group's `T` lanes
//! folds the chunks `i, i + T, …` of `V` columns, then the xor butterflies of the warp and of the
//! block (`row_group` gives `T` and `V`), with `fmaf` where the kernel has it. Without
//! transcendental functions (softmax backward, the norms) it is bit-exact, contractions aside:
//! it reproduces the values logged by GPU runs. `expf` and `logf` are Rust's (not CUDA's, both
//! within the 2 and 1 ulp the bounds assume), which makes the softmax family and cross-entropy
//! a second implementation with a different rounding, as a GPU of another generation would be.
//!
//! [`Bug`] makes the mirror wrong in the ways a kernel goes wrong: a term missing from a
//! reduction, a sign flipped, another row's statistics, an index off by one.

use crate::nn_rows_util::{row_group, NormBwd};

/// A deliberate error in the mirrored kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bug {
    /// The kernel as written.
    None,
    /// The row reduction skips its largest term.
    DropTerm,
    /// The reduction enters the result with the wrong sign.
    FlipSign,
    /// Each row uses the next row's reduction (off by one row).
    NextRow,
    /// An index off by one column (cross-entropy's target; dw's last row is skipped instead).
    OffByOne,
}

pub const BUGS: [Bug; 4] = [Bug::DropTerm, Bug::FlipSign, Bug::NextRow, Bug::OffByOne];

/// The columns each lane of a row group visits, in order.
fn lane_elems(cols: usize) -> Vec<Vec<usize>> {
    let (t, v) = row_group(cols);
    let chunks = cols / v;
    (0..t)
        .map(|l| {
            (l..chunks)
                .step_by(t)
                .flat_map(|i| (0..v).map(move |k| i * v + k))
                .collect()
        })
        .collect()
}

/// The xor butterfly of a warp: every lane merges with lane `l ^ o`, `o = 16, 8, 4, 2, 1`.
fn butterfly<S: Copy>(v: &mut [S], merge: &impl Fn(S, S) -> S) {
    for o in [16, 8, 4, 2, 1] {
        let prev = v.to_vec();
        for (l, x) in v.iter_mut().enumerate() {
            *x = merge(prev[l], prev[l ^ o]);
        }
    }
}

/// A group reduction of the lanes' partials (`grp_sum`, `grp_lse`): the warps' butterflies, then
/// (block mode) warp 0 merges the warps' results, lanes past them holding `id`.
fn group<S: Copy>(mut parts: Vec<S>, id: S, merge: impl Fn(S, S) -> S) -> S {
    for w in parts.chunks_mut(32) {
        butterfly(w, &merge);
    }
    if parts.len() == 32 {
        return parts[0];
    }
    let nw = parts.len() / 32;
    let mut r: Vec<S> = (0..32)
        .map(|l| if l < nw { parts[32 * l] } else { id })
        .collect();
    butterfly(&mut r, &merge);
    r[0]
}

/// A row reduction: every lane folds its columns (but `skip`) into `init` with `push`, then the
/// group merges the lanes.
fn reduce<S: Copy>(
    cols: usize,
    init: S,
    skip: Option<usize>,
    push: impl Fn(S, usize) -> S,
    merge: impl Fn(S, S) -> S,
) -> S {
    let parts = lane_elems(cols)
        .iter()
        .map(|es| {
            es.iter()
                .filter(|&&i| Some(i) != skip)
                .fold(init, |a, &i| push(a, i))
        })
        .collect();
    group(parts, init, merge)
}

/// The column whose term `f` is the largest in magnitude (what [`Bug::DropTerm`] drops).
fn largest(cols: usize, f: impl Fn(usize) -> f64) -> Option<usize> {
    (0..cols).max_by(|&a, &b| f(a).abs().total_cmp(&f(b).abs()))
}

/// The column of a row's largest logit (its `e^(x − max)` is the largest term of the sum).
fn argmax(xr: &[f32]) -> Option<usize> {
    (0..xr.len()).max_by(|&a, &b| xr[a].total_cmp(&xr[b]))
}

fn add(a: f32, b: f32) -> f32 {
    a + b
}

fn add_d(a: f64, b: f64) -> f64 {
    a + b
}

/// `lse_push` (its `a.y·expf(…) + 1` contracted into an fmaf).
fn lse_push(a: (f32, f32), v: f32) -> (f32, f32) {
    if v > a.0 {
        (v, a.1.mul_add((a.0 - v).exp(), 1.0))
    } else if v != f32::NEG_INFINITY {
        (a.0, a.1 + (v - a.0).exp())
    } else {
        a
    }
}

fn lse_merge(a: (f32, f32), b: (f32, f32)) -> (f32, f32) {
    let m = a.0.max(b.0);
    if m == f32::NEG_INFINITY {
        return (m, a.1 + b.1);
    }
    (m, a.1 * (a.0 - m).exp() + b.1 * (b.0 - m).exp())
}

/// The online log-sum-exp `(m, Σ e^(x − m))` of a row (`lse_row`).
fn lse_row(xr: &[f32], bug: Bug) -> (f32, f32) {
    let skip = (bug == Bug::DropTerm).then(|| argmax(xr)).flatten();
    let init = (f32::NEG_INFINITY, 0.0);
    reduce(xr.len(), init, skip, |a, i| lse_push(a, xr[i]), lse_merge)
}

/// Row `r`'s source of statistics: itself, or under [`Bug::NextRow`] the next row.
fn stat_row(r: usize, rows: usize, bug: Bug) -> usize {
    if bug == Bug::NextRow {
        (r + 1) % rows
    } else {
        r
    }
}

pub fn softmax_fwd(x: &[f32], cols: usize, bug: Bug) -> Vec<f32> {
    let rows = x.len() / cols;
    let stats: Vec<(f32, f32)> = x
        .chunks(cols)
        .map(|xr| {
            let m = xr.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            let skip = (bug == Bug::DropTerm).then(|| argmax(xr)).flatten();
            let sum = reduce(cols, 0.0, skip, |s, i| s + (xr[i] - m).exp(), add);
            (m, 1.0 / sum)
        })
        .collect();
    let mut out = Vec::with_capacity(x.len());
    for (r, xr) in x.chunks(cols).enumerate() {
        let (m, inv) = stats[stat_row(r, rows, bug)];
        out.extend(xr.iter().map(|&v| (v - m).exp() * inv));
    }
    out
}

/// What the two softmax backwards share: per row, the f32 sum of `term` over the row's
/// indices (without the term of the largest `|key|` under [`Bug::DropTerm`]); then each
/// element `out(i, s)` with its row's sum `s` (the next row's under [`Bug::NextRow`], negated
/// under [`Bug::FlipSign`]). Indices are into the whole `[rows, cols]` buffer.
fn row_sum_bwd(
    (rows, cols): (usize, usize),
    bug: Bug,
    key: impl Fn(usize) -> f64,
    term: impl Fn(f32, usize) -> f32,
    out: impl Fn(usize, f32) -> f32,
) -> Vec<f32> {
    let sums: Vec<f32> = (0..rows)
        .map(|r| {
            let at = r * cols;
            let skip = (bug == Bug::DropTerm)
                .then(|| largest(cols, |i| key(at + i)))
                .flatten();
            reduce(cols, 0.0f32, skip, |s, i| term(s, at + i), add)
        })
        .collect();
    let mut res = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        let s = sums[stat_row(r, rows, bug)];
        let s = if bug == Bug::FlipSign { -s } else { s };
        res.extend((r * cols..(r + 1) * cols).map(|i| out(i, s)));
    }
    res
}

pub fn softmax_bwd(y: &[f32], dy: &[f32], cols: usize, bug: Bug) -> Vec<f32> {
    row_sum_bwd(
        (y.len() / cols, cols),
        bug,
        |i| y[i] as f64 * dy[i] as f64,
        |d, i| y[i].mul_add(dy[i], d),
        |i, dot| y[i] * (dy[i] - dot),
    )
}

pub fn log_softmax_fwd(x: &[f32], cols: usize, bug: Bug) -> Vec<f32> {
    let rows = x.len() / cols;
    let stats: Vec<(f32, f32)> = x.chunks(cols).map(|xr| lse_row(xr, bug)).collect();
    let mut out = Vec::with_capacity(x.len());
    for (r, xr) in x.chunks(cols).enumerate() {
        let (m, s) = stats[stat_row(r, rows, bug)];
        let ls = if bug == Bug::FlipSign {
            -s.ln()
        } else {
            s.ln()
        };
        out.extend(xr.iter().map(|&v| (v - m) - ls));
    }
    out
}

pub fn log_softmax_bwd(ly: &[f32], dy: &[f32], cols: usize, bug: Bug) -> Vec<f32> {
    row_sum_bwd(
        (ly.len() / cols, cols),
        bug,
        |i| dy[i] as f64,
        |s, i| s + dy[i],
        |i, s| (-ly[i].exp()).mul_add(s, dy[i]),
    )
}

pub fn cross_entropy_fwd(x: &[f32], t: &[u32], cols: usize, bug: Bug) -> Vec<f32> {
    let rows = t.len();
    let stats: Vec<(f32, f32)> = x.chunks(cols).map(|xr| lse_row(xr, bug)).collect();
    (0..rows)
        .map(|r| {
            let (m, s) = stats[stat_row(r, rows, bug)];
            let t = match bug {
                Bug::OffByOne => (t[r] as usize + 1) % cols,
                _ => t[r] as usize,
            };
            let ls = if bug == Bug::FlipSign {
                -s.ln()
            } else {
                s.ln()
            };
            (m - x[r * cols + t]) + ls
        })
        .collect()
}

pub fn cross_entropy_bwd(x: &[f32], t: &[u32], dl: &[f32], cols: usize, bug: Bug) -> Vec<f32> {
    let rows = t.len();
    let stats: Vec<(f32, f32)> = x.chunks(cols).map(|xr| lse_row(xr, bug)).collect();
    let mut out = Vec::with_capacity(x.len());
    for r in 0..rows {
        let (m, s) = stats[stat_row(r, rows, bug)];
        let inv = 1.0 / s;
        let t = match bug {
            Bug::OffByOne => (t[r] as usize + 1) % cols,
            _ => t[r] as usize,
        };
        for i in 0..cols {
            let mut p = (x[r * cols + i] - m).exp() * inv;
            if i == t {
                p = if bug == Bug::FlipSign {
                    p + 1.0
                } else {
                    p - 1.0
                };
            }
            out.push(p * dl[r]);
        }
    }
    out
}

/// `xhat` of the kernel: `(x − mu − lo)·rs`, halved where `x − mu` overflows.
fn xhat(x: f32, mu: f32, lo: f32, rs: f32) -> f32 {
    let d = x - mu;
    if d.abs() <= f32::MAX {
        (d - lo) * rs
    } else {
        (0.5 * x - 0.5 * mu) * (2.0 * rs)
    }
}

/// LayerNorm's statistics of a row: `(mu, lo, rstd)`, by the f32 path or, when its trust test
/// fails, the f64 path (`layernorm_fwd_row_exact`).
fn layernorm_stats(xr: &[f32], eps: f32, bug: Bug) -> (f32, f32, f32) {
    let cols = xr.len();
    let n = cols as f32;
    let skip = (bug == Bug::DropTerm)
        .then(|| largest(cols, |i| xr[i] as f64))
        .flatten();
    let mu = reduce(cols, 0.0f32, skip, |s, i| s + xr[i], add) / n;
    let q = |s: f32, i: usize| (xr[i] - mu).mul_add(xr[i] - mu, s);
    let var32 = reduce(cols, 0.0f32, None, q, add) / n;
    if var32 >= mu * mu * 9.536_743e-7 && var32 <= 1e37 {
        return (mu, 0.0, 1.0 / (var32 + eps).sqrt());
    }
    let k0 = xr[0] as f64;
    let (s, q) = reduce(
        cols,
        (0.0f64, 0.0f64),
        skip,
        |(s, q), i| {
            let d = xr[i] as f64 - k0;
            (s + d, d.mul_add(d, q))
        },
        |a, b| (a.0 + b.0, a.1 + b.1),
    );
    let n = cols as f64;
    let mud = k0 + s / n;
    let mu = mud as f32;
    let lo = (mud - mu as f64) as f32;
    let var = (q - s * (s / n)) / n;
    let rs = (1.0 / (var.max(0.0) + eps as f64).sqrt()) as f32;
    (mu, lo, rs)
}

/// LayerNorm forward: `(y, mean, rstd)`.
pub fn layernorm_fwd(
    x: &[f32],
    w: &[f32],
    b: &[f32],
    cols: usize,
    eps: f32,
    bug: Bug,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let rows = x.len() / cols;
    let stats: Vec<_> = x
        .chunks(cols)
        .map(|xr| layernorm_stats(xr, eps, bug))
        .collect();
    let mut y = Vec::with_capacity(x.len());
    for (r, xr) in x.chunks(cols).enumerate() {
        let (mu, lo, rs) = stats[stat_row(r, rows, bug)];
        for (i, &v) in xr.iter().enumerate() {
            let xh = xhat(v, mu, lo, rs);
            let xh = if bug == Bug::FlipSign { -xh } else { xh };
            y.push(xh.mul_add(w[i], b[i]));
        }
    }
    let mean = stats.iter().map(|s| s.0).collect();
    let rstd = stats.iter().map(|s| s.2).collect();
    (y, mean, rstd)
}

/// The norm backward's sums over rows (dw, db) in the kernel's order on a GPU of `sms`
/// multiprocessors: group `g` of `G` accumulates rows `g, g + G, …` with `acc(acc, row, col)`,
/// a block adds its groups' accumulators, `norm_colsum_f32` adds the blocks' partials.
fn column_sums(
    rows: usize,
    cols: usize,
    sms: usize,
    acc: impl Fn(f32, usize, usize) -> f32,
) -> Vec<f32> {
    let (threads, _) = row_group(cols);
    let (groups, per_sm) = if cols <= 1024 {
        (4, 8)
    } else {
        (1, (1024 / threads).max(1))
    };
    let blocks = rows.div_ceil(groups).min(sms * per_sm).max(1);
    let g_all = blocks * groups;
    let mut partial = vec![vec![0.0f32; cols]; blocks];
    for (blk, part) in partial.iter_mut().enumerate() {
        let group_acc: Vec<Vec<f32>> = (0..groups)
            .map(|j| {
                let mut a = vec![0.0f32; cols];
                for r in (blk * groups + j..rows).step_by(g_all) {
                    for (c, a) in a.iter_mut().enumerate() {
                        *a = acc(*a, r, c);
                    }
                }
                a
            })
            .collect();
        for (c, p) in part.iter_mut().enumerate() {
            *p = group_acc.iter().fold(0.0f32, |s, a| s + a[c]);
        }
    }
    (0..cols)
        .map(|c| {
            let sh: Vec<f32> = (0..32)
                .map(|ty| {
                    (ty..blocks)
                        .step_by(32)
                        .fold(0.0f32, |s, k| s + partial[k][c])
                })
                .collect();
            sh.iter().fold(0.0f32, |t, &v| t + v)
        })
        .collect()
}

/// The rows the column sums see: all, or under [`Bug::OffByOne`] all but the last.
fn sum_rows(rows: usize, bug: Bug) -> usize {
    if bug == Bug::OffByOne {
        rows.saturating_sub(1)
    } else {
        rows
    }
}

/// LayerNorm backward: `(dx, dw, db)` on a GPU of `sms` multiprocessors, from the input and
/// weight, the saved `(mean, rstd)` and the output gradient of `input`.
pub fn layernorm_bwd(input: NormBwd, sms: usize, bug: Bug) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (x, w, mean, rstd, dy, cols) = (
        input.x, input.w, input.mean, input.rstd, input.dy, input.cols,
    );
    let rows = x.len() / cols;
    let n = cols as f32;
    let xh = |r: usize, i: usize| xhat(x[r * cols + i], mean[r], 0.0, rstd[r]);
    let g = |r: usize, i: usize| dy[r * cols + i] * w[i];
    let stats: Vec<(f32, f32)> = (0..rows)
        .map(|r| {
            let skip = (bug == Bug::DropTerm)
                .then(|| largest(cols, |i| g(r, i) as f64 * xh(r, i) as f64))
                .flatten();
            let push = |s: (f32, f32), i: usize| (s.0 + g(r, i), g(r, i).mul_add(xh(r, i), s.1));
            let s = reduce(cols, (0.0, 0.0), skip, push, |a, b| (a.0 + b.0, a.1 + b.1));
            (s.0 / n, s.1 / n)
        })
        .collect();
    let mut dx = Vec::with_capacity(x.len());
    for r in 0..rows {
        let (m1, m2) = stats[stat_row(r, rows, bug)];
        let m2 = if bug == Bug::FlipSign { -m2 } else { m2 };
        for i in 0..cols {
            dx.push(rstd[r] * (-xh(r, i)).mul_add(m2, g(r, i) - m1));
        }
    }
    let rs = sum_rows(rows, bug);
    let dw = column_sums(rs, cols, sms, |a, r, c| {
        dy[r * cols + c].mul_add(xh(r, c), a)
    });
    let db = column_sums(rs, cols, sms, |a, r, c| a + dy[r * cols + c]);
    (dx, dw, db)
}

/// RMSNorm forward: `(y, rstd)`.
pub fn rmsnorm_fwd(x: &[f32], w: &[f32], cols: usize, eps: f32, bug: Bug) -> (Vec<f32>, Vec<f32>) {
    let rows = x.len() / cols;
    let (_, v) = row_group(cols);
    let rstd: Vec<f32> = x
        .chunks(cols)
        .map(|xr| {
            let skip = (bug == Bug::DropTerm)
                .then(|| largest(cols, |i| xr[i] as f64))
                .flatten();
            // V f64 accumulators per lane, added in order, then the group sum.
            let parts = lane_elems(cols)
                .iter()
                .map(|es| {
                    let mut q = [0.0f64; 4];
                    for &i in es.iter().filter(|&&i| Some(i) != skip) {
                        let k = i % v;
                        q[k] = (xr[i] as f64).mul_add(xr[i] as f64, q[k]);
                    }
                    q[..v].iter().skip(1).fold(q[0], |a, &b| a + b)
                })
                .collect();
            let q = group(parts, 0.0, add_d);
            (1.0 / (q / cols as f64 + eps as f64).sqrt()) as f32
        })
        .collect();
    let mut y = Vec::with_capacity(x.len());
    for (r, xr) in x.chunks(cols).enumerate() {
        let rs = rstd[stat_row(r, rows, bug)];
        let rs = if bug == Bug::FlipSign { -rs } else { rs };
        y.extend(xr.iter().zip(w).map(|(&v, &g)| v * rs * g));
    }
    (y, rstd)
}

/// RMSNorm backward: `(dx, dw)` on a GPU of `sms` multiprocessors (`input.mean` unused).
pub fn rmsnorm_bwd(input: NormBwd, sms: usize, bug: Bug) -> (Vec<f32>, Vec<f32>) {
    let (x, w, rstd, dy, cols) = (input.x, input.w, input.rstd, input.dy, input.cols);
    let rows = x.len() / cols;
    let xh = |r: usize, i: usize| x[r * cols + i] * rstd[r];
    let g = |r: usize, i: usize| dy[r * cols + i] * w[i];
    let coefs: Vec<f32> = (0..rows)
        .map(|r| {
            let skip = (bug == Bug::DropTerm)
                .then(|| largest(cols, |i| g(r, i) as f64 * xh(r, i) as f64))
                .flatten();
            reduce(cols, 0.0f32, skip, |s, i| g(r, i).mul_add(xh(r, i), s), add) / cols as f32
        })
        .collect();
    let mut dx = Vec::with_capacity(x.len());
    for r in 0..rows {
        let c = coefs[stat_row(r, rows, bug)];
        let c = if bug == Bug::FlipSign { -c } else { c };
        for i in 0..cols {
            dx.push(rstd[r] * (-xh(r, i)).mul_add(c, g(r, i)));
        }
    }
    let rs = sum_rows(rows, bug);
    let dw = column_sums(rs, cols, sms, |a, r, c| {
        dy[r * cols + c].mul_add(xh(r, c), a)
    });
    (dx, dw)
}

#[cfg(test)]
mod mirror_tests;
#[cfg(test)]
mod tests;
