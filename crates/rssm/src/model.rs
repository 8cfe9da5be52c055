//! [`Rssm`]: the ensemble world model: construction, filtering a context ([`Rssm::observe`]),
//! multi-step rollouts from the prior ([`Rssm::imagine`]), predictions with their ensemble
//! disagreement ([`Rssm::predict`]) and checkpoints. Training is in `train.rs`.

use crate::config::RssmConfig;
use crate::error::{Result, RssmError};
use crate::layers::{check_device, check_sequences, Encoder, Member, Stats};
use std::collections::HashMap;
use tensor_ops::nn::{Mode, Module, ModuleT, ParamStore};
use tensor_ops::optim::AdamW;
use tensor_ops::{no_grad, Device, Tensor};

/// The metadata key of a checkpoint's training-step count.
const STEPS_KEY: &str = "rssm.steps";

/// A member's state after filtering: the GRU state `h` `[B, H]` and the latent `z` `[B, S]`.
#[derive(Debug, Clone)]
pub struct MemberState {
    /// Deterministic (GRU) state.
    pub h: Tensor,
    /// Stochastic latent (the posterior mean after [`Rssm::observe`]).
    pub z: Tensor,
}

/// What [`Rssm::predict`] returns for a batch of `B` contexts and `N` steps ahead.
#[derive(Debug, Clone)]
pub struct Prediction {
    /// Each member's prediction, `[M, B, N, D]`.
    pub members: Tensor,
    /// The ensemble mean, `[B, N, D]`: the prediction to use.
    pub mean: Tensor,
    /// The ensemble disagreement, `[B, N]`: the variance across members, averaged over the `D`
    /// outputs. The model's uncertainty about each predicted step.
    pub disagreement: Tensor,
}

/// One member's filtered trajectory over `T` steps (each entry `[B, ..]`).
pub(crate) struct Trajectory {
    pub(crate) hs: Vec<Tensor>,
    pub(crate) zs: Vec<Tensor>,
    pub(crate) post: Vec<Stats>,
}

/// The recurrent state-space world model: a shared encoder and an ensemble of members, each a
/// GRU cell with a Gaussian prior, a posterior and a decoder, trained by backpropagation
/// through time on any device (see the crate docs for the equations).
pub struct Rssm {
    pub(crate) cfg: RssmConfig,
    pub(crate) store: ParamStore,
    pub(crate) encoder: Encoder,
    pub(crate) members: Vec<Member>,
    pub(crate) opt: AdamW,
    pub(crate) steps: u64,
    /// Bumped by every change of the weights (training, loading): caches of host copies key
    /// on it.
    pub(crate) version: u64,
}

impl std::fmt::Debug for Rssm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rssm")
            .field("config", &self.cfg)
            .field("device", &self.device())
            .field("steps", &self.steps)
            .finish()
    }
}

