//! `trainer`: the training library under the `hybrid-trainer` command line: the training
//! driver ([`train_gpt`]: one loop for AdamW, the hybrid and the range test), the hybrid
//! trainer (the step-size controller of [`control`] and its world model), the main job
//! ([`job`]: the hybrid against AdamW), the experiment ([`experiment`]) and its reports, the
//! checkpoints and curves, and the embedded corpus.

pub mod control;
pub mod corpus;
pub mod experiment;
pub mod job;
pub mod report;
pub mod tensor_file;
pub mod train_args;
pub mod train_ckpt;
pub mod train_curve;
pub mod train_gpt;
pub mod train_step;
