//! The hybrid predictive trainer: AdamW full steps, and predicted steps where a learned world
//! model (an [`rssm::Rssm`] ensemble behind [`GpuAccelerator`]) supplies the update, with
//! confidence gating, drift correction and rollback. Generic over any tensor-ops model.
//!
//! # How a run goes
//!
//! Phases: **warm-up** (full AdamW steps while the update history fills and the world model
//! starts learning) → **full** (AdamW steps; the model keeps learning and is scored on each
//! step) → **predict** (a span of at most `max_span` steps whose updates come from the model:
//! no forward and no backward pass unless `predicted_forward`) → **correct** (the full step
//! that ends a span, plus the drift correction) → full or predict again. The trainer returns
//! to full steps at any step where the gate refuses.
//!
//! **What is predicted.** Each parameter tensor keeps its last `history` full-step updates;
//! their top-`rank` right singular vectors (`compress_residuals`) are its basis. The world
//! model reads the [`TrainingState`] features and predicts, beside the next features, the
//! next update's coefficients in every tensor's basis. A predicted step adds `Σ c_j·v_j` to
//! every parameter tensor in place (`apply_corrections`, `U` = coefficients, `V` = basis).
//!
//! **The gate**, checked at every predicted step: the ensemble's disagreement about that step
//! is at most `gate_disagreement` times its running mean on full steps, and the running mean
//! of the model's relative update error `‖Δ − Δ̂‖/‖Δ‖` measured on full steps is below
//! `gate_error` (below 1 a predicted update moves the weights closer to AdamW's than no
//! update would).
//!
//! **The correction.** The full step that ends a span compares its AdamW update with the
//! model's prediction for that step; the residual of each tensor is compressed to rank
//! `correction_rank` in the tensor's matrix view and added `correction_gain × span` times: the
//! span's steps are assumed to have missed the same residual each.
//!
//! **The optimiser's moments** summarise observed gradients: a predicted step observes none,
//! so it leaves the moments and AdamW's step count (its bias correction) unchanged; the
//! updates it applies already contain the weight decay (they are learned from actual updates).
//!
//! **Safety.** A non-finite loss, a correct step's loss above the recent full-step trajectory
//! (mean + 3σ of the last 16, plus `drift_tolerance` relative), or a held-out loss worse than
//! the best one by more than `holdout_tolerance` (relative) rolls back to the last good
//! snapshot — weights, optimiser state, trainer state and step (the data position and every
//! random draw derive from the step) — and continues with full steps for `cooldown` steps. A
//! failure with no predicted step since that snapshot is plain AdamW's own and is returned as
//! [`HybridError::Diverged`].

pub(crate) mod checkpoint;
mod dist;
mod full;
mod run;
pub mod state;
mod updates;

pub use checkpoint::MODEL_FILE;
pub use run::{Counters, HybridTrainer, StepReport, Timings};
pub use state::{StepMeasure, TrainingState, FEATURE_TABLE};

use serde::{Deserialize, Serialize};
use tensor_ops::Tensor;

/// What the trainer trains: a loss for a training step, and a held-out loss for its safety
/// checks.
pub trait Objective {
    /// The training loss of step `step`, as a graph to backpropagate. The batch, dropout and
    /// any other random draw must derive from `step` (so a rollback or a resume repeats it).
    fn train_loss(&mut self, step: u64) -> anyhow::Result<Tensor>;
    /// A loss on data held out of training (never the validation split a report shows),
    /// without gradients.
    fn holdout_loss(&mut self) -> anyhow::Result<f32>;
}

/// What a predicted step applies.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Plain AdamW: every step full, nothing else computed.
    Baseline,
    /// The world model's predicted update, gated.
    Hybrid,
    /// Control: predicted steps, evenly spaced at `fraction`, leave the weights unchanged.
    SkipFreeze { fraction: f64 },
    /// Control: predicted steps, evenly spaced at `fraction`, re-apply the last full step's
    /// update.
    ReapplyLast { fraction: f64 },
}

/// The trainer's settings (see the module docs for what each does).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HybridConfig {
    pub mode: Mode,
    /// Full steps before anything is predicted.
    pub warmup: u64,
    /// Full-step updates kept per tensor (K).
    pub history: usize,
    /// Rank of each tensor's update basis (r).
    pub rank: usize,
    /// Full steps the world model reads before predicting (T <= K).
    pub context: usize,
    /// Longest predicted span.
    pub max_span: usize,
    /// Full steps between spans (the correct step counts).
    pub full_between: usize,
    /// Full steps between basis refreshes.
    pub basis_every: usize,
    /// One world-model training step every this many full steps (0: never).
    pub rssm_every: u64,
    /// World-model training steps before its predictions are used.
    pub rssm_min_steps: u64,
    pub rssm_lr: f32,
    pub gate_disagreement: f32,
    pub gate_error: f32,
    pub drift_tolerance: f32,
    /// Steps between held-out checks (and good snapshots).
    pub holdout_every: u64,
    pub holdout_tolerance: f32,
    /// Full steps after a rollback before predicting again.
    pub cooldown: u64,
    pub correction_rank: usize,
    pub correction_gain: f32,
    /// Run a forward pass on predicted steps too (its loss is checked like a full step's).
    pub predicted_forward: bool,
    /// Seed of every random draw the trainer makes (SVD sketches, the world model).
    pub seed: u64,
    /// The world model's sizes (the feature and output widths follow from the model).
    pub world: WorldModelSize,
}

