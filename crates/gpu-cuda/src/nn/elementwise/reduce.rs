//! The axis reductions on CUDA (`kernels/nn_reduce.cuh`): Sum, Mean and Max over the middle
//! axis of `[outer, n, inner]` in one pass, in two (f32 partials, then their sum) or, for split
//! 16-byte column loads on sm_90, in one clustered launch; and the backward of Max.

use super::plan::{self, ReduceLoads, ReducePlan, REDUCE_THREADS};
use super::u64_arg;
use crate::backend::{CudaBackend, Grouping};
use crate::launch::{KernelArg, LaunchConfig};
use crate::pool::CudaBuffer;
use gpu_core::nn::elementwise::{check_max_axis_bwd, check_reduce, ReduceKind};
use gpu_core::{Backend, BufferInfo, DType, Result};

/// The reduction kernel of `kind` (`sum` or `max`) reading as `loads` says, reading `from`
/// and writing `to` (the f32 partials of a split reduction sit between the two passes).
pub(super) fn reduce_kernel(kind: &str, loads: ReduceLoads, from: DType, to: DType) -> String {
    let prefix = match loads {
        ReduceLoads::Scalar => "reduce_",
        ReduceLoads::Rows => "reduce_rowsv_",
        ReduceLoads::Cols => "reduce_colsv_",
    };
    format!("{prefix}{kind}_{}", reduce_types(from, to))
}

/// The cluster form of the 16-byte column kernel (`reduce_cluster_colsv_*`).
pub(super) fn reduce_cluster_kernel(kind: &str, from: DType, to: DType) -> String {
    format!("reduce_cluster_colsv_{kind}_{}", reduce_types(from, to))
}

/// A reduction kernel's type suffix: `f32`, `bf16`, or `{from}_{to}` when they differ.
fn reduce_types(from: DType, to: DType) -> String {
    if from == to {
        from.to_string()
    } else {
        format!("{from}_{to}")
    }
}

impl CudaBackend {
    /// Launches one reduction pass over `[outer, n, inner]` (all non-zero) as planned by `p`.
    fn reduce_pass(
        &self,
        kind: &str,
        (x, out): (&CudaBuffer, &mut CudaBuffer),
        [outer, n, inner]: [usize; 3],
        p: &ReducePlan,
        divisor: f32,
    ) -> Result<()> {
        let kernel = reduce_kernel(kind, p.loads, x.dtype(), out.dtype());
        let cfg = reduce_cfg(p.grid_x, p.splits as u32);
        let args = [
            x.into(),
            out.into(),
            u64_arg(outer),
            u64_arg(n),
            u64_arg(inner),
            u64_arg(p.chunk),
            KernelArg::U32(p.tx_log2),
            KernelArg::U32(p.ty_log2),
            KernelArg::F32(divisor),
        ];
        // SAFETY: reduce_{,rowsv_,colsv_}{sum,max}_{X}(const X* x, Y* out, u64 outer, u64 n,
        // u64 inner, u64 chunk, u32 tx_log2, u32 ty_log2, float divisor), X and Y the dtypes of
        // x and out (f32 or bf16, named by reduce_kernel), reads x[outer·n·inner] and writes
        // out[outer·splits·inner] (splits = grid.y); the callers size both so. The 16-byte
        // variants run only as reduce_plan allows them: rowsv with inner == 1 and n, chunk
        // multiples of 16 bytes of elements, colsv with inner a multiple of that, so every
        // 16-byte load is aligned (pool buffers are 256-byte aligned).
        unsafe { self.launch(&kernel, cfg, &args) }
    }
    /// A split column reduction in one clustered launch (`reduce_cluster_colsv_*`) over
    /// `[n, inner]` blocks.
    fn reduce_cluster(
        &self,
        kind: &str,
        (x, out): (&CudaBuffer, &mut CudaBuffer),
        [n, inner]: [usize; 2],
        c: &plan::ClusterPlan,
        divisor: f32,
    ) -> Result<()> {
        let kernel = reduce_cluster_kernel(kind, x.dtype(), out.dtype());
        let cfg = reduce_cfg(c.grid_x, 1);
        let args = [
            x.into(),
            (&*out).into(),
            u64_arg(n),
            u64_arg(inner),
            u64_arg(c.chunk),
            KernelArg::U32(c.tx_log2),
            KernelArg::F32(divisor),
        ];
        let group = Grouping {
            cooperative: false,
            cluster: plan::CLUSTER_SPLITS as u32,
        };
        // SAFETY: reduce_cluster_colsv_{sum,max}_{X}(const X* x, Y* out, u64 n, u64 inner, u64
        // chunk, u32 tx_log2, float divisor) reads x[outer·n·inner] (grid.x / 8 items of outer
        // and column tiles) and writes out[outer·inner] (checked by check_reduce); inner is a
        // multiple of the 16-byte unit (cluster_plan takes Cols plans only), so every load is
        // aligned. grid.x is a multiple of the cluster size 8, the portable limit.
        unsafe { self.launch_grouped(&kernel, cfg, &args, group) }
    }

