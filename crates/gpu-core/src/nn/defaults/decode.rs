//! The decode family's defaults: through the host, on the CPU reference (`CpuBackend`), for
//! a backend without its own kernels (wgpu runs its f32 kernels and these for bf16).

use crate::error::Result;
use crate::nn::decode::{CacheAttnIn, DecodeOps, PrefillIn, RopeAppendIn, RopeAppendOut};
use crate::nn::defaults::host as H;
use crate::nn::primitives::Primitives;

/// [`DecodeOps::rope_append`] through the host.
pub fn rope_append<B: Primitives + ?Sized>(
    b: &B,
    x: RopeAppendIn<'_, B::Buffer>,
    out: RopeAppendOut<'_, B::Buffer>,
) -> Result<()> {
    let [qkv, inv_freq, start, slot] = &H::downs_n(b, [x.qkv, x.inv_freq, x.start, x.slot])?;
    let [mut q, mut k, mut v] = H::downs_n(b, out.refs())?;
    let x = RopeAppendIn {
        qkv,
        inv_freq,
        start,
        slot,
        dims: x.dims,
    };
    let host = RopeAppendOut {
        q_out: &mut q,
        k_cache: &mut k,
        v_cache: &mut v,
    };
    crate::CpuBackend.rope_append(x, host)?;
    H::ups(b, &[q, k, v], &mut [out.q_out, out.k_cache, out.v_cache])
}

/// [`DecodeOps::cache_attention`] through the host.
pub fn cache_attention<B: Primitives + ?Sized>(
    b: &B,
    x: CacheAttnIn<'_, B::Buffer>,
    out: &mut B::Buffer,
) -> Result<()> {
    let [q, k_cache, v_cache, start, slot] =
        &H::downs_n(b, [x.q, x.k_cache, x.v_cache, x.start, x.slot])?;
    let mut o = H::down(b, out)?;
    let x = CacheAttnIn {
        q,
        k_cache,
        v_cache,
        start,
        slot,
        dims: x.dims,
        max_end: x.max_end,
        scale: x.scale,
    };
    crate::CpuBackend.cache_attention(x, &mut o)?;
    H::up(b, &o, out)
}

/// [`DecodeOps::prefill_attention`] through the host.
pub fn prefill_attention<B: Primitives + ?Sized>(
    b: &B,
    x: PrefillIn<'_, B::Buffer>,
    out: &mut B::Buffer,
) -> Result<()> {
    let [q, k_cache, v_cache, start] = &H::downs_n(b, [x.q, x.k_cache, x.v_cache, x.start])?;
    let mut o = H::down(b, out)?;
    let x = PrefillIn {
        q,
        k_cache,
        v_cache,
        start,
        dims: x.dims,
        scale: x.scale,
    };
    crate::CpuBackend.prefill_attention(x, &mut o)?;
    H::up(b, &o, out)
}
