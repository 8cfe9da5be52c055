//! RoPE and embeddings on CUDA (`kernels/nn_embed.cu`), for [`RowOps`](gpu_core::nn::RowOps).

use super::{to_grid, to_u32};
use crate::backend::CudaBackend;
use crate::launch::{KernelArg, LaunchConfig};
use crate::pool::CudaBuffer;
use gpu_core::nn::rows::{check_embedding, check_rope};
use gpu_core::Result;

impl CudaBackend {
    /// [`RowOps::rope`](gpu_core::nn::RowOps::rope): `rope_f32`, angles computed once per
    /// thread and reused along the `n` axis.
    pub(super) fn rope_impl(
        &self,
        x: &CudaBuffer,
        out: &mut CudaBuffer,
        n: usize,
        t: usize,
        d: usize,
        base: f32,
        inverse: bool,
    ) -> Result<()> {
        const OP: &str = "rope";
        check_rope(x, out, n, t, d, base)?;
        if n == 0 || t == 0 {
            return Ok(());
        }
        let h = d / 2;
        let v = if h.is_multiple_of(4) { 4 } else { 1 };
        let threads = 256usize;
        let bx = to_grid(OP, (t * (h / v)).div_ceil(threads))?;
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

    /// [`RowOps::embedding_fwd`](gpu_core::nn::RowOps::embedding_fwd): a warp per row.
    pub(super) fn embedding_fwd_impl(
        &self,
        ids: &CudaBuffer,
        table: &CudaBuffer,
        out: &mut CudaBuffer,
        dim: usize,
    ) -> Result<()> {
        const OP: &str = "embedding_fwd";
        let (rows, vocab) = check_embedding(OP, ids, table, out, dim)?;
        if rows == 0 {
            return Ok(());
        }
        let (cfg, args) =
            embedding_launch(OP, rows, dim, vocab, [ids.into(), table.into(), out.into()])?;
        // SAFETY: embedding_fwd_f32(const u32* ids, const float* table, float* out, u64 rows,
        // u32 dim, u64 vocab): ids hold rows u32, table vocab·dim f32, out rows·dim f32
        // (checked); rows past the end return and ids >= vocab are not dereferenced.
        unsafe { self.launch("embedding_fwd_f32", cfg, &args) }
    }

    /// [`RowOps::embedding_bwd`](gpu_core::nn::RowOps::embedding_bwd): memset, then the tiled
    /// shared-memory scatter when ids repeat a lot, else a warp per row of global atomics.
    pub(super) fn embedding_bwd_impl(
        &self,
        ids: &CudaBuffer,
        dout: &CudaBuffer,
        dtable: &mut CudaBuffer,
        dim: usize,
    ) -> Result<()> {
        const OP: &str = "embedding_bwd";
        let (rows, vocab) = check_embedding(OP, ids, dtable, dout, dim)?;
        self.memset32(dtable, 0)?;
        if rows == 0 || vocab == 0 {
            return Ok(());
        }
        if let Some((tile, tiles)) = embedding_tile(rows, vocab, dim)
            .filter(|&(tile, _)| rows.saturating_mul(tile).div_ceil(1 << 31) <= 65_535)
        {
            return self.embedding_bwd_tiled(ids, dout, dtable, rows, dim, vocab, tile, tiles);
        }
        let (cfg, args) = embedding_launch(
            OP,
            rows,
            dim,
            vocab,
            [ids.into(), dout.into(), dtable.into()],
        )?;
        // SAFETY: embedding_bwd_f32(const u32* ids, const float* dout, float* dtable, u64 rows,
        // u32 dim, u64 vocab): ids hold rows u32, dout rows·dim f32, dtable vocab·dim f32
        // (checked, zeroed above on the same stream); ids >= vocab are skipped.
        unsafe { self.launch("embedding_bwd_f32", cfg, &args) }
    }
}

/// Shared memory for the tiled embedding backward's `vocab × tile` accumulators.
const EMBED_TILE_BYTES: usize = 47 * 1024;

/// `(tile, column tiles)` of the tiled embedding backward, used when ids repeat a lot (at least
/// 8 rows per id) and a `vocab × 32` slice fits in shared memory; the tile is the widest multiple
/// of 32 columns (up to 256, or the whole row) that fits.
fn embedding_tile(rows: usize, vocab: usize, dim: usize) -> Option<(usize, usize)> {
    let fit = EMBED_TILE_BYTES / 4 / vocab.max(1);
    if rows < 8 * vocab || fit < 32 {
        return None;
    }
    let tile = if dim <= fit.min(256) {
        dim
    } else {
        fit.min(256) / 32 * 32
    };
    Some((tile, dim.div_ceil(tile)))
}

impl CudaBackend {
    /// The tiled scatter-add (`embedding_bwd_tiled_f32`) into a zeroed `dtable`.
    fn embedding_bwd_tiled(
        &self,
        ids: &CudaBuffer,
        dout: &CudaBuffer,
        dtable: &mut CudaBuffer,
        rows: usize,
        dim: usize,
        vocab: usize,
        tile: usize,
        tiles: usize,
    ) -> Result<()> {
        const OP: &str = "embedding_bwd";
        // About two blocks per SM, but at least 4·vocab rows per block, so the flush (one
        // global atomic per id and column per block) stays well below one per input element.
        // The kernel indexes a chunk's elements in 32 bits: chunk·tile < 2^32.
        let sms = self.info().multiprocessors.max(1) as usize;
        let chunks = (rows / (4 * vocab))
            .min((2 * sms).div_ceil(tiles))
            .max((rows * tile).div_ceil(1 << 31)) // <= 65535: checked by the caller
            .max(1);
        let chunk = rows.div_ceil(chunks);
        let cfg = LaunchConfig {
            grid_dim: (to_grid(OP, tiles)?, rows.div_ceil(chunk) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: (vocab * tile * 4) as u32,
        };
        let args = [
            ids.into(),
            dout.into(),
            dtable.into(),
            KernelArg::U64(rows as u64),
            KernelArg::U32(to_u32(OP, "dim", dim)?),
            KernelArg::U32(vocab as u32),
            KernelArg::U32(tile as u32),
            KernelArg::U64(chunk as u64),
        ];
        // SAFETY: embedding_bwd_tiled_f32(const u32* ids, const float* dout, float* dtable, u64
        // rows, u32 dim, u32 vocab, u32 tile, u64 chunk): ids hold rows u32, dout rows·dim f32,
        // dtable vocab·dim f32 (checked, zeroed on the same stream); grid.x·tile covers dim,
        // grid.y·chunk covers rows, and the block has vocab·tile floats of shared memory
        // (<= 47 KiB by embedding_tile, so vocab < 2^32).
        unsafe { self.launch("embedding_bwd_tiled_f32", cfg, &args) }
    }
}

/// A warp per row, 8 rows per block.
fn embedding_launch(
    op: &'static str,
    rows: usize,
    dim: usize,
    vocab: usize,
    bufs: [KernelArg; 3],
) -> Result<(LaunchConfig, Vec<KernelArg>)> {
    let cfg = LaunchConfig {
        grid_dim: (to_grid(op, rows.div_ceil(8))?, 1, 1),
        block_dim: (32, 8, 1),
        shared_mem_bytes: 0,
    };
    let mut args = bufs.to_vec();
    args.extend([
        KernelArg::U64(rows as u64),
        KernelArg::U32(to_u32(op, "dim", dim)?),
        KernelArg::U64(vocab as u64),
    ]);
    Ok((cfg, args))
}