    /// [`Primitives::reduce_axis`].
    pub(super) fn reduce_axis_impl(
        &self,
        op: ReduceKind,
        (x, out): (&CudaBuffer, &mut CudaBuffer),
        [outer, n, inner]: [usize; 3],
    ) -> Result<()> {
        check_reduce(op, x, outer, n, inner, out)?;
        if out.is_empty() {
            return Ok(());
        }
        if n == 0 {
            // Sum over an empty axis (the others were rejected): +0 in either dtype.
            return match out.dtype() {
                DType::BF16 => self.memset16(out, 0),
                _ => self.memset32(out, 0),
            };
        }
        let (kind, divisor) = match op {
            ReduceKind::Sum => ("sum", 1.0),
            ReduceKind::Mean => ("sum", n as f32),
            ReduceKind::Max => ("max", 1.0),
        };
        let elem = x.dtype().size_in_bytes();
        let p = plan::reduce_plan(outer, n, inner, elem, self.sms(), true, true);
        if p.splits == 1 {
            return self.reduce_pass(kind, (x, out), [outer, n, inner], &p, divisor);
        }
        let clusters = self.has_cluster_code();
        if let Some(c) = plan::cluster_plan(&p, outer, n, inner, elem, self.sms(), clusters) {
            return self.reduce_cluster(kind, (x, out), [n, inner], &c, divisor);
        }
        // Partials [outer, splits, inner] in f32 (whatever x's dtype), then a second pass over
        // the splits that rounds once into out.
        let mut part = self.allocate(DType::F32, outer * p.splits * inner)?;
        self.reduce_pass(kind, (x, &mut part), [outer, n, inner], &p, 1.0)?;
        let p2 = plan::reduce_plan(outer, p.splits, inner, 4, self.sms(), false, true);
        self.reduce_pass(kind, (&part, out), [outer, p.splits, inner], &p2, divisor)
    }

    /// [`ElementwiseOps::max_axis_bwd`].
    pub(super) fn max_axis_bwd_impl(
        &self,
        (x, y, dy): (&CudaBuffer, &CudaBuffer, &CudaBuffer),
        [outer, n, inner]: [usize; 3],
        dx: &mut CudaBuffer,
    ) -> Result<()> {
        check_max_axis_bwd(x, y, dy, outer, n, inner, dx)?;
        if dx.is_empty() {
            return Ok(());
        }
        let p = plan::reduce_plan(
            outer,
            n,
            inner,
            x.dtype().size_in_bytes(),
            self.sms(),
            false,
            false,
        );
        let cfg = reduce_cfg(p.grid_x, 1);
        let args = [
            x.into(),
            y.into(),
            dy.into(),
            dx.into(),
            u64_arg(outer),
            u64_arg(n),
            u64_arg(inner),
            KernelArg::U32(p.tx_log2),
            KernelArg::U32(p.ty_log2),
        ];
        // SAFETY: max_axis_bwd_{T}(const T* x, const T* y, const T* dy, T* dx, u64 outer,
        // u64 n, u64 inner, u32 tx_log2, u32 ty_log2), T f32 or bf16; x and dx hold
        // outer·n·inner elements, y and dy outer·inner (checked above).
        let kernel = format!("max_axis_bwd_{}", dx.dtype());
        unsafe { self.launch(&kernel, cfg, &args) }
    }
}

/// A reduction launch: `grid_x × grid_y` blocks of [`REDUCE_THREADS`], static shared memory only.
fn reduce_cfg(grid_x: u32, grid_y: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid_x, grid_y, 1),
        block_dim: (REDUCE_THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}
