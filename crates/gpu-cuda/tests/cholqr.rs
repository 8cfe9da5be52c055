//! Cholesky QR2 (`gpu_cuda::cholqr`): the `chol_rinv_f32` kernel against its f64 CPU reference,
//! its breakdown flags, and the whole orthonormalisation on tall-skinny matrices of known
//! conditioning, on fresh random inputs (seed printed; `HYBRID_TEST_SEED` replays). The
//! reference's own test runs everywhere; the GPU tests print why they skip without a GPU.

mod common;

use common::gpu_and_rng;
use gpu_core::{Backend, DType};
use gpu_cuda::cholqr::{chol_rinv_reference, CholQrWork};
use gpu_cuda::testing::test_seed;
use gpu_cuda::CudaBackend;
use rand::{rngs::StdRng, Rng, SeedableRng};

const U: f64 = f32::EPSILON as f64 / 2.0;

/// A column-major `rows × l` matrix `Z·diag(s)·V` (`Z` uniform noise, `s` log-spaced from 1
/// down to `1/κ`, `V` a random rotation): condition number about `κ` (times the few of a
/// tall random matrix), spread over all columns so that no column scaling undoes it.
fn tall(r: &mut StdRng, rows: usize, l: usize, kappa: f64) -> Vec<f32> {
    // V: the Q of a random l × l matrix.
    let v = nalgebra::DMatrix::from_fn(l, l, |_, _| r.random_range(-1.0f64..1.0))
        .qr()
        .q();
    let s: Vec<f64> = (0..l)
        .map(|j| kappa.powf(-(j as f64) / (l.max(2) - 1) as f64))
        .collect();
    let z: Vec<f64> = (0..rows * l)
        .map(|_| r.random_range(-1.0f64..1.0))
        .collect();
    let mut y = vec![0.0f32; rows * l];
    for c in 0..l {
        for i in 0..rows {
            y[i + c * rows] = (0..l)
                .map(|j| z[i + j * rows] * s[j] * v[(j, c)])
                .sum::<f64>() as f32;
        }
    }
    y
}

/// `YᵀY` in f64, rounded to f32 (column-major `l × l`).
fn gram(y: &[f32], rows: usize, l: usize) -> Vec<f32> {
    let mut g = vec![0.0f32; l * l];
    for a in 0..l {
        for b in 0..l {
            let s: f64 = (0..rows)
                .map(|i| f64::from(y[i + a * rows]) * f64::from(y[i + b * rows]))
                .sum();
            g[a + b * l] = s as f32;
        }
    }
    g
}

fn frob(v: impl Iterator<Item = f64>) -> f64 {
    v.map(|x| x * x).sum::<f64>().sqrt()
}

/// `‖QᵀQ − I‖_F` in f64 for column-major `rows × l` `q`.
fn orth_err(q: &[f32], rows: usize, l: usize) -> f64 {
    frob((0..l).flat_map(|a| {
        (0..l).map(move |b| {
            let d: f64 = (0..rows)
                .map(|i| f64::from(q[i + a * rows]) * f64::from(q[i + b * rows]))
                .sum();
            d - if a == b { 1.0 } else { 0.0 }
        })
    }))
}

/// `κ̃ = ‖Y‖_F·‖R⁻¹‖_F >= κ₂(Y)` (since `‖Y⁺‖₂ = ‖R⁻¹‖₂`).
fn kappa_bound(y: &[f32], rinv: &[f32]) -> f64 {
    frob(y.iter().map(|&v| f64::from(v))) * frob(rinv.iter().map(|&v| f64::from(v)))
}

