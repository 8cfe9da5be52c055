//! criterion benchmarks of the CPU reference paths (`cargo bench -p benches`).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use gpu_core::cpu::{with_mode, CpuMode};
use gpu_core::nn::attention::{AttnDims, AttnQkv, PackedSaved};
use gpu_core::nn::rows::LayerNormBwdIn;
use gpu_core::nn::Primitives;
use gpu_core::nn::{Activation, AttentionOps, BinaryKind, RowOps};
use gpu_core::{Backend, CpuBackend, DType, MatmulOps, MatmulSpec};

fn data(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0)
        .collect()
}

fn elementwise(c: &mut Criterion) {
    let cpu = CpuBackend;
    let mut g = c.benchmark_group("cpu_elementwise");
    for n in [1 << 12, 1 << 20] {
        let (x, y) = (cpu.upload(&data(n)).unwrap(), cpu.upload(&data(n)).unwrap());
        let mut o = cpu.allocate(DType::F32, n).unwrap();
        g.throughput(Throughput::Bytes(3 * 4 * n as u64));
        g.bench_with_input(BenchmarkId::new("add", n), &n, |b, _| {
            b.iter(|| {
                cpu.broadcast_binary(BinaryKind::Add, &x, &[n], &y, &[n], &mut o)
                    .unwrap()
            })
        });
        g.throughput(Throughput::Bytes(2 * 4 * n as u64));
        g.bench_with_input(BenchmarkId::new("tanh", n), &n, |b, _| {
            b.iter(|| cpu.activation_fwd(Activation::Tanh, &x, &mut o).unwrap())
        });
    }
    g.finish();
}

fn rows(c: &mut Criterion) {
    let cpu = CpuBackend;
    let (r, cols) = (256, 1024);
    let x = cpu.upload(&data(r * cols)).unwrap();
    let (gm, bt) = (
        cpu.upload(&data(cols)).unwrap(),
        cpu.upload(&data(cols)).unwrap(),
    );
    let mut o = cpu.allocate(DType::F32, r * cols).unwrap();
    let (mut mean, mut rstd) = (
        cpu.allocate(DType::F32, r).unwrap(),
        cpu.allocate(DType::F32, r).unwrap(),
    );
    let mut g = c.benchmark_group("cpu_rows_256x1024");
    g.throughput(Throughput::Bytes(2 * 4 * (r * cols) as u64));
    g.bench_function("softmax", |b| {
        b.iter(|| cpu.softmax_fwd(&x, &mut o, cols).unwrap())
    });
    g.bench_function("layernorm", |b| {
        b.iter(|| {
            cpu.layernorm_fwd((&x, &gm, &bt), (&mut o, &mut mean, &mut rstd), cols, 1e-5)
                .unwrap()
        })
    });
    g.finish();
}

fn matmul(c: &mut Criterion) {
    let cpu = CpuBackend;
    let mut g = c.benchmark_group("cpu_sgemm");
    g.sample_size(10);
    for n in [256, 512] {
        let s = MatmulSpec::new(n, n, n);
        let (a, b2) = (
            cpu.upload(&data(n * n)).unwrap(),
            cpu.upload(&data(n * n)).unwrap(),
        );
        let mut o = cpu.allocate(DType::F32, n * n).unwrap();
        g.throughput(Throughput::Elements(s.flops() as u64));
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| cpu.matmul(s, &a, &b2, &mut o).unwrap())
        });
    }
    g.finish();
}

/// The tiny GPT's non-GEMM ops at its shapes (batch 12 × 64 tokens, width 128, 4 heads of
/// 32), in the exact and the fast CPU mode.
fn gpt_ops(c: &mut Criterion) {
    let cpu = CpuBackend;
    let (rows, cols) = (768, 128);
    let (n, t, d) = (48, 64, 32);
    let up = |len: usize| cpu.upload(&data(len)).unwrap();
    let z = |len: usize| cpu.allocate(DType::F32, len).unwrap();
    let (x, w, dy, h) = (
        up(rows * cols),
        up(cols),
        up(rows * cols),
        up(rows * 4 * cols),
    );
    let (q, k, v, dout) = (up(n * t * d), up(n * t * d), up(n * t * d), up(n * t * d));
    let (mut o, mut mean, mut rstd) = (z(rows * cols), z(rows), z(rows));
    let (mut dx, mut dw, mut db) = (z(rows * cols), z(cols), z(cols));
    let (mut ho, mut hg, hdy) = (z(rows * 4 * cols), z(rows * 4 * cols), up(rows * 4 * cols));
    let (mut ao, mut lse) = (z(n * t * d), z(n * t));
    let (mut dq, mut dk, mut dv) = (z(n * t * d), z(n * t * d), z(n * t * d));
    let mut g = c.benchmark_group("cpu_gpt_ops");
    g.sample_size(20);
    for mode in [CpuMode::Exact, CpuMode::Fast] {
        let m = format!("{mode:?}").to_lowercase();
        g.bench_function(format!("gelu_fwd_768x512/{m}"), |b| {
            b.iter(|| with_mode(mode, || cpu.activation_fwd(Activation::Gelu, &h, &mut ho)))
        });
        g.bench_function(format!("gelu_bwd_768x512/{m}"), |b| {
            b.iter(|| {
                with_mode(mode, || {
                    cpu.activation_bwd(Activation::Gelu, &h, &h, &hdy, &mut hg)
                })
            })
        });
        g.bench_function(format!("layernorm_fwd_768x128/{m}"), |b| {
            b.iter(|| {
                with_mode(mode, || {
                    cpu.layernorm_fwd((&x, &w, &w), (&mut o, &mut mean, &mut rstd), cols, 1e-5)
                })
            })
        });
        g.bench_function(format!("layernorm_bwd_768x128/{m}"), |b| {
            b.iter(|| {
                with_mode(mode, || {
                    cpu.layernorm_bwd(
                        LayerNormBwdIn {
                            x: &x,
                            w: &w,
                            mean: &mean,
                            rstd: &rstd,
                            dy: &dy,
                        },
                        (&mut dx, &mut dw, &mut db),
                        cols,
                    )
                })
            })
        });
        let scale = 1.0 / (d as f32).sqrt();
        g.bench_function(format!("attention_fwd_48x64x32/{m}"), |b| {
            b.iter(|| {
                with_mode(mode, || {
                    cpu.causal_attention_fwd(
                        AttnQkv {
                            q: &q,
                            k: &k,
                            v: &v,
                        },
                        (&mut ao, &mut lse),
                        AttnDims { n, t, d, scale },
                    )
                })
            })
        });
        g.bench_function(format!("attention_bwd_48x64x32/{m}"), |b| {
            b.iter(|| {
                with_mode(mode, || {
                    cpu.causal_attention_bwd(
                        AttnQkv {
                            q: &q,
                            k: &k,
                            v: &v,
                        },
                        PackedSaved {
                            out: &ao,
                            lse: &lse,
                            dout: &dout,
                        },
                        (&mut dq, &mut dk, &mut dv),
                        AttnDims { n, t, d, scale },
                    )
                })
            })
        });
    }
    g.finish();
}

criterion_group!(benches, elementwise, rows, matmul, gpt_ops);
criterion_main!(benches);
