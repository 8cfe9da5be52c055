//! Schedule-Free AdamW and Prodigy: their per-step configurations, the layout of Prodigy's
//! device scalars, and the argument checks every backend runs (the ops themselves are methods
//! of [`crate::nn::OptimOps`]).
//!
//! - Schedule-Free AdamW follows `schedulefree.AdamWScheduleFree.step` (Defazio et al. 2024):
//!   the host computes the step's scalars `[lr, ckp1, y_lr, bc2]` (warm-up, the weighting
//!   `ckp1`, `y_lr = lr·(β1·(1−ckp1) − 1)`, the second moment's bias correction), and the op
//!   updates `v`, `y` (the parameters) and `z` per element.
//! - Prodigy follows `prodigyopt.Prodigy.step` (Mishchenko & Defazio 2023): its adaptive `d`
//!   needs two sums over every parameter, so its scalars (`d`, `d_max`, the running numerator,
//!   the step count of the bias correction) live in a device buffer of f64
//!   ([`ProdigyScalars`]) that the op reads and updates on the device: no host read in a step.

use crate::backend::BufferInfo;
use crate::error::{GpuError, Result};
use crate::ops::require_f32;
use crate::DType;

/// Where a step's scalars come from: passed with the launch, or read on the device when the
/// step runs (from an f32 buffer of the same values, written before each replay of a CUDA
/// graph that recorded the step, whose launch arguments are frozen). The same values give
/// the same bits either way.
#[derive(Debug, Clone, Copy)]
pub enum StepScalars<'a, B> {
    /// The values themselves.
    Host(&'a [f32]),
    /// An f32 buffer holding them.
    Device(&'a B),
}

impl<B: BufferInfo> StepScalars<'_, B> {
    /// Checks that the scalars are `len` f32 values.
    pub fn check(&self, op: &'static str, len: usize) -> Result<()> {
        let (got, dtype) = match self {
            StepScalars::Host(v) => (v.len(), DType::F32),
            StepScalars::Device(b) => (b.len(), b.dtype()),
        };
        if got != len || dtype != DType::F32 {
            return Err(GpuError::shape(
                op,
                format!("a schedule of {len} f32"),
                format!("{got} {dtype}"),
            ));
        }
        Ok(())
    }
}

/// Schedule-Free AdamW's fixed hyper-parameters for the op (the per-step scalars come as a
/// [`StepScalars`] of [`SF_SCHEDULE_LEN`] values `[lr, ckp1, y_lr, bc2]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScheduleFreeConfig {
    /// Second-moment decay, in `[0, 1)`.
    pub beta2: f32,
    /// Denominator term, finite and `>= 0`.
    pub eps: f32,
}

/// Length of Schedule-Free AdamW's schedule `[lr, ckp1, y_lr, bc2]`.
pub const SF_SCHEDULE_LEN: usize = 4;

/// Prodigy's hyper-parameters (`prodigyopt.Prodigy`'s, with `slice_p = 1` and no FSDP).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProdigyConfig {
    /// First-moment decay, in `[0, 1)` (0: no first moment, the update uses the gradient).
    pub beta1: f32,
    /// Second-moment decay, in `[0, 1)`.
    pub beta2: f32,
    /// Decay of `s` and of the numerator, in `[0, 1]` (`sqrt(beta2)` by default).
    pub beta3: f32,
    /// Denominator term, finite and `> 0` (multiplied by `d`).
    pub eps: f32,
    /// Initial `d`, finite and `> 0`.
    pub d0: f32,
    /// Multiplier of the estimate `d_hat`, finite and `> 0`.
    pub d_coef: f32,
    /// Largest factor by which `d` may grow in a step, `> 0` (infinity: unbounded).
    pub growth_rate: f32,
    /// Decoupled (AdamW-style, `p −= wd·dlr·p`) weight decay; else `g += wd·p`.
    pub decouple: bool,
    /// Scale `dlr` by `sqrt(1 − β2^k)/(1 − β1^k)`.
    pub use_bias_correction: bool,
    /// `s` accumulates with `d` in place of `dlr` (for warm-up schedules).
    pub safeguard_warmup: bool,
}

/// Length of Prodigy's schedule `[lr]`.
pub const PRODIGY_SCHEDULE_LEN: usize = 1;

