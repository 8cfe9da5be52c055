//! Schedule-Free AdamW and Prodigy under bad hyper-parameters, bad learning rates, missing,
//! misshapen or aliased gradients, bad schedules and non-finite gradients, on every device.

use super::devices;
use tensor_ops::optim::{Optimizer, Prodigy, ProdigyParams, ScheduleFreeAdamW, ScheduleFreeParams};
use tensor_ops::{Device, GpuError, Gradients, Tensor};

/// Two parameters with fixed values on `dev`.
fn params(dev: Device) -> Vec<Tensor> {
    let a = Tensor::from_vec(vec![0.5f32, -1.0, 2.0, 0.25], &[4], dev).unwrap();
    let b = Tensor::from_vec(vec![1.0f32, -0.5, 0.75, 3.0, -2.0, 0.1], &[2, 3], dev).unwrap();
    vec![a.requires_grad_().unwrap(), b.requires_grad_().unwrap()]
}

/// Gradients of `Σ p0 ∘ scale + Σ p1²`.
fn grads(p: &[Tensor], scale: &[f32]) -> Gradients {
    let s = Tensor::from_vec(scale.to_vec(), &[4], p[0].device()).unwrap();
    let a = p[0].mul(&s).unwrap().sum_all().unwrap();
    let b = p[1].mul(&p[1]).unwrap().sum_all().unwrap();
    a.add(&b).unwrap().backward().unwrap()
}

type Make = fn(&[Tensor], Option<f32>) -> Box<dyn Optimizer>;

/// A [`Make`] of optimiser `$opt`: every parameter decayed, weight decay 0.1, clipping at
/// `clip`, the other hyper-parameters `$hp`'s defaults.
macro_rules! maker {
    ($opt:ident, $hp:ident) => {
        |p, clip| {
            let hp = $hp {
                weight_decay: 0.1,
                max_grad_norm: clip,
                ..Default::default()
            };
            let flags = p.iter().map(|t| (t.clone(), true)).collect();
            Box::new($opt::new(flags, hp).unwrap())
        }
    };
}

