//! Device-side copies of parameter values: a fresh copy (snapshots) and an in-place overwrite
//! that keeps the destination tensor's identity (restore, load). Neither goes through the host.

use crate::backend::on_device;
use crate::ops::{buf, buf_mut};
use crate::tensor::{require_f32, same_device, Tensor};
use gpu_core::nn::BlockCopy;
use gpu_core::nn::Primitives;
use gpu_core::{Backend, DType, GpuError, Result};
use std::sync::Arc;

/// A copy of `src`'s elements in new storage on the same device, cut from the graph.
pub(crate) fn deep_copy(src: &Tensor) -> Result<Tensor> {
    require_f32("copy", src)?;
    let n = src.numel();
    let dev = src.device();
    let g = src.read();
    let st = on_device!(dev, |be| {
        let mut out = be.allocate(DType::F32, n)?;
        if n > 0 {
            be.copy_blocks(buf(be, &g)?, &mut out, BlockCopy::run(0, 0, n))?;
        }
        crate::ops::wrap(be, out)
    });
    drop(g);
    Ok(Tensor::from_storage(st, src.shape().to_vec(), dev))
}

/// Overwrites `dst`'s elements with `src`'s, in place: every tensor sharing `dst`'s storage
/// (an optimiser's reference to a parameter) sees the new values. Same device, f32, same shape.
pub(crate) fn copy_into(op: &'static str, dst: &Tensor, src: &Tensor) -> Result<()> {
    let dev = same_device(op, &[dst, src])?;
    require_f32(op, dst)?;
    require_f32(op, src)?;
    if dst.shape() != src.shape() {
        return Err(GpuError::shape(
            op,
            format!("{:?}", dst.shape()),
            format!("{:?}", src.shape()),
        ));
    }
    if Arc::ptr_eq(&dst.0.storage, &src.0.storage) {
        return Ok(()); // the same elements: nothing to copy (and one lock, not two)
    }
    let n = src.numel();
    if n == 0 {
        return Ok(());
    }
    let (g, mut d) = (src.read(), dst.write());
    on_device!(dev, |be| be.copy_blocks(
        buf(be, &g)?,
        buf_mut(be, &mut d)?,
        BlockCopy::run(0, 0, n)
    )?);
    Ok(())
}

impl Tensor {
    /// A copy of this f32 tensor's elements in new storage on the same device, cut from the
    /// autograd graph (no host round trip).
    pub fn deep_copy(&self) -> Result<Tensor> {
        deep_copy(self)
    }

    /// Overwrites this f32 tensor's elements with `src`'s (same shape and device), in place:
    /// every tensor sharing this storage (an optimiser's handle on a parameter) sees the new
    /// values. Checked before anything is written.
    pub fn assign(&self, src: &Tensor) -> Result<()> {
        copy_into("Tensor::assign", self, src)
    }
}
