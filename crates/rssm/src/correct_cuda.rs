//! The CUDA path of `apply_corrections`: `W += U·diag(S)·Vᵀ` in place on a device tensor.
//!
//! Ranks up to 64 (the hybrid trainer's): one fused kernel (`gpu_cuda::lowrank`) forms each
//! 64 × 64 tile of the sum in registers, a first launch checks every entry (NaN or Inf in `W`,
//! a sum that leaves the f32 range), a second writes the sums only when the check passed, and
//! one flag word comes back: a failed call leaves `W` untouched, and nothing of `W`'s size is
//! allocated.
//!
//! Larger ranks: one cuBLAS GEMM with `beta = 1` after `diag(S)` is folded into `U`; NaN or
//! Inf in `W` is refused first, and when the Cauchy–Schwarz bound says the sum could leave the
//! f32 range, the sum is formed in a copy, checked, and only then copied over `W`.

use crate::error::AcceleratorError;
use crate::lowrank::LowRank;
use gpu_cuda::lowrank::{LOWRANK_MAX_RANK, LOWRANK_NONFINITE_W};
use tensor_ops::{DType, Device, Tensor};

const ENTRY: &str = "apply_corrections";

/// The fused kernel's path (`1 <= k <= 64`): one synchronisation, the flag word.
fn fused(w: &Tensor, c: &LowRank, dims: (usize, usize, usize)) -> Result<(), AcceleratorError> {
    use gpu_core::Backend;
    let bits = w.with_cuda_buffer_mut(|gpu, wb| {
        c.u().with_cuda_buffer(|_, u| {
            c.s().with_cuda_buffer(|_, s| {
                c.v().with_cuda_buffer(|_, v| {
                    let mut flag = gpu.allocate(DType::U32, 1)?;
                    gpu.lowrank_add(dims, wb, u, s, v, &mut flag)?;
                    Ok(gpu.download::<u32>(&flag)?[0])
                })
            })
        })
    })?;
    if bits & LOWRANK_NONFINITE_W != 0 {
        return Err(AcceleratorError::NonFinite {
            entry: ENTRY,
            what: "the weights",
        });
    }
    if bits != 0 {
        return Err(AcceleratorError::NonFinite {
            entry: ENTRY,
            what: "the corrected weights (the sum overflows f32)",
        });
    }
    Ok(())
}

/// The largest magnitude in `t` (one synchronisation); NaN when `t` holds NaN or Inf.
fn max_abs(t: &Tensor) -> Result<f32, AcceleratorError> {
    Ok(crate::layers::max_abs_if_finite(t)?.unwrap_or(f32::NAN))
}

/// `w += U·diag(S)·Vᵀ` for `w` an f32 `[m, n]` CUDA tensor and `c` on the same device (both
/// checked by the caller).
pub(crate) fn apply_cuda(w: &Tensor, c: &LowRank) -> Result<(), AcceleratorError> {
    let (m, n) = c.shape();
    let k = c.rank();
    if (1..=LOWRANK_MAX_RANK).contains(&k) {
        return fused(w, c, (m, n, k));
    }
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
