//! The NN operation families of `gpu_core::nn` on CUDA, one file per family, each launching the
//! kernels of `kernels/nn_<family>.cu`.

mod attention;
mod elementwise;
mod optim;
mod rows;
