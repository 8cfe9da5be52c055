//! Fused causal self-attention.

use crate::backend::BufferInfo;
use crate::error::{GpuError, Result};
use crate::nn::defaults::attention as A;
use crate::nn::defaults::packed as P;
use crate::nn::primitives::Primitives;
use crate::ops::require_f32;

/// Causal scaled-dot-product attention over `n` = batch·heads independent sequences.
///
/// `q`, `k`, `v`, `out` are `[n, t, d]`; `lse` is `[n, t]`, the log-sum-exp of each query's
/// scaled, masked scores, saved for the backward. `scale` is usually `1/sqrt(d)`.
/// `out[i] = Σ_{j<=i} softmax_j(scale·q_i·k_j) v_j`.
///
/// Every backend accepts the same arguments (see [`check_dims`]): any `n` and `t` (zero gives an
/// empty call), a head dimension `d` that is a multiple of 4 in `4..=128` ([`MAX_HEAD_DIM`]), and
/// a finite `scale`.
pub trait AttentionOps: Primitives {
    /// Forward pass: writes `out` (`[n, t, d]`) and `lse` (`[n, t]`, natural log).
    fn causal_attention_fwd(
        &self,
        x: AttnQkv<'_, Self::Buffer>,
        (out, lse): (&mut Self::Buffer, &mut Self::Buffer),
        dims: AttnDims,
    ) -> Result<()> {
        check_fwd(x, out, lse, dims)?;
        let AttnDims { n, t, d, scale } = dims;
        let dims = A::Dims::plain(n, t, d, scale);
        let AttnQkv { q, k, v } = x;
        A::forward(self, A::Qkv { q, k, v }, (out, lse), dims)
    }

    /// Gradients of q, k and v (`dq`, `dk`, `dv`, `[n, t, d]` each), given the forward's `out`
    /// and `lse` and the output gradient.
    fn causal_attention_bwd(
        &self,
        x: AttnQkv<'_, Self::Buffer>,
        saved: PackedSaved<'_, Self::Buffer>,
        (dq, dk, dv): (&mut Self::Buffer, &mut Self::Buffer, &mut Self::Buffer),
        dims: AttnDims,
    ) -> Result<()> {
        check_bwd(x, saved, [&*dq, &*dk, &*dv], dims)?;
        let AttnDims { n, t, d, scale } = dims;
        let dims = A::Dims::plain(n, t, d, scale);
        let PackedSaved { out, lse, dout } = saved;
        let saved = A::Saved { out, lse, dout };
        let AttnQkv { q, k, v } = x;
        A::backward(self, A::Qkv { q, k, v }, saved, (dq, dk, dv), dims)
    }

    /// Causal attention over a fused projection ([`Packed`]: `qkv` `[b, t, 3c]`, `out`
    /// `[b, t, c]`, `lse` `[b·heads, t]` f32), with the attention dropout of `call.drop`
    /// (sequence `b·heads + h` of the [`AttnDropout`] mask). `qkv` and `out` are both f32 or
    /// both bf16. The same function as splitting, permuting to `[b·heads, t, d]`,
    /// [`AttentionOps::causal_attention_fwd`] and permuting back. The default does exactly
    /// that (the dropout as the [`Primitives::dropout`] of the `[n, t, t]` probabilities, whose
    /// flat index is the mask's: the CPU reference's mask bit for bit; a device seed offset read
    /// on the host); the CPU and CUDA backends override it with their packed kernels.
    fn attention_packed_fwd(
        &self,
        qkv: &Self::Buffer,
        (out, lse): (&mut Self::Buffer, &mut Self::Buffer),
        call: PackedCall<'_, Self::Buffer>,
    ) -> Result<()> {
        P::forward(self, qkv, (out, lse), call)
    }

    /// The backward of [`AttentionOps::attention_packed_fwd`]: `dqkv` (`qkv`'s layout and
    /// dtype) from the forward's `out`, `lse` and the output gradient; `call` as the forward's
    /// (the mask is regenerated).
    fn attention_packed_bwd(
        &self,
        qkv: &Self::Buffer,
        saved: PackedSaved<'_, Self::Buffer>,
        dqkv: &mut Self::Buffer,
        call: PackedCall<'_, Self::Buffer>,
    ) -> Result<()> {
        P::backward(self, qkv, saved, dqkv, call)
    }
}

