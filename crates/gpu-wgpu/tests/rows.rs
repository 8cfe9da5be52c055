//! The fused LayerNorm forward against the CPU reference (f64 statistics, one rounding), on
//! fresh random rows (the seed is printed; replay with `HYBRID_TEST_SEED`) of widths around
//! the kernel's 64 threads, and hostile rows: a NaN (its row NaN, the others untouched), a
//! constant row (variance 0: rstd = 1/sqrt(eps), y = b) and a huge value (an |x − mean| past
//! ~1.8e19 squares to inf in f32: rstd 0, as in the default's f32 chain). Without an adapter
//! it prints `SKIP` and returns (fails with `HYBRID_REQUIRE_WGPU=1`).

mod common;

use common::{backend_and_rng, close, randn, U};
use gpu_core::nn::rows::{LayerNormBwdIn, LogitsIn, RowBwdIn};
use gpu_core::nn::RowOps;
use gpu_core::{CpuBackend, DType};

/// (rows, cols): widths around the kernels' 64 threads a row, long rows, many short rows; no
/// rows at all; more rows than one grid dimension holds (65,535 workgroups); one huge row.
const SHAPES: [(usize, usize); 10] = [
    (0, 5),
    (70_000, 3),
    (1, 300_000),
    (1, 1),
    (3, 63),
    (2, 64),
    (4, 65),
    (2, 384),
    (3, 1000),
    (300, 40),
];

/// `(y, mean, rstd)` of LayerNorm on `b`.
fn layernorm<B: RowOps>(b: &B, x: &[f32], w: &[f32], bias: &[f32]) -> [Vec<f32>; 3] {
    let (cols, rows) = (w.len(), x.len() / w.len());
    let mut y = b.allocate(DType::F32, x.len()).unwrap();
    let mut mean = b.allocate(DType::F32, rows).unwrap();
    let mut rstd = b.allocate(DType::F32, rows).unwrap();
    let (xb, wb, bb) = (
        b.upload(x).unwrap(),
        b.upload(w).unwrap(),
        b.upload(bias).unwrap(),
    );
    b.layernorm_fwd((&xb, &wb, &bb), (&mut y, &mut mean, &mut rstd), cols, 1e-5)
        .unwrap();
    [&y, &mean, &rstd].map(|t| b.download::<f32>(t).unwrap())
}

#[test]
fn fused_layernorm_matches_the_cpu() {
    let Some((g, mut r)) = backend_and_rng("fused_layernorm_matches_the_cpu") else {
        return;
    };
    for (rows, cols) in SHAPES {
        let mut x = randn(&mut r, rows * cols, 3.0);
        let (w, bias) = (randn(&mut r, cols, 2.0), randn(&mut r, cols, 1.0));
        if rows >= 3 {
            x[0] = f32::NAN; // row 0
            x[cols..2 * cols].fill(0.75); // row 1: variance 0
            x[2 * cols] = 1e15; // row 2: one huge value (its square still an f32)
        }
        let got = layernorm(&g, &x, &w, &bias);
        let want = layernorm(&CpuBackend, &x, &w, &bias);
        for row in 0..rows {
            let xr = &x[row * cols..][..cols];
            let amax = xr.iter().fold(0.0f64, |a, &v| a.max((v as f64).abs()));
            let rs = want[2][row] as f64;
            // Bound: the f32 sums of the mean and the variance (n·2^-24 of their terms), carried
            // through rstd into x̂ (|x − mean| ≤ 2·max|x|), plus a few roundings of y.
            let k = 4.0 * (cols as f64 + 8.0) * U;
            assert!(
                close(got[1][row], want[1][row] as f64, k * amax),
                "{rows}x{cols} mean[{row}]: {} against {}",
                got[1][row],
                want[1][row]
            );
            assert!(
                close(got[2][row], rs, k * rs),
                "{rows}x{cols} rstd[{row}]: {} against {rs}",
                got[2][row]
            );
            for c in 0..cols {
                let tol = k * (2.0 * amax * rs * (w[c] as f64).abs() + (bias[c] as f64).abs());
                let (a, e) = (got[0][row * cols + c], want[0][row * cols + c]);
                assert!(
                    close(a, e as f64, tol),
                    "{rows}x{cols} y[{row}, {c}]: {a} against {e}"
                );
            }
        }
        if rows >= 3 {
            assert!(got[0][..cols].iter().all(|v| v.is_nan()), "the NaN row");
            // The constant row is b within the bound above, not exactly: WGSL's division may
            // be 2.5 ulp off (NVIDIA's is), so its mean may miss 0.75 by an ulp, and that
            // difference, times rstd = 1/sqrt(eps), reaches y.
        }
    }
}

