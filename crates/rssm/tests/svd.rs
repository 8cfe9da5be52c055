//! Randomized SVD against the exact `nalgebra` SVD: the Eckart–Young bound on decaying spectra
//! (q = 2 power iterations, oversampling p = 10), exact recovery of an exactly rank-k matrix,
//! rank-deficient, zero and ill-conditioned (cond 1e7) matrices, and typed errors for bad
//! input; through the accelerator's `compress_residuals` (f32 in, f32 factors out) too.
//!
//! Test matrices are `U·diag(σ)·Vᵀ` with Haar-random orthonormal `U`, `V` from a seed each test
//! prints (`HYBRID_TEST_SEED` replays it).

mod common;
use common::with_spectrum;
use nalgebra::{DMatrix, DVector};
use rand::{rngs::StdRng, SeedableRng};
use rand_distr::{Distribution, StandardNormal};
use rssm::svd::{exact_svd, randomized_svd, Svd};
use rssm::{AcceleratorError, GpuAccelerator, LowRank, SvdMethod, SvdOptions};
use tensor_ops::ndarray::{Array1, Array2};
use tensor_ops::{Device, Tensor};

fn rng(test: &str) -> StdRng {
    StdRng::seed_from_u64(gpu_cuda::testing::test_seed(test))
}

fn frob(a: &DMatrix<f64>) -> f64 {
    a.norm()
}

/// `max |XᵀX − I|` of a matrix that should have orthonormal columns.
fn orthonormality_defect(x: &DMatrix<f64>) -> f64 {
    let g = x.transpose() * x;
    (g - DMatrix::identity(x.ncols(), x.ncols())).abs().max()
}

/// The optimal rank-k error `(Σ_{j>k} σ_j²)^{1/2}` (Eckart–Young) of a spectrum.
fn optimal_error(sigma: &[f64], k: usize) -> f64 {
    sigma[k..].iter().map(|s| s * s).sum::<f64>().sqrt()
}

/// Halko, Martinsson and Tropp (2011), Corollary 10.10: with a Gaussian sketch of k + p
/// columns (p >= 2) and q power iterations,
///
/// ```text
/// E‖(I − QQᵀ)A‖₂ <= [ (1 + √(k/(p−1)))·σ_{k+1}^{2q+1}
///                     + (e·√(k+p)/p)·(Σ_{j>k} σ_j^{2(2q+1)})^{1/2} ]^{1/(2q+1)}
/// ```
///
/// returned here as a multiple of σ_{k+1}. It bounds the expected spectral error of the
/// projection; the power iterations shrink every factor above 1 to its (2q+1)-th root, which
/// is why a few iterations bring the truncated approximation's Frobenius error close to the
/// optimum on decaying spectra. The issue's acceptance bar, asserted below, is the Frobenius
/// error within 1.1× of the Eckart–Young optimum.
fn halko_factor(sigma: &[f64], k: usize, p: usize, q: usize) -> f64 {
    let e = 2.0 * q as f64 + 1.0;
    let s = sigma[k];
    let tail: f64 = sigma[k..]
        .iter()
        .map(|x| (x / s).powf(2.0 * e))
        .sum::<f64>()
        .sqrt();
    let kf = k as f64;
    let pf = p as f64;
    ((1.0 + (kf / (pf - 1.0)).sqrt()) + std::f64::consts::E * (kf + pf).sqrt() / pf * tail)
        .powf(1.0 / e)
}

/// The accelerator's path: f32 residual in, f32 factors out.
fn compress(a: &DMatrix<f64>, k: usize, opts: &SvdOptions) -> Result<LowRank, AcceleratorError> {
    let x = Array2::from_shape_fn(a.shape(), |(i, j)| a[(i, j)] as f32);
    let t = Tensor::from_ndarray(&x, Device::Cpu).unwrap();
    GpuAccelerator::new(Device::Cpu)
        .unwrap()
        .compress_residuals(&t, k, opts)
}

fn to_f64(a: &Array2<f32>) -> DMatrix<f64> {
    DMatrix::from_fn(a.nrows(), a.ncols(), |i, j| f64::from(a[(i, j)]))
}

