//! Parity of every CUDA kernel with the CPU reference, on fresh random inputs of awkward sizes,
//! outputs poisoned before each launch. Each test body is generic over the backend and runs on
//! the CPU always and on CUDA when present, through both launchers and both kernel images.

mod common;

use common::*;
use gpu_core::{BinaryOp, KernelOps, MatmulSpec, UnaryOp};
use rand::rngs::StdRng;

fn vector_add<B: KernelOps>(b: &B, x: &[f32], y: &[f32]) -> Vec<f32> {
    let mut o = poisoned(b, x.len());
    b.vector_add(&up(b, x), &up(b, y), &mut o).unwrap();
    down(b, &o)
}

fn binary<B: KernelOps>(b: &B, op: BinaryOp, x: &[f32], y: &[f32]) -> Vec<f32> {
    let mut o = poisoned(b, x.len());
    b.binary(op, &up(b, x), &up(b, y), &mut o).unwrap();
    down(b, &o)
}

fn unary<B: KernelOps>(b: &B, op: UnaryOp, x: &[f32]) -> Vec<f32> {
    let mut o = poisoned(b, x.len());
    b.unary(op, &up(b, x), &mut o).unwrap();
    down(b, &o)
}

fn softmax<B: KernelOps>(b: &B, x: &[f32], cols: usize) -> Vec<f32> {
    let mut o = poisoned(b, x.len());
    b.softmax_rows(&up(b, x), &mut o, cols).unwrap();
    down(b, &o)
}

fn layernorm<B: KernelOps>(b: &B, x: &[f32], g: &[f32], be: &[f32], cols: usize) -> Vec<f32> {
    let mut o = poisoned(b, x.len());
    b.layernorm_rows(&up(b, x), &up(b, g), &up(b, be), &mut o, cols, 1e-5)
        .unwrap();
    down(b, &o)
}

fn matmul<B: KernelOps>(b: &B, s: MatmulSpec, x: &[f32], y: &[f32]) -> Vec<f32> {
    let mut o = poisoned(b, s.batch * s.m * s.n);
    b.matmul(s, &up(b, x), &up(b, y), &mut o).unwrap();
    down(b, &o)
}

fn vector_add_body<B: KernelOps>(b: &B, dev: &str, rng: &mut StdRng) {
    for &n in SIZES {
        let (x, y) = (random_vec(rng, n, 10.0), random_vec(rng, n, 10.0));
        // Seed B's test: c = a + b, one IEEE add per element, so bit-identical to the CPU.
        assert_eq!(
            vector_add(b, &x, &y),
            vector_add(&CPU, &x, &y),
            "{dev} n={n}"
        );
    }
}

fn add_mul_body<B: KernelOps>(b: &B, dev: &str, rng: &mut StdRng) {
    for &n in SIZES {
        let (x, y) = (random_vec(rng, n, 10.0), random_vec(rng, n, 10.0));
        for op in [BinaryOp::Add, BinaryOp::Mul] {
            assert_eq!(
                binary(b, op, &x, &y),
                binary(&CPU, op, &x, &y),
                "{dev} {op:?} n={n}"
            );
        }
    }
}

fn activations_body<B: KernelOps>(b: &B, dev: &str, rng: &mut StdRng) {
    for &n in SIZES {
        let mut x = random_vec(rng, n, 8.0);
        if n > 3 {
            x[0] = 0.0;
            x[1] = -0.0;
            x[2] = 80.0; // saturates sigmoid and tanh
        }
        for op in [UnaryOp::Relu, UnaryOp::Sigmoid, UnaryOp::Tanh] {
            let what = format!("{dev} {op:?} n={n}");
            assert_close(&what, &unary(b, op, &x), &unary(&CPU, op, &x), 1e-6, 1e-7);
        }
    }
}

/// No rows; rows of 1, 31, 1023 columns; widths with and without float4 loads; rows cached in
/// shared memory (up to 12032 columns) and streamed (wider); rows wider than one block.
const ROWS: &[(usize, usize)] = &[
    (0, 7),
    (1, 1),
    (5, 31),
    (3, 1023),
    (2, 5000),
    (2, 5001),
    (3, 4096),
    (1, 12_032),
    (2, 12_036),
    (1, 70_001),
    (257, 64),
];

fn softmax_body<B: KernelOps>(b: &B, dev: &str, rng: &mut StdRng) {
    for &(rows, cols) in ROWS {
        let x = random_vec(rng, rows * cols, 12.0);
        let what = format!("{dev} softmax {rows}x{cols}");
        assert_close(
            &what,
            &softmax(b, &x, cols),
            &softmax(&CPU, &x, cols),
            5e-6,
            1e-9,
        );
    }
}

fn layernorm_body<B: KernelOps>(b: &B, dev: &str, rng: &mut StdRng) {
    for &(rows, cols) in ROWS {
        // An offset mean exercises the centred variance.
        let x: Vec<f32> = random_vec(rng, rows * cols, 3.0)
            .iter()
            .map(|v| v + 5.0)
            .collect();
        let (g, be) = (random_vec(rng, cols, 2.0), random_vec(rng, cols, 1.0));
        let what = format!("{dev} layernorm {rows}x{cols}");
        let want = layernorm(&CPU, &x, &g, &be, cols);
        assert_close(&what, &layernorm(b, &x, &g, &be, cols), &want, 5e-6, 2e-6);
    }
}

fn matmul_body<B: KernelOps>(b: &B, dev: &str, rng: &mut StdRng) {
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
        for (trans_a, trans_b) in [(false, false), (true, false), (false, true), (true, true)] {
            let s = MatmulSpec {
                batch,
                m,
                n,
                k,
                trans_a,
                trans_b,
            };
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

#[test]
fn gpu_vector_add_matches_cpu() {
    on_every_device!("gpu_vector_add_matches_cpu", vector_add_body);
}

#[test]
fn gpu_add_mul_match_cpu() {
    on_every_device!("gpu_add_mul_match_cpu", add_mul_body);
}

#[test]
fn gpu_activations_match_cpu() {
    on_every_device!("gpu_activations_match_cpu", activations_body);
}

#[test]
fn gpu_softmax_matches_cpu() {
    on_every_device!("gpu_softmax_matches_cpu", softmax_body);
}

#[test]
fn gpu_layernorm_matches_cpu() {
    on_every_device!("gpu_layernorm_matches_cpu", layernorm_body);
}

#[test]
fn gpu_matmul_matches_cpu() {
    on_every_device!("gpu_matmul_matches_cpu", matmul_body);
}
