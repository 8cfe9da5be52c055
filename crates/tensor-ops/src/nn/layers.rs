//! Layers with PyTorch's parameter layouts and default inits: [`Linear`], [`Embedding`],
//! [`LayerNorm`], [`RmsNorm`] and [`Dropout`].

use super::builder::ParamBuilder;
use super::init::Init;
use super::{Mode, Module, ModuleT};
use crate::tensor::same_device;
use crate::{DType, GpuError, Result, Tensor};
use gpu_core::nn::rows::check_eps;

/// Errors unless `t` is an f32 tensor of exactly `shape`.
pub(super) fn check_param(op: &'static str, what: &str, t: &Tensor, shape: &[usize]) -> Result<()> {
    if t.dtype() != DType::F32 || t.shape() != shape {
        return Err(GpuError::shape(
            op,
            format!("{what}: f32 {shape:?}"),
            format!("{what}: {} {:?}", t.dtype(), t.shape()),
        ));
    }
    Ok(())
}

/// Errors unless every dim is positive.
fn check_dims(op: &'static str, dims: &[(&str, usize)]) -> Result<()> {
    match dims.iter().find(|(_, d)| *d == 0) {
        Some((what, _)) => Err(GpuError::invalid(op, format!("{what} must be positive"))),
        None => Ok(()),
    }
}

/// Errors unless `x`'s last dim is `want`.
fn check_last_dim(op: &'static str, x: &Tensor, want: usize) -> Result<()> {
    if x.shape().last() != Some(&want) {
        return Err(GpuError::shape(
            op,
            format!("an input [.., {want}]"),
            format!("{:?}", x.shape()),
        ));
    }
    Ok(())
}

/// `y = x·Wᵀ + b` with PyTorch's layout: `weight` `[out, in]`, `bias` `[out]`.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
}

impl Linear {
    /// Registers `weight` (and `bias`) with PyTorch's init: U(−1/√in, 1/√in) for both.
    pub fn new(vb: ParamBuilder<'_>, in_dim: usize, out_dim: usize, bias: bool) -> Result<Linear> {
        check_dims("Linear", &[("in_dim", in_dim), ("out_dim", out_dim)])?;
        let init = Init::pytorch_uniform(in_dim)?;
        Linear::with_init(vb, in_dim, out_dim, init, bias.then_some(init))
    }

    /// Registers `weight` drawn from `weight`, and `bias` from `bias` when given.
    pub fn with_init(
        vb: ParamBuilder<'_>,
        in_dim: usize,
        out_dim: usize,
        weight: Init,
        bias: Option<Init>,
    ) -> Result<Linear> {
        check_dims("Linear", &[("in_dim", in_dim), ("out_dim", out_dim)])?;
        let w = vb.get("weight", &[out_dim, in_dim], weight)?;
        let b = bias.map(|i| vb.get("bias", &[out_dim], i)).transpose()?;
        Ok(Linear { weight: w, bias: b })
    }

    /// A layer over existing tensors: `weight` f32 `[out, in]`, `bias` f32 `[out]`, one device.
    pub fn from_tensors(weight: Tensor, bias: Option<Tensor>) -> Result<Linear> {
        let (out_dim, in_dim) = match weight.shape() {
            [o, i] if *o > 0 && *i > 0 => (*o, *i),
            _ => {
                return Err(GpuError::shape(
                    "Linear",
                    "weight [out, in]",
                    format!("{:?}", weight.shape()),
                ))
            }
        };
        check_param("Linear", "weight", &weight, &[out_dim, in_dim])?;
        if let Some(b) = &bias {
            check_param("Linear", "bias", b, &[out_dim])?;
            same_device("Linear", &[&weight, b])?;
        }
        Ok(Linear { weight, bias })
    }

    /// `[out, in]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// `[out]`, when the layer has one.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// Input width.
    pub fn in_dim(&self) -> usize {
        self.weight.shape()[1]
    }

    /// Output width.
    pub fn out_dim(&self) -> usize {
        self.weight.shape()[0]
    }
}

impl Module for Linear {
    /// `x` is `[.., in]` (any rank >= 1); the result `[.., out]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        check_last_dim("Linear", x, self.in_dim())?;
        if x.rank() == 1 {
            let y = x
                .reshape(&[1, self.in_dim()])?
                .linear(&self.weight, self.bias.as_ref())?;
            return y.reshape(&[self.out_dim()]);
        }
        x.linear(&self.weight, self.bias.as_ref())
    }
}

/// A lookup table `weight` `[num, dim]`: u32 ids `[..]` give rows `[.., dim]`.
#[derive(Debug, Clone)]
pub struct Embedding {
    weight: Tensor,
}

impl Embedding {
    /// Registers `weight` with PyTorch's init, N(0, 1).
    pub fn new(vb: ParamBuilder<'_>, num: usize, dim: usize) -> Result<Embedding> {
        Embedding::with_init(vb, num, dim, Init::Normal { std: 1.0 })
    }

    /// Registers `weight` drawn from `init`.
    pub fn with_init(
        vb: ParamBuilder<'_>,
        num: usize,
        dim: usize,
        init: Init,
    ) -> Result<Embedding> {
        check_dims("Embedding", &[("num", num), ("dim", dim)])?;
        Ok(Embedding {
            weight: vb.get("weight", &[num, dim], init)?,
        })
    }

    /// A table over an existing f32 `[num, dim]` tensor.
    pub fn from_tensor(weight: Tensor) -> Result<Embedding> {
        match weight.shape() {
            [n, d] if *n > 0 && *d > 0 => {
                check_param("Embedding", "weight", &weight, &[*n, *d])?;
                Ok(Embedding { weight })
            }
            s => Err(GpuError::shape(
                "Embedding",
                "weight [num, dim]",
                format!("{s:?}"),
            )),
        }
    }

