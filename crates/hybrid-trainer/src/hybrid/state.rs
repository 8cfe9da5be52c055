//! [`TrainingState`]: the feature vector the world model reads at every full step (every
//! entry measured, none padding), its online normaliser, and the table that documents it.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// Per-step features that do not depend on the model's layout (entries 0..24).
pub const GLOBAL_FEATURES: usize = 24;
/// Features per parameter group (entries 24 + 5·g .. 24 + 5·g + 5).
pub const GROUP_FEATURES: usize = 5;
/// At most this many parameter groups: 24 + 5·8 = 64 features.
pub const MAX_GROUPS: usize = 8;

/// The documented meaning of each feature (the same table is in `docs/hybrid-trainer.md`).
/// Norms and rates enter as log10 (of at least 1e-30); `G = min(8, parameter tensors)`.
pub const FEATURE_TABLE: [&str; GLOBAL_FEATURES + GROUP_FEATURES] = [
    "0 loss: the full step's training loss",
    "1 loss EMA, β = 0.9 (over full steps)",
    "2 loss EMA, β = 0.99",
    "3 loss change since the previous full step",
    "4 loss standard deviation over the last 16 full steps",
    "5 loss slope per step over the last 16 full steps (least squares)",
    "6 loss minus the minimum of the last 16 full steps",
    "7 log10 learning rate",
    "8 learning rate / the largest learning rate so far",
    "9 progress: step / total steps",
    "10 fraction of the last 32 steps that were predicted",
    "11 steps since the previous full step (1 when consecutive)",
    "12 1 in the warm-up phase, else 0",
    "13 1 when this full step corrects a predicted span, else 0",
    "14 length of the predicted span this full step follows (0 if none)",
    "15 log(1 + rollbacks so far)",
    "16 log10 global gradient norm before clipping",
    "17 gradient norm / its EMA (β = 0.9)",
    "18 clipping coefficient min(1, max_norm / norm) (1 without clipping)",
    "19 world model's relative update error at this step (1 until it predicts: as bad as no update)",
    "20 EMA (β = 0.8) of feature 19",
    "21 world model's ensemble disagreement at this step (0 until it predicts)",
    "22 log10 norm of the whole update (new weights − old)",
    "23 cosine between this update and the previous full step's",
    "24+5g log10 gradient norm of group g",
    "25+5g log10 update norm of group g",
    "26+5g log10 weight norm of group g",
    "27+5g log10 sqrt(mean second moment) of group g",
    "28+5g log10 first-moment norm of group g",
];

/// What one full step measured, in the units the trainer computes them.
#[derive(Debug, Clone, Default)]
pub struct StepMeasure {
    pub step: u64,
    pub total_steps: u64,
    pub loss: f32,
    pub lr: f32,
    pub warmup: bool,
    pub correct: bool,
    pub span_before: usize,
    pub rollbacks: u64,
    pub grad_norm: f32,
    pub clip: f32,
    pub pred_error: Option<f32>,
    pub disagreement: Option<f32>,
    pub update_norm: f32,
    pub update_cosine: f32,
    /// Per group: gradient, update, weight and first-moment norms, sqrt(mean v).
    pub groups: Vec<[f32; 5]>,
}

fn lg(x: f32) -> f32 {
    (x.max(1e-30) as f64).log10() as f32
}

/// The running statistics behind the features, and the online normaliser.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainingState {
    groups: usize,
    losses: VecDeque<(u64, f32)>,
    ema_fast: Option<f64>,
    ema_slow: Option<f64>,
    grad_ema: Option<f64>,
    err_ema: Option<f64>,
    max_lr: f32,
    last_full_step: Option<u64>,
    /// The kind of each of the last 32 steps: true when predicted.
    recent_kinds: VecDeque<bool>,
    norm: Normaliser,
}

impl TrainingState {
    /// A state for a model with `tensors` parameter tensors (groups = min(8, tensors)).
    pub fn new(tensors: usize) -> TrainingState {
        let groups = tensors.clamp(1, MAX_GROUPS);
        TrainingState {
            groups,
            losses: VecDeque::new(),
            ema_fast: None,
            ema_slow: None,
            grad_ema: None,
            err_ema: None,
            max_lr: 0.0,
            last_full_step: None,
            recent_kinds: VecDeque::new(),
            norm: Normaliser::new(GLOBAL_FEATURES + GROUP_FEATURES * groups),
        }
    }

    /// The feature width: 24 + 5·groups (64 for eight or more parameter tensors).
    pub fn width(&self) -> usize {
        GLOBAL_FEATURES + GROUP_FEATURES * self.groups
    }

    /// The number of parameter groups.
    pub fn groups(&self) -> usize {
        self.groups
    }

    /// The group of tensor `i` of `n`: contiguous runs of the parameter list.
    pub fn group_of(&self, i: usize, n: usize) -> usize {
        (i * self.groups / n.max(1)).min(self.groups - 1)
    }

