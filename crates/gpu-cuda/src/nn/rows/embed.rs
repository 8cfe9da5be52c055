//! Embeddings on CUDA (`kernels/nn_embed.cu`), for [`RowOps`](gpu_core::nn::RowOps); RoPE, the
//! other kernel of that file, is `RowOps::rope` in `rows.rs`.

use super::{grid, to_u32};
use crate::backend::CudaBackend;
use crate::launch::{KernelArg, LaunchConfig};
use crate::pool::CudaBuffer;
use gpu_core::nn::rows::check_embedding;
use gpu_core::nn::IdRows;
use gpu_core::{Backend, DType, Result};

impl CudaBackend {
    /// [`RowOps::embedding_fwd`](gpu_core::nn::RowOps::embedding_fwd): a warp per row.
    pub(in crate::nn) fn embedding_fwd_impl(
        &self,
        x: IdRows<'_, CudaBuffer>,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        let (ids, table, dim) = (x.ids, x.rows, x.dim);
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

    /// [`RowOps::embedding_bwd`](gpu_core::nn::RowOps::embedding_bwd): when ids repeat a lot
    /// (a small vocabulary: a GPT's characters), the tiled sum in a fixed order, the same bits
    /// on every run; else a memset and a warp per row of global atomics, whose order (and so
    /// the last bits of an id's sum over three or more rows) varies from run to run.
    pub(in crate::nn) fn embedding_bwd_impl(
        &self,
        x: IdRows<'_, CudaBuffer>,
        dtable: &mut CudaBuffer,
    ) -> Result<()> {
        let (ids, dout, dim) = (x.ids, x.rows, x.dim);
        const OP: &str = "embedding_bwd";
        let (rows, vocab) = check_embedding(OP, ids, dtable, dout, dim)?;
        if rows == 0 || vocab == 0 {
            return self.memset32(dtable, 0);
        }
        if let Some((tile, tiles)) = embedding_tile(rows, vocab, dim) {
            let sizes = [rows, dim, vocab];
            return self.embedding_bwd_tiled((ids, dout), dtable, sizes, (tile, tiles));
        }
        self.memset32(dtable, 0)?;
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

/// The most floats of the deterministic backward's per-chunk partial tables (64 MiB).
const EMBED_PARTS_MAX: usize = 16 << 20;

impl CudaBackend {
    /// The tiled scatter-add in a fixed order (`embedding_bwd_part_f32`, then
    /// `embedding_bwd_sum_f32`): the same bits on every run. `dtable` is overwritten. `sizes`
    /// are `[rows, dim, vocab]`, `tiling` `(tile, tiles)`.
    fn embedding_bwd_tiled(
        &self,
        (ids, dout): (&CudaBuffer, &CudaBuffer),
        dtable: &mut CudaBuffer,
        [rows, dim, vocab]: [usize; 3],
        (tile, tiles): (usize, usize),
    ) -> Result<()> {
        const OP: &str = "embedding_bwd";
        // About two blocks per SM; at least vocab rows per chunk (so writing a chunk's
        // vocab × tile partial costs no more than reading its rows); at most 65535 chunks
        // (grid.y) and EMBED_PARTS_MAX floats of partials.
        let sms = self.info().multiprocessors.max(1) as usize;
        let table = vocab * dim; // <= rows · dim / 8 (embedding_tile): no overflow
        let chunks = (2 * sms)
            .div_ceil(tiles)
            .min(rows / vocab)
            .min(EMBED_PARTS_MAX / table.max(1))
            .clamp(1, 65_535);
        let chunk = rows.div_ceil(chunks);
        let chunks = rows.div_ceil(chunk);
        let mut parts = self.allocate(DType::F32, chunks * table)?;
        let threads = tile.div_ceil(32) * 32;
        let cfg = LaunchConfig {
            grid_dim: (grid(OP, tiles)?, chunks as u32, 1),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: (vocab * tile * 4) as u32,
        };
        let args = [
            ids.into(),
            dout.into(),
            (&mut parts).into(),
            KernelArg::U64(rows as u64),
            KernelArg::U32(to_u32(OP, "dim", dim)?),
            KernelArg::U32(vocab as u32),
            KernelArg::U32(tile as u32),
            KernelArg::U64(chunk as u64),
        ];
        // SAFETY: embedding_bwd_part_f32(const u32* ids, const float* dout, float* part, u64
        // rows, u32 dim, u32 vocab, u32 tile, u64 chunk): ids hold rows u32, dout rows·dim f32
        // (checked), part chunks·vocab·dim f32 (allocated above); grid.x·tile covers dim,
        // grid.y·chunk covers rows, `threads` >= tile (<= 256), and the block has vocab·tile
        // floats of shared memory (<= 47 KiB by embedding_tile).
        unsafe { self.launch("embedding_bwd_part_f32", cfg, &args) }?;
        let args = [
            (&parts).into(),
            dtable.into(),
            KernelArg::U64(table as u64),
            KernelArg::U32(chunks as u32),
        ];
        // SAFETY: embedding_bwd_sum_f32(const float* part, float* dtable, u64 n, u32 chunks):
        // part holds chunks·n f32 written by the kernel queued before on this stream, dtable
        // n = vocab·dim f32 (checked).
        unsafe { self.launch("embedding_bwd_sum_f32", self.stride_grid(table), &args) }
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
        grid_dim: (grid(op, rows.div_ceil(8))?, 1, 1),
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
