//! `wgpu-bench`: the wgpu backend against its own ceiling (issue 42, item 4): a device copy's
//! bandwidth (what wgpu itself reaches), the memory-bound primitives and a row op as a share of
//! it, the f32 GEMM at 4096³, and the GPT's fp32 training step. Each row is the median over
//! `--reps` samples of `--burst` calls queued back to back, timed on the host around the burst
//! and a `synchronize` (wgpu has no portable device timer here), after warm-up. `--small`
//! shrinks every size for a software adapter (lavapipe in CI). Writes markdown.
//!
//! The CUDA rows to compare with come from `gpu-bench` in the same device call; the batch-1
//! decode of a Llama-3.2-1B shape is `hybrid-trainer bench-generate --device wgpu` beside
//! `--device cuda` on the same model directory.

use anyhow::{Context, Result};
use benches::{median, Row};
use clap::Parser;
use gpu_core::nn::{Activation, BinaryKind, Primitives, RowOps};
use gpu_core::{Backend, DType, MatmulOps, MatmulSpec};
use gpu_wgpu::WgpuBackend;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser)]
#[command(about = "Benchmark the wgpu backend against its own copy bandwidth")]
struct Args {
    /// Markdown report to write.
    #[arg(long, default_value = "wgpu-bench.md")]
    out: PathBuf,
    /// The wgpu adapter (index in wgpu's enumeration).
    #[arg(long, default_value_t = 0)]
    adapter: usize,
    /// Timed samples per row (after warm-up).
    #[arg(long, default_value_t = 10)]
    reps: usize,
    /// Calls queued back to back in each timed sample.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    burst: u32,
    /// Sizes for a software adapter: 256 × 256 rows, a 256³ GEMM, a GPT step of batch 4 × 32.
    #[arg(long)]
    small: bool,
    /// Text for the GPT training-step row (tinyshakespeare); the row is skipped without it.
    #[arg(long)]
    gpt_text: Option<PathBuf>,
    /// After the GPT row, time its kernels with GPU timestamps (a separate, slower pass) and
    /// append a per-kernel table: where the step's GPU time goes, and how much of the step the
    /// GPU is busy at all.
    #[arg(long, requires = "gpt_text")]
    profile: bool,
}

struct Bench {
    gpu: WgpuBackend,
    reps: usize,
    burst: usize,
}

impl Bench {
    /// Median microseconds of one call of `f`.
    fn time(&self, mut f: impl FnMut() -> gpu_core::Result<()>) -> Result<f64> {
        for _ in 0..2 {
            f()?;
        }
        self.gpu.synchronize()?;
        let mut samples = Vec::with_capacity(self.reps);
        for _ in 0..self.reps {
            let t0 = Instant::now();
            for _ in 0..self.burst {
                f()?;
            }
            self.gpu.synchronize()?;
            samples.push(t0.elapsed().as_secs_f64() * 1e6 / self.burst as f64);
        }
        Ok(median(&samples))
    }

    fn buf(&self, n: usize, v: f32) -> Result<gpu_wgpu::WgpuBuffer> {
        let mut b = self.gpu.allocate(DType::F32, n)?;
        self.gpu.fill(&mut b, v)?;
        Ok(b)
    }
}

fn row(id: &str, what: String, us: f64, bytes: Option<f64>, flops: Option<f64>) -> Row {
    println!("{id:>12}: {us:12.1} us  {what}");
    Row::new(id, what, us, bytes, flops)
}

