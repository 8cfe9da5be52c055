//! [`DecodeOps`] for [`WgpuBackend`]: the rotary embedding with its cache writes, the
//! attention of new queries against the cache (decode and prefill), the residual add with its
//! RMSNorm and the packed SwiGLU as f32 kernels; bf16 goes through gpu-core's defaults (the
//! attention's through the host, the others composed from primitives). As CUDA's kernels, and unlike the CPU, these cannot refuse
//! a slot past the cache (that would take a read-back): they skip such writes and attend to
//! nothing past the cache; callers check the slots on the host, as `models::engine` does.

use crate::backend::WgpuBackend;
use crate::buffer::WgpuBuffer;
use crate::kernels::{params, row_src, src, thread_src, to_u32};
use crate::shaders::{
    ACTIVATION, ADD_RMS_NORM, CACHE_ATTN, CACHE_COMBINE, CACHE_SPAN, PREFILL_ATTN, ROPE_APPEND,
    SWIGLU, WG_SUM64,
};
use gpu_core::backend::BufferInfo;
use gpu_core::nn::decode::{
    check_add_rms_norm, check_cache_attention, check_prefill_attention, check_rope_append,
    check_swiglu_packed, CacheAttnIn, DecodeDims, DecodeOps, PrefillIn, RopeAppendIn,
    RopeAppendOut,
};
use gpu_core::nn::defaults;
use gpu_core::{Backend, DType, Result};

type Buf = WgpuBuffer;

fn all_f32(bufs: &[&Buf]) -> bool {
    bufs.iter().all(|b| b.dtype() == DType::F32)
}

/// Workgroups a decode attention aims for (queries × splits): enough to fill a large GPU.
const SPLIT_GROUPS: usize = 1024;

/// `d + 512·kv_heads + 2^26·lg`, a parameter word of `cache_attn.wgsl`; 2^17 key/value heads
/// or more are refused.
fn packed_heads(op: &'static str, dims: DecodeDims, lg: u32) -> Result<u32> {
    if dims.kv_heads >= 1 << 17 {
        return Err(gpu_core::GpuError::Unsupported {
            op,
            reason: format!("{} key/value heads (at most 2^17 - 1 here)", dims.kv_heads),
        });
    }
    Ok((dims.d + 512 * dims.kv_heads) as u32 | lg << 26)
}

/// How `cache_attn.wgsl` splits the slots below `max_end` for `rows` queries: `(lg, splits)`,
/// splits of `64·2^lg` slots, about [`SPLIT_GROUPS`] workgroups in all (one split where the
/// queries alone are that many).
fn split_slots(rows: usize, max_end: usize) -> (u32, usize) {
    let chunks = max_end.div_ceil(64).max(1);
    let want = SPLIT_GROUPS.div_ceil(rows).clamp(1, chunks);
    let lg = chunks.div_ceil(want).next_power_of_two().trailing_zeros();
    (lg, chunks.div_ceil(1 << lg))
}

/// Slots a chunk of `prefill_attn.wgsl` stages for head width `d`: keys and values of
/// `C·d ≤ 2047` floats each, so that they and the kernel's 8-byte span fit in 16 KiB of
/// workgroup memory (WebGPU's least).
fn prefill_chunk(d: usize) -> usize {
    (2047 / d).clamp(1, 64)
}

impl WgpuBackend {
    /// `cache_attn.wgsl` over splits of the slots, then `cache_combine.wgsl` (checked).
    fn cache_attn_f32(&self, x: CacheAttnIn<'_, Buf>, out: &mut Buf) -> Result<()> {
        const OP: &str = "cache_attention";
        let (dims, max_end, scale) = (x.dims, x.max_end, x.scale);
        let rows = dims.b * dims.t * dims.heads;
        if rows == 0 {
            return Ok(());
        }
        let (lg, splits) = split_slots(rows, max_end);
        let mut p = params(OP, &[rows, dims.t, dims.heads])?;
        p[3] = packed_heads(OP, dims, lg)?;
        p[4] = to_u32(OP, dims.cap)?;
        (p[5], p[6]) = (dims.window_u32(), scale.to_bits());
        let part = self.allocate(DType::F32, splits * rows * (dims.d + 2))?;
        let (gx, gy) = self.grid(OP, to_u32(OP, rows)?)?;
        let z = to_u32(OP, splits)?;
        if z > self.info().limits.max_compute_workgroups_per_dimension {
            return Err(gpu_core::GpuError::Unsupported {
                op: OP,
                reason: format!("{splits} splits of the slots exceed the device's grid"),
            });
        }
        let bufs = [
            x.q.raw(),
            x.k_cache.raw(),
            x.v_cache.raw(),
            x.start.raw(),
            x.slot.raw(),
            part.raw(),
        ];
        let body = || src(&format!("{WG_SUM64}{CACHE_SPAN}{CACHE_ATTN}"));
        self.launch(OP, ("cache_attn", body), p, (gx, (gx, gy, z)), &bufs)?;
        p[3] = dims.d as u32 | lg << 26;
        let bufs = [x.start.raw(), x.slot.raw(), part.raw(), out.raw()];
        let body = || row_src(64, &format!("{CACHE_SPAN}{CACHE_COMBINE}"));
        self.launch(OP, ("cache_combine", body), p, (gx, (gx, gy, 1)), &bufs)
    }

