//! The CUDA paths of `compress_residuals` (both methods) and `apply_corrections` against the
//! f64 references, on fresh random inputs (seed printed; `HYBRID_TEST_SEED` replays). Each
//! test prints why it skips without a GPU; with one it must run.

mod common;
use common::{gpu, uniform, with_spectrum};
use gpu_core::testing::same_bits;
use nalgebra::{DMatrix, DVector};
use rssm::svd::exact_svd;
use rssm::{AcceleratorError, GpuAccelerator, LowRank, SvdMethod, SvdOptions};
use tensor_ops::ndarray::{Array1, Array2};
use tensor_ops::{Device, Tensor};

/// The rank-one `5 × 4` correction `u·s·vᵀ` with `u` and `s` all `x` and `v` all ones (so
/// every entry is `x²`), on `d`.
fn rank_one_5x4(x: f32, d: Device) -> LowRank {
    let u = Array2::from_elem((5, 1), x);
    let s = Array1::from_elem(1, x);
    let v = Array2::from_elem((4, 1), 1.0);
    LowRank::new(u, s, v).unwrap().to(d).unwrap()
}

/// f32 unit roundoff.
const U: f64 = f32::EPSILON as f64 / 2.0;

fn tensor(a: &DMatrix<f64>, d: Device) -> Tensor {
    let x = Array2::from_shape_fn(a.shape(), |(i, j)| a[(i, j)] as f32);
    Tensor::from_ndarray(&x, d).unwrap()
}

/// `‖A − U·diag(S)·Vᵀ‖_F` in f64 from the f32 factors.
fn residual(a: &DMatrix<f64>, c: &LowRank) -> f64 {
    let h = c.host().unwrap();
    let f = |x: &Array2<f32>| DMatrix::from_fn(x.nrows(), x.ncols(), |i, j| f64::from(x[(i, j)]));
    let s = DMatrix::from_diagonal(&DVector::from_iterator(
        c.rank(),
        h.s.iter().map(|&x| f64::from(x)),
    ));
    (a - f(&h.u) * s * f(&h.v).transpose()).norm()
}

fn methods() -> [SvdMethod; 4] {
    [
        SvdMethod::Halko,
        SvdMethod::HalkoEager,
        SvdMethod::HalkoHouseholder,
        SvdMethod::CusolverGesvdr,
    ]
}

fn halko(method: SvdMethod) -> bool {
    method != SvdMethod::CusolverGesvdr
}

/// `max(‖UᵀU − I‖_F, ‖VᵀV − I‖_F)` in f64.
fn orthonormality(c: &LowRank) -> f64 {
    let h = c.host().unwrap();
    let err = |x: &Array2<f32>| {
        let f = DMatrix::from_fn(x.nrows(), x.ncols(), |i, j| f64::from(x[(i, j)]));
        (f.transpose() * &f - DMatrix::identity(x.ncols(), x.ncols())).norm()
    };
    err(&h.u).max(err(&h.v))
}

/// The orthogonality the Halko paths guarantee: Cholesky QR2's 6(rows·l + l(l+1))·u
/// (Yamamoto et al. 2015; Householder QR is within it), plus the small factors' product
/// (l·u per entry, √k·l·u in norm), for the taller side `rows`.
fn orth_bound(m: usize, n: usize, k: usize, oversample: usize) -> f64 {
    let l = (k + oversample).min(m.min(n)) as f64;
    6.0 * (m.max(n) as f64 * l + l * (l + 1.0)) * U + (k as f64).sqrt() * l * U
}

fn opts(method: SvdMethod) -> SvdOptions {
    SvdOptions {
        oversample: 10,
        power_iters: 2,
        seed: 11,
        method,
    }
}

