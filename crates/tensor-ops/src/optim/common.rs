//! What the optimisers share: parameter and gradient checks, the clipping launch, schedule
//! checks, a step's checks in order ([`check_step`]), and the guards that hand a list of
//! tensors' buffers (and a step's scalars) to a backend op.

use crate::autograd::Gradients;
use crate::backend::{on_device, DeviceBackend};
use crate::storage::Storage;
use crate::tensor::{same_device, Tensor};
use gpu_core::nn::optim::StepScalars;
use gpu_core::{DType, Device, GpuError, Result};
use std::collections::{HashMap, HashSet};
use std::sync::{RwLockReadGuard, RwLockWriteGuard};

/// The address of a tensor's storage: two tensors with the same one share their elements.
pub(crate) fn storage_ptr(t: &Tensor) -> usize {
    std::sync::Arc::as_ptr(&t.0.storage) as *const () as usize
}

/// Checks a step's learning rate: finite and `>= 0`.
pub(crate) fn check_lr(op: &'static str, lr: f32) -> Result<()> {
    gpu_core::ops::require_nonneg(op, "the learning rate", lr)
}

/// Checks a clipping threshold: finite and `> 0` when set.
pub(crate) fn check_max_grad_norm(op: &'static str, max: Option<f32>) -> Result<()> {
    match max {
        Some(max) if !(max.is_finite() && max > 0.0) => Err(GpuError::invalid(
            op,
            format!("max_grad_norm must be finite and > 0, got {max}"),
        )),
        _ => Ok(()),
    }
}

/// Checks an optimiser's parameters: one device, f32 leaves with `requires_grad_`, no two
/// sharing storage (the same tensor twice, a view of another, or `p.detach().requires_grad_()`
/// beside `p`: a shared storage would be updated twice per step).
pub(crate) fn check_params(op: &'static str, params: &[(Tensor, bool)]) -> Result<()> {
    let refs: Vec<&Tensor> = params.iter().map(|(t, _)| t).collect();
    if !refs.is_empty() {
        same_device(op, &refs)?;
    }
    let mut owner = HashMap::new();
    for (i, (p, _)) in params.iter().enumerate() {
        if !p.requires_grad() || p.dtype() != DType::F32 {
            return Err(GpuError::invalid(
                op,
                "parameters must be f32 tensors with requires_grad_",
            ));
        }
        if let Some(j) = owner.insert(storage_ptr(p), i) {
            return Err(GpuError::invalid(
                op,
                format!(
                    "parameters {j} and {i} share storage (the same tensor twice, or a view \
                     or detached copy of another parameter)"
                ),
            ));
        }
    }
    Ok(())
}

/// Checks an optimiser's parameters ([`check_params`]) and splits them into the tensors and
/// each one's weight decay: `wd` where its flag is set, else 0.
pub(crate) fn checked_params(
    op: &'static str,
    params: Vec<(Tensor, bool)>,
    wd: f32,
) -> Result<(Vec<Tensor>, Vec<f32>)> {
    check_params(op, &params)?;
    Ok(params
        .into_iter()
        .map(|(t, d)| (t, if d { wd } else { 0.0 }))
        .unzip())
}

/// Fresh zero tensors shaped as the parameters.
pub(crate) fn zeros_like(params: &[Tensor]) -> Result<Vec<Tensor>> {
    params
        .iter()
        .map(|p| Tensor::zeros(p.shape(), p.device()))
        .collect()
}

/// Device copies of the parameters' values.
pub(crate) fn copies(params: &[Tensor]) -> Result<Vec<Tensor>> {
    params.iter().map(Tensor::deep_copy).collect()
}

/// The gradient of every parameter, checked: present, f32, the parameter's shape, on `dev`,
/// and sharing storage with none of `written` (the tensors the step writes).
pub(crate) fn gather_grads(
    op: &'static str,
    params: &[Tensor],
    written: &[&[Tensor]],
    grads: &Gradients,
    dev: Device,
) -> Result<Vec<Tensor>> {
    let written: HashSet<usize> = written
        .iter()
        .flat_map(|ts| ts.iter())
        .chain(params)
        .map(storage_ptr)
        .collect();
    let mut gs = Vec::with_capacity(params.len());
    for p in params {
        let g = grads.get(p).ok_or_else(|| {
            GpuError::invalid(
                op,
                format!("no gradient for a parameter of shape {:?}", p.shape()),
            )
        })?;
        if g.shape() != p.shape() || g.dtype() != DType::F32 || g.device() != dev {
            return Err(GpuError::shape(
                op,
                format!("an f32 gradient of shape {:?} on {dev}", p.shape()),
                format!("{} {:?} on {}", g.dtype(), g.shape(), g.device()),
            ));
        }
        if written.contains(&storage_ptr(g)) {
            return Err(GpuError::invalid(
                op,
                "a gradient shares storage with a parameter or an optimiser state",
            ));
        }
        gs.push(g.clone());
    }
    Ok(gs)
}