/// The f64 slots of Prodigy's device scalars, stored as an f32 buffer of `2 · COUNT` words
/// (each f64's bits little-endian over two f32 words, which are bit patterns, not values: they
/// are only copied, never computed with, outside the ops): see [`ProdigyScalars::initial`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProdigyScalars {
    /// The step size estimate `d`.
    pub d: f64,
    /// The largest estimate so far.
    pub d_max: f64,
    /// The running numerator `Σ β3^… (d/d0)·dlr·⟨g, p0 − p⟩`.
    pub d_numerator: f64,
    /// Steps applied (the package's `k`, for the bias correction).
    pub k: f64,
    /// The last estimate `d_hat`.
    pub d_hat: f64,
    /// The last denominator `Σ |s|`.
    pub d_denom: f64,
    /// `d·lr·bias_correction` of the step in progress (between the op's passes).
    pub dlr: f64,
    /// 1 when the step in progress updates the parameters (its `Σ|s|` was not 0), else 0.
    pub apply: f64,
}

impl ProdigyScalars {
    /// Number of f64 slots.
    pub const COUNT: usize = 8;

    /// The state before the first step: `d = d_max = d0`, everything else 0.
    pub fn initial(d0: f32) -> Self {
        let d0 = d0 as f64;
        ProdigyScalars {
            d: d0,
            d_max: d0,
            d_numerator: 0.0,
            k: 0.0,
            d_hat: 0.0,
            d_denom: 0.0,
            dlr: 0.0,
            apply: 0.0,
        }
    }

    /// The slots in buffer order.
    pub fn to_array(&self) -> [f64; Self::COUNT] {
        [
            self.d,
            self.d_max,
            self.d_numerator,
            self.k,
            self.d_hat,
            self.d_denom,
            self.dlr,
            self.apply,
        ]
    }

    /// From slots in buffer order.
    pub fn from_array(a: [f64; Self::COUNT]) -> Self {
        let [d, d_max, d_numerator, k, d_hat, d_denom, dlr, apply] = a;
        ProdigyScalars {
            d,
            d_max,
            d_numerator,
            k,
            d_hat,
            d_denom,
            dlr,
            apply,
        }
    }

    /// The words of the buffer (each f64 as its low then high 32 bits, as f32 bit patterns).
    pub fn to_words(&self) -> Vec<f32> {
        self.to_array()
            .iter()
            .flat_map(|x| {
                let b = x.to_bits();
                [f32::from_bits(b as u32), f32::from_bits((b >> 32) as u32)]
            })
            .collect()
    }

    /// From the buffer's words; a typed error unless there are `2 · COUNT`.
    pub fn from_words(w: &[f32]) -> Result<Self> {
        if w.len() != 2 * Self::COUNT {
            return Err(GpuError::shape(
                "ProdigyScalars",
                format!("{} u32 words", 2 * Self::COUNT),
                w.len(),
            ));
        }
        let mut a = [0.0; Self::COUNT];
        for (i, x) in a.iter_mut().enumerate() {
            *x = f64::from_bits(w[2 * i].to_bits() as u64 | (w[2 * i + 1].to_bits() as u64) << 32);
        }
        Ok(Self::from_array(a))
    }
}

fn bad(op: &'static str, what: &str, v: f32, want: &str) -> GpuError {
    GpuError::invalid(op, format!("{what} must be {want}, got {v}"))
}

impl ProdigyConfig {
    /// The package's defaults (`beta3 = sqrt(beta2)` rounded to f32, decoupled weight decay,
    /// no bias correction, no safeguard warm-up).
    pub const DEFAULT: ProdigyConfig = ProdigyConfig {
        beta1: 0.9,
        beta2: 0.999,
        beta3: 0.999_499_9,
        eps: 1e-8,
        d0: 1e-6,
        d_coef: 1.0,
        growth_rate: f32::INFINITY,
        decouple: true,
        use_bias_correction: false,
        safeguard_warmup: false,
    };

    /// Checks the values documented on each field.
    pub fn validate(&self, op: &'static str) -> Result<()> {
        for (what, b) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return Err(bad(op, what, b, "in [0, 1)"));
            }
        }
        if !(0.0..=1.0).contains(&self.beta3) {
            return Err(bad(op, "beta3", self.beta3, "in [0, 1]"));
        }
        for (what, x) in [("eps", self.eps), ("d0", self.d0), ("d_coef", self.d_coef)] {
            if !(x.is_finite() && x > 0.0) {
                return Err(bad(op, what, x, "finite and > 0"));
            }
        }
        if self.growth_rate.is_nan() || self.growth_rate <= 0.0 {
            return Err(bad(op, "growth_rate", self.growth_rate, "> 0"));
        }
        Ok(())
    }
}

/// Checks one list of per-parameter buffers: as many as `params`, f32, each as long as its
/// parameter.
fn check_list<B: BufferInfo>(
    op: &'static str,
    name: &str,
    lens: &[usize],
    bufs: &[&B],
) -> Result<()> {
    if bufs.len() != lens.len() {
        return Err(GpuError::shape(
            op,
            format!("{name} with {} entries (one per parameter)", lens.len()),
            bufs.len(),
        ));
    }
    for (i, (b, &want)) in bufs.iter().zip(lens).enumerate() {
        crate::ops::require_f32_entry(op, (name, i), *b, want)?;
    }
    Ok(())
}