#[test]
fn chol_rinv_reference_orthonormalises_y() {
    let test = "chol_rinv_reference_orthonormalises_y";
    let mut r = StdRng::seed_from_u64(test_seed(test));
    for (rows, l, kappa) in [
        (50, 1, 1.0),
        (80, 7, 10.0),
        (200, 33, 100.0),
        (300, 64, 1e3),
    ] {
        let y = tall(&mut r, rows, l, kappa);
        let g = gram(&y, rows, l);
        let (rinv, flag) = chol_rinv_reference(&g, 1, l, false).unwrap();
        assert_eq!(flag, 0, "{rows}×{l}: positive definite Gram flagged");
        // Q = Y·R⁻¹ in f64: G's rounding to f32 (relative u per entry, so ‖ΔG‖ <= u·‖G‖_F)
        // moves R⁻¹ᵀGR⁻¹ from I by at most ‖R⁻¹‖²·u·‖G‖_F <= u·κ̃², and R⁻¹'s rounding adds
        // 2u·l·κ̃: the bound is 2u·κ̃² + 4u·l·κ̃.
        let q: Vec<f32> = (0..l)
            .flat_map(|c| {
                let (y, rinv) = (&y, &rinv);
                (0..rows).map(move |i| {
                    (0..l)
                        .map(|k| f64::from(y[i + k * rows]) * f64::from(rinv[k + c * l]))
                        .sum::<f64>() as f32
                })
            })
            .collect();
        let k = kappa_bound(&y, &rinv);
        let bound = 2.0 * U * k * k + 4.0 * U * l as f64 * k + 2.0 * U * (rows * l) as f64;
        let e = orth_err(&q, rows, l);
        eprintln!("{rows}×{l} κ≈{kappa:e}: ‖QᵀQ − I‖ {e:.3e} (bound {bound:.3e}, κ̃ {k:.3e})");
        assert!(e <= bound, "{rows}×{l}: {e:e} > {bound:e}");
        assert!((0..l).all(|c| (c + 1..l).all(|i| rinv[i + c * l] == 0.0)));
    }
    // Breakdowns: a zero column (pivot exactly 0), NaN, and the distance check.
    let (rinv, flag) = chol_rinv_reference(&[0.0; 4], 1, 2, false).unwrap();
    assert!(chol_rinv_reference(&[0.0; 5], 1, 2, false).is_err());
    assert_eq!(flag, 1);
    assert!(rinv.iter().all(|v| v.is_finite()));
    assert_eq!(
        chol_rinv_reference(&[f32::NAN, 0.0, 0.0, 1.0], 1, 2, true)
            .unwrap()
            .1,
        3
    );
    assert_eq!(
        chol_rinv_reference(&[1.0, 0.0, 0.0, 1.0], 1, 2, true)
            .unwrap()
            .1,
        0
    );
    assert_eq!(
        chol_rinv_reference(&[2.0, 0.0, 0.0, 1.0], 1, 2, true)
            .unwrap()
            .1,
        2
    );
    assert_eq!(
        chol_rinv_reference(&[2.0, 0.0, 0.0, 1.0], 1, 2, false)
            .unwrap()
            .1,
        0
    );
}

fn chol_gpu(gpu: &CudaBackend, g: &[f32], l: usize, check: bool) -> (Vec<f32>, u32) {
    let dg = gpu.upload(g).unwrap();
    let mut rinv = gpu.upload(&vec![f32::NAN; l * l]).unwrap();
    let mut flag = gpu.upload(&[0u32]).unwrap();
    let parts = g.len() / (l * l).max(1);
    gpu.chol_rinv_cm(l, (&dg, parts), &mut rinv, &mut flag, check)
        .unwrap();
    (
        gpu.download(&rinv).unwrap(),
        gpu.download::<u32>(&flag).unwrap()[0],
    )
}

/// The kernel's `R⁻¹` against the reference's for the Gram matrix of `y`: the same steps in f64
/// (the kernel fuses multiply-adds), so the two differ by f64 rounding amplified by G's
/// conditioning, ≤ l·2^-52·κ̃²·‖R⁻¹‖, plus one f32 rounding each side (2u relative).
fn close_to_reference(what: &str, got: &[f32], want: &[f32], y: &[f32], l: usize) {
    let k = kappa_bound(y, want);
    let norm = frob(want.iter().map(|&v| f64::from(v)));
    let diff = frob(
        got.iter()
            .zip(want)
            .map(|(&a, &b)| f64::from(a) - f64::from(b)),
    );
    let bound = (2.0 * U + l as f64 * f64::EPSILON * k * k) * norm;
    eprintln!("{what}: ‖Δ‖ {diff:.3e} (bound {bound:.3e})");
    assert!(diff <= bound, "{what}: {diff:e} > {bound:e}");
}

