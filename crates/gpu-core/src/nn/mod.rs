//! Neural-network operations, forward and backward, as small dispatch traits (one per family).
//! The CPU backend implements each in `crate::cpu` (the reference); `gpu-cuda` implements them
//! with the kernels of `kernels/`. `tensor-ops` builds tensors and autograd on top.
//!
//! Where each family lives (the same stem everywhere):
//!
//! | family | definition, checks | CPU reference | CUDA launch | kernels | parity tests |
//! |---|---|---|---|---|---|
//! | activations | `nn/activation.rs` (the vocabulary) | `cpu/elementwise.rs` | `gpu-cuda/src/nn/elementwise.rs` | `kernels/nn_elementwise.cu` + generated `nn_activations.cuh` | `gpu-cuda/tests/nn_elementwise.rs` |
//! | elementwise, broadcast, reductions, data movement | `nn/elementwise.rs` | `cpu/elementwise.rs` | `gpu-cuda/src/nn/elementwise.rs` | `kernels/nn_elementwise.cu`, `nn_reduce.cu` | `gpu-cuda/tests/nn_elementwise.rs` |
//! | rows: softmax, log-softmax, cross-entropy, norms, RoPE, embedding | `nn/rows.rs` | `cpu/rows.rs` | `gpu-cuda/src/nn/rows.rs` | `kernels/nn_rows.cu`, `nn_embed.cu` | `gpu-cuda/tests/nn_rows*.rs` |
//! | causal attention | `nn/attention.rs` | `cpu/attention.rs` | `gpu-cuda/src/nn/attention.rs` | `kernels/nn_attention.cu` | `gpu-cuda/tests/nn_attention.rs` |
//! | decoding over a KV cache: RoPE + cache writes, cache attention, argmax | `nn/decode.rs` | `cpu/decode.rs` | `gpu-cuda/src/nn/decode.rs` | `kernels/nn_decode.cu` | `gpu-cuda/tests/nn_decode.rs` |
//! | weight-only int8/int4 matmul and dequantization | `nn/quant.rs` | `cpu/quant.rs` | `gpu-cuda/src/nn/quant.rs` | `kernels/nn_gemv_q.cu` (+ cuBLAS for prefill) | `gpu-cuda/tests/nn_quant.rs` |
//! | token sampling: repetition penalty, temperature, top-k, top-p, Philox draw | `nn/sample.rs` | `cpu/sample.rs` | `gpu-cuda/src/nn/sample.rs` | `kernels/nn_sample.cu` | `gpu-cuda/tests/nn_sample.rs` |
//! | AdamW, Schedule-Free AdamW, Prodigy, gradient clipping | `nn/optim.rs`, `nn/optim_adaptive.rs` | `cpu/optim.rs`, `cpu/optim_adaptive.rs` | `gpu-cuda/src/nn/optim.rs` | `kernels/nn_optim.cu` | `gpu-cuda/tests/nn_optim.rs` |
//! | matmul | `ops.rs` ([`MatmulOps`]) | `cpu.rs` (`sgemm_rows`) | `gpu-cuda/src/ops.rs`, `blas.rs` | cuBLAS | `gpu-cuda/tests/matmul.rs` |
//!
//! Float buffers are f32; the elementwise, reduction and data-movement families, matmul and the
//! packed attention (`cpu::attention_bf16`) also take bf16 (f32 arithmetic, one rounding at the
//! output: bf16 mixed precision). Index buffers (token ids, targets) are u32. Every method
//! checks its buffers' dtypes and lengths and returns a typed error on a mismatch; outputs are
//! fully overwritten (never accumulated into) unless the doc says otherwise.

pub mod activation;
pub mod attention;
pub mod decode;
pub mod defaults;
pub mod elementwise;
pub mod optim;
pub mod optim_adaptive;
pub mod primitives;
pub mod quant;
pub mod rows;
pub mod sample;

pub use activation::{Activation, Direction, Saved};
pub use attention::AttentionOps;
pub use decode::{DecodeDims, DecodeOps};
pub use elementwise::{BinaryKind, ElementwiseOps, ReduceKind};
pub use optim::{AdamWConfig, OptimOps};
pub use primitives::Primitives;
pub use quant::{QuantFormat, QuantOps, QuantSpec, QUANT_GROUP};
pub use rows::RowOps;
pub use sample::{SampleOps, SampleParams};

pub use crate::ops::MatmulOps;

/// Every op family together: what `tensor-ops` needs from a backend.
pub trait NnOps:
    Primitives
    + ElementwiseOps
    + RowOps
    + AttentionOps
    + DecodeOps
    + QuantOps
    + SampleOps
    + OptimOps
    + MatmulOps
{
}
impl<B> NnOps for B where
    B: Primitives
        + ElementwiseOps
        + RowOps
        + AttentionOps
        + DecodeOps
        + QuantOps
        + SampleOps
        + OptimOps
        + MatmulOps
{
}
