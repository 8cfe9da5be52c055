//! One training step of the driver, captured as a CUDA graph and replayed or run op by op, and
//! the LR range test (Smith 2017) that runs on it.

use crate::control::cli::EvalSplits;
use crate::train_args::TrainArgs;
use anyhow::{Context, Result};
use models::gpt::{Dataset, Gpt, GraphedStep};
use rand::rngs::StdRng;
use tensor_ops::dist::{GradSync, ProcessGroup, StepSync};
use tensor_ops::no_grad;
use tensor_ops::optim::{AdamW, AdamWParams, Optimizer, ProdigyParams, ScheduleFreeParams};
use tensor_ops::Tensor;

/// Which optimizer trains.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum OptimizerKind {
    /// AdamW (β 0.9/0.99, eps 1e-8: nanoGPT's).
    Adamw,
    /// Schedule-Free AdamW (Defazio et al. 2024) at the `schedulefree` package's defaults but
    /// the run's weight decay and clipping; evaluated at its average `x`.
    ScheduleFree,
    /// Prodigy (Mishchenko & Defazio 2023) at the `prodigyopt` package's defaults but the run's
    /// weight decay and clipping; `--lr` multiplies its estimate `d` (the package's lr, 1.0).
    Prodigy,
}

impl OptimizerKind {
    pub fn name(self) -> &'static str {
        match self {
            OptimizerKind::Adamw => "adamw",
            OptimizerKind::ScheduleFree => "schedule-free",
            OptimizerKind::Prodigy => "prodigy",
        }
    }
}

/// The run's optimizer: AdamW keeps its own type (its checkpoints are `train_ckpt`'s), the
/// others are trait objects.
pub enum RunOptimizer {
    AdamW(AdamW),
    Other(Box<dyn Optimizer>),
}

impl RunOptimizer {
    /// The optimizer of `kind` over the model's parameters (nanoGPT's decay flags).
    pub fn new(
        kind: OptimizerKind,
        model: &Gpt,
        weight_decay: f32,
        clip: f32,
    ) -> Result<RunOptimizer> {
        let store = model.store();
        let clip = Some(clip);
        Ok(match kind {
            OptimizerKind::Adamw => RunOptimizer::AdamW(store.adamw(AdamWParams {
                beta1: 0.9,
                beta2: 0.99,
                eps: 1e-8,
                weight_decay,
                max_grad_norm: clip,
            })?),
            OptimizerKind::ScheduleFree => {
                RunOptimizer::Other(Box::new(store.schedule_free_adamw(ScheduleFreeParams {
                    weight_decay,
                    max_grad_norm: clip,
                    ..ScheduleFreeParams::default()
                })?))
            }
            OptimizerKind::Prodigy => {
                RunOptimizer::Other(Box::new(store.prodigy(ProdigyParams {
                    weight_decay,
                    max_grad_norm: clip,
                    ..ProdigyParams::default()
                })?))
            }
        })
    }

    pub fn get(&mut self) -> &mut dyn Optimizer {
        match self {
            RunOptimizer::AdamW(o) => o,
            RunOptimizer::Other(o) => o.as_mut(),
        }
    }

    pub fn get_ref(&self) -> &dyn Optimizer {
        match self {
            RunOptimizer::AdamW(o) => o,
            RunOptimizer::Other(o) => o.as_ref(),
        }
    }

    /// The AdamW, when it is one.
    pub fn adamw(&mut self) -> Option<&mut AdamW> {
        match self {
            RunOptimizer::AdamW(o) => Some(o),
            RunOptimizer::Other(_) => None,
        }
    }
}

/// How a step runs: a replay of the captured graph, or eagerly.
pub struct Stepper<'a> {
    pub graphed: Option<GraphedStep>,
    pub pg: &'a ProcessGroup,
    /// This rank's rows of a global batch.
    pub local: usize,
    pub block: usize,
}

impl Stepper<'_> {
    /// Queues one step on this rank's rows `x`, `y` at learning rate `lr`; returns the loss
    /// (on the device, not read).
    pub fn step(
        &self,
        model: &Gpt,
        opt: &mut dyn Optimizer,
        (x, y): (&[u32], &[u32]),
        drop_seed: u64,
        lr: f32,
    ) -> Result<Tensor> {
        match &self.graphed {
            Some(g) => {
                g.step(opt, x, y, drop_seed, lr)?;
                Ok(g.loss().clone())
            }
            None => {
                let dev = model.device();
                let x = Tensor::from_vec(x.to_vec(), &[self.local, self.block], dev)?;
                let y = Tensor::from_vec(y.to_vec(), &[self.local, self.block], dev)?;
                let loss = model.loss(&x, &y, Some(drop_seed))?;
                let mut sync = GradSync::new(self.pg);
                let grads = loss.backward_with(&mut |p, g| sync.grad_ready(p, g))?;
                let loss = loss.detach();
                sync.finish(&loss)?;
                opt.step(&grads, lr)?;
                Ok(loss)
            }
        }
    }
}