#[test]
fn gpu_chol_rinv_matches_its_reference() {
    let test = "gpu_chol_rinv_matches_its_reference";
    let (gpu, mut r) = skip_unless!(gpu_and_rng(test));
    for (rows, l, kappa) in [
        (10, 1, 1.0),
        (90, 7, 10.0),
        (100, 32, 3.0),
        (200, 33, 100.0),
        (500, 64, 100.0),
        (300, 12, 1e3),
    ] {
        let y = tall(&mut r, rows, l, kappa);
        let g = gram(&y, rows, l);
        for check in [false, true] {
            let (want, wf) = chol_rinv_reference(&g, 1, l, check).unwrap();
            let (got, gf) = chol_gpu(&gpu, &g, l, check);
            assert_eq!(gf, wf, "{rows}×{l}: flags");
            close_to_reference(&format!("{rows}×{l} κ≈{kappa:e}"), &got, &want, &y, l);
        }
    }
    // G given as parts (as the Gram product writes it): random f32 parts whose f64 sum is G;
    // kernel and reference add them the same way. 21 parts cross the kernel's batches of 16
    // loads in flight.
    for (rows, l, nparts) in [(120, 20, 3), (150, 40, 21)] {
        let y = tall(&mut r, rows, l, 10.0);
        let g = gram(&y, rows, l);
        let mut parts = vec![0.0f32; nparts * l * l];
        for e in 0..l * l {
            let mut rest = f64::from(g[e]);
            for p in 0..nparts - 1 {
                let a = r.random_range(-1.0f32..1.0);
                parts[p * l * l + e] = a;
                rest -= f64::from(a);
            }
            parts[(nparts - 1) * l * l + e] = rest as f32;
        }
        let (want, wf) = chol_rinv_reference(&parts, nparts, l, false).unwrap();
        let (got, gf) = chol_gpu(&gpu, &parts, l, false);
        assert_eq!((gf, wf), (0, 0), "{nparts} parts");
        close_to_reference(&format!("{nparts} parts"), &got, &want, &y, l);
    }

    // Breakdowns, as the reference flags them; the factor stays finite.
    for (g, l, check) in [
        (vec![0.0f32; 9], 3, false),
        (vec![f32::NAN, 0.0, 0.0, 1.0], 2, true),
        (vec![2.0, 0.0, 0.0, 1.0], 2, true),
        (vec![1.0, 0.0, 0.0, 1.0], 2, true),
        (vec![1.0, 2.0, 2.0, 1.0], 2, false),
    ] {
        let (want, wf) = chol_rinv_reference(&g, 1, l, check).unwrap();
        let (got, gf) = chol_gpu(&gpu, &g, l, check);
        assert_eq!(gf, wf, "{g:?}: flags");
        if !g.iter().any(|v| v.is_nan()) {
            assert!(got.iter().all(|v| v.is_finite()), "{g:?}: {got:?}");
            assert_eq!(got, want, "{g:?}");
        }
    }
    // Too wide, or buffers too short: typed errors before anything is queued.
    let small = gpu.allocate(DType::F32, 4).unwrap();
    let mut out = gpu.allocate(DType::F32, 4).unwrap();
    let mut flag = gpu.allocate(DType::U32, 1).unwrap();
    for (l, parts) in [(65, 1), (3, 1), (2, 2), (2, 0)] {
        assert!(gpu
            .chol_rinv_cm(l, (&small, parts), &mut out, &mut flag, false)
            .is_err());
    }
    let mut not_u32 = gpu.allocate(DType::F32, 1).unwrap();
    assert!(gpu
        .chol_rinv_cm(2, (&small, 1), &mut out, &mut not_u32, false)
        .is_err());
}