/// The sizes, scale and dropout of a packed attention call
/// ([`AttentionOps::attention_packed_fwd`]).
#[derive(Debug)]
pub struct PackedCall<'a, Buf> {
    pub dims: Packed,
    pub scale: f32,
    pub drop: Option<PackedDrop<'a, Buf>>,
}
copy_refs!(PackedCall);

/// The saved tensors of an attention backward (packed or not): the forward's `out` and `lse`,
/// and the output gradient.
pub struct PackedSaved<'a, Buf> {
    /// The forward's output.
    pub out: &'a Buf,
    /// The forward's log-sum-exp of each query's scores.
    pub lse: &'a Buf,
    /// The gradient of `out`.
    pub dout: &'a Buf,
}
copy_refs!(PackedSaved);

/// The inputs of [`AttentionOps::causal_attention_fwd`] and `_bwd`.
#[derive(Debug)]
pub struct AttnQkv<'a, Buf> {
    /// Queries, `[n, t, d]`.
    pub q: &'a Buf,
    /// Keys, `[n, t, d]`.
    pub k: &'a Buf,
    /// Values, `[n, t, d]`.
    pub v: &'a Buf,
}
copy_refs!(AttnQkv);

/// The sizes and scale of [`AttentionOps::causal_attention_fwd`] and `_bwd`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnDims {
    /// Independent sequences (batch·heads).
    pub n: usize,
    /// Tokens per sequence.
    pub t: usize,
    /// Head width.
    pub d: usize,
    /// The scores' scale, usually `1/sqrt(d)`.
    pub scale: f32,
}

/// Attention dropout with an optional device seed offset: the u64 entry `index` of `offsets`
/// (a U32 buffer of pairs, low word first) is added (wrapping) to the seed when the op runs, so
/// a CUDA graph's replays draw new masks (`tensor_ops::graph::with_dropout_offsets`). The
/// reference is `AttnDropout { seed: seed + offsets[index], .. }` on any backend; CUDA reads
/// the entry on the device, the defaults and the CPU on the host.
#[derive(Debug)]
pub struct PackedDrop<'a, Buf> {
    pub drop: AttnDropout,
    pub offset: Option<(&'a Buf, usize)>,
}
copy_refs!(PackedDrop);

impl<Buf> From<AttnDropout> for PackedDrop<'_, Buf> {
    fn from(drop: AttnDropout) -> Self {
        PackedDrop { drop, offset: None }
    }
}

/// `drop` with its device seed offset (if any) read on the host and added to the seed: the
/// plain [`AttnDropout`] a host implementation runs.
pub fn resolve_drop<B: crate::backend::Backend + ?Sized>(
    b: &B,
    op: &'static str,
    drop: Option<PackedDrop<'_, B::Buffer>>,
) -> Result<Option<AttnDropout>> {
    let Some(PackedDrop { drop, offset }) = drop else {
        return Ok(None);
    };
    let Some((offsets, index)) = offset else {
        return Ok(Some(drop));
    };
    let off = crate::nn::elementwise::seed_offset(b, op, offsets, index)?;
    Ok(Some(AttnDropout {
        seed: drop.seed.wrapping_add(off),
        ..drop
    }))
}

/// The largest head dimension `d` the attention ops accept.
pub const MAX_HEAD_DIM: usize = 128;

/// The longest sequence the attention ops accept (2^30; kernels index rows with 32-bit ints).
pub const MAX_SEQ_LEN: usize = 1 << 30;

/// Checks `n`, `t`, `d`: `d` a multiple of 4 in `4..=`[`MAX_HEAD_DIM`], `t <=`
/// [`MAX_SEQ_LEN`], and
/// `n·t·d` within `usize`. Returns `(n·t·d, n·t)`, the lengths of the `[n, t, d]` and `[n, t]`
/// buffers.
pub fn check_dims(op: &'static str, n: usize, t: usize, d: usize) -> Result<(usize, usize)> {
    if d == 0 || d > MAX_HEAD_DIM || !d.is_multiple_of(4) {
        return Err(GpuError::InvalidShape {
            op,
            reason: format!("head dimension d = {d} must be a multiple of 4 in 4..={MAX_HEAD_DIM}"),
        });
    }
    if t > MAX_SEQ_LEN {
        return Err(GpuError::InvalidShape {
            op,
            reason: format!("sequence length t = {t} must be at most {MAX_SEQ_LEN}"),
        });
    }
    let rows = n.checked_mul(t);
    let elems = rows.and_then(|r| r.checked_mul(d));
    match (elems, rows) {
        (Some(e), Some(r)) => Ok((e, r)),
        _ => Err(GpuError::InvalidShape {
            op,
            reason: format!("n·t·d = {n}·{t}·{d} overflows usize"),
        }),
    }
}

