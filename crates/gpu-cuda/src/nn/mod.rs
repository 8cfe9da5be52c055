//! The `gpu_core::nn` operation traits on CUDA, one module per family.

mod elementwise;
