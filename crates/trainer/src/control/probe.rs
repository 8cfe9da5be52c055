//! The measurements of the segment line search on a GPT: the loss on fixed probe batches of the
//! held-out slice of the training split (or of the training split itself; never the validation
//! split), at the current weights or at a point along the segment's displacement; and what a
//! rollback returns to.

use anyhow::{Context, Result};
use models::gpt::{Dataset, Gpt, GraphedLoss};
use rand::rngs::StdRng;
use std::cell::Cell;
use tensor_ops::optim::{lerp_tensors, Optimizer, OptimizerState};
use tensor_ops::{Device, Tensor};

/// Where probe batches are drawn from (never the validation split).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeSplit {
    /// The training split, the tokens training batches are drawn from.
    Train,
    /// The held-out tokens carved from the training split ([`Dataset::hold_out`]: pieces
    /// spread over it).
    HeldOut,
}

/// Which probe batches to draw: `n` batches of `batch` × `block` tokens from `split`, from
/// their own `seed`.
#[derive(Debug, Clone, Copy)]
pub struct ProbeDraw {
    pub split: ProbeSplit,
    pub n: usize,
    pub batch: usize,
    pub block: usize,
    pub seed: u64,
}

/// Fixed batches drawn once from their own seed. On CUDA their loss is measured by replaying
/// one captured graph ([`GraphedLoss`]): one launch and one host read.
pub struct ProbeSet {
    batches: Vec<(Tensor, Tensor)>,
    graphed: Option<GraphedLoss>,
    /// Batch forward passes run so far (counted where they run, not where they are planned).
    run: Cell<u64>,
}

impl ProbeSet {
    /// The batches of `draw` on the model's device; with `graphed` on a CUDA model, their
    /// measurement is captured as a graph now.
    pub fn new(ds: &Dataset, draw: ProbeDraw, model: &Gpt, graphed: bool) -> Result<ProbeSet> {
        let mut rng = Dataset::rng(draw.seed ^ 0x9E37_79B9_7F4A_7C15);
        let (batch, block, dev) = (draw.batch, draw.block, model.device());
        let batches: Vec<_> = (0..draw.n)
            .map(|_| match draw.split {
                ProbeSplit::Train => ds.batch(false, batch, block, &mut rng, dev),
                ProbeSplit::HeldOut => ds.holdout_batch(batch, block, &mut rng, dev),
            })
            .collect::<tensor_ops::Result<_>>()
            .with_context(|| format!("drawing the probe batches ({:?})", draw.split))?;
        let graphed = match model.device() {
            Device::Cuda(_) if graphed => Some(
                GraphedLoss::capture(model, &batches)
                    .context("capturing the probe loss as a CUDA graph (--eager runs without)")?,
            ),
            _ => None,
        };
        Ok(ProbeSet {
            batches,
            graphed,
            run: Cell::new(0),
        })
    }

    /// Forward passes one measurement costs.
    pub fn forwards(&self) -> u64 {
        self.batches.len() as u64
    }

    /// Batch forward passes this set has run so far, successful or not.
    pub fn forwards_run(&self) -> u64 {
        self.run.get()
    }

    /// Whether a measurement replays a captured graph.
    pub fn graphed(&self) -> bool {
        self.graphed.is_some()
    }

    /// The mean loss of the model's current weights over the probe batches (no dropout, no
    /// gradients). One host read.
    pub fn loss(&self, model: &Gpt) -> Result<f32> {
        self.run.set(self.run.get() + self.forwards());
        Ok(match &self.graphed {
            Some(g) => g.loss(model)?,
            None => GraphedLoss::eager(model, &self.batches)?,
        })
    }

    /// The losses at the points `start + s·(end − start)` (`end`: the model's weights now when
    /// `None`), measured one after another. The model's weights are what they were afterwards,
    /// also when a measurement fails; they are copied once for all the points, and each point
    /// is written with one copy per tensor and, unless `s` = 1, one fused lerp.
    pub fn losses_along(&self, model: &Gpt, points: &[Point<'_>]) -> Result<Vec<f32>> {
        let now = Weights::of(model)?;
        let params = model_params(model);
        let measured = (|| {
            let mut out = Vec::with_capacity(points.len());
            for &(start, end, s) in points {
                let end = end.unwrap_or(&now);
                if s == 1.0 {
                    end.load_into(model)?;
                } else {
                    start.load_into(model)?;
                    lerp_tensors(&params, &end.0, s)?;
                }
                out.push(self.loss(model)?);
            }
            Ok(out)
        })();
        now.load_into(model)?;
        measured
    }
}

/// A point of a line search: `start + s·(end − start)`, `end` the weights now when `None`.
pub type Point<'a> = (&'a Weights, Option<&'a Weights>, f32);

fn model_params(model: &Gpt) -> Vec<Tensor> {
    model.parameters().into_iter().map(|p| p.1).collect()
}

/// A copy of a model's weights in the store's order, in its own storage on the device.
pub struct Weights(Vec<Tensor>);

impl Weights {
    /// Tensors in the model's parameter order.
    pub fn from_tensors(ts: Vec<Tensor>) -> Weights {
        Weights(ts)
    }

