//! Causal self-attention straight from a fused q/k/v projection (a GPT's `c_attn` output), with
//! no split, permute or concatenation copies on CUDA.

use crate::backend::cuda_backend;
use crate::storage::Storage;
use crate::tensor::{require_f32, Tensor};
use gpu_core::{Backend, DType, Device, GpuError, Result};

impl Tensor {
    /// Causal scaled-dot-product attention of `qkv` `[b, t, 3c]`, whose three column blocks are
    /// q, k and v of `heads` heads of width `d = c / heads` (head `h` at columns `h·d..` of each
    /// block); returns `[b, t, c]`, the heads side by side. The same function, bit for bit, as
    /// splitting the blocks, permuting each to `[b, heads, t, d]`,
    /// [`Tensor::causal_attention`] and permuting back (which is what the CPU runs). On CUDA the
    /// kernels read q, k and v where they lie and write the output and, backward, the gradient
    /// of `qkv` in place: none of the ten copies of the composed form.
    pub fn causal_attention_packed(&self, heads: usize) -> Result<Tensor> {
        const OP: &str = "causal_attention_packed";
        require_f32(OP, self)?;
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
        let (c, d) = (c3 / 3, c3 / 3 / heads);
        match self.device() {
            Device::Cpu => composed(self, b, t, c, heads, d),
            Device::Cuda(i) => packed_cuda(self, i, b, t, heads, d),
        }
    }
}

/// The composition the packed op stands for (the CPU path).
fn composed(qkv: &Tensor, b: usize, t: usize, c: usize, nh: usize, hd: usize) -> Result<Tensor> {
    let head = |i: usize| -> Result<Tensor> {
        qkv.narrow(2, i * c, c)?
            .reshape(&[b, t, nh, hd])?
            .permute(&[0, 2, 1, 3])
    };
    Tensor::causal_attention(&head(0)?, &head(1)?, &head(2)?)?
        .permute(&[0, 2, 1, 3])?
        .reshape(&[b, t, c])
}

fn cuda_buf<'a>(op: &'static str, s: &'a Storage) -> Result<&'a gpu_cuda::CudaBuffer> {
    match s {
        Storage::Cuda(b) => Ok(b),
        Storage::Cpu(_) => Err(GpuError::invalid(op, "storage and device disagree")),
    }
}

fn packed_cuda(
    qkv: &Tensor,
    ordinal: usize,
    b: usize,
    t: usize,
    nh: usize,
    hd: usize,
) -> Result<Tensor> {
    const OP: &str = "causal_attention_packed";
    let dev = Device::Cuda(ordinal);
    let gpu = cuda_backend(ordinal)?;
    let c = nh * hd;
    let scale = 1.0 / (hd as f32).sqrt();
    let (out, lse) = {
        let g = qkv.read();
        let mut out = gpu.allocate(DType::F32, b * t * c)?;
        let mut lse = gpu.allocate(DType::F32, b * nh * t)?;
        gpu.causal_attention_packed_fwd(
            cuda_buf(OP, &g)?,
            &mut out,
            &mut lse,
            b,
            t,
            nh,
            hd,
            scale,
        )?;
        (out, lse)
    };
    let lse = Tensor::from_storage(Storage::Cuda(lse), vec![b * nh, t], dev);
    let input = qkv.clone();
    Ok(Tensor::from_op(
        Storage::Cuda(out),
        vec![b, t, c],
        dev,
        OP,
        &[qkv],
        move |o, g| {
            let gpu = cuda_backend(ordinal)?;
            let (gq, go, gl, gg) = (input.read(), o.read(), lse.read(), g.read());
            let mut dqkv = gpu.allocate(DType::F32, b * t * 3 * c)?;
            gpu.causal_attention_packed_bwd(
                cuda_buf(OP, &gq)?,
                cuda_buf(OP, &go)?,
                cuda_buf(OP, &gl)?,
                cuda_buf(OP, &gg)?,
                &mut dqkv,
                b,
                t,
                nh,
                hd,
                scale,
            )?;
            Ok(vec![Some(Tensor::from_storage(
                Storage::Cuda(dqkv),
                vec![b, t, 3 * c],
                dev,
            ))])
        },
    ))
}