#[test]
fn gpu_svd_is_within_1_1x_of_eckart_young_on_decaying_spectra() {
    let Some((d, mut r)) = gpu("gpu_svd_is_within_1_1x_of_eckart_young_on_decaying_spectra") else {
        return;
    };
    let acc = GpuAccelerator::new(d).unwrap();
    let (m, n, k) = (300, 200, 32);
    let spectra: [(&str, Vec<f64>); 2] = [
        (
            "geometric 0.9^j",
            (0..n).map(|j| 0.9f64.powi(j as i32)).collect(),
        ),
        (
            "polynomial (j+1)^-2",
            (0..n).map(|j| ((j + 1) as f64).powi(-2)).collect(),
        ),
    ];
    for (name, sigma) in spectra {
        let a = with_spectrum(&mut r, m, n, &sigma);
        let best = sigma[k..].iter().map(|s| s * s).sum::<f64>().sqrt();
        for method in methods() {
            let c = acc
                .compress_residuals(&tensor(&a, d), k, &opts(method))
                .unwrap();
            let ratio = residual(&a, &c) / best;
            eprintln!("{name}, {method:?}: error / optimal = {ratio:.6}");
            // The optimal errors here are >= 1e-4·‖A‖, far above f32's rounding of A and of
            // the factors (~1e-7·‖A‖ each): the 1.1× bound applies as it is.
            assert!(ratio <= 1.1, "{name}, {method:?}: ratio {ratio}");
            if halko(method) {
                let (o, ob) = (orthonormality(&c), orth_bound(m, n, k, 10));
                assert!(o <= ob, "{name}, {method:?}: orthonormality {o:e} > {ob:e}");
            }
        }
    }
}

#[test]
fn gpu_svd_recovers_exact_rank_k_rank_deficient_and_ill_conditioned_matrices() {
    let Some((d, mut r)) =
        gpu("gpu_svd_recovers_exact_rank_k_rank_deficient_and_ill_conditioned_matrices")
    else {
        return;
    };
    let acc = GpuAccelerator::new(d).unwrap();
    let (m, n) = (120, 90);
    // Exactly rank 16, asked for 16; and rank 5, asked for 12 (rank-deficient). The bounds
    // are the Halko path's, the default. cuSOLVER's gesvdr is only printed and checked finite:
    // on an exactly rank-16 matrix it measured 4.8e-4 (not f32 rounding), one reason Halko is
    // the default.
    for (true_rank, k) in [(16, 16), (5, 12)] {
        let sigma: Vec<f64> = (0..true_rank).map(|j| 10.0 * 0.8f64.powi(j)).collect();
        let a = with_spectrum(&mut r, m, n, &sigma);
        for method in methods() {
            let c = acc
                .compress_residuals(&tensor(&a, d), k, &opts(method))
                .unwrap();
            let err = residual(&a, &c) / a.norm();
            // f32 rounding of A (u) and first-order rounding of the 2q + 3 = 7 products and
            // QRs of length <= max(m, n) = 120, each at most γ = 120·u relative.
            let bound = U + 7.0 * 120.0 * U;
            eprintln!(
                "rank {true_rank}, k {k}, {method:?}: relative error {err:e} (bound {bound:e})"
            );
            let s = c.host().unwrap().s;
            assert!(s.iter().all(|x| x.is_finite() && *x >= 0.0));
            if halko(method) {
                assert!(err <= bound, "rank {true_rank}, {method:?}: {err:e}");
                // Rank-deficient: the trailing factors are still orthonormal.
                let (o, ob) = (orthonormality(&c), orth_bound(m, n, k, 10));
                eprintln!("  orthonormality {o:.3e} (bound {ob:.3e})");
                assert!(
                    o <= ob,
                    "rank {true_rank}, {method:?}: orthonormality {o:e}"
                );
            }
        }
    }
    // Condition number 1e7: the leading values are still right (f32 input rounding is
    // ~6e-8·‖A‖, the size of σ_min, so only the leading part is meaningful).
    let sigma: Vec<f64> = (0..n)
        .map(|j| 10f64.powf(-7.0 * j as f64 / (n - 1) as f64))
        .collect();
    let a = with_spectrum(&mut r, m, n, &sigma);
    let k = 10;
    for method in methods() {
        let c = acc
            .compress_residuals(&tensor(&a, d), k, &opts(method))
            .unwrap();
        let s = c.host().unwrap().s;
        let rel = (0..k)
            .map(|j| (f64::from(s[j]) - sigma[j]).abs() / sigma[j])
            .fold(0.0f64, f64::max);
        eprintln!("cond 1e7, {method:?}: leading singular values rel err {rel:e}");
        assert!(s.iter().all(|x| x.is_finite()));
        if halko(method) {
            assert!(rel < 1e-4, "{method:?}: {rel:e}");
            let (o, ob) = (orthonormality(&c), orth_bound(m, n, k, 10));
            assert!(
                o <= ob,
                "cond 1e7, {method:?}: orthonormality {o:e} > {ob:e}"
            );
        }
    }
}