    pub fn tensors(&self) -> &[Tensor] {
        &self.0
    }

    pub fn of(model: &Gpt) -> Result<Weights> {
        Ok(Weights(
            model_params(model)
                .iter()
                .map(Tensor::deep_copy)
                .collect::<tensor_ops::Result<_>>()?,
        ))
    }

    pub fn deep_copy(&self) -> Result<Weights> {
        Ok(Weights(
            self.0
                .iter()
                .map(Tensor::deep_copy)
                .collect::<tensor_ops::Result<_>>()?,
        ))
    }

    /// Writes these weights into the model's parameters, in place. Every tensor's shape,
    /// dtype and device is checked before the first is written: a refusal leaves no trace.
    pub fn load_into(&self, model: &Gpt) -> Result<()> {
        let params = model_params(model);
        anyhow::ensure!(
            params.len() == self.0.len(),
            "{} saved tensors for {} parameters",
            self.0.len(),
            params.len()
        );
        for (i, (p, w)) in params.iter().zip(&self.0).enumerate() {
            anyhow::ensure!(
                p.shape() == w.shape() && p.dtype() == w.dtype() && p.device() == w.device(),
                "saved tensor {i} is {} {:?} on {}, the parameter {} {:?} on {}",
                w.dtype(),
                w.shape(),
                w.device(),
                p.dtype(),
                p.shape(),
                p.device()
            );
        }
        for (p, w) in params.iter().zip(&self.0) {
            p.assign(w)?;
        }
        Ok(())
    }
}

/// A running average of the weights, `w̄ ← w̄ + β·(w − w̄)`, updated every few steps: the
/// trajectory with its step-to-step noise filtered out (what annealing the rate would keep).
pub struct WeightAverage {
    pub avg: Weights,
    beta: f32,
}

impl WeightAverage {
    pub fn new(model: &Gpt, beta: f32) -> Result<WeightAverage> {
        Ok(WeightAverage {
            avg: Weights::of(model)?,
            beta,
        })
    }

    /// Moves the average toward the model's weights (one fused launch on CUDA).
    pub fn update(&mut self, model: &Gpt) -> Result<()> {
        Ok(lerp_tensors(&self.avg.0, &model_params(model), self.beta)?)
    }
}

/// Where a segment started: what a rollback returns to.
pub struct SegmentStart {
    pub step: u32,
    pub weights: Weights,
    /// The weight average then (when the controller keeps one).
    pub average: Option<Weights>,
    pub optimizer: OptimizerState,
    pub rng: StdRng,
    /// The probe loss at these weights.
    pub loss: f32,
    /// The probe loss at the weight average then, when measured.
    pub avg_loss: Option<f32>,
    /// The probe loss at the weight average at this segment's end (set by its line search).
    pub avg_end_loss: Option<f32>,
}

impl SegmentStart {
    pub fn take(
        step: u32,
        (model, average): (&Gpt, Option<&WeightAverage>),
        opt: &dyn Optimizer,
        rng: &StdRng,
        loss: f32,
    ) -> Result<SegmentStart> {
        Ok(SegmentStart {
            step,
            weights: Weights::of(model)?,
            average: average.map(|a| a.avg.deep_copy()).transpose()?,
            optimizer: opt.state()?,
            rng: rng.clone(),
            loss,
            avg_loss: None,
            avg_end_loss: None,
        })
    }

    /// Puts the weights, the optimizer's state and the data stream back; returns the step to
    /// continue from.
    pub fn restore(
        &self,
        (model, average): (&Gpt, Option<&mut WeightAverage>),
        opt: &mut dyn Optimizer,
        rng: &mut StdRng,
    ) -> Result<u32> {
        // The optimizer's state and the weights are each checked before they are written;
        // the copy of the average is made before anything is.
        let avg_copy = self.average.as_ref().map(Weights::deep_copy).transpose()?;
        opt.load_state(&self.optimizer)?;
        self.weights.load_into(model)?;
        if let (Some(avg), Some(copy)) = (average, avg_copy) {
            avg.avg = copy;
        }
        *rng = self.rng.clone();
        Ok(self.step)
    }
}
