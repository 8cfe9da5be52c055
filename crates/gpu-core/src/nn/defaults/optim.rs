//! Defaults of [`OptimOps`](crate::nn::OptimOps) composed on the device: AdamW and lerp
//! (f32 broadcast ops where the CPU evaluates each element in f64 and rounds once: within a
//! few ulps of each updated value).

use super::{f32_buf, map, scalar, zip, zip_same, zip_scalar};
use crate::backend::BufferInfo;
use crate::error::Result;
use crate::nn::elementwise::{Activation, BinaryKind as K};
use crate::nn::optim::{adamw_schedule, AdamWBuffers, AdamWConfig};
use crate::nn::primitives::Primitives;
use crate::nn::BlockCopy;

/// `sqrt(v)` as `exp(ln(v)/2)` (0 stays 0).
fn sqrt<B: Primitives + ?Sized>(b: &B, v: &B::Buffer) -> Result<B::Buffer> {
    let l = map(b, Activation::Log, v)?;
    map(b, Activation::Exp, &zip_scalar(b, K::Mul, &l, 0.5)?)
}

/// `a·x + c·y` for same-length f32 buffers.
fn axpby<B: Primitives + ?Sized>(
    b: &B,
    (a, x): (f32, &B::Buffer),
    (c, y): (f32, &B::Buffer),
) -> Result<B::Buffer> {
    zip_same(
        b,
        K::Add,
        &zip_scalar(b, K::Mul, x, a)?,
        &zip_scalar(b, K::Mul, y, c)?,
    )
}

/// AdamW (see [`OptimOps::adamw_step`](crate::nn::OptimOps::adamw_step)), parameter by
/// parameter; the clip coefficient `grad_scale[1]` is picked with a block copy.
pub fn adamw<B: Primitives + ?Sized>(
    b: &B,
    bufs: AdamWBuffers<'_, '_, B::Buffer>,
    cfg: AdamWConfig,
) -> Result<()> {
    adamw_with(b, bufs, cfg, adamw_schedule(cfg))
}

/// AdamW with the scalars `[lr, step_size, bc2_sqrt]` of a schedule ([`adamw_schedule`]; `cfg`
/// only validated, its betas and eps used), parameter by parameter.
pub fn adamw_with<B: Primitives + ?Sized>(
    b: &B,
    bufs: AdamWBuffers<'_, '_, B::Buffer>,
    cfg: AdamWConfig,
    [lr, step_size, bc2_sqrt]: [f32; 3],
) -> Result<()> {
    bufs.check(cfg)?;
    let (params, grads, m, v) = (bufs.params, bufs.grads, bufs.m, bufs.v);
    let weight_decay = bufs.weight_decay;
    let coef = match bufs.grad_scale {
        Some(s) => {
            let mut c = f32_buf(b, 1)?;
            b.copy_blocks(s, &mut c, BlockCopy::run(1, 0, 1))?;
            Some(c)
        }
        None => None,
    };
    for i in 0..params.len() {
        let g = match &coef {
            Some(c) => zip(b, K::Mul, (grads[i], &[grads[i].len()]), (c, &[1]))?,
            None => zip_scalar(b, K::Mul, grads[i], 1.0)?,
        };
        let mi = axpby(b, (cfg.beta1, m[i]), (1.0 - cfg.beta1, &g))?;
        let g2 = zip_same(b, K::Mul, &g, &g)?;
        let vi = axpby(b, (cfg.beta2, v[i]), (1.0 - cfg.beta2, &g2))?;
        let denom = zip_scalar(b, K::Div, &sqrt(b, &vi)?, bc2_sqrt)?;
        let denom = zip_scalar(b, K::Add, &denom, cfg.eps)?;
        let upd = zip_scalar(b, K::Mul, &zip_same(b, K::Div, &mi, &denom)?, step_size)?;
        let decay = (1.0 - lr as f64 * weight_decay[i] as f64) as f32;
        let p = zip_same(b, K::Sub, &zip_scalar(b, K::Mul, params[i], decay)?, &upd)?;
        b.cast(&p, params[i])?;
        b.cast(&mi, m[i])?;
        b.cast(&vi, v[i])?;
    }
    Ok(())
}

/// `p = lerp(p, e, w)` as `p + w·(e − p)`.
pub fn lerp<B: Primitives + ?Sized>(
    b: &B,
    params: &mut [&mut B::Buffer],
    ends: &[&B::Buffer],
    weight: f32,
) -> Result<()> {
    crate::nn::optim_adaptive::check_lerp_weight("lerp_params", weight)?;
    if params.len() != ends.len() {
        return Err(crate::GpuError::shape(
            "lerp_params",
            params.len(),
            ends.len(),
        ));
    }
    let w = scalar(b, weight)?;
    for (p, e) in params.iter_mut().zip(ends) {
        let n = [p.len()];
        let d = zip_same(b, K::Sub, e, p)?;
        let step = zip(b, K::Mul, (&d, &n), (&w, &[1]))?;
        b.cast(&zip_same(b, K::Add, p, &step)?, p)?;
    }
    Ok(())
}
