//! The accelerator's device engine (`Engine::Fused`: the HAL's world family,
//! `gpu_core::nn::WorldOps`) on the CPU, where the rollout and the correction run the family's
//! default compositions of primitives, and on `PrimitivesOnly` (the CPU's primitives, every
//! other op from its default), against the exact f64 reference (`Engine::Reference`). On CUDA
//! the same engine is the fused kernels (`gpu_rollout.rs`, `gpu_lowrank.rs`).
//!
//! Bounds: the rollout's outputs within 1e-5 norm-wise relative error, as the fast f32 engine
//! (`fast.rs` gives the derivation: f32 products, LayerNorms and gates through 1 + 10 GRU
//! steps, measured ~1e-6). The correction: every entry within `4·2⁻²⁴·(|w| + Σ_r |u s v|)`
//! of the f64 sum (one f32 rounding of `u·s`, a k-term f32 dot product with k ≤ 8, one
//! rounding of the sum). Seeds are printed; replay one with `HYBRID_TEST_SEED`.

mod common;

use gpu_core::testing::same_bits;
use rand::{rngs::StdRng, Rng, SeedableRng};
use rssm::{AcceleratorError, Engine, GpuAccelerator, LowRank, RssmConfig};
use tensor_ops::ndarray::{Array1, Array2};
use tensor_ops::{Device, Tensor};

const CPU: Device = Device::Cpu;

fn rng(test: &str) -> StdRng {
    StdRng::seed_from_u64(gpu_cuda::testing::test_seed(test))
}

use common::{trained_model as model, uniform};

fn odd_config(seed: u64) -> RssmConfig {
    common::odd_config(3, seed)
}

/// The device engine against the reference on `[b, t, F]` contexts, `steps` ahead.
fn compare_rollouts(cfg: RssmConfig, seed: u64, r: &mut StdRng, label: &str) {
    let device = common::on_engine(model(cfg, seed), Engine::Fused);
    let reference = common::on_engine(model(cfg, seed), Engine::Reference);
    let f = cfg.feature_dim;
    for (b, t, steps) in [(1, 1, 1), (3, 2, 4), (17, 3, 7)] {
        let ctx = Tensor::from_vec(uniform(r, b * t * f, 1.0), &[b, t, f], CPU).unwrap();
        let p = device.predict_batch(&ctx, steps).unwrap();
        let q = reference.predict_batch(&ctx, steps).unwrap();
        let what = format!("{label} [{b}, {t}] x {steps}");
        common::assert_predictions_close(&what, &p, &q, 1e-5);
    }
}

#[test]
fn the_device_rollout_matches_the_f64_reference_on_the_cpu() {
    let mut r = rng("the_device_rollout_matches_the_f64_reference_on_the_cpu");
    let seed = r.random();
    compare_rollouts(odd_config(seed), seed, &mut r, "cpu, default composition");
}

#[test]
fn the_device_rollout_matches_the_f64_reference_on_primitives_only() {
    let mut r = rng("the_device_rollout_matches_the_f64_reference_on_primitives_only");
    let seed = r.random();
    tensor_ops::with_primitives_only(|| {
        compare_rollouts(odd_config(seed), seed, &mut r, "primitives only")
    });
}

/// Random factors of rank `k` for an `m × n` weight, and their f64 product added to `w`.
fn factors(r: &mut StdRng, (m, n, k): (usize, usize, usize)) -> LowRank {
    let u = Array2::from_shape_vec((m, k), uniform(r, m * k, 1.0)).unwrap();
    let s = Array1::from_vec(uniform(r, k, 2.0));
    let v = Array2::from_shape_vec((n, k), uniform(r, n * k, 1.0)).unwrap();
    LowRank::new(u, s, v).unwrap()
}

fn check_correction(w0: &[f32], got: &[f32], c: &LowRank, (m, n): (usize, usize)) {
    let h = c.host().unwrap();
    let k = h.s.len();
    let mut worst = 0.0f64;
    for i in 0..m {
        for j in 0..n {
            let terms: Vec<f64> = (0..k)
                .map(|q| f64::from(h.u[(i, q)]) * f64::from(h.s[q]) * f64::from(h.v[(j, q)]))
                .collect();
            let want = f64::from(w0[i * n + j]) + terms.iter().sum::<f64>();
            let scale = f64::from(w0[i * n + j]).abs() + terms.iter().map(|t| t.abs()).sum::<f64>();
            let err = (f64::from(got[i * n + j]) - want).abs();
            assert!(
                err <= 4.0 * 2f64.powi(-24) * scale * k as f64,
                "({i}, {j}): {err:e}"
            );
            worst = worst.max(err / scale.max(f64::MIN_POSITIVE));
        }
    }
    eprintln!("[{m}, {n}] rank {k}: worst error / scale {worst:e}");
}

