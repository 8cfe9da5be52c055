//! Inference over a preallocated key/value cache: what a language model's decode step needs
//! beyond the training ops (rotary positions and cache writes from a fused q/k/v projection,
//! attention of new queries against the cache, the argmax of each row).
//!
//! The cache of one layer is a pair of buffers `[b, kv_heads, cap, d]` (f32 or bf16), written
//! in place. Where each batch row stands is read from the device, from two u32 buffers of `b`
//! elements, so a captured CUDA graph replays the same launches step after step:
//! - `start[r]`: the first cache slot of row `r` that holds a real token (left padding before
//!   it is masked); a token's rotary position is its slot minus `start[r]`;
//! - `slot[r]`: the slot of the first of the `t` new tokens of row `r` (the cache holds `slot[r]`
//!   slots before this call); the new tokens take slots `slot[r]..slot[r] + t`.
//!
//! Query `i` of row `r` sits at slot `s = slot[r] + i` and attends to the slots
//! `start[r]..=s` (causal), or, under a sliding window `W` ([`DecodeDims::window`]), to the
//! slots `max(start[r], s + 1 − W)..=s` (the last `W` slots, itself included: `transformers`'
//! `kv_idx > q_idx − sliding_window`). A slot at or past `cap` is an error on the CPU; CUDA kernels
//! cannot report one (they run inside graphs), so they skip such writes and attend to nothing
//! past `cap`: callers check the bounds on the host, as `models::engine` does.

use crate::backend::BufferInfo;
use crate::dtype::DType;
use crate::error::{GpuError, Result};
use crate::nn::defaults;
use crate::nn::primitives::Primitives;
use crate::nn::rows::{check_len, require_dtype, require_u32};
use crate::ops::require_float;

/// The sizes of a decode call: `b` rows of `t` new tokens, `heads` query heads and
/// `kv_heads` key/value heads (grouped-query attention: query head `h` reads key/value head
/// `h / (heads / kv_heads)`) of width `d`, and caches of `cap` slots per row and head.
/// `window`: the attention ops' sliding window (`Some(W)`, `W >= 1`: a query sees the last `W`
/// slots up to its own; `None`: every slot from `start`); `rope_append` ignores it. It is a
/// layer's constant, so a captured graph replays it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeDims {
    pub b: usize,
    pub t: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub d: usize,
    pub cap: usize,
    pub window: Option<usize>,
}

/// The widest head [`DecodeOps`] accepts.
pub const MAX_DECODE_HEAD_DIM: usize = 256;

impl DecodeDims {
    /// Columns of the fused projection: `(heads + 2·kv_heads)·d`.
    pub fn qkv_cols(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.d
    }

    /// Elements of the q/k/v projection `[b, t, qkv_cols]`.
    pub fn qkv_len(&self) -> usize {
        self.b * self.t * self.qkv_cols()
    }

    /// Elements of a query or attention output `[b, t, heads, d]`.
    pub fn q_len(&self) -> usize {
        self.b * self.t * self.heads * self.d
    }

    /// Elements of one cache buffer `[b, kv_heads, cap, d]`.
    pub fn cache_len(&self) -> usize {
        self.b * self.kv_heads * self.cap * self.d
    }

    /// The first slot a query at slot `s` sees, for a row whose first real slot is `start`.
    pub fn first_visible(&self, start: usize, s: usize) -> usize {
        match self.window {
            Some(w) => start.max((s + 1).saturating_sub(w)),
            None => start,
        }
    }

    /// The window as the kernels take it: `W` clamped to `u32::MAX`, 0 for none.
    pub fn window_u32(&self) -> u32 {
        self.window
            .map_or(0, |w| u32::try_from(w).unwrap_or(u32::MAX))
    }

