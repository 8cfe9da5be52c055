//! `hybrid-trainer train-gpt`: trains the GPT of `models` on a text file, nanoGPT style
//! (AdamW, linear warm-up then cosine decay, global-norm clipping, periodic evaluation), on one
//! device or data-parallel over several GPUs, one process each (`hybrid-trainer launch`, or any
//! launcher that sets the `torch.distributed` environment: docs/multi-gpu.md).
//!
//! One loop (`train`) for every `--mode`: set-up (`setup`), then each iteration the mode's
//! hook before the step, a checkpoint and an evaluation at their intervals, the step, the hook
//! after it and a log line (`steps`); the hybrid and the LR range test are hooks (`hook`).

use crate::control::cli::TrainMode;
use crate::control::world::ScalePredictor;
pub use crate::train_args::{learning_rate, parse_precision, parse_variant, Schedule, TrainArgs};
use crate::train_curve::{RunCurve, Spent};
use crate::train_step::{RunOptimizer, Stepper};
use anyhow::{ensure, Context, Result};
use gpu_core::Device;
use hook::Before;
use models::gpt::{Dataset, Gpt};
use rand::rngs::StdRng;
use std::ops::Range;
use std::time::{Duration, Instant};
use tensor_ops::dist::{DistEnv, ProcessGroup};
use tensor_ops::Tensor;

/// Prints on rank 0 only (which alone evaluates, samples and saves).
macro_rules! say {
    ($main:expr, $($t:tt)*) => {
        if $main {
            println!($($t)*);
        }
    };
}

pub mod ema;
mod hook;
mod setup;
mod steps;

/// What a run reached.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TrainSummary {
    pub device: String,
    /// Data-parallel ranks (1: a single device).
    pub ranks: usize,
    pub params: usize,
    pub iters: u32,
    pub final_train_loss: f32,
    pub final_val_loss: f32,
    pub best_val_loss: f32,
    pub best_val_iter: u32,
    pub train_seconds: f64,
    pub tokens_per_second: f64,
}

/// This process's place in the data-parallel job the environment describes (a group of one
/// when it describes none); the global `batch` must split evenly over the ranks. Rank 0 of
/// several says how the batch is split.
pub(crate) fn join_data_parallel(
    device: Device,
    timeout: Duration,
    batch: u32,
) -> Result<ProcessGroup> {
    // Checked before joining: every rank refuses it alike, none waits for another.
    let world = DistEnv::from_env()?.map_or(1, |e| e.world_size);
    ensure!(
        (batch as usize).is_multiple_of(world),
        "--batch {batch} (the global batch) must be a multiple of the {world} ranks"
    );
    let pg = ProcessGroup::from_env(device, timeout).context("joining the data-parallel job")?;
    if world > 1 && pg.is_main() {
        println!(
            "data parallel: {world} ranks, {} sequences each of the global batch {batch}",
            batch as usize / world
        );
    }
    Ok(pg)
}

/// The hybrid's folder in a checkpoint.
const HYBRID_DIR: &str = "hybrid";

/// Trains and reports; prints progress lines and a final JSON summary line.
pub fn run(device: Device, a: &TrainArgs) -> Result<TrainSummary> {
    run_with_curve(device, a).map(|r| r.0)
}

/// [`run`], also returning the run's curve (what `--curve` writes); the other ranks of a
/// data-parallel job return an empty one.
pub fn run_with_curve(device: Device, a: &TrainArgs) -> Result<(TrainSummary, RunCurve)> {
    run_inner(device, a, None)
}

/// [`run_with_curve`] with `--mode hybrid` and a given predictor in place of the world model
/// (tests give it one that lies).
pub fn run_with_predictor(
    device: Device,
    a: &TrainArgs,
    predictor: Box<dyn ScalePredictor>,
) -> Result<(TrainSummary, RunCurve)> {
    ensure!(
        a.mode == TrainMode::Hybrid,
        "a predictor is for --mode hybrid"
    );
    run_inner(device, a, Some(predictor))
}

