//! A CUDA availability probe that cannot panic and needs no CUDA crate.
//!
//! The HAL learns whether CUDA is usable by loading the driver library itself (`libloading`)
//! and calling two driver entry points, `cuInit` and `cuDeviceGetCount`; it does not depend on
//! any backend library, so a second backend can be added without touching the HAL. Backends
//! that load the driver through their own bindings (cudarc panics on its first driver call when
//! `libcuda.so` is missing) check this probe first, then their own loader.

use crate::error::{GpuError, Result};
use std::sync::OnceLock;

/// The driver library names tried, in order (the versioned name is what drivers install).
const DRIVER_NAMES: &[&str] = &["libcuda.so.1", "libcuda.so", "nvcuda.dll"];

type CuInit = unsafe extern "C" fn(flags: u32) -> i32;
type CuDeviceGetCount = unsafe extern "C" fn(count: *mut i32) -> i32;

/// The loaded driver and its two entry points (the library stays loaded for the process).
struct Driver {
    _lib: libloading::Library,
    device_get_count: CuDeviceGetCount,
}

/// Loads and initialises the driver once per process; the error is kept and repeated.
fn driver() -> std::result::Result<&'static Driver, String> {
    static DRIVER: OnceLock<std::result::Result<Driver, String>> = OnceLock::new();
    DRIVER.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> std::result::Result<Driver, String> {
    let lib = DRIVER_NAMES
        .iter()
        // SAFETY: loading the CUDA driver runs its initialisers, which have no preconditions;
        // nothing else is loaded under these names.
        .find_map(|name| unsafe { libloading::Library::new(*name) }.ok())
        .ok_or_else(|| "the CUDA driver library (libcuda.so) was not found".to_string())?;
    // SAFETY: the symbols are the CUDA driver API's `CUresult cuInit(unsigned int)` and
    // `CUresult cuDeviceGetCount(int*)`, whose C signatures the fn types above match; the
    // pointers stay valid while `lib` is loaded, and `Driver` keeps it loaded.
    let (init, device_get_count) = unsafe {
        let init: libloading::Symbol<CuInit> = lib
            .get(b"cuInit\0")
            .map_err(|e| format!("the CUDA driver has no cuInit: {e}"))?;
        let count: libloading::Symbol<CuDeviceGetCount> = lib
            .get(b"cuDeviceGetCount\0")
            .map_err(|e| format!("the CUDA driver has no cuDeviceGetCount: {e}"))?;
        (*init, *count)
    };
    // SAFETY: cuInit takes flags 0 and may be called any number of times.
    let rc = unsafe { init(0) };
    if rc != 0 {
        return Err(format!("cuInit failed (CUresult {rc})"));
    }
    Ok(Driver {
        _lib: lib,
        device_get_count,
    })
}

/// Loads the driver library and initialises it, or says why CUDA is unusable here.
pub fn ensure_driver() -> Result<()> {
    driver().map(|_| ()).map_err(GpuError::CudaUnavailable)
}

/// Number of CUDA devices, or why CUDA is unusable on this machine.
pub fn cuda_device_count() -> Result<usize> {
    let d = driver().map_err(GpuError::CudaUnavailable)?;
    let mut n = 0i32;
    // SAFETY: the driver is initialised (cuInit succeeded in `load`); `n` is a valid out-pointer.
    let rc = unsafe { (d.device_get_count)(&mut n) };
    if rc != 0 {
        return Err(GpuError::CudaUnavailable(format!(
            "cuDeviceGetCount failed (CUresult {rc})"
        )));
    }
    Ok(n.max(0) as usize)
}

/// True when at least one CUDA device can be used.
pub fn cuda_is_available() -> bool {
    matches!(cuda_device_count(), Ok(n) if n > 0)
}

/// One wgpu adapter as a registered [`WgpuProbe`] reports it (in the backend's enumeration
/// order, so index `n` is `Device::Wgpu(n)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterSummary {
    /// The adapter's name (`llvmpipe (LLVM 15.0.6, 256 bits)`, `NVIDIA H200`).
    pub name: String,
    /// The graphics API and driver (`Vulkan, llvmpipe, Mesa 22.3.6`).
    pub driver: String,
    /// True for a software rasteriser (lavapipe, WARP): [`crate::Device::auto`] never picks one.
    pub software: bool,
}

/// Lists the wgpu adapters present, or says why there are none. It must not panic or hang.
pub type WgpuProbe = fn() -> std::result::Result<Vec<AdapterSummary>, String>;

static WGPU_PROBE: OnceLock<WgpuProbe> = OnceLock::new();

/// Registers the wgpu adapter probe (done by `gpu_wgpu::register_device_probe`).
///
/// The HAL does not depend on any backend crate, so it cannot look for wgpu adapters itself:
/// the layer that links the wgpu backend, and can run on it, registers this hook, and from then
/// on [`crate::Device::auto`] considers wgpu devices. Returns false when a probe was already
/// registered (the first one stays).
pub fn register_wgpu_probe(probe: WgpuProbe) -> bool {
    WGPU_PROBE.set(probe).is_ok()
}

/// The wgpu adapters present, or [`GpuError::WgpuUnavailable`] when none is, or when no probe
/// is registered (the program does not link a layer that runs on wgpu).
pub fn wgpu_adapters() -> Result<Vec<AdapterSummary>> {
    let probe = WGPU_PROBE.get().ok_or_else(|| {
        GpuError::WgpuUnavailable(
            "this program does not link a layer that runs on the wgpu backend".into(),
        )
    })?;
    let adapters = probe().map_err(GpuError::WgpuUnavailable)?;
    if adapters.is_empty() {
        return Err(GpuError::WgpuUnavailable("no wgpu adapter found".into()));
    }
    Ok(adapters)
}

/// True when a wgpu probe has been registered.
pub fn wgpu_probe_registered() -> bool {
    WGPU_PROBE.get().is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_never_panics() {
        // Either answer is fine; what matters is that asking cannot panic on any machine, and
        // that asking twice gives the same answer.
        let first = cuda_device_count().map_err(|e| e.to_string());
        match &first {
            Ok(n) => println!("CUDA devices: {n}"),
            Err(e) => println!("no CUDA: {e}"),
        }
        assert_eq!(first, cuda_device_count().map_err(|e| e.to_string()));
        let _ = cuda_is_available();
    }
}
