//! The [`Backend`] trait: what every device must offer (seed E's HAL).

use crate::device::Device;
use crate::dtype::{DType, Element};
use crate::error::{GpuError, Result};

/// Kind of device behind a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceType {
    Cpu,
    Gpu,
}

/// What every buffer can say about itself.
pub trait BufferInfo {
    /// Number of elements.
    fn len(&self) -> usize;
    /// Element type.
    fn dtype(&self) -> DType;
    /// True when the buffer holds no elements.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Size in bytes.
    fn size_in_bytes(&self) -> usize {
        self.len() * self.dtype().size_in_bytes()
    }
}

/// A device that can hold buffers and move data to and from the host.
pub trait Backend {
    /// The backend's buffer type: owns device memory and frees it on drop.
    type Buffer: BufferInfo;

    /// The device this backend drives.
    fn device(&self) -> Device;
    /// Human-readable device name.
    fn device_name(&self) -> String;
    /// CPU or GPU.
    fn device_type(&self) -> DeviceType;
    /// Bytes the device can still allocate.
    fn memory_available(&self) -> Result<usize>;
    /// Allocates `len` elements of `dtype` (contents unspecified).
    fn allocate(&self, dtype: DType, len: usize) -> Result<Self::Buffer>;
    /// Releases a buffer (dropping it does the same).
    fn free(&self, buffer: Self::Buffer) -> Result<()> {
        drop(buffer);
        Ok(())
    }
    /// Copies host data into a buffer of the same dtype and length. `src` may be reused as
    /// soon as this returns; on an asynchronous device the copy is ordered after the work
    /// queued before it and before the work queued after it, without waiting for either.
    fn copy_to_device<T: Element>(&self, src: &[T], dst: &mut Self::Buffer) -> Result<()>;
    /// Copies a buffer into host memory of the same dtype and length.
    fn copy_from_device<T: Element>(&self, src: &Self::Buffer, dst: &mut [T]) -> Result<()>;
    /// Waits until all work queued on the device has finished.
    fn synchronize(&self) -> Result<()>;

    /// Allocates a buffer holding a copy of `src`.
    fn upload<T: Element>(&self, src: &[T]) -> Result<Self::Buffer> {
        let mut buf = self.allocate(T::DTYPE, src.len())?;
        self.copy_to_device(src, &mut buf)?;
        Ok(buf)
    }

    /// Copies a buffer back into a new host vector.
    fn download<T: Element>(&self, src: &Self::Buffer) -> Result<Vec<T>> {
        let mut out = crate::cpu::try_filled_vec(src.len(), T::default())?;
        self.copy_from_device(src, &mut out)?;
        Ok(out)
    }
}

/// Checks that a host slice and a buffer agree in dtype and length.
pub fn check_transfer<T: Element>(
    op: &'static str,
    host_len: usize,
    buf: &impl BufferInfo,
) -> Result<()> {
    if buf.dtype() != T::DTYPE {
        return Err(GpuError::DTypeMismatch {
            op,
            expected: buf.dtype(),
            got: T::DTYPE,
        });
    }
    if buf.len() != host_len {
        return Err(GpuError::shape(op, buf.len(), host_len));
    }
    Ok(())
}
