//! The packed causal attention (`qkv` `[b, t, 3c]`, [`Packed`]) from the unpacked
//! [`AttentionOps`] by permutes: the default of a backend without a packed kernel (the
//! attention dropout is not composed yet: `p > 0` is an error here).

use super::f32_buf;
use crate::backend::BufferInfo;
use crate::error::{GpuError, Result};
use crate::nn::attention::{check_packed, AttnDropout, Packed};
use crate::nn::AttentionOps;

/// Refuses an active attention dropout (see the module docs).
fn no_dropout(op: &'static str, drop: Option<AttnDropout>) -> Result<()> {
    match AttnDropout::active(drop, op)? {
        None => Ok(()),
        Some(_) => Err(GpuError::invalid(
            op,
            "the default packed attention has no attention dropout; the backend must override it",
        )),
    }
}

/// `[b, t, 3, heads, d]` → three `[b, heads, t, d]` buffers (q, k, v).
fn unpack<B: AttentionOps + ?Sized>(b: &B, qkv: &B::Buffer, p: Packed) -> Result<[B::Buffer; 3]> {
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
        b.copy_blocks(&all, i * len, len, &mut o, 0, len, 1, len)?;
        Ok(o)
    };
    Ok([part(0)?, part(1)?, part(2)?])
}

/// Forward: unpack, [`AttentionOps::causal_attention_fwd`], `[b, heads, t, d]` → `[b, t, c]`.
pub fn forward<B: AttentionOps + ?Sized>(
    b: &B,
    qkv: &B::Buffer,
    (out, lse): (&mut B::Buffer, &mut B::Buffer),
    p: Packed,
    (scale, drop): (f32, Option<AttnDropout>),
) -> Result<()> {
    const OP: &str = "causal_attention_packed_fwd";
    check_packed(OP, qkv, &[&*out], lse, None, p, scale)?;
    no_dropout(OP, drop)?;
    let [q, k, v] = unpack(b, qkv, p)?;
    let mut o = f32_buf(b, out.len())?;
    b.causal_attention_fwd(&q, &k, &v, &mut o, lse, p.n(), p.t, p.d, scale)?;
    b.permute(&o, &[p.b, p.heads, p.t, p.d], &[0, 2, 1, 3], out)
}

/// The backward's saved tensors: the forward's `out`, `lse`, and the output gradient.
pub struct PackedSaved<'a, B: AttentionOps + ?Sized> {
    pub out: &'a B::Buffer,
    pub lse: &'a B::Buffer,
    pub dout: &'a B::Buffer,
}

/// Backward: the unpacked backward, its three gradients stacked and permuted into `dqkv`.
pub fn backward<B: AttentionOps + ?Sized>(
    b: &B,
    qkv: &B::Buffer,
    s: PackedSaved<'_, B>,
    dqkv: &mut B::Buffer,
    p: Packed,
    (scale, drop): (f32, Option<AttnDropout>),
) -> Result<()> {
    const OP: &str = "causal_attention_packed_bwd";
    check_packed(OP, qkv, &[s.out, s.dout], s.lse, Some(&*dqkv), p, scale)?;
    no_dropout(OP, drop)?;
    let [q, k, v] = unpack(b, qkv, p)?;
    let heads_first = |x: &B::Buffer| -> Result<B::Buffer> {
        let mut o = f32_buf(b, x.len())?;
        b.permute(x, &[p.b, p.t, p.heads, p.d], &[0, 2, 1, 3], &mut o)?;
        Ok(o)
    };
    let (out, dout) = (heads_first(s.out)?, heads_first(s.dout)?);
    let len = out.len();
    let (mut dq, mut dk, mut dv) = (f32_buf(b, len)?, f32_buf(b, len)?, f32_buf(b, len)?);
    let grads = (&mut dq, &mut dk, &mut dv);
    let (n, t, d) = (p.n(), p.t, p.d);
    b.causal_attention_bwd(
        &q, &k, &v, &out, s.lse, &dout, grads.0, grads.1, grads.2, n, t, d, scale,
    )?;
    let mut all = f32_buf(b, 3 * len)?;
    for (i, g) in [&dq, &dk, &dv].into_iter().enumerate() {
        b.copy_blocks(g, 0, len, &mut all, i * len, len, 1, len)?;
    }
    b.permute(&all, &[3, p.b, p.heads, p.t, p.d], &[1, 3, 0, 2, 4], dqkv)
}
