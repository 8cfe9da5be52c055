//! cuBLAS SGEMM (`MatmulOps` on CUDA) against the CPU's SGEMM (the `gemm` crate): every transpose
//! combination, batched, empty and degenerate shapes, outputs poisoned before each call.
//! Tolerance: norm-wise and elementwise 1e-5 (f32 sums of at most 300 unit-size products, TF32
//! off; the rounding of either side is below ~300·6e-8 relative to Σ|a·b|).

mod common;

use common::*;
use gpu_core::testing::every_transpose;
use gpu_core::{MatmulOps, MatmulSpec};
use rand::rngs::StdRng;

fn matmul<B: MatmulOps + gpu_core::nn::ElementwiseOps>(
    b: &B,
    s: MatmulSpec,
    x: &[f32],
    y: &[f32],
) -> Vec<f32> {
    run_op(b, [x, y], s.batch * s.m * s.n, |[x, y], o| {
        b.matmul(s, x, y, o)
    })
}

fn matmul_body<B: MatmulOps + gpu_core::nn::ElementwiseOps>(b: &B, dev: &str, rng: &mut StdRng) {
    let cases = [
        (1, 2, 2, 2),
        (1, 1, 1, 1),
        (1, 31, 17, 33),
        (1, 64, 1, 300),
        (3, 33, 65, 129),
        (2, 0, 4, 4),
        (1, 5, 6, 0),
    ];
    for (batch, m, n, k) in cases {
        for s in every_transpose((batch, m, n, k)) {
            let (x, y) = (
                random_vec(rng, batch * m * k, 1.0),
                random_vec(rng, batch * k * n, 1.0),
            );
            let what = format!("{dev} matmul {s:?}");
            assert_close(
                &what,
                &matmul(b, s, &x, &y),
                &matmul(&CPU, s, &x, &y),
                1e-5,
                1e-5,
            );
        }
    }
}

every_device_test!(gpu_matmul_matches_cpu, matmul_body);
