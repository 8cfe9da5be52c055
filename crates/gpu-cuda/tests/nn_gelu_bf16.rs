//! The bf16 GELU kernels (`gelu_fwd_bf16` / `gelu_bwd_bf16` in `kernels/nn_elementwise.cuh`)
//! on every one of the 65,536 bf16 inputs, against the CPU's bf16 GELU (the exact f32
//! reference rounded once to bf16).
//!
//! The kernels evaluate Φ with a cheaper formula than the f32 kernel: relative error
//! `ε(x) <= 1e-5 + 1e-6·x²/2` before the rounding to bf16 (the degree-5 fit's 7.9e-6, the
//! approximate reciprocal and exponential, and the exponent's rounding, which grows with
//! `x²/2`; see the kernel's comment). The reference's f32 value is within 2^-22 of the exact
//! one. Each side then rounds to bf16 (at most half an ulp, 2^-8 relative), so
//! `|got − want| <= 2^-7·max(|got|, |want|) + (ε + 2^-22)·|exact|·1.01 + 2^-133`, the last term
//! one step of bf16's subnormals. For the backward, `exact` is replaced by
//! `(Φ(x) + |x|·φ(x))·|g|` (the two terms cancel near gelu's minimum, x ≈ −0.752, so the error
//! is relative to their magnitudes), plus `|g|·2^-149` for gelu' rounded into f32's subnormals
//! before the product. NaN must give NaN, ±inf the reference's value exactly.

mod common;

use common::gpu_and_rng;
use gpu_core::nn::elementwise::{Activation, ElementwiseOps};
use gpu_core::{Backend, CpuBackend};
use half::bf16;
use rand::{rngs::StdRng, Rng};

/// Every bf16 bit pattern, as bf16.
fn every_bf16() -> Vec<bf16> {
    (0..=u16::MAX).map(bf16::from_bits).collect()
}

/// The formula's relative error bound plus the reference's f32 error. Beyond |x| = 15 both
/// sides are exact (x or 0 forward, g or a result below f32's subnormals backward), so the
/// bound is taken at 15 there rather than growing with x².
fn formula_error(x: f64) -> f64 {
    let x = x.abs().min(15.0);
    1e-5 + 1e-6 * x * x / 2.0 + 2f64.powi(-22)
}

/// `nan_ok[i]`: a NaN result is also right there (see the backward's comment).
fn check(
    what: &str,
    x: &[bf16],
    got: &[bf16],
    want: &[bf16],
    scale: &[f64],
    extra: &[f64],
    nan_ok: &[bool],
) {
    for i in 0..x.len() {
        let (g, w) = (got[i].to_f64(), want[i].to_f64());
        let xi = x[i].to_f64();
        if nan_ok[i] && g.is_nan() {
            continue;
        }
        if w.is_nan() || g.is_nan() {
            assert!(
                w.is_nan() && g.is_nan(),
                "{what}: x = {xi:e}: got {g:e}, want {w:e}"
            );
            continue;
        }
        // Infinite results, and every result at x = ±inf (the limits 0 and x, or g and 0
        // backward; a zero of either sign), are exact.
        if w.is_infinite() || g.is_infinite() || xi.is_infinite() {
            assert_eq!(g, w, "{what}: x = {xi:e}");
            continue;
        }
        let tol = 2f64.powi(-7) * g.abs().max(w.abs())
            + formula_error(xi) * scale[i] * 1.01
            + extra[i]
            + 2f64.powi(-133);
        assert!(
            (g - w).abs() <= tol,
            "{what}: x = {xi:e} ({:#06x}): got {g:e}, want {w:e}, tol {tol:e}",
            x[i].to_bits()
        );
    }
}

/// GELU forward on `x`: `got` against `want` within the bound above, relative to |gelu(x)|.
fn check_forward(what: &str, x: &[bf16], got: &[bf16], want: &[bf16]) {
    let gelu = Activation::Gelu;
    let exact: Vec<f64> = x.iter().map(|v| gelu.eval(v.to_f64()).abs()).collect();
    let n = x.len();
    check(what, x, got, want, &exact, &vec![0.0; n], &vec![false; n]);
}

