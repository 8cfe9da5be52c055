//! The main job (what `hybrid-trainer` runs with no subcommand, and `hybrid-trainer run`): the
//! same char-level GPT trained twice through [`train_gpt::run_with_curve`], once by plain AdamW
//! and once by the hybrid trainer (the step-size controller around AdamW at its defaults, the
//! world model off: `src/control/`), at the same given learning rate and seed, on the embedded
//! tinyshakespeare or `--data FILE`; then a report that puts the two side by side
//! ([`crate::report::compare`]: `report.md`, `report.json`, `report.png` under `--out`).

use crate::control::cli::TrainMode;
use crate::corpus;
use crate::report::compare::{self, Comparison};
use crate::train_curve::RunCurve;
use crate::train_gpt::{self, TrainArgs};
use anyhow::{ensure, Context, Result};
use clap::Parser;
use gpu_core::Device;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The report's file stem under `--out` (`report.md`, `report.json`, `report.png`).
const REPORT_STEM: &str = "report";

/// The main job's flags. The defaults are a small GPT (4 layers × 4 heads × width 128,
/// context 64, batch 12, no dropout) trained for 600 steps in fp32, evaluated every 25 steps
/// on 10 fixed validation batches: about [`DEFAULT_CPU_SECONDS`] a run on 2 CPU cores.
#[derive(Debug, Clone, clap::Args, Serialize, Deserialize)]
pub struct JobArgs {
    /// UTF-8 text to train on (first 90% train, last 10% validation); default: the embedded
    /// tinyshakespeare, written into --out.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Training steps of each run.
    #[arg(long, default_value_t = 600)]
    pub iters: u32,
    #[command(flatten)]
    #[serde(flatten)]
    pub model: SmallGpt,
    /// Learning-rate warm-up steps.
    #[arg(long, default_value_t = 50)]
    pub warmup: u32,
    /// Evaluate every this many steps (and at the end).
    #[arg(long, default_value_t = 25, value_parser = clap::value_parser!(u32).range(1..))]
    pub eval_interval: u32,
    /// Validation batches of an evaluation (the same ones every time).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub eval_iters: u32,
    #[arg(long, default_value_t = 1337)]
    pub seed: u64,
    /// Where the report, the two runs' curves and the written corpus go.
    #[arg(long, default_value = "runs/latest")]
    pub out: PathBuf,
    /// No per-step log lines (evaluations and summaries are still printed).
    #[arg(long)]
    pub quiet: bool,
}

/// The small GPT the main job trains by default (4 layers × 4 heads × width 128, context 64,
/// batch 12, no dropout) and its given rate.
#[derive(Debug, Clone, clap::Args, Serialize, Deserialize)]
pub struct SmallGpt {
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch: u32,
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub block: u32,
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub layers: u32,
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub heads: u32,
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(2..))]
    pub embd: u32,
    #[arg(long, default_value_t = 0.0)]
    pub dropout: f32,
    /// The given peak learning rate (the main job gives it to both its runs).
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f32,
    /// The cosine schedule's floor, reached at the last step.
    #[arg(long, default_value_t = 1e-4)]
    pub min_lr: f32,
}

/// Measured: wall-clock seconds of one run of the default job (AdamW 18.7 s and the hybrid
/// 17.7 s of training, evaluations besides) on the 2-core AVX-512 CPU this was developed on.
pub const DEFAULT_CPU_SECONDS: f64 = 21.0;
/// Measured: the default job's whole wall-clock time (both runs and the report) on that CPU:
/// 41.6 s (72.5 s while another build shared the two cores).
pub const DEFAULT_CPU_JOB_SECONDS: f64 = 42.0;

/// The size of the default job's work: parameters (non-embedding work scales with them) ×
/// tokens per step × steps, plus its evaluations.
fn work(a: &JobArgs) -> f64 {
    let width = f64::from(a.model.embd);
    let params = 12.0 * f64::from(a.model.layers) * width * width;
    let tokens = f64::from(a.model.batch) * f64::from(a.model.block);
    let evals = f64::from(a.iters / a.eval_interval + 1) * f64::from(a.eval_iters) / 3.0;
    params * tokens * (f64::from(a.iters) + evals)
}

