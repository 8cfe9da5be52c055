//! The one error type of the GPU stack.

use crate::dtype::DType;

/// Result alias used across the GPU stack.
pub type Result<T, E = GpuError> = std::result::Result<T, E>;

/// Every failure the HAL, the kernels and the CUDA backend can report.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// Two operands, or an operand and its output, disagree in shape or length.
    #[error("{op}: shape mismatch: expected {expected}, got {got}")]
    ShapeMismatch {
        op: &'static str,
        expected: String,
        got: String,
    },
    /// A shape or size argument is invalid on its own (zero-width rows, overflow, ...).
    #[error("{op}: invalid shape: {reason}")]
    InvalidShape { op: &'static str, reason: String },
    /// Operands have different dtypes.
    #[error("{op}: dtype mismatch: expected {expected}, got {got}")]
    DTypeMismatch {
        op: &'static str,
        expected: DType,
        got: DType,
    },
    /// The operation has no implementation for this dtype on this backend.
    #[error("{op}: dtype {dtype} is not supported on {backend}")]
    UnsupportedDType {
        op: &'static str,
        dtype: DType,
        backend: &'static str,
    },
    /// A device string could not be parsed (`cpu`, `cuda`, `cuda:N`, `wgpu`, `wgpu:N`, `auto`).
    #[error("invalid device '{0}': expected cpu, cuda, cuda:N, wgpu, wgpu:N or auto")]
    InvalidDevice(String),
    /// A buffer was handed to a backend instance other than the one that allocated it.
    #[error("{op}: {detail}")]
    ForeignBuffer { op: &'static str, detail: String },
    /// CUDA is not usable on this machine (no driver library, no GPU, driver init failed).
    #[error("CUDA is not available: {0}")]
    CudaUnavailable(String),
    /// wgpu is not usable here (no adapter, no Vulkan/Metal/DX12 driver, or not linked).
    #[error("wgpu is not available: {0}")]
    WgpuUnavailable(String),
    /// The device was lost (driver reset, removed GPU, destroyed device); it cannot be reused.
    #[error("the device was lost: {0}")]
    DeviceLost(String),
    /// The device lacks a feature or limit the op needs (a buffer larger than the adapter's
    /// `max_storage_buffer_binding_size`, `shader-f16`, ...).
    #[error("{op}: not supported by this device: {reason}")]
    Unsupported { op: &'static str, reason: String },
    /// A layer reached a device whose backend does not have this op yet.
    #[error("device {device}: {op} is not implemented on the {backend} backend yet")]
    NotImplemented {
        device: crate::device::Device,
        op: &'static str,
        backend: &'static str,
    },
    /// Waiting for the device exceeded its bound (the device may be hung).
    #[error("{op}: the device did not finish within {waited_ms} ms")]
    Timeout { op: &'static str, waited_ms: u64 },
    /// Any other wgpu call that failed (validation, internal error, buffer mapping).
    #[error("{call} failed: {detail}")]
    Wgpu { call: &'static str, detail: String },
    /// A CUDA ordinal beyond the devices present.
    #[error("CUDA device {ordinal} does not exist ({count} device(s) present)")]
    InvalidOrdinal { ordinal: usize, count: usize },
    /// Device memory ran out, even after the pool released its cache.
    #[error("out of device memory: requested {requested} bytes, {free} bytes free")]
    OutOfMemory { requested: usize, free: usize },
    /// No kernel of that name exists in the embedded kernel set or the module.
    #[error("unknown kernel '{0}'")]
    UnknownKernel(String),
    /// A module image (PTX, cubin, fatbin) was rejected by the driver.
    #[error("kernel image '{name}' is invalid: {reason}")]
    InvalidKernelImage { name: String, reason: String },
    /// NVRTC could not compile user-supplied CUDA C.
    #[error("compiling kernel '{name}' failed:\n{log}")]
    Compile { name: String, log: String },
    /// Any other CUDA driver, cuBLAS or cuSOLVER call that failed.
    #[error("{call} failed: {detail}")]
    Cuda { call: &'static str, detail: String },
    /// NaN or Inf where a finite value is required.
    #[error("{op}: non-finite value in {what}")]
    NonFinite { op: &'static str, what: String },
    /// Operands live on different devices; moving data is always explicit.
    #[error("{op}: operands are on different devices ({a} and {b}); move one with .to(device)")]
    DeviceMismatch {
        op: &'static str,
        a: crate::device::Device,
        b: crate::device::Device,
    },
    /// A value used as an index (a token id, a class target) at or past the size it indexes.
    /// `value` is the largest such value found (or a bound on them known on the host).
    #[error("{op}: {what} hold the value {value}, out of range (must be < {bound})")]
    IndexOutOfRange {
        op: &'static str,
        what: &'static str,
        value: u32,
        bound: usize,
    },
    /// Any other invalid argument.
    #[error("{op}: {reason}")]
    InvalidArgument { op: &'static str, reason: String },
}

impl GpuError {
    /// Shorthand for [`GpuError::ShapeMismatch`].
    pub fn shape(op: &'static str, expected: impl ToString, got: impl ToString) -> Self {
        Self::ShapeMismatch {
            op,
            expected: expected.to_string(),
            got: got.to_string(),
        }
    }

    /// Shorthand for [`GpuError::InvalidArgument`].
    pub fn invalid(op: &'static str, reason: impl ToString) -> Self {
        Self::InvalidArgument {
            op,
            reason: reason.to_string(),
        }
    }

    /// [`GpuError::NotImplemented`] for a device whose backend lacks `op`.
    pub fn not_implemented(device: crate::device::Device, op: &'static str) -> Self {
        Self::NotImplemented {
            device,
            op,
            backend: device.backend_name(),
        }
    }

    /// Shorthand for [`GpuError::Cuda`].
    pub fn cuda(call: &'static str, detail: impl std::fmt::Debug) -> Self {
        Self::Cuda {
            call,
            detail: format!("{detail:?}"),
        }
    }
}
