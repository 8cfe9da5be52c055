//! `gemm-shapes`: GFLOP/s of the CPU backend's SGEMM on the tiny GPT's matrix shapes (one
//! training step's forward and backward products) and on square sizes, 2 threads by default.

use benches::median;
use gpu_core::{Backend, CpuBackend, DType, MatmulOps, MatmulSpec};
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let cpu = CpuBackend;
    // (m, n, k, trans_a, trans_b): forward x·Wᵀ, backward g·W and gᵀ·x, per GPT linear layer.
    let mut shapes = Vec::new();
    for (o, i) in [(384, 128), (128, 128), (512, 128), (128, 512), (65, 128)] {
        shapes.push((768, o, i, false, true));
        shapes.push((768, i, o, false, false));
        shapes.push((o, i, 768, true, false));
    }
    for n in [256, 512, 1024] {
        shapes.push((n, n, n, false, false));
    }
    let mut total = 0.0;
    for (m, n, k, ta, tb) in shapes {
        let spec = MatmulSpec {
            batch: 1,
            m,
            n,
            k,
            trans_a: ta,
            trans_b: tb,
        };
        let data = |len: usize| -> Vec<f32> {
            (0..len)
                .map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0)
                .collect()
        };
        let (a, b) = (cpu.upload(&data(m * k))?, cpu.upload(&data(k * n))?);
        let mut c = cpu.allocate(DType::F32, m * n)?;
        let reps = (2e9 / spec.flops()).clamp(5.0, 2000.0) as usize;
        for _ in 0..3 {
            cpu.matmul(spec, &a, &b, &mut c)?;
        }
        let mut t = Vec::new();
        for _ in 0..reps {
            let t0 = Instant::now();
            cpu.matmul(spec, &a, &b, &mut c)?;
            t.push(t0.elapsed().as_secs_f64());
        }
        let s = median(&t);
        if m == 768 || n == 128 || k == 768 {
            total += s;
        }
        println!(
            "{m:5} x {n:4} x {k:4} ta={ta:<5} tb={tb:<5} {:8.1} us {:6.1} GFLOP/s",
            s * 1e6,
            spec.flops() / s / 1e9
        );
    }
    println!(
        "GPT-shape products, one per layer kind: {:.2} ms",
        total * 1e3
    );
    Ok(())
}