/// `(dx, dw, db)` of LayerNorm's backward on `b` from the saved `mean` and `rstd`.
fn layernorm_bwd<B: RowOps>(b: &B, [x, w, mean, rstd, dy]: [&[f32]; 5]) -> [Vec<f32>; 3] {
    let cols = w.len();
    let up = |v: &[f32]| b.upload(v).unwrap();
    let (xb, wb, mb, rb, dyb) = (up(x), up(w), up(mean), up(rstd), up(dy));
    let mut dx = b.allocate(DType::F32, x.len()).unwrap();
    let mut dw = b.allocate(DType::F32, cols).unwrap();
    let mut db = b.allocate(DType::F32, cols).unwrap();
    let input = LayerNormBwdIn {
        x: &xb,
        w: &wb,
        mean: &mb,
        rstd: &rb,
        dy: &dyb,
    };
    b.layernorm_bwd(input, (&mut dx, &mut dw, &mut db), cols)
        .unwrap();
    [&dx, &dw, &db].map(|t| b.download::<f32>(t).unwrap())
}

#[test]
fn fused_layernorm_backward_matches_the_cpu() {
    let Some((g, mut r)) = backend_and_rng("fused_layernorm_backward_matches_the_cpu") else {
        return;
    };
    for (rows, cols) in SHAPES {
        let x = randn(&mut r, rows * cols, 3.0);
        let dy = randn(&mut r, rows * cols, 1.0);
        let (w, bias) = (randn(&mut r, cols, 2.0), randn(&mut r, cols, 1.0));
        let [_, mean, rstd] = layernorm(&CpuBackend, &x, &w, &bias);
        let args = [&x[..], &w, &mean, &rstd, &dy];
        let got = layernorm_bwd(&g, args);
        let want = layernorm_bwd(&CpuBackend, args);
        // Bound: f32 sums of n terms (n·2^-24 of the sum of their magnitudes, four times over
        // for the products and the two row means), against the CPU's f64.
        let k = |n: usize| 4.0 * (n as f64 + 8.0) * U;
        let xhat = |i: usize| ((x[i] - mean[i / cols]) * rstd[i / cols]) as f64;
        for row in 0..rows {
            let rs = rstd[row] as f64;
            let gmax = (0..cols).fold(0.0f64, |a, c| {
                a.max((dy[row * cols + c] as f64 * w[c] as f64).abs())
            });
            let xmax = (0..cols).fold(0.0f64, |a, c| a.max(xhat(row * cols + c).abs()));
            let tol = k(cols) * rs * gmax * (2.0 + 2.0 * xmax * xmax);
            for c in 0..cols {
                let i = row * cols + c;
                assert!(
                    close(got[0][i], want[0][i] as f64, tol),
                    "{rows}x{cols} dx[{row}, {c}]: {} against {}",
                    got[0][i],
                    want[0][i]
                );
            }
        }
        for c in 0..cols {
            let sw: f64 = (0..rows)
                .map(|r| (dy[r * cols + c] as f64 * xhat(r * cols + c)).abs())
                .sum();
            let sb: f64 = (0..rows).map(|r| (dy[r * cols + c] as f64).abs()).sum();
            assert!(
                close(got[1][c], want[1][c] as f64, k(rows) * sw),
                "{rows}x{cols} dw[{c}]"
            );
            assert!(
                close(got[2][c], want[2][c] as f64, k(rows) * sb),
                "{rows}x{cols} db[{c}]"
            );
        }
    }
}

