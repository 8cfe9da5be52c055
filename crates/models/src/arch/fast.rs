//! The pieces every architecture's fast forward shares: a projection stored dense in the
//! engine's dtype or quantized ([`Proj`]), and the pass a [`super::DecoderModel`] runs
//! ([`FastPass`]): its tokens, the engine's key/value caches and each row's slots, and the
//! attention of a layer against its cache (a fresh prefill's or the cache attention from each
//! row's slot).

use tensor_ops::{CacheView, DType, Device, QuantWeight, Tensor};

use crate::error::ModelError;
use crate::quant::{QuantKind, Quantized};

/// One pass of a [`super::DecoderModel`]: new tokens of every row, the cache they go into, and
/// which logits come back.
pub struct FastPass<'a> {
    /// Token ids, u32 `[b, t]`, after what the caches hold (each row at its slot).
    pub ids: &'a Tensor,
    /// u32 `[b, t]`: each token's slot minus its row's start (0 on padding), what a model with
    /// learned positions reads ([`super::DecoderModel::learned_positions`]); the others ignore
    /// it.
    pub pos: Option<&'a Tensor>,
    /// The caches the pass writes and attends to.
    pub kv: KvSlots<'a>,
    /// Every row's `slot + t` is at most this.
    pub max_end: usize,
    /// Logits of the last position only.
    pub last_only: bool,
    /// A prefill, every row at slot 0: its attention is `Tensor::prefill_attention` (on tensor
    /// cores for bf16 heads of width 64 or 128).
    pub fresh: bool,
}

/// The engine's key/value caches and where each row stands.
#[derive(Clone, Copy)]
pub struct KvSlots<'a> {
    /// Per layer, the key and value caches `[batch, kv_heads, capacity, head_dim]`.
    pub layers: &'a [(Tensor, Tensor)],
    /// u32 `[batch]`: each row's first real slot and its next free slot, on the device.
    pub start: &'a Tensor,
    pub slot: &'a Tensor,
}

impl<'a> KvSlots<'a> {
    /// One layer's caches `(k, v)` (an entry of [`KvSlots::layers`]) as the cache ops read
    /// them, under that layer's sliding `window`.
    pub fn view(&self, (k, v): &'a (Tensor, Tensor), window: Option<usize>) -> CacheView<'a> {
        CacheView {
            k,
            v,
            start: self.start,
            slot: self.slot,
            window,
        }
    }
}

impl FastPass<'_> {
    /// The attention of a layer's queries `q` `[b, t, heads, d]` against its cache: a fresh
    /// prefill's (`Tensor::prefill_attention`, tensor cores for bf16 heads of width 64 or 128)
    /// or the cache attention from each row's slot.
    pub fn attention(
        &self,
        q: &Tensor,
        view: CacheView<'_>,
        scale: f32,
    ) -> Result<Tensor, ModelError> {
        Ok(if self.fresh {
            q.prefill_attention(view.k, view.v, view.start, view.window, scale)?
        } else {
            q.cache_attention(view, self.max_end, scale)?
        })
    }
}

/// A projection's weight `[out, in]`: dense in the engine's dtype, or quantized.
pub(crate) enum Proj {
    Dense(Tensor),
    Quant(QuantWeight),
}

impl Proj {
    /// The projection of `m`, an f32 matrix `[out, in]` on the host: in `dtype` on `dev`, or
    /// quantized to `quant` from its f32 values.
    pub(crate) fn from_host(
        m: &Tensor,
        dev: Device,
        dtype: DType,
        quant: Option<QuantKind>,
    ) -> Result<Proj, ModelError> {
        let &[rows, cols] = m.shape() else {
            return Err(ModelError::Unsupported(format!(
                "a projection of shape {:?} (not a matrix)",
                m.shape()
            )));
        };
        Ok(match quant {
            None => Proj::Dense(m.to(dev)?.to_dtype(dtype)?),
            Some(kind) => {
                let q = Quantized::new(kind, &m.to_vec()?, rows, cols)?;
                Proj::Quant(q.to_device(dev)?)
            }
        })
    }

    /// `x · Wᵀ` in x's dtype.
    pub(crate) fn apply(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        Ok(match self {
            Proj::Dense(w) => x.matmul_t(w, false, true)?,
            Proj::Quant(q) => x.matmul_quant(q)?,
        })
    }

    /// Bytes a product reads of it.
    pub(crate) fn bytes(&self) -> usize {
        let b = |t: &Tensor| t.numel() * t.dtype().size_in_bytes();
        match self {
            Proj::Dense(w) => b(w),
            Proj::Quant(q) => q.parts().iter().map(|t| b(t)).sum(),
        }
    }
}

/// Bytes of a tensor's elements.
pub(crate) fn bytes(t: &Tensor) -> usize {
    t.numel() * t.dtype().size_in_bytes()
}
