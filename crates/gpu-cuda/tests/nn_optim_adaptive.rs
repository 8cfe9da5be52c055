//! Schedule-Free AdamW, the parameter lerp and Prodigy: CUDA against the CPU's f64 reference
//! over many tensors of awkward lengths (more than 64 tensors: two launches of Schedule-Free
//! AdamW and the lerp, three of each Prodigy pass), the device-schedule path against the eager
//! one bit for bit, and typed errors. The CPU reference itself is checked against PyTorch's
//! packages in `tensor-ops/tests/optim_reference.rs`.
//!
//! Tolerances (f32 kernel arithmetic, a handful of roundings per value, u = 2^-24, against one
//! rounding of an f64 evaluation): every updated value within `1e-6 · T + 1e-7`, where `T` is
//! the sum of the magnitudes of the terms that form it (so cancellation cannot hide behind a
//! small result): at most ~8 roundings of terms bounded by T give ≤ 8u·T ≈ 4.8e-7·T. Sums over
//! all parameters (Prodigy's) are f64 on both sides; their terms are products of f32 values
//! (exact in f64), so the sums agree to ~1e-15 relative apart from the f32 roundings of `s`,
//! `g·coef` (1 ulp each): the scalars within 1e-6 relative of their terms' magnitudes.

mod common;

use common::*;
use gpu_core::nn::optim::{ProdigyBuffers, ScheduleFreeBuffers};
use gpu_core::nn::optim::{
    ProdigyConfig, ProdigyScalars, ScheduleFreeConfig, StepScalars, PRODIGY_SCHEDULE_LEN,
    SF_SCHEDULE_LEN,
};
use gpu_core::nn::{ElementwiseOps, OptimOps};
use gpu_core::{DType, GpuError};
use rand::rngs::StdRng;
use rand::Rng;

const SF: ScheduleFreeConfig = ScheduleFreeConfig {
    beta2: 0.999,
    eps: 1e-8,
};

const PRODIGY: ProdigyConfig = ProdigyConfig::DEFAULT;

fn random_lists(rng: &mut StdRng, lens: &[usize], scale: f32, shift: f32) -> Vec<Vec<f32>> {
    lens.iter()
        .map(|&n| {
            random_vec(rng, n, scale)
                .iter()
                .map(|x| x + shift)
                .collect()
        })
        .collect()
}

fn random_wd(rng: &mut StdRng, lens: &[usize]) -> Vec<f32> {
    lens.iter()
        .map(|_| [0.0, 0.01, 0.1][rng.random_range(0..3)])
        .collect()
}

/// Uploads lists, runs `f` on mutable/shared buffer lists, downloads the mutable ones.
fn upl<B: OptimOps>(b: &B, xs: &[Vec<f32>]) -> Vec<B::Buffer> {
    xs.iter().map(|x| up(b, x)).collect()
}

fn dl<B: OptimOps>(b: &B, xs: &[B::Buffer]) -> Vec<Vec<f32>> {
    xs.iter().map(|x| down(b, x)).collect()
}

