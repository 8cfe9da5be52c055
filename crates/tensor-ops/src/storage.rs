//! Where a tensor's elements live.

use gpu_core::{BufferInfo, CpuStorage, DType};
use gpu_cuda::CudaBuffer;

/// A tensor's elements: host memory or a CUDA buffer.
#[derive(Debug)]
pub enum Storage {
    Cpu(CpuStorage),
    Cuda(CudaBuffer),
}

impl Storage {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Storage::Cpu(b) => b.len(),
            Storage::Cuda(b) => b.len(),
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
        }
    }

    /// Whether this is host or device memory (the CUDA ordinal is the tensor's to know).
    pub fn is_cuda(&self) -> bool {
        matches!(self, Storage::Cuda(_))
    }
}