#[test]
fn gpu_cholqr2_orthonormalises_and_keeps_the_span() {
    let test = "gpu_cholqr2_orthonormalises_and_keeps_the_span";
    let (gpu, mut r) = skip_unless!(gpu_and_rng(test));
    // Yamamoto et al. (2015, Theorem 3.3): when 8κ²(rows·l·u + l(l+1)·u) <= 1 the first pass
    // leaves Q within 1/2 of orthonormal and Cholesky QR2 cannot break down; beyond that it
    // may (flagged: the caller falls back to Householder) or may not, and then must still
    // deliver. κ̃ >= κ(Y) decides which.
    for (rows, l, kappa) in [
        (40, 1, 1.0),
        (1000, 16, 2.0),
        (2000, 8, 3.0),
        (1000, 64, 100.0),
        (3000, 33, 1e3),
        (500, 12, 1e7),
    ] {
        let y = tall(&mut r, rows, l, kappa);
        let g = gram(&y, rows, l);
        let k = kappa_bound(&y, &chol_rinv_reference(&g, 1, l, false).unwrap().0);
        let theorem = 8.0 * k * k * ((rows * l + l * (l + 1)) as f64) * U <= 1.0;
        let mut q = gpu.upload(&y).unwrap();
        let mut work = CholQrWork::new(&gpu, rows, l).unwrap();
        gpu.cholqr2_cm((rows, l), (&mut q, rows), &mut work)
            .unwrap();
        if work.failed(&gpu).unwrap() {
            eprintln!("{rows}×{l} κ≈{kappa:e} (κ̃ {k:.3e}): flagged");
            assert!(
                !theorem,
                "{rows}×{l}: flagged where the theorem guarantees success"
            );
            continue;
        }
        let q: Vec<f32> = gpu.download(&q).unwrap();
        // Orthogonality after the second pass: 6(rows·l + l(l+1))·u (the same theorem, for a
        // first pass that left Q within 1/2 of orthonormal, as the kernel checked).
        let e = orth_err(&q, rows, l);
        let bound = 6.0 * ((rows * l + l * (l + 1)) as f64) * U;
        // The span: Q = Y·R₁⁻¹·R₂⁻¹ spans Y's columns up to the rounding of the two
        // products, l·u·κ(Y) relative each (κ(Y) <= κ̃).
        let proj: f64 = frob((0..l).flat_map(|c| {
            let (y, q) = (&y, &q);
            let coef: Vec<f64> = (0..l)
                .map(|a| {
                    (0..rows)
                        .map(|i| f64::from(q[i + a * rows]) * f64::from(y[i + c * rows]))
                        .sum()
                })
                .collect();
            (0..rows).map(move |i| {
                f64::from(y[i + c * rows])
                    - (0..l)
                        .map(|a| f64::from(q[i + a * rows]) * coef[a])
                        .sum::<f64>()
            })
        })) / frob(y.iter().map(|&v| f64::from(v)));
        let span_bound = 4.0 * l as f64 * U * k + e;
        eprintln!(
            "{rows}×{l} κ≈{kappa:e} (κ̃ {k:.3e}, theorem {theorem}): ‖QᵀQ − I‖ {e:.3e} \
             (bound {bound:.3e}), ‖Y − QQᵀY‖/‖Y‖ {proj:.3e} (bound {span_bound:.3e})"
        );
        assert!(e <= bound, "{rows}×{l}: orthogonality {e:e}");
        assert!(proj <= span_bound, "{rows}×{l}: span {proj:e}");
    }
    // A zero column breaks Cholesky exactly (pivot 0): flagged, whatever lands in the matrix.
    let (rows, l) = (100, 8);
    let mut y = tall(&mut r, rows, l, 1.0);
    y[3 * rows..4 * rows].fill(0.0);
    let mut q = gpu.upload(&y).unwrap();
    let mut work = CholQrWork::new(&gpu, rows, l).unwrap();
    gpu.cholqr2_cm((rows, l), (&mut q, rows), &mut work)
        .unwrap();
    assert!(work.failed(&gpu).unwrap(), "a zero column must be flagged");
    let y = tall(&mut r, 500, 12, 1.0);
    let mut work = CholQrWork::new(&gpu, 500, 12).unwrap();
    // No columns: nothing to do, nothing flagged.
    let mut empty = gpu.allocate(DType::F32, 0).unwrap();
    let mut w0 = CholQrWork::new(&gpu, 10, 0).unwrap();
    gpu.cholqr2_cm((10, 0), (&mut empty, 10), &mut w0).unwrap();
    assert!(!w0.failed(&gpu).unwrap());
    // Shapes beyond the scratch or wider than tall: typed errors.
    let mut q = gpu.upload(&y).unwrap();
    let mut small = CholQrWork::new(&gpu, 100, 12).unwrap();
    assert!(gpu
        .cholqr2_cm((500, 12), (&mut q, 500), &mut small)
        .is_err());
    assert!(gpu.cholqr2_cm((5, 12), (&mut q, 5), &mut work).is_err());
    assert!(CholQrWork::new(&gpu, 100, 65).is_err());
}

