//! The CPU backend's [`WorldOps`]: the largest magnitude as one vectorised scan (the world
//! model's finiteness check runs on every input it factors or writes); the correction and the
//! rollout take the family's defaults on the CPU's own primitives (the fast host engine for
//! the rollout is `rssm::fast`, chosen by the accelerator's engine, not by the device).

use super::fast::{multiversion, Isa};
use super::{CpuBackend, CpuStorage};
use crate::error::Result;
use crate::nn::WorldOps;

/// The bits of `+inf`: [`max_abs_bits`] returns this when the largest magnitude is an
/// infinity, and more when some element is NaN.
pub const INF_BITS: u32 = 0x7f80_0000;

// A plain unsigned-max reduction over the magnitude bits, which the compiler vectorizes
// (`f32::to_bits` of a non-negative value orders like the value; NaN sorts above infinity).
#[inline(always)]
fn max_abs_bits_body(x: &[f32], out: &mut u32) {
    *out = x.iter().fold(0, |a, v| a.max(v.to_bits() & 0x7fff_ffff));
}

multiversion! {
    fn max_abs_bits_isa(x: &[f32], out: &mut u32) => max_abs_bits_body
}

/// The largest `|x|` as the bits of that `f32` (0 for an empty slice; above [`INF_BITS`] when
/// some element is NaN), the halves of a long slice on two threads. The same value on every
/// instruction set (a maximum has no rounding).
pub fn max_abs_bits(x: &[f32]) -> u32 {
    let one = |x: &[f32]| {
        let mut out = 0;
        max_abs_bits_isa(Isa::best(), x, &mut out);
        out
    };
    if x.len() < 1 << 16 {
        return one(x);
    }
    let (a, b) = x.split_at(x.len() / 2);
    let (a, b) = rayon::join(|| one(a), || one(b));
    a.max(b)
}

impl WorldOps for CpuBackend {
    fn max_abs(&self, x: &CpuStorage) -> Result<f32> {
        Ok(f32::from_bits(max_abs_bits(x.as_f32()?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_abs_bits_orders_magnitudes_and_flags_nan_and_inf() {
        assert_eq!(max_abs_bits(&[]), 0);
        assert_eq!(f32::from_bits(max_abs_bits(&[1.0, -3.5, 2.0])), 3.5);
        assert_eq!(max_abs_bits(&[1.0, f32::NEG_INFINITY]), INF_BITS);
        assert!(max_abs_bits(&[f32::INFINITY, f32::NAN, 0.0]) > INF_BITS);
        // The two-thread path agrees with a scalar scan, wherever the maximum sits.
        let mut long: Vec<f32> = (0..200_003).map(|i| (i as f32).sin()).collect();
        for at in [0, 100_001, 200_002] {
            long[at] = -7.25;
            let scalar = long
                .iter()
                .fold(0u32, |a, v| a.max(v.to_bits() & 0x7fff_ffff));
            assert_eq!(max_abs_bits(&long), scalar);
            long[at] = 0.0;
        }
    }
}
