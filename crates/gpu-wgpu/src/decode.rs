//! [`DecodeOps`] for [`WgpuBackend`]: the rotary embedding with its cache writes, the
//! attention of new queries against the cache (decode and prefill), the residual add with its
//! RMSNorm and the packed SwiGLU as f32 kernels; bf16 goes through gpu-core's defaults (the
//! attention's through the host, the others composed from primitives). As CUDA's kernels, and unlike the CPU, these cannot refuse
//! a slot past the cache (that would take a read-back): they skip such writes and attend to
//! nothing past the cache; callers check the slots on the host, as `models::engine` does.

use crate::backend::WgpuBackend;
use crate::buffer::WgpuBuffer;
use crate::kernels::{src, to_u32};
use gpu_core::backend::BufferInfo;
use gpu_core::nn::decode::{
    check_add_rms_norm, check_cache_attention, check_prefill_attention, check_rope_append,
    check_swiglu_packed, CacheAttnIn, DecodeDims, DecodeOps, PrefillIn, RopeAppendIn,
};
use gpu_core::nn::defaults;
use gpu_core::{DType, Result};

const ROPE_APPEND: &str = include_str!("shaders/rope_append.wgsl");
const CACHE_ATTN: &str = include_str!("shaders/cache_attn.wgsl");
const WG_SUM64: &str = include_str!("shaders/wg_sum64.wgsl");
const ADD_RMS_NORM: &str = include_str!("shaders/add_rms_norm.wgsl");
const SWIGLU: &str = include_str!("shaders/swiglu.wgsl");
const ACT_LIB: &str = include_str!("shaders/activation.wgsl");

type Buf = WgpuBuffer;

fn all_f32(bufs: &[&Buf]) -> bool {
    bufs.iter().all(|b| b.dtype() == DType::F32)
}

/// `d + 512·kv_heads + 2^31·prefill`, one parameter word of `cache_attn.wgsl`; more than
/// 2^22 key/value heads is refused.
fn packed_heads(op: &'static str, dims: DecodeDims, prefill: bool) -> Result<u32> {
    if dims.kv_heads >= 1 << 22 {
        return Err(gpu_core::GpuError::Unsupported {
            op,
            reason: format!("{} key/value heads (at most 2^22 here)", dims.kv_heads),
        });
    }
    Ok((dims.d + 512 * dims.kv_heads) as u32 | (u32::from(prefill) << 31))
}

impl WgpuBackend {
    /// One launch of `cache_attn.wgsl` (checked): a workgroup a query head; a prefill's
    /// queries take slots `0..t` (its `slot` binding is not read).
    fn cache_attn_f32(
        &self,
        op: &'static str,
        (x, prefill): (CacheAttnIn<'_, Buf>, bool),
        out: &mut Buf,
        dims: DecodeDims,
        scale: f32,
    ) -> Result<()> {
        let rows = dims.b * dims.t * dims.heads;
        if rows == 0 {
            return Ok(());
        }
        let p = [
            to_u32(op, rows)?,
            to_u32(op, dims.t)?,
            to_u32(op, dims.heads)?,
            // d ≤ 256 (checked); the flag in bit 31.
            packed_heads(op, dims, prefill)?,
            to_u32(op, dims.cap)?,
            dims.window_u32(),
            scale.to_bits(),
            0,
        ];
        let (gx, gy) = self.grid(op, to_u32(op, rows)?)?;
        let bufs = [
            x.q.raw(),
            x.k_cache.raw(),
            x.v_cache.raw(),
            x.start.raw(),
            x.slot.raw(),
            out.raw(),
        ];
        let body = || src(&format!("{WG_SUM64}{CACHE_ATTN}"));
        self.launch(op, ("cache_attn", body), p, (gx, (gx, gy, 1)), &bufs)
    }
}

impl DecodeOps for WgpuBackend {
    /// f32: one kernel, a thread a rotated pair or a copied value (bf16: the default).
    fn rope_append(
        &self,
        x: RopeAppendIn<'_, Buf>,
        (q_out, k_cache, v_cache): (&mut Buf, &mut Buf, &mut Buf),
        dims: DecodeDims,
    ) -> Result<()> {
        const OP: &str = "rope_append";
        check_rope_append(x, [&*q_out, &*k_cache, &*v_cache], dims)?;
        self.check_out(OP, &[x.qkv, x.inv_freq, x.start, x.slot])?;
        self.check_out(OP, &[q_out, k_cache, v_cache])?;
        if !all_f32(&[x.qkv, q_out, k_cache]) {
            return defaults::decode::rope_append(self, x, (q_out, k_cache, v_cache), dims);
        }
        let half = dims.d / 2;
        let per = (dims.heads + dims.kv_heads) * half + dims.kv_heads * dims.d;
        let threads = dims.b * dims.t * per;
        let p = [
            to_u32(OP, threads)?,
            to_u32(OP, dims.t)?,
            to_u32(OP, dims.heads)?,
            to_u32(OP, dims.kv_heads)?,
            to_u32(OP, dims.d)?,
            to_u32(OP, dims.cap)?,
            u32::from(!x.inv_freq.is_empty()),
            0,
        ];
        let bufs = [
            x.qkv.raw(),
            x.inv_freq.raw(),
            x.start.raw(),
            x.slot.raw(),
            q_out.raw(),
            k_cache.raw(),
            v_cache.raw(),
        ];
        self.launch_1d(OP, OP, || src(ROPE_APPEND), p, threads, &bufs)
    }

