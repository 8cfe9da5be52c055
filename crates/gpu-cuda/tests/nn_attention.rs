//! Causal attention: the CPU reference against finite differences, the CUDA kernels against the
//! CPU reference (forward and backward, fresh random inputs, outputs poisoned with NaN, every
//! launcher × image), the causal property, and typed errors for bad arguments.
//!
//! Tolerances (f32 kernels against the f64-accumulated reference; the kernels reassociate sums
//! over d and over up to t keys, and recompute P from the saved lse): forward `out`
//! norm-wise 1e-5, elementwise 1e-4·|want| + 1e-4·rms(want); `lse` 1e-5 relative + 1e-5;
//! gradients norm-wise 3e-5, elementwise 3e-4·|want| + 3e-4·rms(want).

mod common;

use common::*;
use gpu_core::nn::attention::{AttnDims, AttnQkv, PackedSaved};
use gpu_core::nn::AttentionOps;
use gpu_core::nn::ElementwiseOps;
use gpu_core::testing::AttnProblem;
use gpu_core::DType;
use gpu_cuda::testing::{backend_or_skip, cancel};
use gpu_cuda::{CudaBackend, ImageKind, LaunchPath};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use rand::{rngs::StdRng, SeedableRng};

/// A random problem: `q`, `k` uniform in ±`amp`, `v` and `dout` in ±1.
fn random(rng: &mut StdRng, n: usize, t: usize, d: usize, amp: f32) -> AttnProblem {
    AttnProblem::draw((n, t, d), amp, |len, amp| random_vec(rng, len, amp))
}

/// The inputs of an attention call.
fn qkv<'a, Buf>(q: &'a Buf, k: &'a Buf, v: &'a Buf) -> AttnQkv<'a, Buf> {
    AttnQkv { q, k, v }
}

/// `(out, lse)` from backend `b`, outputs poisoned before the call.
fn fwd<B: AttentionOps + ElementwiseOps>(b: &B, p: &AttnProblem) -> (Vec<f32>, Vec<f32>) {
    let mut out = poisoned(b, p.q.len());
    let mut lse = poisoned(b, p.dims.n * p.dims.t);
    let (q, k, v) = (up(b, &p.q), up(b, &p.k), up(b, &p.v));
    b.causal_attention_fwd(qkv(&q, &k, &v), (&mut out, &mut lse), p.dims)
        .unwrap();
    (down(b, &out), down(b, &lse))
}

/// `(dq, dk, dv)` from backend `b`, given the forward's `out` and `lse`.
fn bwd<B: AttentionOps + ElementwiseOps>(
    b: &B,
    p: &AttnProblem,
    out: &[f32],
    lse: &[f32],
) -> [Vec<f32>; 3] {
    let len = p.q.len();
    let (mut dq, mut dk, mut dv) = (poisoned(b, len), poisoned(b, len), poisoned(b, len));
    let (q, k, v) = (up(b, &p.q), up(b, &p.k), up(b, &p.v));
    let (o, l, g) = (up(b, out), up(b, lse), up(b, &p.dout));
    let saved = PackedSaved {
        out: &o,
        lse: &l,
        dout: &g,
    };
    let grads = (&mut dq, &mut dk, &mut dv);
    b.causal_attention_bwd(qkv(&q, &k, &v), saved, grads, p.dims)
        .unwrap();
    [down(b, &dq), down(b, &dk), down(b, &dv)]
}

/// Elementwise `|got − want| <= rtol·(|want| + rms(want))` (every element written and finite),
/// and norm-wise relative error below `norm_rtol`.
fn assert_near(what: &str, got: &[f32], want: &[f32], norm_rtol: f64, rtol: f64) {
    let rms = if want.is_empty() {
        0.0
    } else {
        (want.iter().map(|&w| (w as f64).powi(2)).sum::<f64>() / want.len() as f64).sqrt()
    };
    // Where every gradient is exactly 0 (t = 1: one key, softmax ≡ 1) f32 rounding of terms of
    // size ~1 still leaves up to ~d·1e-8 (dP and D are summed in different orders): the
    // absolute floor is relative to unit-size inputs.
    assert_close(what, got, want, rtol, rtol * rms.max(1e-2));
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        num += (g as f64 - w as f64).powi(2);
        den += (w as f64).powi(2);
    }
    if den > 0.0 {
        let rel = (num / den).sqrt();
        assert!(
            rel < norm_rtol,
            "{what}: norm-wise error {rel:e} >= {norm_rtol:e}"
        );
    }
}