/// The ceiling and the memory-bound rows on `[rows, cols]` f32.
fn memory_rows(b: &Bench, (rows, cols): (usize, usize)) -> Result<Vec<Row>> {
    let n = rows * cols;
    let (x, y) = (b.buf(n, 0.5)?, b.buf(n, 0.25)?);
    let mut out = b.buf(n, 0.0)?;
    let f = 4.0 * n as f64;
    let shape = [rows, cols];
    let copy = b.time(|| b.gpu.cast(&x, &mut out))?;
    let one_block = gpu_core::nn::BlockCopy::run(0, 0, n);
    let copy_kernel = b.time(|| b.gpu.copy_blocks(&x, &mut out, one_block))?;
    let add = b.time(|| {
        b.gpu
            .broadcast_binary(BinaryKind::Add, &x, &shape, &y, &shape, &mut out)
    })?;
    let gelu = b.time(|| b.gpu.activation_fwd(Activation::Gelu, &x, &mut out))?;
    let softmax = b.time(|| b.gpu.softmax_fwd(&x, &mut out, cols))?;
    let size = format!("{rows}×{cols} f32");
    Ok(vec![
        row(
            "copy",
            format!("device copy (copy_buffer_to_buffer), {size}"),
            copy,
            Some(2.0 * f),
            None,
        ),
        row(
            "copy_kernel",
            format!("device copy (a compute kernel: copy_blocks), {size}"),
            copy_kernel,
            Some(2.0 * f),
            None,
        ),
        row("add", format!("add, {size}"), add, Some(3.0 * f), None),
        row(
            "gelu",
            format!("GELU forward, {size}"),
            gelu,
            Some(2.0 * f),
            None,
        ),
        row(
            "softmax",
            format!("softmax over rows, {size}"),
            softmax,
            Some(2.0 * f),
            None,
        ),
    ])
}

/// Host time to queue one small launch (a 256-element add; no wait inside the loop): the
/// floor under a step of many small ops.
fn launch_row(b: &Bench) -> Result<Row> {
    let (x, y) = (b.buf(256, 0.5)?, b.buf(256, 0.25)?);
    let mut out = b.buf(256, 0.0)?;
    let shape = [256];
    let mut add = || {
        b.gpu
            .broadcast_binary(BinaryKind::Add, &x, &shape, &y, &shape, &mut out)
    };
    let n = 2000;
    let mut samples = Vec::new();
    for _ in 0..b.reps.max(3) {
        b.gpu.synchronize()?;
        let t0 = Instant::now();
        for _ in 0..n {
            add()?;
        }
        samples.push(t0.elapsed().as_secs_f64() * 1e6 / n as f64);
    }
    b.gpu.synchronize()?;
    Ok(row(
        "launch",
        "host time to queue one launch (256-element add, no wait)".into(),
        median(&samples),
        None,
        None,
    ))
}

fn gemm_row(b: &Bench, n: usize) -> Result<Row> {
    let (x, y) = (b.buf(n * n, 0.01)?, b.buf(n * n, 0.02)?);
    let mut out = b.buf(n * n, 0.0)?;
    let us = b.time(|| b.gpu.matmul(MatmulSpec::new(n, n, n), &x, &y, &mut out))?;
    let flops = 2.0 * (n as f64).powi(3);
    Ok(row(
        "sgemm",
        format!("f32 GEMM {n}³"),
        us,
        None,
        Some(flops),
    ))
}

fn report(rows: &[Row], name: &str) -> String {
    // The ceiling: the faster of the two copies (a copy engine's buffer copy can be slower
    // than a compute kernel's: 786 against ~1490 GB/s on an H100's Vulkan driver).
    let copy = rows
        .iter()
        .filter(|r| r.id.starts_with("copy"))
        .filter_map(Row::gbps)
        .reduce(f64::max);
    let mut s = format!(
        "# wgpu-bench on {name}\n\nMedian of timed bursts after warm-up, host clock around each \
         burst and a synchronize. Memory-bound rows as a share of the faster copy's bandwidth \
         on the same adapter.\n\n| op | µs | rate | % of the copy |\n|---|---:|---:|---:|\n"
    );
    for r in rows {
        let rate = match (r.gbps(), r.tflops()) {
            (Some(g), _) => format!("{g:.1} GB/s"),
            (_, Some(t)) => format!("{:.1} GFLOP/s", t * 1e3),
            _ => String::new(),
        };
        let share = match (r.gbps(), copy) {
            (Some(g), Some(c)) if !r.id.starts_with("copy") => format!("{:.0}%", 100.0 * g / c),
            _ => String::new(),
        };
        s += &format!("| {} | {:.1} | {rate} | {share} |\n", r.what, r.median_us);
    }
    s
}

