//! The device's small SVD (`jacobi_svd_f32`, `gpu_cuda::small_svd`) against nalgebra's exact f64
//! SVD on fresh random matrices of every width up to 64 and of known conditioning (seed printed;
//! `HYBRID_TEST_SEED` replays), its failure flags, and its typed errors. Prints why it skips
//! without a GPU.

mod common;

use common::gpu_and_rng;
use gpu_core::{Backend, DType};
use gpu_cuda::small_svd::{JACOBI_DEGENERATE, JACOBI_OVERFLOW};
use gpu_cuda::CudaBackend;
use nalgebra::DMatrix;
use rand::{rngs::StdRng, Rng};

const U: f64 = f32::EPSILON as f64 / 2.0;

/// The kernel's stopping tolerance: columns orthogonal to 2^-26 relative.
const TOL: f64 = 1.4901161193847656e-8;

/// `(U [l × k], S [k], V [l × k], flag)` of the device SVD of column-major `r`.
fn svd_gpu(
    gpu: &CudaBackend,
    r: &[f32],
    (l, k): (usize, usize),
    inv_scale: f32,
) -> (DMatrix<f64>, Vec<f64>, DMatrix<f64>, u32) {
    let dr = gpu.upload(r).unwrap();
    let nan = |n: usize| gpu.upload(&vec![f32::NAN; n]).unwrap();
    let (mut u, mut s, mut v) = (nan(l * k), nan(k), nan(l * k));
    let mut flag = gpu.upload(&[0u32]).unwrap();
    let parts = r.len() / (l * l);
    gpu.jacobi_svd_cm(
        (l, k),
        (&dr, parts),
        inv_scale,
        (&mut u, &mut s, &mut v),
        &mut flag,
    )
    .unwrap();
    let m = |b: &gpu_cuda::CudaBuffer| {
        let h: Vec<f32> = gpu.download(b).unwrap();
        DMatrix::from_iterator(l, k, h.into_iter().map(f64::from))
    };
    let sv: Vec<f32> = gpu.download(&s).unwrap();
    let f: Vec<u32> = gpu.download(&flag).unwrap();
    (m(&u), sv.into_iter().map(f64::from).collect(), m(&v), f[0])
}

/// A column-major `l × l` f32 matrix with singular values log-spaced from 1 down to `1/κ`
/// (`U·diag(σ)·Vᵀ` with random orthogonal `U`, `V`, rounded to f32).
fn with_cond(r: &mut StdRng, l: usize, kappa: f64) -> Vec<f32> {
    let mut orth = || {
        let g = DMatrix::from_fn(l, l, |_, _| r.random_range(-1.0f64..1.0));
        g.qr().q()
    };
    let (u, v) = (orth(), orth());
    let s = DMatrix::from_fn(l, l, |i, j| {
        if i == j {
            kappa.powf(-(i as f64) / (l.max(2) - 1) as f64)
        } else {
            0.0
        }
    });
    (u * s * v.transpose()).iter().map(|&x| x as f32).collect()
}

