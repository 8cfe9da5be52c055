//! The hybrid trainer's full step: AdamW, the measurements behind the features, the world
//! model's score on the step, the drift correction after a span, the basis refresh, the
//! world model's online training and the held-out check.

use super::run::{HybridTrainer, StepReport};
use super::state::StepMeasure;
use super::{HybridError, Objective, Phase};
use rssm::SequenceBatch;
use std::time::Instant;
use tensor_ops::{no_grad, Tensor};

/// A lap counter: each call returns the seconds since the previous one.
fn lap_from(start: Instant) -> impl FnMut() -> f64 {
    let mut last = start;
    move || {
        let now = Instant::now();
        let d = now.duration_since(last).as_secs_f64();
        last = now;
        d
    }
}

/// Per tensor: ‖g‖², ‖Δ‖², ‖W‖², ‖m‖², Σv, Δ·Δ_prev.
const STATS: usize = 6;

impl HybridTrainer {
    pub(crate) fn full_step(
        &mut self,
        obj: &mut dyn Objective,
        s: u64,
        lr: f32,
        phase: Phase,
    ) -> Result<StepReport, HybridError> {
        // What the world model expects of this step (the span's next entry after a span).
        let span = self.span.take();
        let span_len = span.as_ref().map_or(0, |sp| sp.taken);
        let clock = Instant::now();
        let mut one_step_change = None;
        let expected = match &span {
            Some(sp) => Some((sp.coefs[sp.taken].clone(), sp.disagreement[sp.taken])),
            None if self.model_ready() => {
                let p = self.predict(1)?;
                one_step_change = Some(p.first_change);
                Some((p.coefs[0].clone(), p.disagreement[0]))
            }
            None => None,
        };
        let mut lap = lap_from(clock);
        self.timings.predict += lap();
        let before = self.copy_params()?;
        self.timings.copies += lap();
        let (loss, grads) = self.adamw_step(obj, s, lr)?;
        self.timings.adamw += lap();
        if !loss.is_finite() {
            return self.rollback(s, format!("{phase:?} step: loss {loss}"));
        }
        if phase == Phase::Correct {
            if let Some(reason) = self.drift(loss) {
                return self.rollback(s, format!("correct step: {reason}"));
            }
        }
        let delta = self.deltas(&before)?;
        self.timings.copies += lap();
        let stats = self.tensor_stats(&grads, &delta)?;
        let gdelta = self.history.by_group(&delta)?;
        let projected = match self.history.basis {
            Some(_) => Some(self.history.project(&gdelta)?),
            None => None,
        };
        if let (Some(p), Some((c, _)), Some(last)) =
            (&one_step_change, &projected, self.host.coefs.back())
        {
            // Calibrate the weight of predicted changes on this one-step prediction.
            let scales = self.history.scales();
            let (mut num, mut den) = (0.0f64, 0.0f64);
            for (((p, c), l), s) in p.iter().zip(c).zip(last).zip(&scales) {
                let (p, a) = (f64::from(p / s), f64::from((c - l) / s));
                num += p * a;
                den += p * p;
            }
            if num.is_finite() && den.is_finite() && last.len() == c.len() {
                self.host.innov_num = 0.95 * self.host.innov_num + num;
                self.host.innov_den = 0.95 * self.host.innov_den + den;
            }
        }
        // The error of what would have been applied (the gains as they stood), then the gains
        // learn from this step.
        let update_error = match (&expected, &projected) {
            (Some((chat, _)), Some((c, sq))) if chat.len() == c.len() => {
                let e = relative_error(&self.with_gains(chat), c, sq);
                self.score_gains(chat, c);
                Some(e)
            }
            _ => None,
        };
        if let (Some((c, sq)), Some(prev)) = (&projected, self.host.coefs.back()) {
            if prev.len() == c.len() {
                tracing::debug!(
                    "step {s}: in-basis (oracle) error {:.3}, persistence error {:.3}",
                    relative_error(c, c, sq),
                    relative_error(prev, c, sq)
                );
            }
        }
        self.timings.measure += lap();
        if let (Some((chat, _)), Phase::Correct) = (&expected, phase) {
            if self.cfg.correction_gain > 0.0 {
                let predicted = self.history.expand(&self.with_gains(chat))?;
                let residual = no_grad(|| {
                    delta
                        .iter()
                        .zip(&predicted)
                        .map(|(d, p)| d.sub(p))
                        .collect::<tensor_ops::Result<Vec<_>>>()
                })?;
                let gain = self.cfg.correction_gain * span_len as f32;
                let seed = self.cfg.seed ^ s.wrapping_mul(0xA24B_AED4_963E_E407);
                self.history.apply_residual(
                    &self.acc,
                    &residual,
                    self.cfg.correction_rank,
                    gain,
                    seed,
                )?;
            }
        }
        self.timings.correct += lap();
        if let Some((_, d)) = &expected {
            let e = self.host.disagreement_ema.map_or(*d, |e| 0.9 * e + 0.1 * d);
            self.host.disagreement_ema = Some(e);
        }
        let measure = self.measure(
            s,
            loss,
            lr,
            phase,
            span_len,
            &stats,
            &expected,
            update_error,
        )?;
        self.last_delta_sq = f64::from(measure.update_norm).powi(2);
        let raw = self.host.state.observe(&measure);
        self.host.features.push_back(raw);
        self.host
            .coefs
            .push_back(projected.map(|p| p.0).unwrap_or_default());
        while self.host.features.len() > self.cfg.history {
            self.host.features.pop_front();
            self.host.coefs.pop_front();
        }
        self.history.push(gdelta);
        self.last_delta = Some(delta);
        self.timings.measure += lap();
        self.host.since_basis += 1;
        if self.history.is_full()
            && (self.history.basis.is_none() || self.host.since_basis >= self.cfg.basis_every)
        {
            let coefs = self.history.refresh_basis(&self.acc)?;
            self.host.coefs = coefs.into();
            self.host.since_basis = 0;
        }
        self.timings.basis += lap();
        self.train_world_model()?;
        self.timings.world_train += lap();
        self.host.full_since_span = if phase == Phase::Correct {
            1
        } else {
            self.host.full_since_span + 1
        };
        self.host.step += 1;
        if self.host.step >= self.host.next_holdout {
            let every = self.cfg.holdout_every;
            self.host.next_holdout = (self.host.step / every + 1) * every;
            let h = obj.holdout_loss().map_err(HybridError::Objective)?;
            self.counters.forward_passes += 1;
            let limit = self
                .host
                .holdout_best
                .map(|b| b + self.cfg.holdout_tolerance * b.abs());
            if !h.is_finite() || limit.is_some_and(|l| h > l) {
                if self.host.predicted_since_good {
                    return self.rollback(s, format!("held-out loss {h:.4} above {limit:?}"));
                }
                if !h.is_finite() {
                    return Err(HybridError::Diverged {
                        step: s,
                        reason: format!("held-out loss {h}"),
                    });
                }
            }
            self.host.holdout_best = Some(self.host.holdout_best.map_or(h, |b| b.min(h)));
            self.take_good()?;
        }
        self.timings.holdout += lap();
        tracing::debug!(
            "step {s} {phase:?}: loss {loss:.4}, update error {update_error:?} (EMA {:?}), \
             disagreement {:?} (EMA {:?})",
            self.host.state.error_ema(),
            expected.as_ref().map(|e| e.1),
            self.host.disagreement_ema
        );
        Ok(StepReport {
            disagreement: expected.map(|e| e.1),
            update_error,
            ..self.report(s, phase, Some(loss), lr)
        })
    }

