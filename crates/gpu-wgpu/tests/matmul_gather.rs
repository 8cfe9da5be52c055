//! Parity of the wgpu matmul (every transpose, shapes around the tiles) and the row gather and
//! scatter-add against the CPU reference, on fresh random inputs (the seed is printed; replay
//! with `HYBRID_TEST_SEED`) and hostile ones. Without an adapter each test prints `SKIP` and
//! returns (fails with `HYBRID_REQUIRE_WGPU=1`).

mod common;

use common::{backend_and_rng, randn, rng, U};
use gpu_core::nn::rows::RowOps;
use gpu_core::nn::IdRows;
use gpu_core::nn::Primitives;
use gpu_core::ops::{MatmulOps, MatmulSpec};
use gpu_core::testing::every_transpose;
use gpu_core::{Backend, CpuBackend, DType, GpuError};
use rand::Rng;

#[test]
fn matmul_parity_with_transposes() {
    let Some((b, mut r)) = backend_and_rng("matmul_parity_with_transposes") else {
        return;
    };
    let shapes = [
        (1, 1, 1, 1),
        (1, 0, 3, 4),
        (1, 3, 4, 0),
        (1, 17, 33, 15),
        (2, 31, 7, 65),
        (1, 64, 48, 129),
        (3, 5, 1, 300),
        // Several 64×64 tiles in both directions, ragged edges, and an exact tile.
        (2, 130, 70, 33),
        (1, 64, 64, 16),
        // The 128×128-tile kernel: ragged in both directions, then split over k (2 splits of
        // 352, the last one short); the 64×64 one split in 3.
        (2, 129, 257, 40),
        (1, 150, 136, 700),
        (1, 70, 20, 900),
        // The 128×128 vec4 kernel (matmul128v): every side a multiple of 4, ragged tiles; split over
        // k in 4 (chunks of 256); m not a multiple of 4 (vec4 only where A is not stored
        // transposed); k not a multiple of 4 (vec4 only for op(A) stored k×m and B row-major).
        (2, 132, 260, 44),
        (1, 136, 128, 1024),
        (1, 130, 132, 40),
        (1, 132, 128, 37),
        // The 64×64 vec4 kernel (matmul64v): small batched, ragged, split over k.
        (3, 8, 12, 20),
        (2, 68, 44, 300),
        // The matrix–vector kernel (1 to 4 rows, B transposed, k a multiple of 4): ragged
        // column blocks of 8, k one vec4 and many.
        (1, 1, 300, 64),
        (1, 4, 9, 1028),
        (1, 2, 1, 8),
        (1, 3, 33, 4),
    ];
    for (batch, m, n, k) in shapes {
        for spec in every_transpose((batch, m, n, k)) {
            let (ta, tb) = (spec.trans_a, spec.trans_b);
            let a = randn(&mut r, batch * m * k, 4.0);
            let bm = randn(&mut r, batch * k * n, 4.0);
            let (ad, bd) = (b.upload(&a).unwrap(), b.upload(&bm).unwrap());
            let mut cd = b.allocate(DType::F32, batch * m * n).unwrap();
            b.fill(&mut cd, f32::NAN).unwrap();
            b.matmul(spec, &ad, &bd, &mut cd).unwrap();
            let got: Vec<f32> = b.download(&cd).unwrap();
            let (ac, bc) = (
                CpuBackend.upload(&a).unwrap(),
                CpuBackend.upload(&bm).unwrap(),
            );
            let mut cc = CpuBackend.allocate(DType::F32, batch * m * n).unwrap();
            CpuBackend.matmul(spec, &ac, &bc, &mut cc).unwrap();
            let want: Vec<f32> = CpuBackend.download(&cc).unwrap();
            for z in 0..batch {
                for i in 0..m {
                    for j in 0..n {
                        let at = |p: usize| {
                            if ta {
                                a[z * m * k + p * m + i]
                            } else {
                                a[z * m * k + i * k + p]
                            }
                        };
                        let bt = |p: usize| {
                            if tb {
                                bm[z * k * n + j * k + p]
                            } else {
                                bm[z * k * n + p * n + j]
                            }
                        };
                        let exact: f64 = (0..k).map(|p| at(p) as f64 * bt(p) as f64).sum();
                        let abs: f64 = (0..k).map(|p| (at(p) as f64 * bt(p) as f64).abs()).sum();
                        // Bound: (k+1)·2^-24·Σ|a||b| against the exact product, twice that
                        // against the CPU backend's (its own error counts too).
                        let tol = (k as f64 + 1.0) * U * abs;
                        let g = got[z * m * n + i * n + j];
                        assert!(
                            ((g as f64) - exact).abs() <= tol,
                            "{spec:?} ({i},{j}): {g} want {exact}"
                        );
                        let w = want[z * m * n + i * n + j];
                        assert!(((g - w) as f64).abs() <= 2.0 * tol);
                    }
                }
            }
        }
    }
    // NaN and inf propagate; huge values overflow to inf, not NaN.
    let a = b.upload(&[f32::NAN, 1.0, 1.0, 1.0, 1e30, 1e30]).unwrap(); // 3x2
    let bm = b.upload(&[1.0f32, 1.0, 1.0, 1e30]).unwrap(); // 2x2
    let mut c = b.allocate(DType::F32, 6).unwrap();
    b.matmul(MatmulSpec::new(3, 2, 2), &a, &bm, &mut c).unwrap();
    let got: Vec<f32> = b.download(&c).unwrap();
    assert!(got[0].is_nan() && got[1].is_nan());
    assert_eq!(got[2], 2.0);
    assert_eq!(got[3], 1e30 + 1.0);
    assert_eq!(got[4], 2e30);
    assert_eq!(got[5], f32::INFINITY);
    // Mismatched lengths are a shape error.
    assert!(b.matmul(MatmulSpec::new(3, 3, 2), &a, &bm, &mut c).is_err());
    // The same hostile values through the vec4 tiles and the matrix–vector kernel: a NaN in
    // row 0 of A, 1e30 across row 1 (its products overflow to inf where B holds 1e30), an inf
    // in B's first entry; NaN, ±inf and finite outputs where the CPU has them, finite ones
    // within the parity bound above.
    let mut r = rng("matmul_hostile_vec4");
    for (m, n, k, tb) in [(130, 132, 8, false), (6, 8, 4, false), (2, 9, 8, true)] {
        let spec = MatmulSpec {
            batch: 1,
            m,
            n,
            k,
            trans_a: false,
            trans_b: tb,
        };
        let mut av = randn(&mut r, m * k, 1.0);
        let mut bv = randn(&mut r, k * n, 1.0);
        av[0] = f32::NAN;
        av[k..2 * k].fill(1e30);
        bv[0] = f32::INFINITY;
        bv[k * n - 1] = 1e30;
        let mut c = b.allocate(DType::F32, m * n).unwrap();
        let (ad, bd) = (b.upload(&av).unwrap(), b.upload(&bv).unwrap());
        b.matmul(spec, &ad, &bd, &mut c).unwrap();
        let got: Vec<f32> = b.download(&c).unwrap();
        let mut cc = CpuBackend.allocate(DType::F32, m * n).unwrap();
        let (ac, bc) = (
            CpuBackend.upload(&av).unwrap(),
            CpuBackend.upload(&bv).unwrap(),
        );
        CpuBackend.matmul(spec, &ac, &bc, &mut cc).unwrap();
        let want: Vec<f32> = CpuBackend.download(&cc).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let (row, col) = (i / n, i % n);
            let bt = |p: usize| if tb { bv[col * k + p] } else { bv[p * n + col] };
            let abs: f64 = (0..k)
                .map(|p| (av[row * k + p] as f64 * bt(p) as f64).abs())
                .sum();
            // Bound: each side within (k+1)·2^-24·Σ|a||b| of the exact product.
            let tol = 2.0 * (k as f64 + 1.0) * U * abs;
            assert!(
                common::same(*g, *w) || ((g - w) as f64).abs() <= tol,
                "{spec:?} [{i}]: {g} against the CPU's {w}"
            );
        }
    }
}

