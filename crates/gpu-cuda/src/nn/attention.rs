//! [`AttentionOps`] on CUDA: the flash-attention kernels of `kernels/nn_attention.cu`.
//! Forward: one launch. Backward: `attn_bwd_dq_*` (which also writes the per-row
//! `delta = Σ dout ∘ out` into a pooled scratch buffer) then `attn_bwd_dkdv_*`.

use crate::backend::CudaBackend;
use crate::launch::{KernelArg, LaunchConfig};
use crate::pool::CudaBuffer;
use gpu_core::nn::attention::{check_bwd, check_fwd, AttentionOps};
use gpu_core::{Backend, DType, GpuError, Result};

/// A kernel and its tile: `rows` rows of the sequence per block, `threads` threads per block.
struct Tile {
    kernel: &'static str,
    rows: usize,
    threads: u32,
}

/// The kernel for head dimension `d` (d <= 64 runs the 64-wide kernels, else the 128-wide).
fn pick(d: usize, narrow: Tile, wide: Tile) -> Tile {
    if d <= 64 {
        narrow
    } else {
        wide
    }
}

/// One block per (sequence, tile of `tile.rows` rows).
fn config(op: &'static str, n: usize, t: usize, tile: &Tile) -> Result<LaunchConfig> {
    let blocks = n
        .checked_mul(t.div_ceil(tile.rows))
        .filter(|&b| b <= i32::MAX as usize)
        .ok_or_else(|| GpuError::InvalidShape {
            op,
            reason: format!("n·ceil(t/{}) blocks exceed 2^31-1", tile.rows),
        })?;
    Ok(LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (tile.threads, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// `n`, `t`, `d` and `scale` as kernel arguments (n < 2^31 once `config` accepted the grid;
/// t <= 2^30 and d <= 128 by the shared checks).
fn dims(n: usize, t: usize, d: usize, scale: f32) -> [KernelArg; 4] {
    [
        KernelArg::U32(n as u32),
        KernelArg::U32(t as u32),
        KernelArg::U32(d as u32),
        KernelArg::F32(scale),
    ]
}

impl AttentionOps for CudaBackend {
    fn causal_attention_fwd(
        &self,
        q: &CudaBuffer,
        k: &CudaBuffer,
        v: &CudaBuffer,
        out: &mut CudaBuffer,
        lse: &mut CudaBuffer,
        n: usize,
        t: usize,
        d: usize,
        scale: f32,
    ) -> Result<()> {
        const OP: &str = "causal_attention_fwd";
        check_fwd(q, k, v, out, lse, n, t, d, scale)?;
        if n == 0 || t == 0 {
            return Ok(());
        }
        let tile = pick(
            d,
            Tile {
                kernel: "attn_fwd_d64_f32",
                rows: 64,
                threads: 256,
            },
            Tile {
                kernel: "attn_fwd_d128_f32",
                rows: 32,
                threads: 128,
            },
        );
        let cfg = config(OP, n, t, &tile)?;
        let mut args = vec![q.into(), k.into(), v.into(), out.into(), lse.into()];
        args.extend(dims(n, t, d, scale));
        // SAFETY: attn_fwd_d{64,128}_f32(const float* q, const float* k, const float* v,
        // float* out, float* lse, u32 n, u32 t, u32 d, float scale) over n·ceil(t/rows) blocks of
        // `threads` threads (the kernel's tile); q, k, v, out hold n·t·d f32 and lse n·t
        // (check_fwd), all 256-byte aligned pool blocks, and d % 4 == 0 keeps every row 16-byte
        // aligned for the float4 accesses; static shared memory only (<= 48 KiB).
        unsafe { self.launch(tile.kernel, cfg, &args) }
    }

    fn causal_attention_bwd(
        &self,
        q: &CudaBuffer,
        k: &CudaBuffer,
        v: &CudaBuffer,
        out: &CudaBuffer,
        lse: &CudaBuffer,
        dout: &CudaBuffer,
        dq: &mut CudaBuffer,
        dk: &mut CudaBuffer,
        dv: &mut CudaBuffer,
        n: usize,
        t: usize,
        d: usize,
        scale: f32,
    ) -> Result<()> {
        const OP: &str = "causal_attention_bwd";
        check_bwd(q, k, v, out, lse, dout, dq, dk, dv, n, t, d, scale)?;
        if n == 0 || t == 0 {
            return Ok(());
        }
        let dq_tile = pick(
            d,
            Tile {
                kernel: "attn_bwd_dq_d64_f32",
                rows: 32,
                threads: 128,
            },
            Tile {
                kernel: "attn_bwd_dq_d128_f32",
                rows: 16,
                threads: 64,
            },
        );
        let dkdv_tile = pick(
            d,
            Tile {
                kernel: "attn_bwd_dkdv_d64_f32",
                rows: 32,
                threads: 128,
            },
            Tile {
                kernel: "attn_bwd_dkdv_d128_f32",
                rows: 16,
                threads: 64,
            },
        );
        let dq_cfg = config(OP, n, t, &dq_tile)?;
        let dkdv_cfg = config(OP, n, t, &dkdv_tile)?;
        // Returned to the pool on drop; later work reusing it is queued behind both kernels.
        let mut delta = self.allocate(DType::F32, n * t)?;

        let mut args = vec![
            q.into(),
            k.into(),
            v.into(),
            out.into(),
            lse.into(),
            dout.into(),
            dq.into(),
            (&mut delta).into(),
        ];
        args.extend(dims(n, t, d, scale));
        // SAFETY: attn_bwd_dq_d{64,128}_f32(const float* q, k, v, out, lse, dout, float* dq,
        // float* delta, u32 n, u32 t, u32 d, float scale) over n·ceil(t/rows) blocks of
        // `threads` threads; every [n, t, d] buffer holds n·t·d f32 and lse, delta hold n·t
        // (check_bwd, allocation above); 256-byte aligned pool blocks, rows 16-byte aligned
        // (d % 4 == 0).
        unsafe { self.launch(dq_tile.kernel, dq_cfg, &args) }?;

        let mut args = vec![
            q.into(),
            k.into(),
            v.into(),
            lse.into(),
            dout.into(),
            (&delta).into(),
            dk.into(),
            dv.into(),
        ];
        args.extend(dims(n, t, d, scale));
        // SAFETY: attn_bwd_dkdv_d{64,128}_f32(const float* q, k, v, lse, dout, delta,
        // float* dk, float* dv, u32 n, u32 t, u32 d, float scale) over n·ceil(t/rows) blocks;
        // sizes and alignment as above; delta was written by the dq kernel queued before this
        // one on the same stream.
        unsafe { self.launch(dkdv_tile.kernel, dkdv_cfg, &args) }
    }
}
