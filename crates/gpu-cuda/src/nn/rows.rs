//! [`RowOps`] on CUDA: the kernels of `kernels/nn_rows.cu` (softmax family, cross-entropy,
//! LayerNorm, RMSNorm) and `kernels/nn_embed.cu` (RoPE, embeddings).
//!
//! Row kernels give each row a *group* of threads: a warp for rows of up to [`WARP_COLS`]
//! columns ([`WARP_ROWS`] rows per block), else a whole block (see the comment at the top of
//! `nn_rows.cu`). Arguments are checked by the same `gpu_core::nn::rows::check_*` functions as on
//! the CPU; bad u32 targets or ids, which only the CPU checks, give NaN on CUDA (see each kernel).

use super::decode::grid;
use crate::backend::CudaBackend;
use crate::launch::{KernelArg, LaunchConfig};
use crate::pool::CudaBuffer;
use gpu_core::nn::rows::{
    check_layernorm_fwd, check_rmsnorm_fwd, check_rope, LayerNormBwdIn, LogitsIn, RmsNormBwdIn,
    RowBwdIn,
};
use gpu_core::nn::RowOps;
use gpu_core::ops::check_rows;
use gpu_core::{Backend, DType, GpuError, Result};

mod embed;

/// Rows of up to this many columns get one warp each; wider rows a block each.
const WARP_COLS: usize = 1024;
/// Rows (warps) per block in warp mode.
const WARP_ROWS: usize = 4;
/// Dynamic shared memory a block may use for its row caches: with the kernels' 256-byte static
/// scratch, a block stays within the 48 KiB every GPU allows without opting in.
const CACHE_BYTES: usize = 47 * 1024;
/// Threads per block of the column-sum kernel (32 columns × 32 slices).
const COLSUM_BLOCK: (u32, u32, u32) = (32, 32, 1);

/// The launch geometry of a row kernel.
struct RowGrid {
    cfg: LaunchConfig,
    /// 1 when each group's row caches (or accumulators) live in shared memory.
    cached: u32,
    rows: u32,
    cols: u32,
}

impl RowGrid {
    /// `blocks` blocks of `groups` groups of `threads` threads, with `smem` bytes of row caches
    /// a block (none: uncached).
    fn new(
        op: &'static str,
        blocks: usize,
        (groups, threads, smem): (usize, u32, u32),
        rows: usize,
        cols: usize,
    ) -> Result<Self> {
        Ok(RowGrid {
            cfg: LaunchConfig {
                grid_dim: (grid(op, blocks)?, 1, 1),
                block_dim: (threads, groups as u32, 1),
                shared_mem_bytes: smem,
            },
            cached: (smem > 0) as u32,
            rows: to_u32(op, "rows", rows)?,
            cols: to_u32(op, "cols", cols)?,
        })
    }

    fn args(&self, cached: bool) -> Vec<KernelArg> {
        let mut v = vec![KernelArg::U32(self.cols), KernelArg::U32(self.rows)];
        if cached {
            v.push(KernelArg::U32(self.cached));
        }
        v
    }
}

fn to_u32(op: &'static str, what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| GpuError::InvalidShape {
        op,
        reason: format!("{what} = {v} does not fit in 32 bits"),
    })
}

impl CudaBackend {
    /// Geometry of a row kernel: groups per block, threads per group, and whether `arrays` rows
    /// of `cols` f32 per group fit in [`CACHE_BYTES`] of shared memory.
    fn row_shape(cols: usize, arrays: usize) -> (usize, u32, u32) {
        let (groups, threads) = if cols <= WARP_COLS {
            (WARP_ROWS, 32)
        } else {
            (
                1,
                cols.div_ceil(16).next_power_of_two().clamp(32, 512) as u32,
            )
        };
        let bytes = groups * arrays * cols * 4;
        let smem = if arrays > 0 && bytes <= CACHE_BYTES {
            bytes as u32
        } else {
            0
        };
        (groups, threads, smem)
    }

    /// One group per row (non-persistent kernels).
    fn row_grid(op: &'static str, rows: usize, cols: usize, arrays: usize) -> Result<RowGrid> {
        let shape = Self::row_shape(cols, arrays);
        RowGrid::new(op, rows.div_ceil(shape.0), shape, rows, cols)
    }

