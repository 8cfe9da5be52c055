//! The fused AdamW kernel against the CPU reference (each element in f64, rounded once), on
//! fresh random inputs (the seed is printed; replay with `HYBRID_TEST_SEED`) and hostile ones:
//! several parameters of sizes around the workgroup, with and without the clip coefficient,
//! early and late steps, with and without weight decay; the scheduled entry gives the same
//! bits; a bad argument is a typed error that changes nothing. A gradient whose square
//! overflows f32 gives v = inf and no step (the f32 kernels', CUDA's too), not the CPU's. Without an adapter each test
//! prints `SKIP` and returns (fails with `HYBRID_REQUIRE_WGPU=1`).

mod common;

use common::{backend_and_rng, close, randn, rng, with_hostile, SIZES, U};
use gpu_core::nn::optim::{adamw_schedule, AdamWBuffers};
use gpu_core::nn::{AdamWConfig, OptimOps};
use gpu_core::testing::{adamw_config, adamw_one};
use gpu_core::{Backend, CpuBackend, DType};
use gpu_wgpu::testing::backend_or_skip;

/// Parameters, gradients, first and second moments of one parameter.
type State = [Vec<f32>; 4];

/// One AdamW step on `b` over `states`: the updated parameters and moments.
fn step<B: OptimOps>(
    b: &B,
    states: &[State],
    wd: &[f32],
    scale: Option<[f32; 2]>,
    cfg: AdamWConfig,
) -> Vec<State> {
    let up = |x: &[f32]| b.upload(x).unwrap();
    let mut p: Vec<B::Buffer> = states.iter().map(|s| up(&s[0])).collect();
    let g: Vec<B::Buffer> = states.iter().map(|s| up(&s[1])).collect();
    let mut m: Vec<B::Buffer> = states.iter().map(|s| up(&s[2])).collect();
    let mut v: Vec<B::Buffer> = states.iter().map(|s| up(&s[3])).collect();
    let s = scale.map(|s| up(&s));
    b.adamw_step(
        AdamWBuffers {
            params: &mut p.iter_mut().collect::<Vec<_>>(),
            grads: &g.iter().collect::<Vec<_>>(),
            m: &mut m.iter_mut().collect::<Vec<_>>(),
            v: &mut v.iter_mut().collect::<Vec<_>>(),
            weight_decay: wd,
            grad_scale: s.as_ref(),
        },
        cfg,
    )
    .unwrap();
    let down = |x: &B::Buffer| b.download::<f32>(x).unwrap();
    (0..states.len())
        .map(|i| [down(&p[i]), down(&g[i]), down(&m[i]), down(&v[i])])
        .collect()
}

/// The error bound of one updated value: WGSL's `sqrt` (via `inverseSqrt`, ≤ 2 ulp, and a
/// reciprocal) and `/` (2.5 ulp) and about eight correctly rounded operations, so 16 ulp of
/// the sum of the magnitudes of the terms that make the value, plus the CPU's one rounding.
fn bounds(s: &State, j: usize, wd: f32, coef: f32, cfg: AdamWConfig) -> [f64; 3] {
    let [lr, step_size, bc2_sqrt] = adamw_schedule(cfg).map(|x| x as f64);
    let (b1, b2) = (cfg.beta1 as f64, cfg.beta2 as f64);
    let g = s[1][j] as f64 * coef as f64;
    let m = b1 * s[2][j] as f64 + (1.0 - b1) * g;
    let v = b2 * s[3][j] as f64 + (1.0 - b2) * g * g;
    let upd = step_size * m / (v.sqrt() / bc2_sqrt + cfg.eps as f64);
    let p = s[0][j] as f64 * (1.0 - lr * wd as f64);
    let tol = |terms: f64| 17.0 * U * terms + f64::MIN_POSITIVE;
    [
        tol(p.abs() + upd.abs()),
        tol((b1 * s[2][j] as f64).abs() + ((1.0 - b1) * g).abs()),
        tol((b2 * s[3][j] as f64).abs() + ((1.0 - b2) * g * g).abs()),
    ]
}

