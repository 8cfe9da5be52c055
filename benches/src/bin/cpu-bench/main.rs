//! `cpu-bench`: the CPU path's SGEMM (1024³, 2048³) and the tiny GPT's training step, beside
//! numpy and PyTorch CPU timed in the same run (`benches/torch_cpu_peer.py`, same thread count).
//! Prints a markdown table and writes it to `--out`.

use anyhow::{Context, Result};
use benches::median;
use clap::Parser;
use gpu_core::{cpu, Backend, CpuBackend, DType, MatmulOps, MatmulSpec};
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;
use tensor_ops::gpt::{Dataset, Gpt, GptConfig};
use tensor_ops::Device;

#[derive(Parser)]
#[command(about = "Benchmark the CPU path against numpy and PyTorch CPU in the same run")]
struct Args {
    /// Markdown table to write.
    #[arg(long, default_value = "target/cpu-bench.md")]
    out: PathBuf,
    /// The Python interpreter with numpy (and PyTorch for its rows).
    #[arg(long, default_value = "python3")]
    python: String,
    /// The peer script.
    #[arg(long, default_value = "benches/torch_cpu_peer.py")]
    peer: PathBuf,
    /// Timed repeats per SGEMM row (after 3 warm-ups).
    #[arg(long, default_value_t = 10)]
    reps: usize,
    /// Text for the GPT training-step row; the row is skipped without it.
    #[arg(long)]
    gpt_text: Option<PathBuf>,
    /// Skip the SGEMM rows (profiling the GPT step alone).
    #[arg(long)]
    no_sgemm: bool,
    /// Skip the peer (numpy, PyTorch).
    #[arg(long)]
    no_peer: bool,
    /// The CPU backend's mode for the GPT step: fast (f32 kernels, what training uses) or exact
    /// (the f64 reference).
    #[arg(long, default_value = "fast", value_parser = parse_mode)]
    cpu_mode: cpu::CpuMode,
    /// Print where the GPT step's time goes: each CPU op's total per step (`cpu::profile`).
    #[arg(long)]
    profile: bool,
}

/// Median microseconds of `f` over `reps` calls after `warmup`.
fn time_us(reps: usize, warmup: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..warmup {
        f()?;
    }
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t0 = Instant::now();
        f()?;
        t.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    Ok(median(&t))
}

fn sgemm_us(n: usize, reps: usize) -> Result<f64> {
    let cpu = CpuBackend;
    let data = |seed: usize| -> Vec<f32> {
        (0..n * n)
            .map(|i| ((i * 7919 + seed) % 1000) as f32 / 250.0 - 2.0)
            .collect()
    };
    let (a, b) = (cpu.upload(&data(1))?, cpu.upload(&data(2))?);
    let mut c = cpu.allocate(DType::F32, n * n)?;
    time_us(reps, 3, || {
        Ok(cpu.matmul(MatmulSpec::new(n, n, n), &a, &b, &mut c)?)
    })
}

/// One training step of the tiny GPT (`GptConfig::tiny`, batch 12 × 64): batch, forward,
/// backward, clip 1.0, AdamW, `loss.item()`; as the peer does.
fn gpt_step_us(text: &str, profile: bool) -> Result<f64> {
    let ds = Dataset::from_text(text, 0.9)?;
    let model = Gpt::new(GptConfig::tiny(ds.tokenizer.vocab_size()), 1, Device::Cpu)?;
    let mut opt = benches::gpt_adamw(&model)?;
    let mut rng = Dataset::rng(1);
    let mut step = || {
        let (x, y) = ds.batch(false, 12, 64, &mut rng, Device::Cpu)?;
        let loss = model.loss(&x, &y, None)?;
        let g = loss.backward()?;
        opt.step(&g, 1e-3)?;
        loss.item()?;
        Ok(())
    };
    let us = time_us(20, 5, &mut step)?;
    if profile {
        print_profile(&mut step)?;
    }
    Ok(us)
}

