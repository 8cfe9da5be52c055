//! Optimiser steps over many parameters at once.

use crate::backend::BufferInfo;
use crate::error::{GpuError, Result};
use crate::nn::defaults::{self, host as H};
use crate::nn::primitives::Primitives;
use crate::ops::require_f32;

pub use super::optim_adaptive::{
    ProdigyBuffers, ProdigyConfig, ProdigyScalars, ScheduleFreeBuffers, ScheduleFreeConfig,
    StepScalars, PRODIGY_SCHEDULE_LEN, SF_SCHEDULE_LEN,
};

/// AdamW hyper-parameters for one step (PyTorch's `torch.optim.AdamW` semantics: decoupled
/// weight decay `p -= lr·wd·p`, bias-corrected moments).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    /// Learning rate, finite and `>= 0`.
    pub lr: f32,
    /// First-moment decay, in `[0, 1)`.
    pub beta1: f32,
    /// Second-moment decay, in `[0, 1)`.
    pub beta2: f32,
    /// Denominator term, finite and `>= 0`.
    pub eps: f32,
    /// 1-based step number, for the bias corrections.
    pub step: u32,
}

/// Multi-tensor optimiser operations.
pub trait OptimOps: Primitives {
    /// Global-norm clipping coefficient, computed on the device: writes
    /// `out[0] = sqrt(Σ over all grads of g²)` and `out[1] = min(1, max_norm / (out[0] + 1e-6))`.
    /// `out` holds 2 f32. No host transfer on CUDA. The sum of squares is accumulated in f64
    /// and the coefficient computed in f64 from it; a non-finite norm gives a NaN (norm NaN) or
    /// 0 (norm inf) coefficient, as PyTorch's clamp does. `max_norm` must be finite and `> 0`.
    fn clip_coefficient(
        &self,
        grads: &[&Self::Buffer],
        max_norm: f32,
        out: &mut Self::Buffer,
    ) -> Result<()> {
        let h = H::downs(self, grads)?;
        let mut o = H::down(self, out)?;
        let refs: Vec<_> = h.iter().collect();
        crate::CpuBackend.clip_coefficient(&refs, max_norm, &mut o)?;
        H::up(self, &o, out)
    }

    /// One fused AdamW step over every parameter: with `g = grads[i] · grad_scale[1]` when
    /// `grad_scale` is given (the [`OptimOps::clip_coefficient`] output; else `g = grads[i]`):
    /// `m = β1·m + (1−β1)·g`, `v = β2·v + (1−β2)·g²`, `p -= lr·wd[i]·p`,
    /// `p -= lr · (m/(1−β1^step)) / (sqrt(v/(1−β2^step)) + eps)`. One kernel launch on CUDA.
    ///
    /// As in `torch.optim.AdamW`: the decay is `p *= 1 − lr·wd[i]` before the Adam update, and
    /// the update is `p −= (lr/bc1) · m / (sqrt(v)/sqrt(bc2) + eps)` with `bc = 1 − β^step`.
    /// All lists have one entry per parameter and each `grads[i]`, `m[i]`, `v[i]` has the length
    /// of `params[i]` ([`AdamWBuffers`]); see [`check_adamw`] for the accepted values.
    fn adamw_step(&self, bufs: AdamWBuffers<'_, '_, Self::Buffer>, cfg: AdamWConfig) -> Result<()> {
        defaults::optim::adamw(self, bufs, cfg)
    }

    /// [`OptimOps::adamw_step`] with the step's learning rate and bias corrections read when
    /// the op runs from `schedule` = `[lr, step_size, bc2_sqrt]` (3 f32, [`adamw_schedule`]);
    /// `cfg.lr` and `cfg.step` are only validated. On CUDA the kernel reads it on the device,
    /// so a graph that records this call runs a new step on each replay from the values
    /// written before it; with the schedule of `cfg` it gives `adamw_step(…, cfg)`'s bits there.
    /// The default reads the schedule on the host and runs the composed AdamW with its
    /// scalars (the CPU's too: within a few ulps of `adamw_step` per value).
    fn adamw_step_scheduled(
        &self,
        bufs: AdamWBuffers<'_, '_, Self::Buffer>,
        cfg: AdamWConfig,
        schedule: &Self::Buffer,
    ) -> Result<()> {
        let s = read_schedule(self, schedule)?;
        defaults::optim::adamw_with(self, bufs, cfg, s)
    }

