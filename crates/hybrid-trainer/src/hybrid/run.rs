//! [`HybridTrainer`]: one call of [`HybridTrainer::step`] runs one training step in the phase
//! the gate chooses (see the module docs of `hybrid`).

use super::state::TrainingState;
use super::updates::UpdateHistory;
use super::{HybridConfig, HybridError, Mode, Objective, Phase};
use rssm::{GpuAccelerator, Rssm};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::Arc;
use tensor_ops::dist::{GradSync, ProcessGroup, StepSync};
use tensor_ops::nn::ParamStore;
use tensor_ops::optim::{AdamW, AdamWParams, AdamWState};
use tensor_ops::{no_grad, Device, Tensor};

/// What a run has spent so far (never rewound by a rollback).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Counters {
    /// Steps taken, the repeated ones after a rollback included.
    pub steps: u64,
    /// Forward passes: full steps, predicted steps with a forward pass, held-out batches.
    pub forward_passes: u64,
    pub backward_passes: u64,
    pub predicted_steps: u64,
    pub rollbacks: u64,
    pub world_model_updates: u64,
}

/// Where the trainer's time went, in seconds (host wall-clock; each part ends in a host read,
/// so device work is included). Not part of checkpoints' equality: timings vary run to run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Timings {
    /// Forward, backward and AdamW of full steps.
    pub adamw: f64,
    /// Copies of the weights before a full step and the updates after it.
    pub copies: f64,
    /// Features, the update's coefficients and norms (one host read).
    pub measure: f64,
    /// The world model's rollouts (`predict_batch`).
    pub predict: f64,
    /// Predicted updates applied (`apply_corrections`).
    pub apply: f64,
    /// Drift corrections (`compress_residuals` + `apply_corrections`).
    pub correct: f64,
    /// Basis refreshes (`compress_residuals`).
    pub basis: f64,
    /// The world model's training.
    pub world_train: f64,
    /// Held-out checks and good snapshots.
    pub holdout: f64,
}

impl Timings {
    /// Everything but `adamw`: what the hybrid adds to plain training.
    pub fn overhead(&self) -> f64 {
        self.copies
            + self.measure
            + self.predict
            + self.apply
            + self.correct
            + self.basis
            + self.world_train
            + self.holdout
    }
}

/// What one step did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepReport {
    pub step: u64,
    pub phase: Phase,
    /// The training loss, when the step ran a forward pass.
    pub loss: Option<f32>,
    pub lr: f32,
    /// The ensemble's disagreement about this step, when it predicted it.
    pub disagreement: Option<f32>,
    /// The world model's relative update error on this full step, when it predicted it.
    pub update_error: Option<f32>,
    /// Set when this step rolled back (the step index then goes back).
    pub rollback: Option<String>,
}

/// What [`HybridTrainer::predict`] returns.
pub(crate) struct Prediction {
    pub(crate) coefs: Vec<Vec<f32>>,
    pub(crate) disagreement: Vec<f32>,
    pub(crate) first_change: Vec<f32>,
}

/// The span of predicted steps in progress: the world model's coefficients (unscaled) and
/// disagreement for each step ahead.
#[derive(Clone)]
pub(crate) struct Span {
    pub(crate) coefs: Vec<Vec<f32>>,
    pub(crate) disagreement: Vec<f32>,
    pub(crate) taken: usize,
}

