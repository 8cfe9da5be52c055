//! `hybrid-trainer`: the command line of the workspace (`main.rs`), over the `trainer`
//! library (training, the hybrid, the main job, experiments) and the `inference` commands;
//! what only the command line has lives here: the GPU demo, the multi-process launcher and its
//! self-tests and benchmark, and the parity dumps that the PyTorch scripts compare with.

pub mod demo;
pub mod dist_bench;
pub mod dist_selftest;
pub mod launch;
pub mod parity;
pub mod parity_gru;
