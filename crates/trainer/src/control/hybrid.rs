//! The hybrid trainer's decision point, run by the training driver at every segment's end:
//! measure, roll back or adapt the multiplier (predicted by the world model or measured), and
//! start the next segment.

use super::checkpoint::HostState;
use super::probe::{ProbeDraw, ProbeSet, ProbeSplit, SegmentStart, WeightAverage, Weights};
use super::world::{DecisionState, Gate, ScalePredictor, StepSizeModel, WorldSnapshot, FEATURES};
use super::{best_scale, ControlConfig, Controller, Decision};
use anyhow::{bail, ensure, Result};
use models::gpt::{Dataset, Gpt};
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};
use std::time::Instant;
use tensor_ops::optim::Optimizer;

/// What the controller's own work cost (wall-clock seconds, forward passes).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ControlCosts {
    /// Probe-batch forward passes, counted where they ran.
    pub probe_forwards: u64,
    pub probe_seconds: f64,
    pub world_seconds: f64,
    pub snapshot_seconds: f64,
    pub average_seconds: f64,
    pub measured: u32,
    pub predicted: u32,
    /// Finite rises of the held-out probe loss checked on the training probes.
    pub overfit_checks: u32,
}

/// Where the run is, for a decision.
pub struct At {
    pub step: u32,
    pub iters: u32,
    pub warmup: u32,
    /// The scheduled rate at this step over the peak rate.
    pub schedule: f32,
}

/// The step-size controller with its measurements, world model and rollback point.
pub struct StepSizeHybrid {
    pub ctl: Controller,
    probes: ProbeSet,
    /// Probe batches of the training split, when `probes` are held-out ones: a rise of the
    /// held-out loss is overfitting when the training loss fell.
    train_check: Option<ProbeSet>,
    start: SegmentStart,
    average: Option<WeightAverage>,
    world: Option<Box<dyn ScalePredictor>>,
    gate: Gate,
    states: Vec<[f32; FEATURES]>,
    prev_change: f32,
    last_log_scale: f32,
    last_measured: bool,
    mean_log_scale: Option<f32>,
    pub costs: ControlCosts,
}

/// The probes of the line search (held-out batches when `cfg.probe_holdout` > 0, which the
/// driver then carved from `ds`), and the training-split batches that tell overfitting from
/// divergence beside held-out ones.
fn probe_sets(
    cfg: &ControlConfig,
    ds: &Dataset,
    shape: &ProbeShape,
    model: &Gpt,
) -> Result<(ProbeSet, Option<ProbeSet>)> {
    let probes = |split, seed| {
        let draw = ProbeDraw {
            split,
            n: cfg.probe_batches as usize,
            batch: shape.batch,
            block: shape.block,
            seed,
        };
        ProbeSet::new(ds, draw, model, shape.graphed)
    };
    if cfg.probe_holdout == 0.0 {
        return Ok((probes(ProbeSplit::Train, shape.seed)?, None));
    }
    ensure!(
        !ds.holdout.is_empty(),
        "held-out probes ({} of the training split) need the slice carved from the data",
        cfg.probe_holdout
    );
    let held = probes(ProbeSplit::HeldOut, shape.seed)?;
    let train_seed = shape.seed ^ 0x7EA1;
    let check = probes(ProbeSplit::Train, train_seed)?;
    Ok((held, Some(check)))
}

/// The sizes of the probe batches.
pub struct ProbeShape {
    pub batch: usize,
    pub block: usize,
    pub seed: u64,
    /// On CUDA, measure by replaying a captured graph (`--eager`: op by op).
    pub graphed: bool,
}

impl StepSizeHybrid {
    /// A controller whose first segment starts at step `step` with the model's weights now.
    pub fn new(
        cfg: ControlConfig,
        ds: &Dataset,
        shape: ProbeShape,
        (model, opt, rng, step): (&Gpt, &dyn Optimizer, &StdRng, u32),
    ) -> Result<StepSizeHybrid> {
        use super::trivial::{LastMeasured, PowerLaw, Predictor};
        let world: Option<Box<dyn ScalePredictor>> = match (cfg.world_model, cfg.predictor) {
            (false, _) => None,
            (true, Predictor::Rssm) => Some(Box::new(StepSizeModel::new(
                shape.seed ^ 0x57E9,
                model.device(),
            )?)),
            (true, Predictor::Last) => Some(Box::new(LastMeasured)),
            (true, Predictor::PowerLaw) => Some(Box::new(PowerLaw)),
        };
        Self::with_predictor(cfg, ds, shape, (model, opt, rng, step), world)
    }

