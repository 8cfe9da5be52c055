//! What a `--mode` adds to the driver's loop: plain training (`adamw`) adds nothing, the LR
//! range test sweeps the rate before the loop, and the hybrid decides the rate's multiplier at
//! segment ends (and rolls back) before a step and moves its weight average after one.

use super::{Progress, Trainer, HYBRID_DIR};
use crate::control::cli::TrainMode;
use crate::control::hybrid::{At, ProbeShape, StepSizeHybrid};
use crate::control::world::ScalePredictor;
use crate::train_args::learning_rate;
use crate::train_curve::RunCurve;
use crate::train_step::RangeTest;
use anyhow::{ensure, Context, Result};
use std::path::Path;
use std::time::Instant;

/// What happens before a step.
pub(super) enum Before {
    /// Nothing: the step runs.
    Step,
    /// A decision was taken (the loss of the last step is not read again).
    Decided,
    /// Rolled back: the loop goes on from this iteration.
    Back(u32),
}

/// A mode's part of the loop; every method defaults to plain training's.
pub(super) trait Hook {
    /// Once, before the loop (`resumed`: the run goes on from a checkpoint).
    fn start(&mut self, _t: &mut Trainer, _p: &mut Progress, _resumed: bool) -> Result<()> {
        Ok(())
    }
    /// Before step `it` (below `--iters`) runs.
    fn before_step(&mut self, _it: u32, _t: &mut Trainer) -> Result<Before> {
        Ok(Before::Step)
    }
    /// The factor on the schedule's rate.
    fn multiplier(&self) -> f32 {
        1.0
    }
    /// After step `it` ran.
    fn after_step(&mut self, _it: u32, _t: &Trainer) -> Result<()> {
        Ok(())
    }
    /// Whether a non-finite training loss stops the run (the hybrid rolls back instead).
    fn stops_on_non_finite(&self) -> bool {
        true
    }
    /// Forward passes spent outside the steps.
    fn extra_forwards(&self) -> u64 {
        0
    }
    /// Writes the mode's state into a checkpoint's folder.
    fn save(&mut self, _checkpoint: &Path) -> Result<()> {
        Ok(())
    }
    /// Records the mode's part of the curve once the loop is done.
    fn finish(&self, _curve: &mut RunCurve, _main: bool) {}
}

/// `--mode adamw`: the optimizer at the given rate and schedule.
struct Plain;

impl Hook for Plain {}

/// The mode's hook; the hybrid starts at the run's first iteration (or the checkpoint's),
/// with `predictor` in place of its world model when given.
pub(super) fn for_mode(
    t: &Trainer,
    p: &mut Progress,
    resumed: Option<&Path>,
    predictor: Option<Box<dyn ScalePredictor>>,
) -> Result<Box<dyn Hook>> {
    Ok(match t.a.mode {
        TrainMode::Adamw => Box::new(Plain),
        TrainMode::RangeTest => Box::new(RangeTest::default()),
        TrainMode::Hybrid => {
            let started = Instant::now();
            let h = hybrid(t, p.start, resumed, predictor)?;
            p.train_secs += started.elapsed().as_secs_f64();
            Box::new(h)
        }
    })
}

/// The LR range test sweeps before the loop (not again on a resume: the checkpoint keeps its
/// pick), then the run trains at the picked peak rate.
impl Hook for RangeTest {
    fn start(&mut self, t: &mut Trainer, p: &mut Progress, resumed: bool) -> Result<()> {
        if resumed {
            return Ok(());
        }
        let started = Instant::now();
        let pick = self.run(
            &t.stepper,
            (&t.model, t.opt.get()),
            (&t.ds, &mut t.rng, t.stepper.local),
            t.a.seed,
        )?;
        p.train_secs += started.elapsed().as_secs_f64();
        p.spent.backward += pick.steps as u64;
        p.spent.forward += pick.steps as u64;
        p.curve.range_test_steps = pick.steps;
        p.curve.peak_lr = pick.lr;
        p.rate_scale = pick.lr / t.a.lr;
        say!(
            t.main,
            "range test: {} steps, picked peak lr {:.3e}",
            pick.steps,
            pick.lr
        );
        Ok(())
    }
}

/// The hybrid at iteration `start`, resumed from the checkpoint's folder when given.
fn hybrid(
    t: &Trainer,
    start: u32,
    resumed: Option<&Path>,
    predictor: Option<Box<dyn ScalePredictor>>,
) -> Result<StepSizeHybrid> {
    let a = t.a;
    ensure!(
        t.world == 1,
        "--mode hybrid runs on one device (data parallelism is for --mode adamw)"
    );
    let shape = ProbeShape {
        batch: t.batch,
        block: t.block,
        seed: a.seed,
        graphed: !a.eager,
    };
    let at = (&t.model, t.opt.get_ref(), &t.rng, start);
    let mut h = match predictor {
        None => StepSizeHybrid::new(a.control.config(), &t.ds, shape, at)?,
        Some(p) => StepSizeHybrid::with_predictor(a.control.config(), &t.ds, shape, at, Some(p))?,
    };
    if let Some(sub) = resumed {
        let dir = sub.join(HYBRID_DIR);
        h = StepSizeHybrid::load(&dir, h, (&t.ds, &t.model, t.batch, t.block, a.seed))
            .with_context(|| format!("resuming the hybrid from {}", dir.display()))?;
    }
    Ok(h)
}

/// Where step `it` stands in the run, for the hybrid.
fn at(t: &Trainer, it: u32, schedule: f32) -> At {
    At {
        step: it,
        iters: t.a.iters,
        warmup: t.a.warmup,
        schedule,
    }
}

impl Hook for StepSizeHybrid {
    fn before_step(&mut self, it: u32, t: &mut Trainer) -> Result<Before> {
        let at = at(t, it, learning_rate(t.a, it) / t.a.lr);
        if !self.is_decision(&at) {
            return Ok(Before::Step);
        }
        match self.decide(&at, &t.model, t.opt.get(), &mut t.rng)? {
            Some(back) => {
                say!(
                    t.main,
                    "iter {it}: rolled back to iteration {back}, lr multiplier now {:.3}",
                    self.ctl.multiplier()
                );
                Ok(Before::Back(back))
            }
            None => Ok(Before::Decided),
        }
    }

    fn multiplier(&self) -> f32 {
        self.ctl.multiplier()
    }

    fn after_step(&mut self, it: u32, t: &Trainer) -> Result<()> {
        StepSizeHybrid::after_step(self, &at(t, it, 0.0), &t.model)
    }

    fn stops_on_non_finite(&self) -> bool {
        false
    }

    fn extra_forwards(&self) -> u64 {
        self.costs.probe_forwards
    }

    fn save(&mut self, checkpoint: &Path) -> Result<()> {
        StepSizeHybrid::save(self, &checkpoint.join(HYBRID_DIR))
    }

    fn finish(&self, curve: &mut RunCurve, main: bool) {
        curve.decisions = self.ctl.history.clone();
        curve.costs = Some(self.costs.clone());
        curve.rollbacks = self.ctl.rollbacks;
        say!(main, "{}", self.summary());
    }
}