fn reconstruct(c: &LowRank) -> DMatrix<f64> {
    let h = c.host().unwrap();
    let s = DVector::from_iterator(c.rank(), h.s.iter().map(|&x| f64::from(x)));
    Svd::new(to_f64(&h.u), s, to_f64(&h.v))
        .unwrap()
        .reconstruct()
}

#[test]
fn rank_k_error_is_within_1_1x_of_eckart_young_on_decaying_spectra() {
    let mut r = rng("rank_k_error_is_within_1_1x_of_eckart_young_on_decaying_spectra");
    let (m, n, k) = (300, 200, 32);
    let opts = SvdOptions {
        oversample: 10,
        power_iters: 2,
        seed: 7,
        method: SvdMethod::Halko,
    };
    let spectra: [(&str, Vec<f64>); 3] = [
        (
            "geometric 0.9^j",
            (0..n).map(|j| 0.9f64.powi(j as i32)).collect(),
        ),
        (
            "polynomial (j+1)^-2",
            (0..n).map(|j| ((j + 1) as f64).powi(-2)).collect(),
        ),
        (
            "slow (j+1)^-1",
            (0..n).map(|j| 1.0 / (j + 1) as f64).collect(),
        ),
    ];
    for (name, sigma) in spectra {
        let a = with_spectrum(&mut r, m, n, &sigma);
        let best = optimal_error(&sigma, k);
        let exact = exact_svd(&a, k).unwrap();
        let exact_err = frob(&(&a - exact.reconstruct()));
        let rand_err = frob(&(&a - randomized_svd(&a, k, &opts).unwrap().reconstruct()));
        let f32_err = frob(&(&a - reconstruct(&compress(&a, k, &opts).unwrap())));
        let bound = halko_factor(&sigma, k, opts.oversample, opts.power_iters);
        eprintln!(
            "{name}: optimal {best:.4e}; exact SVD ratio {:.6}, randomized (f64) ratio {:.6}, \
             compress_residuals (f32) ratio {:.6}; Halko Cor. 10.10 spectral factor {bound:.3}",
            exact_err / best,
            rand_err / best,
            f32_err / best
        );
        assert!(
            (exact_err / best - 1.0).abs() < 1e-9,
            "{name}: the exact SVD is optimal"
        );
        assert!(rand_err <= 1.1 * best, "{name}: ratio {}", rand_err / best);
        assert!(
            f32_err <= 1.1 * best,
            "{name}: f32 ratio {}",
            f32_err / best
        );
    }
}

#[test]
fn an_exactly_rank_k_matrix_is_recovered_exactly() {
    let mut r = rng("an_exactly_rank_k_matrix_is_recovered_exactly");
    let (m, n, k) = (120, 90, 16);
    let sigma: Vec<f64> = (0..k).map(|j| 10.0 * 0.8f64.powi(j as i32)).collect();
    let a = with_spectrum(&mut r, m, n, &sigma);
    for q in [0, 2] {
        let opts = SvdOptions {
            power_iters: q,
            ..SvdOptions::default()
        };
        let svd = randomized_svd(&a, k, &opts).unwrap();
        let err = frob(&(&a - svd.reconstruct())) / frob(&a);
        let s_err = (0..k)
            .map(|j| (svd.s()[j] - sigma[j]).abs() / sigma[j])
            .fold(0.0f64, f64::max);
        eprintln!("q = {q}: relative reconstruction error {err:e}, singular values {s_err:e}");
        // f64 rounding through a few products and QRs of 120 x 90: a few hundred ulps.
        assert!(err < 1e-12, "q = {q}: {err:e}");
        assert!(s_err < 1e-12, "q = {q}: {s_err:e}");
        assert!(orthonormality_defect(svd.u()) < 1e-12);
        assert!(orthonormality_defect(svd.v()) < 1e-12);
    }
    // Through f32: the input and the factors are rounded once each (unit roundoff 6e-8).
    let c = compress(&a, k, &SvdOptions::default()).unwrap();
    let err = frob(&(&a - reconstruct(&c))) / frob(&a);
    eprintln!("compress_residuals (f32): relative reconstruction error {err:e}");
    assert!(err < 1e-6, "{err:e}");
}

