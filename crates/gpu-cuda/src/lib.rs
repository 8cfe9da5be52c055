//! `gpu-cuda`: the CUDA backend of hybrid-trainer, on `cudarc` with dynamic loading.
//! Context and stream, lazy module cache, caching memory pool, cuBLAS SGEMM (and bf16 GEMM on
//! tensor cores, [`blas_bf16`]) and cuSOLVER
//! ([`linalg`], with Cholesky QR2 and a small Jacobi SVD in [`cholqr`] and [`small_svd`]),
//! the world model's fused correction ([`lowrank`]) and finiteness scan ([`amax`]), CUDA graphs ([`graph`]), events, kernel launchers (cudarc's, the raw driver API, cooperative), the world model's fused
//! rollout ([`rollout`]), and NVRTC for user CUDA C. Never panics without a GPU.

pub mod amax;
mod backend;
mod blas;
pub mod blas_bf16;
pub mod cholqr;
mod error;
mod gate;
pub mod graph;
mod launch;
pub mod linalg;
pub mod lowrank;
mod module;
pub mod nccl;
mod nn;
mod nvrtc;
mod ops;
mod pool;
pub mod rollout;
pub mod small_svd;
pub mod testing;
mod timer;

pub use backend::{CudaBackend, DeviceInfo, Grouping};
pub use error::{describe_driver_error, is_cooperative_launch_too_large};
pub use gpu_core::probe::{cuda_device_count, cuda_is_available};
pub use launch::{KernelArg, LaunchConfig, LaunchPath};
pub use module::ImageKind;
pub use nn::attention::DeviceAttnDropout;
pub use nn::quant::{k_splits, matmul_quant_bound, qgemm_form, QgemmForm, FUSED_GEMM_MAX_ROWS};
pub use nvrtc::UserKernel;
pub use pool::{CudaBuffer, PoolStats};
pub use timer::GpuTimer;
