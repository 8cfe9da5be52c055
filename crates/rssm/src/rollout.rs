//! The device path of `predict_batch`: the ensemble rollout as one op of the HAL's world
//! family (`gpu_core::nn::WorldOps::rssm_rollout`) over the members' weights packed into one
//! device tensor, after the encoder's tensor-ops forward. On CUDA the op is one fused,
//! cooperative kernel launch (`kernels/rssm_rollout.cu`); a model it cannot hold, and every
//! other backend, runs the family's default composition of primitives. Same result as
//! [`Rssm::predict`] (the f64 reference is `HostRssm::predict`); no host round trip inside
//! the rollout.

use crate::config::RssmConfig;
use crate::error::{Result, RssmError};
use crate::layers::Head;
use crate::model::{Prediction, Rssm};
use gpu_core::nn::RolloutDims;
use tensor_ops::nn::Mode;
use tensor_ops::{no_grad, Tensor};

/// Every member's weights, flattened in the kernel's order
/// ([`RolloutDims::member_layout`]), as one device tensor.
pub(crate) fn pack(model: &Rssm) -> Result<Tensor> {
    no_grad(|| {
        let mut parts: Vec<Tensor> = Vec::new();
        let head = |h: &Head, parts: &mut Vec<Tensor>| -> Result<()> {
            let bias = |t: Option<&Tensor>| {
                t.cloned().ok_or(RssmError::InvalidArgument {
                    what: "rollout weights",
                    reason: "a head layer has no bias".into(),
                })
            };
            for t in [
                h.fc.weight().clone(),
                bias(h.fc.bias())?,
                h.norm.weight().clone(),
                bias(h.norm.bias())?,
                h.out.weight().clone(),
                bias(h.out.bias())?,
            ] {
                parts.push(t.reshape(&[t.numel()])?);
            }
            Ok(())
        };
        for m in &model.members {
            let g = &m.gru;
            let missing = || RssmError::InvalidArgument {
                what: "rollout weights",
                reason: "the GRU cell has no bias".into(),
            };
            for t in [
                g.weight_ih().clone(),
                g.weight_hh().clone(),
                g.bias_ih().ok_or_else(missing)?.clone(),
                g.bias_hh().ok_or_else(missing)?.clone(),
            ] {
                parts.push(t.reshape(&[t.numel()])?);
            }
            head(&m.prior, &mut parts)?;
            head(&m.posterior, &mut parts)?;
            head(&m.decoder, &mut parts)?;
        }
        let refs: Vec<&Tensor> = parts.iter().collect();
        let packed = Tensor::cat(&refs, 0)?;
        let want = model.members.len() * dims(model, 1, 1, 1).member_len();
        if packed.numel() != want {
            return Err(RssmError::InvalidArgument {
                what: "rollout weights",
                reason: format!(
                    "packed {} floats, the kernel's layout needs {want}",
                    packed.numel()
                ),
            });
        }
        Ok(packed)
    })
}

fn dims(model: &Rssm, batch: usize, context: usize, steps: usize) -> RolloutDims {
    RolloutDims {
        members: model.members.len(),
        ..rollout_dims(model.config(), batch, context, steps)
    }
}

/// The fused kernel's sizes for a model of `cfg` rolling `batch` contexts of `context` steps
/// `steps` ahead.
pub fn rollout_dims(cfg: &RssmConfig, batch: usize, context: usize, steps: usize) -> RolloutDims {
    RolloutDims {
        members: cfg.ensemble,
        batch,
        context,
        steps,
        hidden: cfg.hidden_dim,
        latent: cfg.latent_dim,
        embed: cfg.embed_dim,
        head: cfg.head_dim,
        out: cfg.output_dim,
        eps: cfg.layer_norm_eps,
    }
}

/// [`Rssm::predict`] through the world family's rollout op on the model's device, with
/// `packed` from [`pack`] of the model's current weights; `context` `[B, T, F]` was checked by
/// the caller (shape, width, device, finite) and `steps > 0`.
pub(crate) fn predict_packed(
    model: &Rssm,
    packed: &Tensor,
    context: &Tensor,
    steps: usize,
) -> Result<Prediction> {
    let (b, t) = (context.shape()[0], context.shape()[1]);
    let d = dims(model, b, t, steps);
    let embeds = no_grad(|| model.encode(context, Mode::Eval))?;
    let r = tensor_ops::ops::world::rssm_rollout(&d, packed, &embeds)?;
    Ok(Prediction {
        members: r.members,
        mean: r.mean,
        disagreement: r.disagreement,
    })
}