#[test]
fn gpu_svd_matches_the_cpu_path_and_handles_extreme_scales() {
    let Some((d, mut r)) = gpu("gpu_svd_matches_the_cpu_path_and_handles_extreme_scales") else {
        return;
    };
    let gpu_acc = GpuAccelerator::new(d).unwrap();
    let cpu_acc = GpuAccelerator::new(Device::Cpu).unwrap();
    let (m, n, k) = (257, 130, 8);
    let sigma: Vec<f64> = (0..n).map(|j| 0.7f64.powi(j as i32)).collect();
    let a = with_spectrum(&mut r, m, n, &sigma);
    let exact = exact_svd(&a, k).unwrap();
    let best = (&a - exact.reconstruct()).norm();
    let halko = opts(SvdMethod::Halko);
    let cpu = cpu_acc
        .compress_residuals(&tensor(&a, Device::Cpu), k, &halko)
        .unwrap();
    let cpu_err = residual(&a, &cpu);
    for scale in [1.0f64, 1e30, 1e-30] {
        let scaled = &a * scale;
        for method in methods() {
            let c = gpu_acc
                .compress_residuals(&tensor(&scaled, d), k, &opts(method))
                .unwrap();
            let err = residual(&scaled, &c) / scale;
            eprintln!(
                "scale {scale:e}, {method:?}: error {err:e}, CPU path {cpu_err:e}, optimal {best:e}"
            );
            assert!(
                err <= 1.1 * best,
                "scale {scale:e}, {method:?}: {err:e} vs {best:e}"
            );
        }
    }
}

#[test]
fn gpu_svd_rejects_bad_input_with_typed_errors() {
    let Some((d, _)) = gpu("gpu_svd_rejects_bad_input_with_typed_errors") else {
        return;
    };
    let acc = GpuAccelerator::new(d).unwrap();
    let mut v = vec![0.5f32; 12 * 8];
    let ok = Tensor::from_vec(v.clone(), &[12, 8], d).unwrap();
    for method in methods() {
        let o = opts(method);
        assert!(matches!(
            acc.compress_residuals(&ok, 0, &o),
            Err(AcceleratorError::Rank { .. })
        ));
        assert!(matches!(
            acc.compress_residuals(&ok, 9, &o),
            Err(AcceleratorError::Rank { .. })
        ));
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            v[37] = bad;
            let t = Tensor::from_vec(v.clone(), &[12, 8], d).unwrap();
            let e = acc.compress_residuals(&t, 2, &o).unwrap_err();
            assert!(
                matches!(e, AcceleratorError::NonFinite { .. }),
                "{bad}: {e}"
            );
        }
        v[37] = 0.5;
        let cpu = Tensor::from_vec(v.clone(), &[12, 8], Device::Cpu).unwrap();
        let e = acc.compress_residuals(&cpu, 2, &o).unwrap_err();
        assert!(matches!(e, AcceleratorError::DeviceMismatch { .. }), "{e}");
        // A zero residual: zero singular values, finite factors.
        let z = Tensor::zeros(&[12, 8], d).unwrap();
        let c = acc.compress_residuals(&z, 3, &o).unwrap();
        assert!(c.host().unwrap().s.iter().all(|&x| x == 0.0), "{method:?}");
    }
    // Finite entries whose singular value overflows f32 (64 × 64 of 3e38: σ₁ = 1.9e40): a typed
    // error from every method. Rank 1 at k = 1 keeps the fast path's Cholesky QR well posed,
    // so its small SVD is the one that flags the overflow and hands over to the host path.
    let huge = Tensor::from_vec(vec![3e38f32; 64 * 64], &[64, 64], d).unwrap();
    for method in methods() {
        let o = SvdOptions {
            oversample: 0,
            ..opts(method)
        };
        let e = acc.compress_residuals(&huge, 1, &o).unwrap_err();
        assert!(
            matches!(e, AcceleratorError::NonFinite { .. }),
            "{method:?}: {e}"
        );
    }
    let cpu_acc = GpuAccelerator::new(Device::Cpu).unwrap();
    let cpu = Tensor::from_vec(v, &[12, 8], Device::Cpu).unwrap();
    let e = cpu_acc
        .compress_residuals(&cpu, 2, &opts(SvdMethod::CusolverGesvdr))
        .unwrap_err();
    assert!(matches!(e, AcceleratorError::InvalidArgument { .. }), "{e}");
}