/// The LR range test's sweep: `steps` steps at rates growing exponentially from `lo` to `hi`.
#[derive(Debug, Clone, Copy)]
pub struct RangeTest {
    pub steps: u32,
    pub lo: f32,
    pub hi: f32,
}

impl Default for RangeTest {
    /// 100 steps from 1e-6 to 1: the test needs no rate from the user.
    fn default() -> Self {
        RangeTest {
            steps: 100,
            lo: 1e-6,
            hi: 1.0,
        }
    }
}

/// What the sweep found.
#[derive(Debug, Clone)]
pub struct RangePick {
    pub lr: f32,
    /// Steps run (backward passes spent).
    pub steps: u32,
}

impl RangeTest {
    /// The rate of sweep step `i`.
    pub fn rate(&self, i: u32) -> f32 {
        let t = i as f64 / (self.steps.max(2) - 1) as f64;
        (self.lo as f64 * (self.hi as f64 / self.lo as f64).powf(t)) as f32
    }

    /// Runs the sweep from the model's current weights, then puts the weights, the optimizer's
    /// state and the data stream back. The pick is fastai's rule: a tenth of the rate at the
    /// minimum of the smoothed loss (EMA 0.98, bias-corrected); the sweep stops once the
    /// smoothed loss passes 4 × its minimum or is not finite.
    pub fn run(
        &self,
        stepper: &Stepper,
        (model, opt): (&Gpt, &mut dyn Optimizer),
        (ds, rng, batch): (&Dataset, &mut StdRng, usize),
        seed: u64,
    ) -> Result<RangePick> {
        let weights = model.store().snapshot()?;
        let state = opt.state()?;
        let saved_rng = rng.clone();
        let mut sweep_rng = Dataset::rng(seed ^ 0x4A46_E57F);
        let (mut avg, mut best, mut best_lr, mut done) = (0.0f64, f64::INFINITY, self.lo, 0);
        for i in 0..self.steps {
            let lr = self.rate(i);
            let (x, y) = ds
                .batch_ids(false, batch, stepper.block, &mut sweep_rng)
                .context("drawing a range-test batch")?;
            let loss = stepper.step(model, opt, (&x, &y), seed.wrapping_add(i as u64), lr)?;
            let l = loss.item()? as f64;
            done = i + 1;
            avg = 0.98 * avg + 0.02 * l;
            let smooth = avg / (1.0 - 0.98f64.powi(i as i32 + 1));
            if !smooth.is_finite() || smooth > 4.0 * best {
                break;
            }
            if smooth < best {
                (best, best_lr) = (smooth, lr);
            }
        }
        model.store().restore(&weights)?;
        opt.load_state(&state)?;
        *rng = saved_rng;
        Ok(RangePick {
            lr: best_lr / 10.0,
            steps: done,
        })
    }
}

/// The mean loss over `--eval-iters` batches of the train and val splits (train NaN with
/// `--eval-splits val`).
pub(crate) fn evaluate(model: &Gpt, ds: &Dataset, a: &TrainArgs, seed: u64) -> Result<(f32, f32)> {
    no_grad(|| {
        let mut out = [f32::NAN; 2];
        for (k, val) in [false, true].into_iter().enumerate() {
            if !val && a.eval_splits == EvalSplits::Val {
                continue;
            }
            let mut rng = Dataset::rng(seed ^ (k as u64 + 1));
            let mut total = 0.0;
            for _ in 0..a.eval_iters {
                let (x, y) = ds
                    .batch(
                        val,
                        a.batch as usize,
                        a.block as usize,
                        &mut rng,
                        model.device(),
                    )
                    .with_context(|| batch_context(a))?;
                total += model.loss(&x, &y, None)?.item()?;
            }
            out[k] = total / a.eval_iters as f32;
        }
        Ok((out[0], out[1]))
    })
}

/// Writes a NaN into the first element of the model's first parameter (`--inject-nan-at`).
pub(crate) fn poison_first_weight(model: &Gpt) -> Result<()> {
    let (_, p, _) = model
        .parameters()
        .into_iter()
        .next()
        .context("a model has parameters")?;
    let mut v = p.to_vec()?;
    v[0] = f32::NAN;
    p.assign(&Tensor::from_vec(v, p.shape(), p.device())?)?;
    Ok(())
}

pub(crate) fn batch_context(a: &TrainArgs) -> String {
    format!(
        "sampling a batch of --batch {} x --block {} tokens",
        a.batch, a.block
    )
}