/// The host-side state a rollback restores and a checkpoint writes as JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct HostState {
    pub(crate) step: u64,
    pub(crate) state: TrainingState,
    /// Raw features of the last K full steps.
    pub(crate) features: VecDeque<Vec<f32>>,
    /// Their updates' coefficients in the current basis (unscaled), aligned with `features`.
    pub(crate) coefs: VecDeque<Vec<f32>>,
    pub(crate) full_since_span: usize,
    pub(crate) since_basis: usize,
    pub(crate) disagreement_ema: Option<f32>,
    pub(crate) holdout_best: Option<f32>,
    pub(crate) predicted_since_good: bool,
    pub(crate) cooldown_until: u64,
    /// Running sums (decay 0.95) of Σ p·a and Σ p² over one-step predictions on full steps,
    /// p the world model's predicted change of the coefficients and a the actual one (each
    /// divided by its scale): their ratio, clamped to [0, 1], is how much of the predicted
    /// change a prediction applies (0: persistence).
    pub(crate) innov_num: f64,
    pub(crate) innov_den: f64,
    /// The step index at or after which the next held-out check runs (at the first full
    /// step there: a predicted span may straddle a multiple of `holdout_every`).
    pub(crate) next_holdout: u64,
    /// Per group, running sums (decay 0.9) of ⟨c, ĉ⟩ and ‖ĉ‖² over the world model's
    /// predictions scored on full steps (c the actual coefficients, ĉ the predicted): their
    /// ratio, clamped to [0, 1], is the least-squares gain a predicted update is applied with.
    pub(crate) gain_num: Vec<f64>,
    pub(crate) gain_den: Vec<f64>,
}

/// The last good point: weights, optimiser state and the host state.
pub(crate) struct Good {
    pub(crate) weights: Vec<Tensor>,
    pub(crate) opt: AdamWState,
    pub(crate) host: HostState,
}

/// The hybrid predictive trainer over the parameters of a [`ParamStore`].
pub struct HybridTrainer {
    pub(crate) cfg: HybridConfig,
    pub(crate) device: Device,
    pub(crate) names: Vec<String>,
    pub(crate) params: Vec<Tensor>,
    pub(crate) opt: AdamW,
    pub(crate) max_grad_norm: Option<f32>,
    pub(crate) acc: GpuAccelerator,
    pub(crate) history: UpdateHistory,
    pub(crate) host: HostState,
    pub(crate) span: Option<Span>,
    pub(crate) last_delta: Option<Vec<Tensor>>,
    /// ‖last_delta‖².
    pub(crate) last_delta_sq: f64,
    pub(crate) good: Option<Good>,
    /// The data-parallel job this trainer is one rank of (none: a single process).
    pub(crate) pg: Option<Arc<ProcessGroup>>,
    pub(crate) counters: Counters,
    pub(crate) timings: Timings,
    pub(crate) total_steps: u64,
}

impl HybridTrainer {
    /// A trainer of `store`'s parameters with AdamW `adamw` over `total_steps` steps.
    pub fn new(
        store: &ParamStore,
        adamw: AdamWParams,
        cfg: HybridConfig,
        total_steps: u64,
    ) -> Result<HybridTrainer, HybridError> {
        cfg.validate()?;
        let opt = store.adamw(adamw)?;
        let params: Vec<Tensor> = store.params().iter().map(|p| p.tensor().clone()).collect();
        let names = store.names();
        if params.is_empty() {
            return Err(HybridError::Config {
                field: "store",
                reason: "has no parameters".into(),
            });
        }
        let device = store.device();
        let state = TrainingState::new(params.len());
        let group: Vec<usize> = (0..params.len())
            .map(|i| state.group_of(i, params.len()))
            .collect();
        let history = UpdateHistory::new(params.clone(), &group, cfg.history, cfg.rank);
        let width = state.width() + history.coefficients();
        let rc = cfg.world.config(width, width, cfg.seed ^ 0x5EED_0F1D);
        let acc = if cfg.mode == Mode::Hybrid {
            GpuAccelerator::with_model(Rssm::new(rc, device)?)
        } else {
            GpuAccelerator::new(device)?
        };
        let holdout_every = cfg.holdout_every;
        let mut t = HybridTrainer {
            max_grad_norm: adamw.max_grad_norm,
            cfg,
            device,
            names,
            params,
            opt,
            acc,
            history,
            host: HostState {
                step: 0,
                state,
                features: VecDeque::new(),
                coefs: VecDeque::new(),
                full_since_span: 0,
                since_basis: 0,
                disagreement_ema: None,
                holdout_best: None,
                predicted_since_good: false,
                cooldown_until: 0,
                innov_num: 0.0,
                innov_den: 0.0,
                next_holdout: holdout_every,
                gain_num: Vec::new(),
                gain_den: Vec::new(),
            },
            span: None,
            last_delta: None,
            last_delta_sq: 0.0,
            good: None,
            pg: None,
            counters: Counters::default(),
            timings: Timings::default(),
            total_steps,
        };
        if t.cfg.mode == Mode::Hybrid {
            t.take_good()?;
        }
        Ok(t)
    }

