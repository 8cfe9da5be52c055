//! The mean loss of a GPT on fixed batches (no dropout, no gradients), captured once as a CUDA
//! graph and replayed with one launch: a measurement that is taken often between training steps
//! (a line search's probes, an evaluation on fixed batches) costs one launch and one host read
//! instead of a launch per op. A replay reads the parameters' storage as it is then, so the
//! weights may change in place ([`Tensor::assign`], an optimiser, a lerp) between replays; it
//! computes exactly what the eager [`GraphedLoss::eager`] computes (the same kernels in the same
//! order; tested bit for bit).

use super::model::Gpt;
use tensor_ops::graph::{capture, Graph};
use tensor_ops::no_grad;
use tensor_ops::Tensor;
use tensor_ops::{Device, GpuError, Result};

/// A captured loss of one model on fixed batches.
pub struct GraphedLoss {
    graph: Graph,
    /// The sum of the batches' mean losses (a scalar on the device, written by the graph).
    total: Tensor,
    /// The batches, kept alive for the graph that reads them.
    batches: Vec<(Tensor, Tensor)>,
    /// The model's parameters at capture: the graph reads their storage.
    params: Vec<Tensor>,
}

impl std::fmt::Debug for GraphedLoss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GraphedLoss({} batches, {:?})",
            self.batches.len(),
            self.graph
        )
    }
}

const OP: &str = "GraphedLoss";

impl GraphedLoss {
    /// The eager measurement the graph records: the mean over `batches` of the model's mean
    /// loss (inputs, targets as u32 token ids `[batch, block]`), without dropout or gradients.
    /// Queues the work and returns the device scalar of the sum; an empty list is an error.
    pub fn eager_total(model: &Gpt, batches: &[(Tensor, Tensor)]) -> Result<Tensor> {
        no_grad(|| {
            let mut total: Option<Tensor> = None;
            for (x, y) in batches {
                let l = model.loss(x, y, None)?;
                total = Some(match total {
                    Some(t) => t.add(&l)?,
                    None => l,
                });
            }
            total.ok_or_else(|| GpuError::invalid(OP, "no batches to measure"))
        })
    }

    /// [`GraphedLoss::eager_total`] divided by the number of batches, read to the host.
    pub fn eager(model: &Gpt, batches: &[(Tensor, Tensor)]) -> Result<f32> {
        let total = Self::eager_total(model, batches)?;
        Ok(total.item()? / batches.len() as f32)
    }

    /// Records the measurement of `model` on `batches` without running it. Needs a CUDA model
    /// and batches on its device; nothing runs and nothing changes when it fails.
    pub fn capture(model: &Gpt, batches: &[(Tensor, Tensor)]) -> Result<GraphedLoss> {
        let dev = model.device();
        if !matches!(dev, Device::Cuda(_)) {
            return Err(GpuError::invalid(
                OP,
                format!("CUDA graphs need a CUDA model, this one is on {dev}"),
            ));
        }
        if batches.is_empty() {
            return Err(GpuError::invalid(OP, "no batches to measure"));
        }
        if let Some((x, y)) = batches
            .iter()
            .find(|(x, y)| x.device() != dev || y.device() != dev)
        {
            return Err(GpuError::invalid(
                OP,
                format!(
                    "a batch is on {} / {}, the model on {dev}",
                    x.device(),
                    y.device()
                ),
            ));
        }
        let (graph, total) = capture(dev, || Self::eager_total(model, batches))?;
        Ok(GraphedLoss {
            graph,
            total,
            batches: batches.to_vec(),
            params: model.parameters().into_iter().map(|p| p.1).collect(),
        })
    }

    /// The mean loss of `model`'s weights now: one replay, one host read. `model` must be the
    /// model captured (its parameters the same storage); another is a typed error and nothing
    /// runs.
    pub fn loss(&self, model: &Gpt) -> Result<f32> {
        let params: Vec<Tensor> = model.parameters().into_iter().map(|p| p.1).collect();
        let same = params.len() == self.params.len()
            && params
                .iter()
                .zip(&self.params)
                .all(|(a, b)| a.shares_storage(b));
        if !same {
            return Err(GpuError::invalid(
                OP,
                "the model is not the one captured (its parameters are other storage)",
            ));
        }
        self.graph.replay()?;
        Ok(self.total.item()? / self.batches.len() as f32)
    }

    /// How many batches one measurement runs (forward passes).
    pub fn batches(&self) -> usize {
        self.batches.len()
    }
}
