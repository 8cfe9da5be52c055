//! A CUDA availability probe that cannot panic.
//!
//! `cudarc` panics on its first driver call when `libcuda.so` is missing, so every path into the
//! driver goes through [`cuda_device_count`] (or [`ensure_driver`]) first.

use crate::error::{GpuError, Result};

/// Loads the driver library and initialises it, or says why CUDA is unusable here.
pub fn ensure_driver() -> Result<()> {
    // SAFETY: `is_culib_present` only tries to dlopen the driver library by name; it has no
    // preconditions and does not call into the library.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(GpuError::CudaUnavailable(
            "the CUDA driver library (libcuda.so) was not found".into(),
        ));
    }
    cudarc::driver::result::init()
        .map_err(|e| GpuError::CudaUnavailable(format!("cuInit failed: {e}")))
}

/// Number of CUDA devices, or why CUDA is unusable on this machine.
pub fn cuda_device_count() -> Result<usize> {
    ensure_driver()?;
    let n = cudarc::driver::result::device::get_count()
        .map_err(|e| GpuError::CudaUnavailable(format!("cuDeviceGetCount failed: {e}")))?;
    Ok(n.max(0) as usize)
}

/// True when at least one CUDA device can be used.
pub fn cuda_is_available() -> bool {
    matches!(cuda_device_count(), Ok(n) if n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_never_panics() {
        // Either answer is fine; what matters is that asking cannot panic on any machine.
        match cuda_device_count() {
            Ok(n) => println!("CUDA devices: {n}"),
            Err(e) => println!("no CUDA: {e}"),
        }
        let _ = cuda_is_available();
    }
}
