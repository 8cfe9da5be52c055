//! `gpu-bench`: the GPU's own ceilings, then every kernel, timed with CUDA events (median of
//! timed bursts of calls queued back to back, after warm-up; inputs rotated over buffers larger
//! than L2), beside the same ops in PyTorch measured in the same run when `python3 -c "import
//! torch"` works. Writes markdown.

mod host;
mod nn;
mod nn_bf16;
mod qgemm;
mod rssm;

use anyhow::{bail, Context, Result};
use benches::{median, Row};
use clap::Parser;
use gpu_core::nn::{Activation, BinaryKind, Primitives, RowOps};
use gpu_core::{Backend, DType, MatmulOps, MatmulSpec};
use gpu_cuda::{CudaBackend, CudaBuffer, GpuTimer};
use rand::Rng;
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;

#[derive(Parser)]
#[command(about = "Benchmark the CUDA kernels against the GPU's ceilings and PyTorch")]
struct Args {
    /// Markdown report to write.
    #[arg(long, default_value = "target/benchmarks.md")]
    out: PathBuf,
    /// The PyTorch peer script (benches/torch_peer.py).
    #[arg(long, default_value = "benches/torch_peer.py")]
    torch_script: PathBuf,
    /// Skip the PyTorch comparison.
    #[arg(long)]
    no_torch: bool,
    /// Timed samples per row (after warm-up).
    #[arg(long, default_value_t = 30)]
    reps: usize,
    /// Kernel rows: calls queued back to back in each timed sample (the sample's time divided
    /// by this), so that the host's launch work overlaps the GPU's as in a real program; 1
    /// times each call alone between two events, its launch latency included. The PyTorch peer
    /// times its rows the same way.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    burst: u32,
    /// Only the world model's rows (`rssm`), skipping the kernel and ceiling rows.
    #[arg(long)]
    only_rssm: bool,
    /// Only the randomized SVD rows (implies `--only-rssm`; for profilers).
    #[arg(long)]
    only_svd: bool,
    /// Text for the GPT training-step row (tinyshakespeare); the row is skipped without it.
    #[arg(long)]
    gpt_text: Option<PathBuf>,
    /// Only the GPT training-step rows (needs `--gpt-text`).
    #[arg(long)]
    only_gpt: bool,
    /// Only the quantized matmul's two forms of more than 4 rows (fused dequantize-GEMM and
    /// dequantize-then-cuBLAS) on a Llama-3.2-1B layer's shapes, printed (no report written).
    #[arg(long)]
    only_qgemm: bool,
    /// Only the host time per queued op (no PyTorch peer).
    #[arg(long)]
    only_host: bool,
    /// Only the copy ceiling and the memory-bound bf16 rows (and PyTorch's).
    #[arg(long)]
    only_bf16: bool,
    /// Only the ceilings (the copy, cuBLAS's fp32 and TF32 GEMMs; with `--only-gpt`, beside
    /// the GPT rows): the CUDA rows that `wgpu-bench` compares with in the same device call.
    #[arg(long)]
    only_ceilings: bool,
}

pub(crate) const ROWS: usize = 8192;
pub(crate) const COLS: usize = 4096;

pub(crate) struct Bench {
    pub(crate) gpu: CudaBackend,
    timer: GpuTimer,
    /// Calls a timed sample queues back to back (`--burst`).
    pub(crate) burst: usize,
    reps: usize,
}

impl Bench {
    /// Median microseconds of `f(i)` over warm-up + `reps` timed calls; `i` rotates input sets.
    /// Median µs per call of `f(i)` (`i` counts the calls, to rotate inputs): each of `reps`
    /// samples times `burst` calls queued back to back, after 3 warm-up calls.
    pub(crate) fn time(&self, mut f: impl FnMut(usize) -> gpu_core::Result<()>) -> Result<f64> {
        for i in 0..3 {
            f(i)?;
        }
        self.gpu.synchronize()?;
        let mut samples = Vec::with_capacity(self.reps);
        for i in 0..self.reps {
            let ms = self.timer.time(&self.gpu, || {
                (0..self.burst).try_for_each(|j| f(i * self.burst + j))
            })?;
            samples.push(ms as f64 * 1e3 / self.burst as f64);
        }
        Ok(median(&samples))
    }