/// The run's fixed parts: the flags, the data, the model and its optimizer, how a step runs,
/// and this rank's place in the job.
struct Trainer<'a> {
    a: &'a TrainArgs,
    device: Device,
    pg: &'a ProcessGroup,
    ds: Dataset,
    model: Gpt,
    /// The parameters' names and tensors, in the model's order.
    names: Vec<String>,
    params: Vec<Tensor>,
    /// The moving average of the weights (`--ema-decay`).
    ema: Option<ema::Ema>,
    opt: RunOptimizer,
    stepper: Stepper<'a>,
    /// The data stream: every rank draws the same global batches.
    rng: StdRng,
    /// The global batch and the context.
    batch: usize,
    block: usize,
    /// This rank's rows (token ids) of each global batch.
    rows: Range<usize>,
    main: bool,
    world: usize,
    rank: usize,
}

/// What the loop has reached (the counters and the curve are a checkpoint's driver state).
struct Progress {
    /// The first iteration (the checkpoint's on a resume).
    start: u32,
    curve: RunCurve,
    spent: Spent,
    /// Seconds of training so far (evaluations excluded).
    train_secs: f64,
    /// The factor on the schedule's rate: the range test's pick over the given rate.
    rate_scale: f32,
    t_run: Instant,
    best: f32,
    best_iter: u32,
    last_val: f32,
    last_train: f32,
    /// Training time runs from `since` (after an evaluation) to each evaluation.
    since: Instant,
    steps_since: u32,
    /// The last step's loss, not read yet.
    last_loss: Option<Tensor>,
    evaluated: Option<u32>,
    lr: f32,
    injected: bool,
    /// Why training stopped early (a non-finite loss), when it did.
    diverged: Option<String>,
}

impl Progress {
    fn new(start: u32, curve: RunCurve) -> Progress {
        Progress {
            start,
            curve,
            spent: Spent::default(),
            train_secs: 0.0,
            rate_scale: 1.0,
            t_run: Instant::now(),
            best: f32::INFINITY,
            best_iter: 0,
            last_val: f32::NAN,
            last_train: f32::NAN,
            since: Instant::now(),
            steps_since: 0,
            last_loss: None,
            evaluated: None,
            lr: 0.0,
            injected: false,
            diverged: None,
        }
    }
}

fn run_inner(
    device: Device,
    a: &TrainArgs,
    predictor: Option<Box<dyn ScalePredictor>>,
) -> Result<(TrainSummary, RunCurve)> {
    let prepared = setup::prepare(a)?;
    let pg = join_data_parallel(device, Duration::from_secs(a.dist_timeout_secs), a.batch)?;
    let out = train(Trainer::new(device, a, &pg, prepared)?, predictor)?;
    pg.finish()?;
    Ok(out)
}

