//! The world model's op family (`gpu_core::nn::WorldOps`) on wgpu, from gpu-core's default
//! compositions on the WGSL primitives, against the same defaults on the CPU backend: the
//! ensemble rollout over packed weights, the checked low-rank correction, the largest
//! magnitude and the randomized SVD, on random inputs (seed printed; `HYBRID_TEST_SEED`
//! replays) and hostile ones.
//!
//! Bounds: the rollout's outputs within `1e-5·scale` of the CPU's (`scale` the largest
//! magnitude of the output): both run f32 matmuls, LayerNorms and gates through 1 + 6 GRU steps
//! and three heads a step; the wgpu reductions are f32 tree sums where the CPU sums in f64, and
//! its transcendentals are f32 forms of the f64 definitions (a few ulps each), so per step a few
//! 1e-7 relative, compounded over the steps (measured ~2e-7, printed). The correction: `1e-6·scale`
//! (a k-term f32 dot product with k = 5 and one sum). `max_abs`: exact. The SVD: the factors are
//! only defined up to signs, so the singular values within `1e-5·σ₁` and the reconstruction
//! `U·S·Vᵀ` within `1e-5·σ₁` per entry of the CPU's.

mod common;

use common::{backend_and_rng, get, out, up};
use gpu_core::nn::{
    LowRankFactors, LowRankOutcome, RolloutCall, RolloutDims, SvdMethod, SvdOut, SvdOutcome,
    SvdSpec, WorldOps,
};
use gpu_core::testing::same_bits;
use gpu_core::CpuBackend;

fn close(test: &str, got: &[f32], want: &[f32], rtol: f32) {
    assert_eq!(got.len(), want.len(), "{test}: lengths");
    let scale = want.iter().fold(1e-30f32, |m, v| m.max(v.abs()));
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    eprintln!("{test}: worst |wgpu − cpu| {worst:e} of scale {scale:e} (bound {rtol}·scale)");
    assert!(
        worst <= rtol * scale,
        "{test}: {worst:e} > {rtol}·{scale:e}"
    );
}

const DIMS: RolloutDims = RolloutDims {
    members: 3,
    batch: 4,
    context: 3,
    steps: 3,
    hidden: 12,
    latent: 4,
    embed: 6,
    head: 10,
    out: 5,
    eps: 1e-5,
};

fn rollout<B: WorldOps>(b: &B, weights: &[f32], embeds: &[f32]) -> [Vec<f32>; 3] {
    let d = DIMS;
    let (w, e) = (up(b, weights), up(b, embeds));
    let per = d.batch * d.steps * d.out;
    let (mut o, mut m, mut dis) = (
        out(b, d.members * per),
        out(b, per),
        out(b, d.batch * d.steps),
    );
    let call = RolloutCall {
        weights: &w,
        embeds: &e,
        out: &mut o,
        mean: &mut m,
        disagreement: &mut dis,
    };
    b.rssm_rollout(&d, call).unwrap();
    [get(b, &o), get(b, &m), get(b, &dis)]
}

#[test]
fn the_rollout_default_matches_the_cpu() {
    let Some((w, mut r)) = backend_and_rng("the_rollout_default_matches_the_cpu") else {
        return;
    };
    let d = DIMS;
    let weights = common::randn(&mut r, d.members * d.member_len(), 0.3);
    let embeds = common::randn(&mut r, d.batch * d.context * d.embed, 1.0);
    let cpu = rollout(&CpuBackend, &weights, &embeds);
    let gpu = rollout(&w, &weights, &embeds);
    for (name, (g, c)) in ["members", "mean", "disagreement"]
        .iter()
        .zip(gpu.iter().zip(&cpu))
    {
        close(&format!("rollout {name}"), g, c, 1e-5);
    }
    // A weights buffer one float short is a typed error, before anything runs.
    let short = up(&w, &weights[1..]);
    let e = up(&w, &embeds);
    let per = d.batch * d.steps * d.out;
    let (mut o, mut m, mut dis) = (
        out(&w, d.members * per),
        out(&w, per),
        out(&w, d.batch * d.steps),
    );
    let call = RolloutCall {
        weights: &short,
        embeds: &e,
        out: &mut o,
        mean: &mut m,
        disagreement: &mut dis,
    };
    assert!(w.rssm_rollout(&d, call).is_err());
}

fn correction<B: WorldOps>(
    b: &B,
    w0: &[f32],
    (u, s, v): (&[f32], &[f32], &[f32]),
) -> (LowRankOutcome, Vec<f32>) {
    let (m, n, k) = (9, 7, 5);
    let mut w = up(b, w0);
    let (ub, sb, vb) = (up(b, u), up(b, s), up(b, v));
    let f = LowRankFactors {
        m,
        n,
        k,
        u: &ub,
        s: &sb,
        v: &vb,
    };
    let o = b.low_rank_add(&mut w, f).unwrap();
    (o, get(b, &w))
}

