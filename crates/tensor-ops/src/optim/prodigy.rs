//! Prodigy (Mishchenko & Defazio 2023), as the `prodigyopt` package's `Prodigy` (1.1,
//! `slice_p = 1`, no FSDP): Adam whose step size `d` is estimated from the distance travelled
//! from the initial point `p0`. The estimate needs two sums over every parameter each step;
//! they and `d` stay on the device ([`ProdigyScalars`], f64), so a step never waits for the
//! host and can be recorded in a CUDA graph.

use super::common::{check_lr, check_max_grad_norm, copies, storage_ptr, zeros_like};
use super::fused::{FusedCore, FusedStep, StepBufs};
use super::state::{copy_named, load_counted, named};
use super::{Optimizer, OptimizerState};
use crate::autograd::Gradients;
use crate::backend::DeviceBackend;
use crate::tensor::Tensor;
use gpu_core::nn::optim::ProdigyBuffers;
use gpu_core::nn::optim::{ProdigyConfig, ProdigyScalars, PRODIGY_SCHEDULE_LEN};
use gpu_core::{GpuError, Result};

/// Prodigy's hyper-parameters (the package's defaults). The step's `lr` multiplies `d`
/// (1.0 by default, the package's `lr`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProdigyParams {
    /// First-moment decay, in `[0, 1)`.
    pub beta1: f32,
    /// Second-moment decay, in `[0, 1)`.
    pub beta2: f32,
    /// Decay of `s` and of the numerator, in `[0, 1]`; `None`: `sqrt(beta2)`.
    pub beta3: Option<f32>,
    /// Denominator term (times `d`), finite and `> 0`.
    pub eps: f32,
    /// Weight decay of the decayed parameters, finite and `>= 0`.
    pub weight_decay: f32,
    /// Decoupled (AdamW-style) weight decay; else added to the gradient.
    pub decouple: bool,
    /// Scale the step by Adam's bias corrections.
    pub use_bias_correction: bool,
    /// Accumulate `s` with `d` rather than `d·lr` (for warm-up schedules).
    pub safeguard_warmup: bool,
    /// Initial `d`, finite and `> 0`.
    pub d0: f32,
    /// Multiplier of the estimate, finite and `> 0`.
    pub d_coef: f32,
    /// Largest growth factor of `d` per step, `> 0` (infinity: unbounded).
    pub growth_rate: f32,
    /// Clip the global gradient norm to this value first, when set.
    pub max_grad_norm: Option<f32>,
}

impl Default for ProdigyParams {
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            beta3: None,
            eps: 1e-8,
            weight_decay: 0.0,
            decouple: true,
            use_bias_correction: false,
            safeguard_warmup: false,
            d0: 1e-6,
            d_coef: 1.0,
            growth_rate: f32::INFINITY,
            max_grad_norm: None,
        }
    }
}

impl ProdigyParams {
    /// The op's configuration (`beta3 = sqrt(beta2)` computed in f64 when unset).
    pub fn config(&self) -> ProdigyConfig {
        ProdigyConfig {
            beta1: self.beta1,
            beta2: self.beta2,
            beta3: self
                .beta3
                .unwrap_or_else(|| (self.beta2 as f64).sqrt() as f32),
            eps: self.eps,
            d0: self.d0,
            d_coef: self.d_coef,
            growth_rate: self.growth_rate,
            decouple: self.decouple,
            use_bias_correction: self.use_bias_correction,
            safeguard_warmup: self.safeguard_warmup,
        }
    }

    /// Checks the values documented on each field.
    pub fn validate(&self) -> Result<()> {
        const OP: &str = "Prodigy";
        self.config().validate(OP)?;
        gpu_core::ops::require_nonneg(OP, "weight_decay", self.weight_decay)?;
        check_max_grad_norm(OP, self.max_grad_norm)
    }
}

/// Prodigy over a list of parameters (see the module doc). `p0` is a copy of the parameters
/// when the optimiser is built (the package takes it at the first step: build it right before
/// training, after any checkpoint load).
pub struct Prodigy {
    core: FusedCore,
    p0: Vec<Tensor>,
    s: Vec<Tensor>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    /// [`ProdigyScalars`] as 16 f32 words (f64 bit patterns) on the parameters' device.
    scalars: Tensor,
    hp: ProdigyParams,
    step: u32,
}

impl Prodigy {
    /// `params` with whether each is weight-decayed. Errors as [`super::AdamW::new`] does.
    pub fn new(params: Vec<(Tensor, bool)>, hp: ProdigyParams) -> Result<Self> {
        hp.validate()?;
        let core = FusedCore::new("Prodigy", params, hp.weight_decay)?;
        let params = &core.params;
        let dev = params.first().map_or(gpu_core::Device::Cpu, |p| p.device());
        let words = ProdigyScalars::initial(hp.d0).to_words();
        Ok(Prodigy {
            p0: copies(params)?,
            s: zeros_like(params)?,
            m: zeros_like(params)?,
            v: zeros_like(params)?,
            scalars: Tensor::from_vec(words, &[2 * ProdigyScalars::COUNT], dev)?,
            core,
            hp,
            step: 0,
        })
    }

