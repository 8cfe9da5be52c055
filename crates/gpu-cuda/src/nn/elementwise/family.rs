//! The [`ElementwiseOps`] methods of CUDA beyond the primitives (affine, the max backward,
//! the dropout's device seed offset) and the dropout launch they share with `Primitives`.

use super::*;

impl ElementwiseOps for CudaBackend {
    fn affine(&self, x: &CudaBuffer, mul: f32, add: f32, out: &mut CudaBuffer) -> Result<()> {
        let dt = check_float_elementwise("affine", &[x], out)?;
        let (n, kernel) = (out.len(), format!("affine_{dt}"));
        let ptrs: [KernelArg; 2] = [x.into(), out.into()];
        let scalars = [KernelArg::F32(mul), KernelArg::F32(add)];
        // SAFETY: affine_{T}(const T* x, T* out, u64 n, float mul, float add), T f32 or bf16;
        // both hold n elements, 256-byte aligned.
        unsafe { self.launch_streaming(&kernel, (&ptrs, n, &scalars), (dt, BLOCKS_PER_SM)) }
    }

    fn max_axis_bwd(
        &self,
        xs: (&CudaBuffer, &CudaBuffer, &CudaBuffer),
        dims: [usize; 3],
        dx: &mut CudaBuffer,
    ) -> Result<()> {
        self.max_axis_bwd_impl(xs, dims, dx)
    }

    /// The kernel of [`Primitives::dropout`], with `offsets[index]` read on the device when it
    /// runs (a graph's replays draw new masks from the values written before them).
    fn dropout_offset(
        &self,
        x: &CudaBuffer,
        p: f32,
        seed: u64,
        (offsets, index): (&CudaBuffer, usize),
        out: &mut CudaBuffer,
    ) -> Result<()> {
        let ptr = self.seed_offset_ptr("dropout_offset", offsets, index)?;
        self.dropout_impl(x, p, seed, ptr, out)
    }
}

impl CudaBackend {
    /// The device address of u64 entry `index` of `offsets` (U32 pairs, low word first), after
    /// checking the dtype, the bounds and that the buffer is this backend's: in bounds and
    /// 8-byte aligned (256-byte aligned base, 8-byte entries).
    pub(crate) fn seed_offset_ptr(
        &self,
        op: &'static str,
        offsets: &CudaBuffer,
        index: usize,
    ) -> Result<u64> {
        gpu_core::nn::elementwise::check_seed_offset(op, offsets, index)?;
        self.check_owned(op, &[offsets])?;
        Ok(offsets.device_ptr() + 8 * index as u64)
    }

    pub(super) fn dropout_impl(
        &self,
        x: &CudaBuffer,
        p: f32,
        seed: u64,
        offset_ptr: u64,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        check_dropout(x, p, out)?;
        let (n, dt) = (out.len(), out.dtype());
        let ptrs: [KernelArg; 2] = [x.into(), out.into()];
        let scalars = [
            KernelArg::F32(p),
            KernelArg::U64(seed),
            KernelArg::Ptr(offset_ptr),
        ];
        let kernel = format!("dropout_{dt}");
        // SAFETY: dropout_{T}(const T* x, T* out, u64 n, float p, u64 seed, const u64* offset),
        // T f32 or bf16 (check_dropout: one dtype); both hold n elements, 256-byte aligned;
        // offset_ptr is 0 (null) or an 8-byte aligned u64 inside a buffer of this backend
        // (`dropout_offset`).
        unsafe { self.launch_streaming(&kernel, (&ptrs, n, &scalars), (dt, BLOCKS_PER_SM)) }
    }
}
