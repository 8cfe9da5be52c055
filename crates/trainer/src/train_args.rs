//! The flags of `train-gpt` (and of every run the experiment and the main job start) and the
//! learning-rate schedule they define.

use crate::control::cli::{ControlArgs, EvalSplits, TrainMode};
use crate::train_step::OptimizerKind;
use models::gpt::Variant;
use std::path::PathBuf;
use tensor_ops::Precision;

/// Options of a training run (the CLI's flags).
#[derive(Debug, Clone, clap::Args)]
pub struct TrainArgs {
    /// UTF-8 text to train on (first 90% train, last 10% validation).
    #[arg(long)]
    pub data: PathBuf,
    /// Architecture: gpt2 or llama.
    #[arg(long, default_value = "gpt2", value_parser = parse_variant)]
    pub variant: Variant,
    #[arg(long, default_value_t = 2000)]
    pub iters: u32,
    /// Sequences a step, over all ranks together (data-parallel runs split it evenly).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch: u32,
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub block: u32,
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..))]
    pub layers: u32,
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..))]
    pub heads: u32,
    #[arg(long, default_value_t = 384, value_parser = clap::value_parser!(u32).range(2..))]
    pub embd: u32,
    /// Dropout probability in training, at nanoGPT's sites: the embeddings, the attention
    /// probabilities and the two residual branches of every block.
    #[arg(long, default_value_t = 0.2)]
    pub dropout: f32,
    /// Peak learning rate.
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f32,
    /// Final learning rate of the cosine decay.
    #[arg(long, default_value_t = 1e-4)]
    pub min_lr: f32,
    #[arg(long, default_value_t = 100)]
    pub warmup: u32,
    /// Iterations over which the cosine decays to `min_lr` (default: `--iters`, at least
    /// `--warmup`: the rate reaches `min_lr` when the run ends, as nanoGPT advises; its
    /// shakespeare-char config trains 5000 iterations with 5000 here).
    #[arg(long)]
    pub lr_decay_iters: Option<u32>,
    #[arg(long, default_value_t = 0.1)]
    pub weight_decay: f32,
    #[arg(long, default_value_t = 1.0)]
    pub grad_clip: f32,
    /// Evaluate every this many iterations (and at the end).
    #[arg(long, default_value_t = 250, value_parser = clap::value_parser!(u32).range(1..))]
    pub eval_interval: u32,
    /// Batches per evaluation.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    pub eval_iters: u32,
    /// Arithmetic: fp32, tf32 (f32 matmuls on TF32 tensor cores) or bf16 (mixed precision:
    /// bf16 matmuls and activations, f32 master weights, norms, loss and AdamW). CUDA only
    /// for tf32 and bf16.
    #[arg(long, default_value = "fp32", value_parser = parse_precision)]
    pub precision: Precision,
    /// The same as `--precision tf32` (kept for older scripts).
    #[arg(long, conflicts_with = "precision")]
    pub tf32: bool,
    /// On CUDA, run every step op by op instead of replaying one captured CUDA graph of the
    /// whole step (the same numbers, more host work per step).
    #[arg(long)]
    pub eager: bool,
    /// Read the loss back (and log it) every this many iterations; steps in between run
    /// without waiting for the device.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    pub log_interval: u32,
    #[arg(long, default_value_t = 1337)]
    pub seed: u64,
    /// Save the trained model here (safetensors).
    #[arg(long)]
    pub save: Option<PathBuf>,
    /// Characters to sample after training.
    #[arg(long, default_value_t = 200)]
    pub sample: usize,
    /// Write a checkpoint (weights, the optimizer's state, iteration) into this directory every
    /// `--checkpoint-interval` iterations and at the end (rank 0 only).
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// With --checkpoint: write one every this many iterations (and at the end).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..))]
    pub checkpoint_interval: u32,
    /// Continue from the newest checkpoint in this directory (written by a run with the same
    /// seed, global batch, context and model, on any number of GPUs); `--iters` counts from
    /// the start of the original run. Every rank reads it.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Data-parallel runs: how long the rendezvous, and then each step, may take before the
    /// other ranks are declared hung or gone (this rank then aborts NCCL and exits with status
    /// 75); at most a day. NCCL's own set-up between the two is not bounded by it.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub dist_timeout_secs: u64,
    /// What trains: adamw (the optimizer at the given rate and schedule), hybrid (the
    /// step-size controller and its world model around it: docs/hybrid-trainer.md) or
    /// range-test (an LR range test picks the peak rate first).
    #[arg(long, value_enum, default_value_t = TrainMode::Adamw)]
    pub mode: TrainMode,
    /// The optimizer (the hybrid wraps any of them).
    #[arg(long, value_enum, default_value_t = OptimizerKind::Adamw)]
    pub optimizer: OptimizerKind,
    /// The rate's shape after the warm-up: cosine (decay to --min-lr at --lr-decay-iters, then
    /// flat: a cosine to 50% of the run is `--lr-decay-iters` = iters/2), constant
    /// (Schedule-Free AdamW's) or wsd (warm-up, stable at --lr, then a linear decay to
    /// --min-lr over the last --decay-fraction of the run).
    #[arg(long, value_enum, default_value_t = Schedule::Cosine)]
    pub schedule: Schedule,
    /// With `--schedule wsd`: the fraction of the run, at its end, over which the rate decays
    /// linearly to --min-lr.
    #[arg(long, default_value_t = 0.2)]
    pub decay_fraction: f32,
    #[command(flatten)]
    pub control: ControlArgs,
    /// Which splits an evaluation measures.
    #[arg(long, value_enum, default_value_t = EvalSplits::Both)]
    pub eval_splits: EvalSplits,
    /// Evaluate on the same batches every time (else fresh ones each evaluation).
    #[arg(long)]
    pub eval_fixed: bool,
    /// Keep an exponential moving average of the weights on the training device (decay D per
    /// step, warmed up as TensorFlow's `min(D, (1 + t)/(10 + t))`) and evaluate it too at every
    /// evaluation (`ema_val` in the curve); training is unchanged. Off by default; for
    /// `--mode adamw` and `range-test`, not with Schedule-Free AdamW (evaluated at its own
    /// average already). A checkpoint keeps the average.
    #[arg(long, value_parser = parse_ema_decay)]
    pub ema_decay: Option<f32>,
    /// Write the run's evaluations, counters and the controller's decisions here (JSON).
    #[arg(long)]
    pub curve: Option<PathBuf>,
    /// Tests: write a NaN into the first parameter once, after this step.
    #[arg(long, hide = true)]
    pub inject_nan_at: Option<u32>,
}

