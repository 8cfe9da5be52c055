//! What every optimiser's fused step does around its backend op: the parameters with their
//! weight decays and last clipping result ([`FusedCore`]), the step's checks, the locks on the
//! tensors it reads and writes, and the backend buffers handed to the op ([`FusedStep`]).

use super::common::{
    bufs, bufs_mut, check_step, checked_params, clip_norm, read_all, step_scalars, write_all,
    CheckedStep,
};
use crate::autograd::Gradients;
use crate::backend::{on_device, DeviceBackend};
use crate::storage::Storage;
use crate::tensor::Tensor;
use gpu_core::nn::optim::StepScalars;
use gpu_core::{Device, Result};
use std::sync::{RwLockReadGuard, RwLockWriteGuard};

/// The backend buffers of one fused step: the parameters with their weight decays and their
/// gradients, the `W` state lists it writes and the `R` it only reads (each in its optimiser's
/// order), the clipping result when clipped and the step's scalars.
pub(crate) struct StepBufs<'a, B: DeviceBackend, const W: usize, const R: usize> {
    pub params: Vec<&'a mut B::Buffer>,
    pub decays: &'a [f32],
    pub grads: Vec<&'a B::Buffer>,
    pub written: [Vec<&'a mut B::Buffer>; W],
    pub read: [Vec<&'a B::Buffer>; R],
    pub clip: Option<&'a B::Buffer>,
    pub scalars: StepScalars<'a, B::Buffer>,
}

/// An optimiser's backend op over a step's buffers.
pub(crate) trait FusedStep<const W: usize, const R: usize> {
    /// Runs (queues) the op on `be`.
    fn launch<B: DeviceBackend>(&self, be: &B, bufs: StepBufs<'_, B, W, R>) -> Result<()>;
}

/// The state lists of a step: `W` written, `R` only read.
pub(crate) type StateLists<'t, const W: usize, const R: usize> =
    ([&'t [Tensor]; W], [&'t [Tensor]; R]);

/// What every optimiser holds: its parameters, each one's weight decay, and the device result
/// `[norm, coef]` of the last step's clipping.
pub(crate) struct FusedCore {
    pub params: Vec<Tensor>,
    pub decays: Vec<f32>,
    pub last_clip: Option<Tensor>,
}

impl FusedCore {
    /// `params` with whether each is weight-decayed by `wd`, checked as
    /// [`super::common::check_params`] does.
    pub fn new(op: &'static str, params: Vec<(Tensor, bool)>, wd: f32) -> Result<Self> {
        let (params, decays) = checked_params(op, params, wd)?;
        Ok(FusedCore {
            params,
            decays,
            last_clip: None,
        })
    }

    /// The global gradient norm before the last step's clipping (a device-to-host copy).
    pub fn last_grad_norm(&self) -> Result<Option<f32>> {
        clip_norm(self.last_clip.as_ref())
    }

    /// Checks a step as [`check_step`] does (the gradients against the written lists, then the
    /// read ones), then queues the clipping and `step` with the `host` scalars or the device
    /// `schedule`, and keeps the clipping result. Nothing to do without parameters.
    pub fn queue<const W: usize, const R: usize>(
        &mut self,
        op: &'static str,
        (written, read): StateLists<'_, W, R>,
        grads: &Gradients,
        (host, schedule): (&[f32], Option<(&Tensor, usize)>),
        max_grad_norm: Option<f32>,
        step: &impl FusedStep<W, R>,
    ) -> Result<()> {
        let checked: Vec<&[Tensor]> = written.iter().chain(&read).copied().collect();
        let Some(CheckedStep { dev, grads, clip }) =
            check_step(op, &self.params, &checked, grads, schedule, max_grad_norm)?
        else {
            return Ok(());
        };
        let schedule = schedule.map(|(s, _)| s);
        let lists = (&self.params[..], &self.decays[..], &grads[..]);
        lock_and_launch(dev, lists, (written, read), (&clip, host, schedule), step)?;
        self.last_clip = clip;
        Ok(())
    }
}

/// Locks the parameters and the state lists for writing, the gradients, the read lists, the
/// clipping result and the schedule for reading, and runs `step` on `dev`'s backend.
pub(crate) fn lock_and_launch<const W: usize, const R: usize>(
    dev: Device,
    (params, decays, grads): (&[Tensor], &[f32], &[Tensor]),
    (written, read): StateLists<'_, W, R>,
    (clip, host, schedule): (&Option<Tensor>, &[f32], Option<&Tensor>),
    step: &impl FusedStep<W, R>,
) -> Result<()> {
    let mut locks = Locks {
        params: write_all(params),
        grads: read_all(grads),
        written: written.map(write_all),
        read: read.map(read_all),
        clip: clip.as_ref().map(|c| c.read()),
        schedule: schedule.map(|s| s.read()),
    };
    on_device!(dev, |be| locks.launch(be, decays, host, step)?);
    Ok(())
}

/// The guards of one step's tensors.
struct Locks<'g, const W: usize, const R: usize> {
    params: Vec<RwLockWriteGuard<'g, Storage>>,
    grads: Vec<RwLockReadGuard<'g, Storage>>,
    written: [Vec<RwLockWriteGuard<'g, Storage>>; W],
    read: [Vec<RwLockReadGuard<'g, Storage>>; R],
    clip: Option<RwLockReadGuard<'g, Storage>>,
    schedule: Option<RwLockReadGuard<'g, Storage>>,
}

impl<const W: usize, const R: usize> Locks<'_, W, R> {
    /// Runs `step` on `be` over the locked buffers (the `host` scalars unless a schedule is
    /// locked).
    fn launch<B: DeviceBackend>(
        &mut self,
        be: &B,
        decays: &[f32],
        host: &[f32],
        step: &impl FusedStep<W, R>,
    ) -> Result<()> {
        let (clip, scalars) =
            step_scalars::<B>(self.clip.as_deref(), host, self.schedule.as_deref())?;
        let bufs = StepBufs {
            params: bufs_mut::<B>(&mut self.params)?,
            decays,
            grads: bufs::<B>(&self.grads)?,
            written: lists(self.written.iter_mut().map(|g| bufs_mut::<B>(g)))?,
            read: lists(self.read.iter().map(|g| bufs::<B>(g)))?,
            clip,
            scalars,
        };
        step.launch(be, bufs)
    }
}

/// `N` lists, one per guard list.
fn lists<T, const N: usize>(each: impl Iterator<Item = Result<T>>) -> Result<[T; N]> {
    let all: Vec<T> = each.collect::<Result<_>>()?;
    Ok(all
        .try_into()
        .unwrap_or_else(|_| unreachable!("one list per guard list")))
}