    /// The device scalars (`d`, `d_max`, ...), read back (a device-to-host copy).
    pub fn scalars(&self) -> Result<ProdigyScalars> {
        ProdigyScalars::from_words(&self.scalars.to_vec()?)
    }

    /// The current step-size estimate `d` (a device-to-host copy).
    pub fn d(&self) -> Result<f64> {
        Ok(self.scalars()?.d)
    }

    /// The per-parameter state lists with their name prefixes in the state.
    fn state_lists(&self) -> [(&'static str, &[Tensor]); 4] {
        [
            ("p0", &self.p0),
            ("s", &self.s),
            ("m", &self.m),
            ("v", &self.v),
        ]
    }

    fn next_step(&self, op: &'static str) -> Result<u32> {
        self.step
            .checked_add(1)
            .ok_or_else(|| GpuError::invalid(op, "the step counter would overflow u32"))
    }

    /// Checks everything, then queues the clipping and the three passes of the step with
    /// `lr` (`host`) or the device schedule.
    fn queue(
        &mut self,
        op: &'static str,
        grads: &Gradients,
        host: &[f32],
        schedule: Option<&Tensor>,
    ) -> Result<()> {
        let step = ProdigyStep {
            cfg: self.hp.config(),
            scalars: &self.scalars,
        };
        let lists = ([&self.s[..], &self.m, &self.v], [&self.p0[..]]);
        let sched = schedule.map(|s| (s, PRODIGY_SCHEDULE_LEN));
        let max = self.hp.max_grad_norm;
        self.core.queue(op, lists, grads, (host, sched), max, &step)
    }
}

/// Prodigy's op over the step's buffers: `[s, m, v]` written, `[p0]` read, and the device
/// scalars, locked here.
struct ProdigyStep<'a> {
    cfg: ProdigyConfig,
    scalars: &'a Tensor,
}

impl FusedStep<3, 1> for ProdigyStep<'_> {
    fn launch<B: DeviceBackend>(&self, be: &B, b: StepBufs<'_, B, 3, 1>) -> Result<()> {
        let (mut params, [mut s, mut m, mut v], [p0]) = (b.params, b.written, b.read);
        let mut sc = self.scalars.write();
        be.prodigy_step(
            ProdigyBuffers {
                params: &mut params,
                grads: &b.grads,
                p0: &p0,
                s: &mut s,
                m: &mut m,
                v: &mut v,
                weight_decay: b.decays,
                grad_scale: b.clip,
            },
            self.cfg,
            b.scalars,
            B::get_mut(&mut sc)?,
        )
    }
}

const NAME: &str = "prodigy";

impl Optimizer for Prodigy {
    fn name(&self) -> &'static str {
        NAME
    }

    fn step(&mut self, grads: &Gradients, lr: f32) -> Result<()> {
        const OP: &str = "Prodigy::step";
        check_lr(OP, lr)?;
        let step = self.next_step(OP)?;
        self.queue(OP, grads, &[lr], None)?;
        self.step = step;
        Ok(())
    }

    fn schedule_len(&self) -> usize {
        PRODIGY_SCHEDULE_LEN
    }

    /// `[lr]`: everything else lives on the device.
    fn next_schedule(&self, lr: f32) -> Result<Vec<f32>> {
        const OP: &str = "Prodigy::next_schedule";
        check_lr(OP, lr)?;
        self.next_step(OP)?;
        Ok(vec![lr])
    }

    fn step_scheduled(&mut self, grads: &Gradients, schedule: &Tensor) -> Result<()> {
        const OP: &str = "Prodigy::step_scheduled";
        self.next_step(OP)?;
        self.queue(OP, grads, &[], Some(schedule))
    }

    fn count_replayed_step(&mut self, _lr: f32) -> Result<()> {
        self.step = self.next_step("Prodigy::count_replayed_step")?;
        Ok(())
    }

    /// Step calls (eager or counted replays); the bias correction counts only steps that
    /// updated the parameters (the scalars' `k`).
    fn steps(&self) -> u32 {
        self.step
    }

    fn last_grad_norm(&self) -> Result<Option<f32>> {
        self.core.last_grad_norm()
    }

    /// Tensors `p0.i`, `s.i`, `m.i`, `v.i`, `scalars` (the device f64 scalars as 16 f32
    /// words); scalar `step`.
    fn state(&self) -> Result<OptimizerState> {
        let mut tensors = copy_named(&named(&self.state_lists()))?;
        tensors.push(("scalars".into(), self.scalars.deep_copy()?));
        Ok(OptimizerState {
            optimizer: NAME.into(),
            tensors,
            scalars: vec![("step".into(), self.step as f64)],
        })
    }

    fn load_state(&mut self, state: &OptimizerState) -> Result<()> {
        const OP: &str = "Prodigy::load_state";
        let mut mine = named(&self.state_lists());
        mine.push(("scalars".into(), &self.scalars));
        self.step = load_counted(OP, NAME, &mine, state)?;
        self.core.last_clip = None;
        Ok(())
    }

    fn state_id(&self) -> usize {
        storage_ptr(&self.scalars)
    }
}