/// The loop: the mode's hook before a step (a decision, a rollback), a checkpoint and an
/// evaluation at their intervals, the step, the hook after it and a log line; then the curve,
/// the summary, the saved model and a sample.
fn train(
    mut t: Trainer,
    predictor: Option<Box<dyn ScalePredictor>>,
) -> Result<(TrainSummary, RunCurve)> {
    let (mut p, resumed) = t.resume()?;
    let mut hook = hook::for_mode(&t, &mut p, resumed.as_deref(), predictor)?;
    hook.start(&mut t, &mut p, resumed.is_some())?;
    let iters = t.a.iters;
    p.since = Instant::now();
    let mut it = p.start;
    while it <= iters {
        if it < iters {
            match hook.before_step(it, &mut t)? {
                Before::Step => {}
                Before::Decided => p.last_loss = None,
                Before::Back(back) => {
                    (p.last_loss, it) = (None, back);
                    continue;
                }
            }
        }
        if t.checkpoint_due(it, &p) {
            t.checkpoint(it, &p, hook.as_mut())?;
        }
        if t.eval_due(it, &p) && t.evaluate(it, &mut p, hook.as_ref())?.is_break() {
            break;
        }
        if it == iters {
            break;
        }
        let loss = t.step(it, &mut p, hook.multiplier())?;
        hook.after_step(it, &t)?;
        t.pg.fence()?;
        if t.log(it, loss, &mut p, hook.stops_on_non_finite())?
            .is_break()
        {
            break;
        }
        it += 1;
    }
    t.finish(p, hook.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: TrainArgs,
    }

    /// Without `--lr-decay-iters` the cosine ends at the run's last iteration; with it, where
    /// it says; and never before the warm-up ends.
    #[test]
    fn the_decay_length_defaults_to_the_run() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["t", "--data", "c.txt", "--iters", "1500"];
            argv.extend_from_slice(extra);
            Cli::try_parse_from(argv).unwrap().args
        };
        let a = parse(&[]);
        assert_eq!(a.decay_iters(), 1500);
        assert_eq!(learning_rate(&a, 1500), a.min_lr);
        assert!(learning_rate(&a, 1499) > a.min_lr);
        let a = parse(&["--lr-decay-iters", "5000"]);
        assert_eq!(a.decay_iters(), 5000);
        assert!(learning_rate(&a, 1500) > 0.8 * a.lr);
        let a = parse(&["--warmup", "2000"]);
        assert_eq!(a.decay_iters(), 2000);
    }

    /// The tuner's schedules (issue 41) at their key steps: cosine to 50% and 75% of a
    /// 2000-step run (`--lr-decay-iters`: half-way at the middle of the decay, `min_lr` at its
    /// end and flat after it), and warm-up–stable–decay (`lr` until step 1600, linear to
    /// `min_lr` at 2000).
    #[test]
    fn cosine_to_a_fraction_and_wsd_give_their_rates_at_key_steps() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["t", "--data", "c.txt", "--iters", "2000", "--warmup", "100"];
            argv.extend_from_slice(&["--lr", "1e-3", "--min-lr", "1e-4"]);
            argv.extend_from_slice(extra);
            Cli::try_parse_from(argv).unwrap().args
        };
        let close = |x: f32, y: f32| (x - y).abs() <= 1e-5 * y;
        for (decay, mid) in [(1000, 550), (1500, 800), (2000, 1050)] {
            let a = parse(&["--lr-decay-iters", &decay.to_string()]);
            assert!(close(learning_rate(&a, 100), 1e-3), "{decay}");
            assert!(close(learning_rate(&a, mid), 5.5e-4), "{decay}: middle");
            assert!(close(learning_rate(&a, decay), 1e-4), "{decay}: end");
            if decay < 2000 {
                assert_eq!(learning_rate(&a, 1999), a.min_lr, "{decay}: flat after it");
            }
            assert!(
                learning_rate(&a, decay - 1) > 1e-4,
                "{decay}: still decaying"
            );
        }
        let a = parse(&["--schedule", "wsd"]);
        assert!(close(learning_rate(&a, 50), 1e-3 * 51.0 / 101.0), "warm-up");
        for (it, want) in [(100, 1e-3), (1000, 1e-3), (1600, 1e-3), (1800, 5.5e-4)] {
            assert!(
                close(learning_rate(&a, it), want),
                "{it}: {}",
                learning_rate(&a, it)
            );
        }
        assert!(close(learning_rate(&a, 2000), 1e-4));
        assert!(learning_rate(&a, 1601) < 1e-3);
        let a = parse(&["--schedule", "wsd", "--decay-fraction", "0.5"]);
        assert!(close(learning_rate(&a, 1000), 1e-3) && learning_rate(&a, 1001) < 1e-3);
    }

    /// `--warmup 4294967295` overflowed `warmup + 1` (a panic in a debug build).
    #[test]
    fn learning_rate_with_the_largest_warmup_does_not_overflow() {
        let max = u32::MAX.to_string();
        let cli = Cli::try_parse_from([
            "t",
            "--data",
            "corpus.txt",
            "--warmup",
            &max,
            "--lr-decay-iters",
            &max,
        ])
        .unwrap();
        for it in [0, u32::MAX - 1, u32::MAX] {
            let lr = learning_rate(&cli.args, it);
            assert!(
                lr.is_finite() && lr > 0.0 && lr <= cli.args.lr,
                "{it}: {lr}"
            );
        }
    }
}
