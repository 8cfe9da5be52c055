//! Mixed precision, as PyTorch's autocast: inside [`autocast`]`(Precision::Bf16, f)` every
//! [`Tensor::linear`] (so every `nn::Linear`) casts its input, weight and bias to bf16 and
//! multiplies on tensor cores with f32 accumulation, giving a bf16 result; the parameters stay
//! f32 (master weights; their gradients come back f32 through the casts). The other ops follow
//! the dtypes they are given, the rules PyTorch's autocast and type promotion give:
//! - elementwise ops, dropout, activations and reductions keep bf16 (computed in f32, rounded
//!   once);
//! - a binary op on one f32 and one bf16 operand computes in f32 (the residual stream stays f32);
//! - norms, softmax, cross-entropy and attention compute in f32, widening bf16 inputs.

use crate::Result;
use gpu_core::{DType, Device, GpuError};
use std::cell::Cell;
use std::fmt;
use std::str::FromStr;

/// A run's arithmetic: the user-facing switch (`--precision fp32|tf32|bf16`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// IEEE f32 everywhere (the default; the CPU's only mode).
    #[default]
    Fp32,
    /// f32 tensors; f32 matmuls may use TF32 tensor cores (10-bit mantissa products, f32 sums).
    Tf32,
    /// bf16 mixed precision: bf16 matmuls and the activations between them, f32 master weights,
    /// norms, softmax, loss and optimiser (see the module doc).
    Bf16,
}

impl Precision {
    /// The dtype [`autocast`] gives matmuls: bf16 under [`Precision::Bf16`], else none.
    pub fn autocast_dtype(self) -> Option<DType> {
        (self == Precision::Bf16).then_some(DType::BF16)
    }

    /// Applies the part of the precision that is a device setting: TF32 for f32 matmuls on
    /// CUDA, on for tf32 and off for fp32 (a setting of the device's backend, shared by every
    /// user of that device); bf16 leaves it as it is (its matmuls are bf16). On the CPU, bf16
    /// runs the reference of the bf16 kernels (f32 arithmetic, the same roundings; slow) and
    /// tf32 is an error: the CPU has no TF32 arithmetic. On wgpu as on the CPU: fp32 and bf16
    /// (bf16 matmuls widen to f32 and round their outputs once) need no setting; tf32 is an
    /// error (WGSL has no TF32 arithmetic).
    pub fn apply(self, device: Device) -> Result<()> {
        match device {
            Device::Cuda(i) => {
                if self != Precision::Bf16 {
                    crate::cuda_backend(i)?.set_tf32(self == Precision::Tf32);
                }
                Ok(())
            }
            Device::Cpu if self != Precision::Tf32 => Ok(()),
            Device::Cpu => Err(GpuError::invalid(
                "precision",
                "tf32 needs a CUDA device; the CPU computes f32 matmuls in f32",
            )),
            Device::Wgpu(_) if self != Precision::Tf32 => Ok(()),
            Device::Wgpu(_) => Err(GpuError::invalid(
                "precision",
                format!("tf32 needs a CUDA device; {device} computes f32 matmuls in f32"),
            )),
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Precision::Fp32 => "fp32",
            Precision::Tf32 => "tf32",
            Precision::Bf16 => "bf16",
        })
    }
}

impl FromStr for Precision {
    type Err = GpuError;
    fn from_str(s: &str) -> Result<Precision> {
        match s {
            "fp32" | "f32" => Ok(Precision::Fp32),
            "tf32" => Ok(Precision::Tf32),
            "bf16" => Ok(Precision::Bf16),
            other => Err(GpuError::invalid(
                "precision",
                format!("'{other}': expected fp32, tf32 or bf16"),
            )),
        }
    }
}

thread_local! {
    static AUTOCAST: Cell<Option<DType>> = const { Cell::new(None) };
}

/// The dtype matmuls are autocast to on this thread, if any.
pub fn autocast_dtype() -> Option<DType> {
    AUTOCAST.with(|a| a.get())
}

/// Runs `f` with `precision`'s autocast on this thread (nested calls: the innermost wins; the
/// previous setting comes back when `f` returns or panics).
pub fn autocast<R>(precision: Precision, f: impl FnOnce() -> R) -> R {
    gpu_core::cpu::fast::with_local(&AUTOCAST, precision.autocast_dtype(), f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precision_parses_prints_and_scopes() {
        for p in [Precision::Fp32, Precision::Tf32, Precision::Bf16] {
            assert_eq!(p.to_string().parse::<Precision>().unwrap(), p);
        }
        assert!("fp16".parse::<Precision>().is_err());
        assert_eq!(autocast_dtype(), None);
        autocast(Precision::Bf16, || {
            assert_eq!(autocast_dtype(), Some(DType::BF16));
            autocast(Precision::Fp32, || assert_eq!(autocast_dtype(), None));
            assert_eq!(autocast_dtype(), Some(DType::BF16));
        });
        assert_eq!(autocast_dtype(), None);
        assert!(Precision::Tf32.apply(Device::Cpu).is_err());
        assert!(Precision::Bf16.apply(Device::Cpu).is_ok());
        assert!(Precision::Fp32.apply(Device::Cpu).is_ok());
        // On wgpu as on the CPU (no adapter needed: nothing is set on the device).
        assert!(Precision::Tf32.apply(Device::Wgpu(0)).is_err());
        assert!(Precision::Bf16.apply(Device::Wgpu(0)).is_ok());
        assert!(Precision::Fp32.apply(Device::Wgpu(0)).is_ok());
    }
}
