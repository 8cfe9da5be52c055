//! criterion benchmarks of the CPU reference paths (`cargo bench -p benches`).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use gpu_core::nn::{Activation, BinaryKind, ElementwiseOps, RowOps};
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
            cpu.layernorm_fwd(&x, &gm, &bt, &mut o, &mut mean, &mut rstd, cols, 1e-5)
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

criterion_group!(benches, elementwise, rows, matmul);
criterion_main!(benches);
