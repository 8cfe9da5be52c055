//! Neural-network operations, forward and backward, as small dispatch traits (one per family).
//! A backend implements the [`Primitives`] (and [`MatmulOps`] and [`Backend`](crate::Backend));
//! every family method has a default body built from them (`nn/defaults/`), which the CPU
//! backend (`crate::cpu`, the reference) and `gpu-cuda` (the kernels of `kernels/`) override.
//! `tensor-ops` builds tensors and autograd on top and calls only these traits.
//!
//! **The primitives** (required; [`primitives`]): `fill`, `cast`, `copy_blocks`, `permute`,
//! `broadcast_binary` (the zip), `activation_fwd`/`activation_bwd` (the map and its
//! derivative), `reduce_axis`, `argmax_rows`, `gather_rows`, `scatter_add_rows`, `dropout` (the
//! counter-based mask), and `matmul` ([`MatmulOps`]).
//!
//! **What a second backend must implement**: [`Backend`](crate::Backend)'s 8 required methods
//! (buffers, host copies, synchronize), [`MatmulOps::matmul`] and the 12 primitives, then one
//! empty `impl` per family. [`crate::testing::PrimitivesOnly`] is exactly that: 27 lines of
//! `Backend`, 12 of `MatmulOps`, 61 of `Primitives` and 8 empty family impls (113 lines, each
//! method a call into the CPU backend); the GPT's training step (with and without dropout),
//! the world model and greedy decoding of the Hugging Face fixtures run on it and match the
//! CPU backend (`gpu-core/tests/{primitives_only,side_doors}.rs`, `models/tests/primitives_only*.rs`,
//! `rssm/tests/{world_model,device_engine}.rs`).
//!
//! Where each family lives (the same stem everywhere); every method listed defaults, and the
//! defaults are of two kinds (`nn/defaults/mod.rs`): device compositions of the primitives, and
//! host fallbacks (copy to the host, run the CPU reference, copy back):
//!
//! | family | methods (default kind) | definition, checks | CPU reference | CUDA launch | kernels | parity tests |
//! |---|---|---|---|---|---|---|
//! | activations | the vocabulary of `activation_fwd`/`_bwd` (primitives) | `nn/activation.rs` | `cpu/elementwise.rs` | `gpu-cuda/src/nn/elementwise.rs` | `kernels/nn_elementwise.cu` + generated `nn_activations.cuh` | `gpu-cuda/tests/nn_elementwise.rs` |
//! | elementwise, broadcast, reductions, data movement | `affine`, `max_axis_bwd` (composed); `dropout_offset` (the seed offset read on the host; CUDA reads it on the device, for graphs) | `nn/elementwise.rs` | `cpu/elementwise.rs` | `gpu-cuda/src/nn/elementwise.rs` | `kernels/nn_elementwise.cu`, `nn_reduce.cu` | `gpu-cuda/tests/nn_elementwise.rs` |
//! | rows: softmax, log-softmax, cross-entropy, norms, RoPE, embedding | all (composed) | `nn/rows.rs` | `cpu/rows.rs` | `gpu-cuda/src/nn/rows.rs` | `kernels/nn_rows.cu`, `nn_embed.cu` | `gpu-cuda/tests/nn_rows*.rs` |
//! | causal attention, unpacked and packed (f32/bf16, attention dropout, device seed offsets) | `causal_attention_{fwd,bwd}`, `attention_packed_{fwd,bwd}` (composed: materialised `[n, t, t]` scores; the dropout is the `dropout` primitive on the probabilities; packed by permutes) | `nn/attention.rs` | `cpu/attention.rs`, `attention_packed.rs`, `attention_bf16.rs` | `gpu-cuda/src/nn/attention.rs`, `attention_bf16.rs` | `kernels/nn_attention.cu` | `gpu-cuda/tests/nn_attention*.rs` |
//! | decoding over a KV cache: RoPE + cache writes, cache attention, argmax | norms, SwiGLU (composed); cache ops (host) | `nn/decode.rs` | `cpu/decode.rs` | `gpu-cuda/src/nn/decode.rs` | `kernels/nn_decode.cu` | `gpu-cuda/tests/nn_decode.rs` |
//! | weight-only int8/int4 matmul and dequantization | all (host) | `nn/quant.rs` | `cpu/quant.rs` | `gpu-cuda/src/nn/quant.rs` | `kernels/nn_gemv_q.cu` (+ cuBLAS for prefill) | `gpu-cuda/tests/nn_quant.rs` |
//! | token sampling: repetition penalty, temperature, top-k, top-p, Philox draw | all (host) | `nn/sample.rs` | `cpu/sample.rs` | `gpu-cuda/src/nn/sample.rs` | `kernels/nn_sample.cu` | `gpu-cuda/tests/nn_sample.rs` |
//! | AdamW (eager and scheduled), Schedule-Free AdamW, Prodigy, gradient clipping, lerp | AdamW, `adamw_step_scheduled` (the schedule read on the host), lerp (composed); clipping, Schedule-Free, Prodigy (host) | `nn/optim.rs`, `nn/optim_adaptive.rs` | `cpu/optim.rs`, `cpu/optim_adaptive.rs` | `gpu-cuda/src/nn/optim.rs` | `kernels/nn_optim.cu` | `gpu-cuda/tests/nn_optim.rs` |
//! | the world model: max magnitude, checked low-rank correction, ensemble rollout over packed weights | all (composed: two max reductions; a scaled product added in a temporary, checked, then copied; GRU, heads and decoder step by step) | `nn/world.rs` | the defaults on the CPU's primitives (`cpu/world.rs`: a vectorised max); f64 reference `rssm::reference` | `gpu-cuda/src/nn/world.rs` | `kernels/linalg_amax.cu`, `rssm_correct.cu`, `rssm_rollout*.cu` | `rssm/tests/device_engine.rs`, `gpu_rollout.rs`, `gpu_lowrank.rs` |
//! | matmul | required | `ops.rs` ([`MatmulOps`]) | `cpu.rs` (`sgemm_rows`) | `gpu-cuda/src/ops.rs`, `blas.rs` | cuBLAS | `gpu-cuda/tests/matmul.rs` |
//!
//! The defaults that read a device value on the host (index buffers, seed offsets, schedules,
//! the host fallbacks) synchronise and cannot be captured in a CUDA graph: a backend that
//! records graphs overrides them (CUDA does).
//!
//! Float buffers are f32; the elementwise, reduction and data-movement families, matmul and the
//! packed attention also take bf16 (f32 arithmetic, one rounding at the
//! output: bf16 mixed precision). Index buffers (token ids, targets) are u32. Every method
//! checks its buffers' dtypes and lengths and returns a typed error on a mismatch; outputs are
//! fully overwritten (never accumulated into) unless the doc says otherwise.