/// The CPU reference of one problem: `(out, lse, [dq, dk, dv])`.
struct Reference {
    out: Vec<f32>,
    lse: Vec<f32>,
    grads: [Vec<f32>; 3],
}

impl Reference {
    fn of(p: &AttnProblem) -> Self {
        let (out, lse) = fwd(&CPU, p);
        let grads = bwd(&CPU, p, &out, &lse);
        Self { out, lse, grads }
    }
}

/// Checks backend `b` against the CPU reference on one problem (the backward is given the
/// reference `out` and `lse`, so its check does not depend on the forward's error).
fn check<B: AttentionOps + ElementwiseOps>(b: &B, dev: &str, p: &AttnProblem, r: &Reference) {
    let what = format!("{dev} {}", p.what());
    let (out, lse) = fwd(b, p);
    assert_near(&format!("{what} out"), &out, &r.out, 1e-5, 1e-4);
    // lse can be ~0 (t = 1 gives one scaled score), so it is checked elementwise only, with an
    // absolute floor: a norm-wise relative bound would measure rounding against ~0.
    for (i, (&g, &w)) in lse.iter().zip(&r.lse).enumerate() {
        let d = (g as f64 - w as f64).abs();
        assert!(
            g.is_finite() && d <= 1e-5 * (w as f64).abs() + 1e-5,
            "{what} lse[{i}]: got {g}, want {w}"
        );
    }
    // Gradients cancel (dS = P∘(dP − D); nearly one-hot softmaxes make dq tiny against its
    // terms): each is bounded by the size of its cancelling terms (`testing::cancel`).
    let got = bwd(b, p, &r.out, &r.lse);
    let terms = cancel::attention(
        (&p.q, &p.k, &p.v, &p.dout),
        [p.dims.n, p.dims.t, p.dims.d],
        p.dims.scale as f64,
    );
    for (name, ((g, w), t)) in ["dq", "dk", "dv"]
        .iter()
        .zip(got.iter().zip(&r.grads).zip(&terms))
    {
        cancel::check(&format!("{what} {name}"), g, w, t);
    }
}

/// Checks the GPU (every variant) and, for small problems, the CPU backend itself (which runs
/// the generic body: poisoning, every element written) against the reference.
fn check_all(gpu: &Option<CudaBackend>, p: &AttnProblem) {
    let small = p.dims.t <= 65;
    if gpu.is_none() && !small {
        return;
    }
    let r = Reference::of(p);
    if small {
        check(&CPU, "cpu", p, &r);
    }
    each_variant(gpu, |g, dev| check(g, dev, p, &r));
}

/// Runs `f` on the GPU (when there is one) under every launcher × image.
fn each_variant(gpu: &Option<CudaBackend>, mut f: impl FnMut(&CudaBackend, &str)) {
    let Some(gpu) = gpu else { return };
    for path in [LaunchPath::Cudarc, LaunchPath::RawDriver] {
        for image in [ImageKind::Fatbin, ImageKind::Ptx] {
            gpu.set_launch_path(path);
            gpu.set_image_kind(image);
            f(gpu, &format!("cuda {path:?} {image:?}"));
        }
    }
}

