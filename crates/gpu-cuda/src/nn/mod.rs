//! The NN op families of `gpu_core::nn` on CUDA, one module per family.

mod rows;
