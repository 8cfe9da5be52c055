//! Causal self-attention straight from a fused q/k/v projection (a GPT's `c_attn` output), with
//! no split, permute or concatenation copies.

use crate::backend::{on_device, DeviceBackend};
use crate::ops::buf;
use crate::tensor::{require_f32, Tensor};
use gpu_core::cpu::attention_bf16::HEAD_DIM_BF16;
use gpu_core::nn::attention::Packed;
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
        const OP: &str = "causal_attention_packed";
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
        if bf16 && p.d != HEAD_DIM_BF16 {
            // The bf16 kernels are for head dimension 64: other widths compute in f32 (the
            // bf16 input widens exactly) and give an f32 output.
            return self
                .to_dtype(gpu_core::DType::F32)?
                .causal_attention_packed(heads);
        }
        packed(self, p)
    }
}

fn packed(qkv: &Tensor, p: Packed) -> Result<Tensor> {
    const OP: &str = "causal_attention_packed";
    let dev = qkv.device();
    let (b, t, c) = (p.b, p.t, p.c());
    let scale = 1.0 / (p.d as f32).sqrt();
    let g = qkv.read();
    let dtype = qkv.dtype();
    let (out, lse) = on_device!(dev, |be| {
        let mut out = be.alloc_output_as(dtype, b * t * c)?;
        let mut lse = be.alloc_output(p.n() * t)?;
        be.attention_packed_fwd(buf(be, &g)?, &mut out, &mut lse, p, scale)?;
        (crate::ops::wrap(be, out), crate::ops::wrap(be, lse))
    });
    drop(g);
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
            let dqkv = on_device!(dev, |be| {
                let mut dqkv = be.alloc_output_as(dtype, b * t * 3 * c)?;
                let (q, o, l, d) = (buf(be, &gq)?, buf(be, &go)?, buf(be, &gl)?, buf(be, &gg)?);
                be.attention_packed_bwd(q, o, l, d, &mut dqkv, p, scale)?;
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
