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

/// Why a curve file cannot be what `train-gpt` wrote (a hand-edited, corrupted or lying file):
/// the analysis reads the evaluations in order and would cost such a run wrongly.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CurveError {
    #[error(
        "evaluation {index}: {field} {value} goes back from the previous evaluation's {previous}"
    )]
    OutOfOrder {
        index: usize,
        field: &'static str,
        value: f64,
        previous: f64,
    },
    #[error("evaluation {index}: {field} is {value}, not {what}")]
    BadEval {
        index: usize,
        field: &'static str,
        value: f64,
        what: &'static str,
    },
    #[error("evaluation {index} is at step {iter}, past the run's {iters} steps")]
    PastTheEnd { index: usize, iter: u32, iters: u32 },
    #[error("{field} is {value}, not {what}")]
    BadRun {
        field: &'static str,
        value: f64,
        what: &'static str,
    },
}

const POSITIVE: &str = "a positive finite number";
const SECONDS: &str = "a finite number of seconds ≥ 0";
const LOSS: &str = "a loss ≥ 0 (or null)";

impl RunCurve {
    /// Checks what the analysis relies on: positive finite rates, finite non-negative seconds
    /// (the evaluations' within the total), and evaluations in step order whose counters and
    /// seconds never go back, at most at the run's last step, with losses ≥ 0 or NaN (`null`:
    /// a diverged run's).
    pub fn check(&self) -> Result<(), CurveError> {
        let run = |field, value: f64, ok: bool, what| match ok {
            true => Ok(()),
            false => Err(CurveError::BadRun { field, value, what }),
        };
        for (field, lr) in [("given_lr", self.given_lr), ("peak_lr", self.peak_lr)] {
            run(field, lr as f64, lr.is_finite() && lr > 0.0, POSITIVE)?;
        }
        let (total, evals) = (self.total_seconds, self.eval_seconds);
        run(
            "total_seconds",
            total,
            total.is_finite() && total >= 0.0,
            SECONDS,
        )?;
        run(
            "eval_seconds",
            evals,
            evals.is_finite() && evals >= 0.0,
            SECONDS,
        )?;
        run(
            "eval_seconds",
            evals,
            evals <= total,
            "within total_seconds",
        )?;
        for (index, e) in self.evals.iter().enumerate() {
            e.check(index, self.iters)?;
        }
        for (index, pair) in self.evals.windows(2).enumerate() {
            pair[1].after(&pair[0], index + 1)?;
        }
        Ok(())
    }
}

impl EvalPoint {
    /// One evaluation on its own: at most at step `iters`, finite non-negative seconds and
    /// rate, losses ≥ 0 or NaN.
    fn check(&self, index: usize, iters: u32) -> Result<(), CurveError> {
        if self.iter > iters {
            let iter = self.iter;
            return Err(CurveError::PastTheEnd { index, iter, iters });
        }
        let bad = |field, value: f64, what| CurveError::BadEval {
            index,
            field,
            value,
            what,
        };
        if !(self.seconds.is_finite() && self.seconds >= 0.0) {
            return Err(bad("seconds", self.seconds, SECONDS));
        }
        if !(self.lr.is_finite() && self.lr >= 0.0) {
            return Err(bad("lr", self.lr as f64, "a finite rate ≥ 0"));
        }
        for (field, loss) in [
            ("train", self.train),
            ("val", self.val),
            ("ema_val", self.ema_val),
        ] {
            // NaN is a loss not taken or not finite (`null`); anything else is a number ≥ 0.
            if !(loss.is_nan() || (loss.is_finite() && loss >= 0.0)) {
                return Err(bad(field, loss as f64, LOSS));
            }
        }
        Ok(())
    }

    /// This evaluation (number `index`) against the one before it: a later step, and
    /// counters and seconds that never go back.
    fn after(&self, prev: &EvalPoint, index: usize) -> Result<(), CurveError> {
        let order = [
            (
                "iter",
                self.iter as f64,
                prev.iter as f64,
                self.iter > prev.iter,
            ),
            (
                "backward",
                self.backward as f64,
                prev.backward as f64,
                self.backward >= prev.backward,
            ),
            (
                "forward",
                self.forward as f64,
                prev.forward as f64,
                self.forward >= prev.forward,
            ),
            (
                "seconds",
                self.seconds,
                prev.seconds,
                self.seconds >= prev.seconds,
            ),
        ];
        match order.into_iter().find(|o| !o.3) {
            None => Ok(()),
            Some((field, value, previous, _)) => Err(CurveError::OutOfOrder {
                index,
                field,
                value,
                previous,
            }),
        }
    }
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

