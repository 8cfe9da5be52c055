//! The packed causal attention (`qkv` `[b, t, 3c]`, [`Packed`]) from the unpacked
//! attention defaults by permutes: the default of a backend without a packed kernel
//! ([`AttentionOps::attention_packed_fwd`]). The attention dropout is the unpacked default's
//! (the [`Primitives::dropout`] of the `[b·heads, t, t]` probabilities: sequence
//! `b·heads + h` after the permute, the mask of [`AttnDropout`]); a device seed offset is read
//! on the host ([`resolve_drop`]). A bf16 `qkv` is widened to f32 (exact), the output rounded
//! to bf16 once.

use super::attention::{self as A, Dims};
use super::{f32_buf, widen};
use crate::backend::BufferInfo;
use crate::dtype::DType;
use crate::error::Result;
use crate::nn::attention::{
    check_packed, resolve_drop, AttnDropout, Packed, PackedCall, PackedSaved,
};
use crate::nn::primitives::Primitives;
use crate::nn::AttentionOps;
use crate::nn::BlockCopy;
use crate::ops::same_dtype;

/// `[b, t, 3, heads, d]` → three `[b, heads, t, d]` buffers (q, k, v).
fn unpack<B: Primitives + ?Sized>(b: &B, qkv: &B::Buffer, p: Packed) -> Result<[B::Buffer; 3]> {
    let len = p.b * p.t * p.c();
    let mut all = f32_buf(b, 3 * len)?;
    b.permute(
        qkv,
        &[p.b, p.t, 3, p.heads, p.d],
        &[2, 0, 3, 1, 4],
        &mut all,
    )?;
    let part = |i: usize| -> Result<B::Buffer> {
        let mut o = f32_buf(b, len)?;
        b.copy_blocks(&all, &mut o, BlockCopy::run(i * len, 0, len))?;
        Ok(o)
    };
    Ok([part(0)?, part(1)?, part(2)?])
}

/// `[b, t, heads, d]` → `[b, heads, t, d]` in a new f32 buffer.
fn heads_first<B: Primitives + ?Sized>(b: &B, x: &B::Buffer, p: Packed) -> Result<B::Buffer> {
    let mut o = f32_buf(b, x.len())?;
    b.permute(x, &[p.b, p.t, p.heads, p.d], &[0, 2, 1, 3], &mut o)?;
    Ok(o)
}

/// The unpacked defaults' dims of a packed call with the dropout `drop`.
fn dims(p: Packed, scale: f32, drop: Option<AttnDropout>) -> Dims {
    Dims {
        drop,
        ..Dims::plain(p.n(), p.t, p.d, scale)
    }
}

/// The call's active dropout with its seed offset applied (`op`'s errors).
fn dropout<B: AttentionOps + ?Sized>(
    b: &B,
    op: &'static str,
    call: PackedCall<'_, B::Buffer>,
) -> Result<Option<AttnDropout>> {
    AttnDropout::active(resolve_drop(b, op, call.drop)?, op)
}

/// The unpacked attention forward that a packed call runs on (f32, `[n, t, d]`, with the
/// call's dropout): [`A::forward`], or a backend's fused one with the same meaning.
pub type Forward<B> = fn(
    &B,
    A::Qkv<'_, B>,
    (
        &mut <B as crate::Backend>::Buffer,
        &mut <B as crate::Backend>::Buffer,
    ),
    Dims,
) -> Result<()>;

/// The unpacked attention backward that a packed call runs on: [`A::backward`] or a
/// backend's.
pub type Backward<B> = fn(
    &B,
    A::Qkv<'_, B>,
    A::Saved<'_, B>,
    (
        &mut <B as crate::Backend>::Buffer,
        &mut <B as crate::Backend>::Buffer,
        &mut <B as crate::Backend>::Buffer,
    ),
    Dims,
) -> Result<()>;

/// Forward (see the module docs).
pub fn forward<B: AttentionOps + ?Sized>(
    b: &B,
    qkv: &B::Buffer,
    outs: (&mut B::Buffer, &mut B::Buffer),
    call: PackedCall<'_, B::Buffer>,
) -> Result<()> {
    forward_with(b, qkv, outs, call, A::forward::<B>)
}

