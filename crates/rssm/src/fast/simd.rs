//! Runtime CPU-feature dispatch and the element-wise kernels of the fast engine.
//!
//! Every hot loop is written once as plain Rust over fixed-size arrays and compiled three
//! times by [`simd_fn!`]: for AVX-512 (`avx512f`, `avx512vl`, `avx2`, `fma`), for AVX2 + FMA,
//! and for the baseline target (SSE2, no FMA). The level is detected once per process
//! ([`level`]); the build never assumes a CPU (`target-cpu=native` is not used). The
//! environment variable `RSSM_SIMD` (`avx2` or `base`) caps the level, to test the fallbacks.

use std::sync::OnceLock;

/// The instruction-set level the kernels run at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    Avx512,
    Avx2,
    Base,
}

/// The best level this CPU supports (capped by `RSSM_SIMD`), detected once.
pub(crate) fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(detect)
}

fn detect() -> Level {
    let cap = match std::env::var("RSSM_SIMD").as_deref() {
        Ok("base") => Level::Base,
        Ok("avx2") => Level::Avx2,
        _ => Level::Avx512,
    };
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma");
        let avx512 = avx2
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vl");
        if cap == Level::Avx512 && avx512 {
            return Level::Avx512;
        }
        if cap != Level::Base && avx2 {
            return Level::Avx2;
        }
    }
    let _ = cap;
    Level::Base
}

/// Defines a function whose body is compiled once per [`Level`] and chosen at run time. The
/// bodies are expressions over the arguments, usually a call of an `#[inline(always)]`
/// generic with the level's tile sizes, which is then compiled with the level's features.
macro_rules! simd_fn {
    (
        $(#[$meta:meta])*
        $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? {
            avx512: $avx512:expr,
            avx2: $avx2:expr,
            base: $base:expr $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
                fn avx512($($arg: $ty),*) $(-> $ret)? {
                    $avx512
                }
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($arg: $ty),*) $(-> $ret)? {
                    $avx2
                }
                match $crate::fast::simd::level() {
                    // SAFETY: `level()` returns Avx512 only after `is_x86_feature_detected!`
                    // found avx512f, avx512vl, avx2 and fma on this CPU.
                    $crate::fast::simd::Level::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: `level()` returns Avx2 only after avx2 and fma were detected.
                    $crate::fast::simd::Level::Avx2 => return unsafe { avx2($($arg),*) },
                    $crate::fast::simd::Level::Base => {}
                }
            }
            $base
        }
    };
}
pub(crate) use simd_fn;

/// The element types of the kernels: `f32` and `f64`.
pub(crate) trait Real:
    Copy
    + Default
    + Send
    + Sync
    + PartialEq
    + std::fmt::Debug
    + std::ops::Add<Output = Self>
    + std::ops::Mul<Output = Self>
    + 'static
{
    /// `a·b + c`: fused where the level has FMA (`FMA`), else a product and a sum.
    fn madd<const FMA: bool>(a: Self, b: Self, c: Self) -> Self;
    const ZERO: Self;
}

impl Real for f32 {
    #[inline(always)]
    fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
        if FMA {
            a.mul_add(b, c)
        } else {
            a * b + c
        }
    }
    const ZERO: f32 = 0.0;
}

impl Real for f64 {
    #[inline(always)]
    fn madd<const FMA: bool>(a: f64, b: f64, c: f64) -> f64 {
        if FMA {
            a.mul_add(b, c)
        } else {
            a * b + c
        }
    }
    const ZERO: f64 = 0.0;
}

/// `e^x` in f32 without branches (so that loops over it vectorize): `x = n·ln 2 + r` with
/// `|r| <= ln 2 / 2`, a degree-6 polynomial for `e^r` (Cephes `expf`, about 1 ulp), and `2^n`
/// built in the exponent bits. `x` is clamped to `[-87, 88]` (results from 1.6e-38 to 1.7e38,
/// normal numbers): callers use it inside sigmoid and tanh, where the clamp changes nothing
/// visible in f32. NaN is not expected (inputs are checked finite).
#[inline(always)]
pub(crate) fn exp<const FMA: bool>(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5·2^23: adding it rounds to an integer held in the low mantissa bits.
    const MAGIC: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let t = f32::madd::<FMA>(x, LOG2E, MAGIC);
    let n = t - MAGIC;
    let r = f32::madd::<FMA>(n, -LN2_HI, x);
    let r = f32::madd::<FMA>(n, -LN2_LO, r);
    let mut p = 1.987_569_1e-4;
    p = f32::madd::<FMA>(p, r, 1.398_199_9e-3);
    p = f32::madd::<FMA>(p, r, 8.333_452e-3);
    p = f32::madd::<FMA>(p, r, 4.166_579_6e-2);
    p = f32::madd::<FMA>(p, r, 1.666_666_5e-1);
    p = f32::madd::<FMA>(p, r, 0.5);
    p = f32::madd::<FMA>(p, r * r, r + 1.0);
    // n is in [-126, 127]: its two's complement sits in the low bits of t's representation.
    let bits = (t.to_bits().wrapping_sub(MAGIC.to_bits()).wrapping_add(127)) << 23;
    p * f32::from_bits(bits)
}

/// `1 / (1 + e^-x)`.
#[inline(always)]
pub(crate) fn sigmoid<const FMA: bool>(x: f32) -> f32 {
    1.0 / (1.0 + exp::<FMA>(-x))
}

/// `tanh x = 1 − 2/(e^{2x} + 1)`: absolute error a few ulps of 1 (the GRU uses it in
/// `h' = n + z∘(h − n)`, where absolute error is what matters).
#[inline(always)]
pub(crate) fn tanh<const FMA: bool>(x: f32) -> f32 {
    1.0 - 2.0 / (exp::<FMA>(2.0 * x) + 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_sigmoid_and_tanh_are_accurate_over_the_range() {
        let mut worst = [0.0f64; 3];
        for i in -200_000..=200_000 {
            let x = i as f32 * 4.3e-4; // [-86, 86]
            let e = f64::from(x).exp();
            for (fma, got) in [(true, exp::<true>(x)), (false, exp::<false>(x))] {
                let rel = (f64::from(got) - e).abs() / e;
                assert!(rel < 3e-7, "exp({x}) fma {fma}: rel {rel:e}");
                worst[0] = worst[0].max(rel);
            }
            let s = 1.0 / (1.0 + (-f64::from(x)).exp());
            worst[1] = worst[1].max((f64::from(sigmoid::<true>(x)) - s).abs());
            let t = f64::from(x).tanh();
            worst[2] = worst[2].max((f64::from(tanh::<true>(x)) - t).abs());
        }
        assert!(worst[1] < 2e-7 && worst[2] < 4e-7, "{worst:?}");
        assert_eq!(exp::<true>(-1000.0), exp::<true>(-87.0));
        assert!(exp::<true>(1000.0).is_finite());
        assert_eq!(sigmoid::<true>(-1e30), sigmoid::<true>(-88.0));
        assert_eq!(sigmoid::<true>(1e30), 1.0);
        assert_eq!(tanh::<true>(1e30), 1.0);
        assert_eq!(tanh::<true>(-1e30), -1.0);
    }

    #[test]
    fn the_level_is_stable() {
        assert_eq!(level(), level());
    }
}