#[test]
fn cpu_backward_matches_finite_differences() {
    // L = Σ out ∘ w through the public f32 API, so dout = w. Central differences with
    // h = 1e-2 (the actual f32 step is used); truncation and f32 rounding of `out` stay near
    // 1e-4, so the bound is 2e-3 + 1e-2·|analytic|.
    let (mut rng, _) = rng("cpu_backward_matches_finite_differences");
    for (n, t, d) in [(1, 1, 4), (2, 5, 4), (1, 9, 8)] {
        let p = random(&mut rng, n, t, d, 1.0);
        let (out, lse) = fwd(&CPU, &p);
        let grads = bwd(&CPU, &p, &out, &lse);
        let loss = |p: &AttnProblem| -> f64 {
            let (o, _) = fwd(&CPU, p);
            o.iter()
                .zip(&p.dout)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum()
        };
        for (which, grad) in grads.iter().enumerate() {
            for e in 0..n * t * d {
                let shifted = |delta: f32| -> (f64, f64) {
                    let mut pp = p.clone();
                    let x = match which {
                        0 => &mut pp.q,
                        1 => &mut pp.k,
                        _ => &mut pp.v,
                    };
                    let before = x[e];
                    x[e] += delta;
                    let actual = x[e] as f64 - before as f64;
                    (loss(&pp), actual)
                };
                let ((lp, hp), (lm, hm)) = (shifted(1e-2), shifted(-1e-2));
                let fd = (lp - lm) / (hp - hm);
                let an = grad[e] as f64;
                assert!(
                    (fd - an).abs() <= 2e-3 + 1e-2 * an.abs(),
                    "n={n} t={t} d={d} input {which} elem {e}: fd {fd}, analytic {an}"
                );
            }
        }
    }
}

#[test]
fn cpu_matches_a_hand_computed_example() {
    // t = 2, d = 4, scale 1: row 0 sees key 0 only; row 1 has scores (q1·k0, q1·k1) = (1, 2).
    let p = AttnProblem {
        dims: AttnDims {
            n: 1,
            t: 2,
            d: 4,
            scale: 1.0,
        },
        q: vec![1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0],
        k: vec![1.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0, 0.0],
        v: vec![1.0, 2.0, 3.0, 4.0, -1.0, 0.0, 1.0, 0.0],
        dout: vec![0.0; 8],
    };
    let (out, lse) = fwd(&CPU, &p);
    let (e1, e2) = (1f64.exp(), 2f64.exp());
    let (p0, p1) = (e1 / (e1 + e2), e2 / (e1 + e2));
    let want_row1 = [p0 - p1, 2.0 * p0, 3.0 * p0 + p1, 4.0 * p0];
    assert_eq!(&out[..4], &[1.0, 2.0, 3.0, 4.0]);
    for c in 0..4 {
        assert!((out[4 + c] as f64 - want_row1[c]).abs() < 1e-6, "{out:?}");
    }
    assert!((lse[0] - 1.0).abs() < 1e-7);
    assert!((lse[1] as f64 - (e1 + e2).ln()).abs() < 1e-6);
}

#[test]
fn gpu_attention_matches_cpu() {
    let test = "gpu_attention_matches_cpu";
    let (mut rng, _) = rng(test);
    let gpu = backend_or_skip(test);
    for &t in &[0usize, 1, 7, 64, 65, 256, 300] {
        for &d in &[4usize, 16, 64, 128] {
            for &n in &[1usize, 3] {
                check_all(&gpu, &random(&mut rng, n, t, d, 1.5));
            }
        }
    }
}

#[test]
fn gpu_attention_handles_peaked_softmax_and_odd_widths() {
    // Large scores (scale 1, amplitude 3: softmax close to one-hot, the running max moves a
    // lot between key tiles) and head dimensions that are not 16, 64 or 128.
    let test = "gpu_attention_handles_peaked_softmax_and_odd_widths";
    let (mut rng, _) = rng(test);
    let gpu = backend_or_skip(test);
    for (n, t, d) in [(2, 97, 12), (1, 130, 68), (2, 33, 124), (1, 200, 60)] {
        let mut p = random(&mut rng, n, t, d, 3.0);
        p.dims.scale = 1.0;
        check_all(&gpu, &p);
    }
}

#[test]
fn gpu_attention_random_shapes() {
    // Random small shapes (proptest, 24 cases, shrinking on failure) on the GPU only.
    let gpu = skip_unless!(backend_or_skip("gpu_attention_random_shapes"));
    let config = proptest_config("gpu_attention_random_shapes", 24);
    let shapes = (1usize..4, 0usize..150, 1usize..33, any::<u64>());
    TestRunner::new(config)
        .run(&shapes, |(n, t, d4, seed)| {
            let mut rng = StdRng::seed_from_u64(seed);
            let p = random(&mut rng, n, t, 4 * d4, 1.0);
            check(&gpu, "cuda", &p, &Reference::of(&p));
            Ok(())
        })
        .unwrap();
}

