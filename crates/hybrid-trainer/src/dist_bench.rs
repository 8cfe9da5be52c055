//! `hybrid-trainer launch --nproc-per-node N -- allreduce-bench`: the all-reduce bus bandwidth
//! of [`tensor_ops::dist::ProcessGroup`] (NCCL underneath), measured as `benches/torch_ddp.py
//! allreduce` measures `torch.distributed.all_reduce`: f32 sums in place, the median of timed
//! calls each followed by a synchronisation. Rank 0 prints one JSON line.

use anyhow::{ensure, Context, Result};
use gpu_core::{Backend, Device};
use std::time::{Duration, Instant};
use tensor_ops::dist::{ProcessGroup, ReduceOp};
use tensor_ops::Tensor;

/// Flags of the all-reduce benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct AllReduceBenchArgs {
    /// Message sizes in MiB, comma-separated.
    #[arg(long, default_value = "1,16,64,256", value_delimiter = ',')]
    pub sizes_mib: Vec<usize>,
    /// Timed calls a size.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub reps: u32,
}

/// Runs the benchmark on `device` as this process's rank.
pub fn run(device: Device, a: &AllReduceBenchArgs) -> Result<()> {
    for &mib in &a.sizes_mib {
        ensure!(
            mib > 0 && mib <= 1 << 14,
            "--sizes-mib: {mib} is not in 1..=16384"
        );
    }
    let pg = ProcessGroup::from_env(device, Duration::from_secs(120))
        .context("joining the data-parallel job")?;
    let world = pg.world_size();
    ensure!(
        world > 1,
        "allreduce-bench needs several ranks (hybrid-trainer launch)"
    );
    let mut rows = Vec::new();
    for &mib in &a.sizes_mib {
        let n = mib * (1 << 20) / 4;
        let x = Tensor::from_vec(vec![1.0f32; n], &[n], device)?;
        for _ in 0..5 {
            pg.all_reduce(&[&x], ReduceOp::Sum)?;
        }
        tensor_ops::cuda_backend(device_ordinal(device)?)?.synchronize()?;
        let mut times = Vec::with_capacity(a.reps as usize);
        for _ in 0..a.reps {
            let t0 = Instant::now();
            pg.all_reduce(&[&x], ReduceOp::Sum)?;
            tensor_ops::cuda_backend(device_ordinal(device)?)?.synchronize()?;
            times.push(t0.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let t = times[times.len() / 2];
        let bytes = 4.0 * n as f64;
        rows.push(serde_json::json!({
            "mib": mib,
            "us": t * 1e6,
            "busbw_gbs": bytes * 2.0 * (world - 1) as f64 / world as f64 / t / 1e9,
        }));
    }
    if pg.is_main() {
        println!(
            "{}",
            serde_json::json!({"peer": "ours_allreduce", "world": world, "rows": rows})
        );
    }
    pg.finish()?;
    Ok(())
}

fn device_ordinal(d: Device) -> Result<usize> {
    match d {
        Device::Cuda(i) => Ok(i),
        other => anyhow::bail!("allreduce-bench runs on CUDA devices, not {other}"),
    }
}