/// `Clone` and `Copy` for argument structs `$t<'_, Buf>` that hold only references and
/// plain values: `derive` would ask `Buf: Copy`, which a device buffer is not.
macro_rules! copy_refs {
    ($($t:ident),*) => {$(
        impl<Buf> Clone for $t<'_, Buf> {
            fn clone(&self) -> Self {
                *self
            }
        }
        impl<Buf> Copy for $t<'_, Buf> {}
    )*};
}

/// An argument struct of references and plain values (`Debug`, and `Clone`/`Copy` by
/// [`copy_refs`]) with `new`, which takes every field in order: for the structs whose callers
/// build them in one expression.
macro_rules! arg_struct {
    (
        $(#[$m:meta])*
        pub struct $t:ident<'a, Buf> {
            $($(#[$fm:meta])* pub $f:ident: $ty:ty,)*
        }
    ) => {
        $(#[$m])*
        #[derive(Debug)]
        pub struct $t<'a, Buf> {
            $($(#[$fm])* pub $f: $ty,)*
        }

        impl<'a, Buf> $t<'a, Buf> {
            #[doc = concat!("A [`", stringify!($t), "`] of its fields, in their order.")]
            pub fn new($($f: $ty),*) -> Self {
                $t { $($f),* }
            }
        }

        copy_refs!($t);
    };
}

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
pub mod world;

pub use activation::{Activation, Direction, Saved};
pub use attention::AttentionOps;
pub use decode::{DecodeDims, DecodeOps};
pub use elementwise::{BinaryKind, ElementwiseOps, ReduceKind};
pub use optim::{AdamWConfig, OptimOps};
pub use primitives::{BlockCopy, IdRows, Primitives};
pub use quant::{QuantFormat, QuantOps, QuantSpec, QUANT_GROUP};
pub use rows::RowOps;
pub use sample::{SampleOps, SampleParams};
pub use world::{
    LowRankFactors, LowRankOutcome, RolloutCall, RolloutDims, SvdMethod, SvdOut, SvdOutcome,
    SvdSpec, WorldOps,
};

pub use crate::ops::MatmulOps;

/// Defines [`NnOps`] as the sum of the op families, implemented for every backend that has
/// them all (one list for both).
macro_rules! all_families {
    ($($family:ident),+) => {
        /// Every op family together: what `tensor-ops` needs from a backend.
        pub trait NnOps: $($family +)+ {}
        impl<B: $($family +)+> NnOps for B {}
    };
}
all_families!(
    Primitives,
    ElementwiseOps,
    RowOps,
    AttentionOps,
    DecodeOps,
    QuantOps,
    SampleOps,
    OptimOps,
    WorldOps,
    MatmulOps
);
