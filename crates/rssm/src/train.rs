//! Training: [`SequenceBatch`], [`Rssm::train_step`] (backpropagation through time over a batch
//! of sequences, every member on its own bootstrap resample) and its [`LossBreakdown`].

use crate::error::{Result, RssmError};
use crate::layers::{check_sequences, free_bits, Stats};
use crate::model::Rssm;
use rand::{Rng, SeedableRng};
use tensor_ops::nn::{Mode, Module};
use tensor_ops::{no_grad, Tensor};

/// A batch of `B` sequences of `T` feature vectors, `[B, T, F]`, and what the decoder should
/// predict at each step: the features themselves (when the decoder's width is `F`) or given
/// targets `[B, T, D]`.
#[derive(Debug, Clone)]
pub struct SequenceBatch {
    features: Tensor,
    targets: Option<Tensor>,
}

impl SequenceBatch {
    /// Sequences whose decoder targets are their own features.
    pub fn new(features: Tensor) -> SequenceBatch {
        SequenceBatch {
            features,
            targets: None,
        }
    }

    /// Sequences with explicit decoder targets `[B, T, D]` (say, the features followed by the
    /// coefficients of the parameter update in a low-rank basis).
    pub fn with_targets(features: Tensor, targets: Tensor) -> SequenceBatch {
        SequenceBatch {
            features,
            targets: Some(targets),
        }
    }

    /// `[B, T, F]`.
    pub fn features(&self) -> &Tensor {
        &self.features
    }

    /// `[B, T, D]`, when given.
    pub fn targets(&self) -> Option<&Tensor> {
        self.targets.as_ref()
    }
}

/// The losses of one training step. Each term is the ensemble's mean of the members'
/// bootstrap-weighted means over sequences and steps (what the gradient was taken of).
#[derive(Debug, Clone, PartialEq)]
pub struct LossBreakdown {
    /// The step this was (0 for the first).
    pub step: u64,
    /// The optimised loss: `recon_scale·recon + pred_scale·pred + dyn_scale·kl_dyn +
    /// rep_scale·kl_rep`.
    pub total: f32,
    /// Reconstruction: `½‖y − decoder(h, z_posterior)‖²` per step.
    pub recon: f32,
    /// One-step prediction: `½‖y − decoder(h, μ_prior)‖²` per step.
    pub pred: f32,
    /// `KL(posterior ‖ prior)` per step in nats, before free bits.
    pub kl: f32,
    /// The dynamics term `max(free, KL(sg(posterior) ‖ prior))`.
    pub kl_dyn: f32,
    /// The representation term `max(free, KL(posterior ‖ sg(prior)))`.
    pub kl_rep: f32,
    /// Each member's total.
    pub member_totals: Vec<f32>,
    /// Each member's bootstrap mask: how many times each of the `B` sequences was drawn in its
    /// resample (`B` draws with replacement; the counts sum to `B`).
    pub bootstrap: Vec<Vec<u32>>,
}

/// The bootstrap counts of `members` resamples of `b` sequences, from `seed`.
pub(crate) fn bootstrap_counts(members: usize, b: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..members)
        .map(|_| {
            let mut c = vec![0u32; b];
            for _ in 0..b {
                c[rng.random_range(0..b)] += 1;
            }
            c
        })
        .collect()
}

/// The seed of sub-stream `site` of a training step's seed.
fn fork(seed: u64, site: u64) -> u64 {
    match Mode::train(seed).fork(site) {
        Mode::Train { seed } => seed,
        Mode::Eval => seed,
    }
}

/// The number of loss terms a member reports: total, recon, pred, kl, kl_dyn, kl_rep.
const TERMS: usize = 6;

impl Rssm {
    /// One AdamW step of backpropagation through time on `batch` with learning rate `lr`.
    ///
    /// Every member filters each sequence from the zero state (`h_t = GRU(z_{t−1}, h_{t−1})`,
    /// `z_t ~ q(z | h_t, e_t)` reparameterised), and is scored by the loss terms of
    /// [`LossBreakdown`] averaged over steps; its loss weights the sequences by its bootstrap
    /// counts. The encoder is shared. Dropout masks, latent noise and bootstrap draws come
    /// from `config.seed` and the step count, so a run is reproducible on any device.
    ///
    /// Errors, before anything changes: features or targets of the wrong shape, width or
    /// device, or with NaN or Inf; a missing target when the decoder's width is not the
    /// feature width; a learning rate that is not finite and `>= 0`. A loss that comes out
    /// non-finite is [`RssmError::NonFinite`] and the update is not applied.
    pub fn train_step(&mut self, batch: &SequenceBatch, lr: f32) -> Result<LossBreakdown> {
        if !(lr.is_finite() && lr >= 0.0) {
            return Err(RssmError::InvalidArgument {
                what: "learning rate",
                reason: format!("must be finite and >= 0, got {lr}"),
            });
        }
        let dev = self.device();
        let (b, t) = check_sequences("features", &batch.features, self.cfg.feature_dim, dev)?;
        let targets = match &batch.targets {
            Some(y) => {
                let (yb, yt) = check_sequences("targets", y, self.cfg.output_dim, dev)?;
                if (yb, yt) != (b, t) {
                    return Err(RssmError::Shape {
                        what: "targets",
                        expected: format!("[{b}, {t}, {}] (as the features)", self.cfg.output_dim),
                        got: y.shape().to_vec(),
                    });
                }
                y.clone()
            }
            None if self.cfg.output_dim == self.cfg.feature_dim => batch.features.clone(),
            None => {
                return Err(RssmError::InvalidArgument {
                    what: "targets",
                    reason: format!(
                        "the decoder predicts {} values but the features have {}: give targets",
                        self.cfg.output_dim, self.cfg.feature_dim
                    ),
                })
            }
        };
        let seed = fork(self.cfg.seed, self.steps);
        let (total, terms) = self.losses(batch, &targets, seed, (b, t))?;
        let values = terms.to_vec()?;
        if values.iter().any(|v| !v.is_finite()) {
            return Err(RssmError::NonFinite { what: "the loss" });
        }
        let grads = total.backward()?;
        self.opt.step(&grads, lr)?;
        let m = self.members.len();
        let mean = |k: usize| (0..m).map(|i| values[i * TERMS + k]).sum::<f32>() / m as f32;
        let out = LossBreakdown {
            step: self.steps,
            total: mean(0),
            recon: mean(1),
            pred: mean(2),
            kl: mean(3),
            kl_dyn: mean(4),
            kl_rep: mean(5),
            member_totals: (0..m).map(|i| values[i * TERMS]).collect(),
            bootstrap: bootstrap_counts(m, b, fork(seed, 1)),
        };
        self.steps += 1;
        self.version += 1;
        Ok(out)
    }

