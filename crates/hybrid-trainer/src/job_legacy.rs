//! The old main job, kept for comparison as `hybrid-trainer predict-updates`: a char-level
//! GPT trained by the per-step [`HybridTrainer`] (which predicts whole parameter updates and
//! skips backward passes), or plain AdamW, or a control, on the embedded corpus or
//! `--data FILE`, with a progress bar, periodic evaluation, checkpoints that resume bit for
//! bit, and a report (markdown, JSON, loss-curve PNG). The main job is now [`crate::job`].

use crate::corpus;
use crate::hybrid::{HybridConfig, HybridTrainer, Mode, Objective, Phase, StepReport};
use crate::report::{self, EvalPoint, RunRecord, StepKind, StepPoint};
use anyhow::{ensure, Context, Result};
use gpu_core::Device;
use indicatif::{ProgressBar, ProgressStyle};
use models::gpt::{Dataset, Gpt, GptConfig, Variant};
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tensor_ops::dist::ProcessGroup;
use tensor_ops::optim::AdamWParams;
use tensor_ops::{no_grad, Tensor};

/// The flags of `predict-updates`. The defaults are a small GPT (4 layers × width 128, context
/// 64, batch 12) that trains in a few minutes on 2 CPU cores.
#[derive(Debug, Clone, clap::Args, Serialize, Deserialize)]
pub struct JobArgs {
    /// UTF-8 text to train on; default: the embedded tinyshakespeare.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// hybrid, baseline, skip-freeze or reapply-last (the last two: controls, at --fraction).
    #[arg(long, value_enum, default_value_t = LegacyMode::Hybrid)]
    pub mode: LegacyMode,
    /// Fraction of predicted steps for the controls.
    #[arg(long, default_value_t = 0.3)]
    pub fraction: f64,
    #[arg(long, default_value_t = 600)]
    pub iters: u64,
    #[command(flatten)]
    #[serde(flatten)]
    pub model: crate::job::SmallGpt,
    /// Learning-rate warm-up steps (also the hybrid's warm-up).
    #[arg(long, default_value_t = 50)]
    pub warmup: u64,
    #[arg(long, default_value_t = 0.1)]
    pub weight_decay: f32,
    #[arg(long, default_value_t = 0.99)]
    pub beta2: f32,
    #[arg(long, default_value_t = 1.0)]
    pub grad_clip: f32,
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    pub eval_interval: u64,
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub eval_iters: u32,
    /// Longest predicted span (hybrid). Longer spans compound the prediction error (measured:
    /// docs/hybrid-trainer.md).
    #[arg(long, default_value_t = 1)]
    pub max_span: usize,
    /// Rank of each parameter tensor's update basis (hybrid).
    #[arg(long, default_value_t = 4)]
    pub rank: usize,
    /// Full-step updates kept per tensor (hybrid).
    #[arg(long, default_value_t = 8)]
    pub history: usize,
    /// The gate's bound on the world model's relative update error (hybrid).
    #[arg(long, default_value_t = 0.9)]
    pub gate_error: f32,
    /// Drift-correction gain per predicted step of a span (hybrid; 0: no correction).
    #[arg(long, default_value_t = 0.5)]
    pub correction_gain: f32,
    /// Train the world model every this many full steps (hybrid).
    #[arg(long, default_value_t = 1)]
    pub world_every: u64,
    /// World-model size: GRU hidden width (the model: 256).
    #[arg(long, default_value_t = 256)]
    pub world_hidden: usize,
    /// Allow TF32 tensor cores in matmuls (CUDA).
    #[arg(long)]
    pub tf32: bool,
    #[arg(long, default_value_t = 1337)]
    pub seed: u64,
    /// Where the report, checkpoints and summary go.
    #[arg(long, default_value = "runs/latest")]
    pub out: PathBuf,
    /// Write a checkpoint every this many steps (and at the end); 0: only at the end.
    #[arg(long, default_value_t = 0)]
    pub checkpoint_every: u64,
    /// Resume from the checkpoint in this run directory (its `checkpoint/`).
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Stop (after a checkpoint) once this step is reached, as an interruption would.
    #[arg(long)]
    pub stop_after: Option<u64>,
    /// No progress bar (log lines instead).
    #[arg(long)]
    pub quiet: bool,
}