#[test]
fn the_correction_and_max_abs_defaults_match_the_cpu() {
    let Some((w, mut r)) = backend_and_rng("the_correction_and_max_abs_defaults_match_the_cpu")
    else {
        return;
    };
    let (m, n, k) = (9, 7, 5);
    let w0 = common::randn(&mut r, m * n, 2.0);
    let u = common::randn(&mut r, m * k, 1.0);
    let s = common::randn(&mut r, k, 1.0);
    let v = common::randn(&mut r, n * k, 1.0);
    let (oc, c) = correction(&CpuBackend, &w0, (&u, &s, &v));
    let (og, g) = correction(&w, &w0, (&u, &s, &v));
    assert_eq!((oc, og), (LowRankOutcome::Written, LowRankOutcome::Written));
    close("low_rank_add", &g, &c, 1e-6);
    // Poisoned weights, and a sum that overflows (every entry of the product is 5·1e38):
    // nothing written, bit for bit.
    let (ones_u, big, ones_v) = (vec![1.0f32; m * k], vec![1e38f32; k], vec![1.0f32; n * k]);
    for (value, overflow, want) in [
        (f32::NAN, false, LowRankOutcome::NonFiniteWeights),
        (f32::INFINITY, false, LowRankOutcome::NonFiniteWeights),
        (1.0, true, LowRankOutcome::NonFiniteSum),
    ] {
        let mut bad = w0.clone();
        bad[3] = value;
        let factors = if overflow {
            (&ones_u[..], &big[..], &ones_v[..])
        } else {
            (&u[..], &s[..], &v[..])
        };
        let (oc, c_after) = correction(&CpuBackend, &bad, factors);
        let (o, after) = correction(&w, &bad, factors);
        assert_eq!((oc, o), (want, want), "{value}");
        for x in [&after, &c_after] {
            assert!(same_bits(x, &bad), "{value}: written");
        }
    }
    for xs in [
        vec![],
        vec![-0.0, 0.0],
        vec![1.0, -3.5, 2.0],
        vec![1.0, f32::NEG_INFINITY],
        vec![f32::INFINITY, f32::NAN],
    ] {
        let (c, g) = (
            CpuBackend.max_abs(&up(&CpuBackend, &xs)),
            w.max_abs(&up(&w, &xs)),
        );
        let (c, g) = (c.unwrap(), g.unwrap());
        assert!(
            c.to_bits() == g.to_bits() || (c.is_nan() && g.is_nan()),
            "{xs:?}: wgpu {g}, cpu {c}"
        );
    }
}

fn svd<B: WorldOps>(b: &B, a: &[f32], spec: &SvdSpec) -> (SvdOutcome, Vec<f32>, Vec<f32>) {
    let (m, n, k) = (spec.m, spec.n, spec.rank);
    let ab = up(b, a);
    let (mut u, mut s, mut v) = (out(b, m * k), out(b, k), out(b, n * k));
    let o = b
        .randomized_svd(
            &ab,
            spec,
            SvdOut {
                u: &mut u,
                s: &mut s,
                v: &mut v,
            },
        )
        .unwrap();
    if o != SvdOutcome::Done {
        return (o, vec![], vec![]);
    }
    let (u, s, v) = (get(b, &u), get(b, &s), get(b, &v));
    // U·S·Vᵀ, sign-free.
    let rec = (0..m * n)
        .map(|e| {
            (0..k)
                .map(|c| u[(e / n) * k + c] * s[c] * v[(e % n) * k + c])
                .sum()
        })
        .collect();
    (o, s, rec)
}

#[test]
fn the_svd_default_matches_the_cpu() {
    let Some((w, mut r)) = backend_and_rng("the_svd_default_matches_the_cpu") else {
        return;
    };
    let (m, n, k) = (40, 24, 4);
    // A decaying spectrum: rank-k part plus small noise.
    let a: Vec<f32> = {
        let g = common::randn(&mut r, m * k, 1.0);
        let h = common::randn(&mut r, k * n, 1.0);
        let noise = common::randn(&mut r, m * n, 1e-3);
        (0..m * n)
            .map(|e| {
                (0..k)
                    .map(|c| g[(e / n) * k + c] * h[c * n + e % n] / (c + 1) as f32)
                    .sum::<f32>()
                    + noise[e]
            })
            .collect()
    };
    let spec = SvdSpec {
        m,
        n,
        rank: k,
        oversample: 6,
        power_iters: 2,
        seed: 11,
        method: SvdMethod::Halko,
    };
    let (oc, sc, rc) = svd(&CpuBackend, &a, &spec);
    let (og, sg, rg) = svd(&w, &a, &spec);
    assert_eq!((oc, og), (SvdOutcome::Done, SvdOutcome::Done));
    close("svd singular values", &sg, &sc, 1e-5);
    let s1 = sc[0];
    let worst = rg
        .iter()
        .zip(&rc)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    eprintln!("svd reconstruction: worst {worst:e}, sigma_1 {s1:e}");
    assert!(worst <= 1e-5 * s1, "{worst:e}");
    let mut bad = a.clone();
    bad[5] = f32::NAN;
    assert_eq!(svd(&w, &bad, &spec).0, SvdOutcome::NonFiniteInput);
    let gesvdr = SvdSpec {
        method: SvdMethod::CusolverGesvdr,
        ..spec
    };
    let (ab, mut u, mut s, mut v) = (up(&w, &a), out(&w, m * k), out(&w, k), out(&w, n * k));
    assert!(w
        .randomized_svd(
            &ab,
            &gesvdr,
            SvdOut {
                u: &mut u,
                s: &mut s,
                v: &mut v
            }
        )
        .is_err());
}
