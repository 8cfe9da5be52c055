//! Schedule-Free AdamW (Defazio et al. 2024, "The Road Less Scheduled"), as the `schedulefree`
//! package's `AdamWScheduleFree` (1.4): no learning-rate schedule is needed (a linear warm-up
//! is built in), the parameters hold the point `y` where gradients are taken, the optimiser
//! keeps the base sequence `z` and the second moment, and the evaluation point `x` (an average
//! weighted by `ckp1`) is swapped in by [`Optimizer::eval_params`].

use super::common::{
    bufs, bufs_mut, check_lr, check_max_grad_norm, copies, read_all, storage_ptr, write_all,
    zeros_like,
};
use super::fused::{FusedCore, FusedStep, StepBufs};
use super::state::{assign_all, checked_state, copy_named, count_scalar, named};
use super::{Optimizer, OptimizerState};
use crate::autograd::Gradients;
use crate::backend::{on_device, DeviceBackend};
use crate::storage::Storage;
use crate::tensor::Tensor;
use gpu_core::nn::optim::ScheduleFreeBuffers;
use gpu_core::nn::optim::{ScheduleFreeConfig, SF_SCHEDULE_LEN};
use gpu_core::{GpuError, Result};

/// Schedule-Free AdamW's hyper-parameters (the package's defaults; the learning rate comes
/// with each step, the package's default is 0.0025).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScheduleFreeParams {
    /// Interpolation between `z` and `x` for `y`, and the moment of the average: in `(0, 1)`.
    pub beta1: f32,
    /// Second-moment decay, in `[0, 1)`.
    pub beta2: f32,
    /// Denominator term, finite and `>= 0`.
    pub eps: f32,
    /// Weight decay (evaluated at `y`, as the package does) of the decayed parameters.
    pub weight_decay: f32,
    /// Linear warm-up of the learning rate over this many steps (0: none).
    pub warmup_steps: u32,
    /// Polynomial weighting power of the average (finite).
    pub r: f32,
    /// The average's weights are `lr_max^weight_lr_power` (finite, `>= 0`).
    pub weight_lr_power: f32,
    /// Clip the global gradient norm to this value first, when set.
    pub max_grad_norm: Option<f32>,
}

impl Default for ScheduleFreeParams {
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            warmup_steps: 0,
            r: 0.0,
            weight_lr_power: 2.0,
            max_grad_norm: None,
        }
    }
}

impl ScheduleFreeParams {
    /// Checks the values documented on each field.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str, v: f32, want: &str| {
            Err(GpuError::invalid(
                "ScheduleFreeAdamW",
                format!("{what} must be {want}, got {v}"),
            ))
        };
        if !(self.beta1 > 0.0 && self.beta1 < 1.0) {
            return bad("beta1", self.beta1, "in (0, 1)");
        }
        if !(0.0..1.0).contains(&self.beta2) {
            return bad("beta2", self.beta2, "in [0, 1)");
        }
        for (what, x) in [
            ("eps", self.eps),
            ("weight_decay", self.weight_decay),
            ("weight_lr_power", self.weight_lr_power),
        ] {
            if !(x.is_finite() && x >= 0.0) {
                return bad(what, x, "finite and >= 0");
            }
        }
        if !self.r.is_finite() {
            return bad("r", self.r, "finite");
        }
        check_max_grad_norm("ScheduleFreeAdamW", self.max_grad_norm)
    }
}

/// Schedule-Free AdamW over a list of parameters (see the module doc). It starts in train
/// mode (the parameters are `y`; the package needs an explicit `train()` first).
pub struct ScheduleFreeAdamW {
    core: FusedCore,
    z: Vec<Tensor>,
    v: Vec<Tensor>,
    hp: ScheduleFreeParams,
    /// Steps taken (the package's `k`).
    k: u32,
    lr_max: f64,
    weight_sum: f64,
    train_mode: bool,
}