    /// One fused Schedule-Free AdamW step (`schedulefree.AdamWScheduleFree.step`) over every
    /// parameter `y = params[i]`, with `[lr, ckp1, y_lr, bc2] = scalars` and
    /// `g = grads[i] · grad_scale[1]` (or `grads[i]`): `v = β2·v + (1−β2)·g²`,
    /// `u = g / (sqrt(v/bc2) + eps) + wd[i]·y`, `y = lerp(y, z, ckp1) + y_lr·u`, `z −= lr·u`
    /// (`lerp` as `torch.lerp`). `z` and `v` have one buffer per parameter of its length.
    /// On CUDA one kernel launch (per 64 tensors), reading `scalars` on the device when
    /// [`StepScalars::Device`]; the CPU reads a device schedule from its buffer.
    fn schedule_free_step(
        &self,
        bufs: ScheduleFreeBuffers<'_, '_, Self::Buffer>,
        cfg: ScheduleFreeConfig,
        scalars: StepScalars<'_, Self::Buffer>,
    ) -> Result<()> {
        let mut host = H::downs_lists(self, [&*bufs.params, &*bufs.z, &*bufs.v])?;
        let hg = H::downs(self, bufs.grads)?;
        let hs = H::down_opt(self, bufs.grad_scale)?;
        let mut held = None;
        let sc = H::scalars(self, scalars, &mut held)?;
        let g: Vec<_> = hg.iter().collect();
        let [mut hp, mut hz, mut hv] = host.each_mut().map(|h| H::refs_mut(h));
        let on_host = ScheduleFreeBuffers {
            params: &mut hp,
            grads: &g,
            z: &mut hz,
            v: &mut hv,
            weight_decay: bufs.weight_decay,
            grad_scale: hs.as_ref(),
        };
        crate::CpuBackend.schedule_free_step(on_host, cfg, sc)?;
        H::ups_lists(self, &host, [bufs.params, bufs.z, bufs.v])
    }

    /// `params[i] = lerp(params[i], ends[i], weight)` per element (`torch.lerp`): Schedule-Free
    /// AdamW's switch between the point `y` where gradients are taken and the average `x`
    /// where the model is evaluated. `weight` finite.
    fn lerp_params(
        &self,
        params: &mut [&mut Self::Buffer],
        ends: &[&Self::Buffer],
        weight: f32,
    ) -> Result<()> {
        defaults::optim::lerp(self, params, ends, weight)
    }

    /// One Prodigy step (`prodigyopt.Prodigy.step`, `slice_p = 1`) over every parameter, with
    /// its f64 scalars read and updated in `scalars` (an f32 buffer of
    /// `2 · ProdigyScalars::COUNT` words, [`ProdigyScalars`]) and the learning rate from `lr`
    /// (one value). With `g = grads[i] · grad_scale[1]` (or `grads[i]`), plus `wd[i]·p` when
    /// `!cfg.decouple`, and `dlr = d·lr·bc`: when `lr > 0`, `m = β1·m + d(1−β1)·g`,
    /// `v = β2·v + d²(1−β2)·g²`, `s = β3·s + (d/d0)·dlr·g` (`·d` with `safeguard_warmup`);
    /// then, unless `Σ|s| = 0` (the package returns early), `d` is updated from
    /// `d_hat = d_coef·(β3·num + (d/d0)·dlr·Σ⟨g, p0 − p⟩)/Σ|s|` and
    /// `p −= wd[i]·dlr·p` (decoupled), `p −= dlr·m/(sqrt(v) + d·eps)` with the new `d`
    /// (with `β1 = 0`: `p −= dlr·d·g/(sqrt(v) + d·eps)`). The sums are accumulated in f64 on
    /// the device; no host transfer on CUDA, so the step can be captured in a CUDA graph.
    fn prodigy_step(
        &self,
        bufs: ProdigyBuffers<'_, '_, Self::Buffer>,
        cfg: ProdigyConfig,
        lr: StepScalars<'_, Self::Buffer>,
        scalars: &mut Self::Buffer,
    ) -> Result<()> {
        let lists = [&*bufs.params, &*bufs.s, &*bufs.m, &*bufs.v];
        let mut host = H::downs_lists(self, lists)?;
        let (hg, h0) = (H::downs(self, bufs.grads)?, H::downs(self, bufs.p0)?);
        let (gs, mut sc) = (H::down_opt(self, bufs.grad_scale)?, H::down(self, scalars)?);
        let mut held = None;
        let lr = H::scalars(self, lr, &mut held)?;
        let (g, p0h): (Vec<_>, Vec<_>) = (hg.iter().collect(), h0.iter().collect());
        let [mut hp, mut hs, mut hm, mut hv] = host.each_mut().map(|h| H::refs_mut(h));
        let on_host = ProdigyBuffers {
            params: &mut hp,
            grads: &g,
            p0: &p0h,
            s: &mut hs,
            m: &mut hm,
            v: &mut hv,
            weight_decay: bufs.weight_decay,
            grad_scale: gs.as_ref(),
        };
        crate::CpuBackend.prodigy_step(on_host, cfg, lr, &mut sc)?;
        H::ups_lists(self, &host, [bufs.params, bufs.s, bufs.m, bufs.v])?;
        H::up(self, &sc, scalars)
    }
}