#[test]
fn gather_and_scatter_add_rows_parity() {
    let Some((b, mut r)) = backend_and_rng("gather_and_scatter_add_rows_parity") else {
        return;
    };
    for (vocab, dim, n) in [
        (1, 1, 1),
        (5, 3, 0),
        (7, 13, 40),
        (100, 257, 33),
        (3, 64, 500),
        // Many rows an id (the scan kernel, deterministic); rows past its 256-id tile.
        (65, 384, 2000),
        (10, 3, 700),
    ] {
        let table = randn(&mut r, vocab * dim, 3.0);
        let ids: Vec<u32> = (0..n).map(|_| r.random_range(0..vocab as u32)).collect();
        let (td, idd) = (b.upload(&table).unwrap(), b.upload(&ids).unwrap());
        let mut out = b.allocate(DType::F32, n * dim).unwrap();
        b.gather_rows(IdRows::new(&idd, &td, dim), &mut out)
            .unwrap();
        let got: Vec<f32> = b.download(&out).unwrap();
        let (tc, ic) = (
            CpuBackend.upload(&table).unwrap(),
            CpuBackend.upload(&ids).unwrap(),
        );
        let mut oc = CpuBackend.allocate(DType::F32, n * dim).unwrap();
        CpuBackend
            .embedding_fwd(IdRows::new(&ic, &tc, dim), &mut oc)
            .unwrap();
        assert_eq!(
            got,
            CpuBackend.download::<f32>(&oc).unwrap(),
            "gather is exact"
        );

        let src = randn(&mut r, n * dim, 3.0);
        let sd = b.upload(&src).unwrap();
        let mut dt = b.allocate(DType::F32, vocab * dim).unwrap();
        b.fill(&mut dt, 0.0).unwrap();
        b.scatter_add_rows(IdRows::new(&idd, &sd, dim), &mut dt)
            .unwrap();
        let got: Vec<f32> = b.download(&dt).unwrap();
        let scd = CpuBackend.upload(&src).unwrap();
        let mut dc = CpuBackend.allocate(DType::F32, vocab * dim).unwrap();
        CpuBackend
            .embedding_bwd(IdRows::new(&ic, &scd, dim), &mut dc)
            .unwrap();
        let want: Vec<f32> = CpuBackend.download(&dc).unwrap();
        for v in 0..vocab {
            let dup = ids.iter().filter(|&&i| i as usize == v).count() as f64;
            for c in 0..dim {
                let abs: f64 = ids
                    .iter()
                    .enumerate()
                    .filter(|(_, &i)| i as usize == v)
                    .map(|(row, _)| src[row * dim + c].abs() as f64)
                    .sum();
                // Bound: 2·dup·2^-24·Σ|src| (both sides sum in their own order).
                let (g, w) = (got[v * dim + c], want[v * dim + c]);
                assert!(
                    ((g - w) as f64).abs() <= 2.0 * dup * U * abs,
                    "({v},{c}): {g} vs {w}"
                );
            }
        }
    }
    // An out-of-range id is a typed error on both: on wgpu from the next call that waits
    // (the row NaN, nothing waits for the check), once; the first bad launch is the one named.
    let table = b.upload(&[1.0f32; 6]).unwrap();
    let ids = b.upload(&[0u32, 7, 1]).unwrap();
    let mut out = b.allocate(DType::F32, 6).unwrap();
    b.gather_rows(IdRows::new(&ids, &table, 2), &mut out)
        .unwrap();
    let e = b.download::<f32>(&out).unwrap_err();
    assert!(
        matches!(
            e,
            GpuError::IndexOutOfRange {
                op: "gather_rows",
                value: 7,
                bound: 3,
                ..
            }
        ),
        "{e}"
    );
    let got: Vec<f32> = b.download(&out).unwrap();
    assert!(got[2..4].iter().all(|v| v.is_nan()) && got[..2] == [1.0, 1.0]);
    let mut dt = b.allocate(DType::F32, 6).unwrap();
    let src = b.upload(&[1.0f32; 6]).unwrap();
    b.scatter_add_rows(IdRows::new(&ids, &src, 2), &mut dt)
        .unwrap();
    b.gather_rows(IdRows::new(&ids, &table, 2), &mut out)
        .unwrap();
    assert!(matches!(
        b.synchronize(),
        Err(GpuError::IndexOutOfRange {
            op: "scatter_add_rows",
            value: 7,
            ..
        })
    ));
    b.synchronize().unwrap();
    // The scan kernel reports one too (20 rows to a vocabulary of 2), past its first tile.
    let mut many = vec![1u32; 300];
    many[280] = 9;
    let ids = b.upload(&many).unwrap();
    let src = b.upload(&vec![1.0f32; 300]).unwrap();
    let mut dt = b.allocate(DType::F32, 2).unwrap();
    b.scatter_add_rows(IdRows::new(&ids, &src, 1), &mut dt)
        .unwrap();
    assert!(matches!(
        b.synchronize(),
        Err(GpuError::IndexOutOfRange {
            value: 9,
            bound: 2,
            ..
        })
    ));
    // More checked launches than the ring holds (256) between two waits: the full ring is
    // read on the way (a good launch) and the bad one after it is still reported.
    let ok = b.upload(&[0u32, 1, 2]).unwrap();
    for _ in 0..300 {
        b.gather_rows(IdRows::new(&ok, &table, 2), &mut out)
            .unwrap();
    }
    let bad = b.upload(&[5u32, 0, 0]).unwrap();
    b.gather_rows(IdRows::new(&bad, &table, 2), &mut out)
        .unwrap();
    assert!(matches!(
        b.synchronize(),
        Err(GpuError::IndexOutOfRange { value: 5, .. })
    ));
    b.synchronize().unwrap();
}
