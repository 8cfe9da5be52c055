//! Seed C's demo: device info, a memory round trip, a 2×2 matmul and a 1024² matmul checked
//! against independent references, with the achieved GFLOP/s. Runs on the GPU when present.

use anyhow::{ensure, Result};
use gpu_core::{Backend, CpuBackend, DType, Device, MatmulOps, MatmulSpec};
use rand::Rng;
use std::time::Instant;

/// What the demo measured, for tests and the CLI's summary.
#[derive(Debug, Clone)]
pub struct DemoReport {
    pub device: Device,
    pub device_name: String,
    pub round_trip_elements: usize,
    /// Largest relative error of the 1024² product against f64 dot products.
    pub matmul_rel_error: f64,
    /// Norm-wise relative error against the CPU backend (GPU runs only).
    pub vs_cpu_rel_error: Option<f64>,
    pub gflops: f64,
}

/// Runs the demo on `device` with `n × n` matrices (the CLI uses 1024).
pub fn run(device: Device, n: usize) -> Result<DemoReport> {
    match device {
        Device::Cpu => run_on(&CpuBackend, device, n),
        Device::Cuda(i) => {
            // The same instance as the tensors on this device use (one context, stream and pool).
            let gpu = tensor_ops::cuda_backend(i)?;
            let info = gpu.info();
            println!(
                "CUDA device {i}: {} (compute {}.{}, {} SMs, {:.1} GiB)",
                info.name,
                info.compute_capability.0,
                info.compute_capability.1,
                info.multiprocessors,
                info.total_memory as f64 / (1u64 << 30) as f64
            );
            run_on(&gpu, device, n)
        }
        Device::Wgpu(i) => {
            // The tensors' shared backend of this adapter.
            let gpu = tensor_ops::wgpu_backend(i)?;
            println!(
                "wgpu adapter {i}: {} ({:?})",
                gpu.info().adapter.name,
                gpu.info().adapter.device_type
            );
            run_on(&gpu, device, n)
        }
    }
}

fn run_on<B: MatmulOps>(b: &B, device: Device, n: usize) -> Result<DemoReport> {
    println!(
        "device: {device} = {} ({:?})",
        b.device_name(),
        b.device_type()
    );
    let avail = b.memory_available()?;
    println!(
        "memory available: {:.2} GiB",
        avail as f64 / (1u64 << 30) as f64
    );

    // 1. Memory round trip.
    let mut rng = rand::rng();
    let count = 1 << 20;
    let host: Vec<f32> = (0..count).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let back: Vec<f32> = b.download(&b.upload(&host)?)?;
    ensure!(back == host, "memory round trip changed the data");
    println!("memory round trip: {count} f32 up and back, identical");

    // 2. A 2×2 product with a known answer.
    let (a2, b2) = (
        b.upload(&[1.0f32, 2.0, 3.0, 4.0])?,
        b.upload(&[5.0f32, 6.0, 7.0, 8.0])?,
    );
    let mut c2 = b.allocate(DType::F32, 4)?;
    b.matmul(MatmulSpec::new(2, 2, 2), &a2, &b2, &mut c2)?;
    let c2: Vec<f32> = b.download(&c2)?;
    ensure!(c2 == [19.0, 22.0, 43.0, 50.0], "2x2 matmul gave {c2:?}");
    println!("2x2 matmul: [[1,2],[3,4]] x [[5,6],[7,8]] = {c2:?}  ok");

    // 3. n × n product: checked against f64 dot products at random entries, timed.
    let a: Vec<f32> = (0..n * n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let bm: Vec<f32> = (0..n * n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let (da, db) = (b.upload(&a)?, b.upload(&bm)?);
    let mut dc = b.allocate(DType::F32, n * n)?;
    let spec = MatmulSpec::new(n, n, n);
    b.matmul(spec, &da, &db, &mut dc)?; // warm-up (module load, cuBLAS handle)
    b.synchronize()?;
    let reps = 5;
    let t = Instant::now();
    for _ in 0..reps {
        b.matmul(spec, &da, &db, &mut dc)?;
    }
    b.synchronize()?;
    let secs = t.elapsed().as_secs_f64() / reps as f64;
    let gflops = spec.flops() / secs / 1e9;
    let c: Vec<f32> = b.download(&dc)?;
    let mut worst = 0.0f64;
    for _ in 0..64 {
        let (i, j) = (rng.random_range(0..n), rng.random_range(0..n));
        let exact: f64 = (0..n)
            .map(|k| a[i * n + k] as f64 * bm[k * n + j] as f64)
            .sum();
        let scale: f64 = (0..n)
            .map(|k| (a[i * n + k] as f64 * bm[k * n + j] as f64).abs())
            .sum();
        worst = worst.max((c[i * n + j] as f64 - exact).abs() / scale.max(f64::MIN_POSITIVE));
    }
    ensure!(
        worst < 1e-5,
        "{n}x{n} matmul: relative error {worst:e} against f64"
    );
    let vs_cpu = if device != Device::Cpu {
        let cpu = CpuBackend;
        let mut cc = cpu.allocate(DType::F32, n * n)?;
        cpu.matmul(spec, &cpu.upload(&a)?, &cpu.upload(&bm)?, &mut cc)?;
        let cc = cc.as_f32()?;
        let num: f64 = c
            .iter()
            .zip(cc)
            .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
            .sum();
        let den: f64 = cc.iter().map(|y| (*y as f64).powi(2)).sum();
        let rel = (num / den).sqrt();
        ensure!(rel < 1e-5, "{n}x{n} matmul differs from the CPU by {rel:e}");
        Some(rel)
    } else {
        None
    };
    println!(
        "{n}x{n} matmul: {:.3} ms, {gflops:.1} GFLOP/s; max rel. error vs f64 {worst:.1e}{}",
        secs * 1e3,
        vs_cpu.map_or(String::new(), |r| format!(", vs CPU {r:.1e}"))
    );
    Ok(DemoReport {
        device,
        device_name: b.device_name(),
        round_trip_elements: count,
        matmul_rel_error: worst,
        vs_cpu_rel_error: vs_cpu,
        gflops,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demo_runs_on_the_cpu() {
        let r = run(Device::Cpu, 128).unwrap();
        assert_eq!(r.device, Device::Cpu);
        assert!(r.matmul_rel_error < 1e-5 && r.gflops > 0.0);
        assert!(r.vs_cpu_rel_error.is_none());
    }
}