fn check_buffers<B: BufferInfo>(op: &'static str, bufs: &[(&str, &B, usize)]) -> Result<()> {
    for &(name, buf, want) in bufs {
        require_f32(op, buf.dtype())?;
        crate::ops::check_count(op, name, buf.len(), want)?;
    }
    Ok(())
}

fn check_scale(op: &'static str, scale: f32) -> Result<()> {
    if scale.is_finite() {
        Ok(())
    } else {
        Err(GpuError::invalid(
            op,
            format!("scale must be finite, got {scale}"),
        ))
    }
}

/// Checks the arguments of [`AttentionOps::causal_attention_fwd`] (every backend calls this).
pub fn check_fwd<B: BufferInfo>(x: AttnQkv<'_, B>, out: &B, lse: &B, dims: AttnDims) -> Result<()> {
    const OP: &str = "causal_attention_fwd";
    let (e, r) = check_qkv(OP, x, dims)?;
    check_buffers(OP, &[("out", out, e), ("lse", lse, r)])
}

/// Checks the sizes, the scale and `q`, `k`, `v` (in that order) of a causal attention call;
/// returns the element count of a `[n, t, d]` buffer and the row count `n·t`.
fn check_qkv<B: BufferInfo>(
    op: &'static str,
    x: AttnQkv<'_, B>,
    dims: AttnDims,
) -> Result<(usize, usize)> {
    let AttnDims { n, t, d, scale } = dims;
    let (e, r) = check_dims(op, n, t, d)?;
    check_scale(op, scale)?;
    check_buffers(op, &[("q", x.q, e), ("k", x.k, e), ("v", x.v, e)])?;
    Ok((e, r))
}

/// Checks the arguments of [`AttentionOps::causal_attention_bwd`] (every backend calls this),
/// with the gradients `[dq, dk, dv]`.
pub fn check_bwd<B: BufferInfo>(
    x: AttnQkv<'_, B>,
    saved: PackedSaved<'_, B>,
    [dq, dk, dv]: [&B; 3],
    dims: AttnDims,
) -> Result<()> {
    const OP: &str = "causal_attention_bwd";
    let (e, r) = check_qkv(OP, x, dims)?;
    check_buffers(
        OP,
        &[
            ("out", saved.out, e),
            ("lse", saved.lse, r),
            ("dout", saved.dout, e),
            ("dq", dq, e),
            ("dk", dk, e),
            ("dv", dv, e),
        ],
    )
}

/// The sizes of a packed attention call (`causal_attention_packed_*`, the CPU and CUDA
/// backends): `qkv` `[b, t, 3c]` holding q, k, v as column blocks of `heads` heads of width
/// `d` (c = heads·d), outputs `[b, t, c]`, `lse` `[b·heads, t]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packed {
    pub b: usize,
    pub t: usize,
    pub heads: usize,
    pub d: usize,
}

impl Packed {
    /// `c = heads·d`, the width of a head block.
    pub fn c(&self) -> usize {
        self.heads * self.d
    }

    /// Sequences: `b·heads`.
    pub fn n(&self) -> usize {
        self.b * self.heads
    }
}

/// Checks a packed call (every backend calls this): the head width and sequence length as
/// [`check_dims`], `heads >= 1`, `scale` finite, f32 buffers, `qkv` and `dqkv` (when given) of
/// `b·t·3c` elements, each of `outs` of `b·t·c`, `lse` of `b·heads·t`, and every size and row
/// stride below 2^31 (the CUDA kernels' 32-bit arithmetic).
pub fn check_packed<B: BufferInfo>(
    op: &'static str,
    qkv: &B,
    outs: &[&B],
    lse: &B,
    dqkv: Option<&B>,
    p: Packed,
    scale: f32,
) -> Result<()> {
    check_dims(op, p.b.saturating_mul(p.heads), p.t, p.d)?;
    check_scale(op, scale)?;
    if p.heads == 0 {
        return Err(GpuError::InvalidShape {
            op,
            reason: "at least one head".into(),
        });
    }
    let (e_qkv, e_out, e_lse) = packed_lens(op, p)?;
    let mut bufs = vec![("qkv", qkv, e_qkv), ("lse", lse, e_lse)];
    bufs.extend(outs.iter().map(|&o| ("out", o, e_out)));
    bufs.extend(dqkv.map(|g| ("dqkv", g, e_qkv)));
    check_buffers(op, &bufs)
}

