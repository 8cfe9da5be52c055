//! Decoding over a preallocated key/value cache (`gpu_core::nn::decode`): rotary positions and
//! cache writes from a fused projection, attention against the cache, and the argmax of rows.
//! Inference only: the outputs carry no gradient, and the caches are written in place.

use crate::backend::on_device;
use crate::ops::{buf, buf_mut};
use crate::tensor::{same_device, Tensor};
use gpu_core::nn::decode::DecodeDims;
use gpu_core::nn::decode::{CacheAttnIn, PrefillIn, RopeAppendIn, RopeAppendOut};
use gpu_core::nn::DecodeOps;
use gpu_core::nn::Primitives;
use gpu_core::{Backend, DType, GpuError, Result};

/// A layer's key and value caches, `[b, kv_heads, cap, d]` each (f32 or bf16), where each
/// batch row stands (`start`, `slot`: u32 `[b]`, see `gpu_core::nn::decode`), and the layer's
/// sliding window (`None`: full causal attention; see `DecodeDims::window`).
#[derive(Debug, Clone, Copy)]
pub struct CacheView<'a> {
    pub k: &'a Tensor,
    pub v: &'a Tensor,
    pub start: &'a Tensor,
    pub slot: &'a Tensor,
    pub window: Option<usize>,
}

impl CacheView<'_> {
    /// The decode sizes of `t` new tokens with `heads` query heads, from the caches' shape.
    fn dims(&self, op: &'static str, t: usize, heads: usize) -> Result<DecodeDims> {
        let &[b, kv_heads, cap, d] = self.k.shape() else {
            return Err(GpuError::shape(
                op,
                "caches of shape [b, kv_heads, cap, d]",
                format!("{:?}", self.k.shape()),
            ));
        };
        if self.v.shape() != self.k.shape() {
            return Err(GpuError::shape(
                op,
                format!("a value cache of shape {:?}", self.k.shape()),
                format!("{:?}", self.v.shape()),
            ));
        }
        let dims = DecodeDims {
            b,
            t,
            heads,
            kv_heads,
            d,
            cap,
            window: self.window,
        };
        dims.check(op)?;
        Ok(dims)
    }

    /// The decode sizes of queries `q` `[b, t, heads, d]` against these caches (their `b` and
    /// `d` must be the caches').
    fn query_dims(&self, op: &'static str, q: &Tensor) -> Result<DecodeDims> {
        let &[_, t, heads, _] = q.shape() else {
            return Err(GpuError::shape(
                op,
                "queries of shape [b, t, heads, d]",
                format!("{:?}", q.shape()),
            ));
        };
        let dims = self.dims(op, t, heads)?;
        if q.shape() != [dims.b, t, heads, dims.d] {
            return Err(GpuError::shape(
                op,
                format!("queries [{}, {t}, {heads}, {}]", dims.b, dims.d),
                format!("{:?}", q.shape()),
            ));
        }
        Ok(dims)
    }

    /// Refuses caches that share storage with each other or with `inputs` (a write lock taken
    /// twice would deadlock, and an op must not read what it overwrites).
    fn check_distinct(&self, op: &'static str, inputs: &[&Tensor]) -> Result<()> {
        let clash = self.k.shares_storage(self.v)
            || inputs
                .iter()
                .any(|t| t.shares_storage(self.k) || t.shares_storage(self.v));
        if clash {
            return Err(GpuError::invalid(
                op,
                "the key and value caches must be two buffers, distinct from the inputs",
            ));
        }
        Ok(())
    }
}

