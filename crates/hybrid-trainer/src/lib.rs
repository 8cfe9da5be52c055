//! `hybrid-trainer`: the top layer of the workspace and its CLI.
//! Today it holds the GPU demo (seed C) that the CLI runs by default and the GPT training loop;
//! the hybrid predictive trainer and its `GpuAccelerator` arrive with their own issues.

pub mod corpus;
pub mod demo;
pub mod hybrid;
pub mod parity;
pub mod parity_gru;
pub mod report;
pub mod train_gpt;