fn correction_case(r: &mut StdRng) {
    let acc = GpuAccelerator::new(CPU)
        .unwrap()
        .with_engine(Engine::Fused)
        .unwrap();
    for (m, n, k) in [(1, 1, 1), (7, 5, 3), (33, 70, 8)] {
        let w0 = uniform(r, m * n, 3.0);
        let w = Tensor::from_vec(w0.clone(), &[m, n], CPU).unwrap();
        let c = factors(r, (m, n, k));
        acc.apply_corrections(&w, &c).unwrap();
        check_correction(&w0, &w.to_vec().unwrap(), &c, (m, n));
    }
}

#[test]
fn the_device_correction_matches_the_f64_sum() {
    let mut r = rng("the_device_correction_matches_the_f64_sum");
    correction_case(&mut r);
    tensor_ops::with_primitives_only(|| correction_case(&mut r));
}

#[test]
fn a_refused_device_correction_leaves_the_weights_as_they_were() {
    let mut r = rng("a_refused_device_correction_leaves_the_weights_as_they_were");
    let acc = GpuAccelerator::new(CPU)
        .unwrap()
        .with_engine(Engine::Fused)
        .unwrap();
    let c = factors(&mut r, (4, 3, 2));
    for (poison, what) in [(f32::NAN, "the weights"), (f32::INFINITY, "the weights")] {
        let mut w0 = uniform(&mut r, 12, 1.0);
        w0[5] = poison;
        let w = Tensor::from_vec(w0.clone(), &[4, 3], CPU).unwrap();
        let e = acc.apply_corrections(&w, &c).unwrap_err();
        assert!(
            matches!(e, AcceleratorError::NonFinite { what: w, .. } if w == what),
            "{e}"
        );
        let after = w.to_vec().unwrap();
        assert!(same_bits(&after, &w0));
    }
    // A sum that leaves the f32 range: nothing written.
    let big = Array2::from_elem((4, 2), 1e20f32);
    let huge = LowRank::new(
        big.clone(),
        Array1::from_elem(2, 1e20),
        Array2::from_elem((3, 2), 1e20),
    )
    .unwrap();
    let w0 = uniform(&mut r, 12, 1.0);
    let w = Tensor::from_vec(w0.clone(), &[4, 3], CPU).unwrap();
    let e = acc.apply_corrections(&w, &huge).unwrap_err();
    assert!(matches!(e, AcceleratorError::NonFinite { .. }), "{e}");
    assert_eq!(w.to_vec().unwrap(), w0);
    // Shapes that disagree are refused before anything runs.
    let wrong = Tensor::from_vec(vec![0.0; 6], &[2, 3], CPU).unwrap();
    assert!(matches!(
        acc.apply_corrections(&wrong, &c).unwrap_err(),
        AcceleratorError::Shape { .. }
    ));
}

#[test]
fn the_device_max_abs_agrees_with_a_scan_on_hostile_values() {
    let cases: [&[f32]; 6] = [
        &[],
        &[0.0, -0.0],
        &[1.0, -3.5, 2.0],
        &[f32::MAX, -f32::MAX],
        &[1.0, f32::NEG_INFINITY],
        &[f32::INFINITY, f32::NAN, 0.0],
    ];
    for xs in cases {
        let t = Tensor::from_vec(xs.to_vec(), &[xs.len()], CPU).unwrap();
        let want = xs.iter().fold(0f32, |a, v| {
            if v.is_nan() || a.is_nan() {
                f32::NAN
            } else {
                a.max(v.abs())
            }
        });
        let cpu = t.max_abs().unwrap();
        let composed = tensor_ops::with_primitives_only(|| t.max_abs().unwrap());
        for got in [cpu, composed] {
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{xs:?}: {got} against {want}"
            );
        }
    }
}

