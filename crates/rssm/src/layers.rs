//! The world model's building blocks on the module layer: the shared [`Encoder`], a [`Head`]
//! (Linear, LayerNorm, ReLU, Linear), a member's [`Member`] (GRU cell, prior, posterior,
//! decoder), the diagonal-Gaussian [`Stats`] with their KL, and the input checks.

use crate::config::RssmConfig;
use crate::error::{Result, RssmError};
use tensor_ops::nn::{Dropout, GruCell, LayerNorm, Linear, Mode, Module, ModuleT, ParamBuilder};
use tensor_ops::{no_grad, DType, Device, Tensor};

/// Linear F → E, LayerNorm, ReLU, dropout (the identity outside training).
#[derive(Debug, Clone)]
pub(crate) struct Encoder {
    pub(crate) fc: Linear,
    pub(crate) norm: LayerNorm,
    dropout: Dropout,
}

impl Encoder {
    pub(crate) fn new(vb: ParamBuilder<'_>, cfg: &RssmConfig) -> Result<Encoder> {
        Ok(Encoder {
            fc: vb.pp("fc").linear(cfg.feature_dim, cfg.embed_dim, true)?,
            norm: vb
                .pp("norm")
                .layer_norm(cfg.embed_dim, cfg.layer_norm_eps, true)?,
            dropout: Dropout::new(cfg.dropout)?,
        })
    }
}

impl ModuleT for Encoder {
    fn forward_t(&self, x: &Tensor, mode: Mode) -> tensor_ops::Result<Tensor> {
        let y = self.norm.forward(&self.fc.forward(x)?)?.relu()?;
        self.dropout.forward_t(&y, mode)
    }
}

/// `out(relu(norm(fc(x))))`: the prior, posterior and decoder heads.
#[derive(Debug, Clone)]
pub(crate) struct Head {
    pub(crate) fc: Linear,
    pub(crate) norm: LayerNorm,
    pub(crate) out: Linear,
}

impl Head {
    fn new(vb: ParamBuilder<'_>, input: usize, output: usize, cfg: &RssmConfig) -> Result<Head> {
        Ok(Head {
            fc: vb.pp("fc").linear(input, cfg.head_dim, true)?,
            norm: vb
                .pp("norm")
                .layer_norm(cfg.head_dim, cfg.layer_norm_eps, true)?,
            out: vb.pp("out").linear(cfg.head_dim, output, true)?,
        })
    }
}

impl Module for Head {
    fn forward(&self, x: &Tensor) -> tensor_ops::Result<Tensor> {
        self.out
            .forward(&self.norm.forward(&self.fc.forward(x)?)?.relu()?)
    }
}

/// One ensemble member: its own GRU cell (input: the previous latent), prior `p(z | h)`,
/// posterior `q(z | h, e)` and decoder `y(h, z)`.
#[derive(Debug, Clone)]
pub(crate) struct Member {
    pub(crate) gru: GruCell,
    pub(crate) prior: Head,
    pub(crate) posterior: Head,
    pub(crate) decoder: Head,
}

impl Member {
    pub(crate) fn new(vb: ParamBuilder<'_>, cfg: &RssmConfig) -> Result<Member> {
        let (h, s) = (cfg.hidden_dim, cfg.latent_dim);
        Ok(Member {
            gru: vb.pp("gru").gru_cell(s, h)?,
            prior: Head::new(vb.pp("prior"), h, 2 * s, cfg)?,
            posterior: Head::new(vb.pp("posterior"), h + cfg.embed_dim, 2 * s, cfg)?,
            decoder: Head::new(vb.pp("decoder"), h + s, cfg.output_dim, cfg)?,
        })
    }

    /// The decoder's prediction from `h` `[rows, H]` and `z` `[rows, S]`.
    pub(crate) fn decode(&self, h: &Tensor, z: &Tensor) -> tensor_ops::Result<Tensor> {
        self.decoder.forward(&Tensor::cat(&[h, z], 1)?)
    }
}

/// A diagonal Gaussian: `mean` and `std`, both `[rows, S]`.
#[derive(Debug, Clone)]
pub(crate) struct Stats {
    pub(crate) mean: Tensor,
    pub(crate) std: Tensor,
}

impl Stats {
    /// Splits a head's raw output `[rows, 2S]`: the mean, then `σ = min + (max − min)·sigmoid`
    /// (bounded both ways: no overflow, no collapse to zero).
    pub(crate) fn from_raw(raw: &Tensor, cfg: &RssmConfig) -> tensor_ops::Result<Stats> {
        let s = cfg.latent_dim;
        Ok(Stats {
            mean: raw.narrow(-1, 0, s)?,
            std: raw
                .narrow(-1, s, s)?
                .sigmoid()?
                .affine(cfg.max_std - cfg.min_std, cfg.min_std)?,
        })
    }

    /// The same values cut from the graph (a stop-gradient).
    pub(crate) fn detach(&self) -> Stats {
        Stats {
            mean: self.mean.detach(),
            std: self.std.detach(),
        }
    }

    /// Stacks per-step stats along rows.
    pub(crate) fn cat(parts: &[Stats]) -> tensor_ops::Result<Stats> {
        let means: Vec<&Tensor> = parts.iter().map(|p| &p.mean).collect();
        let stds: Vec<&Tensor> = parts.iter().map(|p| &p.std).collect();
        Ok(Stats {
            mean: Tensor::cat(&means, 0)?,
            std: Tensor::cat(&stds, 0)?,
        })
    }