/// An evaluation with what the run had spent to reach it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EvalTrace {
    pub step: u64,
    pub train: f32,
    pub val: f32,
    pub backward_passes: u64,
    pub forward_passes: u64,
    pub wall_seconds: f64,
}

/// What a run wrote as `summary.json` (and the job state a resume continues from).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobSummary {
    pub mode: String,
    pub device: String,
    pub seed: u64,
    pub iters: u64,
    pub finished: bool,
    pub params: usize,
    pub evals: Vec<EvalTrace>,
    pub counters: crate::hybrid::Counters,
    /// Where the trainer's time went (this process's part of the run).
    #[serde(default)]
    pub timings: crate::hybrid::Timings,
    pub train_seconds: f64,
    pub final_val: f32,
    pub best_val: f32,
    pub record: RunRecord,
}

/// The GPT's loss on step-derived batches; held-out batches from the end of the train split.
/// In a data-parallel job every rank draws the same global batch and keeps its rows (`rank`
/// of `world` equal shares); the held-out loss is the whole batch's on every rank (the same
/// value everywhere: the gate's decisions agree).
struct GptObjective<'a> {
    model: &'a Gpt,
    train: &'a Dataset,
    holdout: &'a Dataset,
    args: &'a JobArgs,
    rank: usize,
    world: usize,
}

impl Objective for GptObjective<'_> {
    fn train_loss(&mut self, step: u64) -> Result<Tensor> {
        let a = self.args;
        let mut rng = rand::rngs::StdRng::seed_from_u64(a.seed ^ step.wrapping_mul(0x9E37_79B9));
        let (batch, block) = (a.model.batch as usize, a.model.block as usize);
        let (x, y) = self.train.batch_ids(false, batch, block, &mut rng)?;
        let local = batch / self.world;
        let rows = self.rank * local * block..(self.rank + 1) * local * block;
        let dev = self.model.device();
        let x = Tensor::from_vec(x[rows.clone()].to_vec(), &[local, block], dev)?;
        let y = Tensor::from_vec(y[rows].to_vec(), &[local, block], dev)?;
        let drop =
            (a.model.dropout > 0.0).then(|| a.seed.wrapping_add(step) ^ ((self.rank as u64) << 40));
        Ok(self.model.loss(&x, &y, drop)?)
    }

    fn holdout_loss(&mut self) -> Result<f32> {
        mean_loss(
            self.model,
            self.holdout,
            true,
            self.args,
            4,
            self.args.seed ^ 0x401D,
        )
    }
}

/// The mean loss over `iters` batches of a split (no gradients), from a fixed seed.
fn mean_loss(
    model: &Gpt,
    ds: &Dataset,
    val: bool,
    a: &JobArgs,
    iters: u32,
    seed: u64,
) -> Result<f32> {
    no_grad(|| {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut total = 0.0f64;
        for _ in 0..iters {
            let (x, y) = ds.batch(
                val,
                a.model.batch as usize,
                a.model.block as usize,
                &mut rng,
                model.device(),
            )?;
            total += f64::from(model.loss(&x, &y, None)?.item()?);
        }
        Ok((total / f64::from(iters)) as f32)
    })
}

/// nanoGPT's schedule over the run's own length: linear warm-up, cosine decay to `min_lr` at
/// the last step.
pub fn learning_rate(a: &JobArgs, it: u64) -> f32 {
    if it < a.warmup {
        return a.model.lr * (it as f32 + 1.0) / (a.warmup as f32 + 1.0);
    }
    let span = a.iters.saturating_sub(a.warmup).max(1);
    let ratio = ((it - a.warmup) as f32 / span as f32).min(1.0);
    a.model.min_lr
        + 0.5 * (1.0 + (std::f32::consts::PI * ratio).cos()) * (a.model.lr - a.model.min_lr)
}

/// What `predict-updates` trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LegacyMode {
    /// The per-step hybrid (predicted parameter updates).
    Hybrid,
    /// Plain AdamW.
    Baseline,
    /// Control: freeze the weights on a fraction of the steps.
    SkipFreeze,
    /// Control: re-apply the last update on a fraction of the steps.
    ReapplyLast,
}