/// Times 20 more steps with the op timer on and prints each op's share of a step.
fn print_profile(step: &mut impl FnMut() -> Result<()>) -> Result<()> {
    const STEPS: usize = 20;
    cpu::profile::take();
    cpu::profile::enable(true);
    let t0 = Instant::now();
    for _ in 0..STEPS {
        step()?;
    }
    let total = t0.elapsed().as_secs_f64() / STEPS as f64;
    cpu::profile::enable(false);
    let ops = cpu::profile::take();
    println!(
        "GPT step profile ({STEPS} steps with the op timer on): {:.2} ms a step",
        total * 1e3
    );
    println!("| op | calls a step | ms a step | share |\n|---|---:|---:|---:|");
    let mut in_ops = 0.0;
    for o in &ops {
        let s = o.seconds / STEPS as f64;
        in_ops += s;
        println!(
            "| {} | {} | {:.2} | {:.1}% |",
            o.name,
            o.calls / STEPS as u64,
            s * 1e3,
            100.0 * s / total
        );
    }
    let rest = total - in_ops;
    println!(
        "| outside the ops (autograd, tensor bookkeeping, batch) | | {:.2} | {:.1}% |",
        rest * 1e3,
        100.0 * rest / total
    );
    Ok(())
}

/// The peer's rows (`id median_us` lines); empty, with a note, when it cannot run.
fn peer(a: &Args) -> HashMap<String, f64> {
    let mut cmd = Command::new(&a.python);
    cmd.arg(&a.peer)
        .args(["--reps", &a.reps.to_string()])
        .args(["--threads", &threads().to_string()]);
    if let Some(t) = &a.gpt_text {
        cmd.arg("--gpt-text").arg(t);
    }
    // OpenBLAS at its best: some hosts pin a slower core type through the environment.
    cmd.env_remove("OPENBLAS_CORETYPE");
    match cmd.output() {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| {
                let (id, us) = l.split_once(' ')?;
                Some((id.to_string(), us.trim().parse().ok()?))
            })
            .collect(),
        Ok(o) => {
            eprintln!("peer failed: {}", String::from_utf8_lossy(&o.stderr));
            HashMap::new()
        }
        Err(e) => {
            eprintln!("peer not run ({}): {e}", a.python);
            HashMap::new()
        }
    }
}

fn parse_mode(s: &str) -> Result<cpu::CpuMode, String> {
    cpu::CpuMode::parse(s).ok_or_else(|| format!("'{s}': expected exact or fast"))
}

fn main() -> Result<()> {
    let a = Args::parse();
    cpu::set_mode(a.cpu_mode);
    let threads = threads();
    let mut ours = Vec::new();
    for n in [1024, 2048].into_iter().filter(|_| !a.no_sgemm) {
        ours.push((
            format!("sgemm_{n}"),
            sgemm_us(n, a.reps)?,
            2.0 * (n as f64).powi(3),
        ));
    }
    if let Some(p) = &a.gpt_text {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        ours.push(("gpt_cpu_step".into(), gpt_step_us(&text, a.profile)?, 0.0));
    }
    let peers = if a.no_peer { HashMap::new() } else { peer(&a) };
    let mut md = format!(
        "CPU rows, {threads} threads, median µs (SGEMM: {} timed calls after 3 warm-ups; GPT \
         step: 20 after 5), numpy and PyTorch CPU in the same run.\n\n\
         | row | ours (µs) | ours | numpy (µs) | torch (µs) | numpy / ours | torch / ours |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
        a.reps
    );
    for (id, us, flops) in &ours {
        let rate = if *flops > 0.0 {
            format!("{:.0} GFLOP/s", flops / us / 1e3)
        } else {
            format!("{:.1}K tok/s", 12.0 * 64.0 / us * 1e3)
        };
        let np = peers.get(&format!("numpy_{id}")).copied();
        let th = peers
            .get(&format!("torch_{id}"))
            .or_else(|| peers.get(id))
            .copied();
        let f = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
        let r = |v: Option<f64>| v.map_or("-".into(), |v| format!("{:.2}", v / us));
        md += &format!(
            "| {id} | {us:.1} | {rate} | {} | {} | {} | {} |\n",
            f(np),
            f(th),
            r(np),
            r(th)
        );
    }
    print!("{md}");
    if let Some(d) = a.out.parent() {
        std::fs::create_dir_all(d)?;
    }
    std::fs::write(&a.out, md)?;
    Ok(())
}

/// The size of the pool the CPU backend runs on (rayon's default: the available cores, or
/// `RAYON_NUM_THREADS`).
fn threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}