    /// Records a predicted step (for the phase-history features).
    pub fn note_predicted(&mut self) {
        self.push_kind(true);
    }

    fn push_kind(&mut self, predicted: bool) {
        self.recent_kinds.push_back(predicted);
        if self.recent_kinds.len() > 32 {
            self.recent_kinds.pop_front();
        }
    }

    /// The relative update error's EMA (None before the world model predicted).
    pub fn error_ema(&self) -> Option<f32> {
        self.err_ema.map(|e| e as f32)
    }

    /// The mean and standard deviation of the last 16 full-step losses (None with fewer than
    /// four).
    pub fn loss_trajectory(&self) -> Option<(f32, f32)> {
        if self.losses.len() < 4 {
            return None;
        }
        let (mean, std, _) = stats(&self.losses);
        Some((mean as f32, std as f32))
    }

    /// Takes a full step's measurements: updates the running statistics and the normaliser,
    /// and returns the raw feature vector.
    /// Non-finite measurements (the trainer rolls back before it would pass one) are replaced
    /// by the previous value, so they cannot poison the running statistics.
    pub fn observe(&mut self, m: &StepMeasure) -> Vec<f32> {
        let prev_loss = self.losses.back().map(|l| l.1);
        let mut m = m.clone();
        if !m.loss.is_finite() {
            m.loss = prev_loss.unwrap_or(0.0);
        }
        if !m.grad_norm.is_finite() {
            m.grad_norm = self.grad_ema.unwrap_or(0.0) as f32;
        }
        let m = &m;
        self.losses.push_back((m.step, m.loss));
        if self.losses.len() > 16 {
            self.losses.pop_front();
        }
        let l = f64::from(m.loss);
        let ema = |e: Option<f64>, b: f64| Some(e.map_or(l, |e| b * e + (1.0 - b) * l));
        self.ema_fast = ema(self.ema_fast, 0.9);
        self.ema_slow = ema(self.ema_slow, 0.99);
        let g = f64::from(m.grad_norm);
        self.grad_ema = Some(self.grad_ema.map_or(g, |e| 0.9 * e + 0.1 * g));
        if let Some(e) = m.pred_error {
            let e = f64::from(e);
            self.err_ema = Some(self.err_ema.map_or(e, |x| 0.8 * x + 0.2 * e));
        }
        self.max_lr = self.max_lr.max(m.lr);
        let since = self
            .last_full_step
            .map_or(1, |s| m.step.saturating_sub(s).max(1));
        self.last_full_step = Some(m.step);
        self.push_kind(false);
        let (_, std, slope) = stats(&self.losses);
        let min = self
            .losses
            .iter()
            .map(|l| l.1)
            .fold(f32::INFINITY, f32::min);
        let predicted = self.recent_kinds.iter().filter(|&&p| p).count();
        let mut f = vec![
            m.loss,
            self.ema_fast.unwrap_or(l) as f32,
            self.ema_slow.unwrap_or(l) as f32,
            prev_loss.map_or(0.0, |p| m.loss - p),
            std as f32,
            slope as f32,
            m.loss - min,
            lg(m.lr),
            if self.max_lr > 0.0 {
                m.lr / self.max_lr
            } else {
                0.0
            },
            m.step as f32 / m.total_steps.max(1) as f32,
            predicted as f32 / self.recent_kinds.len().max(1) as f32,
            since as f32,
            f32::from(u8::from(m.warmup)),
            f32::from(u8::from(m.correct)),
            m.span_before as f32,
            (m.rollbacks as f32).ln_1p(),
            lg(m.grad_norm),
            (g / self.grad_ema.unwrap_or(g).max(1e-30)) as f32,
            m.clip,
            m.pred_error.unwrap_or(1.0),
            self.err_ema.unwrap_or(1.0) as f32,
            m.disagreement.unwrap_or(0.0),
            lg(m.update_norm),
            m.update_cosine,
        ];
        for gr in &m.groups {
            f.extend([lg(gr[0]), lg(gr[1]), lg(gr[2]), lg(gr[4]), lg(gr[3])]);
        }
        f.resize(self.width(), 0.0);
        for x in &mut f {
            if !x.is_finite() {
                *x = 0.0;
            }
        }
        self.norm.update(&f);
        f
    }

    /// `raw` normalised with the current running mean and variance, clipped to ±8.
    pub fn normalise(&self, raw: &[f32]) -> Vec<f32> {
        self.norm.apply(raw)
    }
}