#[test]
fn a_rank_deficient_matrix_gives_zero_trailing_values_and_orthonormal_factors() {
    let mut r = rng("a_rank_deficient_matrix_gives_zero_trailing_values_and_orthonormal_factors");
    let (m, n, true_rank, k) = (100, 80, 6, 20);
    let sigma: Vec<f64> = (0..true_rank).map(|j| 5.0 - j as f64 * 0.5).collect();
    let a = with_spectrum(&mut r, m, n, &sigma);
    let svd = randomized_svd(&a, k, &SvdOptions::default()).unwrap();
    assert!(svd.s().iter().all(|s| s.is_finite()));
    for j in 0..true_rank {
        assert!((svd.s()[j] - sigma[j]).abs() < 1e-12 * sigma[0], "σ_{j}");
    }
    let trailing = svd.s().rows(true_rank, k - true_rank).abs().max();
    eprintln!("rank {true_rank} of {k}: largest trailing singular value {trailing:e}");
    assert!(trailing < 1e-12 * sigma[0]);
    assert!(frob(&(&a - svd.reconstruct())) < 1e-12 * frob(&a));
    assert!(orthonormality_defect(svd.u()) < 1e-12, "U");
    assert!(orthonormality_defect(svd.v()) < 1e-12, "V");
}

#[test]
fn a_zero_matrix_gives_zero_values_and_finite_orthonormal_factors() {
    let a = DMatrix::<f64>::zeros(40, 30);
    let svd = randomized_svd(&a, 5, &SvdOptions::default()).unwrap();
    assert!(svd.s().iter().all(|&s| s == 0.0));
    assert!(orthonormality_defect(svd.u()) < 1e-12);
    assert!(orthonormality_defect(svd.v()) < 1e-12);
    assert_eq!(svd.reconstruct(), a);
}

#[test]
fn an_ill_conditioned_matrix_keeps_its_leading_triplets_and_the_bound() {
    let mut r = rng("an_ill_conditioned_matrix_keeps_its_leading_triplets_and_the_bound");
    let (m, n, k) = (200, 150, 20);
    // Singular values log-spaced from 1 down to 1e-7: condition number 1e7.
    let sigma: Vec<f64> = (0..n)
        .map(|j| 10f64.powf(-7.0 * j as f64 / (n - 1) as f64))
        .collect();
    let a = with_spectrum(&mut r, m, n, &sigma);
    let exact = exact_svd(&a, n).unwrap();
    let cond = exact.s()[0] / exact.s()[n - 1];
    let svd = randomized_svd(&a, k, &SvdOptions::default()).unwrap();
    let best = optimal_error(&sigma, k);
    let ratio = frob(&(&a - svd.reconstruct())) / best;
    let rel = |j: usize| (svd.s()[j] - sigma[j]).abs() / sigma[j];
    let head = (0..k / 4).map(rel).fold(0.0f64, f64::max);
    let all = (0..k).map(rel).fold(0.0f64, f64::max);
    eprintln!(
        "cond {cond:.3e}: error ratio {ratio:.6}; singular values rel err: first {} {head:e}, \
         all {k} {all:e}",
        k / 4
    );
    assert!(
        (cond / 1e7 - 1.0).abs() < 1e-3,
        "the test matrix has cond {cond:e}"
    );
    assert!(ratio <= 1.1, "ratio {ratio}");
    // The estimates of σ_j converge as (σ_{l+1}/σ_j)^(2q+1) (l = k + p): to rounding for the
    // leading quarter, still a few digits at j = k (spectral ratio 0.9 per index here).
    assert!(head < 1e-8, "{head:e}");
    assert!(all < 1e-3, "{all:e}");
    assert!(orthonormality_defect(svd.u()) < 1e-12);
    assert!(orthonormality_defect(svd.v()) < 1e-12);
    // The smallest singular values are reached too when the rank asks for them.
    let full = randomized_svd(&a, n, &SvdOptions::default()).unwrap();
    let small = (full.s()[n - 1] - sigma[n - 1]).abs() / sigma[n - 1];
    eprintln!(
        "rank = n: σ_min {:.6e} (true 1e-7), rel err {small:e}",
        full.s()[n - 1]
    );
    assert!(small < 1e-6, "σ_min rel err {small:e}");
    // In f32 (what compress_residuals takes) the input's rounding is ~6e-8‖A‖, the size of
    // σ_min, and the fast engine's f32 products are backward stable: the factors are exact
    // ones of A + ΔA with ‖ΔA‖₂ <= (u + γ_m)·‖A‖ (u = 2⁻²⁴, γ_m = m·u = 1.2e-5 here, worst
    // case). By Weyl, |σ̂_j − σ_j| <= ‖ΔA‖₂ on top of the convergence error asserted above
    // for the f64 path (1e-3 at j < k: a property of the random sketch, which the f32 and f64
    // paths draw differently; seed 32 gives 1.19e-4 on the f64 path at j = 19). So: the
    // leading quarter (σ_j >= 0.65) within 1e-4 (rounding: <= 2e-5), all k within the
    // convergence bound plus rounding (<= 1e-3 + 1.2e-5/σ_k = 1.1e-3), and nothing is NaN.
    let c = compress(&a, k, &SvdOptions::default()).unwrap();
    let cs = c.host().unwrap().s;
    let rel32 = |j: usize| (f64::from(cs[j]) - sigma[j]).abs() / sigma[j];
    let head = (0..k / 4).map(rel32).fold(0.0f64, f64::max);
    let all = (0..k).map(rel32).fold(0.0f64, f64::max);
    eprintln!(
        "compress_residuals (f32): singular values rel err, first {} {head:e}, all {k} {all:e}",
        k / 4
    );
    assert!(head < 1e-4, "{head:e}");
    assert!(all < 1.1e-3, "{all:e}");
}