    /// The persistent grid of the norm backward: enough blocks to fill the GPU (about 1024
    /// threads per SM, which the kernels' registers allow), each looping over rows; `arrays` accumulator rows per group. In warp mode the accumulators always fit
    /// in shared memory (4 groups × 2 arrays × 1024 columns × 4 bytes = 32 KiB), which the
    /// kernels require when a block holds more than one group.
    fn norm_bwd_grid(
        &self,
        op: &'static str,
        rows: usize,
        cols: usize,
        arrays: usize,
    ) -> Result<RowGrid> {
        let (groups, threads, smem) = Self::row_shape(cols, arrays);
        debug_assert!(
            groups == 1 || smem > 0,
            "warp mode needs its accumulators cached"
        );
        let sms = self.info().multiprocessors.max(1) as usize;
        let per_sm = if groups > 1 {
            8
        } else {
            (1024 / threads as usize).max(1)
        };
        let blocks = rows.div_ceil(groups).min(sms * per_sm);
        RowGrid::new(op, blocks, (groups, threads, smem), rows, cols)
    }

    /// Sums `partial`'s `[outs.len()][nparts][cols]` slices over `nparts` into each of `outs`.
    fn norm_colsum(
        &self,
        partial: &CudaBuffer,
        outs: &mut [&mut CudaBuffer],
        nparts: u32,
        cols: u32,
    ) -> Result<()> {
        let cfg = LaunchConfig {
            grid_dim: (cols.div_ceil(32), outs.len() as u32, 1),
            block_dim: COLSUM_BLOCK,
            shared_mem_bytes: 0,
        };
        let out1 = outs
            .get(1)
            .map_or(KernelArg::Ptr(0), |b| KernelArg::from(&**b));
        let args = [
            partial.into(),
            KernelArg::from(&*outs[0]),
            out1,
            KernelArg::U32(nparts),
            KernelArg::U32(cols),
        ];
        // SAFETY: norm_colsum_f32(const float* partial, float* out0, float* out1, u32 nparts,
        // u32 cols): partial holds outs.len()·nparts·cols f32 (allocated so by the caller), each
        // out holds cols f32 (checked), and out1 is only used when grid.y == 2.
        unsafe { self.launch("norm_colsum_f32", cfg, &args) }
    }