    /// One host read of every tensor's [`STATS`].
    fn tensor_stats(
        &self,
        grads: &tensor_ops::Gradients,
        delta: &[Tensor],
    ) -> Result<Vec<f32>, HybridError> {
        let (m, v) = self.opt.moments();
        let mut parts = Vec::with_capacity(STATS * self.params.len());
        no_grad(|| -> Result<(), HybridError> {
            let sq = |t: &Tensor| t.mul(t)?.sum_all()?.reshape(&[1]);
            for (i, p) in self.params.iter().enumerate() {
                let g = grads
                    .get(p)
                    .ok_or(HybridError::NonFinite("gradient (missing)"))?;
                let d = &delta[i];
                parts.push(sq(g)?);
                parts.push(sq(d)?);
                parts.push(sq(&p.detach())?);
                parts.push(sq(&m[i])?);
                parts.push(v[i].sum_all()?.reshape(&[1])?);
                let prev = match &self.last_delta {
                    Some(l) => d.mul(&l[i])?.sum_all()?.reshape(&[1])?,
                    None => Tensor::zeros(&[1], p.device())?,
                };
                parts.push(prev);
            }
            Ok(())
        })?;
        let refs: Vec<&Tensor> = parts.iter().collect();
        Ok(no_grad(|| Tensor::cat(&refs, 0))?.to_vec()?)
    }