/// Mean, standard deviation and least-squares slope (per step) of `(step, loss)` pairs.
fn stats(xs: &VecDeque<(u64, f32)>) -> (f64, f64, f64) {
    let n = xs.len() as f64;
    if xs.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    let mx = xs.iter().map(|p| p.0 as f64).sum::<f64>() / n;
    let my = xs.iter().map(|p| f64::from(p.1)).sum::<f64>() / n;
    let (mut sxx, mut sxy, mut syy) = (0.0, 0.0, 0.0);
    for &(x, y) in xs {
        let (dx, dy) = (x as f64 - mx, f64::from(y) - my);
        sxx += dx * dx;
        sxy += dx * dy;
        syy += dy * dy;
    }
    let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    (my, (syy / n).sqrt(), slope)
}

/// Running mean and variance per feature: exact (Welford) for the first 100 updates, then an
/// exponential average with weight 0.01, so it follows a drifting training run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Normaliser {
    count: u64,
    mean: Vec<f64>,
    var: Vec<f64>,
}

impl Normaliser {
    fn new(width: usize) -> Normaliser {
        Normaliser {
            count: 0,
            mean: vec![0.0; width],
            var: vec![0.0; width],
        }
    }

    fn update(&mut self, x: &[f32]) {
        self.count += 1;
        let a = (1.0 / self.count as f64).max(0.01);
        for ((m, v), &x) in self.mean.iter_mut().zip(&mut self.var).zip(x) {
            let d = f64::from(x) - *m;
            *m += a * d;
            *v = (1.0 - a) * (*v + a * d * d);
        }
    }

    fn apply(&self, x: &[f32]) -> Vec<f32> {
        x.iter()
            .zip(self.mean.iter().zip(&self.var))
            .map(|(&x, (m, v))| ((f64::from(x) - m) / (v + 1e-8).sqrt()).clamp(-8.0, 8.0) as f32)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measure(step: u64, loss: f32, groups: usize) -> StepMeasure {
        StepMeasure {
            step,
            total_steps: 100,
            loss,
            lr: 1e-3,
            grad_norm: 2.0,
            clip: 0.5,
            update_norm: 1e-2,
            update_cosine: 0.9,
            groups: vec![[1.0, 0.1, 10.0, 0.01, 0.5]; groups],
            ..StepMeasure::default()
        }
    }

    #[test]
    fn widths_and_groups_follow_the_parameter_count() {
        assert_eq!(TrainingState::new(39).width(), 64);
        assert_eq!(TrainingState::new(4).width(), 44);
        let s = TrainingState::new(39);
        let gs: Vec<usize> = (0..39).map(|i| s.group_of(i, 39)).collect();
        assert_eq!(gs[0], 0);
        assert_eq!(gs[38], 7);
        assert!(gs.windows(2).all(|w| w[1] == w[0] || w[1] == w[0] + 1));
        assert_eq!(FEATURE_TABLE.len(), GLOBAL_FEATURES + GROUP_FEATURES);
    }

    #[test]
    fn features_are_measured_values_and_normalise_to_unit_scale() {
        let mut s = TrainingState::new(8);
        let mut last = Vec::new();
        for i in 0..40u64 {
            let f = s.observe(&measure(i, 3.0 - 0.01 * i as f32, 8));
            assert_eq!(f.len(), 64);
            last = f;
        }
        assert!((last[0] - 2.61).abs() < 1e-5);
        assert!((last[5] + 0.01).abs() < 1e-4, "slope {}", last[5]);
        assert!((last[3] + 0.01).abs() < 1e-4);
        assert_eq!(last[11], 1.0);
        assert!((last[7] + 3.0).abs() < 1e-6);
        assert!((last[16] - 2f32.log10()).abs() < 1e-6);
        assert!((last[24 + 5 * 7 + 2] - 1.0).abs() < 1e-6);
        let n = s.normalise(&last);
        assert!(n.iter().all(|x| x.is_finite() && x.abs() <= 8.0));
        // A step after a predicted span sees the gap and the span.
        s.note_predicted();
        s.note_predicted();
        let mut m = measure(42, 2.5, 8);
        m.correct = true;
        m.span_before = 2;
        let f = s.observe(&m);
        assert_eq!(f[11], 3.0, "steps 40 and 41 were predicted");
        assert_eq!(f[13], 1.0);
        assert_eq!(f[14], 2.0);
        assert!(f[10] > 0.0);
    }

    #[test]
    fn non_finite_measurements_do_not_poison_the_normaliser() {
        let mut s = TrainingState::new(2);
        let mut m = measure(0, f32::NAN, 2);
        m.grad_norm = f32::INFINITY;
        let f = s.observe(&m);
        assert!(f.iter().all(|x| x.is_finite()));
        assert!(s.normalise(&f).iter().all(|x| x.is_finite()));
        let f = s.observe(&measure(1, 2.0, 2));
        assert_eq!(f[0], 2.0);
        assert!(f.iter().all(|x| x.is_finite()));
        assert!(s.normalise(&f).iter().all(|x| x.is_finite()));
    }
}