    /// The loss (a scalar with a graph) and each member's terms `[M, TERMS]` (no graph).
    fn losses(
        &self,
        batch: &SequenceBatch,
        targets: &Tensor,
        seed: u64,
        (b, t): (usize, usize),
    ) -> Result<(Tensor, Tensor)> {
        let cfg = &self.cfg;
        let dev = self.device();
        let rows = t * b;
        // Time-major targets, row t·B + b (as the stacked states below).
        let y = targets
            .permute(&[1, 0, 2])?
            .reshape(&[rows, cfg.output_dim])?;
        let embeds = self.embed_steps(&batch.features, Mode::train(fork(seed, 0)))?;
        let counts = bootstrap_counts(self.members.len(), b, fork(seed, 1));
        let mut member_losses = Vec::with_capacity(self.members.len());
        let mut member_terms = Vec::with_capacity(self.members.len());
        for (i, (member, count)) in self.members.iter().zip(&counts).enumerate() {
            let noise = Tensor::randn(&[t, b, cfg.latent_dim], 1.0, fork(seed, 2 + i as u64), dev)?;
            let tr = self.filter(member, &embeds, Some(&noise))?;
            let h = Tensor::cat(&tr.hs.iter().collect::<Vec<_>>(), 0)?;
            let z = Tensor::cat(&tr.zs.iter().collect::<Vec<_>>(), 0)?;
            let post = Stats::cat(&tr.post)?;
            let prior = Stats::from_raw(&member.prior.forward(&h)?, cfg)?;
            let sq_err = |pred: &Tensor| -> tensor_ops::Result<Tensor> {
                let d = pred.sub(&y)?;
                d.mul(&d)?.sum(-1, false)?.mul_scalar(0.5)
            };
            let recon = sq_err(&member.decode(&h, &z)?)?;
            let pred = sq_err(&member.decode(&h, &prior.mean)?)?;
            let kl_dyn_raw = post.detach().kl(&prior)?;
            let kl_rep = free_bits(&post.kl(&prior.detach())?, cfg.free_nats)?;
            let kl_dyn = free_bits(&kl_dyn_raw, cfg.free_nats)?;
            let per_row = recon
                .mul_scalar(cfg.recon_scale)?
                .add(&pred.mul_scalar(cfg.pred_scale)?)?
                .add(&kl_dyn.mul_scalar(cfg.dyn_scale)?)?
                .add(&kl_rep.mul_scalar(cfg.rep_scale)?)?;
            // Bootstrap weights: count / B, so a member's loss is the mean over its resample.
            let w: Vec<f32> = count.iter().map(|&c| c as f32 / b as f32).collect();
            let w = Tensor::from_vec(w, &[b], dev)?;
            // Mean over steps, then the weighted sum over sequences.
            let weigh = |r: &Tensor| -> tensor_ops::Result<Tensor> {
                r.reshape(&[t, b])?.mean(0, false)?.mul(&w)?.sum_all()
            };
            let loss = weigh(&per_row)?;
            let terms = no_grad(|| -> tensor_ops::Result<Tensor> {
                let parts = [
                    loss.detach(),
                    weigh(&recon)?,
                    weigh(&pred)?,
                    weigh(&kl_dyn_raw)?,
                    weigh(&kl_dyn)?,
                    weigh(&kl_rep)?,
                ]
                .map(|p| p.reshape(&[1]));
                let parts = parts.into_iter().collect::<tensor_ops::Result<Vec<_>>>()?;
                Tensor::cat(&parts.iter().collect::<Vec<_>>(), 0)
            })?;
            member_losses.push(loss);
            member_terms.push(terms);
        }
        let mut total = member_losses[0].clone();
        for l in &member_losses[1..] {
            total = total.add(l)?;
        }
        let total = total.mul_scalar(1.0 / self.members.len() as f32)?;
        let terms = Tensor::cat(&member_terms.iter().collect::<Vec<_>>(), 0)?;
        Ok((total, terms))
    }
}
