//! Neural-network operations, forward and backward, as small dispatch traits (one per family).
//! The CPU backend implements each in `crate::cpu` (the reference); `gpu-cuda` implements them
//! with the kernels of `kernels/`. `tensor-ops` builds tensors and autograd on top.
//!
//! All float buffers are f32; index buffers (token ids, targets) are u32. Every method checks its
//! buffers' dtypes and lengths and returns a typed error on a mismatch; outputs are fully
//! overwritten (never accumulated into) unless the doc says otherwise.

pub mod activation;
pub mod attention;
pub mod elementwise;
pub mod optim;
pub mod rows;

pub use activation::{Activation, Direction, Saved};
pub use attention::AttentionOps;
pub use elementwise::{BinaryKind, ElementwiseOps, ReduceKind};
pub use optim::{AdamWConfig, OptimOps};
pub use rows::RowOps;

pub use crate::ops::MatmulOps;

/// Every op family together: what `tensor-ops` needs from a backend.
pub trait NnOps: ElementwiseOps + RowOps + AttentionOps + OptimOps + MatmulOps {}
impl<B: ElementwiseOps + RowOps + AttentionOps + OptimOps + MatmulOps> NnOps for B {}
