//! The fused correction kernel (`gpu_cuda::lowrank`) against its f64 reference on fresh random
//! inputs (seed printed), its check-then-write contract on hostile values, and its typed
//! errors. Tests named `gpu_*` skip with a printed reason without a GPU.

mod common;

use common::*;
use gpu_core::testing::same_bits;
use gpu_core::{Backend, DType};
use gpu_cuda::lowrank::{lowrank_add_reference, LOWRANK_NONFINITE_SUM, LOWRANK_NONFINITE_W};
use gpu_cuda::testing::backend_or_skip;
use gpu_cuda::CudaBackend;

/// f32 unit roundoff.
const U: f64 = f32::EPSILON as f64 / 2.0;

/// Runs the kernel on host data; returns W afterwards and the flag.
fn run(
    gpu: &CudaBackend,
    (m, n, k): (usize, usize, usize),
    w: &[f32],
    u: &[f32],
    s: &[f32],
    v: &[f32],
) -> (Vec<f32>, u32) {
    let mut wb = up(gpu, w);
    let (ub, sb, vb) = (up(gpu, u), up(gpu, s), up(gpu, v));
    let mut flag = gpu.upload(&[0xdead_beefu32]).unwrap();
    gpu.lowrank_add((m, n, k), &mut wb, &ub, &sb, &vb, &mut flag)
        .unwrap();
    (down(gpu, &wb), gpu.download::<u32>(&flag).unwrap()[0])
}

#[test]
fn gpu_lowrank_add_matches_its_reference_within_the_summation_bound() {
    let (gpu, mut r) = skip_unless!(gpu_and_rng(
        "gpu_lowrank_add_matches_its_reference_within_the_summation_bound"
    ));
    // Tile edges (64), ranks 1 and 64, one row, one column.
    for (m, n, k) in [
        (64, 64, 64),
        (65, 63, 7),
        (1, 300, 3),
        (300, 1, 2),
        (130, 70, 1),
    ] {
        let w = random_vec(&mut r, m * n, 3.0);
        let u = random_vec(&mut r, m * k, 1.0);
        let s = random_vec(&mut r, k, 2.0);
        let v = random_vec(&mut r, n * k, 1.0);
        let (got, flag) = run(&gpu, (m, n, k), &w, &u, &s, &v);
        let (want, wf) = lowrank_add_reference((m, n, k), &w, &u, &s, &v);
        assert_eq!((flag, wf), (0, 0), "{m}×{n} k {k}");
        // f32 products (u·s rounded as in the reference, then k products and sums) against
        // the f64 sum: (k + 2)·u times the magnitudes of the terms, plus the final rounding.
        for i in 0..m {
            for j in 0..n {
                let mag = f64::from(w[i * n + j]).abs()
                    + (0..k)
                        .map(|t| (f64::from(u[i * k + t] * s[t]) * f64::from(v[j * k + t])).abs())
                        .sum::<f64>();
                let err = (f64::from(got[i * n + j]) - f64::from(want[i * n + j])).abs();
                let bound = (k as f64 + 3.0) * U * mag;
                assert!(
                    err <= bound,
                    "{m}×{n} k {k} ({i}, {j}): {err:e} > {bound:e}"
                );
            }
        }
    }
}

#[test]
fn gpu_lowrank_add_leaves_w_untouched_when_any_entry_fails() {
    let (gpu, mut r) = skip_unless!(gpu_and_rng(
        "gpu_lowrank_add_leaves_w_untouched_when_any_entry_fails"
    ));
    let (m, n, k) = (100, 90, 4);
    let w0 = random_vec(&mut r, m * n, 1.0);
    let u0 = random_vec(&mut r, m * k, 1.0);
    let s0 = random_vec(&mut r, k, 1.0);
    let v0 = random_vec(&mut r, n * k, 1.0);
    // NaN or ±inf in W (one entry in the last tile): bit 1 (and bit 2), nothing written.
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut w = w0.clone();
        w[m * n - 1] = bad;
        let (got, flag) = run(&gpu, (m, n, k), &w, &u0, &s0, &v0);
        assert!(flag & LOWRANK_NONFINITE_W != 0, "{bad}: flag {flag}");
        assert!(same_bits(&got, &w), "{bad}: W changed");
    }
    // NaN in a factor, or a sum past f32's range in one entry: bit 2, nothing written.
    let mut u = u0.clone();
    u[3] = f32::NAN;
    let (got, flag) = run(&gpu, (m, n, k), &w0, &u, &s0, &v0);
    assert_eq!(flag, LOWRANK_NONFINITE_SUM);
    assert!(same_bits(&got, &w0));
    let mut w = w0.clone();
    w[5 * n + 7] = 3.0e38;
    let mut u = u0.clone();
    let mut v = v0.clone();
    u[5 * k..6 * k].fill(1.0e19);
    v[7 * k..8 * k].fill(1.0e19);
    let s = vec![1.0f32; k];
    let (got, flag) = run(&gpu, (m, n, k), &w, &u, &s, &v);
    assert_eq!(flag, LOWRANK_NONFINITE_SUM, "an overflowing entry");
    assert!(same_bits(&got, &w));
    // Large but finite everywhere: written, flag clear; the reference agrees.
    u[5 * k..6 * k].fill(1.0e17);
    let (got, flag) = run(&gpu, (m, n, k), &w, &u, &s, &v);
    let (want, wf) = lowrank_add_reference((m, n, k), &w, &u, &s, &v);
    assert_eq!((flag, wf), (0, 0));
    assert!(got.iter().all(|x| x.is_finite()));
    assert!((f64::from(got[5 * n + 7]) / f64::from(want[5 * n + 7]) - 1.0).abs() < 1e-5);
    // Denormals and signed zeros pass through a zero correction unchanged.
    let w = vec![f32::from_bits(1), -0.0, 0.0, -f32::from_bits(3)];
    let (got, flag) = run(&gpu, (2, 2, 1), &w, &[0.0, 0.0], &[1.0], &[0.0, 0.0]);
    assert_eq!(flag, 0);
    assert_eq!(got[0].to_bits(), w[0].to_bits());
    assert_eq!(got[3].to_bits(), w[3].to_bits());
}

#[test]
fn gpu_lowrank_add_rejects_bad_arguments_before_queueing() {
    let gpu = skip_unless!(backend_or_skip(
        "gpu_lowrank_add_rejects_bad_arguments_before_queueing"
    ));
    let mut w = gpu.allocate(DType::F32, 12).unwrap();
    let u = gpu.allocate(DType::F32, 3 * 65).unwrap();
    let s = gpu.allocate(DType::F32, 65).unwrap();
    let v = gpu.allocate(DType::F32, 4 * 65).unwrap();
    let mut flag = gpu.allocate(DType::U32, 1).unwrap();
    for dims in [
        (3, 4, 0),
        (3, 4, 65),
        (4, 4, 2),
        (3, 5, 2),
        (usize::MAX, 2, 1),
    ] {
        assert!(
            gpu.lowrank_add(dims, &mut w, &u, &s, &v, &mut flag)
                .is_err(),
            "{dims:?}"
        );
    }
    let mut not_u32 = gpu.allocate(DType::F32, 1).unwrap();
    assert!(gpu
        .lowrank_add((3, 4, 2), &mut w, &u, &s, &v, &mut not_u32)
        .is_err());
    let other = CudaBackend::new(0).unwrap();
    let foreign = other.allocate(DType::F32, 3 * 2).unwrap();
    assert!(gpu
        .lowrank_add((3, 4, 2), &mut w, &foreign, &s, &v, &mut flag)
        .is_err());
}