/// The host scalars after a step, and the step's schedule `[lr, ckp1, y_lr, bc2]`.
struct Plan {
    lr_max: f64,
    weight_sum: f64,
    schedule: [f32; SF_SCHEDULE_LEN],
}

impl ScheduleFreeAdamW {
    /// `params` with whether each is weight-decayed. `z` starts as a copy of the parameters,
    /// the second moment at 0. Errors as [`super::AdamW::new`] does.
    pub fn new(params: Vec<(Tensor, bool)>, hp: ScheduleFreeParams) -> Result<Self> {
        hp.validate()?;
        let core = FusedCore::new("ScheduleFreeAdamW", params, hp.weight_decay)?;
        Ok(ScheduleFreeAdamW {
            z: copies(&core.params)?,
            v: zeros_like(&core.params)?,
            core,
            hp,
            k: 0,
            lr_max: -1.0,
            weight_sum: 0.0,
            train_mode: true,
        })
    }

    /// Whether the parameters hold `y` (train mode) rather than `x`.
    pub fn is_train_mode(&self) -> bool {
        self.train_mode
    }

    /// The step's scalars at `lr`, in f64 as the package computes them with Python floats:
    /// warm-up `sched = (k+1)/warmup_steps` while `k < warmup_steps`, `lr·sched`, `lr_max`,
    /// `weight = (k+1)^r · lr_max^weight_lr_power`, `ckp1 = weight/weight_sum` (0 when the
    /// sum is 0), `y_lr = lr·(β1·(1 − ckp1) − 1)`, `bc2 = 1 − β2^(k+1)`.
    fn plan(&self, op: &'static str, lr: f32) -> Result<Plan> {
        check_lr(op, lr)?;
        if !self.train_mode {
            return Err(GpuError::invalid(
                op,
                "the parameters hold x (eval mode): call train_params before stepping",
            ));
        }
        self.k
            .checked_add(1)
            .ok_or_else(|| GpuError::invalid(op, "the step counter would overflow u32"))?;
        let hp = &self.hp;
        let k1 = self.k as f64 + 1.0;
        let sched = if self.k < hp.warmup_steps {
            k1 / hp.warmup_steps as f64
        } else {
            1.0
        };
        let bc2 = 1.0 - (hp.beta2 as f64).powf(k1);
        let lr = lr as f64 * sched;
        let lr_max = if self.lr_max > lr { self.lr_max } else { lr };
        let weight = k1.powf(hp.r as f64) * lr_max.powf(hp.weight_lr_power as f64);
        let weight_sum = self.weight_sum + weight;
        let ckp1 = if weight_sum == 0.0 {
            0.0
        } else {
            weight / weight_sum
        };
        let y_lr = lr * (hp.beta1 as f64 * (1.0 - ckp1) - 1.0);
        Ok(Plan {
            lr_max,
            weight_sum,
            schedule: [lr as f32, ckp1 as f32, y_lr as f32, bc2 as f32],
        })
    }

