//! `gpu_cuda::linalg` against host references on fresh random inputs (seed printed):
//! the device normal stream, column-major GEMM with transposes and `beta`, transposes,
//! row scaling, Householder orthonormalisation, and the shape checks.

mod common;

use common::gpu_and_rng;
use gpu_core::nn::elementwise::randn_at;
use gpu_core::{Backend, DType};
use gpu_cuda::linalg::SolverInfo;
use gpu_cuda::testing::{backend_or_skip, test_seed};
use rand::Rng;

const U: f64 = f32::EPSILON as f64 / 2.0;

#[test]
fn gpu_fill_randn_matches_its_reference() {
    let test = "gpu_fill_randn_matches_its_reference";
    let gpu = skip_unless!(backend_or_skip(test));
    let seed = test_seed(test);
    let n = 100_003;
    let mut buf = gpu.allocate(DType::F32, n).unwrap();
    gpu.fill_randn(&mut buf, seed).unwrap();
    let got: Vec<f32> = gpu.download(&buf).unwrap();
    for (i, &g) in got.iter().enumerate() {
        let want = randn_at(seed, i as u64);
        // The bound stated at randn_at: 8 ulps of the radius sqrt(-2 ln u1) <= 5.8.
        assert!((g - want).abs() <= 3e-6, "element {i}: {g} vs {want}");
    }
    let mean = got.iter().map(|&x| f64::from(x)).sum::<f64>() / n as f64;
    let var = got
        .iter()
        .map(|&x| (f64::from(x) - mean).powi(2))
        .sum::<f64>()
        / n as f64;
    // Standard errors: 1/sqrt(n) = 0.0032 for the mean, sqrt(2/n) = 0.0045 for the variance.
    assert!(
        mean.abs() < 5.0 * 0.0032 && (var - 1.0).abs() < 5.0 * 0.0045,
        "{mean} {var}"
    );
}

/// Column-major `rows × cols` with leading dimension `ld`, entry (i, j).
fn at(v: &[f32], ld: usize, i: usize, j: usize) -> f64 {
    f64::from(v[i + j * ld])
}

#[test]
fn gpu_gemm_cm_matches_the_host_product_for_every_transpose_and_beta() {
    let test = "gpu_gemm_cm_matches_the_host_product_for_every_transpose_and_beta";
    let (gpu, mut r) = skip_unless!(gpu_and_rng(test));
    for _ in 0..12 {
        let (m, n, k) = (
            r.random_range(1..70),
            r.random_range(1..70),
            r.random_range(0..90),
        );
        let (ta, tb) = (r.random_bool(0.5), r.random_bool(0.5));
        let (alpha, beta) = (
            r.random_range(-2.0f32..2.0),
            [0.0f32, 1.0, -0.5][r.random_range(0..3)],
        );
        let (ar, ac) = if ta { (k, m) } else { (m, k) };
        let (br, bc) = if tb { (n, k) } else { (k, n) };
        let (lda, ldb, ldc) = (ar.max(1) + r.random_range(0..3), br.max(1) + 1, m + 2);
        let mut fill = |len: usize| {
            (0..len)
                .map(|_| r.random_range(-1.0f32..1.0))
                .collect::<Vec<_>>()
        };
        let (a, b, c0) = (fill(lda * ac.max(1)), fill(ldb * bc.max(1)), fill(ldc * n));
        let (da, db) = (gpu.upload(&a).unwrap(), gpu.upload(&b).unwrap());
        let mut dc = gpu.upload(&c0).unwrap();
        gpu.gemm_cm(
            (ta, tb),
            (m, n, k),
            (alpha, beta),
            (&da, lda),
            (&db, ldb),
            (&mut dc, ldc),
        )
        .unwrap();
        let got: Vec<f32> = gpu.download(&dc).unwrap();
        for i in 0..m {
            for j in 0..n {
                let terms: Vec<f64> = (0..k)
                    .map(|p| {
                        let x = if ta {
                            at(&a, lda, p, i)
                        } else {
                            at(&a, lda, i, p)
                        };
                        let y = if tb {
                            at(&b, ldb, j, p)
                        } else {
                            at(&b, ldb, p, j)
                        };
                        f64::from(alpha) * x * y
                    })
                    .collect();
                let cterm = f64::from(beta) * at(&c0, ldc, i, j);
                let want = terms.iter().sum::<f64>() + cterm;
                let mag = terms.iter().map(|t| t.abs()).sum::<f64>() + cterm.abs();
                let err = (at(&got, ldc, i, j) - want).abs();
                // k products and sums plus alpha and beta: (k + 3)·u of the terms' magnitudes.
                assert!(
                    err <= (k as f64 + 3.0) * U * mag + 1e-30,
                    "{m}x{n}x{k} ({i},{j}) {err:e}"
                );
            }
            // Padding rows of C below m are never written.
            for j in 0..n {
                for pad in m..ldc {
                    assert_eq!(got[pad + j * ldc], c0[pad + j * ldc]);
                }
            }
        }
    }
}

