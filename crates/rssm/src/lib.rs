//! `rssm`: the world model of hybrid-trainer: an ensemble RSSM over training-state feature
//! vectors, trained by backpropagation through time, that predicts the next steps with an
//! uncertainty; and [`GpuAccelerator`], the trainer's single door to the device work.
//!
//! # The model
//!
//! [`Rssm`] is built on `tensor_ops::nn` and runs on any device. Per step `t`, with features
//! `x_t` (`F` = 64), and for each ensemble member (5 by default, each with its own weights;
//! the encoder is shared):
//!
//! ```text
//! e_t = dropout(relu(LayerNorm(Linear_{F→E}(x_t))))          encoder, E = 128
//! h_t = GRUCell(z_{t−1}, h_{t−1})                             deterministic state, H = 256
//! p(z_t | h_t)      = N(μ, σ²) from head(h_t)                 prior
//! q(z_t | h_t, e_t) = N(μ, σ²) from head([h_t, e_t])          posterior
//! y_t = head([h_t, z_t])                                      decoder, width D (configurable)
//! ```
//!
//! A head is Linear, LayerNorm, ReLU, Linear; `σ = min + (max − min)·sigmoid(raw)`. The state
//! starts at zero. [`Rssm::observe`] filters a context along the posterior means,
//! [`Rssm::imagine`] rolls forward along the prior means, [`Rssm::predict`] does both and
//! returns each member's predictions, their mean and their disagreement.
//!
//! **Latent: a diagonal Gaussian (S = 32), not DreamerV3's 32×32 categorical.** The features
//! are continuous, low-dimensional and smooth (loss curves, norms), where a unimodal Gaussian
//! fits and the categorical's advantage (multimodal pixel worlds) buys nothing. The Gaussian
//! gives unbiased reparameterised gradients (`z = μ + σ·ε`, `ε` drawn on the host from the
//! step's seed, the same on every device) where the categorical needs the biased
//! straight-through estimator and argmax/one-hot sampling ops tensor-ops lacks (a host round
//! trip per step on the GPU). And the prediction is a continuous function of weights and
//! inputs, so GPU and CPU agree to rounding, where an argmax near a tie flips. DreamerV3's KL
//! balancing and free bits are kept as they are.
//!
//! **Training** ([`Rssm::train_step`]): per step, `½‖y − decoder(h, z_post)‖²`
//! (reconstruction) + `½‖y − decoder(h, μ_prior)‖²` (one-step prediction, what rollouts use) +
//! `0.5·max(1, KL(sg(q) ‖ p))` + `0.1·max(1, KL(q ‖ sg(p)))` (balancing and free bits, in
//! nats), averaged over steps, through time by autograd, AdamW with clipping. Each member
//! weights the batch's sequences by its own bootstrap resample, so members differ by
//! initialisation and by data; their disagreement (variance across members, averaged over
//! outputs) is the exposed uncertainty. The decoder's width is configurable: give
//! [`SequenceBatch::with_targets`] to predict more than the features (the coefficients of
//! parameter updates in a low-rank basis).
//!
//! # The accelerator
//!
//! [`GpuAccelerator`] lives here because it needs the RSSM (`encode_state`, `predict_batch`)
//! and tensor-ops, and the trainer, its only user, sits above: `tensor-ops ← rssm ←
//! hybrid-trainer` stays strictly downward. Each entry point dispatches by engine:
//!
//! | entry point | CPU: [`Engine::Fast`] (default) / [`Engine::Reference`] (f64) | any device: [`Engine::Fused`] (the default off the CPU) |
//! |---|---|---|
//! | `encode_state` | [`fast::FastRssm`] / [`reference::HostRssm::encode`] | the encoder's tensor-ops forward |
//! | `predict_batch` | [`fast::FastRssm`] / [`reference::HostRssm::predict`] | the HAL's `WorldOps::rssm_rollout`: on CUDA one fused, cooperative kernel launch (`kernels/rssm_rollout.cu`), elsewhere the family's default composition of primitives; or [`Rssm::predict`] ([`Engine::Tensor`]) |
//! | `compress_residuals` | [`fast`]'s f32 randomized SVD / [`svd::randomized_svd`] (exact: [`svd::exact_svd`]) | the HAL's `WorldOps::randomized_svd`: on CUDA the same algorithm on cuBLAS with Cholesky QR2 and a Jacobi small SVD on the device (Householder QR and the host SVD as fallbacks; replayed as a CUDA graph), or `cusolverDnXgesvdr` ([`SvdMethod`]); elsewhere the default composition (products on the device, QRs and the small SVD on the host) |
//! | `apply_corrections` | [`correct::apply_tiled`] (f32 GEMM) / its exact f64 path, in place | the HAL's `WorldOps::low_rank_add`, checked then written in place: on CUDA one fused kernel (rank <= 64), elsewhere the default composition |
//!
//! The world family (`gpu_core::nn::WorldOps`) is the device's: no code here touches a device
//! buffer or matches on the device to run it. [`SvdMethod::Gram`] is composed of tensor ops
//! here, on any device. Bad input (wrong widths, ranks, NaN or Inf,
//! mismatched devices, no model, an untrained ensemble) is a typed error ([`RssmError`],
//! [`AcceleratorError`]).

mod accelerator;
mod config;
pub mod correct;
mod error;
pub mod fast;
mod layers;
mod lowrank;
mod model;
pub mod reference;
mod rollout;
pub mod svd;
pub mod svd_gram;
mod train;

pub use accelerator::{Engine, GpuAccelerator};
pub use config::RssmConfig;
pub use error::{AcceleratorError, Result, RssmError};
pub use gpu_core::nn::SvdMethod;
pub use lowrank::{HostLowRank, LowRank};
pub use model::{MemberState, Prediction, Rssm};
pub use rollout::rollout_dims;
pub use svd::SvdOptions;
pub use train::{LossBreakdown, SequenceBatch};