    /// As [`StepSizeHybrid::new`] with a given predictor (tests inject one that lies).
    pub fn with_predictor(
        cfg: ControlConfig,
        ds: &Dataset,
        shape: ProbeShape,
        (model, opt, rng, step): (&Gpt, &dyn Optimizer, &StdRng, u32),
        world: Option<Box<dyn ScalePredictor>>,
    ) -> Result<StepSizeHybrid> {
        let gate = Gate::new(cfg.trust, cfg.world_min_examples, cfg.max_predicted_run);
        let ctl = Controller::new(cfg)?;
        let (probes, train_check) = probe_sets(&ctl.cfg, ds, &shape, model)?;
        // The probes' timers count the probes, not the training steps queued before them.
        tensor_ops::synchronize(model.device())?;
        let t = Instant::now();
        let f0 = probes.loss(model)?;
        let mut costs = ControlCosts {
            probe_forwards: probes.forwards_run(),
            probe_seconds: t.elapsed().as_secs_f64(),
            ..ControlCosts::default()
        };
        let t = Instant::now();
        let average = ctl
            .cfg
            .average
            .map(|b| WeightAverage::new(model, b))
            .transpose()?;
        let start = SegmentStart::take(step, (model, average.as_ref()), opt, rng, f0)?;
        costs.snapshot_seconds += t.elapsed().as_secs_f64();
        Ok(StepSizeHybrid {
            ctl,
            probes,
            train_check,
            start,
            average,
            world,
            gate,
            states: Vec::new(),
            prev_change: 0.0,
            last_log_scale: 0.0,
            last_measured: false,
            mean_log_scale: None,
            costs,
        })
    }

    /// The current segment's length: `segment` while adapting, four times that after.
    fn segment_len(&self, at: &At) -> u32 {
        let l = self.ctl.cfg.segment;
        if self.ctl.adapting(at.step, at.warmup, at.iters) {
            l
        } else {
            l.saturating_mul(4)
        }
    }

    /// Whether step `at.step` (about to run) ends the current segment.
    pub fn is_decision(&self, at: &At) -> bool {
        at.step > self.start.step && at.step - self.start.step >= self.segment_len(at)
    }

    /// Probe-batch forward passes run so far by this controller's probe sets (a resumed
    /// run's count starts again at zero; [`ControlCosts::probe_forwards`] goes on).
    fn forwards_run(&self) -> u64 {
        self.probes.forwards_run() + self.train_check.as_ref().map_or(0, ProbeSet::forwards_run)
    }

    /// The decision at a segment's end. Returns the step to continue from when it rolled
    /// back (the weights, optimizer state and `rng` are then the segment start's). The probe
    /// forwards it ran are counted in the costs and in its record.
    pub fn decide(
        &mut self,
        at: &At,
        model: &Gpt,
        opt: &mut dyn Optimizer,
        rng: &mut StdRng,
    ) -> Result<Option<u32>> {
        let before = self.forwards_run();
        let out = self.decide_uncounted(at, model, opt, rng);
        let ran = self.forwards_run() - before;
        self.costs.probe_forwards += ran;
        if let (Ok(_), Some(d)) = (&out, self.ctl.history.last_mut()) {
            d.probe_forwards = ran;
        }
        out
    }

    /// Whether the training probes' loss fell from the segment's start to the weights now.
    fn training_loss_fell(&mut self, model: &Gpt) -> Result<bool> {
        let Some(check) = &self.train_check else {
            return Ok(false);
        };
        let t = Instant::now();
        let w0 = &self.start.weights;
        let l = check.losses_along(model, &[(w0, Some(w0), 1.0), (w0, None, 1.0)])?;
        self.costs.probe_seconds += t.elapsed().as_secs_f64();
        self.costs.overfit_checks += 1;
        Ok(l[1] < l[0])
    }

