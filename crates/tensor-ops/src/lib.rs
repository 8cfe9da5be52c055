//! `tensor-ops`: device-aware tensors and reverse-mode autograd for hybrid-trainer.
//! Every op runs where its inputs live (CPU reference, CUDA or wgpu), moving data only through an
//! explicit `to(device)`; a transfer counter makes hidden copies testable.

pub mod autocast;
mod autograd;
mod backend;
mod bound;
pub mod dist;
pub mod fsio;
pub mod graph;
mod interop;
mod ndarray_io;
pub mod nn;
pub mod ops;
pub mod optim;
mod pool;
mod storage;
mod tensor;

pub use autocast::{autocast, Precision};
pub use autograd::{no_grad, Gradients};
pub use backend::{
    cuda_backend, register_wgpu_probe, synchronize, transfer_stats, wgpu_backend,
    with_primitives_only, TransferStats,
};
pub use gpu_core::{DType, Device, GpuError, Result};
pub use gpu_wgpu::KernelTime;
/// The `ndarray` version [`Tensor::from_ndarray`] and [`Tensor::to_ndarray`] speak.
pub use ndarray;
pub use ops::decode::CacheView;
pub use ops::quant::QuantWeight;
pub use ops::sample::SampleParams;
pub use storage::Storage;
pub use tensor::Tensor;
