//! Raw access to a tensor's memory for crates that run their own device work on it (cuBLAS,
//! cuSOLVER, in-place updates) — the `data_ptr` door of the library. Every entry checks the
//! tensor's device and dtype first and never hands out two writers to one storage.

use crate::backend::cuda_backend;
use crate::storage::Storage;
use crate::tensor::{require_f32, Tensor};
use gpu_core::{BufferInfo, Device, GpuError, Result, Shape};
use gpu_cuda::{CudaBackend, CudaBuffer};

fn not_on(op: &'static str, t: &Tensor, want: &str) -> GpuError {
    GpuError::invalid(op, format!("the tensor is on {}, not {want}", t.device()))
}

pub(crate) fn busy(op: &'static str) -> GpuError {
    GpuError::invalid(
        op,
        "the tensor's storage is in use by another access (the same tensor, or a view of it, \
         was passed twice)",
    )
}

impl Tensor {
    /// Runs `f` with the CUDA backend and this f32 tensor's device buffer (row-major, the
    /// tensor's shape). Errors when the tensor is not an f32 CUDA tensor or its storage is
    /// being written.
    pub fn with_cuda_buffer<R>(
        &self,
        f: impl FnOnce(&CudaBackend, &CudaBuffer) -> Result<R>,
    ) -> Result<R> {
        const OP: &str = "with_cuda_buffer";
        let Device::Cuda(i) = self.device() else {
            return Err(not_on(OP, self, "a CUDA device"));
        };
        require_f32(OP, self)?;
        let gpu = cuda_backend(i)?;
        let guard = self.0.storage.try_read().map_err(|_| busy(OP))?;
        match &*guard {
            Storage::Cuda(b) => f(&gpu, b),
            _ => Err(not_on(OP, self, "a CUDA device")),
        }
    }

    /// Runs `f` with the CUDA backend and this f32 tensor's device buffer, to write it in
    /// place. Errors when the tensor is not an f32 CUDA tensor, belongs to an autograd graph
    /// (an op's result: writing it would corrupt the saved values), or its storage is in use.
    pub fn with_cuda_buffer_mut<R>(
        &self,
        f: impl FnOnce(&CudaBackend, &mut CudaBuffer) -> Result<R>,
    ) -> Result<R> {
        const OP: &str = "with_cuda_buffer_mut";
        let Device::Cuda(i) = self.device() else {
            return Err(not_on(OP, self, "a CUDA device"));
        };
        self.check_writable(OP)?;
        let gpu = cuda_backend(i)?;
        let mut guard = self.0.storage.try_write().map_err(|_| busy(OP))?;
        match &mut *guard {
            Storage::Cuda(b) => f(&gpu, b),
            _ => Err(not_on(OP, self, "a CUDA device")),
        }
    }

    /// Runs `f` on this f32 CPU tensor's elements (row-major), to write them in place. The
    /// same checks as [`Tensor::with_cuda_buffer_mut`].
    pub fn with_host_slice_mut<R>(&self, f: impl FnOnce(&mut [f32]) -> Result<R>) -> Result<R> {
        const OP: &str = "with_host_slice_mut";
        if self.device() != Device::Cpu {
            return Err(not_on(OP, self, "the CPU"));
        }
        self.check_writable(OP)?;
        let mut guard = self.0.storage.try_write().map_err(|_| busy(OP))?;
        match &mut *guard {
            Storage::Cpu(c) => f(c.as_f32_mut()?),
            _ => Err(not_on(OP, self, "the CPU")),
        }
    }

    /// A tensor owning `buf`, an f32 buffer of CUDA device `ordinal`'s shared backend
    /// (`cuda_backend(ordinal)`), holding exactly the elements of `shape`.
    pub fn from_cuda_buffer(buf: CudaBuffer, shape: &[usize], ordinal: usize) -> Result<Tensor> {
        const OP: &str = "from_cuda_buffer";
        let numel = Shape::from(shape).checked_numel()?;
        if BufferInfo::len(&buf) != numel {
            return Err(GpuError::shape(
                OP,
                format!("{numel} elements for {shape:?}"),
                BufferInfo::len(&buf),
            ));
        }
        if BufferInfo::dtype(&buf) != gpu_core::DType::F32 {
            return Err(GpuError::invalid(OP, "the buffer must hold f32"));
        }
        if buf.owner() != cuda_backend(ordinal)?.id() {
            return Err(GpuError::invalid(
                OP,
                format!("the buffer does not belong to cuda:{ordinal}'s shared backend"),
            ));
        }
        Ok(Tensor::from_storage(
            Storage::Cuda(buf),
            shape.to_vec(),
            Device::Cuda(ordinal),
        ))
    }

    pub(crate) fn check_writable(&self, op: &'static str) -> Result<()> {
        require_f32(op, self)?;
        if self.0.node.is_some() {
            return Err(GpuError::invalid(
                op,
                "the tensor is an op's result in an autograd graph; detach it first",
            ));
        }
        Ok(())
    }
}
