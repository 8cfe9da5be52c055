//! [`RssmConfig`]: the world model's sizes, latent, loss weights and optimiser, checked by
//! [`RssmConfig::validate`] before anything is built.

use crate::error::{Result, RssmError};
use tensor_ops::optim::AdamWParams;

/// Sizes and hyper-parameters of an [`crate::Rssm`]. [`RssmConfig::default`] is the issue's
/// model: features 64 → encoder 128, five GRU members of hidden size 256, a 32-dimensional
/// Gaussian latent, a decoder that predicts the 64 features.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RssmConfig {
    /// Width F of a training-state feature vector (the encoder's input).
    pub feature_dim: usize,
    /// Width E of the encoder's output (Linear F → E, LayerNorm, ReLU, dropout).
    pub embed_dim: usize,
    /// Hidden size H of each member's GRU cell (the deterministic state).
    pub hidden_dim: usize,
    /// Dimension S of the diagonal-Gaussian stochastic latent.
    pub latent_dim: usize,
    /// Width of the hidden layer of the prior, posterior and decoder heads.
    pub head_dim: usize,
    /// Width D of the decoder's output: what the model predicts at each step. Equal to
    /// `feature_dim` to predict the features; wider to also predict, say, the coefficients of
    /// parameter updates in a low-rank basis (the training batch then carries targets).
    pub output_dim: usize,
    /// Number of ensemble members (each its own GRU, prior, posterior and decoder; the encoder
    /// is shared). At least 2: their disagreement is the model's uncertainty.
    pub ensemble: usize,
    /// Dropout probability after the encoder's ReLU, in `[0, 1)`.
    pub dropout: f32,
    /// LayerNorm epsilon (encoder and heads).
    pub layer_norm_eps: f32,
    /// Smallest standard deviation of a latent dimension.
    pub min_std: f32,
    /// Largest standard deviation of a latent dimension (`σ = min + (max − min)·sigmoid(raw)`).
    pub max_std: f32,
    /// Free bits: the KL per step (summed over latent dims, in nats) below which it is not
    /// penalised (DreamerV3: 1).
    pub free_nats: f32,
    /// Weight of the dynamics KL, `KL(sg(posterior) ‖ prior)`: trains the prior (DreamerV3: 0.5).
    pub dyn_scale: f32,
    /// Weight of the representation KL, `KL(posterior ‖ sg(prior))`: regularises the
    /// posterior (DreamerV3: 0.1).
    pub rep_scale: f32,
    /// Weight of the reconstruction loss (decoder on the posterior latent).
    pub recon_scale: f32,
    /// Weight of the one-step prediction loss (decoder on the prior's mean: what rollouts use).
    pub pred_scale: f32,
    /// AdamW's hyper-parameters (the learning rate is given per step).
    pub adamw: AdamWParams,
    /// Seed of the initial weights, dropout masks, latent noise and bootstrap draws.
    pub seed: u64,
}

impl Default for RssmConfig {
    fn default() -> Self {
        RssmConfig {
            feature_dim: 64,
            embed_dim: 128,
            hidden_dim: 256,
            latent_dim: 32,
            head_dim: 128,
            output_dim: 64,
            ensemble: 5,
            dropout: 0.1,
            layer_norm_eps: 1e-5,
            min_std: 0.1,
            max_std: 2.0,
            free_nats: 1.0,
            dyn_scale: 0.5,
            rep_scale: 0.1,
            recon_scale: 1.0,
            pred_scale: 1.0,
            adamw: AdamWParams {
                weight_decay: 0.0,
                max_grad_norm: Some(100.0),
                ..AdamWParams::default()
            },
            seed: 0,
        }
    }
}

fn bad(field: &'static str, reason: impl Into<String>) -> RssmError {
    RssmError::InvalidConfig {
        field,
        reason: reason.into(),
    }
}

impl RssmConfig {
    /// Checks every field: positive sizes, at least two members (none is
    /// [`RssmError::EmptyEnsemble`]), dropout in `[0, 1)`, finite positive `layer_norm_eps`,
    /// `0 < min_std < max_std` finite, finite non-negative loss weights and free nats, valid
    /// AdamW hyper-parameters.
    pub fn validate(&self) -> Result<()> {
        for (field, v) in [
            ("feature_dim", self.feature_dim),
            ("embed_dim", self.embed_dim),
            ("hidden_dim", self.hidden_dim),
            ("latent_dim", self.latent_dim),
            ("head_dim", self.head_dim),
            ("output_dim", self.output_dim),
        ] {
            if v == 0 {
                return Err(bad(field, "must be positive"));
            }
        }
        match self.ensemble {
            0 => return Err(RssmError::EmptyEnsemble),
            1 => {
                return Err(bad(
                    "ensemble",
                    "one member has no disagreement to expose: use at least 2",
                ))
            }
            _ => {}
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(bad(
                "dropout",
                format!("must be in [0, 1), got {}", self.dropout),
            ));
        }
        if !(self.layer_norm_eps.is_finite() && self.layer_norm_eps > 0.0) {
            return Err(bad("layer_norm_eps", "must be finite and > 0"));
        }
        let stds_ok = self.min_std.is_finite()
            && self.max_std.is_finite()
            && self.min_std > 0.0
            && self.min_std < self.max_std;
        if !stds_ok {
            return Err(bad(
                "min_std/max_std",
                format!(
                    "need 0 < min_std < max_std, finite; got {} and {}",
                    self.min_std, self.max_std
                ),
            ));
        }
        for (field, v) in [
            ("free_nats", self.free_nats),
            ("dyn_scale", self.dyn_scale),
            ("rep_scale", self.rep_scale),
            ("recon_scale", self.recon_scale),
            ("pred_scale", self.pred_scale),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(bad(field, format!("must be finite and >= 0, got {v}")));
            }
        }
        self.adamw
            .validate()
            .map_err(|e| bad("adamw", e.to_string()))
    }
}