#[test]
fn gpu_apply_corrections_matches_the_dense_product_in_place() {
    let Some((d, mut r)) = gpu("gpu_apply_corrections_matches_the_dense_product_in_place") else {
        return;
    };
    let acc = GpuAccelerator::new(d).unwrap();
    // Ranks up to 64 take the fused kernel, larger ones cuBLAS (80).
    for (m, n, k) in [
        (300, 200, 32),
        (1, 1, 1),
        (37, 129, 5),
        (1024, 1024, 32),
        (65, 130, 64),
        (200, 150, 80),
    ] {
        let u = Array2::from_shape_vec((m, k), uniform(&mut r, m * k, 1.0)).unwrap();
        let s = Array1::from_vec(uniform(&mut r, k, 2.0));
        let v = Array2::from_shape_vec((n, k), uniform(&mut r, n * k, 1.0)).unwrap();
        let w0 = uniform(&mut r, m * n, 1.0);
        let c = LowRank::new(u.clone(), s.clone(), v.clone())
            .unwrap()
            .to(d)
            .unwrap();
        let w = Tensor::from_vec(w0.clone(), &[m, n], d).unwrap();
        let view = w.reshape(&[m * n]).unwrap();
        acc.apply_corrections(&w, &c).unwrap();
        let got = w.to_vec().unwrap();
        assert_eq!(
            view.to_vec().unwrap(),
            got,
            "updated in place: views see it"
        );
        // Elementwise: an f32 GEMM of k terms accumulated onto W is within (k + 1)·u of the
        // sum of the terms' magnitudes (the cancelling terms bound), plus the final rounding.
        let mut worst = 0.0f64;
        for i in 0..m {
            for j in 0..n {
                let terms: Vec<f64> = (0..k)
                    .map(|t| f64::from(u[(i, t)]) * f64::from(s[t]) * f64::from(v[(j, t)]))
                    .collect();
                let want = f64::from(w0[i * n + j]) + terms.iter().sum::<f64>();
                let mag =
                    f64::from(w0[i * n + j]).abs() + terms.iter().map(|x| x.abs()).sum::<f64>();
                let err = (f64::from(got[i * n + j]) - want).abs();
                let bound = (k as f64 + 2.0) * U * mag;
                worst = worst.max(err / bound);
                assert!(
                    err <= bound,
                    "{m}x{n} k {k} ({i}, {j}): {err:e} > {bound:e}"
                );
            }
        }
        eprintln!("apply_corrections {m}x{n} rank {k} on {d}: worst error / bound {worst:.3}");
    }
}