/// Cross-entropy's loss and gradient on `b`; `None` where the call is refused.
fn cross_entropy<B: RowOps>(
    b: &B,
    (x, cols): (&[f32], usize),
    t: &[u32],
    dl: &[f32],
) -> Option<[Vec<f32>; 2]> {
    let rows = t.len();
    let (xb, tb, db) = (
        b.upload(x).unwrap(),
        b.upload(t).unwrap(),
        b.upload(dl).unwrap(),
    );
    let mut loss = b.upload(&vec![7.0f32; rows]).unwrap();
    let mut d = b.upload(&vec![7.0f32; x.len()]).unwrap();
    let fwd = b.cross_entropy_fwd(LogitsIn::new(&xb, &tb, cols), &mut loss);
    let bwd = b.cross_entropy_bwd(LogitsIn::new(&xb, &tb, cols), &db, &mut d);
    if fwd.is_err() || bwd.is_err() {
        // The CPU refuses the call: it writes nothing.
        assert!(fwd.is_err() && bwd.is_err(), "{fwd:?} {bwd:?}");
        let got = [&loss, &d].map(|t| b.download::<f32>(t).unwrap());
        assert!(got.iter().all(|v| v.iter().all(|&e| e == 7.0)));
        return None;
    }
    // wgpu checks on the device: the next wait reports the first bad launch (the forward),
    // and each bad target's row is NaN in both outputs.
    if let Err(e) = b.synchronize() {
        assert!(
            matches!(
                e,
                gpu_core::GpuError::IndexOutOfRange {
                    op: "cross_entropy_fwd",
                    what: "targets",
                    ..
                }
            ),
            "{e}"
        );
        let got = [&loss, &d].map(|t| b.download::<f32>(t).unwrap());
        for (r, _) in t.iter().enumerate().filter(|(_, &v)| v as usize >= cols) {
            assert!(got[0][r].is_nan());
            assert!(got[1][r * cols..(r + 1) * cols].iter().all(|v| v.is_nan()));
        }
        return None;
    }
    Some([&loss, &d].map(|t| b.download::<f32>(t).unwrap()))
}

/// The fused cross-entropy (forward and backward) against the CPU, with hostile rows (NaN,
/// +inf: NaN loss and gradient as on the CPU; huge finite logits; −inf at the target: loss
/// +inf, the gradient finite) and an out-of-range target (refused by both passes, nothing
/// written).
#[test]
fn fused_cross_entropy_matches_the_cpu() {
    let Some((g, mut r)) = backend_and_rng("fused_cross_entropy_matches_the_cpu") else {
        return;
    };
    for (rows, cols) in SHAPES {
        let mut x = randn(&mut r, rows * cols, 4.0);
        let t: Vec<u32> = (0..rows).map(|i| ((i * 7919 + 3) % cols) as u32).collect();
        let dl = randn(&mut r, rows, 1.0);
        if rows >= 3 {
            x[1] = f32::NAN; // row 0
            x[cols + 2] = f32::INFINITY; // row 1
            x[2 * cols..3 * cols].iter_mut().for_each(|v| *v *= 1e29); // row 2: huge
        }
        if rows >= 4 {
            x[3 * cols + t[3] as usize] = f32::NEG_INFINITY; // row 3: the target impossible
        }
        let got = cross_entropy(&g, (&x, cols), &t, &dl).unwrap();
        let want = cross_entropy(&CpuBackend, (&x, cols), &t, &dl).unwrap();
        if rows >= 4 {
            assert_eq!((got[0][3], want[0][3]), (f32::INFINITY, f32::INFINITY));
        }
        // Bound: the f32 sum of cols exponentials (each within 3 + 2|x − max| ulp, |x − max|
        // at most 8 here) and a log: (4·(cols + 8) + 64)·2^-24 relative, of the loss's terms
        // and of each probability.
        let k = (4.0 * (cols as f64 + 8.0) + 64.0) * U;
        for row in 0..rows {
            if rows >= 3 && row < 2 {
                assert!(got[0][row].is_nan() && want[0][row].is_nan(), "row {row}");
                assert!(got[1][row * cols..][..cols].iter().all(|v| v.is_nan()));
                continue;
            }
            let xt = x[row * cols + t[row] as usize] as f64;
            let lse = want[0][row] as f64 + xt;
            let tol = k * (1.0 + lse.abs() + xt.abs());
            assert!(
                close(got[0][row], want[0][row] as f64, tol),
                "{rows}x{cols} loss[{row}]: {} against {}",
                got[0][row],
                want[0][row]
            );
            for c in 0..cols {
                let i = row * cols + c;
                let onehot = if c == t[row] as usize { 1.0 } else { 0.0 };
                let p = if dl[row] == 0.0 {
                    1.0
                } else {
                    want[1][i] as f64 / dl[row] as f64 + onehot
                };
                let tol = k * (p.abs() + onehot + 1e-30) * (dl[row] as f64).abs();
                assert!(
                    close(got[1][i], want[1][i] as f64, tol),
                    "{rows}x{cols} dlogits[{row}, {c}]: {} against {} (tol {tol}, p {p}, dl {})",
                    got[1][i],
                    want[1][i],
                    dl[row]
                );
            }
        }
        // A target equal to cols is refused by both passes, on both backends.
        if rows > 0 {
            let mut bad = t.clone();
            bad[rows - 1] = cols as u32;
            assert!(cross_entropy(&g, (&x, cols), &bad, &dl).is_none());
            assert!(cross_entropy(&CpuBackend, (&x, cols), &bad, &dl).is_none());
        }
    }
}