    /// As [`Bench::time`], with the burst captured once as a CUDA graph and its replays timed:
    /// the kernels' own throughput, as the PyTorch peer times SDPA (whose host work per call
    /// outlasts its kernels); launch gaps between the burst's kernels shrink on both sides.
    pub(crate) fn time_graph(
        &self,
        mut f: impl FnMut(usize) -> gpu_core::Result<()>,
    ) -> Result<f64> {
        for i in 0..3 {
            f(i)?;
        }
        self.gpu.synchronize()?;
        let graph = self.gpu.capture(|_| (0..self.burst).try_for_each(&mut f))?;
        let mut samples = Vec::with_capacity(self.reps);
        for _ in 0..self.reps {
            let ms = self
                .timer
                .time(&self.gpu, || self.gpu.launch_graph(&graph))?;
            samples.push(ms as f64 * 1e3 / self.burst as f64);
        }
        Ok(median(&samples))
    }

    pub(crate) fn random(&self, n: usize) -> Result<CudaBuffer> {
        let mut rng = rand::rng();
        let host: Vec<f32> = (0..n).map(|_| rng.random_range(-4.0f32..4.0)).collect();
        Ok(self.gpu.upload(&host)?)
    }

    pub(crate) fn out(&self, n: usize) -> Result<CudaBuffer> {
        Ok(self.gpu.allocate(DType::F32, n)?)
    }
}

pub(crate) fn row(id: &str, what: String, us: f64, bytes: Option<f64>, flops: Option<f64>) -> Row {
    println!("{id:>12}: {us:10.1} us  {what}");
    Row::new(id, what, us, bytes, flops)
}

/// The bandwidth ceiling: a 1 GiB device-to-device copy (read + write counted).
fn copy_ceiling(b: &Bench) -> Result<Row> {
    let len = 1 << 28;
    let src = b.random(len)?;
    let mut dst = b.out(len)?;
    let us = b.time(|_| b.gpu.copy_buffer(&src, &mut dst))?;
    Ok(row(
        "copy",
        "device-to-device copy, 1 GiB f32".into(),
        us,
        Some(2.0 * len as f64 * 4.0),
        None,
    ))
}

/// The ceilings: the copy and large fp32 (and TF32) cuBLAS GEMMs.
fn ceilings(b: &Bench) -> Result<Vec<Row>> {
    let mut rows = vec![copy_ceiling(b)?];
    for (id, size, tf32) in [
        ("sgemm_1024", 1024, false),
        ("sgemm_4096", 4096, false),
        ("sgemm_8192", 8192, false),
        ("tf32_4096", 4096, true),
    ] {
        let s = MatmulSpec::new(size, size, size);
        let (x, y) = (b.random(size * size)?, b.random(size * size)?);
        let mut c = b.out(size * size)?;
        b.gpu.set_tf32(tf32);
        let us = b.time(|_| b.gpu.matmul(s, &x, &y, &mut c))?;
        let mode = if tf32 { "TF32" } else { "fp32, TF32 off" };
        rows.push(row(
            id,
            format!("cuBLAS GEMM {size}³ {mode}"),
            us,
            None,
            Some(s.flops()),
        ));
    }
    b.gpu.set_tf32(false);
    Ok(rows)
}

fn measure(b: &Bench) -> Result<Vec<Row>> {
    let mut rows = ceilings(b)?;
    let n = ROWS * COLS;
    let nb = (n * 4) as f64;
    // bf16 GEMMs on tensor cores (f32 accumulation, bf16 out): 4096³ and the shakespeare-char
    // GPT's forward shapes (batch 64 × context 256 rows, width 384).
    for (id, m, n, k, what) in [
        ("bf16_4096", 4096, 4096, 4096, "4096³"),
        (
            "bf16_gpt_qkv",
            16384,
            1152,
            384,
            "16384×384 · 384×1152 (GPT qkv)",
        ),
        (
            "bf16_gpt_fc",
            16384,
            1536,
            384,
            "16384×384 · 384×1536 (GPT mlp up)",
        ),
        (
            "bf16_gpt_proj",
            16384,
            384,
            1536,
            "16384×1536 · 1536×384 (GPT mlp down)",
        ),
    ] {
        let s = MatmulSpec::new(m, n, k);
        let mut rng = rand::rng();
        let mut host = |len: usize| -> Vec<half::bf16> {
            (0..len)
                .map(|_| half::bf16::from_f32(rng.random_range(-4.0f32..4.0)))
                .collect()
        };
        let (x, y) = (b.gpu.upload(&host(m * k))?, b.gpu.upload(&host(k * n))?);
        let mut c = b.gpu.allocate(DType::BF16, m * n)?;
        let us = b.time(|_| b.gpu.matmul_bf16(s, &x, &y, &mut c))?;
        rows.push(row(
            id,
            format!("cuBLAS bf16 GEMM {what}, f32 accumulation"),
            us,
            None,
            Some(s.flops()),
        ));
    }
    // Memory-bound kernels at 8192×4096 f32 (128 MiB per tensor, twice the L2), two input sets.
    let xs = [b.random(n)?, b.random(n)?];
    let ys = [b.random(n)?, b.random(n)?];
    let mut o = b.out(n)?;
    let size = format!("{ROWS}×{COLS} f32");
    for (id, op) in [("add", BinaryKind::Add), ("mul", BinaryKind::Mul)] {
        let us = b.time(|i| {
            b.gpu
                .broadcast_binary(op, &xs[i % 2], &[n], &ys[i % 2], &[n], &mut o)
        })?;
        rows.push(row(id, format!("{id} {size}"), us, Some(3.0 * nb), None));
    }
    for op in [Activation::Relu, Activation::Sigmoid, Activation::Tanh] {
        let us = b.time(|i| b.gpu.activation_fwd(op, &xs[i % 2], &mut o))?;
        let id = op.name();
        rows.push(row(id, format!("{id} {size}"), us, Some(2.0 * nb), None));
    }
    let us = b.time(|i| b.gpu.softmax_fwd(&xs[i % 2], &mut o, COLS))?;
    rows.push(row(
        "softmax",
        format!("softmax over rows {size}"),
        us,
        Some(2.0 * nb),
        None,
    ));
    Ok(rows)
}