#[test]
fn gpu_apply_corrections_refuses_bad_input_and_leaves_the_weights() {
    let Some((d, mut r)) = gpu("gpu_apply_corrections_refuses_bad_input_and_leaves_the_weights")
    else {
        return;
    };
    let acc = GpuAccelerator::new(d).unwrap();
    let c = LowRank::new(
        Array2::from_shape_vec((5, 2), uniform(&mut r, 10, 1.0)).unwrap(),
        Array1::from_vec(vec![1.0, 0.5]),
        Array2::from_shape_vec((4, 2), uniform(&mut r, 8, 1.0)).unwrap(),
    )
    .unwrap()
    .to(d)
    .unwrap();
    let same = |w: &Tensor, before: &[f32]| same_bits(&w.to_vec().unwrap(), before);
    // Shape, device, NaN.
    let w = Tensor::ones(&[5, 3], d).unwrap();
    assert!(matches!(
        acc.apply_corrections(&w, &c),
        Err(AcceleratorError::Shape { .. })
    ));
    let w = Tensor::ones(&[5, 4], Device::Cpu).unwrap();
    assert!(matches!(
        acc.apply_corrections(&w, &c),
        Err(AcceleratorError::DeviceMismatch { .. })
    ));
    let mut v = vec![1.0f32; 20];
    v[7] = f32::NAN;
    let w = Tensor::from_vec(v.clone(), &[5, 4], d).unwrap();
    let e = acc.apply_corrections(&w, &c).unwrap_err();
    assert!(
        matches!(
            e,
            AcceleratorError::NonFinite {
                what: "the weights",
                ..
            }
        ),
        "{e}"
    );
    assert!(same(&w, &v));
    // A sum that overflows f32: refused, nothing written; a large but finite one is written.
    let huge = rank_one_5x4(1e30, d);
    let w = Tensor::ones(&[5, 4], d).unwrap();
    let e = acc.apply_corrections(&w, &huge).unwrap_err();
    assert!(matches!(e, AcceleratorError::NonFinite { .. }), "{e}");
    assert!(same(&w, &[1.0; 20]));
    let big = rank_one_5x4(1e19, d);
    acc.apply_corrections(&w, &big).unwrap();
    assert!(w
        .to_vec()
        .unwrap()
        .iter()
        .all(|&x| (x - 1e38).abs() <= 1e38 * 1e-6));
    // Weights that are an op's result in a graph cannot be written in place.
    let p = Tensor::ones(&[5, 4], d).unwrap().requires_grad_().unwrap();
    let g = p.mul_scalar(2.0).unwrap();
    let e = acc.apply_corrections(&g, &c).unwrap_err();
    assert!(matches!(e, AcceleratorError::Tensor(_)), "{e}");
    // Aliasing: a factor sharing the weights' storage (V is W itself, 4 × 4, rank 4) is a typed
    // error, never a deadlock or a read of half-written weights; W is left as it was.
    let wv: Vec<f32> = uniform(&mut r, 16, 1.0);
    let w = Tensor::from_vec(wv.clone(), &[4, 4], d).unwrap();
    let u = Tensor::from_vec(uniform(&mut r, 16, 1.0), &[4, 4], d).unwrap();
    let s = Tensor::ones(&[4], d).unwrap();
    let aliased = LowRank::from_tensors(u, s, w.clone()).unwrap();
    let e = acc.apply_corrections(&w, &aliased).unwrap_err();
    assert!(matches!(e, AcceleratorError::Tensor(_)), "{e}");
    assert!(same(&w, &wv));
}

/// `Halko` replays a captured graph from the second call of a shape on; `HalkoEager` issues
/// the same operations one by one. Same inputs, same seed: the same bits, whichever call of the
/// plan it is (first: eager, second: capture, later: replay), when the inputs and seeds change
/// between calls, and after more shapes than the plan cache keeps have pushed a plan out.
#[test]
fn gpu_halko_graph_replays_match_eager_calls_bit_for_bit() {
    let Some((d, mut r)) = gpu("gpu_halko_graph_replays_match_eager_calls_bit_for_bit") else {
        return;
    };
    let acc = GpuAccelerator::new(d).unwrap();
    let bits = |c: &LowRank| {
        let h = c.host().unwrap();
        let all = h.u.iter().chain(h.s.iter()).chain(h.v.iter());
        all.map(|x| x.to_bits()).collect::<Vec<u32>>()
    };
    // Each shape's eager call comes first, so its `Halko` call is the plan's second (a
    // capture) or later (a replay). Three shapes three times, then six (more than the cache's
    // four plans), then the first two again (fresh plans).
    let shapes = [
        (96, 80, 4),
        (64, 120, 6),
        (200, 50, 3),
        (72, 72, 8),
        (130, 90, 5),
        (40, 64, 2),
    ];
    let order = [0, 1, 2, 0, 1, 2, 0, 1, 2, 3, 4, 5, 0, 1];
    for (call, &i) in order.iter().enumerate() {
        let (m, n, k) = shapes[i];
        let sigma: Vec<f64> = (0..m.min(n)).map(|j| 0.8f64.powi(j as i32)).collect();
        let a = tensor(&with_spectrum(&mut r, m, n, &sigma), d);
        let seed = call as u64;
        let run = |method| {
            let o = SvdOptions {
                seed,
                ..opts(method)
            };
            acc.compress_residuals(&a, k, &o).unwrap()
        };
        let eager = run(SvdMethod::HalkoEager);
        let graph = run(SvdMethod::Halko);
        assert_eq!(
            bits(&graph),
            bits(&eager),
            "call {call}: {m}×{n} rank {k}, seed {seed}"
        );
    }
}
