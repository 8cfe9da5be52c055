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