    /// f32: one kernel, a workgroup a query head (bf16: the default).
    fn cache_attention(
        &self,
        x: CacheAttnIn<'_, Buf>,
        out: &mut Buf,
        dims: DecodeDims,
        max_end: usize,
        scale: f32,
    ) -> Result<()> {
        const OP: &str = "cache_attention";
        check_cache_attention(x, out, dims, max_end, scale)?;
        self.check_out(OP, &[x.q, x.k_cache, x.v_cache, x.start, x.slot, out])?;
        if !all_f32(&[x.q, x.k_cache, out]) {
            return defaults::decode::cache_attention(self, x, out, dims, max_end, scale);
        }
        self.cache_attn_f32(OP, (x, false), out, dims, scale)
    }

    /// f32: `cache_attention`'s kernel, the queries at slots `0..t` (bf16: the default).
    fn prefill_attention(
        &self,
        x: PrefillIn<'_, Buf>,
        out: &mut Buf,
        dims: DecodeDims,
        scale: f32,
    ) -> Result<()> {
        const OP: &str = "prefill_attention";
        check_prefill_attention(x, out, dims, scale)?;
        self.check_out(OP, &[x.q, x.k_cache, x.v_cache, x.start, out])?;
        if !all_f32(&[x.q, x.k_cache, out]) {
            return defaults::decode::prefill_attention(self, x, out, dims, scale);
        }
        let x = CacheAttnIn {
            q: x.q,
            k_cache: x.k_cache,
            v_cache: x.v_cache,
            start: x.start,
            slot: x.start,
        };
        self.cache_attn_f32(OP, (x, true), out, dims, scale)
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
        let p = [
            to_u32(OP, rows)?,
            to_u32(OP, cols)?,
            has_y,
            eps.to_bits(),
            0,
            0,
            0,
            0,
        ];
        let (gx, gy) = self.grid(OP, to_u32(OP, rows)?)?;
        let bufs = [
            x.raw(),
            y.unwrap_or(x).raw(),
            w.raw(),
            sum.raw(),
            normed.raw(),
        ];
        let body = || src(&format!("{WG_SUM64}{ADD_RMS_NORM}"));
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
        let p = [to_u32(OP, out.len())?, to_u32(OP, i)?, 0, 0, 0, 0, 0, 0];
        let body = || src(&format!("{ACT_LIB}{SWIGLU}"));
        self.launch_1d(OP, OP, body, p, out.len(), &[gu.raw(), out.raw()])
    }
}