#[test]
fn gpu_transpose_scale_and_orthonormalize_are_right() {
    let test = "gpu_transpose_scale_and_orthonormalize_are_right";
    let (gpu, mut r) = skip_unless!(gpu_and_rng(test));
    let (rows, cols) = (300, 24);
    let a: Vec<f32> = (0..rows * cols)
        .map(|_| r.random_range(-1.0f32..1.0))
        .collect();
    let da = gpu.upload(&a).unwrap();
    let mut t = gpu.allocate(DType::F32, rows * cols).unwrap();
    gpu.transpose_cm((rows, cols), (&da, rows), (&mut t, cols))
        .unwrap();
    let tv: Vec<f32> = gpu.download(&t).unwrap();
    assert!((0..rows).all(|i| (0..cols).all(|j| tv[j + i * cols] == a[i + j * rows])));
    let x: Vec<f32> = (0..rows).map(|_| r.random_range(-3.0f32..3.0)).collect();
    let dx = gpu.upload(&x).unwrap();
    let mut sc = gpu.allocate(DType::F32, rows * cols).unwrap();
    gpu.scale_rows_cm((rows, cols), (&da, rows), &dx, (&mut sc, rows))
        .unwrap();
    let sv: Vec<f32> = gpu.download(&sc).unwrap();
    assert!((0..rows * cols).all(|e| sv[e] == a[e] * x[e % rows]));
    // Q of a rank-deficient matrix (two equal columns) is still orthonormal, and spans A.
    let mut a2 = a.clone();
    a2.copy_within(0..rows, rows);
    let mut q = gpu.upload(&a2).unwrap();
    let mut info = SolverInfo::new(&gpu, 2).unwrap();
    gpu.orthonormalize_cm((rows, cols), (&mut q, rows), &mut info)
        .unwrap();
    info.check(&gpu, test).unwrap();
    let qv: Vec<f32> = gpu.download(&q).unwrap();
    let dot = |x: usize, y: usize| {
        (0..rows)
            .map(|i| at(&qv, rows, i, x) * at(&qv, rows, i, y))
            .sum::<f64>()
    };
    // Householder QR: orthonormal to within a small multiple of rows·u.
    let bound = 10.0 * rows as f64 * U;
    for x in 0..cols {
        for y in 0..cols {
            let want = if x == y { 1.0 } else { 0.0 };
            assert!(
                (dot(x, y) - want).abs() <= bound,
                "QᵀQ ({x}, {y}) = {}",
                dot(x, y)
            );
        }
    }
    // Bad shapes are typed errors, before anything is queued.
    let small = gpu.allocate(DType::F32, 10).unwrap();
    let mut out = gpu.allocate(DType::F32, 10).unwrap();
    // (size, lda, ldb, ldc): buffers too small for 4 × 4, then a leading dimension below the rows.
    for (n, lda, ldb, ldc) in [(4, 4, 4, 4), (2, 1, 2, 2)] {
        let r = gpu.gemm_cm(
            (false, false),
            (n, n, n),
            (1.0, 0.0),
            (&small, lda),
            (&small, ldb),
            (&mut out, ldc),
        );
        assert!(r.is_err(), "gemm_cm {n}x{n}x{n} ld ({lda}, {ldb}, {ldc})");
    }
    assert!(gpu
        .orthonormalize_cm((2, 5), (&mut out, 2), &mut info)
        .is_err());
    assert!(gpu
        .transpose_cm((5, 3), (&small, 5), (&mut out, 3))
        .is_err());
    let mut ints = gpu.allocate(DType::U32, 16).unwrap();
    assert!(gpu.fill_randn(&mut ints, 1).is_err());
}