    /// `KL(self ‖ other)` per row, summed over the latent dims:
    /// `Σ ln σₚ − ln σ_q + (σ_q² + (μ_q − μₚ)²) / (2σₚ²) − ½`.
    pub(crate) fn kl(&self, other: &Stats) -> tensor_ops::Result<Tensor> {
        let (q, p) = (self, other);
        let d = q.mean.sub(&p.mean)?;
        let num = q.std.mul(&q.std)?.add(&d.mul(&d)?)?;
        let den = p.std.mul(&p.std)?.mul_scalar(2.0)?;
        p.std
            .log()?
            .sub(&q.std.log()?)?
            .add(&num.div(&den)?)?
            .add_scalar(-0.5)?
            .sum(-1, false)
    }
}

/// `max(free, kl)` elementwise for a `[rows]` KL (free bits; the gradient of a clipped row is
/// zero).
pub(crate) fn free_bits(kl: &Tensor, free: f32) -> tensor_ops::Result<Tensor> {
    let rows = kl.numel();
    let floor = Tensor::full(free, &[rows, 1], kl.device())?;
    Tensor::cat(&[&kl.reshape(&[rows, 1])?, &floor], 1)?.max(1, false)
}

/// Errors unless `t` is f32 `[B, T, width]` on `device` with `B, T > 0` and finite values;
/// returns `(B, T)`.
pub(crate) fn check_sequences(
    what: &'static str,
    t: &Tensor,
    width: usize,
    device: Device,
) -> Result<(usize, usize)> {
    let (b, steps, w) = match t.shape() {
        [b, s, w] => (*b, *s, *w),
        s => {
            return Err(RssmError::Shape {
                what,
                expected: format!("[batch, steps, {width}]"),
                got: s.to_vec(),
            })
        }
    };
    if w != width {
        return Err(RssmError::FeatureWidth {
            what,
            expected: width,
            got: w,
        });
    }
    if b == 0 || steps == 0 {
        return Err(RssmError::Empty { what });
    }
    check_device(what, t, device)?;
    check_finite(what, t)?;
    Ok((b, steps))
}

/// Errors unless `t` lives on `device`.
pub(crate) fn check_device(what: &'static str, t: &Tensor, device: Device) -> Result<()> {
    if t.device() != device {
        return Err(RssmError::DeviceMismatch {
            what,
            expected: device,
            got: t.device(),
        });
    }
    Ok(())
}

/// The largest magnitude in `t`, or `None` when `t` holds NaN or Inf: one scan on its device
/// (`WorldOps::max_abs`: CUDA's one-pass kernel, the CPU's vectorised loop, the default's two
/// max reductions elsewhere) and one value read. A bf16 tensor is widened first.
pub(crate) fn max_abs_if_finite(t: &Tensor) -> tensor_ops::Result<Option<f32>> {
    let m = if t.dtype() == DType::F32 {
        t.max_abs()?
    } else {
        no_grad(|| t.to_dtype(DType::F32))?.max_abs()?
    };
    Ok(m.is_finite().then_some(m))
}

/// Errors when `t` holds NaN or Inf (or is not f32). On the device: `Σ 0·x` is NaN exactly when
/// some element is non-finite (and cannot overflow), so only one scalar comes back.
pub(crate) fn check_finite(what: &'static str, t: &Tensor) -> Result<()> {
    let probe = no_grad(|| t.mul_scalar(0.0)?.sum_all()?.item())?;
    if probe.is_nan() {
        return Err(RssmError::NonFinite { what });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: &[f32], shape: &[usize]) -> Tensor {
        Tensor::from_vec(v.to_vec(), shape, Device::Cpu).unwrap()
    }

    #[test]
    fn kl_matches_the_closed_form_in_f64_and_vanishes_on_equal_gaussians() {
        let (mq, sq) = ([0.3f32, -1.2, 0.0, 2.0], [0.5f32, 1.5, 0.2, 1.0]);
        let (mp, sp) = ([0.1f32, 0.4, -0.3, 2.0], [1.0f32, 0.7, 0.9, 1.0]);
        let q = Stats {
            mean: t(&mq, &[2, 2]),
            std: t(&sq, &[2, 2]),
        };
        let p = Stats {
            mean: t(&mp, &[2, 2]),
            std: t(&sp, &[2, 2]),
        };
        let got = q.kl(&p).unwrap().to_vec().unwrap();
        for (row, g) in got.iter().enumerate() {
            let want: f64 = (0..2)
                .map(|j| {
                    let i = row * 2 + j;
                    let (a, b, c, d) = (mq[i] as f64, sq[i] as f64, mp[i] as f64, sp[i] as f64);
                    (d / b).ln() + (b * b + (a - c).powi(2)) / (2.0 * d * d) - 0.5
                })
                .sum();
            assert!((*g as f64 - want).abs() < 1e-6 * (1.0 + want), "row {row}");
        }
        let same = q.kl(&q).unwrap().to_vec().unwrap();
        assert!(same.iter().all(|v| v.abs() < 1e-6), "{same:?}");
    }

    #[test]
    fn free_bits_floor_the_value_and_stop_the_gradient_below_it() {
        let kl = t(&[0.2, 3.0], &[2]).requires_grad_().unwrap();
        let y = free_bits(&kl, 1.0).unwrap();
        assert_eq!(y.to_vec().unwrap(), [1.0, 3.0]);
        let g = y.sum_all().unwrap().backward().unwrap();
        assert_eq!(g.get(&kl).unwrap().to_vec().unwrap(), [0.0, 1.0]);
    }

    #[test]
    fn the_finiteness_probe_finds_nan_and_both_infinities_but_not_large_values() {
        assert!(check_finite("x", &t(&[f32::MAX, -f32::MAX, 0.0], &[3])).is_ok());
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            assert!(matches!(
                check_finite("x", &t(&[1.0, bad], &[2])),
                Err(RssmError::NonFinite { what: "x" })
            ));
        }
    }
}