/// [`forward`] on the unpacked forward `core`.
pub fn forward_with<B: AttentionOps + ?Sized>(
    b: &B,
    qkv: &B::Buffer,
    (out, lse): (&mut B::Buffer, &mut B::Buffer),
    call: PackedCall<'_, B::Buffer>,
    core: Forward<B>,
) -> Result<()> {
    const OP: &str = "causal_attention_packed_fwd";
    if qkv.dtype() == DType::BF16 {
        same_dtype(OP, DType::BF16, out.dtype())?;
        let mut o = f32_buf(b, out.len())?;
        forward_with(b, &widen(b, qkv)?, (&mut o, lse), call, core)?;
        return b.cast(&o, out);
    }
    let (p, scale) = (call.dims, call.scale);
    check_packed(OP, qkv, &[&*out], lse, None, p, scale)?;
    let drop = dropout(b, OP, call)?;
    let [q, k, v] = unpack(b, qkv, p)?;
    let mut o = f32_buf(b, out.len())?;
    core(
        b,
        A::Qkv {
            q: &q,
            k: &k,
            v: &v,
        },
        (&mut o, lse),
        dims(p, scale, drop),
    )?;
    b.permute(&o, &[p.b, p.heads, p.t, p.d], &[0, 2, 1, 3], out)
}

/// Backward: the unpacked backward, its three gradients stacked and permuted into `dqkv`.
pub fn backward<B: AttentionOps + ?Sized>(
    b: &B,
    qkv: &B::Buffer,
    s: PackedSaved<'_, B::Buffer>,
    dqkv: &mut B::Buffer,
    call: PackedCall<'_, B::Buffer>,
) -> Result<()> {
    backward_with(b, qkv, s, dqkv, call, A::backward::<B>)
}

/// [`backward`] on the unpacked backward `core`.
pub fn backward_with<B: AttentionOps + ?Sized>(
    b: &B,
    qkv: &B::Buffer,
    s: PackedSaved<'_, B::Buffer>,
    dqkv: &mut B::Buffer,
    call: PackedCall<'_, B::Buffer>,
    core: Backward<B>,
) -> Result<()> {
    const OP: &str = "causal_attention_packed_bwd";
    if qkv.dtype() == DType::BF16 {
        same_dtype(OP, DType::BF16, dqkv.dtype())?;
        let (out, dout) = (widen(b, s.out)?, widen(b, s.dout)?);
        let wide = PackedSaved {
            out: &out,
            lse: s.lse,
            dout: &dout,
        };
        let mut g = f32_buf(b, dqkv.len())?;
        backward_with(b, &widen(b, qkv)?, wide, &mut g, call, core)?;
        return b.cast(&g, dqkv);
    }
    let (p, scale) = (call.dims, call.scale);
    check_packed(OP, qkv, &[s.out, s.dout], s.lse, Some(&*dqkv), p, scale)?;
    let drop = dropout(b, OP, call)?;
    let [q, k, v] = unpack(b, qkv, p)?;
    let (out, dout) = (heads_first(b, s.out, p)?, heads_first(b, s.dout, p)?);
    let len = out.len();
    let (mut dq, mut dk, mut dv) = (f32_buf(b, len)?, f32_buf(b, len)?, f32_buf(b, len)?);
    let saved = A::Saved {
        out: &out,
        lse: s.lse,
        dout: &dout,
    };
    let x = A::Qkv {
        q: &q,
        k: &k,
        v: &v,
    };
    core(
        b,
        x,
        saved,
        (&mut dq, &mut dk, &mut dv),
        dims(p, scale, drop),
    )?;
    let mut all = f32_buf(b, 3 * len)?;
    for (i, g) in [&dq, &dk, &dv].into_iter().enumerate() {
        b.copy_blocks(g, &mut all, BlockCopy::run(0, i * len, len))?;
    }
    b.permute(&all, &[3, p.b, p.heads, p.t, p.d], &[1, 3, 0, 2, 4], dqkv)
}