impl Tensor {
    /// From the fused projection `self` `[b, t, (heads + 2·kv_heads)·d]`: rotates q and k by
    /// the rotary embedding of each token's position (`inv_freq` f32 `[d/2]`, or empty for no
    /// rotation), writes k and v into `cache` at each row's `slot..slot + t`, and returns the
    /// rotated queries `[b, t, heads, d]` in `q_dtype` (`DecodeOps::rope_append`).
    pub fn rope_append(
        &self,
        inv_freq: &Tensor,
        cache: CacheView<'_>,
        heads: usize,
        q_dtype: DType,
    ) -> Result<Tensor> {
        const OP: &str = "rope_append";
        let dev = same_device(
            OP,
            &[self, inv_freq, cache.k, cache.v, cache.start, cache.slot],
        )?;
        let &[b, t, _] = self.shape() else {
            return Err(GpuError::shape(
                OP,
                "qkv of shape [b, t, cols]",
                format!("{:?}", self.shape()),
            ));
        };
        let dims = cache.dims(OP, t, heads)?;
        if dims.b != b {
            return Err(GpuError::shape(OP, format!("{b} cache rows"), dims.b));
        }
        cache.check_distinct(OP, &[self, inv_freq, cache.start, cache.slot])?;
        let (x, f, st, sl) = (
            self.read(),
            inv_freq.read(),
            cache.start.read(),
            cache.slot.read(),
        );
        let (mut kc, mut vc) = (cache.k.write(), cache.v.write());
        let q = on_device!(dev, |be| {
            let mut q = be.allocate(q_dtype, dims.q_len())?;
            be.rope_append(
                RopeAppendIn {
                    qkv: buf(be, &x)?,
                    inv_freq: buf(be, &f)?,
                    start: buf(be, &st)?,
                    slot: buf(be, &sl)?,
                    dims,
                },
                RopeAppendOut {
                    q_out: &mut q,
                    k_cache: buf_mut(be, &mut kc)?,
                    v_cache: buf_mut(be, &mut vc)?,
                },
            )?;
            crate::ops::wrap(be, q)
        });
        Ok(Tensor::from_storage(q, vec![b, t, heads, dims.d], dev))
    }

    /// Attention of the queries `self` `[b, t, heads, d]` against `cache` (causal, from each
    /// row's `start`, within the cache's window; `DecodeOps::cache_attention`), with scores
    /// `scale·q·k`; returns
    /// `[b, t, heads·d]` in the queries' dtype. `max_end` bounds every row's `slot + t`.
    pub fn cache_attention(
        &self,
        cache: CacheView<'_>,
        max_end: usize,
        scale: f32,
    ) -> Result<Tensor> {
        self.attend_cache("cache_attention", cache, Some(max_end), scale)
    }

    /// [`Tensor::cache_attention`] of a fresh prefill (`DecodeOps::prefill_attention`): each
    /// row's `t` queries `self` `[b, t, heads, d]` are its slots `0..t` of the caches `k`, `v`
    /// (written there by [`Tensor::rope_append`] at slot 0), so query `i` attends to slots
    /// `start[r]..=i` (the last `W` of them under a sliding `window` `W`). On CUDA, bf16
    /// queries and caches of head width 64 or 128 take a tensor-core flash attention. Returns
    /// `[b, t, heads·d]` in the queries' dtype.
    pub fn prefill_attention(
        &self,
        k: &Tensor,
        v: &Tensor,
        start: &Tensor,
        window: Option<usize>,
        scale: f32,
    ) -> Result<Tensor> {
        let cache = CacheView {
            k,
            v,
            start,
            slot: start,
            window,
        };
        self.attend_cache("prefill_attention", cache, None, scale)
    }

    /// The body of both cache attentions: with `max_end`, [`Tensor::cache_attention`] from
    /// `cache.slot`; without, [`Tensor::prefill_attention`] (slots from 0, `cache.slot` unread).
    fn attend_cache(
        &self,
        op: &'static str,
        cache: CacheView<'_>,
        max_end: Option<usize>,
        scale: f32,
    ) -> Result<Tensor> {
        let dev = same_device(op, &[self, cache.k, cache.v, cache.start, cache.slot])?;
        let dims = cache.query_dims(op, self)?;
        let (q, kc, vc, st) = (
            self.read(),
            cache.k.read(),
            cache.v.read(),
            cache.start.read(),
        );
        let sl = max_end.map(|_| cache.slot.read());
        let dtype = self.dtype();
        let out = on_device!(dev, |be| {
            let mut out = be.allocate(dtype, dims.q_len())?;
            let (q, k_cache, v_cache) = (buf(be, &q)?, buf(be, &kc)?, buf(be, &vc)?);
            let start = buf(be, &st)?;
            match (max_end, &sl) {
                (Some(max_end), Some(sl)) => {
                    let slot = buf(be, sl)?;
                    let input = CacheAttnIn {
                        q,
                        k_cache,
                        v_cache,
                        start,
                        slot,
                        dims,
                        max_end,
                        scale,
                    };
                    be.cache_attention(input, &mut out)?;
                }
                _ => {
                    let input = PrefillIn {
                        q,
                        k_cache,
                        v_cache,
                        start,
                        dims,
                        scale,
                    };
                    be.prefill_attention(input, &mut out)?;
                }
            }
            crate::ops::wrap(be, out)
        });
        Ok(Tensor::from_storage(
            out,
            vec![dims.b, dims.t, dims.heads * dims.d],
            dev,
        ))
    }

