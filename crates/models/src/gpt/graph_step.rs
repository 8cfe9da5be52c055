//! A whole GPT training step — forward, loss, backward, global-norm clipping, AdamW — captured
//! once as a CUDA graph and replayed with one launch per step ([`tensor_ops::graph`]). The batch,
//! the dropout seed and the step's learning rate and bias corrections are written to the
//! device before each replay; the loss stays on the device until the caller reads it (at its
//! log interval). A replay computes exactly what the eager step `model.loss` → `backward` →
//! `AdamW::step` computes with the same inputs: the same kernels in the same order on the same
//! values (tested bit for bit).

use super::blocks::DropoutSeeds;
use super::model::Gpt;
use gpu_cuda::PoolStats;
use tensor_ops::graph::{capture, with_dropout_offsets, Graph};
use tensor_ops::optim::Optimizer;
use tensor_ops::Tensor;
use tensor_ops::{Device, GpuError, Result};

/// A captured training step of one model and its optimiser, for batches of one shape.
pub struct GraphedStep {
    graph: Graph,
    /// Token ids and targets `[batch, block]`, read by the graph.
    x: Tensor,
    y: Tensor,
    /// Per dropout site, what the replay's seed adds to the capture's (u64s as U32 pairs).
    offsets: Tensor,
    /// The dropout sites of a pass and their seeds in the captured pass (seed 0).
    captured_seeds: Vec<u64>,
    /// The optimiser's schedule ([`Optimizer::next_schedule`]; AdamW's `[lr, step_size,
    /// bc2_sqrt]`).
    schedule: Tensor,
    /// The mean loss of the last replay (detached; written by the graph).
    loss: Tensor,
    vocab: usize,
    opt: usize,
}

impl std::fmt::Debug for GraphedStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GraphedStep({:?} tokens, {:?})",
            self.x.shape(),
            self.graph
        )
    }
}

impl GraphedStep {
    /// Records one training step of `model` with `opt` (any [`Optimizer`] over the model's
    /// parameters: `&mut AdamW`, `&mut Prodigy`, `&mut dyn Optimizer`) on batches of `batch` ×
    /// `block` tokens, without running it. Needs a CUDA model; the optimiser must be on the
    /// model's device.
    pub fn capture<O: Optimizer + ?Sized>(
        model: &Gpt,
        opt: &mut O,
        batch: usize,
        block: usize,
    ) -> Result<Self> {
        Self::capture_synced(model, opt, batch, block, &mut tensor_ops::dist::NoSync)
    }

    /// [`GraphedStep::capture`] with `sync`'s hooks in the step: each gradient as the backward
    /// pass finishes it, then the loss before AdamW ([`tensor_ops::dist::StepSync`]). What they queue
    /// (a data-parallel average of the gradients, overlapped with the pass) is captured into the
    /// step.
    pub fn capture_synced<O: Optimizer + ?Sized>(
        model: &Gpt,
        opt: &mut O,
        batch: usize,
        block: usize,
        sync: &mut dyn tensor_ops::dist::StepSync,
    ) -> Result<Self> {
        let dev = model.device();
        if !matches!(dev, Device::Cuda(_)) {
            return Err(GpuError::invalid(
                "GraphedStep::capture",
                format!("CUDA graphs need a CUDA model, this one is on {dev}"),
            ));
        }
        let n = batch.checked_mul(block).filter(|&n| n > 0).ok_or_else(|| {
            GpuError::invalid(
                "GraphedStep::capture",
                format!("{batch} x {block} tokens: the batch must be non-empty and fit usize"),
            )
        })?;
        let ids = || gpu_core::cpu::try_filled_vec(n, 0u32);
        let x = Tensor::from_vec(ids()?, &[batch, block], dev)?;
        let y = Tensor::from_vec(ids()?, &[batch, block], dev)?;
        // The sites' seeds are an LCG's iterates from the pass's seed (`DropoutSeeds`): the
        // capture runs the pass with seed 0, and each replay's offsets make up the difference.
        let sites = model.dropout_sites();
        let captured_seeds = DropoutSeeds::site_seeds(0, sites);
        let offsets = Tensor::from_vec(vec![0u32; 2 * sites], &[2 * sites], dev)?;
        // Overwritten before every replay; any valid schedule serves the capture.
        let schedule = opt.next_schedule(0.0)?;
        let schedule = Tensor::from_vec(schedule, &[opt.schedule_len()], dev)?;
        let (graph, loss) = capture(dev, || {
            with_dropout_offsets(&offsets, || -> Result<Tensor> {
                let loss = model.loss(&x, &y, Some(0))?; // pass seed 0: `captured_seeds`
                let grads = loss.backward_with(&mut |p, g| sync.grad_ready(p, g))?;
                let loss = loss.detach();
                sync.finish(&loss)?;
                opt.step_scheduled(&grads, &schedule)?;
                Ok(loss)
            })?
        })?;
        Ok(GraphedStep {
            graph,
            x,
            y,
            offsets,
            captured_seeds,
            schedule,
            loss,
            vocab: model.config.vocab_size,
            opt: opt.state_id(),
        })
    }

    /// Queues one training step on the batch `x` → `y` (host token ids, `batch × block`
    /// row-major) with dropout seed `seed` and learning rate `lr`: the eager
    /// `model.loss(x, y, Some(seed))`, `backward`, `opt.step(grads, lr)`. Asynchronous: read
    /// [`GraphedStep::loss`] when the value is needed. `opt` must be the optimiser captured.
    /// Everything is checked (lengths, ids below the vocabulary size, `lr`, the optimiser)
    /// before anything is written.
    pub fn step<O: Optimizer + ?Sized>(
        &self,
        opt: &mut O,
        x: &[u32],
        y: &[u32],
        seed: u64,
        lr: f32,
    ) -> Result<()> {
        const OP: &str = "GraphedStep::step";
        if opt.state_id() != self.opt {
            return Err(GpuError::invalid(
                OP,
                "not the optimiser this step was captured with",
            ));
        }
        for (name, ids) in [("x", x), ("y", y)] {
            if ids.len() != self.x.numel() {
                return Err(GpuError::shape(
                    OP,
                    format!("{name} of {:?} token ids", self.x.shape()),
                    ids.len(),
                ));
            }
            if let Some(&bad) = ids.iter().find(|&&t| t as usize >= self.vocab) {
                return Err(GpuError::invalid(
                    OP,
                    format!(
                        "{name} holds token id {bad}, the vocabulary has {}",
                        self.vocab
                    ),
                ));
            }
        }
        let schedule = opt.next_schedule(lr)?;
        self.x.write_from_host(x)?;
        self.y.write_from_host(y)?;
        let wanted = DropoutSeeds::site_seeds(seed, self.captured_seeds.len());
        let offsets: Vec<u32> = (wanted.iter().zip(&self.captured_seeds))
            .map(|(w, c)| w.wrapping_sub(*c))
            .flat_map(|d| [d as u32, (d >> 32) as u32])
            .collect();
        self.offsets.write_from_host(&offsets)?;
        self.schedule.write_from_host(&schedule)?;
        self.graph.replay()?;
        opt.count_replayed_step(lr)
    }

    /// The mean loss of the last replay, on the device (reading it synchronises).
    pub fn loss(&self) -> &Tensor {
        &self.loss
    }

    /// The device memory the graph keeps for its replays (activations, gradients).
    pub fn memory_stats(&self) -> PoolStats {
        self.graph.memory_stats()
    }
}
