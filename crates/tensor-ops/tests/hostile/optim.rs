//! AdamW under bad hyper-parameters, aliased parameters and non-finite gradients.

use super::devices;
use tensor_ops::optim::{AdamW, AdamWParams};
use tensor_ops::{Device, GpuError, Gradients, Tensor};

/// Two parameters with fixed values on `dev`.
fn params(dev: Device) -> Vec<Tensor> {
    vec![
        Tensor::from_vec(vec![0.5f32, -1.0, 2.0, 0.25], &[4], dev)
            .unwrap()
            .requires_grad_()
            .unwrap(),
        Tensor::from_vec(vec![1.0f32, -0.5, 0.75, 3.0, -2.0, 0.1], &[2, 3], dev)
            .unwrap()
            .requires_grad_()
            .unwrap(),
    ]
}

/// The reason of the `InvalidArgument` that building an optimiser (`built`) must end in;
/// panics, naming `what`, on any other outcome.
fn refusal_reason<T>(what: &str, built: Result<T, GpuError>) -> String {
    match built {
        Err(GpuError::InvalidArgument { reason, .. }) => reason,
        Err(e) => panic!("{what}: expected InvalidArgument, got {e:?}"),
        Ok(_) => panic!("{what}: accepted"),
    }
}

/// Gradients of `Σ p0 ∘ scale + Σ p1²`.
fn grads(p: &[Tensor], scale: &[f32]) -> Gradients {
    let s = Tensor::from_vec(scale.to_vec(), &[4], p[0].device()).unwrap();
    let loss = p[0]
        .mul(&s)
        .unwrap()
        .sum_all()
        .unwrap()
        .add(&p[1].mul(&p[1]).unwrap().sum_all().unwrap())
        .unwrap();
    loss.backward().unwrap()
}

fn optimizer(p: &[Tensor]) -> AdamW {
    AdamW::new(
        p.iter().map(|t| (t.clone(), true)).collect(),
        AdamWParams {
            weight_decay: 0.1,
            max_grad_norm: Some(1.0),
            ..Default::default()
        },
    )
    .unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec().unwrap().iter().map(|v| v.to_bits()).collect()
}

/// Parameters and both moments, bit for bit.
fn state(p: &[Tensor], opt: &AdamW) -> Vec<Vec<u32>> {
    let (m, v) = opt.moments();
    p.iter().chain(m).chain(v).map(bits).collect()
}

/// A step with a bad learning rate used to advance the step counter before failing, so the next
/// valid step used the bias correction of step 2. It must leave no trace.
#[test]
fn failed_adamw_steps_leave_no_trace_on_every_device() {
    let scale = [1.0, -2.0, 0.5, 3.0];
    for dev in devices("failed_adamw_steps_leave_no_trace_on_every_device") {
        let pb = params(dev);
        let mut ob = optimizer(&pb);
        ob.step(&grads(&pb, &scale), 0.1).unwrap();
        let want = state(&pb, &ob);
        for bad in [f32::NAN, -1.0, f32::INFINITY, f32::NEG_INFINITY] {
            let pa = params(dev);
            let mut oa = optimizer(&pa);
            let g = grads(&pa, &scale);
            let before = state(&pa, &oa);
            match oa.step(&g, bad) {
                Err(GpuError::InvalidArgument { .. }) => {}
                other => panic!("{dev}: lr {bad}: expected InvalidArgument, got {other:?}"),
            }
            assert_eq!(oa.steps(), 0, "{dev}: lr {bad}: the step counter moved");
            assert_eq!(state(&pa, &oa), before, "{dev}: lr {bad}: state changed");
            assert_eq!(oa.last_grad_norm().unwrap(), None, "{dev}: lr {bad}");
            oa.step(&g, 0.1).unwrap();
            assert_eq!(oa.steps(), 1);
            assert_eq!(
                state(&pa, &oa),
                want,
                "{dev}: lr {bad}: a failed step changed the next valid one"
            );
        }
    }
}

/// A clipping norm of 0, NaN, −1 or inf (and other bad hyper-parameters) is rejected when the
/// optimiser is built, so no step can fail on it halfway.
#[test]
fn adamw_rejects_invalid_hyper_parameters_when_built() {
    let p = params(Device::Cpu);
    let base = AdamWParams {
        max_grad_norm: Some(1.0),
        ..Default::default()
    };
    let bad = [
        AdamWParams {
            max_grad_norm: Some(0.0),
            ..base
        },
        AdamWParams {
            max_grad_norm: Some(f32::NAN),
            ..base
        },
        AdamWParams {
            max_grad_norm: Some(-1.0),
            ..base
        },
        AdamWParams {
            max_grad_norm: Some(f32::INFINITY),
            ..base
        },
        AdamWParams { beta1: 1.0, ..base },
        AdamWParams {
            beta2: f32::NAN,
            ..base
        },
        AdamWParams {
            eps: f32::NAN,
            ..base
        },
        AdamWParams {
            weight_decay: -1.0,
            ..base
        },
    ];
    for hp in bad {
        let built = AdamW::new(p.iter().map(|t| (t.clone(), true)).collect(), hp);
        refusal_reason(&format!("{hp:?}"), built);
    }
}

/// The same tensor listed twice, or two leaves over one storage, made `step` take one storage's
/// write lock twice and deadlock (CPU and CUDA): now a typed error when the optimiser is built.
#[test]
fn adamw_rejects_parameters_that_share_storage_on_every_device() {
    for dev in devices("adamw_rejects_parameters_that_share_storage_on_every_device") {
        let p = params(dev);
        let detached = p[0].detach().requires_grad_().unwrap();
        let view = p[1].reshape(&[6]).unwrap();
        for (what, list) in [
            ("the same tensor twice", vec![p[0].clone(), p[0].clone()]),
            ("a detached leaf", vec![p[0].clone(), detached]),
            ("a view", vec![p[1].clone(), p[0].clone(), view]),
        ] {
            let list = list.into_iter().map(|t| (t, true)).collect();
            let built = AdamW::new(list, AdamWParams::default());
            let reason = refusal_reason(&format!("{dev} {what}"), built);
            assert!(reason.contains("share storage"), "{dev} {what}: {reason}")
        }
    }
}

/// Kept on purpose (PyTorch does the same): with global-norm clipping, one NaN gradient makes
/// the norm NaN and with it every parameter. Detecting that and rolling back is the trainer's job.
#[test]
fn a_nan_gradient_with_clipping_makes_every_parameter_nan_on_every_device() {
    for dev in devices("a_nan_gradient_with_clipping_makes_every_parameter_nan_on_every_device") {
        let p = params(dev);
        let mut opt = optimizer(&p);
        opt.step(&grads(&p, &[1.0, f32::NAN, 0.5, 3.0]), 0.1)
            .unwrap();
        assert!(opt.last_grad_norm().unwrap().unwrap().is_nan());
        for t in &p {
            let v = t.to_vec().unwrap();
            assert!(v.iter().all(|x| x.is_nan()), "{dev}: {v:?}");
        }
    }
}