    /// The index of the next step.
    pub fn step_index(&self) -> u64 {
        self.host.step
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Where the time went so far (this process; not restored by a resume).
    pub fn timings(&self) -> &Timings {
        &self.timings
    }

    pub fn config(&self) -> &HybridConfig {
        &self.cfg
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// The world model (hybrid mode only).
    pub fn world_model(&self) -> Option<&Rssm> {
        self.acc.model()
    }

    /// The training-state features' width.
    pub fn feature_width(&self) -> usize {
        self.host.state.width()
    }

    /// One step in the phase the gate picks; `lr_at(step)` gives the learning rate.
    pub fn step(
        &mut self,
        obj: &mut dyn Objective,
        lr_at: &dyn Fn(u64) -> f32,
    ) -> Result<StepReport, HybridError> {
        let s = self.host.step;
        let lr = lr_at(s);
        self.counters.steps += 1;
        let r = match self.cfg.mode {
            Mode::Baseline => self.baseline_step(obj, s, lr),
            Mode::SkipFreeze { fraction } | Mode::ReapplyLast { fraction } => {
                self.control_step(obj, s, lr, fraction)
            }
            Mode::Hybrid => self.hybrid_step(obj, s, lr),
        }?;
        self.check_agreement(&r)?;
        Ok(r)
    }

    pub(crate) fn report(&self, step: u64, phase: Phase, loss: Option<f32>, lr: f32) -> StepReport {
        StepReport {
            step,
            phase,
            loss,
            lr,
            disagreement: None,
            update_error: None,
            rollback: None,
        }
    }

    /// Forward, backward and AdamW; returns the loss (synchronised).
    pub(crate) fn adamw_step(
        &mut self,
        obj: &mut dyn Objective,
        s: u64,
        lr: f32,
    ) -> Result<(f32, tensor_ops::Gradients), HybridError> {
        let loss = obj.train_loss(s).map_err(HybridError::Objective)?;
        let (loss, grads) = match &self.pg {
            // Each rank's gradients of its share, averaged as the pass finishes them.
            Some(pg) => {
                let mut sync = GradSync::new(pg);
                let grads = loss.backward_with(&mut |p, g| sync.grad_ready(p, g))?;
                let loss = loss.detach();
                sync.finish(&loss)?;
                (loss, grads)
            }
            None => {
                let grads = loss.backward()?;
                (loss, grads)
            }
        };
        self.counters.forward_passes += 1;
        self.counters.backward_passes += 1;
        self.opt.step(&grads, lr)?;
        Ok((loss.item()?, grads))
    }

    fn baseline_step(
        &mut self,
        obj: &mut dyn Objective,
        s: u64,
        lr: f32,
    ) -> Result<StepReport, HybridError> {
        let t0 = std::time::Instant::now();
        let (l, _) = self.adamw_step(obj, s, lr)?;
        self.timings.adamw += t0.elapsed().as_secs_f64();
        if !l.is_finite() {
            return Err(HybridError::Diverged {
                step: s,
                reason: format!("loss {l}"),
            });
        }
        self.host.step += 1;
        Ok(self.report(s, Phase::Full, Some(l), lr))
    }

    /// The controls: predicted steps evenly spaced at `fraction` after warm-up.
    fn control_step(
        &mut self,
        obj: &mut dyn Objective,
        s: u64,
        lr: f32,
        fraction: f64,
    ) -> Result<StepReport, HybridError> {
        let i = s.saturating_sub(self.cfg.warmup);
        let predicted = s >= self.cfg.warmup
            && ((i + 1) as f64 * fraction).floor() > (i as f64 * fraction).floor()
            && self.last_delta.is_some();
        if predicted {
            if let (Mode::ReapplyLast { .. }, Some(d)) = (self.cfg.mode, &self.last_delta) {
                no_grad(|| -> tensor_ops::Result<()> {
                    for (p, d) in self.params.iter().zip(d) {
                        p.assign(&p.detach().add(&d.reshape(p.shape())?)?)?;
                    }
                    Ok(())
                })?;
            }
            self.counters.predicted_steps += 1;
            self.host.step += 1;
            return Ok(self.report(s, Phase::Predict, None, lr));
        }
        // The controls count a full step's whole time (copies, forward, backward, AdamW, the
        // delta) as `adamw`; it ends in the loss's host read, so the device work of a re-applied
        // update queued before it lands there too.
        let t0 = std::time::Instant::now();
        let before = self.copy_params()?;
        let (l, _) = self.adamw_step(obj, s, lr)?;
        if !l.is_finite() {
            return Err(HybridError::Diverged {
                step: s,
                reason: format!("loss {l}"),
            });
        }
        self.last_delta = Some(self.deltas(&before)?);
        self.timings.adamw += t0.elapsed().as_secs_f64();
        self.host.step += 1;
        let phase = if s < self.cfg.warmup {
            Phase::Warmup
        } else {
            Phase::Full
        };
        Ok(self.report(s, phase, Some(l), lr))
    }

    pub(crate) fn copy_params(&self) -> Result<Vec<Tensor>, HybridError> {
        Ok(self
            .params
            .iter()
            .map(Tensor::deep_copy)
            .collect::<tensor_ops::Result<_>>()?)
    }

    /// `params − before`, flattened per tensor.
    pub(crate) fn deltas(&self, before: &[Tensor]) -> Result<Vec<Tensor>, HybridError> {
        Ok(no_grad(|| {
            self.params
                .iter()
                .zip(before)
                .map(|(p, b)| p.detach().sub(b)?.reshape(&[p.numel()]))
                .collect::<tensor_ops::Result<Vec<_>>>()
        })?)
    }

    pub(crate) fn take_good(&mut self) -> Result<(), HybridError> {
        self.host.predicted_since_good = false;
        self.good = Some(Good {
            weights: self.copy_params()?,
            opt: self.opt.state()?,
            host: self.host.clone(),
        });
        Ok(())
    }

    /// Rolls back to the last good point, or fails when plain AdamW produced the failure.
    pub(crate) fn rollback(&mut self, s: u64, reason: String) -> Result<StepReport, HybridError> {
        let good = match &self.good {
            Some(g) if self.host.predicted_since_good => g,
            _ => return Err(HybridError::Diverged { step: s, reason }),
        };
        for (p, w) in self.params.iter().zip(&good.weights) {
            p.assign(w)?;
        }
        self.opt.load_state(&good.opt)?;
        let rollbacks = self.counters.rollbacks + 1;
        self.host = good.host.clone();
        self.host.cooldown_until = s.max(good.host.step) + self.cfg.cooldown;
        self.host.features.clear();
        self.host.coefs.clear();
        self.host.since_basis = 0;
        self.history.clear();
        self.span = None;
        self.last_delta = None;
        self.counters.rollbacks = rollbacks;
        tracing::warn!("step {s}: {reason}; rolled back to step {}", self.host.step);
        Ok(StepReport {
            rollback: Some(reason),
            ..self.report(s, Phase::Full, None, 0.0)
        })
    }

    /// The rows the world model observes, one per stored full step after the first: the
    /// normalised features and the change of the update's coefficients since the previous full
    /// step, divided by their scales (clipped to ±8). Predicting the change makes persistence
    /// (the last update again, in the basis) what an untrained model falls back to.
    pub(crate) fn rows(&self) -> Vec<Vec<f32>> {
        let scales = self.history.scales();
        let pairs = self.host.coefs.iter().zip(self.host.coefs.iter().skip(1));
        self.host
            .features
            .iter()
            .skip(1)
            .zip(pairs)
            .map(|(raw, (prev, c))| {
                let mut x = self.host.state.normalise(raw);
                x.extend(
                    c.iter()
                        .zip(prev)
                        .zip(&scales)
                        .map(|((c, p), s)| ((c - p) / s).clamp(-8.0, 8.0)),
                );
                x
            })
            .collect()
    }

    /// The context the world model reads: the last T rows, `[1, T, F + C]`.
    fn context(&self) -> Result<Tensor, HybridError> {
        let t = self.cfg.context;
        let rows = self.rows();
        let w = rows[0].len();
        let x: Vec<f32> = rows[rows.len() - t..].concat();
        Ok(Tensor::from_vec(x, &[1, t, w], self.device())?)
    }

    /// Whether the world model may predict now.
    pub(crate) fn model_ready(&self) -> bool {
        let trained = self
            .acc
            .model()
            .is_some_and(|m| m.steps() >= self.cfg.rssm_min_steps);
        trained && self.history.basis.is_some() && self.host.features.len() >= self.cfg.context
    }

    /// Each group's gain (see [`HostState::gain_num`]; 0 until measured).
    pub(crate) fn gains(&self) -> Vec<f32> {
        (0..self.history.members.len())
            .map(|g| {
                ratio01(
                    self.host.gain_num.get(g).copied().unwrap_or(0.0),
                    self.host.gain_den.get(g).copied().unwrap_or(0.0),
                )
            })
            .collect()
    }

    /// Coefficients `[C]` with each group's gain applied: what a predicted step applies.
    pub(crate) fn with_gains(&self, coefs: &[f32]) -> Vec<f32> {
        let gains = self.gains();
        let mut out = Vec::with_capacity(coefs.len());
        let mut at = 0;
        for (r, g) in self.history.ranks().iter().zip(gains) {
            out.extend(coefs[at..at + r].iter().map(|c| c * g));
            at += r;
        }
        out
    }

    /// Scores a raw prediction `chat` against the actual coefficients `c`: updates each group's
    /// gain sums.
    pub(crate) fn score_gains(&mut self, chat: &[f32], c: &[f32]) {
        let ranks = self.history.ranks();
        if self.host.gain_num.len() != ranks.len() {
            self.host.gain_num = vec![0.0; ranks.len()];
            self.host.gain_den = vec![0.0; ranks.len()];
        }
        let mut at = 0;
        for (g, r) in ranks.iter().enumerate() {
            let (mut num, mut den) = (0.0f64, 0.0f64);
            for j in at..at + r {
                num += f64::from(c[j]) * f64::from(chat[j]);
                den += f64::from(chat[j]) * f64::from(chat[j]);
            }
            at += r;
            if num.is_finite() && den.is_finite() {
                self.host.gain_num[g] = 0.9 * self.host.gain_num[g] + num;
                self.host.gain_den[g] = 0.9 * self.host.gain_den[g] + den;
            }
        }
    }

    /// How much of the world model's predicted change a prediction applies: the regression
    /// coefficient of actual on predicted changes, clamped to [0, 1] (0 until measured).
    pub(crate) fn innovation_weight(&self) -> f32 {
        ratio01(self.host.innov_num, self.host.innov_den)
    }

    /// The world model's next `steps` predictions: the coefficients (unscaled: the last full
    /// step's plus the weighted predicted changes), the disagreement, and the first step's
    /// predicted change (unweighted, unscaled).
    pub(crate) fn predict(&self, steps: usize) -> Result<Prediction, HybridError> {
        let p = self.acc.predict_batch(&self.context()?, steps)?;
        let mean = p.mean.to_vec()?;
        let dis = p.disagreement.to_vec()?;
        let f = self.host.state.width();
        let d = p.mean.shape()[2];
        let scales = self.history.scales();
        let alpha = self.innovation_weight();
        let mut c = self.host.coefs.back().cloned().unwrap_or_default();
        let change = |i: usize| -> Vec<f32> {
            mean[i * d + f..(i + 1) * d]
                .iter()
                .zip(&scales)
                .map(|(x, s)| x * s)
                .collect()
        };
        let first = change(0);
        let coefs = (0..steps)
            .map(|i| {
                for (c, x) in c.iter_mut().zip(change(i)) {
                    *c += alpha * x;
                }
                c.clone()
            })
            .collect();
        Ok(Prediction {
            coefs,
            disagreement: dis,
            first_change: first,
        })
    }

    /// The gate for predicted step `i` of the span.
    fn gate(&self, disagreement: f32) -> bool {
        let dis_ok = self
            .host
            .disagreement_ema
            .is_some_and(|e| disagreement <= self.cfg.gate_disagreement * e);
        let err_ok = self
            .host
            .state
            .error_ema()
            .is_some_and(|e| e < self.cfg.gate_error);
        dis_ok && err_ok && disagreement.is_finite()
    }

    fn hybrid_step(
        &mut self,
        obj: &mut dyn Objective,
        s: u64,
        lr: f32,
    ) -> Result<StepReport, HybridError> {
        // Continue or end the span in progress, or open one.
        if let Some(span) = &self.span {
            let i = span.taken;
            if i < self.cfg.max_span && self.gate(span.disagreement[i]) {
                return self.predicted_step(obj, s, lr);
            }
            return self.full_step(obj, s, lr, Phase::Correct);
        }
        let may_open = s >= self.cfg.warmup
            && s >= self.host.cooldown_until
            && self.host.full_since_span >= self.cfg.full_between
            && self.model_ready();
        if may_open {
            let t0 = std::time::Instant::now();
            let p = self.predict(self.cfg.max_span + 1)?;
            self.timings.predict += t0.elapsed().as_secs_f64();
            if self.gate(p.disagreement[0]) {
                self.span = Some(Span {
                    coefs: p.coefs,
                    disagreement: p.disagreement,
                    taken: 0,
                });
                return self.predicted_step(obj, s, lr);
            }
        }
        let phase = if s < self.cfg.warmup {
            Phase::Warmup
        } else {
            Phase::Full
        };
        self.full_step(obj, s, lr, phase)
    }

    fn predicted_step(
        &mut self,
        obj: &mut dyn Objective,
        s: u64,
        lr: f32,
    ) -> Result<StepReport, HybridError> {
        let span = self.span.as_mut().expect("a span is open");
        let i = span.taken;
        span.taken += 1;
        let (coefs, dis) = (span.coefs[i].clone(), span.disagreement[i]);
        if tracing::enabled!(tracing::Level::DEBUG) {
            let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
            let last = self.host.coefs.back().map_or(0.0, |c| norm(c));
            tracing::debug!(
                "step {s} predicted ({i}): |c| {:.3e} vs last full step's {last:.3e}, weight {}",
                norm(&coefs),
                self.innovation_weight()
            );
        }
        let t0 = std::time::Instant::now();
        let applied = self
            .history
            .apply_predicted(&self.acc, &self.with_gains(&coefs));
        self.timings.apply += t0.elapsed().as_secs_f64();
        if let Err(e) = applied {
            return match e {
                HybridError::NonFinite(_) | HybridError::Accelerator(_) => {
                    self.rollback(s, format!("predicted update refused: {e}"))
                }
                e => Err(e),
            };
        }
        self.host.predicted_since_good = true;
        self.host.state.note_predicted();
        self.counters.predicted_steps += 1;
        let mut loss = None;
        if self.cfg.predicted_forward {
            let l = no_grad(|| obj.train_loss(s))
                .map_err(HybridError::Objective)?
                .item()?;
            self.counters.forward_passes += 1;
            if let Some(reason) = self.drift(l) {
                return self.rollback(s, format!("predicted step: {reason}"));
            }
            loss = Some(l);
        }
        self.host.step += 1;
        Ok(StepReport {
            disagreement: Some(dis),
            ..self.report(s, Phase::Predict, loss, lr)
        })
    }

    /// Why `loss` is out of the recent full-step trajectory, if it is.
    pub(crate) fn drift(&self, loss: f32) -> Option<String> {
        if !loss.is_finite() {
            return Some(format!("loss {loss}"));
        }
        let (mean, std) = self.host.state.loss_trajectory()?;
        let limit = mean + 3.0 * std + self.cfg.drift_tolerance * mean.abs();
        (loss > limit).then(|| format!("loss {loss:.4} above the trajectory limit {limit:.4}"))
    }
}

/// A regression coefficient `num / den` from running sums, clamped to [0, 1]; 0 until the
/// denominator has any weight.
fn ratio01(num: f64, den: f64) -> f32 {
    if den > 0.0 {
        (num / den).clamp(0.0, 1.0) as f32
    } else {
        0.0
    }
}
