//! Optimisers behind one trait, [`Optimizer`]: [`AdamW`], [`ScheduleFreeAdamW`] and
//! [`Prodigy`], each one fused multi-tensor step (a few kernel launches on CUDA) with optional
//! global-norm clipping computed on the device, a graph path (the step's scalars read from a
//! small device "schedule" tensor, so that a CUDA graph can replay it, `models::gpt::GraphedStep`),
//! device-side snapshots of their state ([`OptimizerState`]) and safetensors checkpoints.

mod adamw;
mod common;
mod fused;
mod prodigy;
mod schedule_free;
mod state;

pub use adamw::{AdamW, AdamWParams, AdamWState};
pub use prodigy::{Prodigy, ProdigyParams};
pub use schedule_free::{lerp_tensors, ScheduleFreeAdamW, ScheduleFreeParams};
pub use state::OptimizerState;

use crate::autograd::Gradients;
use crate::tensor::Tensor;
use gpu_core::Result;
use std::path::Path;

/// An optimiser over a fixed list of parameters (object safe: `&mut dyn Optimizer` works).
///
/// Two ways to step:
/// - eagerly, [`Optimizer::step`] with the step's learning rate;
/// - recorded in a CUDA graph: [`Optimizer::step_scheduled`] reads the step's scalars from a
///   device tensor of [`Optimizer::schedule_len`] f32 when it runs; before each replay the
///   caller writes [`Optimizer::next_schedule`]`(lr)` into it, and after it calls
///   [`Optimizer::count_replayed_step`]`(lr)`. A replay with the schedule of `next_schedule(lr)`
///   gives the same bits as `step(grads, lr)`. No step reads anything back to the host.
///
/// Every failed call leaves no trace: everything is checked before anything is written.
/// Non-finite gradients are not errors: they propagate into the parameters (as in PyTorch), for
/// the caller to detect and roll back.
pub trait Optimizer {
    /// A short name: `"adamw"`, `"schedule_free_adamw"`, `"prodigy"`.
    fn name(&self) -> &'static str;

    /// One eager step. `lr` (finite, `>= 0`) is the scheduled learning rate: AdamW's and
    /// Schedule-Free AdamW's step size, Prodigy's multiplier of its adaptive `d` (1 by default).
    /// Every parameter needs a gradient in `grads`.
    fn step(&mut self, grads: &Gradients, lr: f32) -> Result<()>;

    /// Number of f32 values in the graph path's schedule tensor.
    fn schedule_len(&self) -> usize;

    /// The schedule values of the next step at `lr` (refuses a bad `lr`, as `step` does).
    fn next_schedule(&self, lr: f32) -> Result<Vec<f32>>;

    /// Queues the next step with its scalars read on the device from `schedule` (f32,
    /// [`Optimizer::schedule_len`] elements, on the parameters' device) when it runs: the step a
    /// CUDA graph records. The step counters do not advance here (see
    /// [`Optimizer::count_replayed_step`]). AdamW's takes CUDA parameters only; the others also
    /// run on the CPU (reading the schedule's values there).
    fn step_scheduled(&mut self, grads: &Gradients, schedule: &Tensor) -> Result<()>;

    /// Counts one step run by a replay of a graph that recorded [`Optimizer::step_scheduled`]
    /// with the schedule of `next_schedule(lr)`: advances the host-side state as `step` would.
    fn count_replayed_step(&mut self, lr: f32) -> Result<()>;

    /// Steps taken (eager or counted replays).
    fn steps(&self) -> u32;

    /// The global gradient norm before clipping at the last step, when clipping is on (a
    /// device-to-host copy).
    fn last_grad_norm(&self) -> Result<Option<f32>>;

    /// A copy of the optimiser's state: device copies of every state tensor, host scalars.
    fn state(&self) -> Result<OptimizerState>;

    /// Writes a state from [`Optimizer::state`] (of this optimiser or one of the same kind
    /// over parameters of the same shapes) back, in place. Name, tensors (names, dtypes,
    /// shapes) and scalars are all checked before anything is written; tensors on another
    /// device are uploaded first.
    fn load_state(&mut self, state: &OptimizerState) -> Result<()>;

    /// Switches the parameters to the point where the model is evaluated. Schedule-Free AdamW
    /// trains at `y` but evaluates at the average `x`: this overwrites the parameters in place
    /// with `x` (call it before evaluation and before saving the model). A no-op for AdamW and
    /// Prodigy, and when already switched.
    fn eval_params(&mut self) -> Result<()> {
        Ok(())
    }

    /// Switches the parameters back to where gradients are taken (`y` for Schedule-Free AdamW;
    /// call it before training resumes). A no-op for AdamW and Prodigy, and when already there.
    fn train_params(&mut self) -> Result<()> {
        Ok(())
    }

    /// An identity of this optimiser's device state, so that a graph that recorded one
    /// optimiser's step can refuse to count its replays on another.
    fn state_id(&self) -> usize;

    /// Writes [`Optimizer::state`] to a safetensors file ([`OptimizerState::save`]).
    fn save_state(&self, path: &Path) -> Result<()> {
        self.state()?.save(path)
    }

    /// Loads a file written by [`Optimizer::save_state`] into this optimiser
    /// ([`Optimizer::load_state`]).
    fn load_state_file(&mut self, path: &Path) -> Result<()> {
        let state = OptimizerState::load(path)?;
        self.load_state(&state)
    }
}