/// Changing k and v at positions > i0 leaves out[..=i0] and lse[..=i0] bit-identical.
fn causal_body<B: AttentionOps + ElementwiseOps>(b: &B, dev: &str, rng: &mut StdRng) {
    for (n, t, d, i0) in [(2, 70, 16, 33), (1, 130, 64, 63), (1, 40, 128, 0)] {
        let p = random(rng, n, t, d, 1.0);
        let (out, lse) = fwd(b, &p);
        let mut p2 = p.clone();
        for s in 0..n {
            for i in i0 + 1..t {
                for c in 0..d {
                    let e = (s * t + i) * d + c;
                    p2.k[e] = -3.0 * p2.k[e] + 1.0;
                    p2.v[e] = 100.0;
                }
            }
        }
        let (out2, lse2) = fwd(b, &p2);
        for s in 0..n {
            let rows = s * t * d..(s * t + i0 + 1) * d;
            assert_eq!(out[rows.clone()], out2[rows], "{dev} seq {s}");
            assert_eq!(
                lse[s * t..s * t + i0 + 1],
                lse2[s * t..s * t + i0 + 1],
                "{dev}"
            );
            assert_ne!(out[(s * t + t - 1) * d], out2[(s * t + t - 1) * d], "{dev}");
        }
    }
}

every_device_test!(gpu_attention_is_causal, causal_body);

// One case a line: rustfmt would spread each over five.
#[rustfmt::skip]
fn errors_body<B: AttentionOps + ElementwiseOps>(b: &B, dev: &str) {
    let f = |len: usize| b.allocate(DType::F32, len).unwrap();
    let (n, t, d) = (2, 3, 8);
    let (q, k, v) = (f(48), f(48), f(48));
    let (mut out, mut lse) = (f(48), f(6));
    let dims = |d, scale| AttnDims { n, t, d, scale };
    let fwd = |q: &B::Buffer, out: &mut B::Buffer, lse: &mut B::Buffer, dims: AttnDims| {
        b.causal_attention_fwd(qkv(q, &k, &v), (out, lse), dims)
    };
    assert!(fwd(&q, &mut out, &mut lse, dims(d, 0.5)).is_ok(), "{dev}");
    for bad_d in [0, 6, 132] {
        let what = format!("{dev} d={bad_d}");
        assert_err!(what, InvalidShape, fwd(&q, &mut out, &mut lse, dims(bad_d, 0.5)));
    }
    assert_err!(dev, InvalidArgument, fwd(&q, &mut out, &mut lse, dims(d, f32::NAN)));
    let mut short_lse = f(5);
    assert_err!(dev, ShapeMismatch, fwd(&q, &mut out, &mut short_lse, dims(d, 0.5)));
    let q_u32 = b.allocate(DType::U32, 48).unwrap();
    assert_err!(dev, UnsupportedDType, fwd(&q_u32, &mut out, &mut lse, dims(d, 0.5)));
    let huge = AttnDims { n: usize::MAX, t: 2, d: 8, scale: 0.5 };
    assert_err!(dev, InvalidShape, fwd(&q, &mut out, &mut lse, huge));

    let (o, l, g) = (f(48), f(6), f(48));
    let (mut dq, mut dk, mut dv, mut short) = (f(48), f(48), f(48), f(47));
    let bwd = |grads: (&mut B::Buffer, &mut B::Buffer, &mut B::Buffer), dims: AttnDims| {
        let saved = PackedSaved { out: &o, lse: &l, dout: &g };
        b.causal_attention_bwd(qkv(&q, &k, &v), saved, grads, dims)
    };
    assert_err!(dev, ShapeMismatch, bwd((&mut dq, &mut short, &mut dv), dims(d, 0.5)));
    assert_err!(dev, ShapeMismatch, bwd((&mut dq, &mut dk, &mut dv), dims(4, 0.5)));
    assert_err!(dev, InvalidArgument, bwd((&mut dq, &mut dk, &mut dv), dims(d, f32::INFINITY)));
    // Empty problems are fine and touch nothing.
    let (e, mut eo, mut el) = (f(0), f(0), f(0));
    let empty = AttnDims { n: 0, t: 5, d: 8, scale: 0.5 };
    b.causal_attention_fwd(qkv(&e, &e, &e), (&mut eo, &mut el), empty).unwrap();
}