/// κ₂(Y) in f64, from the eigenvalues of its exact Gram matrix.
fn kappa2(y: &[f32], rows: usize, l: usize) -> f64 {
    let g = nalgebra::DMatrix::from_fn(l, l, |a, b| {
        (0..rows)
            .map(|i| f64::from(y[i + a * rows]) * f64::from(y[i + b * rows]))
            .sum::<f64>()
    });
    let e = g.symmetric_eigenvalues();
    (e.max() / e.min()).sqrt()
}

/// One pass (`cholqr1_cm`, the intermediate bases of the randomized SVD): within the theorem's
/// range (8·κ₂²·(rows·l + l(l+1))·u <= 1), Yamamoto et al. bound the first pass' ‖QᵀQ − I‖ by
/// 5/8 of that quantity (plus the rounding of the product); the input is left alone.
#[test]
fn gpu_cholqr1_keeps_the_span_within_its_orthogonality_bound() {
    let test = "gpu_cholqr1_keeps_the_span_within_its_orthogonality_bound";
    let (gpu, mut r) = skip_unless!(gpu_and_rng(test));
    // κ small enough for the theorem's range at these sizes (8·κ²·rows·l·u <= 1 needs
    // κ <= ~5 at 1024 × 64).
    for (rows, l, kappa) in [
        (40, 1, 1.0),
        (1000, 32, 2.0),
        (1024, 64, 2.0),
        (3000, 33, 2.0),
    ] {
        let y = tall(&mut r, rows, l, kappa);
        let k = kappa2(&y, rows, l);
        let quantity = 8.0 * k * k * ((rows * l + l * (l + 1)) as f64) * U;
        assert!(
            quantity <= 1.0,
            "{rows}×{l}: κ₂ {k:.3e} outside the theorem's range"
        );
        let a = gpu.upload(&y).unwrap();
        let mut out = gpu.upload(&vec![f32::NAN; rows * l]).unwrap();
        let mut work = CholQrWork::new(&gpu, rows, l).unwrap();
        gpu.cholqr1_cm((rows, l), (&a, rows), (&mut out, rows), &mut work)
            .unwrap();
        assert!(!work.failed(&gpu).unwrap(), "{rows}×{l}: flagged");
        assert_eq!(gpu.download::<f32>(&a).unwrap(), y, "the input changed");
        let q: Vec<f32> = gpu.download(&out).unwrap();
        let e = orth_err(&q, rows, l);
        let bound = 5.0 / 8.0 * quantity + 2.0 * ((rows * l) as f64) * U;
        eprintln!("{rows}×{l} κ≈{kappa:e} (κ₂ {k:.3e}): ‖QᵀQ − I‖ {e:.3e} (bound {bound:.3e})");
        assert!(e <= bound, "{rows}×{l}: orthogonality {e:e} > {bound:e}");
    }
    // `out` too small, or the input wider than tall: typed errors, nothing queued.
    let y = tall(&mut r, 100, 8, 1.0);
    let a = gpu.upload(&y).unwrap();
    let mut work = CholQrWork::new(&gpu, 100, 8).unwrap();
    let mut short = gpu.allocate(DType::F32, 100 * 8 - 1).unwrap();
    assert!(gpu
        .cholqr1_cm((100, 8), (&a, 100), (&mut short, 100), &mut work)
        .is_err());
    let mut out = gpu.allocate(DType::F32, 100 * 8).unwrap();
    assert!(gpu
        .cholqr1_cm((4, 8), (&a, 4), (&mut out, 4), &mut work)
        .is_err());
}
