//! The CUDA path of `predict_batch`: the ensemble rollout as one fused, cooperative kernel
//! (`gpu_cuda::rollout`, `kernels/rssm_rollout.cu`) over the members' weights packed into one
//! device buffer, after the encoder's tensor-ops forward. Same result as [`Rssm::predict`]
//! (the f64 reference is `HostRssm::predict`); no host round trip inside the rollout. A model
//! the kernel cannot hold on the device (shared memory, co-resident blocks), or whose
//! cooperative grid the driver refuses, falls back to [`Rssm::predict`].

use crate::config::RssmConfig;
use crate::error::{Result, RssmError};
use crate::layers::Head;
use crate::model::{Prediction, Rssm};
use gpu_cuda::rollout::RolloutDims;
use tensor_ops::nn::Mode;
use tensor_ops::{no_grad, Device, Tensor};

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

/// [`Rssm::predict`] on CUDA through the fused kernel, with `packed` from [`pack`] of the
/// model's current weights; `context` `[B, T, F]` was checked by the caller (shape, width,
/// device, finite) and `steps > 0`.
pub(crate) fn predict_fused(
    model: &Rssm,
    packed: &Tensor,
    context: &Tensor,
    steps: usize,
) -> Result<Prediction> {
    let Device::Cuda(dev) = model.device() else {
        return Err(RssmError::InvalidArgument {
            what: "predict_batch",
            reason: format!(
                "the fused rollout runs on CUDA, the model is on {}",
                model.device()
            ),
        });
    };
    let (b, t) = (context.shape()[0], context.shape()[1]);
    let d = dims(model, b, t, steps);
    // A model too large for the kernel's shared memory or grid on this device takes the
    // tensor-ops path (same result, more launches).
    if !tensor_ops::cuda_backend(dev)?.rssm_rollout_fits(&d) {
        return model.predict(context, steps);
    }
    let embeds = no_grad(|| model.encode(context, Mode::Eval))?;
    let (m, o) = (d.members, d.out);
    let fused = embeds.with_cuda_buffer(|gpu, e| {
        packed.with_cuda_buffer(|_, w| {
            use gpu_core::Backend;
            let mut out = gpu.allocate(tensor_ops::DType::F32, m * b * steps * o)?;
            let mut mean = gpu.allocate(tensor_ops::DType::F32, b * steps * o)?;
            let mut dis = gpu.allocate(tensor_ops::DType::F32, b * steps)?;
            gpu.rssm_rollout(&d, w, e, &mut out, &mut mean, &mut dis)?;
            Ok((out, mean, dis))
        })
    });
    let (out, mean, dis) = match fused {
        Ok(v) => v,
        // The driver refused every cooperative grid of the kernel although its occupancy
        // queries admitted them (`gpu_cuda::rollout`): nothing ran and the outputs were this
        // call's own, so the tensor-ops path gives the result instead.
        Err(e) if gpu_cuda::is_cooperative_launch_too_large(&e) => {
            return model.predict(context, steps)
        }
        Err(e) => return Err(e.into()),
    };
    Ok(Prediction {
        members: Tensor::from_cuda_buffer(out, &[m, b, steps, o], dev)?,
        mean: Tensor::from_cuda_buffer(mean, &[b, steps, o], dev)?,
        disagreement: Tensor::from_cuda_buffer(dis, &[b, steps], dev)?,
    })
}
