//! bf16 GEMM on tensor cores (`gpu_cuda::blas_bf16`) against its f64 reference on fresh random
//! inputs (seed printed): every transpose, batches, bf16 and f32 outputs, empty and k = 0
//! shapes, NaN confined to its row, typed errors. Tests named `gpu_*` skip with a printed reason
//! without a GPU.

mod common;

use common::*;
use gpu_core::testing::every_transpose;
use gpu_core::{Backend, DType, MatmulSpec};
use gpu_cuda::blas_bf16::{matmul_bf16_reference, matmul_bf16_terms};
use half::bf16;

/// f32 unit roundoff; bf16's is 2^-8.
const U32: f64 = f32::EPSILON as f64 / 2.0;
const U16: f64 = 1.0 / 256.0;

/// Σ_t |a_it·b_tj| for entry (p, i, j).
fn magnitude(s: &MatmulSpec, a: &[bf16], b: &[bf16], at: (usize, usize, usize)) -> f64 {
    matmul_bf16_terms(s, (a, b), at).map(f64::abs).sum()
}

#[test]
fn gpu_bf16_matmul_matches_its_reference_within_the_accumulation_bound() {
    let (gpu, mut r) = skip_unless!(gpu_and_rng(
        "gpu_bf16_matmul_matches_its_reference_within_the_accumulation_bound"
    ));
    for (batch, m, n, k) in [
        (1, 64, 48, 96),
        (3, 17, 33, 65),
        (1, 1, 300, 7),
        (2, 130, 1, 513),
    ] {
        for s in every_transpose((batch, m, n, k)) {
            case(&gpu, &mut r, s);
        }
    }
}

/// Skinny products (at most 16 rows against a `[n, k]` weight, k a multiple of 8): what a
/// decode step multiplies, taken by the kernels of `nn_gemv_bf16.cu` instead of cuBLAS.
#[test]
fn gpu_bf16_skinny_matmul_matches_its_reference_within_the_accumulation_bound() {
    let (gpu, mut r) = skip_unless!(gpu_and_rng(
        "gpu_bf16_skinny_matmul_matches_its_reference_within_the_accumulation_bound"
    ));
    for m in [1, 2, 3, 5, 8, 9, 16] {
        for (n, k) in [(1, 8), (37, 72), (1030, 2056), (3, 8192)] {
            let s = MatmulSpec {
                trans_b: true,
                ..MatmulSpec::new(m, n, k)
            };
            case(&gpu, &mut r, s);
        }
    }
}

/// One product on fresh random bf16 operands against the reference, every output type.
fn case(gpu: &gpu_cuda::CudaBackend, r: &mut rand::rngs::StdRng, s: MatmulSpec) {
    let MatmulSpec { batch, m, n, k, .. } = s;
    let a = bf16s(r, batch * m * k, 2.0);
    let b = bf16s(r, batch * k * n, 2.0);
    let want = matmul_bf16_reference(s, &a, &b);
    let (da, db) = (gpu.upload(&a).unwrap(), gpu.upload(&b).unwrap());
    for out in [DType::F32, DType::BF16] {
        let mut dc = gpu.allocate(out, batch * m * n).unwrap();
        gpu.matmul_bf16(s, &da, &db, &mut dc).unwrap();
        let got: Vec<f64> = match out {
            DType::F32 => gpu
                .download::<f32>(&dc)
                .unwrap()
                .into_iter()
                .map(f64::from)
                .collect(),
            _ => gpu
                .download::<bf16>(&dc)
                .unwrap()
                .into_iter()
                .map(|x| f64::from(x.to_f32()))
                .collect(),
        };
        // f32 accumulation of k exact products (tensor cores may truncate instead of
        // rounding: 2u a step), then one rounding to the output type.
        let round = if out == DType::BF16 { U16 } else { U32 };
        for p in 0..batch {
            for i in 0..m {
                for j in 0..n {
                    let e = (p * m + i) * n + j;
                    let w = f64::from(want[e]);
                    let mag = magnitude(&s, &a, &b, (p, i, j));
                    let bound = round * w.abs() + (1.0 + round) * (2 * k + 2) as f64 * U32 * mag;
                    let err = (got[e] - w).abs();
                    assert!(
                        err <= bound,
                        "{s:?} {out}: ({p}, {i}, {j}) {err:e} > {bound:e}"
                    );
                }
            }
        }
    }
}

#[test]
fn gpu_bf16_matmul_edges_and_errors() {
    let (gpu, mut r) = skip_unless!(gpu_and_rng("gpu_bf16_matmul_edges_and_errors"));
    // NaN in row 0 of A reaches row 0 of C only.
    let s = MatmulSpec::new(4, 5, 6);
    let mut a = bf16s(&mut r, 24, 2.0);
    a[2] = bf16::NAN;
    let b = bf16s(&mut r, 30, 2.0);
    let (da, db) = (gpu.upload(&a).unwrap(), gpu.upload(&b).unwrap());
    let mut dc = gpu.allocate(DType::F32, 20).unwrap();
    gpu.matmul_bf16(s, &da, &db, &mut dc).unwrap();
    let c = gpu.download::<f32>(&dc).unwrap();
    assert!(c[..5].iter().all(|x| x.is_nan()) && c[5..].iter().all(|x| x.is_finite()));
    // k = 0: zeros; empty outputs: nothing to do.
    let s0 = MatmulSpec::new(3, 2, 0);
    let empty = gpu.allocate(DType::BF16, 0).unwrap();
    let mut c0 = gpu.upload(&[bf16::from_f32(7.0); 6]).unwrap();
    gpu.matmul_bf16(s0, &empty, &empty, &mut c0).unwrap();
    assert!(gpu
        .download::<bf16>(&c0)
        .unwrap()
        .iter()
        .all(|x| x.to_f32() == 0.0));
    let mut none = gpu.allocate(DType::F32, 0).unwrap();
    gpu.matmul_bf16(MatmulSpec::new(0, 5, 6), &empty, &db, &mut none)
        .unwrap();
    // Wrong dtypes, wrong lengths, overflowing shapes: typed errors.
    let f = gpu.allocate(DType::F32, 24).unwrap();
    assert!(gpu.matmul_bf16(s, &f, &db, &mut dc).is_err());
    let mut u = gpu.allocate(DType::U32, 20).unwrap();
    assert!(gpu.matmul_bf16(s, &da, &db, &mut u).is_err());
    assert!(gpu
        .matmul_bf16(MatmulSpec::new(4, 5, 7), &da, &db, &mut dc)
        .is_err());
    let huge = MatmulSpec {
        batch: usize::MAX,
        ..MatmulSpec::new(4, 5, 6)
    };
    assert!(gpu.matmul_bf16(huge, &da, &db, &mut dc).is_err());
}
