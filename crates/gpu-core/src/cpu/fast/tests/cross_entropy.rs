//! Fast cross-entropy against the exact reference, through the backend in both modes.

use super::{at_every_level, check, hostile_mix, normal, seed, U};
use crate::cpu::fast::{softmax, with_mode, CpuMode};
use crate::cpu::{CpuBackend, CpuStorage};
use crate::nn::rows::LogitsIn;
use crate::nn::RowOps;
use crate::Backend;
use rand::{rngs::StdRng, Rng, SeedableRng};

/// `[loss, dlogits]` of the backend in `mode`.
fn run(x: &[f32], t: &[u32], dl: &[f32], cols: usize, mode: CpuMode) -> [Vec<f32>; 2] {
    let cpu = CpuBackend;
    with_mode(mode, || {
        let (xs, ts, dls) = (
            cpu.upload(x).unwrap(),
            cpu.upload(t).unwrap(),
            cpu.upload(dl).unwrap(),
        );
        let z = |len| cpu.allocate(crate::DType::F32, len).unwrap();
        let (mut loss, mut dx) = (z(t.len()), z(x.len()));
        cpu.cross_entropy_fwd(LogitsIn::new(&xs, &ts, cols), &mut loss)
            .unwrap();
        cpu.cross_entropy_bwd(LogitsIn::new(&xs, &ts, cols), &dls, &mut dx)
            .unwrap();
        let v = |s: &CpuStorage| s.as_f32().unwrap().to_vec();
        [v(&loss), v(&dx)]
    })
}

/// Bounds, from f64 values of the inputs: with `a_c = max − x_c`, each term `exp(−a_c)` is
/// off by a relative `8u` (exp's 4 ulp) plus `u·a_c` (the rounded subtraction), so the sum of
/// the row's `n` terms (at least 1, the max's term) is off by a relative
/// `ε_s = (2n + 8)·u` (`n·u` for the summation, `u·Σ a_c e^(−a_c) <= n·u/e`).
/// loss `= a_t + ln Σ`: `ε_s + 2u·(|ln Σ| + a_t + |loss|)` (ln's ulp, the two roundings) plus
/// `8u` slack for second-order terms. dlogit `= (p_c − [c = t])·g`, `p_c = e_c/Σ` off by a
/// relative `ε_p = 8u + u·a_c + ε_s + u`: `|g|·(p_c·ε_p + u·|p_c − [c = t]|) + u·|out|`, plus
/// `1e-38` for results in f32's subnormal range (exp's bound there is 2 subnormal steps).
#[test]
fn cross_entropy_matches_the_exact_reference() {
    let mut rng = StdRng::seed_from_u64(seed("cross_entropy_matches_the_exact_reference"));
    for (rows, cols) in [(0, 5), (1, 1), (9, 65), (3, 300), (2, 11)] {
        let n = rows * cols;
        let mut x = normal(&mut rng, n, 0.0, 3.0);
        if rows == 2 {
            // A row of hostile values (NaN, ±inf, ±1e30, subnormal) and a row of -inf.
            x = hostile_mix(&mut rng, 0, 1.0);
            x.extend(std::iter::repeat_n(f32::NEG_INFINITY, cols));
        }
        if rows == 9 {
            // Rows where one logit dominates, or with huge and subnormal values.
            x[3] = 1e30;
            x[cols + 1] = -1e30;
            x[2 * cols + 4] = f32::MIN_POSITIVE / 4.0;
            x[3 * cols + 7] = f32::NEG_INFINITY;
            x[4 * cols] = 60.0;
        }
        let t: Vec<u32> = (0..rows)
            .map(|_| rng.random_range(0..cols as u32))
            .collect();
        let dl = normal(&mut rng, rows, 0.0, 1.0);
        let (fast, exact) = (
            run(&x, &t, &dl, cols, CpuMode::Fast),
            run(&x, &t, &dl, cols, CpuMode::Exact),
        );
        let what = format!("cross-entropy {rows}x{cols}");
        let nf = cols as f64;
        let eps_s = (2.0 * nf + 8.0) * U;
        let stats = |r: usize| {
            let xr = &x[r * cols..(r + 1) * cols];
            let max = xr.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
            let sum: f64 = xr.iter().map(|&v| (v as f64 - max).exp()).sum();
            (max, sum)
        };
        let e = |k: usize| -> Vec<f64> { exact[k].iter().map(|&v| v as f64).collect() };
        let loss = e(0);
        check(&format!("{what} loss"), &fast[0], &loss, |r| {
            let (max, sum) = stats(r);
            let at = max - x[r * cols + t[r] as usize] as f64;
            eps_s + 2.0 * U * (sum.ln().abs() + at + loss[r].abs()) + 8.0 * U
        });
        let dx = e(1);
        check(&format!("{what} dlogits"), &fast[1], &dx, |i| {
            let (r, c) = (i / cols, i % cols);
            let (max, sum) = stats(r);
            let a = max - x[i] as f64;
            let p = (-a).exp() / sum;
            let one = if c == t[r] as usize { 1.0 } else { 0.0 };
            let eps_p = 8.0 * U + U * a + eps_s + U;
            // p = 0 (a logit of -inf, or e^(−a) below f64's range): the term is exactly 0.
            let pe = if p == 0.0 { 0.0 } else { p * eps_p };
            (dl[r] as f64).abs() * (pe + U * (p - one).abs()) + U * dx[i].abs() + 1e-38
        });
    }
}

/// The cross-entropy kernels give the same bits at every level (the backend uses the best).
#[test]
fn cross_entropy_levels_agree_bit_for_bit() {
    let mut rng = StdRng::seed_from_u64(seed("cross_entropy_levels_agree_bit_for_bit"));
    let (rows, cols) = (7, 37);
    let x = normal(&mut rng, rows * cols, 0.0, 4.0);
    let t: Vec<u32> = (0..rows)
        .map(|_| rng.random_range(0..cols as u32))
        .collect();
    let dl = normal(&mut rng, rows, 0.0, 1.0);
    at_every_level("cross-entropy", |isa| {
        let (mut loss, mut dx) = (vec![0.0; rows], vec![0.0; rows * cols]);
        softmax::cross_entropy_fwd(isa, &x, &t, &mut loss, cols);
        softmax::cross_entropy_bwd(isa, &x, &t, &dl, &mut dx, cols);
        [loss, dx].concat()
    });
}