    /// A curve as `train-gpt` writes it: 3 evaluations of a 20-step run.
    fn written() -> RunCurve {
        RunCurve {
            given_lr: 1e-3,
            peak_lr: 1e-3,
            iters: 20,
            total_seconds: 3.0,
            eval_seconds: 1.0,
            ..RunCurve::every_ten_passes(&[2.0, 1.5, 1.25], 0.5)
        }
    }

    #[test]
    fn a_written_curve_and_a_diverged_one_pass_the_check() {
        assert_eq!(written().check(), Ok(()));
        let mut diverged = written();
        diverged.evals[2].val = f32::NAN;
        diverged.evals[2].train = f32::NAN;
        assert_eq!(diverged.check(), Ok(()));
        assert_eq!(
            RunCurve {
                evals: vec![],
                ..written()
            }
            .check(),
            Ok(())
        );
    }

    /// Every way a hand-edited or corrupted curve could make the analysis cost a run wrongly
    /// is refused, naming the evaluation and the field.
    #[test]
    fn a_lying_curve_is_refused_by_name() {
        type Edit = fn(&mut RunCurve);
        let cases: [(Edit, &str); 12] = [
            (|c| c.evals.reverse(), "evaluation 1: iter 10 goes back"),
            (|c| c.evals[1].iter = 0, "evaluation 1: iter 0 goes back"),
            (
                |c| c.evals[2].backward = 5,
                "evaluation 2: backward 5 goes back",
            ),
            (
                |c| c.evals[2].forward = 0,
                "evaluation 2: forward 0 goes back",
            ),
            (
                |c| c.evals[2].seconds = 0.1,
                "evaluation 2: seconds 0.1 goes back",
            ),
            (
                |c| c.evals[0].seconds = f64::NAN,
                "evaluation 0: seconds is NaN",
            ),
            (|c| c.evals[1].val = -0.5, "evaluation 1: val is -0.5"),
            (
                |c| c.evals[1].ema_val = f32::NEG_INFINITY,
                "evaluation 1: ema_val is -inf",
            ),
            (|c| c.evals[0].lr = -1e-3, "evaluation 0: lr is -0.0010"),
            (
                |c| c.iters = 10,
                "evaluation 2 is at step 20, past the run's 10 steps",
            ),
            (
                |c| c.eval_seconds = 4.0,
                "eval_seconds is 4, not within total_seconds",
            ),
            (
                |c| c.peak_lr = 0.0,
                "peak_lr is 0, not a positive finite number",
            ),
        ];
        for (edit, want) in cases {
            let mut c = written();
            edit(&mut c);
            let err = c.check().expect_err(want).to_string();
            assert!(
                err.starts_with(want),
                "{err:?} does not start with {want:?}"
            );
        }
    }

    /// A loss too large for an f32 (1e300 in the file) reads as inf and is refused, not
    /// taken for a diverged run's NaN; 1e30 is a (huge) loss and stands.
    #[test]
    fn a_loss_past_f32_in_the_file_is_refused() {
        for (val, refused) in [("1e300", true), ("-1e300", true), ("1e30", false)] {
            let mut c = serde_json::to_value(written()).unwrap();
            c["evals"][1]["val"] = serde_json::from_str(val).unwrap();
            let c: RunCurve = serde_json::from_value(c).unwrap();
            let got = c.check();
            assert_eq!(got.is_err(), refused, "{val}: {got:?}");
            if refused {
                assert!(got
                    .unwrap_err()
                    .to_string()
                    .starts_with("evaluation 1: val is"));
            }
        }
    }

    /// The curves behind `docs/results.md` are what `train-gpt` wrote: all pass. They are
    /// read from `$HYBRID_RESULT_CURVES` where set (the GPU bundle carries W5's and its
    /// `run.sh` sets it: the compiled-in source path is absent there), else from `docs/`.
    #[test]
    fn the_committed_curves_pass_the_check() {
        let root = std::env::var_os("HYBRID_RESULT_CURVES").map_or_else(
            || {
                std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join("../../docs/results-curves")
            },
            std::path::PathBuf::from,
        );
        let dir = root.join("issue41/w5");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            let c: RunCurve = serde_json::from_str(&text).unwrap();
            c.check()
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            n += 1;
        }
        assert!(n >= 90, "{n} curves in {}", dir.display());
    }
}