#[test]
fn gpu_jacobi_svd_matches_the_exact_svd() {
    let test = "gpu_jacobi_svd_matches_the_exact_svd";
    let (gpu, mut r) = skip_unless!(gpu_and_rng(test));
    for (l, kappa) in [
        (1, 1.0),
        (2, 3.0),
        (7, 10.0),
        (32, 100.0),
        (32, 1e6),
        (33, 1e3),
        (63, 1e5),
        (64, 10.0),
        (64, 1e6),
    ] {
        let a = with_cond(&mut r, l, kappa);
        let am = DMatrix::from_iterator(l, l, a.iter().map(|&x| f64::from(x)));
        let exact = am.clone().svd(false, false).singular_values;
        for k in [l, l.div_ceil(2)] {
            let (u, s, v, flag) = svd_gpu(&gpu, &a, (l, k), 1.0);
            assert_eq!(flag, 0, "l {l} κ {kappa:e} k {k}: flag {flag}");
            // One-sided Jacobi in f64 is backward stable (error ~ l·2^-53·‖R‖ per sweep, a few
            // sweeps); columns left orthogonal to TOL move the norms by at most TOL·σ_max; then
            // each output is rounded to f32 (u relative).
            let smax = exact[0];
            for j in 0..k {
                let bound = 2.0 * U * exact[j] + (64.0 * l as f64 * f64::EPSILON + TOL) * smax;
                assert!(
                    (s[j] - exact[j]).abs() <= bound,
                    "l {l} κ {kappa:e}: σ_{j} {} vs {} (bound {bound:e})",
                    s[j],
                    exact[j]
                );
            }
            // Orthonormal columns: the stopping test leaves them orthogonal to TOL, the f32
            // rounding adds u per entry: ‖XᵀX − I‖_F <= 2·l·u + l·TOL + l²·2^-53.
            let orth_bound = 2.0 * l as f64 * U + l as f64 * TOL + (l * l) as f64 * f64::EPSILON;
            for (name, x) in [("U", &u), ("V", &v)] {
                let e = (x.transpose() * x - DMatrix::identity(k, k)).norm();
                assert!(e <= orth_bound, "l {l} κ {kappa:e} k {k}: {name} {e:e}");
            }
            // The leading part reconstructs R's best rank-k approximation:
            // ‖R − U·S·Vᵀ‖_F within the Eckart–Young optimum plus the f32 rounding of three
            // factors and the stopping tolerance ((3u + TOL)·√k·σ_max) and the f64 backward
            // error (64·l·2^-53·‖R‖_F).
            let sm = DMatrix::from_diagonal(&nalgebra::DVector::from_vec(s.clone()));
            let err = (&am - &u * sm * v.transpose()).norm();
            let best = exact.iter().skip(k).map(|x| x * x).sum::<f64>().sqrt();
            let rec_bound = best
                + (3.0 * U + TOL) * (k as f64).sqrt() * smax
                + 64.0 * l as f64 * f64::EPSILON * am.norm();
            eprintln!("l {l} κ {kappa:e} k {k}: ‖R − USVᵀ‖ {err:.3e} (bound {rec_bound:.3e})");
            assert!(err <= rec_bound, "l {l} κ {kappa:e} k {k}: {err:e}");
        }
    }
    // R given as two parts (as the parts product writes it) gives the same factors.
    let a = with_cond(&mut r, 24, 100.0);
    let half: Vec<f32> = a.iter().map(|x| 0.5 * x).collect();
    let two = [half.clone(), half].concat();
    let (u1, s1, v1, f1) = svd_gpu(&gpu, &a, (24, 24), 1.0);
    let (u2, s2, v2, f2) = svd_gpu(&gpu, &two, (24, 24), 1.0);
    assert_eq!((f1, f2), (0, 0));
    assert!(s1 == s2 && u1 == u2 && v1 == v2, "x/2 + x/2 is x exactly");
    // inv_scale (a power of two) scales S exactly.
    let a = with_cond(&mut r, 16, 10.0);
    let (_, s1, _, _) = svd_gpu(&gpu, &a, (16, 16), 1.0);
    let (_, s2, _, _) = svd_gpu(&gpu, &a, (16, 16), 0.125);
    assert!(s1.iter().zip(&s2).all(|(x, y)| x * 0.125 == *y));
}

#[test]
fn gpu_jacobi_svd_flags_what_it_cannot_finish() {
    let test = "gpu_jacobi_svd_flags_what_it_cannot_finish";
    let (gpu, mut r) = skip_unless!(gpu_and_rng(test));
    // Rank 5 of 12: all 12 asked for is flagged (zero singular values), the first 5 are not.
    let l = 12;
    let mut a = with_cond(&mut r, l, 10.0);
    for c in 5..l {
        a[c * l..(c + 1) * l].fill(0.0);
    }
    assert_eq!(
        svd_gpu(&gpu, &a, (l, l), 1.0).3 & JACOBI_DEGENERATE,
        JACOBI_DEGENERATE
    );
    assert_eq!(svd_gpu(&gpu, &a, (l, 5), 1.0).3, 0);
    // All zero, or NaN: flagged.
    assert_ne!(svd_gpu(&gpu, &[0.0; 9], (3, 1), 1.0).3, 0);
    let mut nan = with_cond(&mut r, 4, 2.0);
    nan[5] = f32::NAN;
    assert_ne!(svd_gpu(&gpu, &nan, (4, 2), 1.0).3, 0);
    // A singular value beyond f32 once unscaled (σ₁ = 4 times 2^127).
    let big: Vec<f32> = with_cond(&mut r, 4, 2.0).iter().map(|x| 4.0 * x).collect();
    assert_eq!(
        svd_gpu(&gpu, &big, (4, 2), 2f32.powi(127)).3,
        JACOBI_OVERFLOW
    );
    // Typed errors before anything is queued.
    let buf = gpu.allocate(DType::F32, 65 * 65).unwrap();
    let mut o = gpu.allocate(DType::F32, 65 * 65).unwrap();
    let mut s = gpu.allocate(DType::F32, 65).unwrap();
    let mut o2 = gpu.allocate(DType::F32, 65 * 65).unwrap();
    let mut flag = gpu.upload(&[0u32]).unwrap();
    for (l, k) in [(65, 1), (4, 0), (4, 5)] {
        assert!(gpu
            .jacobi_svd_cm((l, k), (&buf, 1), 1.0, (&mut o, &mut s, &mut o2), &mut flag)
            .is_err());
    }
    // A matrix buffer too short, then a flag that is not u32.
    let short = gpu.allocate(DType::F32, 3).unwrap();
    let mut f32_flag = gpu.allocate(DType::F32, 1).unwrap();
    for (what, a, flag) in [
        ("short", &short, &mut flag),
        ("f32 flag", &buf, &mut f32_flag),
    ] {
        let r = gpu.jacobi_svd_cm((4, 2), (a, 1), 1.0, (&mut o, &mut s, &mut o2), flag);
        assert!(r.is_err(), "{what}");
    }
}