impl Default for HybridConfig {
    fn default() -> Self {
        HybridConfig {
            mode: Mode::Hybrid,
            warmup: 100,
            history: 8,
            rank: 2,
            context: 4,
            max_span: 1,
            full_between: 1,
            basis_every: 4,
            rssm_every: 1,
            rssm_min_steps: 20,
            rssm_lr: 1e-3,
            gate_disagreement: 2.0,
            gate_error: 0.9,
            drift_tolerance: 0.05,
            holdout_every: 50,
            holdout_tolerance: 0.02,
            cooldown: 20,
            correction_rank: 2,
            correction_gain: 0.5,
            predicted_forward: false,
            seed: 0,
            world: WorldModelSize::default(),
        }
    }
}

impl HybridConfig {
    /// Checks every field; a typed error names the first bad one.
    pub fn validate(&self) -> Result<(), HybridError> {
        let bad = |field: &'static str, reason: String| Err(HybridError::Config { field, reason });
        if let Mode::SkipFreeze { fraction } | Mode::ReapplyLast { fraction } = self.mode {
            if !(0.0..1.0).contains(&fraction) {
                return bad(
                    "mode.fraction",
                    format!("must be in [0, 1), got {fraction}"),
                );
            }
        }
        for (field, v) in [
            ("history", self.history),
            ("rank", self.rank),
            ("context", self.context),
            ("max_span", self.max_span),
            ("full_between", self.full_between),
            ("basis_every", self.basis_every),
            ("correction_rank", self.correction_rank),
        ] {
            if v == 0 {
                return bad(field, "must be at least 1".into());
            }
        }
        if self.context > self.history {
            return bad(
                "context",
                format!("{} exceeds history {}", self.context, self.history),
            );
        }
        if self.holdout_every == 0 {
            return bad("holdout_every", "must be at least 1".into());
        }
        for (field, v) in [
            ("rssm_lr", self.rssm_lr),
            ("gate_disagreement", self.gate_disagreement),
            ("gate_error", self.gate_error),
            ("drift_tolerance", self.drift_tolerance),
            ("holdout_tolerance", self.holdout_tolerance),
            ("correction_gain", self.correction_gain),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return bad(field, format!("must be finite and >= 0, got {v}"));
            }
        }
        Ok(())
    }
}

/// The world model's sizes: [`rssm::RssmConfig`]'s, whose defaults are the model
/// (5 members, encoder 128, GRU 256, latent 32, heads 128).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct WorldModelSize {
    pub ensemble: usize,
    pub embed: usize,
    pub hidden: usize,
    pub latent: usize,
    pub head: usize,
}

impl Default for WorldModelSize {
    fn default() -> Self {
        let d = rssm::RssmConfig::default();
        WorldModelSize {
            ensemble: d.ensemble,
            embed: d.embed_dim,
            hidden: d.hidden_dim,
            latent: d.latent_dim,
            head: d.head_dim,
        }
    }
}

impl WorldModelSize {
    /// The world model's config for `features` inputs and `outputs` predicted values.
    pub fn config(&self, features: usize, outputs: usize, seed: u64) -> rssm::RssmConfig {
        rssm::RssmConfig {
            feature_dim: features,
            output_dim: outputs,
            ensemble: self.ensemble,
            embed_dim: self.embed,
            hidden_dim: self.hidden,
            latent_dim: self.latent,
            head_dim: self.head,
            seed,
            ..rssm::RssmConfig::default()
        }
    }
}

/// What can go wrong in the hybrid trainer.
#[derive(Debug, thiserror::Error)]
pub enum HybridError {
    #[error("invalid hybrid config: {field} {reason}")]
    Config { field: &'static str, reason: String },
    /// Plain AdamW fails here too: the failure came with no predicted step since the last good
    /// snapshot.
    #[error("training diverged at step {step}: {reason} (with full AdamW steps only since the last good snapshot)")]
    Diverged { step: u64, reason: String },
    #[error("non-finite {0}")]
    NonFinite(&'static str),
    #[error("the update basis is not computed yet")]
    NoBasis,
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    #[error("the objective failed: {0:#}")]
    Objective(anyhow::Error),
    #[error(transparent)]
    Tensor(#[from] tensor_ops::GpuError),
    #[error(transparent)]
    Accelerator(#[from] rssm::AcceleratorError),
    #[error(transparent)]
    Rssm(#[from] rssm::RssmError),
    /// A data-parallel job's ranks failed to agree, or a collective failed.
    #[error("data parallel: {0}")]
    Distributed(String),
}

/// The phase a step ran in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Warmup,
    Full,
    Predict,
    Correct,
}
