//! `hybrid-trainer`: the top layer of the workspace: the training driver ([`train_gpt`]), the
//! hybrid trainer (the step-size controller of [`control`]), the main job ([`job`], what the
//! CLI runs by default: the hybrid against AdamW) and experiment ([`experiment`]), with
//! reports, the embedded corpus, the GPU demo and parity dumps.

pub mod control;
pub mod corpus;
pub mod demo;
pub mod dist_bench;
pub mod dist_selftest;
pub mod experiment;
pub mod job;
pub mod launch;
pub mod parity;
pub mod parity_gru;
pub mod report;
pub mod tensor_file;
pub mod train_args;
pub mod train_ckpt;
pub mod train_curve;
pub mod train_gpt;
pub mod train_step;