/// Schedule-Free state: y (params), z, v.
#[derive(Clone)]
struct Sf {
    y: Vec<Vec<f32>>,
    z: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

/// Where a step's scalars come from in a test.
#[derive(Clone, Copy, PartialEq)]
enum Src {
    Host,
    Device,
}

impl Src {
    /// The step's scalars: the `host` values, or the buffer `dev` holding the same values.
    fn pick<'a, B>(self, host: &'a [f32], dev: &'a B) -> StepScalars<'a, B> {
        match self {
            Src::Host => StepScalars::Host(host),
            Src::Device => StepScalars::Device(dev),
        }
    }
}

/// One Schedule-Free step on `b`.
fn sf_step<B: OptimOps>(
    b: &B,
    s: &Sf,
    g: &[Vec<f32>],
    wd: &[f32],
    scale: Option<[f32; 2]>,
    sched: [f32; 4],
    src: Src,
) -> Sf {
    let (mut y, mut z, mut v, gb) = (upl(b, &s.y), upl(b, &s.z), upl(b, &s.v), upl(b, g));
    let sc = scale.map(|c| up(b, &c));
    let dev_sched = up(b, &sched);
    let scalars = src.pick(&sched, &dev_sched);
    let mut yr: Vec<_> = y.iter_mut().collect();
    let mut zr: Vec<_> = z.iter_mut().collect();
    let mut vr: Vec<_> = v.iter_mut().collect();
    let gr: Vec<_> = gb.iter().collect();
    b.schedule_free_step(
        ScheduleFreeBuffers {
            params: &mut yr,
            grads: &gr,
            z: &mut zr,
            v: &mut vr,
            weight_decay: wd,
            grad_scale: sc.as_ref(),
        },
        SF,
        scalars,
    )
    .unwrap();
    Sf {
        y: dl(b, &y),
        z: dl(b, &z),
        v: dl(b, &v),
    }
}

/// `|got − want| <= 1e-6·terms + 1e-7` elementwise (NaN, i.e. unwritten, fails).
fn assert_terms(what: &str, got: &[f32], want: &[f32], terms: impl Fn(usize) -> f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (e, (&g, &w)) in got.iter().zip(want).enumerate() {
        let tol = 1e-6 * terms(e) + 1e-7;
        let d = (g as f64 - w as f64).abs();
        assert!(
            d <= tol,
            "{what}[{e}]: got {g}, want {w} (tolerance {tol:e})"
        );
    }
}

fn schedule_free_body<B: OptimOps + ElementwiseOps>(b: &B, dev: &str, rng: &mut StdRng) {
    let lens = multi_tensor_lengths(rng);
    let s0 = Sf {
        y: random_lists(rng, &lens, 1.0, 0.0),
        z: random_lists(rng, &lens, 1.0, 0.0),
        v: random_lists(rng, &lens, 0.01, 0.01),
    };
    let g = random_lists(rng, &lens, 1.0, 0.0);
    let wd = random_wd(rng, &lens);
    // [lr, ckp1, y_lr, bc2]: a first step (ckp1 = 1, a ckp1 ≥ 0.5 lerp) and a later one.
    for (sched, scale) in [
        ([0.01f32, 1.0, -0.01, 0.001], Some([2.0f32, 0.5])),
        ([2.5e-3, 0.05, -2.6e-4, 0.5], None),
    ] {
        let want = sf_step(&CPU, &s0, &g, &wd, scale, sched, Src::Host);
        let got = sf_step(b, &s0, &g, &wd, scale, sched, Src::Host);
        let coef = scale.map_or(1.0, |c| c[1]) as f64;
        let [lr, ckp1, y_lr, _] = sched.map(|x| x as f64);
        for i in 0..lens.len() {
            let what = format!("{dev} ckp1 {ckp1} tensor {i}");
            // |u| <= |g|/(sqrt(v/bc2)) + wd|y|: bounded through the reference's v.
            let u = |e: usize| {
                let denom = (want.v[i][e] as f64 / sched[3] as f64).sqrt();
                (coef * g[i][e] as f64).abs() / denom + wd[i] as f64 * (s0.y[i][e] as f64).abs()
            };
            let (y0, z0) = (&s0.y[i], &s0.z[i]);
            assert_terms(&format!("{what} y"), &got.y[i], &want.y[i], |e| {
                (y0[e] as f64).abs() + (z0[e] as f64).abs() + (y_lr.abs() + lr) * u(e)
            });
            assert_terms(&format!("{what} z"), &got.z[i], &want.z[i], |e| {
                (z0[e] as f64).abs() + lr * u(e)
            });
            assert_close(&format!("{what} v"), &got.v[i], &want.v[i], 1e-6, 0.0);
        }
        // The device schedule gives the eager step's bits.
        let sched_got = sf_step(b, &s0, &g, &wd, scale, sched, Src::Device);
        for i in 0..lens.len() {
            assert_eq!(
                bits(&sched_got.y[i]),
                bits(&got.y[i]),
                "{dev} scheduled y[{i}]"
            );
            assert_eq!(
                bits(&sched_got.z[i]),
                bits(&got.z[i]),
                "{dev} scheduled z[{i}]"
            );
            assert_eq!(
                bits(&sched_got.v[i]),
                bits(&got.v[i]),
                "{dev} scheduled v[{i}]"
            );
        }
    }
    // The lerp (eval/train swap), both branches of torch.lerp.
    for w in [1.0 - 1.0 / 0.9f32, 0.75] {
        let mut want = upl(&CPU, &s0.y);
        let mut got = upl(b, &s0.y);
        let (zc, zb) = (upl(&CPU, &s0.z), upl(b, &s0.z));
        let mut wr: Vec<_> = want.iter_mut().collect();
        CPU.lerp_params(&mut wr, &zc.iter().collect::<Vec<_>>(), w)
            .unwrap();
        let mut gr: Vec<_> = got.iter_mut().collect();
        b.lerp_params(&mut gr, &zb.iter().collect::<Vec<_>>(), w)
            .unwrap();
        for i in 0..lens.len() {
            let (y0, z0) = (&s0.y[i], &s0.z[i]);
            assert_terms(
                &format!("{dev} lerp {w} tensor {i}"),
                &down(b, &got[i]),
                &down(&CPU, &want[i]),
                |e| (y0[e] as f64).abs() + (z0[e] as f64).abs(),
            );
        }
    }
}

every_device_test!(gpu_schedule_free_matches_cpu, schedule_free_body);

/// Prodigy state: p, p0, s, m, v and the scalars.
#[derive(Clone)]
struct Pd {
    p: Vec<Vec<f32>>,
    p0: Vec<Vec<f32>>,
    s: Vec<Vec<f32>>,
    m: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    sc: ProdigyScalars,
}

/// One Prodigy step on `b` from state `st`, with the gradients `g`, weight decays `wd` and clip
/// `scale`, the config `cfg`, and the learning rate `lr` read from `src`.
fn pd_step<B: OptimOps>(
    b: &B,
    st: &Pd,
    (g, wd, scale): (&[Vec<f32>], &[f32], Option<[f32; 2]>),
    (cfg, lr, src): (ProdigyConfig, f32, Src),
) -> Pd {
    let (mut p, p0, gb) = (upl(b, &st.p), upl(b, &st.p0), upl(b, g));
    let (mut s, mut m, mut v) = (upl(b, &st.s), upl(b, &st.m), upl(b, &st.v));
    let mut sc = up(b, &st.sc.to_words());
    let sb = scale.map(|c| up(b, &c));
    let lr_buf = up(b, &[lr]);
    let lr_arg = [lr];
    let lr_s = src.pick(&lr_arg, &lr_buf);
    let mut pr: Vec<_> = p.iter_mut().collect();
    let mut sr: Vec<_> = s.iter_mut().collect();
    let mut mr: Vec<_> = m.iter_mut().collect();
    let mut vr: Vec<_> = v.iter_mut().collect();
    let (gr, p0r): (Vec<_>, Vec<_>) = (gb.iter().collect(), p0.iter().collect());
    b.prodigy_step(
        ProdigyBuffers {
            params: &mut pr,
            grads: &gr,
            p0: &p0r,
            s: &mut sr,
            m: &mut mr,
            v: &mut vr,
            weight_decay: wd,
            grad_scale: sb.as_ref(),
        },
        cfg,
        lr_s,
        &mut sc,
    )
    .unwrap();
    Pd {
        p: dl(b, &p),
        p0: st.p0.clone(),
        s: dl(b, &s),
        m: dl(b, &m),
        v: dl(b, &v),
        sc: ProdigyScalars::from_words(&down(b, &sc)).unwrap(),
    }
}

fn random_prodigy(rng: &mut StdRng, lens: &[usize]) -> Pd {
    let p = random_lists(rng, lens, 1.0, 0.0);
    let p0 = p
        .iter()
        .map(|x| {
            x.iter()
                .map(|v| v + rng.random_range(-0.01..0.01))
                .collect()
        })
        .collect();
    Pd {
        p,
        p0,
        s: random_lists(rng, lens, 1e-3, 0.0),
        m: random_lists(rng, lens, 1e-4, 0.0),
        v: random_lists(rng, lens, 1e-8, 2e-8),
        sc: ProdigyScalars {
            d: 2e-4,
            d_max: 3e-4,
            d_numerator: 5e-5,
            k: 3.0,
            ..ProdigyScalars::initial(1e-6)
        },
    }
}

fn assert_scalar(what: &str, got: f64, want: f64, terms: f64) {
    assert!(
        (got - want).abs() <= 1e-6 * terms,
        "{what}: got {got}, want {want} (terms {terms:e})"
    );
}

fn prodigy_body<B: OptimOps + ElementwiseOps>(b: &B, dev: &str, rng: &mut StdRng) {
    let lens = multi_tensor_lengths(rng);
    let st = random_prodigy(rng, &lens);
    let g = random_lists(rng, &lens, 1.0, 0.0);
    let wd = random_wd(rng, &lens);
    let coupled = ProdigyConfig {
        decouple: false,
        use_bias_correction: true,
        safeguard_warmup: true,
        growth_rate: 1.5,
        ..PRODIGY
    };
    let no_m = ProdigyConfig {
        beta1: 0.0,
        ..PRODIGY
    };
    for (cfg, scale, lr) in [
        (PRODIGY, Some([3.0f32, 0.25]), 1.0f32),
        (coupled, None, 0.5),
        (no_m, None, 1.0),
    ] {
        let what = format!("{dev} decouple {} beta1 {}", cfg.decouple, cfg.beta1);
        let want = pd_step(&CPU, &st, (&g, &wd, scale), (cfg, lr, Src::Host));
        let got = pd_step(b, &st, (&g, &wd, scale), (cfg, lr, Src::Host));
        assert_eq!(want.sc.apply, 1.0, "{what}: the step updates");
        let (w, gs) = (want.sc, got.sc);
        assert_scalar(&format!("{what} d"), gs.d, w.d, w.d.abs());
        assert_scalar(&format!("{what} d_denom"), gs.d_denom, w.d_denom, w.d_denom);
        assert_scalar(&format!("{what} dlr"), gs.dlr, w.dlr, w.dlr);
        assert_eq!((gs.k, gs.apply), (w.k, w.apply), "{what} k, apply");
        let coef = scale.map_or(1.0, |c| c[1]) as f64;
        let d = st.sc.d;
        let (dlr, dn) = (w.dlr, w.d);
        // The numerator's terms: β3·|num| + (d/d0)·dlr·Σ|g|·|p0 − p|.
        let mut dot_terms = 0.0;
        for i in 0..lens.len() {
            let it = g[i].iter().zip(&st.p[i]).zip(&st.p0[i]);
            for ((&gv, &pv), &p0v) in it {
                let ga = (coef * gv as f64).abs() + wd[i] as f64 * (pv as f64).abs();
                dot_terms += ga * (p0v as f64 - pv as f64).abs();
            }
        }
        let num_terms =
            cfg.beta3 as f64 * st.sc.d_numerator.abs() + (d / cfg.d0 as f64) * dlr * dot_terms;
        assert_scalar(
            &format!("{what} numerator"),
            gs.d_numerator,
            w.d_numerator,
            num_terms,
        );
        for i in 0..lens.len() {
            let t = format!("{what} tensor {i}");
            let ga =
                |e: usize| coef * (g[i][e] as f64).abs() + wd[i] as f64 * (st.p[i][e] as f64).abs();
            let sc_coef = (d / cfg.d0 as f64) * if cfg.safeguard_warmup { d } else { dlr };
            assert_terms(&format!("{t} m"), &got.m[i], &want.m[i], |e| {
                cfg.beta1 as f64 * (st.m[i][e] as f64).abs() + d * ga(e)
            });
            assert_terms(&format!("{t} s"), &got.s[i], &want.s[i], |e| {
                cfg.beta3 as f64 * (st.s[i][e] as f64).abs() + sc_coef * ga(e)
            });
            assert_close(&format!("{t} v"), &got.v[i], &want.v[i], 1e-6, 1e-30);
            assert_terms(&format!("{t} p"), &got.p[i], &want.p[i], |e| {
                let denom = (want.v[i][e] as f64).sqrt() + dn * cfg.eps as f64;
                let upd = dlr * ((want.m[i][e] as f64).abs() + dn * ga(e)) / denom;
                (st.p[i][e] as f64).abs() * (1.0 + wd[i] as f64 * dlr) + upd
            });
        }
        // The device learning rate gives the eager step's bits.
        let sched = pd_step(b, &st, (&g, &wd, scale), (cfg, lr, Src::Device));
        assert_eq!(sched.sc, got.sc, "{what} scheduled scalars");
        for i in 0..lens.len() {
            for (n, x, y) in [
                ("p", &sched.p[i], &got.p[i]),
                ("s", &sched.s[i], &got.s[i]),
                ("m", &sched.m[i], &got.m[i]),
                ("v", &sched.v[i], &got.v[i]),
            ] {
                assert_eq!(bits(x), bits(y), "{what} scheduled {n}[{i}]");
            }
        }
    }
    // lr 0 is a no-op (the package skips everything); so is a step whose Σ|s| is 0.
    let still = pd_step(b, &st, (&g, &wd, None), (PRODIGY, 0.0, Src::Host));
    assert_eq!(
        (still.p.clone(), still.sc.apply),
        (st.p.clone(), 0.0),
        "{dev} lr 0"
    );
    assert_eq!(still.m, st.m, "{dev} lr 0 moments");
    let zero = Pd {
        s: lens.iter().map(|&n| vec![0.0; n]).collect(),
        ..st.clone()
    };
    let zg: Vec<Vec<f32>> = lens.iter().map(|&n| vec![0.0; n]).collect();
    let none = pd_step(b, &zero, (&zg, &wd, None), (PRODIGY, 1.0, Src::Host));
    assert_eq!(
        (none.p, none.sc.k),
        (zero.p, zero.sc.k),
        "{dev} zero gradients"
    );
}

every_device_test!(gpu_prodigy_matches_cpu, prodigy_body);

fn errors_body<B: OptimOps + ElementwiseOps>(b: &B, dev: &str, _rng: &mut StdRng) {
    let f = |n: usize| b.allocate(DType::F32, n).unwrap();
    let shape = |r: gpu_core::Result<()>| matches!(r, Err(GpuError::ShapeMismatch { .. }));
    let invalid = |r: gpu_core::Result<()>| matches!(r, Err(GpuError::InvalidArgument { .. }));
    let (mut y, g, mut z, mut v) = (f(5), f(5), f(5), f(5));
    let short = f(4);
    let sched = [0.1f32, 1.0, -0.1, 0.5];
    let mut sf =
        |g: &B::Buffer, wd: &[f32], cfg: ScheduleFreeConfig, s: StepScalars<'_, B::Buffer>| {
            b.schedule_free_step(
                ScheduleFreeBuffers {
                    params: &mut [&mut y],
                    grads: &[g],
                    z: &mut [&mut z],
                    v: &mut [&mut v],
                    weight_decay: wd,
                    grad_scale: None,
                },
                cfg,
                s,
            )
        };
    assert!(
        sf(&g, &[0.0], SF, StepScalars::Host(&sched)).is_ok(),
        "{dev}"
    );
    assert!(
        shape(sf(&short, &[0.0], SF, StepScalars::Host(&sched))),
        "{dev} g length"
    );
    assert!(
        shape(sf(&g, &[], SF, StepScalars::Host(&sched))),
        "{dev} wd list"
    );
    assert!(
        invalid(sf(&g, &[-1.0], SF, StepScalars::Host(&sched))),
        "{dev} wd < 0"
    );
    assert!(
        shape(sf(&g, &[0.0], SF, StepScalars::Host(&sched[..3]))),
        "{dev} schedule"
    );
    let bad_sched = b.upload(&[1u32, 2, 3, 4]).unwrap();
    assert!(
        shape(sf(&g, &[0.0], SF, StepScalars::Device(&bad_sched))),
        "{dev} u32 schedule"
    );
    let bad = ScheduleFreeConfig { beta2: 1.0, ..SF };
    assert!(
        invalid(sf(&g, &[0.0], bad, StepScalars::Host(&sched))),
        "{dev} beta2 1"
    );
    let r = b.lerp_params(&mut [&mut y], &[&g], f32::NAN);
    assert!(invalid(r), "{dev} lerp weight NaN");
    assert!(
        shape(b.lerp_params(&mut [&mut y], &[&short], 0.5)),
        "{dev} lerp length"
    );
    assert_eq!(SF_SCHEDULE_LEN, 4);