impl LegacyMode {
    pub fn name(self) -> &'static str {
        match self {
            LegacyMode::Hybrid => "hybrid",
            LegacyMode::Baseline => "baseline",
            LegacyMode::SkipFreeze => "skip-freeze",
            LegacyMode::ReapplyLast => "reapply-last",
        }
    }
}

fn mode_of(a: &JobArgs) -> Mode {
    match a.mode {
        LegacyMode::Baseline => Mode::Baseline,
        LegacyMode::SkipFreeze => Mode::SkipFreeze {
            fraction: a.fraction,
        },
        LegacyMode::ReapplyLast => Mode::ReapplyLast {
            fraction: a.fraction,
        },
        LegacyMode::Hybrid => Mode::Hybrid,
    }
}

/// The hybrid settings of a job.
pub fn hybrid_config(a: &JobArgs) -> HybridConfig {
    let mut cfg = HybridConfig {
        mode: mode_of(a),
        warmup: a.warmup,
        max_span: a.max_span,
        rank: a.rank,
        history: a.history,
        gate_error: a.gate_error,
        correction_gain: a.correction_gain,
        rssm_every: a.world_every,
        seed: a.seed,
        ..HybridConfig::default()
    };
    cfg.world.hidden = a.world_hidden;
    cfg
}

fn kind(p: Phase) -> StepKind {
    match p {
        Phase::Warmup => StepKind::Warmup,
        Phase::Full => StepKind::Full,
        Phase::Predict => StepKind::Predicted,
        Phase::Correct => StepKind::Correct,
    }
}

