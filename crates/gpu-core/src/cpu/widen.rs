//! bf16 on the CPU, the reference of the bf16 kernels: an op on bf16 buffers widens its
//! operands to f32 (exact), runs the f32 reference, and rounds the output once to bf16 (round
//! to nearest even; NaN stays NaN, overflow goes to ±inf), as the kernels do in registers.

use super::par::for_chunks;
use super::{try_zeroed_vec, CpuStorage};
use crate::backend::BufferInfo;
use crate::dtype::DType;
use crate::error::{GpuError, Result};
use half::bf16;

/// `x` as f32 storage: bf16 widened (exact), f32 copied.
pub(crate) fn widen(x: &CpuStorage) -> Result<CpuStorage> {
    match x {
        CpuStorage::BF16(v) => {
            let mut out = try_zeroed_vec::<f32>(v.len())?;
            for_chunks(&mut out, |off, o| {
                for (o, &e) in o.iter_mut().zip(&v[off..]) {
                    *o = e.to_f32();
                }
            });
            Ok(CpuStorage::F32(out))
        }
        other => other.try_clone(),
    }
}

/// Rounds `src` into the bf16 or f32 buffer `out` (of the same length).
pub(crate) fn narrow_into(src: &[f32], out: &mut CpuStorage) -> Result<()> {
    match out {
        CpuStorage::BF16(o) => {
            for_chunks(o, |off, o| {
                for (o, &v) in o.iter_mut().zip(&src[off..]) {
                    *o = bf16::from_f32(v);
                }
            });
            Ok(())
        }
        CpuStorage::F32(o) => {
            o.copy_from_slice(src);
            Ok(())
        }
        other => Err(GpuError::UnsupportedDType {
            op: "cast",
            dtype: other.dtype(),
            backend: "cpu (f32 and bf16 only)",
        }),
    }
}

/// Runs the f32 op `f` for an op whose output `out` is bf16: widens `inputs` (and `out` when
/// `keep_out`, for ops that leave part of it as it was), calls `f` on f32 buffers, and rounds
/// the result into `out` once.
pub(crate) fn via_f32(
    inputs: &[&CpuStorage],
    out: &mut CpuStorage,
    keep_out: bool,
    f: impl FnOnce(&[&CpuStorage], &mut CpuStorage) -> Result<()>,
) -> Result<()> {
    let wide: Vec<CpuStorage> = inputs.iter().map(|x| widen(x)).collect::<Result<_>>()?;
    let refs: Vec<&CpuStorage> = wide.iter().collect();
    let mut o = if keep_out {
        widen(out)?
    } else {
        CpuStorage::F32(try_zeroed_vec(out.len())?)
    };
    f(&refs, &mut o)?;
    narrow_into(o.as_f32()?, out)
}

/// True when `out` is bf16: the op takes the [`via_f32`] path.
pub(crate) fn is_bf16(out: &CpuStorage) -> bool {
    out.dtype() == DType::BF16
}

/// [`crate::nn::Primitives::cast`] after its checks.
pub(crate) fn cast(x: &CpuStorage, out: &mut CpuStorage) -> Result<()> {
    match (x, &mut *out) {
        (CpuStorage::F32(x), _) => narrow_into(x, out),
        (CpuStorage::BF16(x), CpuStorage::BF16(o)) => {
            o.copy_from_slice(x);
            Ok(())
        }
        (CpuStorage::BF16(x), CpuStorage::F32(o)) => {
            for_chunks(o, |off, o| {
                for (o, &e) in o.iter_mut().zip(&x[off..]) {
                    *o = e.to_f32();
                }
            });
            Ok(())
        }
        _ => Err(GpuError::UnsupportedDType {
            op: "cast",
            dtype: x.dtype(),
            backend: "cpu (f32 and bf16 only)",
        }),
    }
}

/// `x` rounded once to the nearest bf16 (ties to even). Not `half::bf16::from_f64`, which is
/// not correctly rounded (it gives 0x3f80 for the f32 0x3f808001, just above a tie, where
/// 0x3f81 is nearest), and not `x as f32` then bf16 (two roundings): f64 → f32 rounded to odd
/// keeps which side of a bf16 tie `x` lies on, and f32 → bf16 then rounds once.
pub(crate) fn bf16_rne(x: f64) -> bf16 {
    let y = x as f32;
    if y.is_finite() && y as f64 != x && y.to_bits() & 1 == 0 {
        // Inexact with an even last bit: one ulp toward x makes it odd (round to odd).
        let b = y.to_bits();
        let toward_zero = (y as f64).abs() > x.abs();
        return bf16::from_f32(f32::from_bits(if toward_zero { b - 1 } else { b + 1 }));
    }
    bf16::from_f32(y)
}

#[cfg(test)]
mod tests {
    use super::bf16_rne;
    use half::bf16;

    #[test]
    fn bf16_from_f64_rounds_once_to_nearest_even() {
        for bits in [
            0x3f80_8000u32,
            0x3f81_8000,
            0xbf80_8000,
            0x3f80_8001,
            0xbf80_8001,
            1,
            0x7f7f_ffff,
        ] {
            let x = f32::from_bits(bits);
            assert_eq!(bf16_rne(x as f64), bf16::from_f32(x), "{bits:08x}");
        }
        // Just above and below a tie in f64, where f32 would land on the tie itself.
        let tie = f32::from_bits(0x3f80_8000) as f64;
        assert_eq!(bf16_rne(tie + 1e-12).to_bits(), 0x3f81);
        assert_eq!(bf16_rne(tie - 1e-12).to_bits(), 0x3f80);
        assert_eq!(bf16_rne(-tie - 1e-12).to_bits(), 0xbf81);
        assert!(bf16_rne(f64::NAN).is_nan());
        assert_eq!(bf16_rne(f64::INFINITY), bf16::INFINITY);
        assert_eq!(bf16_rne(1e300), bf16::INFINITY);
    }
}