#[test]
fn the_sketch_is_reproducible_from_its_seed() {
    let mut r = rng("the_sketch_is_reproducible_from_its_seed");
    let a = DMatrix::from_fn(60, 50, |_, _| StandardNormal.sample(&mut r));
    let opts = SvdOptions {
        seed: 3,
        ..SvdOptions::default()
    };
    assert_eq!(
        randomized_svd(&a, 8, &opts).unwrap(),
        randomized_svd(&a, 8, &opts).unwrap()
    );
}

#[test]
fn bad_ranks_non_finite_values_and_options_are_typed_errors() {
    let a = DMatrix::<f64>::from_fn(10, 6, |i, j| (i * 6 + j) as f64);
    let opts = SvdOptions::default();
    for rank in [0, 7, usize::MAX] {
        for res in [randomized_svd(&a, rank, &opts), exact_svd(&a, rank)] {
            match res {
                Err(AcceleratorError::Rank { rank: got, max, .. }) => {
                    assert_eq!((got, max), (rank, 6))
                }
                other => panic!("rank {rank}: {other:?}"),
            }
        }
    }
    for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let mut b = a.clone();
        b[(3, 2)] = bad;
        assert!(matches!(
            randomized_svd(&b, 2, &opts),
            Err(AcceleratorError::NonFinite { .. })
        ));
        assert!(matches!(
            exact_svd(&b, 2),
            Err(AcceleratorError::NonFinite { .. })
        ));
    }
    let too_many = SvdOptions {
        power_iters: SvdOptions::MAX_POWER + 1,
        ..opts
    };
    assert!(matches!(
        randomized_svd(&a, 2, &too_many),
        Err(AcceleratorError::InvalidArgument { .. })
    ));
    // A huge oversampling is capped at min(m, n), not an error.
    let wide = SvdOptions {
        oversample: usize::MAX,
        ..opts
    };
    assert_eq!(randomized_svd(&a, 2, &wide).unwrap().s().len(), 2);
}