/// GELU backward on `x` and gradients `g`: within the bound above, relative to
/// `(Φ(x) + |x|·φ(x))·|g|`. Where gelu'(x) is below half of f32's smallest subnormal
/// (x < −14.1) the kernel's f32 gelu' is 0, and 0·(±inf) is NaN, as in the f32 kernel; the f64
/// reference keeps ∓inf: a NaN is accepted there.
fn check_backward(what: &str, x: &[bf16], g: &[bf16], got: &[bf16], want: &[bf16]) {
    let gelu = Activation::Gelu;
    let n = x.len();
    let (mut scale, mut extra, mut nan_ok) = (vec![0.0; n], vec![0.0; n], vec![false; n]);
    for i in 0..n {
        let (xi, gi) = (x[i].to_f64(), g[i].to_f64().abs());
        let pdf = (-0.5 * xi * xi).exp() / (2.0 * std::f64::consts::PI).sqrt();
        let cdf = if xi.is_finite() {
            gelu.backward(xi, 0.0, 1.0) - xi * pdf
        } else {
            0.0
        };
        scale[i] = (cdf + xi.abs() * pdf) * gi;
        extra[i] = gi * 2f64.powi(-149);
        nan_ok[i] = gi.is_infinite() && (cdf + xi.abs() * pdf) < 2f64.powi(-150);
    }
    check(what, x, got, want, &scale, &extra, &nan_ok);
}

#[test]
fn gpu_bf16_gelu_matches_the_reference_on_every_bf16_input() {
    let test = "gpu_bf16_gelu_matches_the_reference_on_every_bf16_input";
    let (gpu, mut r) = skip_unless!(gpu_and_rng(test));
    let cpu = CpuBackend;
    let x = every_bf16();
    let n = x.len();
    let gelu = Activation::Gelu;

    // Forward.
    let (got, want) = (gpu.fwd(gelu, &x), cpu.fwd(gelu, &x));
    check_forward(&format!("{test} forward"), &x, &got, &want);

    // Backward: g of every magnitude bf16 has (and both signs), with ±inf and NaN mixed in.
    let g: Vec<bf16> = (0..n)
        .map(|_| {
            if r.random_bool(0.01) {
                [f32::INFINITY, f32::NEG_INFINITY, f32::NAN][r.random_range(0..3)]
            } else {
                r.random_range(-1.0f32..1.0) * 2f32.powi(r.random_range(-40..40))
            }
        })
        .map(bf16::from_f32)
        .collect();
    let (got, want) = (gpu.bwd(gelu, &x, &g), cpu.bwd(gelu, &x, &g));
    check_backward(&format!("{test} backward"), &x, &g, &got, &want);
}

