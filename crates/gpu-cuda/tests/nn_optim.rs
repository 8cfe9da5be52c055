//! Optimiser ops: the CPU AdamW against a hand-computed two-step example, the clip coefficient
//! against hand values, CUDA against CPU over many tensors of awkward lengths (more than 64
//! tensors: two launches), by-value struct kernel arguments, and typed errors.
//!
//! Tolerances (f32 kernel arithmetic against the CPU's f64-per-element reference): norm and
//! coefficient 1e-6 relative; p 1e-6 of max(|p before|, |update|) + 1e-7; m 1e-5 relative + 2e-8
//! (m can cancel to near zero from terms near 0.1); v 1e-6 relative.

mod common;

use common::*;
use gpu_core::nn::optim::AdamWBuffers;
use gpu_core::nn::ElementwiseOps;
use gpu_core::nn::{AdamWConfig, OptimOps};
use gpu_core::testing::{adamw_config, adamw_one};
use gpu_core::{Backend, DType, GpuError};
use gpu_cuda::testing::backend_or_skip;
use gpu_cuda::{KernelArg, LaunchConfig};
use rand::rngs::StdRng;
use rand::Rng;

const CFG: AdamWConfig = adamw_config(0.1, 1);

/// Host copies of one optimiser state.
#[derive(Clone)]
struct State {
    p: Vec<Vec<f32>>,
    m: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

/// One AdamW step on backend `b`; returns the new state.
fn adamw<B: OptimOps + ElementwiseOps>(
    b: &B,
    s: &State,
    grads: &[Vec<f32>],
    wd: &[f32],
    grad_scale: Option<[f32; 2]>,
    cfg: AdamWConfig,
) -> State {
    let upl = |xs: &[Vec<f32>]| xs.iter().map(|x| up(b, x)).collect::<Vec<_>>();
    let (mut p, mut m, mut v, g) = (upl(&s.p), upl(&s.m), upl(&s.v), upl(grads));
    let scale = grad_scale.map(|c| up(b, &c));
    let mut pr: Vec<&mut B::Buffer> = p.iter_mut().collect();
    let mut mr: Vec<&mut B::Buffer> = m.iter_mut().collect();
    let mut vr: Vec<&mut B::Buffer> = v.iter_mut().collect();
    let gr: Vec<&B::Buffer> = g.iter().collect();
    b.adamw_step(
        AdamWBuffers {
            params: &mut pr,
            grads: &gr,
            m: &mut mr,
            v: &mut vr,
            weight_decay: wd,
            grad_scale: scale.as_ref(),
        },
        cfg,
    )
    .unwrap();
    let dl = |xs: &[B::Buffer]| xs.iter().map(|x| down(b, x)).collect();
    State {
        p: dl(&p),
        m: dl(&m),
        v: dl(&v),
    }
}

/// `[norm, coefficient]` from backend `b`, the output poisoned first.
fn clip<B: OptimOps + ElementwiseOps>(b: &B, grads: &[Vec<f32>], max_norm: f32) -> Vec<f32> {
    let g: Vec<B::Buffer> = grads.iter().map(|x| up(b, x)).collect();
    let gr: Vec<&B::Buffer> = g.iter().collect();
    let mut out = poisoned(b, 2);
    b.clip_coefficient(&gr, max_norm, &mut out).unwrap();
    down(b, &out)
}

#[test]
fn cpu_adamw_matches_a_hand_computed_two_step_example() {
    // Hyper-parameters exact in f32 (binary fractions), so the hand values are exact up to eps:
    // lr 0.5, betas (0.5, 0.75), eps 1e-8, wd 0.25 (decay 1 − 0.5·0.25 = 0.875);
    // p = [1, −0.5]; g1 = [0.5, 0.25]; g2 = [−0.5, 1].
    // Step 1 (bc1 = 0.5, bc2 = 0.25, step size lr/bc1 = 1):
    //   e0: p = 0.875; m = 0.25; v = 0.25·0.25 = 0.0625; denom = sqrt(0.0625)/sqrt(0.25) + eps
    //       = 0.5 + 1e-8; p = 0.875 − 0.25/0.50000001 = 0.37500001.
    //   e1: p = −0.4375; m = 0.125; v = 0.015625; denom = 0.25 + 1e-8; p = −0.93749998.
    // Step 2 (bc1 = 0.75, bc2 = 0.4375, step size 2/3):
    //   e0: p = 0.37500001·0.875 = 0.328125009; m = 0.125 − 0.25 = −0.125;
    //       v = 0.75·0.0625 + 0.25·0.25 = 0.109375; denom = sqrt(0.109375/0.4375) + eps = 0.5 + eps;
    //       p = 0.328125009 + (2/3)·0.125/0.50000001 = 0.494791672.
    //   e1: p = −0.820312483; m = 0.0625 + 0.5 = 0.5625; v = 0.01171875 + 0.25 = 0.26171875;
    //       denom = sqrt(0.26171875/0.4375) = 0.773443137; p = −0.820312483 − 0.375/0.773443137
    //       = −1.305157428.
    let cfg = AdamWConfig {
        lr: 0.5,
        beta1: 0.5,
        beta2: 0.75,
        eps: 1e-8,
        step: 1,
    };
    let s0 = State {
        p: vec![vec![1.0, -0.5]],
        m: vec![vec![0.0, 0.0]],
        v: vec![vec![0.0, 0.0]],
    };
    let s1 = adamw(&CPU, &s0, &[vec![0.5, 0.25]], &[0.25], None, cfg);
    let close = |got: f32, want: f64| (got as f64 - want).abs() <= 1e-7 * want.abs();
    assert!(close(s1.p[0][0], 0.37500001), "{:?}", s1.p);
    assert!(close(s1.p[0][1], -0.93749998), "{:?}", s1.p);
    assert_eq!(
        (s1.m[0].clone(), s1.v[0].clone()),
        (vec![0.25, 0.125], vec![0.0625, 0.015625])
    );
    let s2 = adamw(
        &CPU,
        &s1,
        &[vec![-0.5, 1.0]],
        &[0.25],
        None,
        AdamWConfig { step: 2, ..cfg },
    );
    assert!(close(s2.p[0][0], 0.494791672), "{:?}", s2.p);
    assert!(close(s2.p[0][1], -1.305157428), "{:?}", s2.p);
    assert_eq!(s2.m[0], vec![-0.125, 0.5625]);
    assert_eq!(s2.v[0], vec![0.109375, 0.26171875]);
    // grad_scale multiplies g before everything else: g·2 with coefficient 0.5 is the same step.
    let half = adamw(&CPU, &s0, &[vec![1.0, 0.5]], &[0.25], Some([9.0, 0.5]), cfg);
    assert_eq!(half.p, s1.p);
}

#[test]
fn cpu_clip_coefficient_hand_values() {
    let grads = vec![vec![3.0, 4.0], vec![], vec![12.0]];
    let c = clip(&CPU, &grads, 1.0);
    assert_eq!(c[0], 13.0);
    assert_eq!(c[1], (1.0 / (13.0 + 1e-6)) as f32);
    assert_eq!(clip(&CPU, &grads, 100.0), vec![13.0, 1.0]);
    assert_eq!(clip(&CPU, &[], 1.0), vec![0.0, 1.0]);
    let inf = clip(&CPU, &[vec![f32::INFINITY]], 1.0);
    assert_eq!(inf, vec![f32::INFINITY, 0.0]);
    let nan = clip(&CPU, &[vec![1.0, f32::NAN]], 1.0);
    assert!(nan[0].is_nan() && nan[1].is_nan());
}

fn random_state(rng: &mut StdRng, lens: &[usize]) -> (State, Vec<Vec<f32>>, Vec<f32>) {
    let s = State {
        p: lens.iter().map(|&n| random_vec(rng, n, 1.0)).collect(),
        m: lens.iter().map(|&n| random_vec(rng, n, 0.1)).collect(),
        v: lens
            .iter()
            .map(|&n| random_vec(rng, n, 0.01).iter().map(|x| x + 0.01).collect())
            .collect(),
    };
    let g = lens.iter().map(|&n| random_vec(rng, n, 1.0)).collect();
    let wd = lens
        .iter()
        .map(|_| [0.0, 0.01, 0.1][rng.random_range(0..3)])
        .collect();
    (s, g, wd)
}

/// `got` against `want` after a step from `before` with gradients `g` (times the clip coefficient
/// `coef`): p within 1e-6 of the larger of its old value and its update (the update is several
/// f32 roundings deep and can cancel against p) plus 1e-7; v within 1e-6 relative (its terms are
/// all non-negative). m = β1·m + (1−β1)·coef·g can cancel, so it is bounded by the size of its
/// terms, T = β1·|m| + (1−β1)·|coef·g|: the kernel rounds coef·g, the product and the sum, and
/// the f64 reference rounds once, so |Δm| <= 4u·T (u = 2^-24); the check allows 8u·T.
/// Unwritten (NaN) elements fail.
fn assert_state(what: &str, got: &State, want: &State, before: &State, g: &[Vec<f32>], coef: f32) {
    const U: f64 = 1.0 / (1u64 << 24) as f64;
    let b1 = CFG.beta1 as f64;
    assert_eq!(g.len(), want.p.len(), "{what}: one gradient per tensor");
    for (i, gi) in g.iter().enumerate() {
        let (gp, wp, bp) = (&got.p[i], &want.p[i], &before.p[i]);
        assert_eq!(gp.len(), wp.len(), "{what} p[{i}] length");
        for e in 0..wp.len() {
            let (gv, wv, bv) = (gp[e] as f64, wp[e] as f64, bp[e] as f64);
            let tol = 1e-6 * (bv.abs() + (wv - bv).abs()) + 1e-7;
            assert!(
                (gv - wv).abs() <= tol,
                "{what} p[{i}][{e}]: got {gv}, want {wv} (before {bv})"
            );
            let (gm, wm) = (got.m[i][e] as f64, want.m[i][e] as f64);
            let terms =
                b1 * (before.m[i][e] as f64).abs() + (1.0 - b1) * (coef * gi[e]).abs() as f64;
            assert!(
                (gm - wm).abs() <= 8.0 * U * terms,
                "{what} m[{i}][{e}]: got {gm}, want {wm}, terms {terms:e}"
            );
        }
        assert_close(&format!("{what} v[{i}]"), &got.v[i], &want.v[i], 1e-6, 0.0);
    }
}

fn optim_body<B: OptimOps + ElementwiseOps>(b: &B, dev: &str, rng: &mut StdRng) {
    let lens = multi_tensor_lengths(rng);
    let (s0, g1, wd) = random_state(rng, &lens);
    // Clip coefficient over all gradients, a coefficient below 1 and one clamped to 1.
    for max_norm in [1.0f32, 1e6] {
        let (got, want) = (clip(b, &g1, max_norm), clip(&CPU, &g1, max_norm));
        assert_close(&format!("{dev} clip {max_norm}"), &got, &want, 1e-6, 0.0);
    }
    assert_eq!(clip(b, &[vec![], vec![]], 1.0), vec![0.0, 1.0], "{dev}");
    // Two steps (bias corrections of steps 1 and 2), the first with a clip coefficient.
    let coef = clip(&CPU, &g1, 1.0);
    let scale = Some([coef[0], coef[1]]);
    let want1 = adamw(&CPU, &s0, &g1, &wd, scale, CFG);
    let got1 = adamw(b, &s0, &g1, &wd, scale, CFG);
    assert_state(&format!("{dev} step 1"), &got1, &want1, &s0, &g1, coef[1]);
    let g2: Vec<Vec<f32>> = lens.iter().map(|&n| random_vec(rng, n, 1.0)).collect();
    let cfg2 = AdamWConfig {
        step: 2,
        lr: 3e-3,
        ..CFG
    };
    let want2 = adamw(&CPU, &want1, &g2, &wd, None, cfg2);
    let got2 = adamw(b, &want1, &g2, &wd, None, cfg2);
    assert_state(&format!("{dev} step 2"), &got2, &want2, &want1, &g2, 1.0);
}

every_device_test!(gpu_optim_matches_cpu, optim_body);

fn errors_body<B: OptimOps + ElementwiseOps>(b: &B, dev: &str, _rng: &mut StdRng) {
    let f = |n: usize| b.allocate(DType::F32, n).unwrap();
    let (mut p, g, mut m, mut v) = (f(5), f(5), f(5), f(5));
    let (mut p2, g2, mut m2, mut v2) = (f(3), f(3), f(3), f(4));
    let bad_g = b.allocate(DType::U32, 3).unwrap();
    let mut run = |p2: &mut B::Buffer,
                   g2: &B::Buffer,
                   v2: &mut B::Buffer,
                   ngrads: usize,
                   wd: &[f32],
                   scale: Option<&B::Buffer>,
                   cfg: AdamWConfig| {
        let gs = [&g, g2];
        b.adamw_step(
            AdamWBuffers {
                params: &mut [&mut p, p2],
                grads: &gs[..ngrads],
                m: &mut [&mut m, &mut m2],
                v: &mut [&mut v, v2],
                weight_decay: wd,
                grad_scale: scale,
            },
            cfg,
        )
    };
    let mut v_ok = f(3);
    assert!(run(&mut p2, &g2, &mut v_ok, 2, &[0.0, 0.1], None, CFG).is_ok());
    let shape = |r: gpu_core::Result<()>| matches!(r, Err(GpuError::ShapeMismatch { .. }));
    let invalid = |r: gpu_core::Result<()>| matches!(r, Err(GpuError::InvalidArgument { .. }));
    assert!(
        shape(run(&mut p2, &g2, &mut v2, 2, &[0.0, 0.1], None, CFG)),
        "{dev} v[1] length"
    );
    assert!(
        shape(run(&mut p2, &g2, &mut v_ok, 1, &[0.0, 0.1], None, CFG)),
        "{dev} grads list"
    );
    assert!(
        shape(run(&mut p2, &g2, &mut v_ok, 2, &[0.0], None, CFG)),
        "{dev} wd list"
    );
    let r = run(&mut p2, &bad_g, &mut v_ok, 2, &[0.0, 0.1], None, CFG);
    assert!(
        matches!(r, Err(GpuError::UnsupportedDType { .. })),
        "{dev}: {r:?}"
    );
    assert!(
        invalid(run(&mut p2, &g2, &mut v_ok, 2, &[0.0, -0.1], None, CFG)),
        "{dev} wd < 0"
    );
    let long_scale = f(3);
    let r = run(
        &mut p2,
        &g2,
        &mut v_ok,
        2,
        &[0.0, 0.1],
        Some(&long_scale),
        CFG,
    );
    assert!(shape(r), "{dev} grad_scale length");
    for bad in [
        AdamWConfig { beta1: 1.0, ..CFG },
        AdamWConfig { beta2: -0.1, ..CFG },
        AdamWConfig { step: 0, ..CFG },
        AdamWConfig {
            lr: f32::NAN,
            ..CFG
        },
        AdamWConfig { eps: -1.0, ..CFG },
    ] {
        let r = run(&mut p2, &g2, &mut v_ok, 2, &[0.0, 0.1], None, bad);
        assert!(invalid(r), "{dev} {bad:?}");
    }
    // Empty lists are a no-op.
    b.adamw_step(
        AdamWBuffers {
            params: &mut [],
            grads: &[],
            m: &mut [],
            v: &mut [],
            weight_decay: &[],
            grad_scale: None,
        },
        CFG,
    )
    .unwrap();

    let mut out = f(2);
    let r = b.clip_coefficient(&[&g], 0.0, &mut out);
    assert!(invalid(r), "{dev} max_norm 0");
    let r = b.clip_coefficient(&[&g], f32::INFINITY, &mut out);
    assert!(invalid(r), "{dev} max_norm inf");
    let mut out3 = f(3);
    assert!(shape(b.clip_coefficient(&[&g], 1.0, &mut out3)), "{dev}");
    let r = b.clip_coefficient(&[&g, &bad_g], 1.0, &mut out);
    assert!(
        matches!(r, Err(GpuError::UnsupportedDType { .. })),
        "{dev}: {r:?}"
    );
}

every_device_test!(gpu_optim_rejects_bad_arguments, errors_body);

const TAKE_STRUCT: &str = r#"
struct S { float a[3]; int k; double x; };
extern "C" __global__ void take_struct(S s, float* out) {
    if (threadIdx.x < 3) out[threadIdx.x] = s.a[threadIdx.x] * s.k;
    if (threadIdx.x == 3) out[3] = (float)s.x;
}
"#;

#[test]
fn gpu_by_value_struct_arguments() {
    // KernelArg::Bytes: a 24-byte struct by value through the raw driver launcher; a kernel
    // loaded through cudarc rejects it with a typed error.
    let gpu = skip_unless!(backend_or_skip("gpu_by_value_struct_arguments"));
    let compiled = gpu.compile_kernel("take_struct", TAKE_STRUCT).unwrap();
    let raw = gpu
        .load_kernel_image(compiled.ptx().as_bytes(), "take_struct")
        .unwrap();
    let mut bytes = Vec::new();
    for a in [1.5f32, -2.0, 4.0] {
        bytes.extend(a.to_le_bytes());
    }
    bytes.extend(3i32.to_le_bytes());
    bytes.extend(0.25f64.to_le_bytes());
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (32, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut out = poisoned(&gpu, 4);
    let args = [KernelArg::Bytes(bytes.clone()), (&mut out).into()];
    // SAFETY: take_struct(S s, float* out) with S = {float[3], int, double} (24 bytes, as
    // built above); out holds 4 f32 and threads 0..4 write one each.
    unsafe { gpu.run_kernel(&raw, cfg, &args) }.unwrap();
    assert_eq!(down(&gpu, &out), vec![4.5, -6.0, 12.0, 0.25]);
    // SAFETY: as above (the launch is refused before reaching the driver).
    let r = unsafe { gpu.run_kernel(&compiled, cfg, &args) };
    assert!(matches!(r, Err(GpuError::InvalidArgument { .. })), "{r:?}");
    assert!(KernelArg::Bytes(bytes).is_bytes() && !KernelArg::U32(1).is_bytes());
    let _ = gpu.synchronize();
}

/// The step a CUDA graph records (`adamw_step_scheduled`, scalars read on the device) gives the
/// eager CUDA step's bits when its schedule is `adamw_schedule(cfg)` (the eager step is checked
/// against the CPU reference above): both round the same f64 scalars to f32, and the kernel forms
/// 1 − lr·wd in f64 as the host does. Random states, every weight decay of `random_state`, with
/// and without a clip coefficient, steps 1 and 1000.
#[test]
fn gpu_scheduled_adamw_gives_the_eager_steps_bits() {
    let (gpu, mut r) = skip_unless!(gpu_and_rng(
        "gpu_scheduled_adamw_gives_the_eager_steps_bits"
    ));
    let lens = multi_tensor_lengths(&mut r);
    let (s0, g, wd) = random_state(&mut r, &lens);
    for (cfg, scale) in [
        (CFG, Some([3.5f32, 0.25])),
        (
            AdamWConfig {
                lr: 3e-4,
                step: 1000,
                ..CFG
            },
            None,
        ),
    ] {
        let want = adamw(&gpu, &s0, &g, &wd, scale, cfg);
        let upl = |xs: &[Vec<f32>]| xs.iter().map(|x| up(&gpu, x)).collect::<Vec<_>>();
        let (mut p, mut m, mut v, gb) = (upl(&s0.p), upl(&s0.m), upl(&s0.v), upl(&g));
        let sc = scale.map(|c| up(&gpu, &c));
        let sched = up(&gpu, &gpu_core::nn::optim::adamw_schedule(cfg));
        let mut pr: Vec<_> = p.iter_mut().collect();
        let mut mr: Vec<_> = m.iter_mut().collect();
        let mut vr: Vec<_> = v.iter_mut().collect();
        let gr: Vec<_> = gb.iter().collect();
        // cfg's lr and step are not used: a different (valid) pair must change nothing.
        let other = AdamWConfig {
            lr: 0.0,
            step: 7,
            ..cfg
        };
        let bufs = AdamWBuffers {
            params: &mut pr,
            grads: &gr,
            m: &mut mr,
            v: &mut vr,
            weight_decay: &wd,
            grad_scale: sc.as_ref(),
        };
        gpu.adamw_step_scheduled(bufs, other, &sched).unwrap();
        for i in 0..lens.len() {
            let what = format!("step {} tensor {i}", cfg.step);
            assert_eq!(bits(&down(&gpu, &p[i])), bits(&want.p[i]), "{what} p");
            assert_eq!(bits(&down(&gpu, &m[i])), bits(&want.m[i]), "{what} m");
            assert_eq!(bits(&down(&gpu, &v[i])), bits(&want.v[i]), "{what} v");
        }
    }
    // A schedule of the wrong length or dtype is a typed error, and nothing is written.
    let mut p = up(&gpu, &[1.0f32; 4]);
    let (gb, mut m, mut v) = (
        up(&gpu, &[1.0f32; 4]),
        up(&gpu, &[0.0f32; 4]),
        up(&gpu, &[0.0f32; 4]),
    );
    for bad in [up(&gpu, &[0.1f32, 1.0]), gpu.upload(&[1u32, 2, 3]).unwrap()] {
        let e = adamw_one((&mut p, &gb, &mut m, &mut v), 0.0, None, |bufs| {
            gpu.adamw_step_scheduled(bufs, CFG, &bad)
        })
        .unwrap_err();
        assert!(e.to_string().contains("schedule of 3 f32"), "{e}");
    }
    assert_eq!(down(&gpu, &p), vec![1.0; 4]);
}