    /// Checks the sizes every backend accepts: `heads` a positive multiple of `kv_heads >= 1`,
    /// `d` even in `2..=`[`MAX_DECODE_HEAD_DIM`], a window of at least 1 slot, and every
    /// buffer length and index below 2^31 (the kernels' 32-bit arithmetic). `b`, `t` or `cap`
    /// may be 0 (an empty call).
    pub fn check(&self, op: &'static str) -> Result<()> {
        let bad = |reason: String| Err(GpuError::InvalidShape { op, reason });
        if self.window == Some(0) {
            return bad("a sliding window of 0 slots sees nothing".into());
        }
        if self.kv_heads == 0 || self.heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "{} query heads do not split into groups of {} key/value heads",
                self.heads, self.kv_heads
            ));
        }
        if self.d < 2 || self.d > MAX_DECODE_HEAD_DIM || !self.d.is_multiple_of(2) {
            return bad(format!(
                "head width d = {} must be even in 2..={MAX_DECODE_HEAD_DIM}",
                self.d
            ));
        }
        let lens = [
            self.b.checked_mul(self.t),
            self.b
                .checked_mul(self.t)
                .and_then(|r| r.checked_mul(self.qkv_cols())),
            self.b
                .checked_mul(self.kv_heads)
                .and_then(|r| r.checked_mul(self.cap)),
            self.b
                .checked_mul(self.kv_heads)
                .and_then(|r| r.checked_mul(self.cap))
                .and_then(|r| r.checked_mul(self.d)),
            self.cap.checked_add(self.t),
        ];
        if lens.iter().any(|l| l.is_none_or(|l| l >= 1 << 31)) {
            return bad(format!(
                "{self:?} is too large (sizes must stay below 2^31)"
            ));
        }
        Ok(())
    }
}

/// The inputs of [`DecodeOps::rope_append`].
#[derive(Debug)]
pub struct RopeAppendIn<'a, Buf> {
    /// The fused projection `[b, t, (heads + 2·kv_heads)·d]` (f32 or bf16).
    pub qkv: &'a Buf,
    /// The rotary frequencies `[d/2]` f32 (empty: no rotation).
    pub inv_freq: &'a Buf,
    /// Each row's first real slot, `[b]` u32.
    pub start: &'a Buf,
    /// Each row's first new slot, `[b]` u32.
    pub slot: &'a Buf,
    /// The sizes.
    pub dims: DecodeDims,
}

/// The inputs of [`DecodeOps::cache_attention`].
#[derive(Debug)]
pub struct CacheAttnIn<'a, Buf> {
    /// The new queries `[b, t, heads, d]`.
    pub q: &'a Buf,
    /// The key cache `[b, kv_heads, cap, d]`.
    pub k_cache: &'a Buf,
    /// The value cache `[b, kv_heads, cap, d]`.
    pub v_cache: &'a Buf,
    /// Each row's first real slot, `[b]` u32.
    pub start: &'a Buf,
    /// Each row's first new slot, `[b]` u32.
    pub slot: &'a Buf,
    /// The sizes.
    pub dims: DecodeDims,
    /// A bound the caller guarantees on every `slot[r] + t` (at most `cap`).
    pub max_end: usize,
    /// The scores' scale (`scale·q·k`).
    pub scale: f32,
}

/// The inputs of [`DecodeOps::prefill_attention`]: those of [`CacheAttnIn`] but `slot`
/// (a prefill's new tokens start at slot 0) and `max_end` (`t`).
#[derive(Debug)]
pub struct PrefillIn<'a, Buf> {
    /// The new queries `[b, t, heads, d]`.
    pub q: &'a Buf,
    /// The key cache `[b, kv_heads, cap, d]`.
    pub k_cache: &'a Buf,
    /// The value cache `[b, kv_heads, cap, d]`.
    pub v_cache: &'a Buf,
    /// Each row's first real slot, `[b]` u32.
    pub start: &'a Buf,
    /// The sizes.
    pub dims: DecodeDims,
    /// The scores' scale (`scale·q·k`).
    pub scale: f32,
}

copy_refs!(RopeAppendIn, CacheAttnIn, PrefillIn);