#[test]
fn gpu_gemm_tn_parts_sum_to_the_product() {
    let test = "gpu_gemm_tn_parts_sum_to_the_product";
    let (gpu, mut r) = skip_unless!(gpu_and_rng(test));
    // Exact multiples of the chunk, a remainder, and fewer rows than one chunk; the randomized
    // SVD's widths (32, 33, 64) and wider.
    for (rows, m, n, chunk) in [
        (256, 7, 5, 64),
        (1000, 32, 32, 128),
        (50, 3, 9, 64),
        (129, 1, 1, 128),
        (700, 33, 32, 100),
        (4100, 64, 64, 128),
        (300, 70, 65, 128),
    ] {
        let (lda, ldb) = (rows + 3, rows);
        let mut fill = |len: usize| {
            (0..len)
                .map(|_| r.random_range(-1.0f32..1.0))
                .collect::<Vec<_>>()
        };
        let (a, b) = (fill(lda * m), fill(ldb * n));
        let count = rows.div_ceil(chunk);
        let mut parts = gpu.upload(&vec![f32::NAN; count * m * n]).unwrap();
        let got_count = gpu
            .gemm_tn_parts_cm(
                rows,
                (m, n),
                (&gpu.upload(&a).unwrap(), lda),
                (&gpu.upload(&b).unwrap(), ldb),
                chunk,
                &mut parts,
            )
            .unwrap();
        assert_eq!(got_count, count);
        let p: Vec<f32> = gpu.download(&parts).unwrap();
        for i in 0..m {
            for j in 0..n {
                let sum: f64 = (0..count)
                    .map(|s| f64::from(p[s * m * n + i + j * m]))
                    .sum();
                let (want, size) = (0..rows).fold((0.0f64, 0.0f64), |(w, z), t| {
                    let v = at(&a, lda, t, i) * at(&b, ldb, t, j);
                    (w + v, z + v.abs())
                });
                // Each part is an f32 sum of at most `chunk` products: chunk·u·Σ|ab|.
                let bound = chunk as f64 * U * size;
                assert!(
                    (sum - want).abs() <= bound,
                    "{rows}: ({i}, {j}) {sum} vs {want}"
                );
            }
        }
    }
    // Empty shapes: no rows gives no parts; no columns queues nothing.
    let one = gpu.upload(&[1.0f32; 16]).unwrap();
    let mut parts = gpu.upload(&[f32::NAN; 4]).unwrap();
    assert_eq!(
        gpu.gemm_tn_parts_cm(0, (2, 2), (&one, 1), (&one, 1), 4, &mut parts)
            .unwrap(),
        0
    );
    assert_eq!(
        gpu.gemm_tn_parts_cm(8, (0, 2), (&one, 8), (&one, 8), 4, &mut parts)
            .unwrap(),
        2
    );
    let left: Vec<f32> = gpu.download(&parts).unwrap();
    assert!(left.iter().all(|x| x.is_nan()), "nothing written");
    // A parts buffer too short, or a zero chunk: typed errors.
    let a = gpu.upload(&[1.0f32; 20]).unwrap();
    let mut short = gpu.allocate(DType::F32, 3).unwrap();
    assert!(gpu
        .gemm_tn_parts_cm(10, (2, 2), (&a, 10), (&a, 10), 4, &mut short)
        .is_err());
    assert!(gpu
        .gemm_tn_parts_cm(10, (2, 2), (&a, 10), (&a, 10), 0, &mut short)
        .is_err());
}
