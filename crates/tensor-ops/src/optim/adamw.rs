//! AdamW over a set of parameters, as one fused multi-tensor step, with optional global-norm
//! clipping computed on the device.

use super::common::{
    check_lr as check_lr_in, check_max_grad_norm, check_schedule, clip, copies, gather_grads,
    storage_ptr, zeros_like,
};
use super::fused::{lock_and_launch, FusedCore, FusedStep, StepBufs};
use super::state::{copy_named, load_counted, named};
use super::{Optimizer, OptimizerState};
use crate::autograd::Gradients;
use crate::backend::DeviceBackend;
use crate::tensor::Tensor;
use gpu_core::nn::optim::{AdamWBuffers, StepScalars};
use gpu_core::nn::AdamWConfig;
use gpu_core::{DType, GpuError, Result};

/// AdamW hyper-parameters (PyTorch defaults except the learning rate, which is per step).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWParams {
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// Clip the global gradient norm to this value first, when set.
    pub max_grad_norm: Option<f32>,
}

impl Default for AdamWParams {
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            max_grad_norm: None,
        }
    }
}

/// A copy of an [`AdamW`]'s state: both moments of each parameter (in the optimiser's order)
/// and the step count that sets the bias correction.
#[derive(Debug, Clone)]
pub struct AdamWState {
    pub m: Vec<Tensor>,
    pub v: Vec<Tensor>,
    pub step: u32,
}

/// AdamW state: first and second moments for each parameter.
pub struct AdamW {
    core: FusedCore,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    hp: AdamWParams,
    step: u32,
}

impl AdamWParams {
    /// Checks the hyper-parameters: betas in `[0, 1)`, `eps` and `weight_decay` finite and
    /// `>= 0`, `max_grad_norm` finite and `> 0` when set.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str, v: f32, want: &str| {
            Err(GpuError::invalid(
                "AdamW",
                format!("{what} must be {want}, got {v}"),
            ))
        };
        for (what, b) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return bad(what, b, "in [0, 1)");
            }
        }
        for (what, x) in [("eps", self.eps), ("weight_decay", self.weight_decay)] {
            if !(x.is_finite() && x >= 0.0) {
                return bad(what, x, "finite and >= 0");
            }
        }
        check_max_grad_norm("AdamW", self.max_grad_norm)
    }
}

/// Checks a step's learning rate: finite and `>= 0`.
fn check_lr(lr: f32) -> Result<()> {
    check_lr_in("AdamW::step", lr)
}

