//! The measurements of the segment line search on a GPT: the loss on fixed probe batches of the
//! training split (never the validation split), at the current weights or at a point along the
//! segment's displacement; and what a rollback returns to.

use anyhow::{Context, Result};
use rand::rngs::StdRng;
use tensor_ops::gpt::{Dataset, Gpt};
use tensor_ops::nn::Snapshot;
use tensor_ops::optim::{AdamW, AdamWState};
use tensor_ops::{no_grad, Tensor};

/// Fixed batches of the training split, drawn once from their own seed.
pub struct ProbeSet {
    batches: Vec<(Tensor, Tensor)>,
}

impl ProbeSet {
    /// `n` batches of `batch` × `block` tokens from the training split, on the model's device.
    pub fn new(
        ds: &Dataset,
        n: usize,
        batch: usize,
        block: usize,
        seed: u64,
        model: &Gpt,
    ) -> Result<ProbeSet> {
        let mut rng = Dataset::rng(seed ^ 0x9E37_79B9_7F4A_7C15);
        let batches = (0..n)
            .map(|_| ds.batch(false, batch, block, &mut rng, model.device()))
            .collect::<tensor_ops::Result<_>>()
            .context("drawing the probe batches")?;
        Ok(ProbeSet { batches })
    }

    /// Forward passes one measurement costs.
    pub fn forwards(&self) -> u64 {
        self.batches.len() as u64
    }

    /// The mean loss of the model's current weights over the probe batches (no dropout, no
    /// gradients). One host read.
    pub fn loss(&self, model: &Gpt) -> Result<f32> {
        no_grad(|| {
            let mut total: Option<Tensor> = None;
            for (x, y) in &self.batches {
                let l = model.loss(x, y, None)?;
                total = Some(match total {
                    Some(t) => t.add(&l)?,
                    None => l,
                });
            }
            let total = total.context("no probe batches")?;
            Ok(total.item()? / self.batches.len() as f32)
        })
    }

    /// The loss at `start + s·(now − start)`, the model's weights being `now`; the weights are
    /// `now` again afterwards, also when the measurement fails.
    pub fn loss_along(&self, model: &Gpt, start: &Snapshot, s: f32) -> Result<f32> {
        let now = model.store().snapshot()?;
        let measured = (|| {
            no_grad(|| -> Result<()> {
                for (name, p, _) in model.parameters() {
                    let w0 = start
                        .get(&name)
                        .with_context(|| format!("the segment start has no '{name}'"))?;
                    // s·now − (s − 1)·start
                    let w = p.mul_scalar(s)?.sub(&w0.mul_scalar(s - 1.0)?)?;
                    p.assign(&w)?;
                }
                Ok(())
            })?;
            self.loss(model)
        })();
        model.store().restore(&now)?;
        measured
    }
}

/// Where a segment started: what a rollback returns to.
pub struct SegmentStart {
    pub step: u32,
    pub weights: Snapshot,
    pub optimizer: AdamWState,
    pub rng: StdRng,
    /// The probe loss at these weights.
    pub loss: f32,
}

impl SegmentStart {
    pub fn take(
        step: u32,
        model: &Gpt,
        opt: &AdamW,
        rng: &StdRng,
        loss: f32,
    ) -> Result<SegmentStart> {
        Ok(SegmentStart {
            step,
            weights: model.store().snapshot()?,
            optimizer: opt.state()?,
            rng: rng.clone(),
            loss,
        })
    }

    /// Puts the weights, the optimizer's state and the data stream back; returns the step to
    /// continue from.
    pub fn restore(&self, model: &Gpt, opt: &mut AdamW, rng: &mut StdRng) -> Result<u32> {
        model.store().restore(&self.weights)?;
        opt.load_state(&self.optimizer)?;
        *rng = self.rng.clone();
        Ok(self.step)
    }
}