/// The unary bf16 streams (`stream2` in `kernels/nn_elementwise.cuh`: two vectors a step, the
/// next step's loads issued first) on more elements than one pass of their grid covers: two
/// full passes (32 blocks per SM × 256 threads × 8 elements) and 13 more, so every thread takes
/// several steps, the prefetch runs, and so do the plain loop and the scalar tail. Hostile
/// values (NaN, ±inf, ±1e30, a subnormal, −0) are mixed in. Cast, affine, dropout and ReLU are
/// exact on both devices: the same bits; GELU forward and backward: the bound above.
#[test]
fn gpu_bf16_streams_match_the_reference_across_steps_and_tails() {
    let test = "gpu_bf16_streams_match_the_reference_across_steps_and_tails";
    let (gpu, mut r) = skip_unless!(gpu_and_rng(test));
    let cpu = CpuBackend;
    let n = 2 * gpu.info().multiprocessors as usize * 32 * 256 * 8 + 13;
    let specials = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e30,
        -1e30,
        1e-40,
        -0.0,
    ];
    let draw = |r: &mut StdRng| -> Vec<bf16> {
        (0..n)
            .map(|_| {
                if r.random_bool(0.001) {
                    specials[r.random_range(0..specials.len())]
                } else {
                    r.random_range(-6.0f32..6.0)
                }
            })
            .map(bf16::from_f32)
            .collect()
    };
    let (x, g) = (draw(&mut r), draw(&mut r));
    let same_bits = |what: &str, got: &[f32], want: &[f32]| {
        for (i, (a, b)) in got.iter().zip(want).enumerate() {
            let same = a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
            assert!(same, "{test}: {what}: element {i} of {n}: {a:e} vs {b:e}");
        }
    };
    let widen = |v: &[bf16]| v.iter().map(|b| b.to_f32()).collect::<Vec<_>>();
    let casts = (cpu.cast_up(&x), gpu.cast_up(&x));
    same_bits("cast bf16 → f32", &casts.1, &casts.0);
    for (what, op) in [
        ("affine", Unary::Affine),
        ("dropout", Unary::Dropout),
        ("relu", Unary::Relu),
    ] {
        same_bits(what, &widen(&gpu.unary(op, &x)), &widen(&cpu.unary(op, &x)));
    }
    let gelu = Activation::Gelu;
    let (got, want) = (gpu.fwd(gelu, &x), cpu.fwd(gelu, &x));
    check_forward(&format!("{test} gelu forward"), &x, &got, &want);
    let (got, want) = (gpu.bwd(gelu, &x, &g), cpu.bwd(gelu, &x, &g));
    check_backward(&format!("{test} gelu backward"), &x, &g, &got, &want);
}

/// The exact unary bf16 ops of the streaming test.
#[derive(Clone, Copy)]
enum Unary {
    Affine,
    Dropout,
    Relu,
}

/// The two calls the test needs, on either backend: upload bf16, run, download.
trait Dev {
    fn fwd(&self, op: Activation, x: &[bf16]) -> Vec<bf16>;
    fn bwd(&self, op: Activation, x: &[bf16], g: &[bf16]) -> Vec<bf16>;
    fn unary(&self, op: Unary, x: &[bf16]) -> Vec<bf16>;
    fn cast_up(&self, x: &[bf16]) -> Vec<f32>;
}

impl<B: Backend + ElementwiseOps> Dev for B {
    fn fwd(&self, op: Activation, x: &[bf16]) -> Vec<bf16> {
        let xb = self.upload(x).unwrap();
        let mut out = self.upload(&vec![bf16::NAN; x.len()]).unwrap();
        self.activation_fwd(op, &xb, &mut out).unwrap();
        self.download(&out).unwrap()
    }

    fn bwd(&self, op: Activation, x: &[bf16], g: &[bf16]) -> Vec<bf16> {
        let (xb, gb) = (self.upload(x).unwrap(), self.upload(g).unwrap());
        // GELU's backward reads x, not y: y is passed as x's buffer.
        let mut out = self.upload(&vec![bf16::NAN; x.len()]).unwrap();
        self.activation_bwd(op, &xb, &xb, &gb, &mut out).unwrap();
        self.download(&out).unwrap()
    }

    fn unary(&self, op: Unary, x: &[bf16]) -> Vec<bf16> {
        let xb = self.upload(x).unwrap();
        let mut out = self.upload(&vec![bf16::NAN; x.len()]).unwrap();
        match op {
            Unary::Affine => self.affine(&xb, 1.5, 0.25, &mut out),
            Unary::Dropout => self.dropout(&xb, 0.2, 77, &mut out),
            Unary::Relu => self.activation_fwd(Activation::Relu, &xb, &mut out),
        }
        .unwrap();
        self.download(&out).unwrap()
    }

    fn cast_up(&self, x: &[bf16]) -> Vec<f32> {
        let xb = self.upload(x).unwrap();
        let mut out = self.upload(&vec![f32::NAN; x.len()]).unwrap();
        self.cast(&xb, &mut out).unwrap();
        self.download(&out).unwrap()
    }
}