    fn decide_uncounted(
        &mut self,
        at: &At,
        model: &Gpt,
        opt: &mut dyn Optimizer,
        rng: &mut StdRng,
    ) -> Result<Option<u32>> {
        // The training steps queued so far finish first: the probes' timer counts the probes
        // (their wait for those steps is training time, in the driver's seconds).
        tensor_ops::synchronize(model.device())?;
        let t = Instant::now();
        let f1 = self.probes.loss(model)?;
        self.costs.probe_seconds += t.elapsed().as_secs_f64();
        let f0 = self.start.loss;
        let risen = self.ctl.must_roll_back(f0, f1);
        let overfit = risen && f1.is_finite() && self.training_loss_fell(model)?;
        if risen && !overfit {
            if self.ctl.at_floor() {
                bail!(
                    "training diverged at step {}: probe loss {f1} after {f0}, with the \
                     multiplier already at its floor",
                    at.step
                );
            }
            self.ctl.apply(at.step, Decision::Rollback, f1);
            let back = self
                .start
                .restore((model, self.average.as_mut()), opt, rng)?;
            return Ok(Some(back));
        }
        let change = (f1 - f0) / f0;
        let decision = if self.ctl.adapting(at.step, at.warmup, at.iters) {
            self.adapt(at, model, f0, f1, change)?
        } else {
            Decision::Continue {
                scale: None,
                measured: true,
            }
        };
        self.ctl.apply(at.step, decision, f1);
        if let Some(d) = self.ctl.history.last_mut() {
            d.overfit = overfit;
        }
        self.prev_change = change;
        let t = Instant::now();
        let avg_loss = self.start.avg_end_loss.take();
        self.start = SegmentStart::take(at.step, (model, self.average.as_ref()), opt, rng, f1)?;
        self.start.avg_loss = avg_loss;
        self.costs.snapshot_seconds += t.elapsed().as_secs_f64();
        Ok(None)
    }

    /// After the step `it` ran: moves the weight average every `average_every` steps until the
    /// multiplier stops adapting (through the warm-up too).
    pub fn after_step(&mut self, at: &At, model: &Gpt) -> Result<()> {
        let every = self.ctl.cfg.average_every;
        if let Some(avg) = self.average.as_mut() {
            // From the first step, not from the first adapting one: the first line search
            // needs an average that moved over its segment (a still average gives a flat
            // parabola, whose answer is the lower bound).
            if self.ctl.before_adaptation_ends(at.step + 1, at.iters)
                && (at.step + 1).is_multiple_of(every)
            {
                let t = Instant::now();
                avg.update(model)?;
                self.costs.average_seconds += t.elapsed().as_secs_f64();
            }
        }
        Ok(())
    }

    /// The probe losses `(f(0), f(1), f(e))` of the line search: along the weight average's
    /// path when kept, else along the raw iterates' (`f0`, `f1` given). Without `e`, the
    /// last is NaN (not measured).
    fn line_losses(
        &mut self,
        model: &Gpt,
        (f0, f1): (f32, f32),
        e: Option<f32>,
    ) -> Result<(f32, f32, f32)> {
        let t = Instant::now();
        let out = match &self.average {
            None => {
                let fe = match e {
                    Some(e) => {
                        let at = [(&self.start.weights, None, e)];
                        self.probes.losses_along(model, &at)?[0]
                    }
                    None => f32::NAN,
                };
                (f0, f1, fe)
            }
            Some(avg) => {
                let a0 = self.start.average.as_ref().expect("kept with the average");
                // The average's loss at the segment's start (unless the last line search
                // measured it), at its end, and at the extrapolation `e`.
                let mut points = Vec::with_capacity(3);
                if self.start.avg_loss.is_none() {
                    points.push((a0, Some(a0), 1.0));
                }
                points.push((a0, Some(&avg.avg), 1.0));
                if let Some(e) = e {
                    points.push((a0, Some(&avg.avg), e));
                }
                let mut losses = self.probes.losses_along(model, &points)?.into_iter();
                let mut next = || losses.next().expect("one loss per point");
                let fa0 = match self.start.avg_loss {
                    Some(l) => l,
                    None => next(),
                };
                let fa1 = next();
                self.start.avg_end_loss = Some(fa1);
                let fae = if e.is_some() { next() } else { f32::NAN };
                (fa0, fa1, fae)
            }
        };
        self.costs.probe_seconds += t.elapsed().as_secs_f64();
        Ok(out)
    }