/// Checks the arguments of [`OptimOps::clip_coefficient`] (every backend calls this).
pub fn check_clip<B: BufferInfo>(grads: &[&B], max_norm: f32, out: &B) -> Result<()> {
    const OP: &str = "clip_coefficient";
    for g in grads {
        require_f32(OP, g.dtype())?;
    }
    require_f32(OP, out.dtype())?;
    if out.len() != 2 {
        return Err(GpuError::shape(OP, "out of 2 elements", out.len()));
    }
    if !(max_norm.is_finite() && max_norm > 0.0) {
        return Err(GpuError::invalid(
            OP,
            format!("max_norm must be finite and > 0, got {max_norm}"),
        ));
    }
    Ok(())
}

/// An invalid-argument error unless parameter `i`'s weight decay `wd` is finite and `>= 0`.
pub(crate) fn check_weight_decay(op: &'static str, i: usize, wd: f32) -> Result<()> {
    crate::ops::require_nonneg(op, format_args!("weight_decay[{i}]"), wd)
}

/// Errors unless the clip coefficient's buffer, when given, is f32 `[norm, coef]`.
pub(crate) fn check_grad_scale<B: BufferInfo>(op: &'static str, s: Option<&B>) -> Result<()> {
    if let Some(s) = s {
        require_f32(op, s.dtype())?;
        if s.len() != 2 {
            return Err(GpuError::shape(op, "grad_scale of 2 elements", s.len()));
        }
    }
    Ok(())
}

/// Checks the arguments of [`OptimOps::adamw_step`] (every backend calls this): lists of equal
/// length, f32 buffers, `grads[i]`, `m[i]`, `v[i]` as long as `params[i]`, `weight_decay[i]`
/// finite and `>= 0`, `grad_scale` of 2 f32, `lr` and `eps` finite and `>= 0`, betas in
/// `[0, 1)`, `step >= 1`.
pub fn check_adamw<B: BufferInfo>(
    params: &[&mut B],
    grads: &[&B],
    m: &[&mut B],
    v: &[&mut B],
    weight_decay: &[f32],
    grad_scale: Option<&B>,
    cfg: AdamWConfig,
) -> Result<()> {
    const OP: &str = "adamw_step";
    let n = params.len();
    for (name, len) in [
        ("grads", grads.len()),
        ("m", m.len()),
        ("v", v.len()),
        ("weight_decay", weight_decay.len()),
    ] {
        if len != n {
            return Err(GpuError::shape(
                OP,
                format!("{name} with {n} entries (one per parameter)"),
                len,
            ));
        }
    }
    for i in 0..n {
        let want = params[i].len();
        require_f32(OP, params[i].dtype())?;
        for (name, b) in [("grads", grads[i]), ("m", &*m[i]), ("v", &*v[i])] {
            crate::ops::require_f32_entry(OP, (name, i), b, want)?;
        }
        check_weight_decay(OP, i, weight_decay[i])?;
    }
    check_grad_scale(OP, grad_scale)?;
    let AdamWConfig {
        lr,
        beta1,
        beta2,
        eps,
        step,
    } = cfg;
    let ok = lr.is_finite()
        && lr >= 0.0
        && eps.is_finite()
        && eps >= 0.0
        && (0.0..1.0).contains(&beta1)
        && (0.0..1.0).contains(&beta2)
        && step >= 1;
    if !ok {
        return Err(GpuError::invalid(
            OP,
            format!(
                "invalid hyper-parameters {cfg:?}: need lr, eps >= 0, betas in [0, 1), step >= 1"
            ),
        ));
    }
    Ok(())
}