fn makers() -> [(&'static str, Make); 2] {
    [
        (
            "schedule_free_adamw",
            maker!(ScheduleFreeAdamW, ScheduleFreeParams),
        ),
        ("prodigy", maker!(Prodigy, ProdigyParams)),
    ]
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec().unwrap().iter().map(|v| v.to_bits()).collect()
}

/// Parameters, state tensors and scalars, bit for bit.
fn state(p: &[Tensor], opt: &dyn Optimizer) -> Vec<Vec<u32>> {
    let st = opt.state().unwrap();
    let mut v: Vec<Vec<u32>> = p.iter().map(bits).collect();
    v.extend(st.tensors.iter().map(|(_, t)| bits(t)));
    v.push(st.scalars.iter().map(|(_, x)| x.to_bits() as u32).collect());
    v
}

/// Bad learning rates, a missing gradient, a gradient of the wrong shape and a schedule of the
/// wrong length fail with typed errors and leave no trace: the next valid step gives the bits
/// of a run that never saw them.
#[test]
fn failed_steps_leave_no_trace_on_every_device() {
    let scale = [1.0, -2.0, 0.5, 3.0];
    for dev in devices("failed_adaptive_steps_leave_no_trace_on_every_device") {
        for (name, make) in makers() {
            let pb = params(dev);
            let mut ob = make(&pb, Some(1.0));
            ob.step(&grads(&pb, &scale), 0.1).unwrap();
            let want = state(&pb, &*ob);
            let pa = params(dev);
            let mut oa = make(&pa, Some(1.0));
            let g = grads(&pa, &scale);
            let before = state(&pa, &*oa);
            for bad in [f32::NAN, -1.0, f32::INFINITY] {
                let r = oa.step(&g, bad);
                assert!(
                    matches!(r, Err(GpuError::InvalidArgument { .. })),
                    "{name} {dev} lr {bad}: {r:?}"
                );
                assert!(oa.next_schedule(bad).is_err(), "{name} {dev} lr {bad}");
            }
            // Gradients of other tensors only: missing.
            let others = params(dev);
            let r = oa.step(&grads(&others, &scale), 0.1);
            assert!(
                matches!(r, Err(GpuError::InvalidArgument { .. })),
                "{name} {dev}: {r:?}"
            );
            let wrong = Tensor::from_vec(vec![0.0f32; 5], &[5], dev).unwrap();
            let r = oa.step_scheduled(&g, &wrong);
            assert!(
                matches!(r, Err(GpuError::ShapeMismatch { .. })),
                "{name} {dev}: {r:?}"
            );
            assert_eq!(oa.steps(), 0, "{name} {dev}");
            assert_eq!(state(&pa, &*oa), before, "{name} {dev}: state changed");
            assert_eq!(oa.last_grad_norm().unwrap(), None, "{name} {dev}");
            oa.step(&g, 0.1).unwrap();
            assert_eq!(
                state(&pa, &*oa),
                want,
                "{name} {dev}: a failed step left a trace"
            );
        }
    }
}

/// A NaN gradient propagates: its parameter becomes NaN; with clipping (a NaN norm) every
/// parameter does. Not an error, for the caller to detect and roll back.
#[test]
fn nan_gradients_propagate_on_every_device() {
    for dev in devices("nan_adaptive_gradients_propagate_on_every_device") {
        for (name, make) in makers() {
            for clip in [None, Some(1.0)] {
                let p = params(dev);
                let mut opt = make(&p, clip);
                opt.step(&grads(&p, &[1.0, f32::NAN, 0.5, 3.0]), 0.1)
                    .unwrap();
                assert!(p[0].to_vec().unwrap()[1].is_nan(), "{name} {dev} {clip:?}");
                if clip.is_some() {
                    assert!(opt.last_grad_norm().unwrap().unwrap().is_nan());
                    for t in &p {
                        assert!(
                            t.to_vec().unwrap().iter().all(|v| v.is_nan()),
                            "{name} {dev}"
                        );
                    }
                }
            }
        }
    }
}

/// Bad hyper-parameters are refused when the optimiser is built, with a typed error.
#[test]
fn adaptive_optimisers_reject_invalid_hyper_parameters_when_built() {
    let p = params(Device::Cpu);
    let flags = || p.iter().map(|t| (t.clone(), true)).collect::<Vec<_>>();
    let sf = ScheduleFreeParams::default();
    for hp in [
        ScheduleFreeParams { beta1: 0.0, ..sf },
        ScheduleFreeParams { beta1: 1.0, ..sf },
        ScheduleFreeParams {
            beta2: f32::NAN,
            ..sf
        },
        ScheduleFreeParams { eps: -1.0, ..sf },
        ScheduleFreeParams {
            weight_decay: f32::INFINITY,
            ..sf
        },
        ScheduleFreeParams { r: f32::NAN, ..sf },
        ScheduleFreeParams {
            weight_lr_power: -2.0,
            ..sf
        },
        ScheduleFreeParams {
            max_grad_norm: Some(0.0),
            ..sf
        },
    ] {
        let r = ScheduleFreeAdamW::new(flags(), hp);
        assert!(matches!(r, Err(GpuError::InvalidArgument { .. })), "{hp:?}");
    }
    let pd = ProdigyParams::default();
    for hp in [
        ProdigyParams { d0: 0.0, ..pd },
        ProdigyParams {
            d0: f32::INFINITY,
            ..pd
        },
        ProdigyParams { eps: 0.0, ..pd },
        ProdigyParams { beta1: -0.1, ..pd },
        ProdigyParams {
            beta3: Some(1.5),
            ..pd
        },
        ProdigyParams {
            d_coef: f32::NAN,
            ..pd
        },
        ProdigyParams {
            growth_rate: 0.0,
            ..pd
        },
        ProdigyParams {
            weight_decay: -0.1,
            ..pd
        },
        ProdigyParams {
            max_grad_norm: Some(f32::NAN),
            ..pd
        },
    ] {
        let r = Prodigy::new(flags(), hp);
        assert!(matches!(r, Err(GpuError::InvalidArgument { .. })), "{hp:?}");
    }
    // The same tensor twice: refused (it would be updated twice a step).
    let twice = vec![(p[0].clone(), true), (p[0].clone(), false)];
    assert!(ScheduleFreeAdamW::new(twice.clone(), sf).is_err());
    assert!(Prodigy::new(twice, pd).is_err());
    // No parameters: every call is a no-op.
    let mut empty = Prodigy::new(vec![], pd).unwrap();
    let g = grads(&p, &[1.0; 4]);
    empty.step(&g, 1.0).unwrap();
    assert_eq!(empty.steps(), 1);
}
