//! The largest magnitude of an f32 buffer and whether it is finite, in one pass over it
//! (`kernels/linalg_amax.cu`): what the world model's entry points check before they factor or
//! write anything (a NaN or an infinity is refused; the magnitude picks a power-of-two scale).
//! Its reference is [`max_abs_bits_reference`].

use crate::backend::CudaBackend;
use crate::launch::KernelArg;
use crate::pool::CudaBuffer;
use gpu_core::{Backend, BufferInfo, DType, GpuError, Result};

/// The bits of `+inf`: [`max_abs_bits_reference`] (and the kernel) return this when the largest
/// magnitude is an infinity, and more when some element is NaN.
pub const INF_BITS: u32 = 0x7f80_0000;

/// The largest `|x|` of `x` as the bits of that `f32` (0 for an empty slice); NaN anywhere gives
/// a value above [`INF_BITS`]. `f32::from_bits` of a result at most [`INF_BITS`] is the largest
/// magnitude.
pub fn max_abs_bits_reference(x: &[f32]) -> u32 {
    x.iter()
        .map(|v| v.to_bits() & 0x7fff_ffff)
        .max()
        .unwrap_or(0)
}

impl CudaBackend {
    /// Queues `out[0] = max(out[0], `[`max_abs_bits_reference`]`(x[..n]))`: the caller zeroes
    /// the u32 `out` first (or keeps a running maximum over several buffers).
    pub fn max_abs_bits_into(&self, x: &CudaBuffer, n: usize, out: &mut CudaBuffer) -> Result<()> {
        const OP: &str = "max_abs_bits";
        if x.dtype() != DType::F32 || x.len() < n {
            return Err(GpuError::invalid(
                OP,
                format!("x needs {n} f32, got {} {}", x.len(), x.dtype()),
            ));
        }
        if out.dtype() != DType::U32 || out.is_empty() {
            return Err(GpuError::invalid(OP, "out must be at least one u32"));
        }
        self.check_owned(OP, &[x, out])?;
        if n == 0 {
            return Ok(());
        }
        // A float4 a thread, at most 8 blocks of 256 threads a multiprocessor.
        let cfg = self.stride_grid_capped(n.div_ceil(4), 8);
        let args = [
            KernelArg::from(x),
            KernelArg::U64(n as u64),
            KernelArg::from(&mut *out),
        ];
        // SAFETY: max_abs_bits_f32(const float* x, u64 n, unsigned* out); x holds at least n
        // f32 (checked) from the start of a pool allocation (16-byte aligned, as its float4 loads
        // need), out one u32; the kernel's block reduction assumes the 256-thread blocks that
        // `stride_grid_capped` gives.
        unsafe { self.launch("max_abs_bits_f32", cfg, &args) }
    }

    /// [`max_abs_bits_reference`] of `x[..n]` on the device; one synchronisation.
    pub fn max_abs_bits(&self, x: &CudaBuffer, n: usize) -> Result<u32> {
        let mut out = self.allocate(DType::U32, 1)?;
        self.memset32(&mut out, 0)?;
        self.max_abs_bits_into(x, n, &mut out)?;
        Ok(self.download::<u32>(&out)?[0])
    }
}
