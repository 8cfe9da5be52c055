//! [`KernelOps`] on CUDA: the embedded kernels and cuBLAS.

use crate::backend::CudaBackend;
use crate::launch::{KernelArg, LaunchConfig};
use crate::pool::CudaBuffer;
use gpu_core::nn::RowOps;
use gpu_core::ops::{check_elementwise, check_layernorm, check_rows};
use gpu_core::{
    Backend, BinaryOp, BufferInfo, DType, GpuError, KernelOps, MatmulSpec, Result, UnaryOp,
};

const BLOCK: u32 = 256;
/// Rows up to this many bytes are staged in dynamic shared memory: 47 KiB, so that with the
/// kernels' static 128-byte scratch a block stays within the 48 KiB every GPU allows without
/// opting in (12032 f32 columns).
const ROW_CACHE_BYTES: usize = 47 * 1024;

impl CudaBackend {
    /// Grid for the float4 grid-stride kernels: enough blocks to fill the GPU, no more.
    fn vec4_config(&self, n: usize) -> LaunchConfig {
        let per_block = 4 * BLOCK as usize;
        let cap = self.info().multiprocessors.max(1) as usize * 8;
        let blocks = n.div_ceil(per_block).clamp(1, cap) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// One block per row; threads scale with the row (32..=512), striding over wider rows.
    /// Rows up to [`ROW_CACHE_BYTES`] are staged in dynamic shared memory (the returned flag).
    fn row_config(op: &'static str, rows: usize, cols: usize) -> Result<(LaunchConfig, u32)> {
        let rows = u32::try_from(rows).ok().filter(|&r| r <= i32::MAX as u32);
        let rows = rows.ok_or_else(|| GpuError::InvalidShape {
            op,
            reason: "more than 2^31-1 rows".into(),
        })?;
        let threads = cols.div_ceil(16).next_power_of_two().clamp(32, 512) as u32;
        let cached = cols * 4 <= ROW_CACHE_BYTES;
        let smem = if cached { (cols * 4) as u32 } else { 0 };
        let cfg = LaunchConfig {
            grid_dim: (rows, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem,
        };
        Ok((cfg, cached as u32))
    }

    fn cols_u32(op: &'static str, cols: usize) -> Result<u32> {
        u32::try_from(cols).map_err(|_| GpuError::InvalidShape {
            op,
            reason: "rows wider than 2^32-1".into(),
        })
    }
}

impl KernelOps for CudaBackend {
    fn fill(&self, buf: &mut CudaBuffer, value: f32) -> Result<()> {
        gpu_core::ops::require_f32("fill", buf.dtype())?;
        self.memset32(buf, value.to_bits())
    }

    fn vector_add(&self, a: &CudaBuffer, b: &CudaBuffer, out: &mut CudaBuffer) -> Result<()> {
        check_elementwise("vector_add", &[a, b], out)?;
        let n = out.len();
        if n == 0 {
            return Ok(());
        }
        let blocks =
            u32::try_from(n.div_ceil(BLOCK as usize)).map_err(|_| GpuError::InvalidShape {
                op: "vector_add",
                reason: "too many elements for one thread each".into(),
            })?;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let args = [a.into(), b.into(), out.into(), KernelArg::U64(n as u64)];
        // SAFETY: vector_add_f32(const float*, const float*, float*, u64 n); all three buffers
        // hold n f32 (checked above).
        unsafe { self.launch("vector_add_f32", cfg, &args) }
    }

    fn binary(
        &self,
        op: BinaryOp,
        a: &CudaBuffer,
        b: &CudaBuffer,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        check_elementwise(op.name(), &[a, b], out)?;
        let n = out.len();
        if n == 0 {
            return Ok(());
        }
        let kernel = match op {
            BinaryOp::Add => "add_f32",
            BinaryOp::Mul => "mul_f32",
        };
        let args = [a.into(), b.into(), out.into(), KernelArg::U64(n as u64)];
        // SAFETY: {add,mul}_f32(const float*, const float*, float*, u64 n); all buffers hold n
        // f32 and are 256-byte aligned (pool blocks), as the float4 accesses need.
        unsafe { self.launch(kernel, self.vec4_config(n), &args) }
    }

    fn unary(&self, op: UnaryOp, x: &CudaBuffer, out: &mut CudaBuffer) -> Result<()> {
        check_elementwise(op.name(), &[x], out)?;
        let n = out.len();
        if n == 0 {
            return Ok(());
        }
        let kernel = match op {
            UnaryOp::Relu => "relu_f32",
            UnaryOp::Sigmoid => "sigmoid_f32",
            UnaryOp::Tanh => "tanh_f32",
        };
        let args = [x.into(), out.into(), KernelArg::U64(n as u64)];
        // SAFETY: {relu,sigmoid,tanh}_f32(const float*, float*, u64 n); both buffers hold n f32
        // and are 256-byte aligned.
        unsafe { self.launch(kernel, self.vec4_config(n), &args) }
    }

    fn softmax_rows(&self, x: &CudaBuffer, out: &mut CudaBuffer, cols: usize) -> Result<()> {
        let rows = check_rows("softmax", x, out, cols)?;
        if rows == 0 {
            return Ok(());
        }
        let (cfg, cached) = Self::row_config("softmax", rows, cols)?;
        let args = [
            x.into(),
            out.into(),
            KernelArg::U32(Self::cols_u32("softmax", cols)?),
            KernelArg::U32(cached),
        ];
        // SAFETY: softmax_f32(const float*, float*, u32 cols, u32 cached) over `rows` blocks;
        // both buffers hold rows·cols f32; when cached, the block has cols·4 bytes of dynamic
        // shared memory.
        unsafe { self.launch("softmax_f32", cfg, &args) }
    }

    fn layernorm_rows(
        &self,
        x: &CudaBuffer,
        gamma: &CudaBuffer,
        beta: &CudaBuffer,
        out: &mut CudaBuffer,
        cols: usize,
        eps: f32,
    ) -> Result<()> {
        let rows = check_layernorm(x, gamma, beta, out, cols, eps)?;
        // The RowOps forward (kernels/nn_rows.cu), with its per-row statistics discarded.
        let mut mean = self.allocate(DType::F32, rows)?;
        let mut rstd = self.allocate(DType::F32, rows)?;
        self.layernorm_fwd(x, gamma, beta, out, &mut mean, &mut rstd, cols, eps)
    }

    fn matmul(
        &self,
        spec: MatmulSpec,
        a: &CudaBuffer,
        b: &CudaBuffer,
        c: &mut CudaBuffer,
    ) -> Result<()> {
        spec.validate(a, b, c)?;
        self.sgemm(spec, a, b, c)
    }
}
