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
    /// The validation loss of the moving average of the weights (`--ema-decay`), on the same
    /// batches as `val`; NaN (absent from the JSON) when the run keeps none.
    #[serde(
        default = "no_loss",
        skip_serializing_if = "is_nan",
        with = "crate::report::finite::f32_or_null"
    )]
    pub ema_val: f32,
}

fn no_loss() -> f32 {
    f32::NAN
}

fn is_nan(x: &f32) -> bool {
    x.is_nan()
}

/// The moving average of the weights a run kept (`--ema-decay`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct EmaRecord {
    pub decay: f32,
    /// Updates (one after every step).
    pub updates: u64,
    /// Host seconds of the updates (the launches' on CUDA); inside `seconds` of the evaluations
    /// (the run did them), its evaluations not.
    pub seconds: f64,
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
    /// The moving average of the weights, when the run kept one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ema: Option<EmaRecord>,
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
impl RunCurve {
    /// A hand-made run for tests: evaluations `vals` every 10 steps (10 backward and forward
    /// passes), `secs` seconds apart, at rate 1e-3, without training or EMA losses.
    pub(crate) fn every_ten_passes(vals: &[f32], secs: f64) -> RunCurve {
        RunCurve {
            evals: (vals.iter().enumerate())
                .map(|(i, &val)| EvalPoint {
                    iter: 10 * i as u32,
                    backward: 10 * i as u64,
                    forward: 10 * i as u64,
                    seconds: secs * i as f64,
                    train: f32::NAN,
                    val,
                    lr: 1e-3,
                    ema_val: f32::NAN,
                })
                .collect(),
            ..RunCurve::default()
        }
    }
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
                ema_val: val,
            };
            let back: EvalPoint =
                serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
            for (a, b) in [(train, back.train), (val, back.val), (val, back.ema_val)] {
                assert!(
                    if a.is_finite() { a == b } else { b.is_nan() },
                    "{a} -> {b}"
                );
            }
        }
    }

    /// A run without `--ema-decay` writes no `ema_val` (its curves are as before), and a curve
    /// written before the field existed reads it as NaN.
    #[test]
    fn ema_val_is_absent_without_an_average() {
        let p = EvalPoint {
            iter: 1,
            backward: 2,
            forward: 3,
            seconds: 0.5,
            train: 1.0,
            val: 1.5,
            lr: 1e-3,
            ema_val: f32::NAN,
        };
        let text = serde_json::to_string(&p).unwrap();
        assert!(!text.contains("ema_val"), "{text}");
        let back: EvalPoint = serde_json::from_str(&text).unwrap();
        assert!(back.ema_val.is_nan() && back.val == 1.5);
        let with = EvalPoint { ema_val: 1.25, ..p };
        let text = serde_json::to_string(&with).unwrap();
        assert!(text.contains("\"ema_val\":1.25"), "{text}");
    }
}
