//! `cpu-bench`: the CPU path's SGEMM (1024³, 1536³, 2048³) and the tiny GPT's training step,
//! beside numpy and PyTorch CPU timed in the same run (`benches/torch_cpu_peer.py`, same thread
//! count), in `--rounds` interleaved rounds (ours, then the peer, per round). Prints a markdown
//! table of medians over the rounds with their range and writes it to `--out`.

use anyhow::{Context, Result};
use benches::median;
use clap::Parser;
use gpu_core::{cpu, Backend, CpuBackend, DType, MatmulOps, MatmulSpec};
use models::gpt::{Dataset, Gpt, GptConfig};
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;
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
    /// Rounds, each timing ours and then the peer.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// SGEMM sizes n (n × n × n).
    #[arg(long, value_delimiter = ',', default_value = "1024,1536,2048")]
    sizes: Vec<usize>,
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
    /// Leave glibc's malloc at its defaults (else `cpu::keep_freed_host_memory`, as training).
    #[arg(long)]
    libc_malloc_defaults: bool,
    /// Print where the GPT step's time goes: each CPU op's total per step (`cpu::profile`).
    #[arg(long)]
    profile: bool,
    /// Run the GPT step from the main thread instead of on a worker of the CPU pool (each op
    /// then hands its loop over to the pool: the way before `cpu::on_pool`).
    #[arg(long)]
    outside_pool: bool,
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
    let sizes: Vec<String> = a.sizes.iter().map(|n| n.to_string()).collect();
    let sizes = if a.no_sgemm {
        String::new()
    } else {
        sizes.join(",")
    };
    cmd.arg(&a.peer)
        .args(["--reps", &a.reps.to_string()])
        .arg(format!("--sizes={sizes}"))
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

/// `median (min–max)` of per-round values.
fn spread(v: &[f64], digits: usize) -> String {
    if v.is_empty() {
        return "-".into();
    }
    let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    format!("{:.digits$} ({lo:.digits$}–{hi:.digits$})", median(v))
}

fn main() -> Result<()> {
    let a = Args::parse();
    cpu::set_mode(a.cpu_mode);
    if !a.libc_malloc_defaults {
        cpu::keep_freed_host_memory();
    }
    let threads = threads();
    let text = match &a.gpt_text {
        Some(p) => {
            Some(std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?)
        }
        None => None,
    };
    // Per row: (id, work: flops or tokens, is_gpt), and per round the µs of ours and the peers'.
    let mut rows: Vec<(String, f64, bool)> = Vec::new();
    if !a.no_sgemm {
        for &n in &a.sizes {
            rows.push((format!("sgemm_{n}"), 2.0 * (n as f64).powi(3), false));
        }
    }
    if text.is_some() {
        rows.push(("gpt_cpu_step".into(), 12.0 * 64.0, true));
    }
    let mut ours: HashMap<String, Vec<f64>> = HashMap::new();
    let mut peers: HashMap<String, Vec<f64>> = HashMap::new();
    for round in 0..a.rounds {
        for (id, _, gpt) in &rows {
            let us = match (gpt, &text) {
                (true, Some(t)) => {
                    let prof = a.profile && round == 0;
                    if a.outside_pool {
                        gpt_step_us(t, prof)?
                    } else {
                        // As the training binaries run it (`cpu::on_pool`).
                        cpu::on_pool(|| gpt_step_us(t, prof))?
                    }
                }
                _ => sgemm_us(id["sgemm_".len()..].parse()?, a.reps)?,
            };
            ours.entry(id.clone()).or_default().push(us);
        }
        if !a.no_peer {
            for (id, us) in peer(&a) {
                peers.entry(id).or_default().push(us);
            }
        }
        eprintln!("round {} of {} done", round + 1, a.rounds);
    }
    let mut md = format!(
        "CPU rows, {threads} threads, {} interleaved rounds (ours, then numpy and PyTorch \
         CPU, per round); each round's figure is a median (SGEMM: {} timed calls after 3 \
         warm-ups; GPT step: 20 after 5); cells are the median over the rounds (min–max). \
         Ours in CPU mode {:?} ({}). OPENBLAS_CORETYPE removed from the peer's environment.\n\n\
         | row | ours | numpy | PyTorch | ours / numpy | ours / PyTorch |\n\
         |---|---:|---:|---:|---:|---:|\n",
        a.rounds,
        a.reps,
        a.cpu_mode,
        cpu::isa_name()
    );
    for (id, work, gpt) in &rows {
        // Rates: GFLOP/s for SGEMM, K tokens/s for the GPT step.
        let rate = |us: f64| {
            if *gpt {
                work / us * 1e3
            } else {
                work / us / 1e3
            }
        };
        let get = |m: &HashMap<String, Vec<f64>>, k: &str| m.get(k).cloned().unwrap_or_default();
        let o: Vec<f64> = get(&ours, id).into_iter().map(rate).collect();
        let np: Vec<f64> = get(&peers, &format!("numpy_{id}"))
            .into_iter()
            .map(rate)
            .collect();
        let mut th = get(&peers, &format!("torch_{id}"));
        if *gpt {
            th = get(&peers, id);
        }
        let th: Vec<f64> = th.into_iter().map(rate).collect();
        // Ratios per round (the rounds pair up in order).
        let ratio = |p: &[f64]| -> Vec<f64> { o.iter().zip(p).map(|(x, y)| x / y).collect() };
        let unit = if *gpt { "K tok/s" } else { "GFLOP/s" };
        let d = if *gpt { 1 } else { 0 };
        md += &format!(
            "| {id} ({unit}) | {} | {} | {} | {} | {} |\n",
            spread(&o, d),
            spread(&np, d),
            spread(&th, d),
            spread(&ratio(&np), 2),
            spread(&ratio(&th), 2)
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
