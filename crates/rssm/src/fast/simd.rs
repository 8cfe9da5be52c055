//! The element-wise kernels of the fast engine and their element types. Every hot loop is
//! written once as plain Rust over fixed-size arrays and compiled per instruction-set level by
//! gpu-core's [`simd_fn!`], the workspace's one run-time dispatch (`gpu_core::cpu::fast::Isa`:
//! AVX-512, AVX2 + FMA, the baseline; `HYBRID_SIMD=avx2|scalar` caps the level to test the
//! fallbacks). The build never assumes a CPU (`target-cpu=native` is not used).

pub(crate) use gpu_core::cpu::fast::packed::Real;
pub(crate) use gpu_core::cpu::fast::Isa as Level;
pub(crate) use gpu_core::simd_fn;

/// The level the kernels run at on this host.
pub(crate) fn level() -> Level {
    Level::best()
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