/// Runs the job; returns its summary (also written to `<out>/summary.json`).
pub fn run(device: Device, a: &JobArgs) -> Result<JobSummary> {
    ensure!(a.iters > 0, "--iters must be at least 1");
    ensure!(
        (0.0..1.0).contains(&a.model.dropout),
        "--dropout must be in [0, 1)"
    );
    let (text, corpus_name) = match &a.data {
        Some(p) => (corpus::read_corpus(p)?, p.display().to_string()),
        None => (
            corpus::default_corpus()?,
            corpus::DEFAULT_CORPUS_NAME.to_string(),
        ),
    };
    let ds = Dataset::from_text(&text, 0.9)?;
    // The trainer's held-out data: the first 5% of the training split, never trained on. (Not
    // the last 5%: the text just before the validation split is its nearest neighbour, the
    // same play, and withholding it made the validation loss 0.18 worse at step 750 on the
    // shakespeare-char model.)
    let cut = ds.train.len() / 20;
    let holdout = Dataset {
        tokenizer: ds.tokenizer.clone(),
        train: vec![],
        val: ds.train[..cut].to_vec(),
    };
    let train = Dataset {
        tokenizer: ds.tokenizer.clone(),
        train: ds.train[cut..].to_vec(),
        val: ds.val.clone(),
    };
    for (name, d) in [
        ("training", &train.train),
        ("validation", &train.val),
        ("held-out", &holdout.val),
    ] {
        ensure!(
            d.len() > a.model.block as usize + 1,
            "--block {} is longer than the corpus {corpus_name}'s {name} part ({} tokens) allows",
            a.model.block,
            d.len()
        );
    }
    let cfg = GptConfig {
        variant: Variant::Gpt2,
        vocab_size: ds.tokenizer.vocab_size(),
        block_size: a.model.block as usize,
        n_layer: a.model.layers as usize,
        n_head: a.model.heads as usize,
        n_embd: a.model.embd as usize,
        dropout: a.model.dropout,
        bias: false,
    };
    if let Device::Cuda(i) = device {
        tensor_ops::cuda_backend(i)?.set_tf32(a.tf32);
    }
    let model = Gpt::new(cfg, a.seed, device)?;
    // One rank of a data-parallel job when the environment says so (hybrid-trainer launch).
    let pg = Arc::new(crate::train_gpt::join_data_parallel(
        device,
        DIST_TIMEOUT,
        a.model.batch,
    )?);
    let (main, world) = (pg.is_main(), pg.world_size());
    // Only rank 0 prints, evaluates and writes.
    macro_rules! say {
        ($($t:tt)*) => { if main { println!($($t)*); } };
    }
    let params: Vec<Tensor> = model.parameters().into_iter().map(|p| p.1).collect();
    pg.broadcast(&params.iter().collect::<Vec<_>>(), 0)?;
    let adamw = AdamWParams {
        beta1: 0.9,
        beta2: a.beta2,
        eps: 1e-8,
        weight_decay: a.weight_decay,
        max_grad_norm: Some(a.grad_clip),
    };
    let hcfg = hybrid_config(a);
    let mut trainer = HybridTrainer::new(model.store(), adamw, hcfg.clone(), a.iters)?;
    trainer.set_process_group(pg.clone());
    let mut summary = JobSummary {
        mode: a.mode.name().to_string(),
        device: device.to_string(),
        seed: a.seed,
        iters: a.iters,
        finished: false,
        params: model.num_params(),
        evals: vec![],
        counters: Default::default(),
        timings: Default::default(),
        train_seconds: 0.0,
        final_val: f32::NAN,
        best_val: f32::INFINITY,
        record: RunRecord {
            title: format!("{} run, seed {}", a.mode.name(), a.seed),
            mode: a.mode.name().to_string(),
            device: device.to_string(),
            corpus: corpus_name,
            config: serde_json::json!({ "job": a, "hybrid": hcfg }),
            ..Default::default()
        },
    };
    if main {
        std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    }
    if let Some(from) = &a.resume {
        trainer.load(&from.join("checkpoint"))?;
        let s = tensor_ops::fsio::read_to_string(
            &from.join("summary.json"),
            "summary",
            tensor_ops::fsio::JSON_MAX,
        )
        .context("reading the resumed run's summary.json")?;
        summary = serde_json::from_str(&s)?;
        say!(
            "resumed {} at step {}",
            from.display(),
            trainer.step_index()
        );
    }
    say!(
        "{} training: GPT {}×{} ({} parameters), context {}, batch {}, {} steps on {device}, corpus {}",
        a.mode.name(), a.model.layers, a.model.embd, model.num_params(), a.model.block, a.model.batch, a.iters, summary.record.corpus
    );
    if a.iters == 600 && a.model.layers == 4 && a.model.embd == 128 && device == Device::Cpu {
        println!("this default run takes about 2 minutes on 2 CPU cores (less on a GPU)");
    }
    let bar = if a.quiet || !main {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(a.iters)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:30} {pos}/{len} {msg} [{elapsed_precise}<{eta_precise}]",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_position(trainer.step_index());
    let tokens = f64::from(a.model.batch) * f64::from(a.model.block);
    let mut obj = GptObjective {
        model: &model,
        train: &train,
        holdout: &holdout,
        args: a,
        rank: pg.rank(),
        world,
    };
    let lr_at = |s: u64| learning_rate(a, s);
    while trainer.step_index() < a.iters {
        let t0 = Instant::now();
        let r: StepReport = trainer.step(&mut obj, &lr_at)?;
        // The step's end, for the hang watchdog (a no-op for one process).
        pg.fence()?;
        let dt = t0.elapsed().as_secs_f64();
        summary.train_seconds += dt;
        if let Some(reason) = &r.rollback {
            summary.record.notes.push(format!(
                "step {}: {reason}; rolled back to step {}",
                r.step,
                trainer.step_index()
            ));
            summary
                .record
                .steps
                .retain(|p| p.step < trainer.step_index());
            bar.set_position(trainer.step_index());
            continue;
        }
        summary.record.steps.push(StepPoint {
            step: r.step,
            kind: kind(r.phase),
            loss: r.loss,
        });
        let done = trainer.step_index();
        bar.set_position(done);
        if let Some(l) = r.loss {
            bar.set_message(format!(
                "loss {l:.4} | {:?} | {:.0} tok/s",
                r.phase,
                tokens / dt.max(1e-9)
            ));
        }
        if main && (done % a.eval_interval == 0 || done == a.iters) {
            let tr = mean_loss(
                &model,
                &train,
                false,
                a,
                a.eval_iters,
                a.seed ^ 0xE7A1 ^ done,
            )?;
            let va = mean_loss(
                &model,
                &train,
                true,
                a,
                a.eval_iters,
                a.seed ^ 0xE7A2 ^ done,
            )?;
            let c = trainer.counters();
            summary.evals.push(EvalTrace {
                step: done,
                train: tr,
                val: va,
                backward_passes: c.backward_passes,
                forward_passes: c.forward_passes,
                wall_seconds: summary.train_seconds,
            });
            summary.record.evals.push(EvalPoint {
                step: done,
                train: tr,
                val: va,
            });
            summary.best_val = summary.best_val.min(va);
            summary.final_val = va;
            let line = format!(
                "step {done}: train {tr:.4}, val {va:.4}, {} backward passes, {:.1} s",
                c.backward_passes, summary.train_seconds
            );
            if bar.is_hidden() {
                println!("{line}");
            } else {
                bar.println(line);
            }
        }
        let stop = a.stop_after.is_some_and(|s| done >= s);
        if main
            && ((a.checkpoint_every > 0 && done % a.checkpoint_every == 0)
                || done == a.iters
                || stop)
        {
            summary.counters = trainer.counters().clone();
            summary.timings = trainer.timings().clone();
            summary.finished = done == a.iters;
            trainer.save(&a.out.join("checkpoint"))?;
            std::fs::write(
                a.out.join("summary.json"),
                serde_json::to_string_pretty(&summary)?,
            )?;
        }
        if stop && done < a.iters {
            bar.abandon_with_message(format!("stopped at step {done} (--stop-after)"));
            leave(trainer, pg)?;
            return Ok(summary);
        }
    }
    bar.finish_and_clear();
    if !main {
        // The other ranks are done once their last step is.
        leave(trainer, pg)?;
        return Ok(summary);
    }
    let c = trainer.counters();
    summary.record.counters = report::Counters {
        steps: c.steps,
        forward_passes: c.forward_passes,
        backward_passes: c.backward_passes,
        predicted_steps: c.predicted_steps,
        rollbacks: c.rollbacks,
        wall_seconds: summary.train_seconds,
    };
    let t = trainer.timings();
    summary.record.notes.push(format!(
        "time: AdamW steps {:.1} s; hybrid overhead {:.1} s (copies {:.1}, measurements {:.1}, \
         rollouts {:.1}, predicted updates {:.1}, corrections {:.1}, basis {:.1}, world-model \
         training {:.1}, held-out checks {:.1})",
        t.adamw,
        t.overhead(),
        t.copies,
        t.measure,
        t.predict,
        t.apply,
        t.correct,
        t.basis,
        t.world_train,
        t.holdout
    ));
    for n in &summary.record.notes {
        println!("{n}");
    }
    let paths = report::write_report(&a.out, "report", &summary.record)?;
    std::fs::write(
        a.out.join("summary.json"),
        serde_json::to_string_pretty(&summary)?,
    )?;
    println!(
        "done: val {:.4} (best {:.4}), {} backward / {} steps ({} predicted, {} rollbacks), {:.1} s; report {}",
        summary.final_val, summary.best_val, c.backward_passes, a.iters, c.predicted_steps, c.rollbacks, summary.train_seconds, paths.markdown.display()
    );
    leave(trainer, pg)?;
    Ok(summary)
}

/// How long the rendezvous and each step of a data-parallel job may take (NCCL's own set-up
/// between them is not bounded by it).
const DIST_TIMEOUT: Duration = Duration::from_secs(300);

/// Leaves the data-parallel job (a no-op for a single process): the trainer holds the
/// group too, so it goes first. A group still held elsewhere would leave as a crash when
/// dropped (see [`ProcessGroup::finish`]): that is an error here, not a silent exit.
fn leave(trainer: HybridTrainer, pg: Arc<ProcessGroup>) -> Result<()> {
    drop(trainer);
    let pg = Arc::try_unwrap(pg)
        .map_err(|_| anyhow::anyhow!("the process group is still in use when the job ends"))?;
    pg.finish()?;
    Ok(())
}

/// The weights file of a finished or stopped run.
pub fn model_file(out: &Path) -> PathBuf {
    out.join("checkpoint").join(crate::hybrid::MODEL_FILE)
}
