//! Causal self-attention straight from a fused q/k/v projection (a GPT's `c_attn` output), with
//! no split, permute or concatenation copies.

use crate::backend::{on_device, DeviceBackend};
use crate::ops::buf;
use crate::tensor::{require_f32, Tensor};
use gpu_core::cpu::attention_bf16::HEAD_DIM_BF16;
use gpu_core::nn::attention::{AttnDropout, Packed, PackedCall, PackedDrop, PackedSaved};
use gpu_core::nn::AttentionOps;
use gpu_core::{GpuError, Result};

impl Tensor {
    /// Causal scaled-dot-product attention of `qkv` `[b, t, 3c]`, whose three column blocks are
    /// q, k and v of `heads` heads of width `d = c / heads` (head `h` at columns `h·d..` of each
    /// block); returns `[b, t, c]`, the heads side by side. The same function, bit for bit, as
    /// splitting the blocks, permuting each to `[b, heads, t, d]`,
    /// [`Tensor::causal_attention`] and permuting back. Both devices read q, k and v where
    /// they lie and write the output and, backward, the gradient of `qkv` in place: none of the
    /// copies of the composed form.
    pub fn causal_attention_packed(&self, heads: usize) -> Result<Tensor> {
        self.causal_attention_packed_dropout(heads, 0.0, 0, false)
    }

    /// [`Tensor::causal_attention_packed`] with dropout of the attention probabilities
    /// (PyTorch's `scaled_dot_product_attention(dropout_p = p)`; the mask of
    /// [`AttnDropout`] with `seed`, sequence `b·heads + h`), in training only; identity of the
    /// dropout (the plain attention, bit for bit) when `!training` or `p == 0`. Under
    /// [`crate::graph::with_dropout_offsets`] a training-mode call is a dropout site (also at
    /// `p = 0`, as [`Tensor::dropout`]) whose seed is completed on the device.
    pub fn causal_attention_packed_dropout(
        &self,
        heads: usize,
        dropout: f32,
        seed: u64,
        training: bool,
    ) -> Result<Tensor> {
        const OP: &str = "causal_attention_packed";
        if !(0.0..1.0).contains(&dropout) {
            return Err(GpuError::invalid(
                OP,
                format!("attention dropout p must be in [0, 1), got {dropout}"),
            ));
        }
        let bf16 = self.dtype() == gpu_core::DType::BF16;
        if !bf16 {
            require_f32(OP, self)?;
        }
        let (b, t, c3) = match self.shape() {
            &[b, t, c3] => (b, t, c3),
            s => {
                return Err(GpuError::shape(
                    OP,
                    "qkv of shape [b, t, 3c]",
                    format!("{s:?}"),
                ))
            }
        };
        if heads == 0 || !c3.is_multiple_of(3 * heads) {
            return Err(GpuError::invalid(
                OP,
                format!("{c3} columns do not split into q, k, v of {heads} heads"),
            ));
        }
        let p = Packed {
            b,
            t,
            heads,
            d: c3 / 3 / heads,
        };
        // The site's device seed offset, taken last among the checks (a refused call takes
        // none) and once, before a bf16 input may widen below.
        let offset = if training {
            crate::graph::next_dropout_offset(self.device())?
        } else {
            None
        };
        let drop =
            (training && dropout != 0.0).then_some((AttnDropout { p: dropout, seed }, offset));
        let x = if bf16 && p.d != HEAD_DIM_BF16 {
            // The bf16 kernels are for head dimension 64: other widths compute in f32 (the
            // bf16 input widens exactly) and give an f32 output.
            self.to_dtype(gpu_core::DType::F32)?
        } else {
            self.clone()
        };
        packed(&x, p, drop)
    }
}

/// A dropout and its device seed offset (the tensor and the entry).
type DropArg = Option<(AttnDropout, Option<(Tensor, usize)>)>;

/// The backend form of `drop` whose offset tensor's storage is `off` (read-locked).
fn backend_drop<'a, B: DeviceBackend>(
    be: &B,
    drop: &DropArg,
    off: Option<&'a crate::storage::Storage>,
) -> Result<Option<PackedDrop<'a, B::Buffer>>> {
    let Some((d, o)) = drop else { return Ok(None) };
    let offset = match (o, off) {
        (Some((_, k)), Some(st)) => Some((buf(be, st)?, *k)),
        _ => None,
    };
    Ok(Some(PackedDrop { drop: *d, offset }))
}

fn packed(qkv: &Tensor, p: Packed, drop: DropArg) -> Result<Tensor> {
    const OP: &str = "causal_attention_packed";
    let dev = qkv.device();
    let (b, t, c) = (p.b, p.t, p.c());
    let scale = 1.0 / (p.d as f32).sqrt();
    let g = qkv.read();
    let dtype = qkv.dtype();
    let offset_tensor = drop
        .as_ref()
        .and_then(|(_, o)| o.as_ref().map(|(t, _)| t.clone()));
    let (out, lse) = {
        let og = offset_tensor.as_ref().map(|t| t.read());
        on_device!(dev, |be| {
            let mut out = be.alloc_output_as(dtype, b * t * c)?;
            let mut lse = be.alloc_output(p.n() * t)?;
            let d = backend_drop(be, &drop, og.as_deref())?;
            let call = PackedCall {
                dims: p,
                scale,
                drop: d,
            };
            be.attention_packed_fwd(buf(be, &g)?, (&mut out, &mut lse), call)?;
            (crate::ops::wrap(be, out), crate::ops::wrap(be, lse))
        })
    };
    std::mem::drop(g);
    let lse = Tensor::from_storage(lse, vec![p.n(), t], dev);
    let input = qkv.clone();
    Ok(Tensor::from_op(
        out,
        vec![b, t, c],
        dev,
        OP,
        &[qkv],
        move |o, g| {
            let (gq, go, gl, gg) = (input.read(), o.read(), lse.read(), g.read());
            let og = offset_tensor.as_ref().map(|t| t.read());
            let dqkv = on_device!(dev, |be| {
                let mut dqkv = be.alloc_output_as(dtype, b * t * 3 * c)?;
                let (q, o, l, d) = (buf(be, &gq)?, buf(be, &go)?, buf(be, &gl)?, buf(be, &gg)?);
                let dr = backend_drop(be, &drop, og.as_deref())?;
                let call = PackedCall {
                    dims: p,
                    scale,
                    drop: dr,
                };
                let saved = PackedSaved {
                    out: o,
                    lse: l,
                    dout: d,
                };
                be.attention_packed_bwd(q, saved, &mut dqkv, call)?;
                crate::ops::wrap(be, dqkv)
            });
            Ok(vec![Some(Tensor::from_storage(
                dqkv,
                vec![b, t, 3 * c],
                dev,
            ))])
        },
    ))
}