/// The buffers of a Schedule-Free step ([`OptimOps::schedule_free_step`]): one entry per
/// parameter in each list.
///
/// [`OptimOps::schedule_free_step`]: crate::nn::OptimOps::schedule_free_step
pub struct ScheduleFreeBuffers<'s, 'b, Buf> {
    /// The points `y` where the gradients are taken, updated in place.
    pub params: &'s mut [&'b mut Buf],
    /// The gradients, one per parameter.
    pub grads: &'s [&'b Buf],
    /// The base sequences `z`, updated in place.
    pub z: &'s mut [&'b mut Buf],
    /// The second moments, updated in place.
    pub v: &'s mut [&'b mut Buf],
    /// Each parameter's weight decay.
    pub weight_decay: &'s [f32],
    /// The clip coefficient's buffer (`[norm, coef]`), if the gradients are scaled.
    pub grad_scale: Option<&'b Buf>,
}

/// The buffers of a Prodigy step ([`OptimOps::prodigy_step`]): one entry per parameter in
/// each list.
///
/// [`OptimOps::prodigy_step`]: crate::nn::OptimOps::prodigy_step
pub struct ProdigyBuffers<'s, 'b, Buf> {
    /// The parameters, updated in place.
    pub params: &'s mut [&'b mut Buf],
    /// The gradients, one per parameter.
    pub grads: &'s [&'b Buf],
    /// The parameters' initial values.
    pub p0: &'s [&'b Buf],
    /// Prodigy's `s` accumulators, updated in place.
    pub s: &'s mut [&'b mut Buf],
    /// The first moments, updated in place.
    pub m: &'s mut [&'b mut Buf],
    /// The second moments, updated in place.
    pub v: &'s mut [&'b mut Buf],
    /// Each parameter's weight decay.
    pub weight_decay: &'s [f32],
    /// The clip coefficient's buffer (`[norm, coef]`), if the gradients are scaled.
    pub grad_scale: Option<&'b Buf>,
}

/// Reborrows a list of mutable buffers as shared ones (for the checks).
pub fn shared<'a, B>(xs: &'a [&mut B]) -> Vec<&'a B> {
    xs.iter().map(|x| &**x).collect()
}

impl<B: BufferInfo> ScheduleFreeBuffers<'_, '_, B> {
    /// The checks of [`crate::nn::OptimOps::schedule_free_step`] (every backend runs them):
    /// these lists ([`check_lists`]), `cfg` ([`check_schedule_free`]) and the step's
    /// [`SF_SCHEDULE_LEN`] scalars.
    pub fn check(&self, cfg: ScheduleFreeConfig, scalars: &StepScalars<'_, B>) -> Result<()> {
        const OP: &str = "schedule_free_step";
        let (z, v) = (shared(self.z), shared(self.v));
        let lists = [("grads", self.grads), ("z", &z[..]), ("v", &v[..])];
        let params = shared(self.params);
        check_lists(OP, &params, &lists, self.weight_decay, self.grad_scale)?;
        check_schedule_free(OP, cfg)?;
        scalars.check(OP, SF_SCHEDULE_LEN)
    }

    /// Every buffer, list by list (`params`, `grads`, `z`, `v`), then `grad_scale` if any:
    /// what a backend checks for ownership.
    pub fn buffers(&self) -> Vec<&B> {
        let (p, z, v) = (shared(self.params), shared(self.z), shared(self.v));
        let lists = [p, self.grads.to_vec(), z, v].concat();
        lists.into_iter().chain(self.grad_scale).collect()
    }

    /// The buffers of parameter `i` in the kernels' order: `[y, g, z, v]`.
    pub fn row(&self, i: usize) -> [&B; 4] {
        [&*self.params[i], self.grads[i], &*self.z[i], &*self.v[i]]
    }
}

impl<B: BufferInfo> ProdigyBuffers<'_, '_, B> {
    /// The checks of [`crate::nn::OptimOps::prodigy_step`] (every backend runs them): these
    /// lists ([`check_lists`]), `cfg` ([`ProdigyConfig::validate`]), the step's
    /// [`PRODIGY_SCHEDULE_LEN`] learning rate and the [`ProdigyScalars`] buffer `scalars`.
    pub fn check(&self, cfg: ProdigyConfig, lr: &StepScalars<'_, B>, scalars: &B) -> Result<()> {
        const OP: &str = "prodigy_step";
        let (s, m, v) = (shared(self.s), shared(self.m), shared(self.v));
        let lists = [
            ("grads", self.grads),
            ("p0", self.p0),
            ("s", &s[..]),
            ("m", &m[..]),
            ("v", &v[..]),
        ];
        let params = shared(self.params);
        check_lists(OP, &params, &lists, self.weight_decay, self.grad_scale)?;
        cfg.validate(OP)?;
        lr.check(OP, PRODIGY_SCHEDULE_LEN)?;
        check_prodigy_scalars(OP, scalars)
    }

