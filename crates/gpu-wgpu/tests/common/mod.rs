//! Helpers shared by the wgpu test files: the backend and seeded randomness (fixed per test,
//! printed; replay with `HYBRID_TEST_SEED`, or `HYBRID_TEST_SEED=fresh`), f32 buffers to a
//! backend and f32 values from one, hostile values and value comparison.
#![allow(dead_code)]

use gpu_core::nn::Primitives;
use gpu_core::testing::fixtures::HOSTILE_FLOATS;
use gpu_core::{Backend, BufferInfo, DType};
use gpu_wgpu::testing::backend_or_skip;
use gpu_wgpu::WgpuBackend;
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// 2^-24, f32's unit roundoff.
pub const U: f64 = 1.0 / (1u64 << 24) as f64;

pub fn rng(test: &str) -> StdRng {
    StdRng::seed_from_u64(gpu_core::testing::test_seed(test))
}

/// The shared wgpu backend and the randomness seeded for `test`, or `None` once the skip is
/// reported (`gpu_wgpu::testing::backend_or_skip`).
pub fn backend_and_rng(test: &str) -> Option<(WgpuBackend, StdRng)> {
    let b = backend_or_skip(test)?;
    Some((b, rng(test)))
}

/// `x` uploaded to `b`.
pub fn up<B: Backend>(b: &B, x: &[f32]) -> B::Buffer {
    b.upload(x).unwrap()
}

/// A poisoned (NaN) f32 output of `n` elements on `b`.
pub fn out<B: Primitives>(b: &B, n: usize) -> B::Buffer {
    let mut x = b.allocate(DType::F32, n).unwrap();
    b.fill(&mut x, f32::NAN).unwrap();
    x
}

/// `x` downloaded from `b` as f32 values (a bf16 buffer widened, exactly).
pub fn get<B: Backend>(b: &B, x: &B::Buffer) -> Vec<f32> {
    match x.dtype() {
        DType::BF16 => b
            .download::<bf16>(x)
            .unwrap()
            .iter()
            .map(|v| v.to_f32())
            .collect(),
        _ => b.download::<f32>(x).unwrap(),
    }
}

/// `x` rounded to bf16 (to nearest, ties to even).
pub fn bf(x: &[f32]) -> Vec<bf16> {
    x.iter().map(|&v| bf16::from_f32(v)).collect()
}

pub fn randn(r: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| r.random_range(-1.0f32..1.0) * scale)
        .collect()
}

pub const HOSTILE: [f32; 10] = {
    let [nan, inf, neg_inf, zero, neg_zero, huge, neg_huge] = HOSTILE_FLOATS;
    [
        nan,
        inf,
        neg_inf,
        zero,
        neg_zero,
        huge,
        neg_huge,
        f32::MAX,
        f32::MIN_POSITIVE,
        1e-40,
    ]
};

/// Sizes that are empty, single, and not multiples of the workgroup (256).
pub const SIZES: [usize; 6] = [0, 1, 3, 255, 257, 4099];

/// `x` with the hostile values written over its first elements.
pub fn with_hostile(mut x: Vec<f32>) -> Vec<f32> {
    for (v, h) in x.iter_mut().zip(HOSTILE) {
        *v = h;
    }
    x
}

/// Equal as values: both NaN, the same infinity, or within `tol` (±0 equal).
pub fn close(got: f32, want: f64, tol: f64) -> bool {
    if want.is_nan() {
        return got.is_nan();
    }
    if want.is_infinite() || got.is_infinite() {
        return got as f64 == want
            || (!want.is_infinite() && want.abs() > f32::MAX as f64 * 0.999_999);
    }
    ((got as f64) - want).abs() <= tol
}

/// WGSL lets a device flush subnormal values to zero (NVIDIA's Vulkan driver does in plain
/// arithmetic, lavapipe in some math functions): where one of `inputs` is subnormal the result
/// is not compared, and a subnormal `want` may come back as ±0.
pub fn flushed(inputs: &[f32], got: f32, want: f32) -> bool {
    inputs.iter().any(|x| x.is_subnormal()) || (want.is_subnormal() && got == 0.0)
}

/// `x` with subnormal values flushed to zero (their sign kept), as such a device reads them.
pub fn ftz(x: &[f32]) -> Vec<f32> {
    x.iter()
        .map(|&v| {
            if v.is_subnormal() {
                0.0f32.copysign(v)
            } else {
                v
            }
        })
        .collect()
}

/// Same bits, or both NaN.
pub fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}