/// The GPT step's kernels by GPU time (timestamps around every launch), per step, against
/// the step's unprofiled median `step_us`.
fn profile_gpt(
    gpu: &WgpuBackend,
    dev: tensor_ops::Device,
    text: &str,
    ((batch, block, _), step_us): ((usize, usize, usize), f64),
) -> Result<String> {
    let steps = 2;
    gpu.set_profiling(true)?;
    // `steps` timed steps after 3 warm-ups: the profile covers all 5.
    let run = benches::gpt_train_step_us(dev, text, (batch, block, steps));
    let (prof, lost) = gpu.profile();
    gpu.set_profiling(false)?;
    run?;
    let per = (steps + 3) as f64;
    let busy: f64 = prof.iter().map(|k| k.gpu_ns).sum::<f64>() / per / 1e3;
    let kernels = || prof.iter().filter(|k| !k.key.starts_with('('));
    let launches: u64 = kernels().map(|k| k.launches).sum();
    let host: f64 = kernels().map(|k| k.host_ns).sum::<f64>() / per / 1e3;
    let mut s = format!(
        "\n## Where the GPT step's GPU time goes\n\nGPU timestamps around each of {:.0} launches \
         per step ({lost} batches unread): the kernels are busy {busy:.1} µs of the step's \
         {step_us:.1} µs ({:.0}%); the rest is the host and the gaps between launches. The \
         host spends {host:.1} µs a step in the launches themselves (checks, bind groups, \
         recording); rows in parentheses are the host's other work, a call each.\n\n\
         | kernel | launches/step | GPU µs/step | % of busy | host µs/launch |\n\
         |---|---:|---:|---:|---:|\n",
        launches as f64 / per,
        100.0 * busy / step_us
    );
    for k in prof
        .iter()
        .take(30)
        .chain(prof.iter().skip(30).filter(|k| k.key.starts_with('(')))
    {
        let us = k.gpu_ns / per / 1e3;
        s += &format!(
            "| {} | {:.1} | {us:.1} | {:.1}% | {:.1} |\n",
            k.key,
            k.launches as f64 / per,
            100.0 * us / busy,
            k.host_ns / 1e3 / k.launches.max(1) as f64
        );
    }
    Ok(s)
}

fn main() -> Result<()> {
    let a = Args::parse();
    gpu_wgpu::register_device_probe();
    let gpu = WgpuBackend::shared(a.adapter).context("opening the wgpu adapter")?;
    let name = gpu.device_name();
    println!("adapter {}: {name}", a.adapter);
    let b = Bench {
        gpu,
        reps: a.reps,
        burst: a.burst as usize,
    };
    let (shape, n, step) = if a.small {
        ((256, 256), 256, (4, 32, 3))
    } else {
        ((8192, 4096), 4096, (64, 256, 10))
    };
    let mut rows = memory_rows(&b, shape)?;
    rows.push(launch_row(&b)?);
    rows.push(gemm_row(&b, n)?);
    if let Some(path) = &a.gpt_text {
        let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
        let dev = tensor_ops::Device::Wgpu(a.adapter);
        let (us, params) = benches::gpt_train_step_us(dev, &text, step)?;
        let tokens = (step.0 * step.1) as f64;
        rows.push(row(
            "gpt_step",
            format!(
                "GPT train step, shakespeare-char config ({:.1}M params, batch {}×{}), fp32, eager: {:.1}K tok/s",
                params as f64 / 1e6,
                step.0,
                step.1,
                tokens / (us * 1e-6) / 1e3
            ),
            us,
            None,
            None,
        ));
    }
    let mut md = report(&rows, &name);
    if let (true, Some(path), Some(step_us)) = (a.profile, &a.gpt_text, rows.last()) {
        let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
        let dev = tensor_ops::Device::Wgpu(a.adapter);
        md += &profile_gpt(&b.gpu, dev, &text, (step, step_us.median_us))?;
    }
    std::fs::write(&a.out, md).with_context(|| format!("writing {}", a.out.display()))?;
    println!("wrote {}", a.out.display());
    Ok(())
}