/// The buffers of an AdamW step ([`OptimOps::adamw_step`], [`OptimOps::adamw_step_scheduled`]):
/// one entry per parameter in each list.
pub struct AdamWBuffers<'s, 'b, Buf> {
    /// The parameters, updated in place.
    pub params: &'s mut [&'b mut Buf],
    /// The gradients, one per parameter.
    pub grads: &'s [&'b Buf],
    /// The first moments, updated in place.
    pub m: &'s mut [&'b mut Buf],
    /// The second moments, updated in place.
    pub v: &'s mut [&'b mut Buf],
    /// Each parameter's weight decay.
    pub weight_decay: &'s [f32],
    /// The clip coefficient's buffer (`[norm, coef]`), if the gradients are scaled.
    pub grad_scale: Option<&'b Buf>,
}

impl<B: BufferInfo> AdamWBuffers<'_, '_, B> {
    /// [`check_adamw`] of these buffers with `cfg`.
    pub fn check(&self, cfg: AdamWConfig) -> Result<()> {
        let (p, m, v) = (&*self.params, &*self.m, &*self.v);
        check_adamw(p, self.grads, m, v, self.weight_decay, self.grad_scale, cfg)
    }

    /// The buffers of parameter `i` in the kernels' order: `[p, g, m, v]`.
    pub fn row(&self, i: usize) -> [&B; 4] {
        [&*self.params[i], self.grads[i], &*self.m[i], &*self.v[i]]
    }
}

/// Checks a device schedule (3 f32: [`adamw_schedule`]) and reads it on the host.
pub fn read_schedule<B: crate::backend::Backend + ?Sized>(
    b: &B,
    schedule: &B::Buffer,
) -> Result<[f32; 3]> {
    if schedule.dtype() != crate::dtype::DType::F32 || schedule.len() != 3 {
        return Err(GpuError::shape(
            "adamw_step_scheduled",
            "a schedule of 3 f32 ([lr, step_size, bc2_sqrt])",
            format!("{} {}", schedule.len(), schedule.dtype()),
        ));
    }
    let s = b.download::<f32>(schedule)?;
    Ok([s[0], s[1], s[2]])
}

/// The per-step scalars of the update, computed in f64 as PyTorch does with Python floats:
/// `(step_size, bc2_sqrt)` = `(lr / (1 − β1^step), sqrt(1 − β2^step))`.
/// The device-side scalars of one AdamW step, for a step replayed from a CUDA graph (whose kernel
/// arguments are frozen): `[lr, step_size, bc2_sqrt]` from [`adamw_scalars`], rounded to f32
/// exactly as the eager launch rounds its arguments, so both give the same bits.
pub fn adamw_schedule(cfg: AdamWConfig) -> [f32; 3] {
    let (step_size, bc2_sqrt) = adamw_scalars(cfg);
    [cfg.lr, step_size as f32, bc2_sqrt as f32]
}

pub fn adamw_scalars(cfg: AdamWConfig) -> (f64, f64) {
    let step = cfg.step as f64;
    let bc1 = 1.0 - (cfg.beta1 as f64).powf(step);
    let bc2 = 1.0 - (cfg.beta2 as f64).powf(step);
    (cfg.lr as f64 / bc1, bc2.sqrt())
}
