//! [`DecodeOps`] on CUDA: the kernels of `kernels/nn_decode.cu` (and the prefill's tensor-core
//! attention, `kernels/nn_prefill_bf16.cu`). Arguments are checked by the
//! same `gpu_core::nn::decode::check_*` functions as on the CPU. What only the device knows (a
//! row's `slot` past the cache) the kernels cannot report from inside a graph: they skip such
//! writes and attend to nothing past the cache (the CPU refuses the call).

use crate::backend::CudaBackend;
use crate::launch::{KernelArg, LaunchConfig};
use crate::pool::CudaBuffer;
use gpu_core::nn::decode::{
    check_add_rms_norm, check_argmax, check_cache_attention, check_prefill_attention,
    check_rope_append, check_swiglu_packed, CacheAttnIn, DecodeDims, DecodeOps, PrefillIn,
    RopeAppendIn, RopeAppendOut,
};
use gpu_core::{Backend, BufferInfo, DType, GpuError, Result};

/// Slots per attention chunk and threads per attention block of the per-head kernel (`CHUNK`,
/// `ATT_THREADS` in the kernels).
const CHUNK: usize = 256;
const ATT_THREADS: u32 = 128;
/// Slots per chunk and query heads per block of the grouped kernel (`G_CHUNK`, `G_MAX`).
const GROUP_CHUNK: usize = 64;
const GROUP_MAX: usize = 8;
/// The head widths, query rows per block and threads per block of the tensor-core prefill
/// attention (`kernels/nn_prefill_bf16.cu`: `prefill_attn_d{64,128}_bf16`).
const PREFILL_D: [usize; 2] = [64, 128];
const PREFILL_ROWS: usize = 64;
const PREFILL_THREADS: u32 = 128;

/// `f` for f32 storage, `b` for bf16 (the kernels' name suffixes, here and in `quant`).
pub(super) fn tag(dtype: DType) -> char {
    if dtype == DType::BF16 {
        'b'
    } else {
        'f'
    }
}

/// `blocks` as a grid's x extent, or `InvalidShape` past the driver's limit 2^31-1 (shared by
/// the decode, quant, rows and embedding launches).
pub(super) fn grid(op: &'static str, blocks: usize) -> Result<u32> {
    u32::try_from(blocks)
        .ok()
        .filter(|&b| b <= i32::MAX as u32)
        .ok_or_else(|| GpuError::InvalidShape {
            op,
            reason: format!("{blocks} blocks exceed 2^31-1"),
        })
}

fn dims_args(dims: DecodeDims) -> [KernelArg; 5] {
    // Every size is below 2^31 (DecodeDims::check).
    [
        KernelArg::U32(dims.t as u32),
        KernelArg::U32(dims.heads as u32),
        KernelArg::U32(dims.kv_heads as u32),
        KernelArg::U32(dims.d as u32),
        KernelArg::U32(dims.cap as u32),
    ]
}