/// The outputs of [`DecodeOps::rope_append`]: the rotated queries and the two caches.
#[derive(Debug)]
pub struct RopeAppendOut<'a, Buf> {
    /// The rotated queries `[b, t, heads, d]` (f32 or bf16).
    pub q_out: &'a mut Buf,
    /// The key cache `[b, kv_heads, cap, d]`: the rotated keys go to slots `slot[r] + i`.
    pub k_cache: &'a mut Buf,
    /// The value cache `[b, kv_heads, cap, d]`: the values go to the same slots.
    pub v_cache: &'a mut Buf,
}

impl<Buf> RopeAppendOut<'_, Buf> {
    /// The outputs, shared, in the order `[q_out, k_cache, v_cache]`.
    pub fn refs(&self) -> [&Buf; 3] {
        [&*self.q_out, &*self.k_cache, &*self.v_cache]
    }
}

/// The decode family. Float buffers are f32 or bf16 (arithmetic in f32, one rounding where a
/// value is stored); positions and token ids are u32.
pub trait DecodeOps: Primitives {
    /// From the fused projection `qkv` `[b, t, (heads + 2·kv_heads)·d]` (column blocks q, k, v;
    /// head `h` at columns `h·d..` of its block): rotates q and k by the rotate-half rotary
    /// embedding at each token's position `p = slot[r] + i − start[r]` (0 for a padding slot
    /// before `start[r]`), with `θ_j = p·inv_freq[j]` computed in f32 (as `transformers`) for
    /// `j < d/2`: `x'_j = x_j cos θ_j − x_{j+d/2} sin θ_j`, `x'_{j+d/2} = x_{j+d/2} cos θ_j +
    /// x_j sin θ_j`; writes the rotated queries to `q_out` `[b, t, heads, d]` and the rotated
    /// keys and the values to slots `slot[r] + i` of `k_cache` and `v_cache`. An empty
    /// `inv_freq` means no rotation (learned positions, GPT-2).
    fn rope_append(
        &self,
        x: RopeAppendIn<'_, Self::Buffer>,
        out: RopeAppendOut<'_, Self::Buffer>,
    ) -> Result<()> {
        defaults::decode::rope_append(self, x, out)
    }

    /// Causal attention of the new queries `q` `[b, t, heads, d]` against the cache: query `i`
    /// of row `r` (at slot `s = slot[r] + i`) attends to slots `start[r]..=s` (from
    /// [`DecodeDims::first_visible`] under a sliding window), with softmax
    /// weights of `scale·q·k` (f32), and `out` `[b, t, heads, d]` gets their average of the
    /// values; a query with no slot to attend to (`start[r] > s`) gets zeros. `x.max_end` is a
    /// bound the caller guarantees on every `slot[r] + t` (at most `cap`; CUDA splits the slots
    /// into chunks up to it).
    fn cache_attention(
        &self,
        x: CacheAttnIn<'_, Self::Buffer>,
        out: &mut Self::Buffer,
    ) -> Result<()> {
        defaults::decode::cache_attention(self, x, out)
    }

    /// [`DecodeOps::cache_attention`] of a fresh prefill: row `r`'s `t` queries are its slots
    /// `0..t` (as if `slot[r] = 0`; the caller wrote this call's keys and values there), so
    /// query `i` attends to slots `start[r]..=i` (from `max(start[r], i + 1 − W)` under a
    /// sliding window `W`), and one before `start[r]` gets zeros. CUDA
    /// runs bf16 queries, caches and output of head width 64 or 128 as a tensor-core flash attention
    /// (the probabilities rounded to bf16 for their product with the values, as the training
    /// attention does); other cases as `cache_attention`.
    fn prefill_attention(
        &self,
        x: PrefillIn<'_, Self::Buffer>,
        out: &mut Self::Buffer,
    ) -> Result<()> {
        defaults::decode::prefill_attention(self, x, out)
    }