/// The lengths of a packed call's buffers, `(qkv, out, lse)` = `(b·t·3c, b·t·c, b·heads·t)`,
/// with every size and row stride below 2^31 (the CUDA kernels' 32-bit arithmetic), else an
/// [`GpuError::InvalidShape`] naming `p`.
pub(crate) fn packed_lens(op: &'static str, p: Packed) -> Result<(usize, usize, usize)> {
    let big = || GpuError::InvalidShape {
        op,
        reason: format!("{p:?} is too large"),
    };
    let c = p.heads.checked_mul(p.d).ok_or_else(big)?;
    let ld = c.checked_mul(3).filter(|&l| l < 1 << 31).ok_or_else(big)?;
    let n =
        p.b.checked_mul(p.heads)
            .filter(|&n| n < 1 << 31)
            .ok_or_else(big)?;
    let rows = p.b.checked_mul(p.t).ok_or_else(big)?;
    let e_qkv = rows.checked_mul(ld).ok_or_else(big)?;
    Ok((e_qkv, rows * c, n * p.t))
}

/// Dropout of the attention probabilities (PyTorch's `scaled_dot_product_attention(dropout_p)`,
/// nanoGPT's `attn_dropout`): with `P = softmax(scale·QKᵀ + causal mask)` per row, the output
/// is `(P ∘ M / (1 − p))·V`, where the keep mask `M` over the visible entries `(i, j)`, `j <= i`,
/// of sequence `s` is [`AttnDropout::keep`]: element `(s·t + i)·t + j` of an `[n, t, t]` array
/// of the elementwise dropout's counter-based hash
/// ([`dropout_keep`](crate::nn::elementwise::dropout_keep)), a pure function of
/// `(seed, s, i, j)` (and `t`), so the backward regenerates it and no tiling changes it. The
/// saved `lse` stays the undropped softmax's. The factor `1/(1 − p)` is rounded to f32 once, as
/// the elementwise dropout's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnDropout {
    /// The drop probability, in `[0, 1)`.
    pub p: f32,
    /// The mask's seed.
    pub seed: u64,
}

impl AttnDropout {
    /// The mask's index of entry `(s, i, j)` of sequences of length `t`: `(s·t + i)·t + j`,
    /// wrapping in u64 (distinct for every entry while `n·t² <= 2^64`).
    pub fn index(s: usize, i: usize, j: usize, t: usize) -> u64 {
        let (s, i, j, t) = (s as u64, i as u64, j as u64, t as u64);
        s.wrapping_mul(t)
            .wrapping_add(i)
            .wrapping_mul(t)
            .wrapping_add(j)
    }

    /// Whether entry `(s, i, j)` (key `j` of query `i` of sequence `s`, sequences of length
    /// `t`) is kept.
    pub fn keep(&self, s: usize, i: usize, j: usize, t: usize) -> bool {
        crate::nn::elementwise::dropout_keep(self.seed, Self::index(s, i, j, t), self.p)
    }

    /// `1/(1 − p)` rounded to f32 (the factor of a kept probability).
    pub fn mul(&self) -> f32 {
        1.0 / (1.0 - self.p)
    }

    /// The factor of entry `(s, i, j)`: [`AttnDropout::mul`] where kept, else 0.
    pub fn factor(&self, s: usize, i: usize, j: usize, t: usize) -> f32 {
        if self.keep(s, i, j, t) {
            self.mul()
        } else {
            0.0
        }
    }

    /// `None` for `None` or `p = 0` (no dropout: the plain kernels), else the dropout after
    /// checking `p` is in `[0, 1)`.
    pub fn active(drop: Option<AttnDropout>, op: &'static str) -> Result<Option<AttnDropout>> {
        match drop {
            Some(d) if !(0.0..1.0).contains(&d.p) => Err(GpuError::invalid(
                op,
                format!("attention dropout p must be in [0, 1), got {}", d.p),
            )),
            Some(d) if d.p > 0.0 => Ok(Some(d)),
            _ => Ok(None),
        }
    }
}