/// Softmax forward and backward on `b`: `(y, dx)`.
fn softmax<B: RowOps>(b: &B, (x, dy): (&[f32], &[f32]), cols: usize) -> [Vec<f32>; 2] {
    let (xb, dyb) = (b.upload(x).unwrap(), b.upload(dy).unwrap());
    let mut y = b.allocate(DType::F32, x.len()).unwrap();
    b.softmax_fwd(&xb, &mut y, cols).unwrap();
    let mut dx = b.allocate(DType::F32, x.len()).unwrap();
    b.softmax_bwd(RowBwdIn { y: &y, dy: &dyb }, &mut dx, cols)
        .unwrap();
    [&y, &dx].map(|t| b.download::<f32>(t).unwrap())
}

/// The fused softmax (forward, and backward from the forward's output) against the CPU, with
/// hostile rows: a NaN, a +inf, a row of −inf (each row NaN, as the CPU's), −inf entries
/// (probability 0) and huge finite logits.
#[test]
fn fused_softmax_matches_the_cpu() {
    let Some((g, mut r)) = backend_and_rng("fused_softmax_matches_the_cpu") else {
        return;
    };
    // Beside SHAPES, the register-held kernels' edges: a full row of 64 threads (512), the
    // first of 256 threads (513), a full one (4096) and the first streamed past it (4097).
    let edges = [(5, 512), (5, 513), (6, 4096), (5, 4097)];
    for (rows, cols) in SHAPES.into_iter().chain(edges) {
        let mut x = randn(&mut r, rows * cols, 4.0);
        let dy = randn(&mut r, rows * cols, 1.0);
        let poisoned = if rows >= 5 { 3 } else { 0 };
        if rows >= 5 {
            x[0] = f32::NAN; // row 0
            x[cols] = f32::INFINITY; // row 1
            x[2 * cols..3 * cols].fill(f32::NEG_INFINITY); // row 2
            x[3 * cols] = f32::NEG_INFINITY; // row 3: one impossible entry
            x[4 * cols..5 * cols].iter_mut().for_each(|v| *v *= 1e29); // row 4: huge
        }
        let got = softmax(&g, (&x, &dy), cols);
        let want = softmax(&CpuBackend, (&x, &dy), cols);
        // Bound: as cross-entropy's, (4·(cols + 8) + 64)·2^-24 relative of each probability;
        // the backward's row sum Σ dy·y adds that of Σ|dy·y| to each |y|·(|dy| + Σ|dy·y|).
        let k = (4.0 * (cols as f64 + 8.0) + 64.0) * U;
        for row in 0..rows {
            let span = row * cols..(row + 1) * cols;
            if row < poisoned {
                assert!(got[0][span.clone()].iter().all(|v| v.is_nan()), "row {row}");
                assert!(want[0][span].iter().all(|v| v.is_nan()), "row {row} (CPU)");
                continue;
            }
            let sum: f64 = span
                .clone()
                .map(|i| (dy[i] as f64 * want[0][i] as f64).abs())
                .sum();
            for i in span {
                let p = want[0][i] as f64;
                assert!(
                    close(got[0][i], p, k * p.abs()),
                    "{rows}x{cols} y[{i}]: {} against {p}",
                    got[0][i]
                );
                let tol = 2.0 * k * p.abs() * ((dy[i] as f64).abs() + sum);
                assert!(
                    close(got[1][i], want[1][i] as f64, tol),
                    "{rows}x{cols} dx[{i}]: {} against {}",
                    got[1][i],
                    want[1][i]
                );
            }
        }
    }
}
