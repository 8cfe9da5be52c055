//! The backend's typed errors, and how they map into [`GpuError`].

use gpu_core::GpuError;

/// Failures specific to wgpu; each converts into the stack's [`GpuError`].
#[derive(Debug, thiserror::Error)]
pub enum WgpuError {
    /// No adapter (no Vulkan/Metal/DX12 driver, or the index is past the adapters present).
    #[error("no wgpu adapter: {0}")]
    NoAdapter(String),
    /// `request_device` failed on an adapter that exists.
    #[error("opening the wgpu device failed: {0}")]
    RequestDevice(String),
    /// The device was lost; nothing can run on it any more.
    #[error("{0}")]
    DeviceLost(String),
    /// The device ran out of memory (after the pool released its cache).
    #[error("out of device memory allocating {requested} bytes")]
    OutOfMemory { requested: usize },
    /// The adapter's limits or features do not allow the request.
    #[error("{op}: {reason}")]
    Unsupported { op: &'static str, reason: String },
    /// A wait on the device passed its bound.
    #[error("{op}: timed out after {waited_ms} ms")]
    Timeout { op: &'static str, waited_ms: u64 },
    /// A validation or internal error reported by wgpu.
    #[error("{call}: {detail}")]
    Call { call: &'static str, detail: String },
}

impl From<WgpuError> for GpuError {
    fn from(e: WgpuError) -> Self {
        match e {
            WgpuError::NoAdapter(s) => GpuError::WgpuUnavailable(s),
            WgpuError::RequestDevice(s) => GpuError::WgpuUnavailable(s),
            WgpuError::DeviceLost(s) => GpuError::DeviceLost(s),
            // wgpu does not report free memory; 0 says "unknown / none left".
            WgpuError::OutOfMemory { requested } => GpuError::OutOfMemory { requested, free: 0 },
            WgpuError::Unsupported { op, reason } => GpuError::Unsupported { op, reason },
            WgpuError::Timeout { op, waited_ms } => GpuError::Timeout { op, waited_ms },
            WgpuError::Call { call, detail } => GpuError::Wgpu { call, detail },
        }
    }
}
