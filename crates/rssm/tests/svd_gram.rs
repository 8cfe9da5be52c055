//! `SvdMethod::Gram` on every device (the CPU, then CUDA where present) against the f64 SVD,
//! with the bounds of `rssm::svd_gram`'s docs, and the device-side `LowRank::entry_bound`
//! against the host's. Random cases print their seed (`HYBRID_TEST_SEED` replays).

mod common;
use common::with_spectrum;
use nalgebra::{DMatrix, DVector};
use rand::{rngs::StdRng, Rng, SeedableRng};
use rssm::svd::exact_svd;
use rssm::{AcceleratorError, GpuAccelerator, LowRank, SvdMethod, SvdOptions};
use tensor_ops::ndarray::{Array1, Array2};
use tensor_ops::{Device, Tensor};

/// f32 unit roundoff.
const U: f64 = f32::EPSILON as f64 / 2.0;

fn gram() -> SvdOptions {
    SvdOptions {
        method: SvdMethod::Gram,
        ..SvdOptions::default()
    }
}

fn tensor(a: &DMatrix<f64>, d: Device) -> Tensor {
    let x = Array2::from_shape_fn(a.shape(), |(i, j)| a[(i, j)] as f32);
    Tensor::from_ndarray(&x, d).unwrap()
}

fn f64m(x: &Array2<f32>) -> DMatrix<f64> {
    DMatrix::from_fn(x.nrows(), x.ncols(), |i, j| f64::from(x[(i, j)]))
}

/// `‖A − U·diag(S)·Vᵀ‖_F` in f64 from the f32 factors.
fn residual(a: &DMatrix<f64>, c: &LowRank) -> f64 {
    let h = c.host().unwrap();
    let s = DMatrix::from_diagonal(&DVector::from_iterator(
        c.rank(),
        h.s.iter().map(|&x| f64::from(x)),
    ));
    (a - f64m(&h.u) * s * f64m(&h.v).transpose()).norm()
}

fn devices(test: &str) -> Vec<(Device, StdRng)> {
    let seed = gpu_cuda::testing::test_seed(test);
    gpu_cuda::testing::devices(test)
        .into_iter()
        .map(|d| (d, StdRng::seed_from_u64(seed)))
        .collect()
}

/// A history-like matrix (8 × 4000, decaying spectrum from 1 to 1e-2, scaled by 1e-3 as
/// updates are): the rank-3 error is within 1.1× of Eckart–Young; the singular values match
/// to the stated bound `m·u·σ₁²/σᵢ` (plus the f32 rounding of the input, `u·σ₁·√m`); both
/// orientations.
#[test]
fn gram_svd_is_near_optimal_on_short_wide_and_tall_matrices() {
    for (d, mut r) in devices("gram_svd_is_near_optimal_on_short_wide_and_tall_matrices") {
        let acc = GpuAccelerator::new(d).unwrap();
        let sigma: Vec<f64> = (0..8)
            .map(|j| 1e-3 * 10f64.powf(-2.0 * j as f64 / 7.0))
            .collect();
        let wide = with_spectrum(&mut r, 8, 4000, &sigma);
        for a in [wide.clone(), wide.transpose()] {
            let a = a.map(|x| x as f32 as f64); // what the device holds
            let exact = exact_svd(&a, 8).unwrap();
            let k = 3;
            let c = acc.compress_residuals(&tensor(&a, d), k, &gram()).unwrap();
            assert_eq!(c.shape(), a.shape());
            let best: f64 = exact.s().iter().skip(k).map(|s| s * s).sum::<f64>().sqrt();
            let err = residual(&a, &c);
            assert!(err <= 1.1 * best, "{d}: {err:e} vs optimal {best:e}");
            let s = c.s().to_vec().unwrap();
            let s1 = exact.s()[0];
            for (i, &got) in s.iter().enumerate().take(k) {
                let si = exact.s()[i];
                let bound = 8.0 * U * s1 * s1 / si + 8.0 * U * s1 * 8f64.sqrt();
                assert!(
                    (f64::from(got) - si).abs() <= bound,
                    "{d}: σ{i} {got} vs {si:e} (bound {bound:e})"
                );
            }
        }
    }
}