#[test]
fn fused_adamw_matches_the_cpu() {
    let Some((w, mut r)) = backend_and_rng("fused_adamw_matches_the_cpu") else {
        return;
    };
    for (step_no, scale, wd) in [
        (1, None, 0.0f32),
        (3, Some([2.0f32, 0.5]), 0.1),
        (1000, Some([0.1, 1.0]), 0.01),
    ] {
        let cfg = AdamWConfig {
            lr: 3e-3,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            step: step_no,
        };
        let states: Vec<State> = SIZES
            .iter()
            .enumerate()
            .map(|(k, &n)| {
                let p = randn(&mut r, n, 2.0);
                // The second parameter's gradient carries the hostile values.
                let g = randn(&mut r, n, 1.0);
                let g = if k == 4 { with_hostile(g) } else { g };
                let m = randn(&mut r, n, 0.1);
                let v: Vec<f32> = randn(&mut r, n, 0.01).iter().map(|x| x.abs()).collect();
                if k == 3 {
                    // Gradients near eps and no second moment yet: eps shapes the step.
                    let g: Vec<f32> = g.iter().map(|x| x * 1e-8).collect();
                    return [p, g, vec![0.0; n], vec![0.0; n]];
                }
                [p, g, m, v]
            })
            .collect();
        let wds = vec![wd; states.len()];
        let got = step(&w, &states, &wds, scale, cfg);
        let want = step(&CpuBackend, &states, &wds, scale, cfg);
        let coef = scale.map_or(1.0, |s| s[1]);
        for (i, s) in states.iter().enumerate() {
            for j in 0..s[0].len() {
                let tol = bounds(s, j, wd, coef, cfg);
                let gc = s[1][j] as f64 * coef as f64;
                if gc.is_finite() && gc * gc > f32::MAX as f64 {
                    // g² overflows f32 (as in the CUDA kernel): v = inf and the step is 0,
                    // where the CPU's f64 takes a finite step.
                    let decayed = s[0][j] as f64 * (1.0 - cfg.lr as f64 * wd as f64);
                    assert_eq!(got[i][3][j], f32::INFINITY, "param {i} v[{j}]");
                    assert!(close(got[i][0][j], decayed, tol[0]), "param {i} p[{j}]");
                    continue;
                }
                for (k, name, t) in [(0, "p", tol[0]), (2, "m", tol[1]), (3, "v", tol[2])] {
                    let (g, c) = (got[i][k][j], want[i][k][j]);
                    assert!(
                        close(g, c as f64, t),
                        "step {step_no} param {i} {name}[{j}]: {g} against the CPU's {c}"
                    );
                }
            }
        }
    }
}