/// The job's expected wall-clock time on the CPU: the measured default, scaled by [`work`].
fn cpu_estimate(a: &JobArgs) -> f64 {
    let default = JobArgs::parse_from_defaults();
    DEFAULT_CPU_JOB_SECONDS * work(a) / work(&default)
}

impl JobArgs {
    /// The defaults (what `hybrid-trainer` with no flags runs).
    pub fn parse_from_defaults() -> JobArgs {
        Wrap::parse_from(["job"]).args
    }
}

/// `JobArgs` as a parser of its own (for the defaults).
#[derive(Parser)]
struct Wrap {
    #[command(flatten)]
    args: JobArgs,
}

/// `TrainArgs` parsed from an argv, as `train-gpt` would parse it.
#[derive(Parser)]
#[command(name = "train-gpt")]
struct TrainCli {
    #[command(flatten)]
    args: TrainArgs,
}

/// The `train-gpt` flags of one run of the job.
fn train_argv(a: &JobArgs, mode: TrainMode, data: &Path, curve: &Path) -> Vec<String> {
    let mut v: Vec<String> = vec!["train-gpt".into()];
    let mut flag = |k: &str, val: String| {
        v.push(format!("--{k}"));
        v.push(val);
    };
    flag("data", data.display().to_string());
    flag("mode", mode.name().into());
    flag("iters", a.iters.to_string());
    flag("batch", a.model.batch.to_string());
    flag("block", a.model.block.to_string());
    flag("layers", a.model.layers.to_string());
    flag("heads", a.model.heads.to_string());
    flag("embd", a.model.embd.to_string());
    flag("dropout", a.model.dropout.to_string());
    flag("lr", a.model.lr.to_string());
    flag("min-lr", a.model.min_lr.to_string());
    flag("warmup", a.warmup.to_string());
    flag("eval-interval", a.eval_interval.to_string());
    flag("eval-iters", a.eval_iters.to_string());
    flag("seed", a.seed.to_string());
    flag("precision", "fp32".into());
    flag("eval-splits", "val".into());
    flag("curve", curve.display().to_string());
    flag("sample", "0".into());
    // --quiet: one log line at the start only.
    let log = if a.quiet { a.iters.max(1) } else { 50 };
    flag("log-interval", log.to_string());
    v.push("--eval-fixed".into());
    v
}

/// The [`TrainArgs`] of one run: its argv parsed by clap.
pub fn train_args(a: &JobArgs, mode: TrainMode, data: &Path, curve: &Path) -> Result<TrainArgs> {
    let argv = train_argv(a, mode, data, curve);
    let cli = TrainCli::try_parse_from(&argv).with_context(|| {
        format!(
            "building the {} run's flags: {}",
            mode.name(),
            argv.join(" ")
        )
    })?;
    Ok(cli.args)
}

/// The job's flags that no run would accept: refused before anything trains.
fn check(a: &JobArgs) -> Result<()> {
    ensure!(a.iters > 0, "--iters must be at least 1");
    ensure!(
        (0.0..1.0).contains(&a.model.dropout),
        "--dropout must be in [0, 1)"
    );
    ensure!(
        a.model.lr.is_finite()
            && a.model.lr > 0.0
            && a.model.min_lr.is_finite()
            && a.model.min_lr >= 0.0,
        "--lr must be positive and --min-lr at least 0"
    );
    ensure!(
        a.warmup <= a.iters,
        "--warmup {} is longer than --iters {}",
        a.warmup,
        a.iters
    );
    let dist = tensor_ops::dist::DistEnv::from_env()?;
    ensure!(
        dist.is_none_or(|e| e.world_size == 1),
        "the main job runs on one device (the hybrid is single-device); train-gpt \
         --mode adamw runs data-parallel"
    );
    Ok(())
}

/// The text file both runs read: `--data`, or the embedded corpus written into `out`.
fn data_file(a: &JobArgs) -> Result<(PathBuf, String)> {
    if let Some(p) = &a.data {
        // Read here too: a bad file is one error before the first run, not two.
        corpus::read_corpus(p)?;
        return Ok((p.clone(), p.display().to_string()));
    }
    let path = a.out.join("tinyshakespeare.txt");
    tensor_ops::fsio::write(&path, "corpus", corpus::default_corpus()?.as_bytes())?;
    Ok((path, corpus::DEFAULT_CORPUS_NAME.to_string()))
}