    /// Every buffer, list by list (`params`, `grads`, `p0`, `s`, `m`, `v`), then `grad_scale`
    /// if any: what a backend checks for ownership.
    pub fn buffers(&self) -> Vec<&B> {
        let (p, s) = (shared(self.params), shared(self.s));
        let (m, v) = (shared(self.m), shared(self.v));
        let lists = [p, self.grads.to_vec(), self.p0.to_vec(), s, m, v].concat();
        lists.into_iter().chain(self.grad_scale).collect()
    }

    /// The buffers of parameter `i` in the kernels' order: `[p, g, p0, s, m, v]`.
    pub fn row(&self, i: usize) -> [&B; 6] {
        let (s, m, v) = (&*self.s[i], &*self.m[i], &*self.v[i]);
        [&*self.params[i], self.grads[i], self.p0[i], s, m, v]
    }
}

/// Checks the parameters, the per-parameter lists (`(name, buffers)`), the weight decays
/// (finite, `>= 0`, one per parameter) and the clip output (2 f32) of a multi-tensor step.
pub fn check_lists<B: BufferInfo>(
    op: &'static str,
    params: &[&B],
    lists: &[(&str, &[&B])],
    weight_decay: &[f32],
    grad_scale: Option<&B>,
) -> Result<()> {
    let lens: Vec<usize> = params.iter().map(|p| p.len()).collect();
    for p in params {
        require_f32(op, p.dtype())?;
    }
    for (name, bufs) in lists {
        check_list(op, name, &lens, bufs)?;
    }
    if weight_decay.len() != params.len() {
        return Err(GpuError::shape(
            op,
            format!(
                "weight_decay with {} entries (one per parameter)",
                params.len()
            ),
            weight_decay.len(),
        ));
    }
    for (i, &wd) in weight_decay.iter().enumerate() {
        super::optim::check_weight_decay(op, i, wd)?;
    }
    super::optim::check_grad_scale(op, grad_scale)?;
    Ok(())
}

/// Checks a Schedule-Free AdamW configuration: `beta2` in `[0, 1)`, `eps` finite and `>= 0`.
pub fn check_schedule_free(op: &'static str, cfg: ScheduleFreeConfig) -> Result<()> {
    if !(0.0..1.0).contains(&cfg.beta2) {
        return Err(bad(op, "beta2", cfg.beta2, "in [0, 1)"));
    }
    if !(cfg.eps.is_finite() && cfg.eps >= 0.0) {
        return Err(bad(op, "eps", cfg.eps, "finite and >= 0"));
    }
    Ok(())
}

/// Checks Prodigy's device scalars: an f32 buffer of `2 · ProdigyScalars::COUNT` words.
pub fn check_prodigy_scalars<B: BufferInfo>(op: &'static str, b: &B) -> Result<()> {
    let want = 2 * ProdigyScalars::COUNT;
    if b.dtype() != DType::F32 || b.len() != want {
        return Err(GpuError::shape(
            op,
            format!("Prodigy scalars of {want} f32 words"),
            format!("{} {}", b.len(), b.dtype()),
        ));
    }
    Ok(())
}

/// Checks the weight of [`crate::nn::OptimOps::lerp_params`]: finite.
pub fn check_lerp_weight(op: &'static str, w: f32) -> Result<()> {
    if w.is_finite() {
        Ok(())
    } else {
        Err(bad(op, "weight", w, "finite"))
    }
}

/// The checks of [`crate::nn::OptimOps::lerp_params`] (every backend runs them): `ends` one
/// f32 buffer of each parameter's length ([`check_lists`]), `weight` finite.
pub fn check_lerp_params<B: BufferInfo>(params: &[&B], ends: &[&B], weight: f32) -> Result<()> {
    const OP: &str = "lerp_params";
    let wd = vec![0.0; params.len()];
    check_lists(OP, params, &[("ends", ends)], &wd, None)?;
    check_lerp_weight(OP, weight)
}

/// `torch.lerp(a, b, w)` in f64: `a + w·(b − a)` when `|w| < 0.5`, else `b − (b − a)·(1 − w)`.
#[inline]
pub fn lerp_f64(a: f64, b: f64, w: f64) -> f64 {
    if w.abs() < 0.5 {
        a + w * (b - a)
    } else {
        b - (b - a) * (1.0 - w)
    }
}
