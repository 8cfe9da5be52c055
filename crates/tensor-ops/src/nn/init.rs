//! How a parameter's initial values are drawn.

use crate::{Device, GpuError, Result, Tensor};
use rand::{Rng, SeedableRng};

/// A parameter's initial values. Random inits draw one `u64` sub-seed from the store's
/// generator when the parameter is registered and sample from it on the host, so a seed gives
/// the same values on every device; constant inits draw nothing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// Every element `value`.
    Const(f32),
    /// Normal(0, std²), sampled as [`Tensor::randn`].
    Normal { std: f32 },
    /// Uniform on `[lo, hi)`.
    Uniform { lo: f32, hi: f32 },
}

impl Init {
    /// Zeros.
    pub const ZEROS: Init = Init::Const(0.0);
    /// Ones.
    pub const ONES: Init = Init::Const(1.0);

    /// PyTorch's default for `nn.Linear` (weight and bias) and `nn.GRUCell`: U(−k, k) with
    /// k = 1/√`fan`. `fan` must be positive.
    pub fn pytorch_uniform(fan: usize) -> Result<Init> {
        if fan == 0 {
            return Err(GpuError::invalid(
                "Init::pytorch_uniform",
                "the fan-in must be positive",
            ));
        }
        let k = 1.0 / (fan as f32).sqrt();
        Ok(Init::Uniform { lo: -k, hi: k })
    }

    /// Whether this init draws a sub-seed.
    pub(crate) fn is_random(&self) -> bool {
        !matches!(self, Init::Const(_))
    }

    /// Checks the init's own numbers: a finite constant, a finite `std >= 0`, finite `lo < hi`.
    pub(crate) fn validate(&self) -> Result<()> {
        let ok = match *self {
            Init::Const(v) => v.is_finite(),
            Init::Normal { std } => std.is_finite() && std >= 0.0,
            Init::Uniform { lo, hi } => lo.is_finite() && hi.is_finite() && lo < hi,
        };
        if ok {
            Ok(())
        } else {
            Err(GpuError::invalid("Init", format!("invalid init {self:?}")))
        }
    }

    /// The values on `device`; `seed` is the sub-seed of a random init (ignored otherwise).
    pub(crate) fn tensor(&self, shape: &[usize], seed: u64, device: Device) -> Result<Tensor> {
        self.validate()?;
        match *self {
            Init::Const(v) => Tensor::full(v, shape, device),
            Init::Normal { std } => Tensor::randn(shape, std, seed, device),
            Init::Uniform { lo, hi } => {
                let n = gpu_core::Shape::from(shape).checked_numel()?;
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
                let data: Vec<f32> = (0..n).map(|_| rng.random_range(lo..hi)).collect();
                Tensor::from_vec(data, shape, device)
            }
        }
    }
}