    /// The residual add and the RMSNorm after it, fused (vLLM's `fused_add_rms_norm`): with
    /// `x` f32 `[rows, cols]` and `y` (f32 or bf16, same length; `None`: nothing to add),
    /// `sum = x + y` (f32) and `normed = sum · (mean(sum²) + eps)^(-1/2) · w` (`w` f32
    /// `[cols]`; `normed` f32 or bf16, rounded once), as `transformers`' Llama norm on an f32
    /// residual stream.
    /// `x`, `y`, `w` are the inputs, `sum`, `normed` the outputs.
    fn add_rms_norm(
        &self,
        (x, y, w): (&Self::Buffer, Option<&Self::Buffer>, &Self::Buffer),
        (sum, normed): (&mut Self::Buffer, &mut Self::Buffer),
        cols: usize,
        eps: f32,
    ) -> Result<()> {
        defaults::rows::add_rms_norm(self, (x, y, w), (sum, normed), cols, eps)
    }

    /// SwiGLU of a packed gate/up projection: `out[r, j] = silu(gu[r, j]) · gu[r, i + j]` for
    /// `gu` `[rows, 2i]` and `out` `[rows, i]` (f32 or bf16 each; f32 arithmetic, one rounding).
    fn swiglu_packed(&self, gu: &Self::Buffer, out: &mut Self::Buffer, i: usize) -> Result<()> {
        defaults::rows::swiglu_packed(self, gu, out, i)
    }
}

/// The checks of the row positions and the cache pair that both cache ops share.
fn check_rows_and_cache<B: BufferInfo>(
    op: &'static str,
    start: &B,
    slot: &B,
    k_cache: &B,
    v_cache: &B,
    dims: DecodeDims,
) -> Result<()> {
    dims.check(op)?;
    for (name, buf) in [("start", start), ("slot", slot)] {
        require_u32(op, buf.dtype())?;
        check_len(op, name, buf, dims.b)?;
    }
    require_float(op, k_cache.dtype())?;
    if v_cache.dtype() != k_cache.dtype() {
        return Err(GpuError::DTypeMismatch {
            op,
            expected: k_cache.dtype(),
            got: v_cache.dtype(),
        });
    }
    check_len(op, "k_cache", k_cache, dims.cache_len())?;
    check_len(op, "v_cache", v_cache, dims.cache_len())
}

/// Checks the arguments of [`DecodeOps::rope_append`] (every backend calls this).
pub fn check_rope_append<B: BufferInfo>(
    x: RopeAppendIn<'_, B>,
    out: &RopeAppendOut<'_, B>,
) -> Result<()> {
    const OP: &str = "rope_append";
    let (qkv, inv_freq, dims) = (x.qkv, x.inv_freq, x.dims);
    let [q_out, k_cache, v_cache] = out.refs();
    check_rows_and_cache(OP, x.start, x.slot, k_cache, v_cache, dims)?;
    require_float(OP, qkv.dtype())?;
    require_float(OP, q_out.dtype())?;
    check_len(OP, "qkv", qkv, dims.qkv_len())?;
    check_len(OP, "q_out", q_out, dims.q_len())?;
    require_dtype(OP, DType::F32, inv_freq.dtype())?;
    if !inv_freq.is_empty() {
        check_len(OP, "inv_freq", inv_freq, dims.d / 2)?;
    }
    Ok(())
}

/// Checks the arguments of [`DecodeOps::cache_attention`] (every backend calls this).
pub fn check_cache_attention<B: BufferInfo>(x: CacheAttnIn<'_, B>, out: &B) -> Result<()> {
    check_attention("cache_attention", x, out)
}

fn check_attention<B: BufferInfo>(op: &'static str, x: CacheAttnIn<'_, B>, out: &B) -> Result<()> {
    let CacheAttnIn {
        dims,
        max_end,
        scale,
        ..
    } = x;
    check_rows_and_cache(op, x.start, x.slot, x.k_cache, x.v_cache, dims)?;
    require_float(op, x.q.dtype())?;
    require_float(op, out.dtype())?;
    check_len(op, "q", x.q, dims.q_len())?;
    check_len(op, "out", out, dims.q_len())?;
    if max_end > dims.cap {
        return Err(GpuError::invalid(
            op,
            format!("max_end {max_end} is past the cache's {} slots", dims.cap),
        ));
    }
    if !scale.is_finite() {
        return Err(GpuError::invalid(
            op,
            format!("scale must be finite, got {scale}"),
        ));
    }
    Ok(())
}