    /// A norm forward on [`CudaBackend::row_grid`] with one cached row per group:
    /// `kernel(ptrs..., u32 cols, u32 rows, float eps, u32 cached)`. The caller has checked
    /// the buffers and `eps` (`check_layernorm_fwd` / `check_rmsnorm_fwd`).
    ///
    /// # Safety
    /// `kernel` has that signature and `ptrs` hold what it reads and writes for `rows` rows of
    /// `cols` (the caller's SAFETY comment).
    unsafe fn norm_fwd(
        &self,
        (op, kernel): (&'static str, &str),
        ptrs: &[KernelArg],
        (rows, cols): (usize, usize),
        eps: f32,
    ) -> Result<()> {
        if rows == 0 {
            return Ok(());
        }
        let g = Self::row_grid(op, rows, cols, 1)?;
        let tail = [
            KernelArg::U32(g.cols),
            KernelArg::U32(g.rows),
            KernelArg::F32(eps),
            KernelArg::U32(g.cached),
        ];
        let args = [ptrs, &tail[..]].concat();
        // SAFETY: this function's contract.
        unsafe { self.launch(kernel, g.cfg, &args) }
    }

    /// A norm backward on [`CudaBackend::norm_bwd_grid`] with `sums.len()` accumulator rows
    /// per group: `kernel(ptrs..., float* partial, u32 cols, u32 rows, u32 cached)` writes each
    /// block's partial sums of the parameter gradients `sums`, which [`CudaBackend::norm_colsum`]
    /// then adds up into them (zeros for no rows).
    ///
    /// # Safety
    /// `kernel` has that signature and `ptrs` hold what it reads and writes for `rows` rows of
    /// `cols` (the caller's SAFETY comment); `partial` is allocated here with
    /// `sums.len()`·gridDim.x·cols f32.
    unsafe fn norm_bwd(
        &self,
        (op, kernel): (&'static str, &str),
        ptrs: &[KernelArg],
        sums: &mut [&mut CudaBuffer],
        (rows, cols): (usize, usize),
    ) -> Result<()> {
        if rows == 0 {
            // Sums over no rows.
            for sum in sums {
                self.memset32(sum, 0)?;
            }
            return Ok(());
        }
        let g = self.norm_bwd_grid(op, rows, cols, sums.len())?;
        let nparts = g.cfg.grid_dim.0;
        let partial = self.allocate(DType::F32, sums.len() * nparts as usize * cols)?;
        let args = [ptrs, &[(&partial).into()], &g.args(true)[..]].concat();
        // SAFETY: this function's contract.
        unsafe { self.launch(kernel, g.cfg, &args)? };
        self.norm_colsum(&partial, sums, nparts, g.cols)
    }

    /// The forward of softmax or log-softmax, `(op, kernel)` naming which: `kernel(const
    /// float* x, float* out, u32 cols, u32 rows, u32 cached)`, a group of threads a row.
    fn softmax_like_fwd(
        &self,
        (op, kernel): (&'static str, &str),
        x: &CudaBuffer,
        out: &mut CudaBuffer,
        cols: usize,
    ) -> Result<()> {
        let rows = check_rows(op, x, out, cols)?;
        if rows == 0 {
            return Ok(());
        }
        let g = Self::row_grid(op, rows, cols, 1)?;
        let args = [&[x.into(), out.into()], &g.args(true)[..]].concat();
        // SAFETY: kernel is softmax_fwd_f32 or log_softmax_fwd_f32 (the callers), both
        // (const float* x, float* out, u32 cols, u32 rows, u32 cached): x and out hold
        // rows·cols f32 (checked); cols floats of shared memory per group when cached.
        unsafe { self.launch(kernel, g.cfg, &args) }
    }

    /// The backward of softmax or log-softmax from the forward's output `y`, `(op, kernel)`
    /// naming which: `kernel(const float* y, const float* dy, float* dx, u32 cols, u32 rows,
    /// u32 cached)`, a group of threads a row.
    fn softmax_like_bwd(
        &self,
        (op, kernel): (&'static str, &str),
        input: RowBwdIn<'_, CudaBuffer>,
        dx: &mut CudaBuffer,
        cols: usize,
    ) -> Result<()> {
        let rows = input.check(op, dx, cols)?;
        let RowBwdIn { y, dy } = input;
        if rows == 0 {
            return Ok(());
        }
        let g = Self::row_grid(op, rows, cols, 2)?;
        let args = [&[y.into(), dy.into(), dx.into()], &g.args(true)[..]].concat();
        // SAFETY: kernel is softmax_bwd_f32 or log_softmax_bwd_f32 (the callers), both
        // (const float* y, const float* dy, float* dx, u32 cols, u32 rows, u32 cached): all
        // three hold rows·cols f32 (checked); the grid covers `rows` groups and gives each
        // 2·cols floats of shared memory when cached.
        unsafe { self.launch(kernel, g.cfg, &args) }
    }
}

impl RowOps for CudaBackend {
    fn softmax_bwd(
        &self,
        input: RowBwdIn<'_, CudaBuffer>,
        dx: &mut CudaBuffer,
        cols: usize,
    ) -> Result<()> {
        self.softmax_like_bwd(("softmax_bwd", "softmax_bwd_f32"), input, dx, cols)
    }

    fn softmax_fwd(&self, x: &CudaBuffer, out: &mut CudaBuffer, cols: usize) -> Result<()> {
        self.softmax_like_fwd(("softmax_fwd", "softmax_fwd_f32"), x, out, cols)
    }

    fn log_softmax_fwd(&self, x: &CudaBuffer, out: &mut CudaBuffer, cols: usize) -> Result<()> {
        self.softmax_like_fwd(("log_softmax_fwd", "log_softmax_fwd_f32"), x, out, cols)
    }

    fn log_softmax_bwd(
        &self,
        input: RowBwdIn<'_, CudaBuffer>,
        dx: &mut CudaBuffer,
        cols: usize,
    ) -> Result<()> {
        self.softmax_like_bwd(("log_softmax_bwd", "log_softmax_bwd_f32"), input, dx, cols)
    }

    fn cross_entropy_fwd(&self, x: LogitsIn<'_, CudaBuffer>, loss: &mut CudaBuffer) -> Result<()> {
        const OP: &str = "cross_entropy_fwd";
        let rows = x.check(OP, loss, None)?;
        let (logits, targets, cols) = (x.logits, x.targets, x.cols);
        if rows == 0 {
            return Ok(());
        }
        let g = Self::row_grid(OP, rows, cols, 0)?;
        let args = [
            &[logits.into(), targets.into(), loss.into()],
            &g.args(false)[..],
        ]
        .concat();
        // SAFETY: cross_entropy_fwd_f32(const float* logits, const u32* targets, float* loss,
        // u32 cols, u32 rows): logits hold rows·cols f32, targets rows u32, loss rows f32
        // (checked); a target >= cols is not dereferenced (the kernel writes NaN).
        unsafe { self.launch("cross_entropy_fwd_f32", g.cfg, &args) }
    }

    fn cross_entropy_bwd(
        &self,
        x: LogitsIn<'_, CudaBuffer>,
        dloss: &CudaBuffer,
        dlogits: &mut CudaBuffer,
    ) -> Result<()> {
        const OP: &str = "cross_entropy_bwd";
        let rows = x.check(OP, dloss, Some(&*dlogits))?;
        let (logits, targets, cols) = (x.logits, x.targets, x.cols);
        if rows == 0 {
            return Ok(());
        }
        let g = Self::row_grid(OP, rows, cols, 1)?;
        let args = [
            &[logits.into(), targets.into(), dloss.into(), dlogits.into()],
            &g.args(true)[..],
        ]
        .concat();
        // SAFETY: cross_entropy_bwd_f32(const float* logits, const u32* targets, const float*
        // dloss, float* dlogits, u32 cols, u32 rows, u32 cached): logits and dlogits hold
        // rows·cols f32, targets rows u32, dloss rows f32 (checked); cols floats of shared
        // memory per group when cached.
        unsafe { self.launch("cross_entropy_bwd_f32", g.cfg, &args) }
    }

    fn layernorm_fwd(
        &self,
        (x, w, b): (&CudaBuffer, &CudaBuffer, &CudaBuffer),
        (y, mean, rstd): (&mut CudaBuffer, &mut CudaBuffer, &mut CudaBuffer),
        cols: usize,
        eps: f32,
    ) -> Result<()> {
        const OP: &str = "layernorm_fwd";
        let rows = check_layernorm_fwd((x, w, b), (y, mean, rstd), cols, eps)?;
        let ptrs: [KernelArg; 6] = [
            x.into(),
            w.into(),
            b.into(),
            y.into(),
            mean.into(),
            rstd.into(),
        ];
        // SAFETY: layernorm_fwd_f32(const float* x, const float* w, const float* b, float* y,
        // float* mean, float* rstd, u32 cols, u32 rows, float eps, u32 cached): x and y hold
        // rows·cols f32, w and b cols, mean and rstd rows (checked); cols floats of shared
        // memory per group when cached.
        unsafe { self.norm_fwd((OP, "layernorm_fwd_f32"), &ptrs, (rows, cols), eps) }
    }

    fn layernorm_bwd(
        &self,
        input: LayerNormBwdIn<'_, CudaBuffer>,
        (dx, dw, db): (&mut CudaBuffer, &mut CudaBuffer, &mut CudaBuffer),
        cols: usize,
    ) -> Result<()> {
        const OP: &str = "layernorm_bwd";
        let rows = input.check((dx, dw, db), cols)?;
        let LayerNormBwdIn {
            x,
            w,
            mean,
            rstd,
            dy,
        } = input;
        let ptrs: [KernelArg; 6] = [
            x.into(),
            w.into(),
            mean.into(),
            rstd.into(),
            dy.into(),
            dx.into(),
        ];
        // SAFETY: layernorm_bwd_f32(const float* x, const float* w, const float* mean, const
        // float* rstd, const float* dy, float* dx, float* partial, u32 cols, u32 rows, u32
        // cached): x, dy and dx hold rows·cols f32, w cols, mean and rstd rows (checked);
        // partial holds 2·gridDim.x·cols f32; 2·cols floats of shared memory per group when
        // cached, and uncached only with one group per block (norm_bwd_grid).
        unsafe {
            self.norm_bwd(
                (OP, "layernorm_bwd_f32"),
                &ptrs,
                &mut [dw, db],
                (rows, cols),
            )
        }
    }

    fn rmsnorm_fwd(
        &self,
        x: &CudaBuffer,
        w: &CudaBuffer,
        y: &mut CudaBuffer,
        rstd: &mut CudaBuffer,
        cols: usize,
        eps: f32,
    ) -> Result<()> {
        const OP: &str = "rmsnorm_fwd";
        let rows = check_rmsnorm_fwd((x, w), (y, rstd), cols, eps)?;
        let ptrs: [KernelArg; 4] = [x.into(), w.into(), y.into(), rstd.into()];
        // SAFETY: rmsnorm_fwd_f32(const float* x, const float* w, float* y, float* rstd, u32
        // cols, u32 rows, float eps, u32 cached): x and y hold rows·cols f32, w cols, rstd rows
        // (checked); cols floats of shared memory per group when cached.
        unsafe { self.norm_fwd((OP, "rmsnorm_fwd_f32"), &ptrs, (rows, cols), eps) }
    }

    fn rmsnorm_bwd(
        &self,
        input: RmsNormBwdIn<'_, CudaBuffer>,
        (dx, dw): (&mut CudaBuffer, &mut CudaBuffer),
        cols: usize,
    ) -> Result<()> {
        const OP: &str = "rmsnorm_bwd";
        let rows = input.check((dx, dw), cols)?;
        let RmsNormBwdIn { x, w, rstd, dy } = input;
        let ptrs: [KernelArg; 5] = [x.into(), w.into(), rstd.into(), dy.into(), dx.into()];
        // SAFETY: rmsnorm_bwd_f32(const float* x, const float* w, const float* rstd, const
        // float* dy, float* dx, float* partial, u32 cols, u32 rows, u32 cached): x, dy and dx
        // hold rows·cols f32, w cols, rstd rows (checked); partial holds gridDim.x·cols f32;
        // cols floats of shared memory per group when cached, uncached only with one group per
        // block.
        unsafe { self.norm_bwd((OP, "rmsnorm_bwd_f32"), &ptrs, &mut [dw], (rows, cols)) }
    }

    /// `rope_f32`, angles computed once per thread and reused along the `n` axis.
    fn rope(
        &self,
        x: &CudaBuffer,
        out: &mut CudaBuffer,
        [n, t, d]: [usize; 3],
        (base, inverse): (f32, bool),
    ) -> Result<()> {
        const OP: &str = "rope";
        check_rope(x, out, n, t, d, base)?;
        if n == 0 || t == 0 {
            return Ok(());
        }
        let h = d / 2;
        let v = if h.is_multiple_of(4) { 4 } else { 1 };
        let threads = 256usize;
        let bx = grid(OP, (t * (h / v)).div_ceil(threads))?;
        // Enough blocks to fill the GPU; each thread reuses its angles n / grid.y times.
        let target = self.info().multiprocessors.max(1) as usize * 8;
        let by = target.div_ceil(bx as usize).clamp(1, n.min(65_535)) as u32;
        let cfg = LaunchConfig {
            grid_dim: (bx, by, 1),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let args = [
            x.into(),
            out.into(),
            KernelArg::U32(n as u32),
            KernelArg::U32(t as u32),
            KernelArg::U32(d as u32),
            KernelArg::F32(base),
            KernelArg::U32(inverse as u32),
        ];
        // SAFETY: rope_f32(const float* x, float* out, u32 n, u32 t, u32 d, float base, u32
        // inverse): both hold n·t·d f32 (checked, each dim below 2^32); threads past t·d/2/V
        // return, and grid.y only strides over n.
        unsafe { self.launch("rope_f32", cfg, &args) }
    }

    // embedding_fwd / embedding_bwd: the trait's defaults, `gather_rows` / `scatter_add_rows`,
    // which run `embedding_fwd_impl` / `embedding_bwd_impl` (`rows/embed.rs`).
}