/// Checks a device schedule: f32, `len` elements, on `dev`.
pub(crate) fn check_schedule(
    op: &'static str,
    schedule: &Tensor,
    len: usize,
    dev: Device,
) -> Result<()> {
    if schedule.device() != dev || schedule.dtype() != DType::F32 || schedule.numel() != len {
        return Err(GpuError::shape(
            op,
            format!("an f32 schedule of {len} elements on {dev}"),
            format!(
                "{} {:?} on {}",
                schedule.dtype(),
                schedule.shape(),
                schedule.device()
            ),
        ));
    }
    Ok(())
}

/// A step's inputs once [`check_step`] passed them: the parameters' device, their gradients
/// and the queued clipping result.
pub(crate) struct CheckedStep {
    pub dev: Device,
    pub grads: Vec<Tensor>,
    pub clip: Option<Tensor>,
}

/// Checks a step before anything is written (the device schedule with its length, when
/// given, then the gradients as [`gather_grads`] does), then queues the clipping at
/// `max_grad_norm`. `None` when there are no parameters (nothing to do).
pub(crate) fn check_step(
    op: &'static str,
    params: &[Tensor],
    written: &[&[Tensor]],
    grads: &Gradients,
    schedule: Option<(&Tensor, usize)>,
    max_grad_norm: Option<f32>,
) -> Result<Option<CheckedStep>> {
    let Some(first) = params.first() else {
        return Ok(None);
    };
    let dev = first.device();
    if let Some((s, len)) = schedule {
        check_schedule(op, s, len, dev)?;
    }
    let grads = gather_grads(op, params, written, grads, dev)?;
    let clip = clip(&grads, max_grad_norm, dev)?;
    Ok(Some(CheckedStep { dev, grads, clip }))
}

/// A step's clipping result (when clipped) and scalars, as a backend's buffers.
pub(crate) type StepExtras<'a, Buf> = (Option<&'a Buf>, StepScalars<'a, Buf>);

/// The backend's view of a step's clipping result and scalars: the device schedule when
/// given, else the `host` values.
pub(crate) fn step_scalars<'a, B: DeviceBackend>(
    clip: Option<&'a Storage>,
    host: &'a [f32],
    schedule: Option<&'a Storage>,
) -> Result<StepExtras<'a, B::Buffer>> {
    let c = clip.map(B::get).transpose()?;
    let scalars = match schedule {
        Some(s) => StepScalars::Device(B::get(s)?),
        None => StepScalars::Host(host),
    };
    Ok((c, scalars))
}

/// The global-norm clipping result `[norm, coef]` on the device, when `max` is set.
pub(crate) fn clip(grads: &[Tensor], max: Option<f32>, dev: Device) -> Result<Option<Tensor>> {
    let Some(max) = max else {
        return Ok(None);
    };
    let guards: Vec<_> = grads.iter().map(|g| g.read()).collect();
    let st = on_device!(dev, |be| clip_impl(be, &guards, max)?);
    Ok(Some(Tensor::from_storage(st, vec![2], dev)))
}

fn clip_impl<B: DeviceBackend>(
    be: &B,
    grads: &[RwLockReadGuard<'_, Storage>],
    max: f32,
) -> Result<Storage> {
    let bufs: Vec<&B::Buffer> = grads.iter().map(|g| B::get(g)).collect::<Result<_>>()?;
    let mut out = be.allocate(DType::F32, 2)?;
    be.clip_coefficient(&bufs, max, &mut out)?;
    Ok(B::wrap(out))
}

/// The norm of a clipping result, read back (a device-to-host copy).
pub(crate) fn clip_norm(clip: Option<&Tensor>) -> Result<Option<f32>> {
    clip.map(|c| Ok(c.to_vec()?[0])).transpose()
}

/// Write guards of a list of tensors.
pub(crate) fn write_all(ts: &[Tensor]) -> Vec<RwLockWriteGuard<'_, Storage>> {
    ts.iter().map(|t| t.write()).collect()
}

/// Read guards of a list of tensors.
pub(crate) fn read_all(ts: &[Tensor]) -> Vec<RwLockReadGuard<'_, Storage>> {
    ts.iter().map(|t| t.read()).collect()
}

/// The backend buffers behind write guards.
pub(crate) fn bufs_mut<'a, B: DeviceBackend>(
    gs: &'a mut [RwLockWriteGuard<'_, Storage>],
) -> Result<Vec<&'a mut B::Buffer>> {
    gs.iter_mut().map(|g| B::get_mut(g)).collect()
}

/// The backend buffers behind read guards.
pub(crate) fn bufs<'a, B: DeviceBackend>(
    gs: &'a [RwLockReadGuard<'_, Storage>],
) -> Result<Vec<&'a B::Buffer>> {
    gs.iter().map(|g| B::get(g)).collect()
}
