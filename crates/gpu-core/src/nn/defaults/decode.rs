//! The decode family's defaults: through the host, on the CPU reference (`CpuBackend`), for
//! a backend without its own kernels (wgpu runs its f32 kernels and these for bf16).

use crate::error::Result;
use crate::nn::decode::{CacheAttnIn, DecodeDims, DecodeOps, PrefillIn, RopeAppendIn};
use crate::nn::defaults::host as H;
use crate::nn::primitives::Primitives;

/// [`DecodeOps::rope_append`] through the host.
pub fn rope_append<B: Primitives + ?Sized>(
    b: &B,
    x: RopeAppendIn<'_, B::Buffer>,
    (q_out, k_cache, v_cache): (&mut B::Buffer, &mut B::Buffer, &mut B::Buffer),
    dims: DecodeDims,
) -> Result<()> {
    let [qkv, inv_freq, start, slot] = &H::downs_n(b, [x.qkv, x.inv_freq, x.start, x.slot])?;
    let [mut q, mut k, mut v] = H::downs_n(b, [&*q_out, &*k_cache, &*v_cache])?;
    let x = RopeAppendIn {
        qkv,
        inv_freq,
        start,
        slot,
    };
    crate::CpuBackend.rope_append(x, (&mut q, &mut k, &mut v), dims)?;
    H::ups(b, &[q, k, v], &mut [q_out, k_cache, v_cache])
}

/// [`DecodeOps::cache_attention`] through the host.
pub fn cache_attention<B: Primitives + ?Sized>(
    b: &B,
    x: CacheAttnIn<'_, B::Buffer>,
    out: &mut B::Buffer,
    dims: DecodeDims,
    max_end: usize,
    scale: f32,
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
    };
    crate::CpuBackend.cache_attention(x, &mut o, dims, max_end, scale)?;
    H::up(b, &o, out)
}

/// [`DecodeOps::prefill_attention`] through the host.
pub fn prefill_attention<B: Primitives + ?Sized>(
    b: &B,
    x: PrefillIn<'_, B::Buffer>,
    out: &mut B::Buffer,
    dims: DecodeDims,
    scale: f32,
) -> Result<()> {
    let [q, k_cache, v_cache, start] = &H::downs_n(b, [x.q, x.k_cache, x.v_cache, x.start])?;
    let mut o = H::down(b, out)?;
    let x = PrefillIn {
        q,
        k_cache,
        v_cache,
        start,
    };
    crate::CpuBackend.prefill_attention(x, &mut o, dims, scale)?;
    H::up(b, &o, out)
}