/// `compress_residuals` through the device engine: the family's default randomized SVD
/// (products by the matrix as f32 matmuls on the device, QRs and the core SVD on the host in
/// f64). The bar is `tests/svd.rs`'s: the Frobenius error of the rank-k reconstruction within
/// 1.1× of the Eckart–Young optimum on decaying spectra, and f32-orthonormal factors
/// (`‖UᵀU − I‖_F ≤ 1e-5`).
fn svd_case(r: &mut StdRng, label: &str) {
    use nalgebra::DMatrix;
    let acc = GpuAccelerator::new(CPU)
        .unwrap()
        .with_engine(Engine::Fused)
        .unwrap();
    let (m, n, k) = (120, 80, 12);
    let opts = rssm::SvdOptions {
        seed: r.random(),
        ..Default::default()
    };
    for (name, sigma) in [
        (
            "geometric 0.9^j",
            (0..n).map(|j| 0.9f64.powi(j as i32)).collect::<Vec<_>>(),
        ),
        (
            "slow (j+1)^-1",
            (0..n).map(|j| 1.0 / (j + 1) as f64).collect(),
        ),
    ] {
        let a = common::with_spectrum(r, m, n, &sigma);
        // Scaled far outside f32's comfortable range: the power-of-two scaling must undo it.
        for scale in [1.0f64, 1e30, 1e-30] {
            let x: Vec<f32> = (0..m * n)
                .map(|e| (a[(e / n, e % n)] * scale) as f32)
                .collect();
            let t = Tensor::from_vec(x, &[m, n], CPU).unwrap();
            let c = acc.compress_residuals(&t, k, &opts).unwrap();
            let h = c.host().unwrap();
            let f = |x: &Array2<f32>| {
                DMatrix::from_fn(x.nrows(), x.ncols(), |i, j| f64::from(x[(i, j)]))
            };
            let (u, v) = (f(&h.u), f(&h.v));
            let s = DMatrix::from_diagonal(&nalgebra::DVector::from_iterator(
                k,
                h.s.iter().map(|&x| f64::from(x) / scale),
            ));
            let err = (&a - &u * s * v.transpose()).norm();
            let best = sigma[k..].iter().map(|s| s * s).sum::<f64>().sqrt();
            let ortho =
                |q: &DMatrix<f64>| (q.transpose() * q - DMatrix::<f64>::identity(k, k)).norm();
            eprintln!(
                "{label}, {name}, scale {scale:e}: error / optimum {:.5}, orthonormality {:e} {:e}",
                err / best,
                ortho(&u),
                ortho(&v)
            );
            assert!(
                err <= 1.1 * best,
                "{label} {name} {scale:e}: {}",
                err / best
            );
            assert!(ortho(&u) <= 1e-5 && ortho(&v) <= 1e-5, "{label} {name}");
            assert!(
                h.s.as_slice().unwrap().windows(2).all(|w| w[0] >= w[1]),
                "descending"
            );
        }
    }
}

#[test]
fn the_device_svd_is_within_the_eckart_young_bar() {
    let mut r = rng("the_device_svd_is_within_the_eckart_young_bar");
    svd_case(&mut r, "cpu");
    tensor_ops::with_primitives_only(|| svd_case(&mut r, "primitives only"));
}

#[test]
fn the_device_svd_refuses_what_it_cannot_factor() {
    let acc = GpuAccelerator::new(CPU)
        .unwrap()
        .with_engine(Engine::Fused)
        .unwrap();
    let opts = rssm::SvdOptions::default();
    let mut x = vec![1.0f32; 12];
    x[7] = f32::NAN;
    let t = Tensor::from_vec(x, &[3, 4], CPU).unwrap();
    let e = acc.compress_residuals(&t, 2, &opts).unwrap_err();
    assert!(matches!(e, AcceleratorError::NonFinite { .. }), "{e}");
    let t = Tensor::from_vec(vec![1.0f32; 12], &[3, 4], CPU).unwrap();
    for rank in [0, 4] {
        let e = acc.compress_residuals(&t, rank, &opts).unwrap_err();
        assert!(matches!(e, AcceleratorError::Rank { .. }), "{e}");
    }
    let gesvdr = rssm::SvdOptions {
        method: rssm::SvdMethod::CusolverGesvdr,
        ..opts
    };
    let e = acc.compress_residuals(&t, 2, &gesvdr).unwrap_err();
    assert!(e.to_string().contains("CUDA only"), "{e}");
    // Every entry f32::MAX: the products run scaled, but σ₁ = √12·MAX does not fit f32.
    let t = Tensor::from_vec(vec![f32::MAX; 12], &[3, 4], CPU).unwrap();
    let e = acc.compress_residuals(&t, 1, &opts).unwrap_err();
    assert!(
        matches!(e, AcceleratorError::NonFinite { what, .. } if what.contains("singular values")),
        "{e}"
    );
    // A quarter of that fits: σ₁ = √12·MAX/4 < MAX, and comes back to f32 rounding.
    let t = Tensor::from_vec(vec![f32::MAX / 4.0; 12], &[3, 4], CPU).unwrap();
    let s = acc
        .compress_residuals(&t, 1, &opts)
        .unwrap()
        .host()
        .unwrap()
        .s[0];
    let want = 12f64.sqrt() * f64::from(f32::MAX / 4.0);
    assert!(
        (f64::from(s) - want).abs() <= 1e-6 * want,
        "{s} against {want}"
    );
}