impl Rssm {
    /// A model with fresh weights on `device`, drawn from `config.seed` (the same values on
    /// every device). The config is checked first ([`RssmConfig::validate`]).
    pub fn new(config: RssmConfig, device: Device) -> Result<Rssm> {
        config.validate()?;
        device.check_present()?;
        let store = ParamStore::new(device, config.seed);
        let encoder = Encoder::new(store.pp("encoder"), &config)?;
        let members = (0..config.ensemble)
            .map(|m| Member::new(store.pp("member").pp(m), &config))
            .collect::<Result<Vec<_>>>()?;
        let opt = store.adamw(config.adamw)?;
        Ok(Rssm {
            cfg: config,
            store,
            encoder,
            members,
            opt,
            steps: 0,
            version: 0,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &RssmConfig {
        &self.cfg
    }

    /// Where the weights live.
    pub fn device(&self) -> Device {
        self.store.device()
    }

    /// Training steps taken (or recorded in the loaded checkpoint).
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Whether the model has been trained (at least one step, here or before a checkpoint).
    pub fn is_trained(&self) -> bool {
        self.steps > 0
    }

    /// Number of ensemble members.
    pub fn ensemble_size(&self) -> usize {
        self.members.len()
    }

    /// Total number of weights.
    pub fn num_parameters(&self) -> usize {
        self.store.num_elements()
    }

    /// The parameters' names, in registration order (`encoder.fc.weight`,
    /// `member.0.gru.weight_ih`, ...).
    pub fn parameter_names(&self) -> Vec<String> {
        self.store.names()
    }

    /// A changes counter of the weights: equal values mean equal weights.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The encoder applied to `features` `[.., F]` (any leading dims): `[.., E]`. Dropout acts
    /// only in a training `mode`.
    pub fn encode(&self, features: &Tensor, mode: Mode) -> Result<Tensor> {
        let f = self.cfg.feature_dim;
        if features.shape().last() != Some(&f) {
            return match features.shape().last() {
                Some(&got) => Err(RssmError::FeatureWidth {
                    what: "features",
                    expected: f,
                    got,
                }),
                None => Err(RssmError::Shape {
                    what: "features",
                    expected: format!("[.., {f}]"),
                    got: vec![],
                }),
            };
        }
        check_device("features", features, self.device())?;
        Ok(self.encoder.forward_t(features, mode)?)
    }

    /// The encoder's output `[B, T, E]` as `T` time-major slices `[B, E]`.
    pub(crate) fn embed_steps(&self, features: &Tensor, mode: Mode) -> Result<Vec<Tensor>> {
        let (b, t) = (features.shape()[0], features.shape()[1]);
        let e = self.encode(features, mode)?.permute(&[1, 0, 2])?;
        let dim = self.cfg.embed_dim;
        (0..t)
            .map(|i| Ok(e.narrow(0, i, 1)?.reshape(&[b, dim])?))
            .collect()
    }

    /// Filters one member through the embedded steps from the zero state. With `noise`
    /// (`[T, B, S]` standard normal) the latent is the reparameterised sample
    /// `μ + σ·ε`, else the posterior mean.
    pub(crate) fn filter(
        &self,
        member: &Member,
        embeds: &[Tensor],
        noise: Option<&Tensor>,
    ) -> Result<Trajectory> {
        let b = match embeds.first() {
            Some(e) => e.shape()[0],
            None => return Err(RssmError::Empty { what: "sequence" }),
        };
        let dev = self.device();
        let mut h = Tensor::zeros(&[b, self.cfg.hidden_dim], dev)?;
        let mut z = Tensor::zeros(&[b, self.cfg.latent_dim], dev)?;
        let mut out = Trajectory {
            hs: Vec::with_capacity(embeds.len()),
            zs: Vec::with_capacity(embeds.len()),
            post: Vec::with_capacity(embeds.len()),
        };
        for (t, e) in embeds.iter().enumerate() {
            h = member.gru.forward(&z, &h)?;
            let raw = member.posterior.forward(&Tensor::cat(&[&h, e], 1)?)?;
            let post = Stats::from_raw(&raw, &self.cfg)?;
            z = match noise {
                Some(n) => {
                    let eps = n.narrow(0, t, 1)?.reshape(&[b, self.cfg.latent_dim])?;
                    post.mean.add(&post.std.mul(&eps)?)?
                }
                None => post.mean.clone(),
            };
            out.hs.push(h.clone());
            out.zs.push(z.clone());
            out.post.push(post);
        }
        Ok(out)
    }

    /// Filters every member through `context` `[B, T, F]` (evaluation mode: no dropout, the
    /// latent is the posterior mean) and returns each member's last state.
    pub fn observe(&self, context: &Tensor) -> Result<Vec<MemberState>> {
        check_sequences("context", context, self.cfg.feature_dim, self.device())?;
        let embeds = self.embed_steps(context, Mode::Eval)?;
        self.members
            .iter()
            .map(|m| {
                let mut tr = self.filter(m, &embeds, None)?;
                match (tr.hs.pop(), tr.zs.pop()) {
                    (Some(h), Some(z)) => Ok(MemberState { h, z }),
                    _ => Err(RssmError::Empty { what: "context" }),
                }
            })
            .collect()
    }

    /// Rolls every member `steps` steps ahead from its state in `start` (one per member, as
    /// [`Rssm::observe`] returns) along its prior's mean: `h ← GRU(z, h)`, `z ← μ_prior(h)`,
    /// `y = decoder(h, z)`. Returns `[M, B, steps, D]`.
    pub fn imagine(&self, start: &[MemberState], steps: usize) -> Result<Tensor> {
        if start.len() != self.members.len() {
            return Err(RssmError::InvalidArgument {
                what: "imagine",
                reason: format!(
                    "{} start states for {} members",
                    start.len(),
                    self.members.len()
                ),
            });
        }
        if steps == 0 {
            return Err(RssmError::Empty {
                what: "the rollout (steps = 0)",
            });
        }
        let (hd, sd, d) = (
            self.cfg.hidden_dim,
            self.cfg.latent_dim,
            self.cfg.output_dim,
        );
        let mut outs = Vec::with_capacity(self.members.len());
        for (m, st) in self.members.iter().zip(start) {
            let b = st.h.shape().first().copied().unwrap_or(0);
            if st.h.shape() != [b, hd] || st.z.shape() != [b, sd] || b == 0 {
                return Err(RssmError::Shape {
                    what: "a start state",
                    expected: format!("h [B, {hd}] and z [B, {sd}], B > 0"),
                    got: [st.h.shape(), st.z.shape()].concat(),
                });
            }
            check_device("a start state", &st.h, self.device())?;
            check_device("a start state", &st.z, self.device())?;
            let (mut h, mut z) = (st.h.clone(), st.z.clone());
            let mut ys = Vec::with_capacity(steps);
            for _ in 0..steps {
                h = m.gru.forward(&z, &h)?;
                z = Stats::from_raw(&m.prior.forward(&h)?, &self.cfg)?.mean;
                ys.push(m.decode(&h, &z)?.reshape(&[b, 1, d])?);
            }
            let refs: Vec<&Tensor> = ys.iter().collect();
            outs.push(Tensor::cat(&refs, 1)?.reshape(&[1, b, steps, d])?);
        }
        let refs: Vec<&Tensor> = outs.iter().collect();
        Ok(Tensor::cat(&refs, 0)?)
    }

    /// Filters `context` `[B, T, F]`, rolls `steps` ahead and returns every member's
    /// prediction, the ensemble mean and the disagreement (no graph is recorded). Errors on an
    /// untrained model ([`RssmError::Untrained`]), a context of the wrong width, shape or
    /// device, with NaN or Inf, and on `steps == 0`.
    pub fn predict(&self, context: &Tensor, steps: usize) -> Result<Prediction> {
        if !self.is_trained() {
            return Err(RssmError::Untrained);
        }
        no_grad(|| {
            let start = self.observe(context)?;
            let members = self.imagine(&start, steps)?;
            let (mean, disagreement) = ensemble_stats(&members)?;
            Ok(Prediction {
                members,
                mean,
                disagreement,
            })
        })
    }

    /// The weights as safetensors bytes, with the step count in the metadata. (AdamW's
    /// moments are not included: training resumed from a checkpoint restarts them.)
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let meta = HashMap::from([(STEPS_KEY.to_string(), self.steps.to_string())]);
        Ok(self.store.to_safetensors(&meta)?)
    }

    /// Overwrites the weights from [`Rssm::to_bytes`] output of a model of the same config
    /// (every name, shape and dtype is checked before anything is written) and takes its step
    /// count (0 when the metadata has none).
    pub fn load_bytes(&mut self, data: &[u8]) -> Result<()> {
        let meta = tensor_ops::nn::read_metadata(data)?;
        let steps = match meta.get(STEPS_KEY) {
            Some(s) => s.parse().map_err(|_| RssmError::InvalidArgument {
                what: "checkpoint",
                reason: format!("{STEPS_KEY} = {s:?} is not a step count"),
            })?,
            None => 0,
        };
        self.store.load_bytes(data)?;
        self.steps = steps;
        self.version += 1;
        Ok(())
    }

    /// A copy of the training optimiser's state (moments and step count), for checkpoints that
    /// resume training bit for bit (with [`Rssm::to_bytes`]).
    pub fn optimizer_state(&self) -> Result<tensor_ops::optim::AdamWState> {
        Ok(self.opt.state()?)
    }

    /// Loads an optimiser state from [`Rssm::optimizer_state`] of a model of the same config
    /// (checked before anything is written).
    pub fn load_optimizer_state(&mut self, state: &tensor_ops::optim::AdamWState) -> Result<()> {
        Ok(self.opt.load_state(state)?)
    }

    /// A copy of this model (weights and step count, fresh optimiser state) on `device`.
    pub fn to_device(&self, device: Device) -> Result<Rssm> {
        let mut other = Rssm::new(self.cfg, device)?;
        other.load_bytes(&self.to_bytes()?)?;
        Ok(other)
    }
}

/// The ensemble mean `[B, N, D]` and disagreement `[B, N]` (variance across members, averaged
/// over outputs) of `members` `[M, B, N, D]`.
pub(crate) fn ensemble_stats(members: &Tensor) -> tensor_ops::Result<(Tensor, Tensor)> {
    let mean = members.mean(0, false)?;
    let dev = members.sub(&mean)?;
    let var = dev.mul(&dev)?.mean(0, false)?;
    Ok((mean, var.mean(-1, false)?))
}