    /// Chooses `s*`: predicted when the gate trusts the world model, else measured.
    fn adapt(&mut self, at: &At, model: &Gpt, f0: f32, f1: f32, change: f32) -> Result<Decision> {
        let cfg = self.ctl.cfg.clone();
        let lc = cfg.max_change.ln();
        let state = DecisionState {
            progress: at.step as f32 / at.iters.max(1) as f32,
            multiplier: self.ctl.multiplier(),
            schedule: at.schedule,
            change,
            prev_change: self.prev_change,
            last_log_scale: self.last_log_scale,
            last_measured: self.last_measured,
            mean_log_scale: self.mean_log_scale.unwrap_or(0.0),
        };
        self.states.push(state.features(cfg.max_change));
        let t = Instant::now();
        let prediction = match self.world.as_mut() {
            Some(w) => w.predict(&self.states)?,
            None => None,
        };
        self.costs.world_seconds += t.elapsed().as_secs_f64();
        let trusted = prediction.filter(|&(_, spread)| self.gate.trusts(spread));
        let (log_scale, measured) = match trusted {
            Some((p, _)) => {
                // The average's end loss is still needed: it starts the next line search.
                self.line_losses(model, (f0, f1), None)?;
                self.gate.predicted();
                self.costs.predicted += 1;
                ((p * lc).clamp(-lc, lc), false)
            }
            None => {
                let e = cfg.extrapolate;
                let max_change = cfg.max_change;
                let (g0, g1, ge) = self.line_losses(model, (f0, f1), Some(e))?;
                self.costs.measured += 1;
                // A non-finite loss past the segment: far too large a step.
                let s = best_scale(g0, g1, ge, e, max_change).unwrap_or(1.0 / max_change);
                let ls = s.ln();
                self.gate.measured(prediction.map(|p| p.0), ls / lc);
                self.mean_log_scale = Some(match self.mean_log_scale {
                    Some(m) => 0.7 * m + 0.3 * ls,
                    None => ls,
                });
                (ls, true)
            }
        };
        self.last_log_scale = log_scale;
        self.last_measured = measured;
        if let Some(w) = self.world.as_mut() {
            let t = Instant::now();
            w.learn(&self.states)?;
            self.costs.world_seconds += t.elapsed().as_secs_f64();
        }
        Ok(Decision::Continue {
            scale: Some(log_scale.exp()),
            measured,
        })
    }

    /// One line on what the controller did and cost.
    pub fn summary(&self) -> String {
        let c = &self.costs;
        format!(
            "hybrid: final lr multiplier {:.3}, {} decisions ({} measured, {} predicted by the \
             world model), {} rollbacks, {} segments overfitting; probes {} forward passes in {:.2} s, world model {:.2} s, \
             weight average {:.2} s, snapshots {:.2} s",
            self.ctl.multiplier(),
            self.ctl.history.len(),
            c.measured,
            c.predicted,
            self.ctl.rollbacks,
            self.ctl.history.iter().filter(|d| d.overfit).count(),
            c.probe_forwards,
            c.probe_seconds,
            c.world_seconds,
            c.average_seconds,
            c.snapshot_seconds
        )
    }

    pub(super) fn start(&self) -> &SegmentStart {
        &self.start
    }

    pub(super) fn average(&self) -> Option<&WeightAverage> {
        self.average.as_ref()
    }

    /// The host state and the world model's, for a checkpoint.
    pub(super) fn host_state(&mut self) -> Result<(HostState, Option<WorldSnapshot>)> {
        let world = match self.world.as_mut() {
            Some(w) => w.snapshot()?,
            None => None,
        };
        let host = HostState {
            ctl: self.ctl.clone(),
            gate: self.gate.clone(),
            states: self.states.clone(),
            prev_change: self.prev_change,
            last_log_scale: self.last_log_scale,
            last_measured: self.last_measured,
            mean_log_scale: self.mean_log_scale,
            costs: self.costs.clone(),
            start_step: self.start.step,
            start_loss: self.start.loss,
            start_avg_loss: self.start.avg_loss,
            start_avg_end_loss: self.start.avg_end_loss,
            has_average: self.average.is_some(),
            world_step: world.as_ref().map(|w| w.optimizer.step),
        };
        Ok((host, world))
    }

    /// This controller (fresh, of the same settings) with a checkpoint's state.
    pub(super) fn restored(
        mut self,
        host: HostState,
        start: SegmentStart,
        average: Option<Weights>,
        world: Option<WorldSnapshot>,
    ) -> Result<StepSizeHybrid> {
        match (self.average.as_mut(), average) {
            (Some(a), Some(w)) => a.avg = w,
            (None, None) => {}
            _ => anyhow::bail!("the checkpoint's weight average does not match the settings"),
        }
        match (self.world.as_mut(), world) {
            (Some(w), Some(snap)) => w.restore(&snap)?,
            (None, None) => {}
            _ => anyhow::bail!("the checkpoint's world model does not match the settings"),
        }
        self.ctl = host.ctl;
        self.gate = host.gate;
        self.states = host.states;
        self.prev_change = host.prev_change;
        self.last_log_scale = host.last_log_scale;
        self.last_measured = host.last_measured;
        self.mean_log_scale = host.mean_log_scale;
        self.costs = host.costs;
        self.start = start;
        Ok(self)
    }

    /// The world model's running error on measured decisions (scaled `ln s*`).
    pub fn world_error(&self) -> Option<f32> {
        self.gate.error()
    }
}
