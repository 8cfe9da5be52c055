//! The CUDA path of `apply_corrections`: `W += U·diag(S)·Vᵀ` in place on a device tensor, as
//! one cuBLAS GEMM with `beta = 1` (each output tile is formed in registers and added to `W`
//! once; nothing of the product's size is allocated), after `diag(S)` is folded into `U`.
//!
//! A failed call leaves `W` untouched: NaN or Inf in `W` is refused first, and when the
//! Cauchy–Schwarz bound says the sum could leave the f32 range, the sum is formed in a copy,
//! checked, and only then copied over `W`.

use crate::error::AcceleratorError;
use crate::lowrank::LowRank;
use tensor_ops::{DType, Device, Tensor};

const ENTRY: &str = "apply_corrections";

/// The largest magnitude in `t` (one synchronisation); NaN when `t` holds NaN or Inf.
fn max_abs(t: &Tensor) -> Result<f32, AcceleratorError> {
    Ok(crate::layers::max_abs_if_finite(t)?.unwrap_or(f32::NAN))
}

/// `w += U·diag(S)·Vᵀ` for `w` an f32 `[m, n]` CUDA tensor and `c` on the same device (both
/// checked by the caller).
pub(crate) fn apply_cuda(w: &Tensor, c: &LowRank) -> Result<(), AcceleratorError> {
    let (m, n) = c.shape();
    let k = c.rank();
    let w_max = max_abs(w)?;
    if !w_max.is_finite() {
        return Err(AcceleratorError::NonFinite {
            entry: ENTRY,
            what: "the weights",
        });
    }
    let risky = c.entry_bound()? + f64::from(w_max) >= f64::from(f32::MAX) / 2.0;
    // U·diag(S): row-major U [m, k] is column-major k × m; row r scaled by S[r].
    let us = c.u().with_cuda_buffer(|gpu, u| {
        c.s().with_cuda_buffer(|_, s| {
            let mut us = gpu_core::Backend::allocate(gpu, DType::F32, m * k)?;
            gpu.scale_rows_cm((k, m), (u, k), s, (&mut us, k))?;
            Ok(us)
        })
    })?;
    // Column-major Wᵀ (n × m) += V (n × k, the k × n buffer transposed) · (U·diag(S))ᵀ.
    let add = |gpu: &gpu_cuda::CudaBackend, target: &mut gpu_cuda::CudaBuffer| {
        c.v().with_cuda_buffer(|_, v| {
            gpu.gemm_cm(
                (true, false),
                (n, m, k),
                1.0,
                (v, k),
                (&us, k),
                1.0,
                (target, n),
            )
        })
    };
    if !risky {
        return Ok(w.with_cuda_buffer_mut(add)?);
    }
    // The sum may overflow: form it in a copy, check it, then write it.
    let Device::Cuda(dev) = w.device() else {
        return Err(AcceleratorError::InvalidArgument {
            entry: ENTRY,
            reason: format!("the CUDA path got weights on {}", w.device()),
        });
    };
    let trial = w.with_cuda_buffer(|gpu, src| {
        let mut t = gpu_core::Backend::allocate(gpu, DType::F32, m * n)?;
        gpu.copy_buffer(src, &mut t)?;
        add(gpu, &mut t)?;
        Ok(t)
    })?;
    let trial = Tensor::from_cuda_buffer(trial, &[m, n], dev)?;
    if !max_abs(&trial)?.is_finite() {
        return Err(AcceleratorError::NonFinite {
            entry: ENTRY,
            what: "the corrected weights (the sum overflows f32)",
        });
    }
    trial.with_cuda_buffer(|_, t| w.with_cuda_buffer_mut(|gpu, dst| gpu.copy_buffer(t, dst)))?;
    Ok(())
}