    #[allow(clippy::too_many_arguments)]
    fn measure(
        &self,
        s: u64,
        loss: f32,
        lr: f32,
        phase: Phase,
        span_len: usize,
        stats: &[f32],
        expected: &Option<(Vec<f32>, f32)>,
        update_error: Option<f32>,
    ) -> Result<StepMeasure, HybridError> {
        let n = self.params.len();
        let groups = self.host.state.groups();
        let mut acc = vec![[0f64; STATS + 1]; groups];
        let (mut g2, mut d2, mut dot) = (0f64, 0f64, 0f64);
        let prev2 = if self.last_delta.is_some() {
            self.last_delta_sq
        } else {
            0.0
        };
        for (i, p) in self.params.iter().enumerate() {
            let st = &stats[i * STATS..(i + 1) * STATS];
            let a = &mut acc[self.host.state.group_of(i, n)];
            for (k, x) in st.iter().enumerate() {
                a[k] += f64::from(*x);
            }
            a[STATS] += p.numel() as f64;
            g2 += f64::from(st[0]);
            d2 += f64::from(st[1]);
            dot += f64::from(st[5]);
        }
        let grad_norm = g2.sqrt() as f32;
        let clip = self
            .max_grad_norm
            .map_or(1.0, |max| (max / grad_norm.max(1e-30)).min(1.0));
        Ok(StepMeasure {
            step: s,
            total_steps: self.total_steps,
            loss,
            lr,
            warmup: phase == Phase::Warmup,
            correct: phase == Phase::Correct,
            span_before: span_len,
            rollbacks: self.counters.rollbacks,
            grad_norm,
            clip,
            pred_error: update_error,
            disagreement: expected.as_ref().map(|e| e.1),
            update_norm: d2.sqrt() as f32,
            update_cosine: if d2 > 0.0 && prev2 > 0.0 {
                (dot / (d2 * prev2).sqrt()) as f32
            } else {
                0.0
            },
            groups: acc
                .iter()
                .map(|a| {
                    [
                        a[0].sqrt() as f32,
                        a[1].sqrt() as f32,
                        a[2].sqrt() as f32,
                        a[3].sqrt() as f32,
                        (a[4] / a[STATS].max(1.0)).max(0.0).sqrt() as f32,
                    ]
                })
                .collect(),
        })
    }

    /// World-model training on the stored full steps: every window of `context` rows (features
    /// and scaled coefficients), each step's target being its own row (the decoder on the
    /// prior predicts it before seeing it).
    fn train_world_model(&mut self) -> Result<(), HybridError> {
        let k = self.host.features.len();
        let t = self.cfg.context;
        let ready = self.history.basis.is_some()
            && k > t
            && self.host.coefs.iter().all(|c| !c.is_empty())
            && self.cfg.rssm_every > 0
            && self
                .counters
                .backward_passes
                .is_multiple_of(self.cfg.rssm_every.max(1));
        if !ready {
            return Ok(());
        }
        let rows = self.rows();
        let w = rows[0].len();
        let b = rows.len() + 1 - t;
        let mut xs = Vec::with_capacity(b * t * w);
        for start in 0..b {
            for r in &rows[start..start + t] {
                xs.extend_from_slice(r);
            }
        }
        let batch = SequenceBatch::new(Tensor::from_vec(xs, &[b, t, w], self.device())?);
        let lr = self.cfg.rssm_lr;
        let model = self.acc.model_mut().ok_or(HybridError::NoBasis)?;
        model.train_step(&batch, lr)?;
        self.counters.world_model_updates += 1;
        Ok(())
    }
}

/// `‖Δ − Δ̂‖/‖Δ‖` from coefficients: with `c` the update's coefficients in the basis and
/// `‖Δ‖²` per tensor, `‖Δ − Δ̂‖² = ‖c − ĉ‖² + (‖Δ‖² − ‖c‖²)` (the part outside the basis).
pub(crate) fn relative_error(chat: &[f32], c: &[f32], sq: &[f32]) -> f32 {
    let total: f64 = sq.iter().map(|&x| f64::from(x)).sum();
    let inside: f64 = c.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
    let miss: f64 = chat
        .iter()
        .zip(c)
        .map(|(a, b)| (f64::from(*a) - f64::from(*b)).powi(2))
        .sum();
    if total <= 0.0 {
        return if miss == 0.0 { 0.0 } else { f32::INFINITY };
    }
    (((miss + (total - inside).max(0.0)) / total).sqrt()) as f32
}