/// Prints what the job will do and about how long it should take.
fn announce(device: Device, a: &JobArgs, corpus_name: &str) {
    println!(
        "main job: the same GPT ({} layers × {} heads × {}, context {}, batch {}, dropout {}, \
         fp32) trained twice on {corpus_name}, {} steps each, warm-up {}, lr {:e} → {:e} \
         (cosine), seed {}: 1. AdamW, 2. the hybrid (step-size controller around AdamW) at \
         the same lr; val loss every {} steps on {} fixed batches; report \
         in {}",
        a.model.layers,
        a.model.heads,
        a.model.embd,
        a.model.block,
        a.model.batch,
        a.model.dropout,
        a.iters,
        a.warmup,
        a.model.lr,
        a.model.min_lr,
        a.seed,
        a.eval_interval,
        a.eval_iters,
        a.out.display()
    );
    let est = cpu_estimate(a);
    match device {
        Device::Cpu => println!(
            "expected time: about {} on this CPU (the default config took {DEFAULT_CPU_JOB_SECONDS:.0} s \
             for both runs, {DEFAULT_CPU_SECONDS:.0} s each, on 2 CPU cores; scaled by model size, \
             tokens and steps)",
            human(est)
        ),
        _ => println!(
            "expected time: under {} on {device} (the CPU estimate; a GPU is faster)",
            human(est)
        ),
    }
}

/// Seconds as "45 s" or "3.2 min".
fn human(s: f64) -> String {
    if s < 90.0 {
        format!("{:.0} s", s.max(1.0))
    } else {
        format!("{:.1} min", s / 60.0)
    }
}

/// One run: its curve, or the curve it wrote before it stopped on a non-finite loss.
fn train(device: Device, a: &JobArgs, mode: TrainMode, data: &Path) -> Result<RunCurve> {
    let curve_path = a.out.join(format!("{}.json", mode.name()));
    // A stale curve must not stand in for this run's.
    let _ = std::fs::remove_file(&curve_path);
    let args = train_args(a, mode, data, &curve_path)?;
    println!("\n== {} ==", mode.name());
    match train_gpt::run_with_curve(device, &args) {
        Ok((_, curve)) => Ok(curve),
        Err(e) => {
            let written = std::fs::read_to_string(&curve_path)
                .ok()
                .and_then(|s| serde_json::from_str::<RunCurve>(&s).ok())
                .filter(|c| c.diverged.is_some());
            match written {
                Some(c) => {
                    println!("{} run stopped: {e:#}", mode.name());
                    Ok(c)
                }
                None => Err(e.context(format!("the {} run", mode.name()))),
            }
        }
    }
}

/// Runs the job: both runs, then the side-by-side report. Returns the comparison (also
/// written to `<out>/report.json`).
pub fn run(device: Device, a: &JobArgs) -> Result<Comparison> {
    check(a)?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    // The report is written after both runs: a destination it cannot write is refused now.
    crate::report::ReportPaths::new(&a.out, REPORT_STEM).check()?;
    let (data, corpus_name) = data_file(a)?;
    announce(device, a, &corpus_name);
    let t = std::time::Instant::now();
    let adamw = train(device, a, TrainMode::Adamw, &data)?;
    let hybrid = train(device, a, TrainMode::Hybrid, &data)?;
    let cmp = Comparison::new(
        format!("The hybrid against AdamW, seed {}", a.seed),
        device.to_string(),
        corpus_name,
        serde_json::to_value(a).context("recording the job's flags")?,
        adamw,
        hybrid,
    );
    let paths = compare::write_comparison(&a.out, REPORT_STEM, &cmp)?;
    println!();
    for line in cmp.summary_lines() {
        println!("{line}");
    }
    println!(
        "job took {:.1} s; report {}",
        t.elapsed().as_secs_f64(),
        paths.markdown.display()
    );
    Ok(cmp)
}
