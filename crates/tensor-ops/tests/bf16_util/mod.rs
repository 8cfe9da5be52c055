//! What the bf16 tests share: the unit roundoffs, exact bf16 draws, and the two comparisons
//! (the same bits; within one bf16 ulp plus the f32 result's own bound).
#![allow(dead_code)]

use half::bf16;
use rand::{rngs::StdRng, Rng};
use tensor_ops::{Device, Tensor};

/// bf16's unit roundoff (8 significant bits).
pub const U16: f64 = 1.0 / 256.0;
/// f32's unit roundoff.
pub const U32: f64 = 1.0 / 16_777_216.0;

pub fn bf16_of(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect()
}

/// Values exactly representable in bf16 (so widening is exact), with a spread of magnitudes.
pub fn draw(r: &mut StdRng, n: usize) -> Vec<f32> {
    let v: Vec<f32> = (0..n)
        .map(|_| r.random_range(-3.0f32..3.0) * 2f32.powi(r.random_range(-4..4)))
        .collect();
    bf16_of(&v)
}

pub fn t_bf16(v: &[f32], shape: &[usize], dev: Device) -> Tensor {
    let h: Vec<bf16> = v.iter().map(|&x| bf16::from_f32(x)).collect();
    Tensor::from_vec(h, shape, dev).unwrap()
}

pub fn same_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        let same = a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        assert!(same, "{what}: element {i}: {a:e} vs {b:e}");
    }
}

/// `|got − want| <= 2^-7·max(|got|, |want|) + abs[i]` elementwise (one bf16 ulp plus the f32
/// result's own error bound `abs`).
pub fn within_ulp(what: &str, got: &[f32], want: &[f32], abs: &[f64]) {
    for (i, ((&a, &b), &e)) in got.iter().zip(want).zip(abs).enumerate() {
        let (a, b) = (a as f64, b as f64);
        let tol = 2.0 * U16 * a.abs().max(b.abs()) + e;
        assert!(
            (a - b).abs() <= tol,
            "{what}: element {i}: {a:e} vs {b:e} (tol {tol:e})"
        );
    }
}