impl DecodeOps for CudaBackend {
    fn rope_append(
        &self,
        x: RopeAppendIn<'_, CudaBuffer>,
        out: RopeAppendOut<'_, CudaBuffer>,
    ) -> Result<()> {
        const OP: &str = "rope_append";
        check_rope_append(x, &out)?;
        let dims = x.dims;
        let RopeAppendIn {
            qkv,
            inv_freq,
            start,
            slot,
            ..
        } = x;
        let [q_out, k_cache, v_cache] = out.refs();
        self.check_owned(OP, &[qkv, inv_freq, start, slot, q_out, k_cache, v_cache])?;
        if dims.b == 0 || dims.t == 0 {
            return Ok(());
        }
        let name = format!(
            "rope_append_{}{}{}",
            tag(qkv.dtype()),
            tag(q_out.dtype()),
            tag(k_cache.dtype())
        );
        let heads = u32::try_from(dims.heads + dims.kv_heads)
            .ok()
            .filter(|&h| h <= 65_535)
            .ok_or_else(|| GpuError::invalid(OP, "more than 65535 query and key heads"))?;
        let cfg = LaunchConfig {
            grid_dim: (grid(OP, dims.b * dims.t)?, heads, 1),
            block_dim: (64, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut args: Vec<KernelArg> = vec![
            qkv.into(),
            inv_freq.into(),
            KernelArg::U32(u32::from(!inv_freq.is_empty())),
            start.into(),
            slot.into(),
            q_out.into(),
            k_cache.into(),
            v_cache.into(),
        ];
        args.extend(dims_args(dims));
        // SAFETY: rope_append_XYZ(const TI* qkv, const float* inv_freq, u32 rope, const u32*
        // start, const u32* slot, TQ* q_out, TC* kc, TC* vc, u32 t, u32 heads, u32 kvh, u32 d,
        // u32 cap), one block per token of b·t and head of q then k (grid.y = heads + kvh,
        // each block's k head also copying its v head). The checks above give qkv b·t·(heads+2kvh)·d
        // elements of TI, q_out b·t·heads·d of TQ, the caches b·kvh·cap·d of TC, start and
        // slot b u32 and inv_freq d/2 f32 (read only when rope = 1); the kernel writes a cache
        // slot only below cap, so every access is in bounds whatever slot holds. The outputs
        // are distinct &mut buffers, the inputs shared ones (no aliasing).
        unsafe { self.launch(&name, cfg, &args) }
    }

    fn cache_attention(&self, x: CacheAttnIn<'_, CudaBuffer>, out: &mut CudaBuffer) -> Result<()> {
        const OP: &str = "cache_attention";
        check_cache_attention(x, out)?;
        let CacheAttnIn {
            q,
            k_cache,
            v_cache,
            start,
            slot,
            ..
        } = x;
        let (dims, max_end, scale) = (x.dims, x.max_end, x.scale);
        self.check_owned(OP, &[q, k_cache, v_cache, start, slot, out])?;
        let rows = dims.b * dims.t * dims.heads;
        if rows == 0 {
            return Ok(());
        }
        // Head widths that are multiples of 8 take the grouped kernel (16- or 32-byte loads,
        // each key/value row read once per group of query heads); others the per-head one.
        let grouped = dims.d.is_multiple_of(8);
        let chunk = if grouped { GROUP_CHUNK } else { CHUNK };
        let chunks = max_end.div_ceil(chunk).max(1);
        if chunks > 65_535 {
            return Err(GpuError::InvalidShape {
                op: OP,
                reason: format!("{max_end} slots make more than 65535 chunks of {chunk}"),
            });
        }
        let part_len = rows
            .checked_mul(chunks)
            .and_then(|n| n.checked_mul(dims.d + 2))
            .ok_or_else(|| GpuError::InvalidShape {
                op: OP,
                reason: format!("{rows} rows × {chunks} chunks overflow"),
            })?;
        let (kind, grid_dim) = if grouped {
            let group = dims.heads / dims.kv_heads;
            let tokens = grid(OP, dims.b * dims.t * dims.kv_heads)?;
            let z = group.div_ceil(GROUP_MAX) as u32; // <= 2^31 / 8 heads
            ("group", (tokens, chunks as u32, z))
        } else {
            ("chunk", (grid(OP, rows)?, chunks as u32, 1))
        };
        let cfg = LaunchConfig {
            grid_dim,
            block_dim: (ATT_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let part = self.allocate(DType::F32, part_len)?;
        let name = format!(
            "cache_attn_{kind}_{}{}",
            tag(q.dtype()),
            tag(k_cache.dtype())
        );
        let mut args: Vec<KernelArg> = vec![
            q.into(),
            k_cache.into(),
            v_cache.into(),
            start.into(),
            slot.into(),
            (&part).into(),
        ];
        args.extend(dims_args(dims));
        args.push(KernelArg::F32(scale));
        args.push(KernelArg::U32(dims.window_u32()));
        // SAFETY: cache_attn_{chunk,group}_XY(const TQ* q, const TC* kc, const TC* vc, const
        // u32* start, const u32* slot, float* part, u32 t, u32 heads, u32 kvh, u32 d, u32 cap,
        // float scale, u32 window), 128 threads a block (the window only narrows the slots a
        // block reads): q holds rows·d of TQ, the caches b·kvh·cap·d of TC
        // (checked above); the kernels read cache slots below cap only and write
        // part[(row·chunks + chunk)·(d+2) ..+ d+2] for their rows, which part_len covers. The
        // chunk kernel: rows × chunks blocks, d <= 256 fits qs[256]. The group kernel: one
        // block per (token·kv head, chunk, group of <= 8 query heads); d % 8 == 0, so its 8-wide
        // loads at row offsets of 256-byte-aligned buffers are aligned; 8·d <= 2048 fits qs.
        unsafe { self.launch(&name, cfg, &args)? };
        let combine = LaunchConfig {
            grid_dim: (grid(OP, rows)?, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let args = [
            (&part).into(),
            (&*out).into(),
            KernelArg::U32(dims.d as u32),
            KernelArg::U32(chunks as u32),
        ];
        let name = format!("cache_attn_combine_{}", tag(out.dtype()));
        // SAFETY: cache_attn_combine_X(const float* part, TO* o, u32 d, u32 nchunks), one block
        // per row: reads the rows·chunks·(d+2) partials written above (same stream, in order)
        // and writes rows·d elements of out (its checked length). The workspace is dropped after
        // the launch is queued: whatever reuses its block runs later on the same stream (every
        // op of the backend is queued on one stream, in order), as for every op's temporaries.
        unsafe { self.launch(&name, combine, &args) }
    }

    fn prefill_attention(&self, x: PrefillIn<'_, CudaBuffer>, out: &mut CudaBuffer) -> Result<()> {
        const OP: &str = "prefill_attention";
        check_prefill_attention(x, out)?;
        let PrefillIn {
            q,
            k_cache,
            v_cache,
            start,
            ..
        } = x;
        let (dims, scale) = (x.dims, x.scale);
        self.check_owned(OP, &[q, k_cache, v_cache, start, out])?;
        let bf16 = [q.dtype(), k_cache.dtype(), out.dtype()] == [DType::BF16; 3];
        if !bf16 || !PREFILL_D.contains(&dims.d) {
            // Slots 0..t: the cache attention with every row at slot 0.
            let mut slot = self.allocate(DType::U32, dims.b)?;
            self.memset32(&mut slot, 0)?;
            return self.cache_attention(x.as_cache(&slot), out);
        }
        if dims.b * dims.t * dims.heads == 0 {
            return Ok(());
        }
        let blocks = dims.b * dims.heads * dims.t.div_ceil(PREFILL_ROWS);
        let cfg = LaunchConfig {
            grid_dim: (grid(OP, blocks)?, 1, 1),
            block_dim: (PREFILL_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let args = [
            q.into(),
            k_cache.into(),
            v_cache.into(),
            start.into(),
            (&*out).into(),
            KernelArg::U32(dims.t as u32),
            KernelArg::U32(dims.heads as u32),
            KernelArg::U32(dims.kv_heads as u32),
            KernelArg::U32(dims.cap as u32),
            KernelArg::F32(scale),
            KernelArg::U32(dims.window_u32()),
        ];
        let name = format!("prefill_attn_d{}_bf16", dims.d);
        // SAFETY: prefill_attn_dD_bf16(const bf16* q, const bf16* kc, const bf16* vc,
        // const u32* start, bf16* out, u32 t, u32 heads, u32 kvh, u32 cap, float scale, u32
        // window; it only narrows the key tiles read), D =
        // dims.d (64 or 128, checked above), over b·heads·ceil(t/64) blocks of 128 threads (the
        // kernel derives b·heads from the grid and t). q and out hold b·t·heads·D bf16, the
        // caches b·kvh·cap·D bf16 and start b u32 (checked above); the kernel reads cache slots
        // below t <= cap only (max_end = t was checked against cap), and its rows are 2·D bytes
        // (caches) or heads·2·D bytes (q, out) apart from 256-byte-aligned pool bases: its
        // 16-byte accesses are aligned. Static shared memory only (40 or 48 KiB). out is
        // distinct (&mut) and written only.
        unsafe { self.launch(&name, cfg, &args) }
    }

    fn add_rms_norm(
        &self,
        (x, y, w): (&CudaBuffer, Option<&CudaBuffer>, &CudaBuffer),
        (sum, normed): (&mut CudaBuffer, &mut CudaBuffer),
        cols: usize,
        eps: f32,
    ) -> Result<()> {
        const OP: &str = "add_rms_norm";
        let rows = check_add_rms_norm(x, y, w, sum, normed, cols, eps)?;
        let mut owned = vec![x, w, &*sum, &*normed];
        owned.extend(y);
        self.check_owned(OP, &owned)?;
        if rows == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (grid(OP, rows)?, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // No y: the f32 kernel with a null y (it skips the add).
        let (y_arg, y_tag) = match y {
            Some(y) => (y.into(), tag(y.dtype())),
            None => (KernelArg::Ptr(0), 'f'),
        };
        let args = [
            x.into(),
            y_arg,
            w.into(),
            (&*sum).into(),
            (&*normed).into(),
            KernelArg::U32(cols as u32),
            KernelArg::F32(eps),
        ];
        let name = format!("add_rms_norm_{y_tag}{}", tag(normed.dtype()));
        // SAFETY: add_rms_norm_YO(const float* x, const TY* y, const float* w, float* sum, TO*
        // normed, u32 cols, float eps), one block of 256 threads per row: x, sum and normed hold
        // rows·cols elements, y (when not null) rows·cols of TY, w cols f32
        // (check_add_rms_norm); each block touches its row only; sum and normed are distinct
        // &mut buffers from the inputs.
        unsafe { self.launch(&name, cfg, &args) }
    }

    fn swiglu_packed(&self, gu: &CudaBuffer, out: &mut CudaBuffer, i: usize) -> Result<()> {
        const OP: &str = "swiglu_packed";
        let rows = check_swiglu_packed(gu, out, i)?;
        self.check_owned(OP, &[gu, out])?;
        if rows == 0 {
            return Ok(());
        }
        let blocks = (rows * i).div_ceil(256).min(4096);
        let cfg = LaunchConfig {
            grid_dim: (grid(OP, blocks)?, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let args = [
            gu.into(),
            (&*out).into(),
            KernelArg::U32(rows as u32),
            KernelArg::U32(i as u32),
        ];
        let name = format!("swiglu_packed_{}{}", tag(gu.dtype()), tag(out.dtype()));
        // SAFETY: swiglu_packed_IO(const TI* gu, TO* out, u32 rows, u32 i), grid-stride over
        // rows·i < 2^31 (check_swiglu_packed): gu holds rows·2i elements of TI, out rows·i of
        // TO; out is a distinct &mut buffer.
        unsafe { self.launch(&name, cfg, &args) }
    }
}

impl CudaBackend {
    pub(crate) fn argmax_rows_impl(
        &self,
        x: &CudaBuffer,
        out: &mut CudaBuffer,
        cols: usize,
    ) -> Result<()> {
        const OP: &str = "argmax_rows";
        let rows = check_argmax(x, out, cols)?;
        self.check_owned(OP, &[x, out])?;
        if rows == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (grid(OP, rows)?, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        let args = [x.into(), (&*out).into(), KernelArg::U32(cols as u32)];
        let name = format!("argmax_rows_{}", tag(x.dtype()));
        // SAFETY: argmax_rows_X(const T* x, u32* out, u32 cols), one block of 1024 threads per
        // row: x holds rows·cols elements and out rows u32 (check_argmax; cols < 2^31).
        unsafe { self.launch(&name, cfg, &args) }
    }
}