fn torch_rows(
    script: &PathBuf,
    reps: usize,
    burst: u32,
    gpt_text: Option<&PathBuf>,
    only_gpt: bool,
    only_bf16: bool,
) -> Result<HashMap<String, Row>> {
    let ok = Command::new("python3")
        .args(["-c", "import torch; assert torch.cuda.is_available()"])
        .status();
    if !ok.is_ok_and(|s| s.success()) {
        bail!("python3 with a CUDA-enabled torch is not available");
    }
    let out = Command::new("python3")
        .arg(script)
        .args(["--reps", &reps.to_string()])
        .args(["--burst", &burst.to_string()])
        .args(
            gpt_text
                .map(|p| vec!["--gpt-text".into(), p.display().to_string()])
                .unwrap_or_default(),
        )
        .args(only_gpt.then_some("--only-gpt"))
        .args(only_bf16.then_some("--only-bf16"))
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    print!("{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<Row> = serde_json::from_slice(&out.stdout).context("parsing the PyTorch rows")?;
    Ok(rows.into_iter().map(|r| (r.id.clone(), r)).collect())
}

fn fmt_rate(r: &Row) -> String {
    match (r.gbps(), r.tflops()) {
        (Some(g), _) => format!("{g:.0} GB/s"),
        (_, Some(t)) => format!("{t:.1} TFLOP/s"),
        _ => "-".into(),
    }
}

fn report(
    gpu: &CudaBackend,
    rows: &[Row],
    torch: &Result<HashMap<String, Row>>,
    reps: usize,
    burst: u32,
) -> String {
    let info = gpu.info();
    let copy_gbps = rows
        .iter()
        .find(|r| r.id == "copy")
        .and_then(Row::gbps)
        .unwrap_or(f64::NAN);
    let gemm_tflops = rows
        .iter()
        .find(|r| r.id == "sgemm_8192")
        .and_then(Row::tflops)
        .unwrap_or(f64::NAN);
    let mut s = format!(
        "# Benchmarks\n\nMeasured by `gpu-bench` (`cargo xtask bench`, or `run.sh --bench` in the GPU bundle) on \
         **{}** (compute capability {}.{}, {} SMs, {:.0} MiB L2, driver API {}).\n\n\
         Method: CUDA events around a burst of {burst} calls queued back to back (the host's launch \
         work overlapping the GPU's), per-call time the median of {reps} such samples after 3 warm-up \
         calls (`--burst 1`: each call alone, its launch latency included; the world model's rows always \
         time whole calls alone); \
         memory-bound rows use 8192×4096 f32 or 8192×8192 bf16 tensors (128 MiB each, larger than \
         L2) rotated over two input sets. Bytes count each input read once and each output written once. Ceilings are \
         this GPU's own, measured in the same run: a 1 GiB device-to-device copy ({copy_gbps:.0} GB/s, \
         read + write counted) for bandwidth and an fp32 8192³ cuBLAS SGEMM ({gemm_tflops:.1} TFLOP/s) \
         for arithmetic. The PyTorch column is the same op in PyTorch, timed the same way in the same \
         run; the ratio is PyTorch time / our time (above 1: ours is faster).\n\n",
        info.name,
        info.compute_capability.0,
        info.compute_capability.1,
        info.multiprocessors,
        info.l2_cache_bytes as f64 / (1 << 20) as f64,
        info.driver_version
    );
    match torch {
        Ok(_) => s += "PyTorch: measured in this run (`benches/torch_peer.py`).\n\n",
        Err(e) => s += &format!("PyTorch: not measured in this run ({e}).\n\n"),
    }
    s += "| op | ours (µs) | ours | % of ceiling | PyTorch (µs) | PyTorch | PyTorch / ours |\n|---|---:|---:|---:|---:|---:|---:|\n";
    for r in rows {
        let pct = match (r.gbps(), r.tflops()) {
            (Some(g), _) => format!("{:.0}%", 100.0 * g / copy_gbps),
            // TF32 and bf16 run on tensor cores: the fp32 SGEMM is not their ceiling.
            (_, Some(_)) if r.id.starts_with("tf32") => "n/a (TF32)".into(),
            (_, Some(_)) if r.id.starts_with("bf16") => "n/a (bf16)".into(),
            (_, Some(t)) => format!("{:.0}%", 100.0 * t / gemm_tflops),
            _ => "-".into(),
        };
        let peer = torch.as_ref().ok().and_then(|t| t.get(&r.id));
        let (pt, prate, ratio) = match peer {
            Some(p) => (
                format!("{:.1}", p.median_us),
                fmt_rate(p),
                format!("{:.2}", p.median_us / r.median_us),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        s += &format!(
            "| {} | {:.1} | {} | {pct} | {pt} | {prate} | {ratio} |\n",
            r.what,
            r.median_us,
            fmt_rate(r)
        );
    }
    // PyTorch rows with no counterpart of ours (e.g. the rollout captured in a CUDA graph).
    if let Ok(t) = torch {
        let mut extra: Vec<&Row> = t
            .values()
            .filter(|p| !rows.iter().any(|r| r.id == p.id))
            .collect();
        extra.sort_by(|a, b| a.id.cmp(&b.id));
        if !extra.is_empty() {
            s += "\nPyTorch rows without a counterpart here:\n\n| PyTorch row | µs |\n|---|---:|\n";
            for p in extra {
                s += &format!("| {} | {:.1} |\n", p.id, p.median_us);
            }
        }
    }
    s
}

fn main() -> Result<()> {
    let args = Args::parse();
    let gpu = CudaBackend::new(0).context("gpu-bench needs a CUDA GPU")?;
    println!("device: {:?}", gpu.info());
    let bench = Bench {
        timer: GpuTimer::new(&gpu)?,
        gpu: gpu.clone(),
        reps: args.reps,
        burst: args.burst as usize,
    };
    let mut rows = Vec::new();
    if args.only_qgemm {
        return qgemm::measure(&bench);
    }
    if args.only_host {
        for r in host::measure()? {
            println!("{} {:.2}", r.id, r.median_us);
        }
        return Ok(());
    }
    if args.only_gpt && args.gpt_text.is_none() {
        bail!("--only-gpt needs --gpt-text");
    }
    if args.only_bf16 {
        rows.push(copy_ceiling(&bench)?);
        rows.extend(nn_bf16::measure(&bench)?);
    } else if args.only_ceilings {
        rows.extend(ceilings(&bench)?);
    } else if !args.only_rssm && !args.only_svd && !args.only_gpt {
        rows.extend(measure(&bench)?);
        rows.extend(nn::measure(&bench)?);
        rows.extend(nn_bf16::measure(&bench)?);
    }
    if !args.only_gpt && !args.only_bf16 && !args.only_ceilings {
        rows.extend(rssm::measure(args.reps, args.only_svd)?);
    }
    if let Some(path) = &args.gpt_text {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        for tf32 in [false, true] {
            rows.push(nn::train_step(gpu.info().ordinal, &text, 10, tf32)?);
        }
        rows.extend(nn::pipelined_steps(gpu.info().ordinal, &text)?);
    }
    let torch = if args.no_torch {
        Err(anyhow::anyhow!("disabled with --no-torch"))
    } else {
        torch_rows(
            &args.torch_script,
            args.reps,
            args.burst,
            args.gpt_text.as_ref(),
            args.only_gpt,
            args.only_bf16,
        )
    };
    if let Err(e) = &torch {
        println!("PyTorch peer not measured: {e}");
    }
    let md = report(&gpu, &rows, &torch, args.reps, args.burst);
    if let Some(dir) = args.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.out, &md)?;
    println!("\n{md}\nwrote {}", args.out.display());
    Ok(())
}