    /// The index of the largest element of each row along the last axis, u32, of shape
    /// `self.shape()[..rank-1]` (first on ties; NaN largest, as `torch.argmax`).
    pub fn argmax_last(&self) -> Result<Tensor> {
        const OP: &str = "argmax_last";
        let Some((&cols, lead)) = self.shape().split_last() else {
            return Err(GpuError::shape(OP, "a tensor of rank >= 1", "a scalar"));
        };
        let rows: usize = lead.iter().product();
        let dev = self.device();
        let x = self.read();
        let out = on_device!(dev, |be| {
            let mut out = be.allocate(DType::U32, rows)?;
            be.argmax_rows(buf(be, &x)?, &mut out, cols)?;
            crate::ops::wrap(be, out)
        });
        Ok(Tensor::from_storage(out, lead.to_vec(), dev))
    }

    /// The residual add and RMSNorm of a decode step, fused (`DecodeOps::add_rms_norm`):
    /// `self` f32 `[.., cols]` plus `y` (f32 or bf16, same shape; `None`: nothing added), and
    /// the sum's RMSNorm times `w` (f32 `[cols]`) in `dtype`. Returns (sum, normed).
    pub fn add_rms_norm(
        &self,
        y: Option<&Tensor>,
        w: &Tensor,
        eps: f32,
        dtype: DType,
    ) -> Result<(Tensor, Tensor)> {
        const OP: &str = "add_rms_norm";
        let mut all = vec![self, w];
        all.extend(y);
        let dev = same_device(OP, &all)?;
        let Some(&cols) = self.shape().last() else {
            return Err(GpuError::shape(OP, "x of rank >= 1", "a scalar"));
        };
        if let Some(y) = y {
            if y.shape() != self.shape() {
                return Err(GpuError::shape(
                    OP,
                    format!("y of shape {:?}", self.shape()),
                    format!("{:?}", y.shape()),
                ));
            }
        }
        let n = self.numel();
        let (x, gw) = (self.read(), w.read());
        let gy = y.map(|y| y.read());
        let (sum, normed) = on_device!(dev, |be| {
            let mut sum = be.allocate(DType::F32, n)?;
            let mut normed = be.allocate(dtype, n)?;
            let yb = match &gy {
                Some(g) => Some(buf(be, g)?),
                None => None,
            };
            be.add_rms_norm(
                (buf(be, &x)?, yb, buf(be, &gw)?),
                (&mut sum, &mut normed),
                cols,
                eps,
            )?;
            (crate::ops::wrap(be, sum), crate::ops::wrap(be, normed))
        });
        let shape = self.shape().to_vec();
        Ok((
            Tensor::from_storage(sum, shape.clone(), dev),
            Tensor::from_storage(normed, shape, dev),
        ))
    }

    /// SwiGLU of a packed gate/up projection `self` `[.., 2i]` (gate columns, then up):
    /// `silu(gate) · up`, `[.., i]` in `self`'s dtype (`DecodeOps::swiglu_packed`).
    pub fn swiglu_packed(&self) -> Result<Tensor> {
        const OP: &str = "swiglu_packed";
        let dev = self.device();
        let Some((&cols, lead)) = self.shape().split_last() else {
            return Err(GpuError::shape(OP, "gu of rank >= 1", "a scalar"));
        };
        if !cols.is_multiple_of(2) {
            return Err(GpuError::shape(OP, "an even last dimension", cols));
        }
        let i = cols / 2;
        let n = self.numel() / 2;
        let g = self.read();
        let out = on_device!(dev, |be| {
            let mut out = be.allocate(self.dtype(), n)?;
            be.swiglu_packed(buf(be, &g)?, &mut out, i)?;
            crate::ops::wrap(be, out)
        });
        let mut shape = lead.to_vec();
        shape.push(i);
        Ok(Tensor::from_storage(out, shape, dev))
    }
}