    /// `[num, dim]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// Row width.
    pub fn dim(&self) -> usize {
        self.weight.shape()[1]
    }
}

impl Module for Embedding {
    /// `ids`: u32 ids below `num`.
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.weight.embedding(ids)
    }
}

/// LayerNorm over the last dim: `weight` (ones) and optional `bias` (zeros), as PyTorch's.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    weight: Tensor,
    bias: Option<Tensor>,
    /// The zero shift used when there is no bias (a constant, not a parameter).
    zeros: Tensor,
    eps: f32,
}

impl LayerNorm {
    /// Registers `weight` (ones) and, when `bias`, `bias` (zeros).
    pub fn new(vb: ParamBuilder<'_>, dim: usize, eps: f32, bias: bool) -> Result<LayerNorm> {
        check_dims("LayerNorm", &[("dim", dim)])?;
        check_eps("LayerNorm", eps)?;
        let weight = vb.get("weight", &[dim], Init::ONES)?;
        let bias = bias
            .then(|| vb.get("bias", &[dim], Init::ZEROS))
            .transpose()?;
        LayerNorm::from_tensors(weight, bias, eps)
    }

    /// A norm over existing f32 `[dim]` tensors.
    pub fn from_tensors(weight: Tensor, bias: Option<Tensor>, eps: f32) -> Result<LayerNorm> {
        check_eps("LayerNorm", eps)?;
        let dim = match weight.shape() {
            [d] if *d > 0 => *d,
            s => {
                return Err(GpuError::shape(
                    "LayerNorm",
                    "weight [dim]",
                    format!("{s:?}"),
                ))
            }
        };
        check_param("LayerNorm", "weight", &weight, &[dim])?;
        if let Some(b) = &bias {
            check_param("LayerNorm", "bias", b, &[dim])?;
            same_device("LayerNorm", &[&weight, b])?;
        }
        let zeros = Tensor::zeros(&[dim], weight.device())?;
        Ok(LayerNorm {
            weight,
            bias,
            zeros,
            eps,
        })
    }

    /// `[dim]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// `[dim]`, when the norm has one.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        check_last_dim("LayerNorm", x, self.weight.numel())?;
        x.layer_norm(
            &self.weight,
            self.bias.as_ref().unwrap_or(&self.zeros),
            self.eps,
        )
    }
}

/// RMSNorm over the last dim with a `weight` (ones).
#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    /// Registers `weight` (ones).
    pub fn new(vb: ParamBuilder<'_>, dim: usize, eps: f32) -> Result<RmsNorm> {
        check_dims("RmsNorm", &[("dim", dim)])?;
        check_eps("RmsNorm", eps)?;
        RmsNorm::from_tensor(vb.get("weight", &[dim], Init::ONES)?, eps)
    }

    /// A norm over an existing f32 `[dim]` weight.
    pub fn from_tensor(weight: Tensor, eps: f32) -> Result<RmsNorm> {
        check_eps("RmsNorm", eps)?;
        match weight.shape() {
            [d] if *d > 0 => check_param("RmsNorm", "weight", &weight, &[*d])?,
            s => return Err(GpuError::shape("RmsNorm", "weight [dim]", format!("{s:?}"))),
        }
        Ok(RmsNorm { weight, eps })
    }

    /// `[dim]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }
}

impl Module for RmsNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        check_last_dim("RmsNorm", x, self.weight.numel())?;
        x.rms_norm(&self.weight, self.eps)
    }
}

/// Inverted dropout with probability `p`: in [`Mode::Train`] each element is zeroed with
/// probability `p` (the rest scaled by 1/(1 − p)) by a mask that depends only on the mode's
/// seed and the element's index, identical on every device; in [`Mode::Eval`] the identity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropout {
    p: f32,
}

impl Dropout {
    /// `p` in `[0, 1)`.
    pub fn new(p: f32) -> Result<Dropout> {
        if !(0.0..1.0).contains(&p) {
            return Err(GpuError::invalid(
                "Dropout",
                format!("p must be in [0, 1), got {p}"),
            ));
        }
        Ok(Dropout { p })
    }

    /// The drop probability.
    pub fn p(&self) -> f32 {
        self.p
    }
}

impl ModuleT for Dropout {
    fn forward_t(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        match mode {
            Mode::Eval => Ok(x.clone()),
            Mode::Train { seed } => x.dropout(self.p, seed, true),
        }
    }
}

impl<'a> ParamBuilder<'a> {
    /// [`Linear::new`] under this prefix (`prefix.weight`, `prefix.bias`).
    pub fn linear(&self, in_dim: usize, out_dim: usize, bias: bool) -> Result<Linear> {
        Linear::new(self.clone(), in_dim, out_dim, bias)
    }

    /// [`Embedding::new`] under this prefix.
    pub fn embedding(&self, num: usize, dim: usize) -> Result<Embedding> {
        Embedding::new(self.clone(), num, dim)
    }

    /// [`LayerNorm::new`] under this prefix.
    pub fn layer_norm(&self, dim: usize, eps: f32, bias: bool) -> Result<LayerNorm> {
        LayerNorm::new(self.clone(), dim, eps, bias)
    }

    /// [`RmsNorm::new`] under this prefix.
    pub fn rms_norm(&self, dim: usize, eps: f32) -> Result<RmsNorm> {
        RmsNorm::new(self.clone(), dim, eps)
    }
}
