//! What a `train-gpt` run spends and reaches: its counters (backward and forward passes,
//! seconds of training with everything the trainer does, evaluations excluded) and its
//! evaluation curve, written as JSON with `--curve`.

use crate::control::hybrid::ControlCosts;
use crate::control::DecisionRecord;
use serde::{Deserialize, Serialize};

/// An evaluation, with what the run had spent to reach it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EvalPoint {
    pub iter: u32,
    /// Backward passes so far (a rolled-back step counts: it was spent).
    pub backward: u64,
    /// Forward passes so far: one per training step plus the trainer's own probes (the
    /// evaluations' own are not counted: every arm makes the same ones).
    pub forward: u64,
    /// Seconds of training so far: steps, probes, the world model, snapshots, range tests;
    /// not the evaluations.
    pub seconds: f64,
    /// NaN when the train split was not evaluated (`null` in JSON, as every non-finite loss).
    #[serde(with = "crate::report::finite::f32_or_null")]
    pub train: f32,
    #[serde(with = "crate::report::finite::f32_or_null")]
    pub val: f32,
    /// The learning rate the last step ran at.
    pub lr: f32,
}

/// Everything `--curve` writes.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct RunCurve {
    pub mode: String,
    pub optimizer: String,
    /// The peak learning rate the user gave.
    pub given_lr: f32,
    /// The peak rate training used (the range test's pick; else the given one).
    pub peak_lr: f32,
    pub seed: u64,
    pub iters: u32,
    pub evals: Vec<EvalPoint>,
    /// The step-size controller's decisions (hybrid).
    pub decisions: Vec<DecisionRecord>,
    /// What the controller's own work cost (hybrid).
    pub costs: Option<ControlCosts>,
    pub rollbacks: u32,
    /// Backward passes the range test spent before training.
    pub range_test_steps: u32,
    pub total_seconds: f64,
    pub eval_seconds: f64,
    /// Why training stopped early (a non-finite loss), when it did.
    pub diverged: Option<String>,
}

/// What a `train-gpt` checkpoint keeps of the driver (`driver.json`), so that a resumed run's
/// curve and counters go on: the curve so far, the counters, and the range test's scale.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DriverState {
    pub curve: RunCurve,
    pub backward: u64,
    pub forward: u64,
    pub train_seconds: f64,
    pub rate_scale: f32,
}

/// The file of [`DriverState`] in a checkpoint.
pub const DRIVER_FILE: &str = "driver.json";

/// The run's counters.
#[derive(Debug, Clone, Copy, Default)]
pub struct Spent {
    pub backward: u64,
    pub forward: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Non-finite losses survive a JSON round trip as NaN; finite ones exactly.
    #[test]
    fn non_finite_losses_round_trip_as_nan() {
        for (train, val) in [(f32::NAN, 1.25f32), (2.5, f32::INFINITY), (0.1, 0.2)] {
            let p = EvalPoint {
                iter: 1,
                backward: 2,
                forward: 3,
                seconds: 0.5,
                train,
                val,
                lr: 1e-3,
            };
            let back: EvalPoint =
                serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
            for (a, b) in [(train, back.train), (val, back.val)] {
                assert!(
                    if a.is_finite() { a == b } else { b.is_nan() },
                    "{a} -> {b}"
                );
            }
        }
    }
}