#[test]
fn scheduled_adamw_is_the_same_step_and_bad_arguments_change_nothing() {
    let Some((w, mut r)) = backend_and_rng("scheduled_adamw_is_the_same_step") else {
        return;
    };
    let cfg = adamw_config(1e-2, 7);
    let x = randn(&mut r, 300, 1.0);
    let (mut p, g) = (w.upload(&x).unwrap(), w.upload(&x).unwrap());
    let (mut m, mut v) = (w.upload(&x).unwrap(), w.upload(&vec![0.5f32; 300]).unwrap());
    let (mut p2, mut m2) = (w.upload(&x).unwrap(), w.upload(&x).unwrap());
    let mut v2 = w.upload(&vec![0.5f32; 300]).unwrap();
    adamw_one((&mut p, &g, &mut m, &mut v), 0.1, None, |bufs| {
        w.adamw_step(bufs, cfg)
    })
    .unwrap();
    let schedule = w.upload(&adamw_schedule(cfg)).unwrap();
    adamw_one((&mut p2, &g, &mut m2, &mut v2), 0.1, None, |bufs| {
        w.adamw_step_scheduled(bufs, cfg, &schedule)
    })
    .unwrap();
    for (a, b) in [(&p, &p2), (&m, &m2), (&v, &v2)] {
        let (a, b): (Vec<f32>, Vec<f32>) = (w.download(a).unwrap(), w.download(b).unwrap());
        assert_eq!(
            a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            b.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }
    // A second parameter whose gradient is one element short: refused before any launch, so
    // the first parameter is unchanged too.
    let before: Vec<f32> = w.download(&p).unwrap();
    let mut q = w.upload(&x[..10]).unwrap();
    let short = w.upload(&x[..9]).unwrap();
    let (mut mq, mut vq) = (
        w.upload(&x[..10]).unwrap(),
        w.upload(&[0.5f32; 10]).unwrap(),
    );
    let err = w.adamw_step(
        AdamWBuffers {
            params: &mut [&mut p, &mut q],
            grads: &[&g, &short],
            m: &mut [&mut m, &mut mq],
            v: &mut [&mut v, &mut vq],
            weight_decay: &[0.1, 0.1],
            grad_scale: None,
        },
        cfg,
    );
    assert!(err.is_err(), "{err:?}");
    let after: Vec<f32> = w.download(&p).unwrap();
    assert_eq!(before, after);
    // A bf16 parameter is a dtype error.
    let mut h = w.allocate(DType::BF16, 300).unwrap();
    let err = adamw_one((&mut h, &g, &mut m, &mut v), 0.0, None, |bufs| {
        w.adamw_step(bufs, cfg)
    });
    assert!(err.is_err(), "{err:?}");
}

/// `[norm, coef]` of `b.clip_coefficient` over `grads`.
fn clip<B: OptimOps>(b: &B, grads: &[Vec<f32>], max: f32) -> [f32; 2] {
    let g: Vec<B::Buffer> = grads.iter().map(|x| b.upload(x).unwrap()).collect();
    let mut out = b.allocate(DType::F32, 2).unwrap();
    b.clip_coefficient(&g.iter().collect::<Vec<_>>(), max, &mut out)
        .unwrap();
    let o: Vec<f32> = b.download(&out).unwrap();
    [o[0], o[1]]
}

#[test]
fn clip_coefficient_on_the_device_matches_the_cpu() {
    let Some(b) = backend_or_skip("clip_coefficient_on_the_device_matches_the_cpu") else {
        return;
    };
    let mut r = rng("clip_coefficient");
    // Sizes around a sumsq block (16384) and a workgroup, an empty gradient, several lists.
    let sizes = [0, 1, 255, 16384, 16385, 70_001];
    let grads: Vec<Vec<f32>> = sizes.iter().map(|&n| randn(&mut r, n, 3.0)).collect();
    for (list, max) in [(&grads[..], 1.0), (&grads[..1], 1.0), (&grads[2..4], 1e9)] {
        let got = clip(&b, list, max);
        let want = clip(&CpuBackend, list, max);
        // f32 partial sums against the CPU's f64 one: relative error ≤ ~(64 + 8 + 8 + 8)·u
        // (non-negative terms), bounded here by 200·u; the coefficient's division adds 3 ulps.
        let rel = |i: usize, k: f64| close(got[i], want[i] as f64, k * U * want[i].abs() as f64);
        assert!(rel(0, 200.0), "norm {got:?} want {want:?}");
        assert!(rel(1, 210.0), "coef {got:?} want {want:?}");
    }
    // A NaN gradient gives a NaN norm and coefficient; an infinite one an infinite norm and 0.
    let mut bad = grads.clone();
    bad[3][7] = f32::NAN;
    let got = clip(&b, &bad, 1.0);
    assert!(got[0].is_nan() && got[1].is_nan(), "{got:?}");
    bad[3][7] = f32::INFINITY;
    assert_eq!(clip(&b, &bad, 1.0), clip(&CpuBackend, &bad, 1.0));
    assert_eq!(clip(&b, &bad, 1.0), [f32::INFINITY, 0.0]);
    // A finite gradient whose square overflows f32 (1e30): the device's f32 sum gives an
    // infinite norm and a coefficient of 0 where the CPU's f64 sum gives 1e30 and 1e-30 (the
    // documented difference); either way the step is scaled to nothing.
    bad[3][7] = -1e30;
    let (got, want) = (clip(&b, &bad, 1.0), clip(&CpuBackend, &bad, 1.0));
    assert_eq!(got, [f32::INFINITY, 0.0]);
    assert!(want[0] >= 1e30 && want[1] <= 1e-29, "{want:?}");
}