/// An exactly rank-2 matrix is recovered; the directions below the noise level come back as
/// σ = 0 with zero columns (no NaN, no garbage); a zero matrix gives all zeros.
#[test]
fn gram_svd_recovers_low_rank_and_zeroes_the_noise_directions() {
    for (d, mut r) in devices("gram_svd_recovers_low_rank_and_zeroes_the_noise_directions") {
        let acc = GpuAccelerator::new(d).unwrap();
        let g1 = DMatrix::<f64>::from_fn(6, 2, |_, _| r.random_range(-1.0..1.0));
        let g2 = DMatrix::<f64>::from_fn(2, 3000, |_, _| r.random_range(-1.0..1.0));
        let a = (g1 * g2).map(|x| x as f32 as f64);
        let c = acc.compress_residuals(&tensor(&a, d), 4, &gram()).unwrap();
        // U·Uᵀ·A with U accurate to m·u·κ² (κ = σ₁/σ₂ of the rank-2 part).
        let e = exact_svd(&a, 2).unwrap();
        let kappa = e.s()[0] / e.s()[1];
        let bound = 16.0 * 6.0 * U * kappa * kappa * a.norm();
        assert!(
            residual(&a, &c) <= bound,
            "{d}: {:e} > {bound:e}",
            residual(&a, &c)
        );
        let s = c.s().to_vec().unwrap();
        assert!(s[2] == 0.0 && s[3] == 0.0, "{d}: {s:?}");
        let v = c.v().to_vec().unwrap();
        assert!(v.iter().all(|x| x.is_finite()));
        let zero = acc
            .compress_residuals(&tensor(&DMatrix::zeros(4, 50), d), 2, &gram())
            .unwrap();
        assert_eq!(zero.s().to_vec().unwrap(), vec![0.0, 0.0]);
        assert!(zero.u().to_vec().unwrap().iter().all(|x| x.is_finite()));
    }
}

/// Extreme scales (1e±30) do not overflow or underflow the squares; NaN is a typed error; a
/// matrix too large in both dimensions is a typed error naming the limit.
#[test]
fn gram_svd_handles_extreme_scales_and_refuses_bad_input() {
    for (d, mut r) in devices("gram_svd_handles_extreme_scales_and_refuses_bad_input") {
        let acc = GpuAccelerator::new(d).unwrap();
        let sigma = [3.0, 2.0, 1.0];
        let base = with_spectrum(&mut r, 3, 500, &sigma);
        for scale in [1e30, 1e-30] {
            let a = (&base * scale).map(|x| x as f32 as f64);
            let c = acc.compress_residuals(&tensor(&a, d), 3, &gram()).unwrap();
            let rel = residual(&a, &c) / a.norm();
            assert!(rel <= 1e-5, "{d} at {scale:e}: {rel:e}");
        }
        let mut bad = base.clone();
        bad[(1, 7)] = f64::NAN;
        let e = acc
            .compress_residuals(&tensor(&bad, d), 2, &gram())
            .unwrap_err();
        assert!(matches!(e, AcceleratorError::NonFinite { .. }), "{e}");
        let big = Tensor::zeros(&[600, 600], d).unwrap();
        let e = acc.compress_residuals(&big, 2, &gram()).unwrap_err();
        assert!(e.to_string().contains("min(m, n) <= 512"), "{e}");
    }
}

/// The entry bound on CUDA (device reductions) equals the host's f64 bound to f32 rounding,
/// also for factors of 1e30 (no overflowing squares) and of 1e-35 (no overflowing 1/max).
#[test]
fn gpu_entry_bound_on_the_device_matches_the_host() {
    let Some(d) =
        gpu_cuda::testing::gpu_device_or_skip("gpu_entry_bound_on_the_device_matches_the_host")
    else {
        return;
    };
    let mut r = StdRng::seed_from_u64(gpu_cuda::testing::test_seed("gpu_entry_bound"));
    for scale in [1.0f32, 1e30, 1e-35] {
        let u = Array2::from_shape_fn((40, 3), |_| r.random_range(-1.0f32..1.0) * scale);
        let s = Array1::from_vec(vec![2.0f32, 1.0, 0.5]);
        let v = Array2::from_shape_fn((70, 3), |_| r.random_range(-1.0f32..1.0));
        let host = LowRank::new(u, s, v).unwrap();
        let want = host.entry_bound().unwrap();
        let got = host.to(d).unwrap().entry_bound().unwrap();
        let tol = if scale < 1e-30 {
            2.0 * 70f64.sqrt()
        } else {
            1.0 + 1e-5
        };
        assert!(
            got >= want * (1.0 - 1e-5) && got <= want * tol,
            "{scale:e}: {got:e} vs {want:e}"
        );
    }
}