/// Checks the arguments of [`DecodeOps::prefill_attention`] (every backend calls this): those
/// of `cache_attention` with `start` for both position vectors and `max_end = t`.
pub fn check_prefill_attention<B: BufferInfo>(x: PrefillIn<'_, B>, out: &B) -> Result<()> {
    check_attention("prefill_attention", x.as_cache(x.start), out)
}

impl<'a, Buf> PrefillIn<'a, Buf> {
    /// The same attention as a [`DecodeOps::cache_attention`] with every row's new tokens at
    /// `slot` (a `[b]` u32 buffer of zeros for the same result; the checks pass `start`)
    /// and `max_end = t`.
    pub fn as_cache(self, slot: &'a Buf) -> CacheAttnIn<'a, Buf> {
        CacheAttnIn {
            q: self.q,
            k_cache: self.k_cache,
            v_cache: self.v_cache,
            start: self.start,
            slot,
            dims: self.dims,
            max_end: self.dims.t,
            scale: self.scale,
        }
    }
}

/// Checks the arguments of [`Primitives::argmax_rows`](crate::nn::Primitives::argmax_rows); returns the number of rows.
pub fn check_argmax<B: BufferInfo>(x: &B, out: &B, cols: usize) -> Result<usize> {
    const OP: &str = "argmax_rows";
    require_float(OP, x.dtype())?;
    require_u32(OP, out.dtype())?;
    if cols == 0 || cols >= 1 << 31 {
        return Err(GpuError::invalid(
            OP,
            format!("a row must have 1..2^31 columns, got {cols}"),
        ));
    }
    let rows = crate::ops::whole_rows(OP, x.len(), cols, || format!("rows of {cols} columns"))?;
    check_len(OP, "out", out, rows)?;
    Ok(rows)
}

/// Checks the arguments of [`DecodeOps::add_rms_norm`]; returns the number of rows.
pub fn check_add_rms_norm<B: BufferInfo>(
    x: &B,
    y: Option<&B>,
    w: &B,
    sum: &B,
    normed: &B,
    cols: usize,
    eps: f32,
) -> Result<usize> {
    const OP: &str = "add_rms_norm";
    for b in [x, w, sum] {
        require_dtype(OP, DType::F32, b.dtype())?;
    }
    require_float(OP, normed.dtype())?;
    if cols == 0 || cols >= 1 << 31 || !x.len().is_multiple_of(cols) {
        return Err(GpuError::shape(
            OP,
            format!("rows of {cols} columns"),
            x.len(),
        ));
    }
    crate::ops::require_nonneg(OP, "eps", eps)?;
    if let Some(y) = y {
        require_float(OP, y.dtype())?;
        check_len(OP, "y", y, x.len())?;
    }
    check_len(OP, "w", w, cols)?;
    check_len(OP, "sum", sum, x.len())?;
    check_len(OP, "normed", normed, x.len())?;
    Ok(x.len() / cols)
}

/// Checks the arguments of [`DecodeOps::swiglu_packed`]; returns the number of rows.
pub fn check_swiglu_packed<B: BufferInfo>(gu: &B, out: &B, i: usize) -> Result<usize> {
    const OP: &str = "swiglu_packed";
    require_float(OP, gu.dtype())?;
    require_float(OP, out.dtype())?;
    if i == 0 || i >= 1 << 30 || !gu.len().is_multiple_of(2 * i) {
        return Err(GpuError::shape(
            OP,
            format!("rows of 2·{i} columns"),
            gu.len(),
        ));
    }
    let rows = gu.len() / (2 * i);
    check_len(OP, "out", out, rows * i)?;
    if gu.len() >= 1 << 31 {
        return Err(GpuError::invalid(
            OP,
            "gu must hold fewer than 2^31 elements",
        ));
    }
    Ok(rows)
}