#[test]
fn compress_residuals_rejects_bad_input_with_typed_errors() {
    let acc = GpuAccelerator::new(Device::Cpu).unwrap();
    let opts = SvdOptions::default();
    let t = |v: Vec<f32>, s: &[usize]| Tensor::from_vec(v, s, Device::Cpu).unwrap();
    let ok = t((0..24).map(|i| i as f32).collect(), &[6, 4]);
    for rank in [0, 5] {
        match acc.compress_residuals(&ok, rank, &opts) {
            Err(AcceleratorError::Rank {
                rank: r, max: 4, ..
            }) => assert_eq!(r, rank),
            other => panic!("rank {rank}: {other:?}"),
        }
    }
    for (bad, name) in [(f32::NAN, "NaN"), (f32::INFINITY, "Inf")] {
        let mut v: Vec<f32> = (0..24).map(|i| i as f32).collect();
        v[5] = bad;
        let e = acc
            .compress_residuals(&t(v, &[6, 4]), 2, &opts)
            .unwrap_err();
        assert!(
            matches!(
                e,
                AcceleratorError::NonFinite {
                    what: "residual",
                    ..
                }
            ),
            "{name}: {e}"
        );
        assert!(e.to_string().contains("NaN or Inf"), "{e}");
    }
    for shape in [&[24][..], &[2, 3, 4], &[0, 4], &[4, 0]] {
        let n: usize = shape.iter().product();
        let e = acc
            .compress_residuals(&t(vec![1.0; n], shape), 1, &opts)
            .unwrap_err();
        assert!(
            matches!(e, AcceleratorError::Shape { .. }),
            "{shape:?}: {e}"
        );
    }
    let ids = Tensor::from_vec(vec![1u32; 24], &[6, 4], Device::Cpu).unwrap();
    assert!(matches!(
        acc.compress_residuals(&ids, 2, &opts),
        Err(AcceleratorError::InvalidArgument { .. })
    ));
}

#[test]
fn low_rank_factors_are_checked() {
    let u = Array2::<f32>::zeros((5, 2));
    let v = Array2::<f32>::zeros((4, 2));
    assert!(LowRank::new(u.clone(), Array1::zeros(2), v.clone()).is_ok());
    for (uu, s, vv) in [
        (u.clone(), Array1::zeros(3), v.clone()),
        (u.clone(), Array1::zeros(2), Array2::zeros((4, 3))),
        (
            Array2::zeros((5, 0)),
            Array1::zeros(0),
            Array2::zeros((4, 0)),
        ),
    ] {
        assert!(matches!(
            LowRank::new(uu, s, vv),
            Err(AcceleratorError::Shape { .. })
        ));
    }
    let mut s = Array1::zeros(2);
    s[1] = f32::NAN;
    assert!(matches!(
        LowRank::new(u, s, v),
        Err(AcceleratorError::NonFinite { .. })
    ));
}

#[test]
fn extreme_scales_neither_overflow_nor_underflow() {
    // Unscaled, ‖x‖² of 1e300-sized columns is Inf (and of 1e-300-sized ones zero): the
    // iteration works on the matrix scaled by a power of two.
    let mut r = rng("extreme_scales_neither_overflow_nor_underflow");
    let sigma = [3.0, 2.0, 1.0];
    let a = with_spectrum(&mut r, 30, 20, &sigma);
    for scale in [1e300, 1e-300] {
        let b = &a * scale;
        for svd in [
            randomized_svd(&b, 3, &SvdOptions::default()).unwrap(),
            exact_svd(&b, 3).unwrap(),
        ] {
            for (j, want) in sigma.iter().enumerate() {
                let rel = (svd.s()[j] / scale - want).abs() / want;
                assert!(rel < 1e-10, "scale {scale:e}: σ_{j} rel err {rel:e}");
            }
        }
    }
}

#[test]
fn exact_svd_of_rank_deficient_matrices_is_verified_and_right() {
    // nalgebra's SVD with vectors returned wrong factors (σ₃ off by up to 1.6%, reconstruction
    // error up to 0.13·‖A‖) for 2–3% of these rank-3 draws, among them seeds 61, 113 and 226;
    // the verified `full_svd` retries them. Fixed seeds: the failing draws are always covered.
    let sigma = [3.0, 2.0, 1.0];
    for seed in 0..300u64 {
        let mut r = StdRng::seed_from_u64(seed);
        let a = with_spectrum(&mut r, 30, 20, &sigma);
        for svd in [
            exact_svd(&a, 3).unwrap(),
            randomized_svd(&a, 3, &SvdOptions::default()).unwrap(),
        ] {
            let rec = frob(&(&a - svd.reconstruct())) / frob(&a);
            assert!(rec < 1e-13, "seed {seed}: reconstruction {rec:e}");
            for (j, want) in sigma.iter().enumerate() {
                let rel = (svd.s()[j] - want).abs() / want;
                assert!(rel < 1e-12, "seed {seed}: σ_{j} rel err {rel:e}");
            }
            assert!(orthonormality_defect(svd.u()) < 1e-12);
            assert!(orthonormality_defect(svd.v()) < 1e-12);
        }
    }
}
