//! The wgpu backend of hybrid-trainer: one API for Vulkan, Metal and DX12 GPUs (seed E's primary).
//! It implements `gpu_core::Backend` (buffers, transfers, a pool, cached pipelines, typed errors),
//! implements `gpu_core::nn::Primitives` and `MatmulOps` with WGSL kernels (`src/shaders/`), and so
//! every other op family of `gpu_core::nn` through its default body (see docs/wgpu.md).
//!
//! Storage: every buffer is a wgpu storage buffer. f32 and u32 hold one element per 32-bit word;
//! f16 and bf16 hold their raw 2-byte values, two per word (element `2w` in the low half of word
//! `w`, little-endian, as in host memory), the buffer padded to a whole word.

mod attention;
mod backend;
mod buffer;
mod decode;
mod error;
mod kernels;
mod matmul;
mod optim;
mod prim_kernels;
mod prims;
mod probe;
mod profile;
mod quant;
mod readback;
mod record;
mod rows;
mod sample;
mod shaders;
mod status;
pub mod testing;

pub use backend::{WgpuBackend, WgpuInfo, POLL_TIMEOUT_ENV};
pub use buffer::{WgpuBuffer, POOL_ENV};
pub use error::WgpuError;
pub use kernels::{BinaryOp, RowReduce, UnaryOp};
pub use probe::{adapters, register_device_probe};
pub use profile::KernelTime;
pub use quant::F16Loads;
pub use readback::ReadBack;
