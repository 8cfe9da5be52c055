//! criterion benchmarks of the world model's accelerator on the CPU at batch 32, the rows of
//! the roadmap's latency table: state encode, GRU ensemble forward over 10 steps, randomized
//! SVD of rank 32 of a 1024² residual, and the rank-32 correction of a 1024² weight
//! (`cargo bench -p benches --bench rssm_cpu`). The model is the default (64 → 128,
//! five GRU members of 256, Gaussian latent 32). Engines: `fast` (the CPU default: f32,
//! packed weights, SIMD dispatched at run time), `reference` (the exact f64 `nalgebra`
//! path), `tensor` (the tensor-ops forward on the CPU backend). `benches/torch_rssm_cpu.py`
//! times PyTorch on the same rows; run both back to back.

use criterion::{criterion_group, criterion_main, Criterion};
use rssm::{Engine, GpuAccelerator, Rssm, RssmConfig, SequenceBatch, SvdOptions};
use tensor_ops::{Device, Tensor};

const BATCH: usize = 32;
const STEPS: usize = 10;

/// Deterministic values in [-1, 1).
fn data(n: usize, salt: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i + salt) * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

/// The default model, trained one step (so that it may predict) on a small batch.
fn model() -> Rssm {
    let mut m = Rssm::new(RssmConfig::default(), Device::Cpu).unwrap();
    let x = Tensor::from_vec(data(2 * 3 * 64, 1), &[2, 3, 64], Device::Cpu).unwrap();
    m.train_step(&SequenceBatch::new(x), 1e-4).unwrap();
    m
}

fn engine(e: Engine) -> GpuAccelerator {
    GpuAccelerator::with_model(model()).with_engine(e).unwrap()
}

fn accelerators() -> [(&'static str, GpuAccelerator); 3] {
    [
        ("fast", engine(Engine::Fast)),
        ("reference", engine(Engine::Reference)),
        ("tensor", engine(Engine::Tensor)),
    ]
}

fn encode_and_predict(c: &mut Criterion) {
    let features = Tensor::from_vec(data(BATCH * 64, 2), &[BATCH, 64], Device::Cpu).unwrap();
    let context = features.reshape(&[BATCH, 1, 64]).unwrap();
    let mut g = c.benchmark_group("rssm_cpu_batch32");
    g.sample_size(20);
    for (name, acc) in accelerators() {
        g.bench_function(format!("state_encode/{name}"), |b| {
            b.iter(|| acc.encode_state(&features).unwrap())
        });
        g.bench_function(format!("gru_ensemble_forward_{STEPS}_steps/{name}"), |b| {
            b.iter(|| acc.predict_batch(&context, STEPS).unwrap())
        });
    }
    g.finish();
}

/// The residual of the PyTorch script: `G1·G2` (Gaussian `n × 32` times `32 × n`, rank 32)
/// plus `0.01·noise`.
fn residual(n: usize) -> Tensor {
    let g1 = Tensor::randn(&[n, 32], 1.0, 1, Device::Cpu).unwrap();
    let g2 = Tensor::randn(&[32, n], 1.0, 2, Device::Cpu).unwrap();
    let noise = Tensor::randn(&[n, n], 0.01, 3, Device::Cpu).unwrap();
    g1.matmul(&g2).unwrap().add(&noise).unwrap()
}

fn svd_and_correction(c: &mut Criterion) {
    let n = 1024;
    let residual = residual(n);
    let opts = SvdOptions::default();
    let mut g = c.benchmark_group("rssm_cpu_1024");
    g.sample_size(10);
    for (name, e) in [("fast", Engine::Fast), ("reference", Engine::Reference)] {
        let acc = GpuAccelerator::new(Device::Cpu)
            .unwrap()
            .with_engine(e)
            .unwrap();
        g.bench_function(format!("svd_rank32_randomized/{name}"), |b| {
            b.iter(|| acc.compress_residuals(&residual, 32, &opts).unwrap())
        });
        let correction = acc.compress_residuals(&residual, 32, &opts).unwrap();
        let w = Tensor::from_vec(data(n * n, 4), &[n, n], Device::Cpu).unwrap();
        g.bench_function(format!("correction_rank32/{name}"), |b| {
            b.iter(|| acc.apply_corrections(&w, &correction).unwrap())
        });
    }
    g.finish();
}

criterion_group!(benches, encode_and_predict, svd_and_correction);
criterion_main!(benches);