    let (mut s, mut m, p0) = (f(5), f(5), f(5));
    let mut sc = up(b, &ProdigyScalars::initial(1e-6).to_words());
    let mut wrong_sc = f(15);
    let lr = [1.0f32];
    let mut pd =
        |sc: &mut B::Buffer, cfg: ProdigyConfig, lr: StepScalars<'_, B::Buffer>, p0: &B::Buffer| {
            b.prodigy_step(
                ProdigyBuffers {
                    params: &mut [&mut y],
                    grads: &[&g],
                    p0: &[p0],
                    s: &mut [&mut s],
                    m: &mut [&mut m],
                    v: &mut [&mut v],
                    weight_decay: &[0.0],
                    grad_scale: None,
                },
                cfg,
                lr,
                sc,
            )
        };
    assert!(
        pd(&mut sc, PRODIGY, StepScalars::Host(&lr), &p0).is_ok(),
        "{dev}"
    );
    assert!(
        shape(pd(&mut wrong_sc, PRODIGY, StepScalars::Host(&lr), &p0)),
        "{dev} scalars"
    );
    assert!(
        shape(pd(&mut sc, PRODIGY, StepScalars::Host(&[]), &p0)),
        "{dev} lr length"
    );
    assert!(
        shape(pd(&mut sc, PRODIGY, StepScalars::Host(&lr), &short)),
        "{dev} p0 length"
    );
    assert_eq!(PRODIGY_SCHEDULE_LEN, 1);
    for bad in [
        ProdigyConfig { d0: 0.0, ..PRODIGY },
        ProdigyConfig {
            eps: 0.0,
            ..PRODIGY
        },
        ProdigyConfig {
            beta3: 1.5,
            ..PRODIGY
        },
        ProdigyConfig {
            growth_rate: f32::NAN,
            ..PRODIGY
        },
        ProdigyConfig {
            beta1: 1.0,
            ..PRODIGY
        },
    ] {
        assert!(
            invalid(pd(&mut sc, bad, StepScalars::Host(&lr), &p0)),
            "{dev} {bad:?}"
        );
    }
    // Empty lists: nothing to update (Σ|s| = 0), the scalars keep d.
    let mut sc0 = up(b, &ProdigyScalars::initial(1e-6).to_words());
    b.prodigy_step(
        ProdigyBuffers {
            params: &mut [],
            grads: &[],
            p0: &[],
            s: &mut [],
            m: &mut [],
            v: &mut [],
            weight_decay: &[],
            grad_scale: None,
        },
        PRODIGY,
        StepScalars::Host(&lr),
        &mut sc0,
    )
    .unwrap();
    let after = ProdigyScalars::from_words(&down(b, &sc0)).unwrap();
    assert_eq!(
        (after.d, after.k, after.apply),
        (1e-6f32 as f64, 0.0, 0.0),
        "{dev} empty"
    );
}

every_device_test!(gpu_adaptive_optimisers_reject_bad_arguments, errors_body);