    /// `prefill_attn.wgsl` (checked): a workgroup 64 queries of a (row, head).
    fn prefill_attn_f32(&self, x: PrefillIn<'_, Buf>, out: &mut Buf) -> Result<()> {
        const OP: &str = "prefill_attention";
        let (dims, scale) = (x.dims, x.scale);
        let groups = dims.b * dims.heads * dims.t.div_ceil(64);
        if groups == 0 {
            return Ok(());
        }
        let mut p = params(OP, &[groups, dims.t, dims.heads, dims.kv_heads, dims.cap])?;
        (p[5], p[6]) = (dims.window_u32(), scale.to_bits());
        let (d, c) = (dims.d, prefill_chunk(dims.d));
        let (gx, gy) = self.grid(OP, to_u32(OP, groups)?)?;
        let bufs = [
            x.q.raw(),
            x.k_cache.raw(),
            x.v_cache.raw(),
            x.start.raw(),
            out.raw(),
        ];
        let key = format!("prefill_attn d{d}");
        let body = || {
            row_src(
                64,
                &format!("const D: u32 = {d}u;\nconst C: u32 = {c}u;\n{PREFILL_ATTN}"),
            )
        };
        self.launch(OP, (&key, body), p, (gx, (gx, gy, 1)), &bufs)
    }
}

impl DecodeOps for WgpuBackend {
    /// f32: one kernel, a thread a rotated pair or a copied value (bf16: the default).
    fn rope_append(&self, x: RopeAppendIn<'_, Buf>, out: RopeAppendOut<'_, Buf>) -> Result<()> {
        const OP: &str = "rope_append";
        check_rope_append(x, &out)?;
        let dims = x.dims;
        self.check_out(OP, &[x.qkv, x.inv_freq, x.start, x.slot])?;
        self.check_out(OP, &out.refs())?;
        if !all_f32(&[x.qkv, out.q_out, out.k_cache]) {
            return defaults::decode::rope_append(self, x, out);
        }
        let [q_out, k_cache, v_cache] = out.refs();
        let half = dims.d / 2;
        let per = (dims.heads + dims.kv_heads) * half + dims.kv_heads * dims.d;
        let threads = dims.b * dims.t * per;
        let mut p = params(
            OP,
            &[threads, dims.t, dims.heads, dims.kv_heads, dims.d, dims.cap],
        )?;
        p[6] = u32::from(!x.inv_freq.is_empty());
        let bufs = [
            x.qkv.raw(),
            x.inv_freq.raw(),
            x.start.raw(),
            x.slot.raw(),
            q_out.raw(),
            k_cache.raw(),
            v_cache.raw(),
        ];
        self.launch_1d(OP, OP, || thread_src(ROPE_APPEND), p, threads, &bufs)
    }

    /// f32: the slots split over workgroups, then the splits combined (bf16: the default).
    fn cache_attention(&self, x: CacheAttnIn<'_, Buf>, out: &mut Buf) -> Result<()> {
        const OP: &str = "cache_attention";
        check_cache_attention(x, out)?;
        self.check_out(OP, &[x.q, x.k_cache, x.v_cache, x.start, x.slot, out])?;
        if !all_f32(&[x.q, x.k_cache, out]) {
            return defaults::decode::cache_attention(self, x, out);
        }
        self.cache_attn_f32(x, out)
    }

