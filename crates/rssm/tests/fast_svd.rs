//! The fast engine's randomized SVD (`compress_residuals` on the CPU default, f32 passes over
//! the residual, f64 QR and small SVD) on the cases that take its other branches: a zero
//! matrix and a rank-deficient one (the Householder fallback), extreme scales (the power-of-two
//! scaling), wide, tall and tiny shapes, a 1024-wide residual (rows 4 KiB apart: the padded
//! copy), and agreement with the f64 reference engine.
//!
//! Bounds: the f32 products are backward stable (`‖ΔA‖ <= γ_n·‖A‖`, γ_n = n·u, u = 2⁻²⁴), so
//! singular values are within `~γ_n·σ₁` of the exact ones (Weyl) once the sketch has converged
//! (exactly low-rank inputs here, where it converges at once), and the f32 factors are
//! orthonormal to the rounding of f32 sums of `n` terms. Seeds are printed; replay one with
//! `HYBRID_TEST_SEED`.

mod common;
use common::with_spectrum;
use nalgebra::DMatrix;
use rand::{rngs::StdRng, SeedableRng};
use rssm::svd::exact_svd;
use rssm::{Engine, GpuAccelerator, LowRank, SvdOptions};
use tensor_ops::ndarray::Array2;
use tensor_ops::{Device, Tensor};

fn rng(test: &str) -> StdRng {
    StdRng::seed_from_u64(gpu_cuda::testing::test_seed(test))
}

fn compress(a: &DMatrix<f64>, k: usize, engine: Engine) -> LowRank {
    let x = Array2::from_shape_fn(a.shape(), |(i, j)| a[(i, j)] as f32);
    let t = Tensor::from_ndarray(&x, Device::Cpu).unwrap();
    let acc = GpuAccelerator::new(Device::Cpu)
        .unwrap()
        .with_engine(engine)
        .unwrap();
    acc.compress_residuals(&t, k, &SvdOptions::default())
        .unwrap()
}

fn defect(x: &Array2<f32>) -> f64 {
    let x = DMatrix::from_fn(x.nrows(), x.ncols(), |i, j| f64::from(x[(i, j)]));
    let g = x.transpose() * &x;
    (g - DMatrix::identity(x.ncols(), x.ncols())).abs().max()
}

fn reconstruct(c: &LowRank) -> DMatrix<f64> {
    let (m, n) = c.shape();
    let h = c.host().unwrap();
    DMatrix::from_fn(m, n, |i, j| {
        (0..c.rank())
            .map(|r| f64::from(h.u[(i, r)]) * f64::from(h.s[r]) * f64::from(h.v[(j, r)]))
            .sum()
    })
}

/// Singular values against `want` (all but the first `zeros` of them, then zeros), relative
/// to σ₁; the factors orthonormal; the reconstruction within `rel` of `‖A‖`.
fn check(what: &str, a: &DMatrix<f64>, c: &LowRank, want: &[f64], rel: f64) {
    let s1 = want
        .iter()
        .fold(0.0f64, |m, &x| m.max(x))
        .max(f64::MIN_POSITIVE);
    let h = c.host().unwrap();
    let s_err = (0..c.rank())
        .map(|j| (f64::from(h.s[j]) - want.get(j).copied().unwrap_or(0.0)).abs() / s1)
        .fold(0.0f64, f64::max);
    let (du, dv) = (defect(&h.u), defect(&h.v));
    let norm = a.norm().max(f64::MIN_POSITIVE);
    let r_err = (a - reconstruct(c)).norm() / norm;
    eprintln!("{what}: σ err {s_err:e} (of σ₁), U {du:e}, V {dv:e}, reconstruction {r_err:e}");
    assert!(h.s.iter().all(|s| s.is_finite()), "{what}");
    assert!(s_err < rel, "{what}: σ {s_err:e}");
    assert!(
        du < 1e-5 && dv < 1e-5,
        "{what}: orthonormality {du:e} {dv:e}"
    );
    assert!(
        r_err < rel || a.norm() == 0.0,
        "{what}: reconstruction {r_err:e}"
    );
}

#[test]
fn zero_and_rank_deficient_residuals_give_orthonormal_factors() {
    let mut r = rng("zero_and_rank_deficient_residuals_give_orthonormal_factors");
    let zero = DMatrix::<f64>::zeros(40, 30);
    let c = compress(&zero, 5, Engine::Fast);
    assert!(c.host().unwrap().s.iter().all(|&s| s == 0.0));
    check("zero 40x30", &zero, &c, &[], 1e-6);
    // Rank 6 asked for 20: the sketch is rank-deficient (CholeskyQR refuses, Householder).
    let sigma: Vec<f64> = (0..6).map(|j| 5.0 - j as f64 * 0.5).collect();
    let a = with_spectrum(&mut r, 100, 80, &sigma);
    check(
        "rank 6 of 20",
        &a,
        &compress(&a, 20, Engine::Fast),
        &sigma,
        1e-5,
    );
}

#[test]
fn extreme_scales_and_odd_shapes_keep_their_accuracy() {
    let mut r = rng("extreme_scales_and_odd_shapes_keep_their_accuracy");
    let sigma = [3.0, 2.0, 1.0, 0.5];
    // k >= the rank (4): the reconstruction is exact up to rounding.
    for (m, n, k) in [
        (30, 20, 4),
        (20, 30, 5),
        (7, 5, 4),
        (200, 1024, 4),
        (1024, 64, 6),
    ] {
        let a = with_spectrum(&mut r, m, n, &sigma);
        let c = compress(&a, k, Engine::Fast);
        check(&format!("{m}x{n} rank {k}"), &a, &c, &sigma, 1e-5);
        for scale in [1e30, 1e-30] {
            let b = &a * scale;
            let want: Vec<f64> = sigma.iter().map(|s| s * scale).collect();
            check(
                &format!("{m}x{n} × {scale:e}"),
                &b,
                &compress(&b, k, Engine::Fast),
                &want,
                1e-5,
            );
        }
    }
}

#[test]
fn the_fast_svd_agrees_with_the_f64_reference_engine() {
    let mut r = rng("the_fast_svd_agrees_with_the_f64_reference_engine");
    // Exactly rank 32 plus a 1e-3 floor: the sketch (l = 42) converges, both engines find the
    // leading 32 values to rounding.
    let (m, n, k) = (300, 260, 32);
    let sigma: Vec<f64> = (0..k).map(|j| 10.0 * 0.9f64.powi(j as i32)).collect();
    let a = with_spectrum(&mut r, m, n, &sigma);
    let exact = exact_svd(&a, k).unwrap();
    let fast = compress(&a, k, Engine::Fast);
    let reference = compress(&a, k, Engine::Reference);
    check("fast vs exact", &a, &fast, exact.s().as_slice(), 1e-5);
    check(
        "reference vs exact",
        &a,
        &reference,
        exact.s().as_slice(),
        1e-5,
    );
}
