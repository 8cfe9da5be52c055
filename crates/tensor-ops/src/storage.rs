//! Where a tensor's elements live.

use gpu_core::{BufferInfo, CpuStorage, DType};
use gpu_cuda::CudaBuffer;
use gpu_wgpu::WgpuBuffer;

/// A tensor's elements: host memory, a CUDA buffer or a wgpu storage buffer.
#[derive(Debug)]
pub enum Storage {
    Cpu(CpuStorage),
    Cuda(CudaBuffer),
    Wgpu(WgpuBuffer),
}

impl Storage {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Storage::Cpu(b) => b.len(),
            Storage::Cuda(b) => b.len(),
            Storage::Wgpu(b) => b.len(),
        }
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        match self {
            Storage::Cpu(b) => b.dtype(),
            Storage::Cuda(b) => b.dtype(),
            Storage::Wgpu(b) => b.dtype(),
        }
    }

    /// Whether this is a CUDA buffer (the ordinal is the tensor's to know).
    pub fn is_cuda(&self) -> bool {
        matches!(self, Storage::Cuda(_))
    }

    /// Whether this is a wgpu buffer (the adapter index is the tensor's to know).
    pub fn is_wgpu(&self) -> bool {
        matches!(self, Storage::Wgpu(_))
    }

    /// Where the buffer lives, in words ("host memory", "a CUDA buffer", "a wgpu buffer").
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Storage::Cpu(_) => "host memory",
            Storage::Cuda(_) => "a CUDA buffer",
            Storage::Wgpu(_) => "a wgpu buffer",
        }
    }
}