pub fn parse_precision(s: &str) -> Result<Precision, String> {
    s.parse().map_err(|e: tensor_ops::GpuError| e.to_string())
}

/// A decay strictly between 0 and 1.
pub fn parse_ema_decay(s: &str) -> Result<f32, String> {
    let d: f32 = s.parse().map_err(|e| format!("'{s}': {e}"))?;
    if d > 0.0 && d < 1.0 {
        Ok(d)
    } else {
        Err(format!("'{s}': the decay must be in (0, 1)"))
    }
}

pub fn parse_variant(s: &str) -> Result<Variant, String> {
    match s {
        "gpt2" => Ok(Variant::Gpt2),
        "llama" => Ok(Variant::Llama),
        _ => Err(format!("'{s}': expected gpt2 or llama")),
    }
}

impl TrainArgs {
    /// The iterations of the cosine decay: `--lr-decay-iters`, else `--iters` (at least
    /// `--warmup`).
    pub fn decay_iters(&self) -> u32 {
        self.lr_decay_iters
            .unwrap_or_else(|| self.iters.max(self.warmup))
    }
}

/// The shape of the rate after the warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Schedule {
    Cosine,
    Constant,
    /// Warm-up, stable, decay (linear, over the last `--decay-fraction` of the run).
    Wsd,
}

/// nanoGPT's schedule: linear warm-up, cosine decay to `min_lr`, then flat (or flat at `lr`
/// after the warm-up with `--schedule constant`).
pub fn learning_rate(a: &TrainArgs, it: u32) -> f32 {
    if it < a.warmup {
        return a.lr * (it as f32 + 1.0) / (a.warmup as f32 + 1.0);
    }
    match a.schedule {
        Schedule::Constant => return a.lr,
        Schedule::Wsd => return wsd_rate(a, it),
        Schedule::Cosine => {}
    }
    let decay_iters = a.decay_iters();
    if it > decay_iters {
        return a.min_lr;
    }
    let ratio = (it - a.warmup) as f32 / (decay_iters - a.warmup).max(1) as f32;
    a.min_lr + 0.5 * (1.0 + (std::f32::consts::PI * ratio).cos()) * (a.lr - a.min_lr)
}

/// The stable phase at `lr` until `iters · (1 − decay_fraction)` (rounded, never before the
/// warm-up's end), then a linear decay reaching `min_lr` at the last iteration.
fn wsd_rate(a: &TrainArgs, it: u32) -> f32 {
    let f = a.decay_fraction.clamp(0.0, 1.0) as f64;
    let start = ((a.iters as f64 * (1.0 - f)).round() as u32).max(a.warmup);
    if it <= start || a.iters <= start {
        return a.lr;
    }
    let t = ((it - start) as f32 / (a.iters - start) as f32).min(1.0);
    a.min_lr + (a.lr - a.min_lr) * (1.0 - t)
}
