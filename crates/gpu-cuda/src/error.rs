//! Mapping of driver, cuBLAS and NVRTC failures onto [`GpuError`].

use cudarc::driver::{result::DriverError, sys::CUresult};
use gpu_core::GpuError;

/// `CUDA_ERROR_NAME: description` for a driver error.
pub fn describe_driver_error(e: &DriverError) -> String {
    let name = e.error_name().map(|s| s.to_string_lossy().into_owned());
    let text = e.error_string().map(|s| s.to_string_lossy().into_owned());
    match (name, text) {
        (Ok(n), Ok(t)) => format!("{n}: {t}"),
        _ => format!("{:?}", e.0),
    }
}

/// Converts a driver error from `call` into the right typed error.
pub(crate) fn drv(call: &'static str) -> impl Fn(DriverError) -> GpuError {
    move |e| match e.0 {
        CUresult::CUDA_ERROR_OUT_OF_MEMORY => GpuError::OutOfMemory {
            requested: 0,
            free: free_bytes(),
        },
        _ => GpuError::Cuda {
            call,
            detail: describe_driver_error(&e),
        },
    }
}

/// True for the driver's refusal of a cooperative grid that cannot be resident at once
/// (`CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE`): the launch did not run, nothing was written.
pub fn is_cooperative_launch_too_large(e: &GpuError) -> bool {
    let name = format!("{:?}", CUresult::CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
    // `drv` writes the driver's name of the error (`describe_driver_error`), which is the
    // enum's, or the enum's Debug form where the name cannot be read: the same string.
    matches!(e, GpuError::Cuda { detail, .. } if detail.starts_with(&name))
}

/// Checks a raw `CUresult` from a `sys::` call.
pub(crate) fn check(call: &'static str, r: CUresult) -> Result<(), GpuError> {
    r.result().map_err(drv(call))
}

/// True for the results that mean "this module image is bad".
pub(crate) fn is_image_error(r: CUresult) -> bool {
    matches!(
        r,
        CUresult::CUDA_ERROR_INVALID_IMAGE
            | CUresult::CUDA_ERROR_INVALID_PTX
            | CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION
            | CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU
            | CUresult::CUDA_ERROR_INVALID_SOURCE
            | CUresult::CUDA_ERROR_JIT_COMPILATION_DISABLED
            | CUresult::CUDA_ERROR_JIT_COMPILER_NOT_FOUND
            | CUresult::CUDA_ERROR_SHARED_OBJECT_INIT_FAILED
            | CUresult::CUDA_ERROR_INVALID_VALUE
    )
}

/// Free device memory of the current context, or 0 when it cannot be read.
pub(crate) fn free_bytes() -> usize {
    cudarc::driver::result::mem_get_info().map_or(0, |(free, _)| free)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cooperative_refusal_is_told_apart() {
        let cuda = |detail: &str| GpuError::Cuda {
            call: "cuLaunchKernelEx",
            detail: detail.into(),
        };
        // As `describe_driver_error` writes it: the driver's name, or the enum's Debug form.
        assert!(is_cooperative_launch_too_large(&cuda(
            "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE: too many blocks in cooperative launch"
        )));
        assert!(is_cooperative_launch_too_large(&cuda(
            "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE"
        )));
        assert!(!is_cooperative_launch_too_large(&cuda(
            "CUDA_ERROR_INVALID_VALUE: invalid argument"
        )));
        assert!(!is_cooperative_launch_too_large(&GpuError::invalid(
            "rssm_rollout",
            "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE"
        )));
    }
}