    /// The state lists with their name prefixes in the state.
    fn state_lists(&self) -> [(&'static str, &[Tensor]); 2] {
        [("z", &self.z), ("v", &self.v)]
    }

    fn commit(&mut self, plan: &Plan) {
        self.k += 1;
        self.lr_max = plan.lr_max;
        self.weight_sum = plan.weight_sum;
    }

    /// Checks everything, then queues the clipping and the fused update with the schedule's
    /// values (`host`) or the device schedule.
    fn queue(
        &mut self,
        op: &'static str,
        grads: &Gradients,
        host: &[f32],
        schedule: Option<&Tensor>,
    ) -> Result<()> {
        let step = SfStep {
            cfg: ScheduleFreeConfig {
                beta2: self.hp.beta2,
                eps: self.hp.eps,
            },
        };
        let lists = ([&self.z[..], &self.v], []);
        let sched = schedule.map(|s| (s, SF_SCHEDULE_LEN));
        let max = self.hp.max_grad_norm;
        self.core.queue(op, lists, grads, (host, sched), max, &step)
    }

    /// `params = lerp(params, z, w)` on the device.
    fn swap(&mut self, w: f64) -> Result<()> {
        let Some(first) = self.core.params.first() else {
            return Ok(());
        };
        let dev = first.device();
        let mut pg = write_all(&self.core.params);
        let zg = read_all(&self.z);
        on_device!(dev, |be| lerp_impl(be, &mut pg, &zg, w as f32)?);
        Ok(())
    }
}

/// Schedule-Free AdamW's op over the step's buffers: `[z, v]` written.
struct SfStep {
    cfg: ScheduleFreeConfig,
}

impl FusedStep<2, 0> for SfStep {
    fn launch<B: DeviceBackend>(&self, be: &B, b: StepBufs<'_, B, 2, 0>) -> Result<()> {
        let (mut params, [mut z, mut v]) = (b.params, b.written);
        be.schedule_free_step(
            ScheduleFreeBuffers {
                params: &mut params,
                grads: &b.grads,
                z: &mut z,
                v: &mut v,
                weight_decay: b.decays,
                grad_scale: b.clip,
            },
            self.cfg,
            b.scalars,
        )
    }
}

fn lerp_impl<B: DeviceBackend>(
    be: &B,
    p: &mut [std::sync::RwLockWriteGuard<'_, Storage>],
    z: &[std::sync::RwLockReadGuard<'_, Storage>],
    w: f32,
) -> Result<()> {
    let mut p = bufs_mut::<B>(p)?;
    let z = bufs::<B>(z)?;
    be.lerp_params(&mut p, &z, w)
}

const NAME: &str = "schedule_free_adamw";
const SCALARS: [&str; 4] = ["k", "lr_max", "weight_sum", "train_mode"];

impl Optimizer for ScheduleFreeAdamW {
    fn name(&self) -> &'static str {
        NAME
    }

    fn step(&mut self, grads: &Gradients, lr: f32) -> Result<()> {
        let plan = self.plan("ScheduleFreeAdamW::step", lr)?;
        self.queue("ScheduleFreeAdamW::step", grads, &plan.schedule, None)?;
        self.commit(&plan);
        Ok(())
    }

    fn schedule_len(&self) -> usize {
        SF_SCHEDULE_LEN
    }

    /// `[lr, ckp1, y_lr, bc2]` of the next step (see the module doc).
    fn next_schedule(&self, lr: f32) -> Result<Vec<f32>> {
        Ok(self
            .plan("ScheduleFreeAdamW::next_schedule", lr)?
            .schedule
            .to_vec())
    }

    fn step_scheduled(&mut self, grads: &Gradients, schedule: &Tensor) -> Result<()> {
        const OP: &str = "ScheduleFreeAdamW::step_scheduled";
        self.plan(OP, 0.0)?; // train mode, counter room
        self.queue(OP, grads, &[], Some(schedule))
    }

    fn count_replayed_step(&mut self, lr: f32) -> Result<()> {
        let plan = self.plan("ScheduleFreeAdamW::count_replayed_step", lr)?;
        self.commit(&plan);
        Ok(())
    }

    fn steps(&self) -> u32 {
        self.k
    }

    fn last_grad_norm(&self) -> Result<Option<f32>> {
        self.core.last_grad_norm()
    }

    /// Tensors `z.i`, `v.i`; scalars `k`, `lr_max`, `weight_sum`, `train_mode` (1 or 0). Take
    /// it together with the parameters, in the same mode.
    fn state(&self) -> Result<OptimizerState> {
        let tensors = copy_named(&named(&self.state_lists()))?;
        let vals = [
            self.k as f64,
            self.lr_max,
            self.weight_sum,
            self.train_mode as u8 as f64,
        ];
        Ok(OptimizerState {
            optimizer: NAME.into(),
            tensors,
            scalars: SCALARS.iter().map(|n| n.to_string()).zip(vals).collect(),
        })
    }

    fn load_state(&mut self, state: &OptimizerState) -> Result<()> {
        const OP: &str = "ScheduleFreeAdamW::load_state";
        let mine = named(&self.state_lists());
        let (fresh, sc) = checked_state(OP, NAME, &mine, &SCALARS, state)?;
        let k = count_scalar(OP, "k", sc[0])?;
        if !(sc[1].is_finite() && sc[2].is_finite() && sc[2] >= 0.0)
            || !(sc[3] == 0.0 || sc[3] == 1.0)
        {
            return Err(GpuError::invalid(
                OP,
                format!(
                    "invalid scalars lr_max {}, weight_sum {}, train_mode {}",
                    sc[1], sc[2], sc[3]
                ),
            ));
        }
        assign_all(&mine, &fresh)?;
        (self.k, self.lr_max, self.weight_sum) = (k, sc[1], sc[2]);
        self.train_mode = sc[3] == 1.0;
        self.core.last_clip = None;
        Ok(())
    }

    /// `x = lerp(y, z, 1 − 1/β1)` in place of the parameters (`AdamWScheduleFree.eval`).
    fn eval_params(&mut self) -> Result<()> {
        if self.train_mode {
            self.swap(1.0 - 1.0 / self.hp.beta1 as f64)?;
            self.train_mode = false;
        }
        Ok(())
    }

    /// `y = lerp(x, z, 1 − β1)` in place of the parameters (`AdamWScheduleFree.train`).
    fn train_params(&mut self) -> Result<()> {
        if !self.train_mode {
            self.swap(1.0 - self.hp.beta1 as f64)?;
            self.train_mode = true;
        }
        Ok(())
    }

    fn state_id(&self) -> usize {
        self.z.first().map_or(0, storage_ptr)
    }
}

/// `targets[i] = lerp(targets[i], ends[i], weight)` per element, every tensor in one fused
/// launch on CUDA ([`gpu_core::nn::optim::OptimOps::lerp_params`], the kernel of
/// Schedule-Free AdamW's swap): a running average of weights, `w̄ ← w̄ + β·(w − w̄)`, is
/// `lerp_tensors(avg, weights, β)`.
///
/// Errors, before anything is written: lists of different lengths, tensors that are not f32,
/// of different shapes or devices, a target that shares storage with another target or with
/// an end (it would be locked twice), a `weight` that is not finite.
pub fn lerp_tensors(targets: &[Tensor], ends: &[Tensor], weight: f32) -> Result<()> {
    const OP: &str = "lerp_tensors";
    if targets.len() != ends.len() {
        return Err(GpuError::invalid(
            OP,
            format!("{} targets and {} ends", targets.len(), ends.len()),
        ));
    }
    let Some(first) = targets.first() else {
        return Ok(());
    };
    let dev = first.device();
    let mut written = std::collections::HashSet::new();
    for t in targets {
        if !written.insert(storage_ptr(t)) {
            return Err(GpuError::invalid(OP, "two targets share storage"));
        }
    }
    for (t, e) in targets.iter().zip(ends) {
        if t.shape() != e.shape()
            || t.dtype() != gpu_core::DType::F32
            || e.dtype() != gpu_core::DType::F32
            || t.device() != dev
            || e.device() != dev
        {
            return Err(GpuError::shape(
                OP,
                format!("f32 {:?} on {dev}", t.shape()),
                format!("{} {:?} on {}", e.dtype(), e.shape(), e.device()),
            ));
        }
        if written.contains(&storage_ptr(e)) {
            return Err(GpuError::invalid(OP, "an end shares storage with a target"));
        }
    }
    if !weight.is_finite() {
        return Err(GpuError::invalid(
            OP,
            format!("the weight must be finite, got {weight}"),
        ));
    }
    let mut tg = write_all(targets);
    let eg = read_all(ends);
    on_device!(dev, |be| lerp_impl(be, &mut tg, &eg, weight)?);
    Ok(())
}