impl AdamW {
    /// `params` with whether each is weight-decayed (nanoGPT decays 2-D weights only).
    ///
    /// Errors (typed, before anything is allocated) on invalid hyper-parameters (see
    /// [`AdamWParams::validate`]), parameters on different devices, parameters that are not f32
    /// leaves with `requires_grad_`, and parameters that share storage: the same tensor listed
    /// twice, a view of another parameter, or `p.detach().requires_grad_()` beside `p`. A shared
    /// storage would be updated twice per step (and its lock taken twice).
    pub fn new(params: Vec<(Tensor, bool)>, hp: AdamWParams) -> Result<AdamW> {
        hp.validate()?;
        let core = FusedCore::new("AdamW", params, hp.weight_decay)?;
        Ok(AdamW {
            m: zeros_like(&core.params)?,
            v: zeros_like(&core.params)?,
            core,
            hp,
            step: 0,
        })
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u32 {
        self.step
    }

    /// The first and second moments, one of each per parameter (in the order given to
    /// [`AdamW::new`]).
    pub fn moments(&self) -> (&[Tensor], &[Tensor]) {
        (&self.m, &self.v)
    }

    /// A copy of the optimiser's state (moments and step count), on the device.
    pub fn state(&self) -> Result<AdamWState> {
        Ok(AdamWState {
            m: copies(&self.m)?,
            v: copies(&self.v)?,
            step: self.step,
        })
    }

    /// Writes a state from [`AdamW::state`] (of this optimiser or one over parameters of the
    /// same shapes) back, in place. Everything is checked (count, shapes, devices) before
    /// anything is written.
    pub fn load_state(&mut self, state: &AdamWState) -> Result<()> {
        let op = "AdamW::load_state";
        if state.m.len() != self.m.len() || state.v.len() != self.v.len() {
            return Err(GpuError::invalid(
                op,
                format!(
                    "the state holds {} and {} moments, the optimiser {} parameters",
                    state.m.len(),
                    state.v.len(),
                    self.m.len()
                ),
            ));
        }
        for (mine, theirs) in self
            .m
            .iter()
            .zip(&state.m)
            .chain(self.v.iter().zip(&state.v))
        {
            if mine.shape() != theirs.shape()
                || mine.device() != theirs.device()
                || theirs.dtype() != DType::F32
            {
                return Err(GpuError::shape(
                    op,
                    format!("f32 {:?} on {}", mine.shape(), mine.device()),
                    format!(
                        "{} {:?} on {}",
                        theirs.dtype(),
                        theirs.shape(),
                        theirs.device()
                    ),
                ));
            }
        }
        for (mine, theirs) in self
            .m
            .iter()
            .zip(&state.m)
            .chain(self.v.iter().zip(&state.v))
        {
            mine.assign(theirs)?;
        }
        self.step = state.step;
        self.core.last_clip = None;
        Ok(())
    }

    /// One step with learning rate `lr`. Parameters without a gradient are an error (they would
    /// silently never train).
    ///
    /// A step that fails leaves no trace: everything is checked (learning rate, gradients'
    /// presence, shape, dtype and device, the step counter) before anything is written, and the
    /// step counter advances only when the update ran. A non-finite gradient is not an error:
    /// as in PyTorch it propagates (with clipping, one NaN makes every parameter NaN), for the
    /// caller to detect and roll back.
    pub fn step(&mut self, grads: &Gradients, lr: f32) -> Result<()> {
        check_lr(lr)?;
        let step = self.next_step()?;
        self.queue_step(grads, lr, step, None)?;
        self.step = step;
        Ok(())
    }

    /// The device scalars `[lr, step_size, bc2_sqrt]` of the next step at `lr`
    /// ([`gpu_core::nn::optim::adamw_schedule`]): what to write into the schedule tensor of
    /// [`AdamW::step_scheduled`] before each replay of a graph that recorded it.
    pub fn next_schedule(&self, lr: f32) -> Result<[f32; 3]> {
        check_lr(lr)?;
        Ok(gpu_core::nn::optim::adamw_schedule(
            self.config(lr, self.next_step()?),
        ))
    }

    /// Queues a step as [`AdamW::step`] does, on CUDA, with the learning rate and the bias
    /// corrections read on the device when it runs, from `schedule` (an f32 CUDA tensor of 3
    /// elements, see [`AdamW::next_schedule`]): the step a CUDA graph records
    /// ([`crate::graph`]). The step counter does not advance here: a replay is counted with
    /// [`AdamW::count_replayed_step`]. With the schedule of `next_schedule(lr)` it gives the
    /// same bits as `step(grads, lr)`. The device values are used as they are, unchecked:
    /// write them from `next_schedule`, which refuses a bad learning rate.
    pub fn step_scheduled(&mut self, grads: &Gradients, schedule: &Tensor) -> Result<()> {
        let step = self.next_step()?;
        self.queue_step(grads, 0.0, step, Some(schedule))
    }

    /// Counts one step run by a replay of a graph that recorded [`AdamW::step_scheduled`].
    pub fn count_replayed_step(&mut self) -> Result<()> {
        self.step = self.next_step()?;
        Ok(())
    }

    /// An identity of this optimiser's state (its first moment buffer), so that a graph that
    /// recorded one optimiser's step can refuse to count its replays on another.
    pub(crate) fn identity(&self) -> usize {
        self.m.first().map_or(0, storage_ptr)
    }

    /// The state lists with their name prefixes in the state.
    fn state_lists(&self) -> [(&'static str, &[Tensor]); 2] {
        [("m", &self.m), ("v", &self.v)]
    }

    fn next_step(&self) -> Result<u32> {
        self.step
            .checked_add(1)
            .ok_or_else(|| GpuError::invalid("AdamW::step", "the step counter would overflow u32"))
    }

    fn config(&self, lr: f32, step: u32) -> AdamWConfig {
        AdamWConfig {
            lr,
            beta1: self.hp.beta1,
            beta2: self.hp.beta2,
            eps: self.hp.eps,
            step,
        }
    }

    /// Checks everything, then queues the clipping and the update (with a device schedule
    /// when given) and records the clip result.
    fn queue_step(
        &mut self,
        grads: &Gradients,
        lr: f32,
        step: u32,
        schedule: Option<&Tensor>,
    ) -> Result<()> {
        let Some(first) = self.core.params.first() else {
            return Ok(());
        };
        let dev = first.device();
        if let Some(s) = schedule {
            check_schedule("AdamW::step_scheduled", s, 3, dev)?;
            if !matches!(dev, gpu_core::Device::Cuda(_)) {
                return Err(GpuError::invalid(
                    "AdamW::step_scheduled",
                    format!("a device schedule is for CUDA parameters, these are on {dev}"),
                ));
            }
        }
        let written = [&self.m[..], &self.v];
        let gs = gather_grads("AdamW::step", &self.core.params, &written, grads, dev)?;
        let step = AdamWStep {
            cfg: self.config(lr, step),
        };
        let clip = clip(&gs, self.hp.max_grad_norm, dev)?;
        let lists = (&self.core.params[..], &self.core.decays[..], &gs[..]);
        lock_and_launch(dev, lists, (written, []), (&clip, &[], schedule), &step)?;
        self.core.last_clip = clip;
        Ok(())
    }

    /// The global gradient norm before clipping at the last step (a device-to-host copy).
    pub fn last_grad_norm(&self) -> Result<Option<f32>> {
        self.core.last_grad_norm()
    }
}

/// AdamW's op over the step's buffers: `[m, v]` written; with a device schedule, the
/// scheduled op.
struct AdamWStep {
    cfg: AdamWConfig,
}

impl FusedStep<2, 0> for AdamWStep {
    fn launch<B: DeviceBackend>(&self, be: &B, b: StepBufs<'_, B, 2, 0>) -> Result<()> {
        let (mut params, [mut m, mut v]) = (b.params, b.written);
        let bufs = AdamWBuffers {
            params: &mut params,
            grads: &b.grads,
            m: &mut m,
            v: &mut v,
            weight_decay: b.decays,
            grad_scale: b.clip,
        };
        match b.scalars {
            StepScalars::Host(_) => be.adamw_step(bufs, self.cfg),
            StepScalars::Device(s) => be.adamw_step_scheduled(bufs, self.cfg, s),
        }
    }
}

impl Optimizer for AdamW {
    fn name(&self) -> &'static str {
        "adamw"
    }

    fn step(&mut self, grads: &Gradients, lr: f32) -> Result<()> {
        AdamW::step(self, grads, lr)
    }

    fn schedule_len(&self) -> usize {
        3
    }

    fn next_schedule(&self, lr: f32) -> Result<Vec<f32>> {
        Ok(AdamW::next_schedule(self, lr)?.to_vec())
    }

    fn step_scheduled(&mut self, grads: &Gradients, schedule: &Tensor) -> Result<()> {
        AdamW::step_scheduled(self, grads, schedule)
    }

    fn count_replayed_step(&mut self, _lr: f32) -> Result<()> {
        AdamW::count_replayed_step(self)
    }

    fn steps(&self) -> u32 {
        self.step
    }

    fn last_grad_norm(&self) -> Result<Option<f32>> {
        AdamW::last_grad_norm(self)
    }

    /// Tensors `m.i`, `v.i`; scalar `step`.
    fn state(&self) -> Result<OptimizerState> {
        Ok(OptimizerState {
            optimizer: "adamw".into(),
            tensors: copy_named(&named(&self.state_lists()))?,
            scalars: vec![("step".into(), self.step as f64)],
        })
    }

    fn load_state(&mut self, state: &OptimizerState) -> Result<()> {
        const OP: &str = "AdamW::load_state";
        self.step = load_counted(OP, "adamw", &named(&self.state_lists()), state)?;
        self.core.last_clip = None;
        Ok(())
    }

    fn state_id(&self) -> usize {
        self.identity()
    }
}