    /// f32: flash-style, a workgroup 64 queries at slots `0..t` (bf16: the default).
    fn prefill_attention(&self, x: PrefillIn<'_, Buf>, out: &mut Buf) -> Result<()> {
        const OP: &str = "prefill_attention";
        check_prefill_attention(x, out)?;
        self.check_out(OP, &[x.q, x.k_cache, x.v_cache, x.start, out])?;
        if !all_f32(&[x.q, x.k_cache, out]) {
            return defaults::decode::prefill_attention(self, x, out);
        }
        self.prefill_attn_f32(x, out)
    }

    /// f32: one row kernel (the default: an add, a cast and RMSNorm's chain).
    fn add_rms_norm(
        &self,
        (x, y, w): (&Buf, Option<&Buf>, &Buf),
        (sum, normed): (&mut Buf, &mut Buf),
        cols: usize,
        eps: f32,
    ) -> Result<()> {
        const OP: &str = "add_rms_norm";
        let rows = check_add_rms_norm(x, y, w, sum, normed, cols, eps)?;
        self.check_out(OP, &[x, y.unwrap_or(x), w, sum, normed])?;
        if !all_f32(&[y.unwrap_or(x), normed]) {
            return defaults::rows::add_rms_norm(self, (x, y, w), (sum, normed), cols, eps);
        }
        let has_y = u32::from(y.is_some());
        let mut p = params(OP, &[rows, cols])?;
        (p[2], p[3]) = (has_y, eps.to_bits());
        let (gx, gy) = self.grid(OP, to_u32(OP, rows)?)?;
        let bufs = [
            x.raw(),
            y.unwrap_or(x).raw(),
            w.raw(),
            sum.raw(),
            normed.raw(),
        ];
        let body = || row_src(256, ADD_RMS_NORM);
        self.launch(OP, (OP, body), p, (gx, (gx, gy, 1)), &bufs)
    }

    /// f32: one elementwise kernel (the default: two block copies, the activation, a product).
    fn swiglu_packed(&self, gu: &Buf, out: &mut Buf, i: usize) -> Result<()> {
        const OP: &str = "swiglu_packed";
        check_swiglu_packed(gu, out, i)?;
        self.check_out(OP, &[gu, out])?;
        if !all_f32(&[gu, out]) {
            return defaults::rows::swiglu_packed(self, gu, out, i);
        }
        let p = params(OP, &[out.len(), i])?;
        let body = || thread_src(&format!("{ACTIVATION}{SWIGLU}"));
        self.launch_1d(OP, OP, body, p, out.len(), &[gu.raw(), out.raw()])
    }
}

#[cfg(test)]
mod tests {
    use super::{prefill_chunk, split_slots, SPLIT_GROUPS};

    /// The prefill's staged keys and values and its span fit WebGPU's least workgroup memory
    /// (16 KiB) for every head width the op accepts.
    #[test]
    fn prefill_chunks_fit_16_kib() {
        for d in 1..=gpu_core::nn::decode::MAX_DECODE_HEAD_DIM {
            let c = prefill_chunk(d);
            assert!((1..=64).contains(&c), "d {d}: chunk {c}");
            assert!(
                2 * c * d * 4 + 8 <= 16384,
                "d {d}: chunk {c} overflows 16 KiB"
            );
        }
    }

    /// The splits cover every slot below `max_end`, none of them empty of slots, and the
    /// workgroups stay near the target unless the queries alone exceed it.
    #[test]
    fn splits_cover_the_slots() {
        for rows in [1, 3, 32, 512, 1024, 5000] {
            for max_end in [1, 63, 64, 65, 513, 2080, 131_080, 1 << 22] {
                let (lg, splits) = split_slots(rows, max_end);
                let span = 64usize << lg;
                assert!(splits * span >= max_end, "{rows} rows, end {max_end}");
                assert!(
                    (splits - 1) * span < max_end,
                    "{rows} rows, end {max_end}: empty split"
                );
                assert!(
                    splits <= 65_535,
                    "{rows} rows, end {max_end}: {splits} splits"
                );
                if rows < SPLIT_GROUPS {
                    assert!(
                        rows * splits <= 2 * SPLIT_GROUPS,
                        "{rows} rows, end {max_end}"
                    );
                } else {
                    assert_eq!(splits, 1, "{rows} rows, end {max_end}");
                }
            }
        }
    }
}