#[test]
fn gpu_attention_rejects_bad_arguments() {
    errors_body(&CPU, "cpu");
    if let Some(gpu) = backend_or_skip("gpu_attention_rejects_bad_arguments") {
        errors_body(&gpu, "cuda");
    }
}

/// Rows `rows` of every sequence of a `[n, t, d]` tensor.
fn seq_rows(x: &[f32], n: usize, t: usize, d: usize, rows: std::ops::Range<usize>) -> Vec<f32> {
    (0..n)
        .flat_map(|s| x[(s * t + rows.start) * d..(s * t + rows.end) * d].to_vec())
        .collect()
}

/// NaN in masked positions never leaks: NaN k and v at the last position leave out, lse and dq
/// of every earlier row bit-identical to a clean run; NaN q and dout at position 0 leave out,
/// dq, dk and dv of every later row bit-identical (query 0 sees key 0 only).
fn masked_nan_body<B: AttentionOps + ElementwiseOps>(b: &B, dev: &str, rng: &mut StdRng) {
    for (n, t, d) in [
        (2, 70, 16),
        (1, 130, 64),
        (2, 47, 128),
        (1, 200, 100),
        (1, 33, 4),
    ] {
        let p = random(rng, n, t, d, 1.0);
        let (out, lse) = fwd(b, &p);
        let grads = bwd(b, &p, &out, &lse);
        let what = format!("{dev} {}", p.what());
        let same = |a: &[f32], b: &[f32], w: usize, r: std::ops::Range<usize>| {
            seq_rows(a, n, t, w, r.clone()) == seq_rows(b, n, t, w, r)
        };
        // NaN in row `m` of every sequence of a `[n, t, d]` input.
        let nan_row = |x: &mut Vec<f32>, m: usize| {
            for s in 0..n {
                x[(s * t + m) * d..][..d].fill(f32::NAN);
            }
        };

        // A NaN in k and v at key m (the last, and one inside a tile): rows before m unchanged.
        for m in [t - 1, t / 2] {
            let mut late = p.clone();
            nan_row(&mut late.k, m);
            nan_row(&mut late.v, m);
            let (o2, l2) = fwd(b, &late);
            let [dq2, _, _] = bwd(b, &late, &o2, &l2);
            let early = 0..m;
            assert!(
                same(&out, &o2, d, early.clone()),
                "{what}: NaN k/v at {m} leaked into out"
            );
            assert!(
                same(&lse, &l2, 1, early.clone()),
                "{what}: NaN k/v at {m} leaked into lse"
            );
            assert!(
                same(&grads[0], &dq2, d, early),
                "{what}: NaN k/v at {m} leaked into dq"
            );
        }

        // A NaN in q and dout at query m (the first, and one inside a tile): out and dq of the
        // other rows, and dk, dv of the keys after m, unchanged.
        for m in [0, t / 2] {
            let mut first = p.clone();
            nan_row(&mut first.q, m);
            nan_row(&mut first.dout, m);
            let (o3, l3) = fwd(b, &first);
            let g3 = bwd(b, &first, &o3, &l3);
            let later = m + 1..t;
            for (name, (a, z)) in [("out", (&out, &o3)), ("dq", (&grads[0], &g3[0]))] {
                assert!(
                    same(a, z, d, 0..m) && same(a, z, d, later.clone()),
                    "{what}: NaN q/dout at {m} leaked into {name} of another row"
                );
            }
            for (name, (g, g0)) in ["dk", "dv"].iter().zip(g3[1..].iter().zip(&grads[1..])) {
                assert!(
                    same(g0, g, d, later.clone()),
                    "{what}: NaN q/dout at {m} leaked into {name}"
                );
            }
        }
    }
}

every_device_test!(gpu_attention_masked_nan_never_leaks, masked_nan_body);
