//! The [`Optimizer`] trait over AdamW, Schedule-Free AdamW and Prodigy, on each device of
//! `gpu_cuda::testing::devices` (the CPU, then CUDA where present): state snapshots and
//! safetensors files resume bit for bit, the scheduled step (a device schedule, counted
//! replays) gives the eager step's bits (on the CPU the new optimisers read the schedule from
//! host memory; AdamW's scheduled path is CUDA-only), Schedule-Free AdamW's eval/train swap,
//! and the `ParamStore` builders.

mod optim_hp;

use tensor_ops::nn::ParamStore;
use tensor_ops::optim::{
    AdamW, Optimizer, OptimizerState, Prodigy, ProdigyParams, ScheduleFreeAdamW, ScheduleFreeParams,
};
use tensor_ops::{Device, Gradients, Tensor};

/// Two parameters with fixed values on `dev`: a decayed matrix and an undecayed vector.
fn params(dev: Device) -> Vec<(Tensor, bool)> {
    let w = Tensor::from_vec(vec![0.5f32, -1.0, 2.0, 0.25, 1.5, -0.75], &[2, 3], dev).unwrap();
    let b = Tensor::from_vec(vec![0.1f32, -0.2, 0.3], &[3], dev).unwrap();
    vec![
        (w.requires_grad_().unwrap(), true),
        (b.requires_grad_().unwrap(), false),
    ]
}

/// Gradients of `Σ (p − 0.3)² + k·0.1·Σ p` at step `k` (they change from step to step).
fn grads(ps: &[Tensor], k: usize) -> Gradients {
    let mut loss: Option<Tensor> = None;
    for p in ps {
        let shift = Tensor::from_vec(vec![0.3f32; p.numel()], p.shape(), p.device()).unwrap();
        let d = p.sub(&shift).unwrap();
        let tilt = Tensor::from_vec(vec![0.1 * k as f32; p.numel()], p.shape(), p.device());
        let term = d.mul(&d).unwrap().sum_all().unwrap();
        let term = term.add(&p.mul(&tilt.unwrap()).unwrap().sum_all().unwrap());
        let term = term.unwrap();
        loss = Some(match loss {
            None => term,
            Some(l) => l.add(&term).unwrap(),
        });
    }
    loss.unwrap().backward().unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec().unwrap().iter().map(|v| v.to_bits()).collect()
}

/// The parameters' bits and the state's tensors' bits and scalars.
fn fingerprint(ps: &[Tensor], opt: &dyn Optimizer) -> (Vec<Vec<u32>>, Vec<(String, u64)>) {
    let st = opt.state().unwrap();
    let mut b: Vec<Vec<u32>> = ps.iter().map(bits).collect();
    b.extend(st.tensors.iter().map(|(_, t)| bits(t)));
    let sc = st
        .scalars
        .iter()
        .map(|(n, v)| (n.clone(), v.to_bits()))
        .collect();
    (b, sc)
}

type Make = fn(Vec<(Tensor, bool)>) -> Box<dyn Optimizer>;

fn makers() -> Vec<(&'static str, Make)> {
    vec![
        ("adamw", |p| {
            Box::new(AdamW::new(p, optim_hp::adamw()).unwrap())
        }),
        ("schedule_free_adamw", |p| {
            Box::new(ScheduleFreeAdamW::new(p, optim_hp::schedule_free()).unwrap())
        }),
        ("prodigy", |p| {
            Box::new(Prodigy::new(p, optim_hp::prodigy()).unwrap())
        }),
    ]
}

fn run(opt: &mut dyn Optimizer, ps: &[Tensor], from: usize, to: usize) {
    for k in from..to {
        let lr = if k < 3 { 0.05 } else { 0.02 };
        opt.step(&grads(ps, k), lr).unwrap();
    }
}

fn snapshot(ps: &[Tensor]) -> Vec<Tensor> {
    ps.iter().map(|p| p.deep_copy().unwrap()).collect()
}

fn restore(ps: &[Tensor], snap: &[Tensor]) {
    for (p, s) in ps.iter().zip(snap) {
        p.assign(s).unwrap();
    }
}

/// state() after 3 steps, 3 more steps; a fresh optimiser loaded with the state (and the
/// parameters restored) repeats the last 3 steps bit for bit, from the snapshot and from a
/// safetensors file; the first step's clipping norm is reported.
#[test]
fn optimiser_states_round_trip_and_resume_bit_for_bit() {
    for dev in gpu_cuda::testing::devices("optimiser_states_round_trip_and_resume_bit_for_bit") {
        for (name, make) in makers() {
            let pf = params(dev);
            let ps: Vec<Tensor> = pf.iter().map(|(t, _)| t.clone()).collect();
            let mut opt = make(pf.clone());
            assert_eq!(opt.name(), name);
            run(&mut *opt, &ps, 0, 3);
            assert!(opt.last_grad_norm().unwrap().unwrap() > 0.0, "{name}");
            let (weights, state) = (snapshot(&ps), opt.state().unwrap());
            let path = std::env::temp_dir()
                .join(format!("optim-{name}-{}.safetensors", std::process::id()));
            opt.save_state(&path).unwrap();
            run(&mut *opt, &ps, 3, 6);
            let straight = fingerprint(&ps, &*opt);
            for from_file in [false, true] {
                let pf2 = params(dev);
                let ps2: Vec<Tensor> = pf2.iter().map(|(t, _)| t.clone()).collect();
                let mut opt2 = make(pf2);
                restore(&ps2, &weights);
                if from_file {
                    opt2.load_state_file(&path).unwrap();
                } else {
                    opt2.load_state(&state).unwrap();
                }
                assert_eq!(opt2.steps(), 3, "{name}");
                run(&mut *opt2, &ps2, 3, 6);
                assert_eq!(
                    fingerprint(&ps2, &*opt2),
                    straight,
                    "{name} file {from_file}"
                );
            }
            // Without the state the resumed run differs: the test can fail.
            let pf3 = params(dev);
            let ps3: Vec<Tensor> = pf3.iter().map(|(t, _)| t.clone()).collect();
            let mut opt3 = make(pf3);
            restore(&ps3, &weights);
            run(&mut *opt3, &ps3, 3, 6);
            assert_ne!(fingerprint(&ps3, &*opt3).0[..2], straight.0[..2], "{name}");
            std::fs::remove_file(&path).ok();
        }
    }
}

/// A state of another optimiser, of other shapes, with a missing scalar or a bad step count is
/// refused before anything is written.
#[test]
fn wrong_states_are_refused_and_leave_no_trace() {
    for dev in gpu_cuda::testing::devices("wrong_states_are_refused_and_leave_no_trace") {
        let all = makers();
        for (i, (name, make)) in all.iter().enumerate() {
            let pf = params(dev);
            let ps: Vec<Tensor> = pf.iter().map(|(t, _)| t.clone()).collect();
            let mut opt = make(pf);
            run(&mut *opt, &ps, 0, 2);
            let before = fingerprint(&ps, &*opt);
            let other = all[(i + 1) % all.len()].1(params(dev));
            let e = opt.load_state(&other.state().unwrap()).unwrap_err();
            assert!(e.to_string().contains("this optimiser is"), "{name}: {e}");
            let small = Tensor::from_vec(vec![1.0f32; 2], &[2], dev).unwrap();
            let mut wrong = opt.state().unwrap();
            wrong.tensors[1].1 = small;
            assert!(opt.load_state(&wrong).is_err(), "{name} shape");
            let mut wrong = opt.state().unwrap();
            wrong.scalars.pop();
            assert!(opt.load_state(&wrong).is_err(), "{name} scalars");
            let mut wrong = opt.state().unwrap();
            wrong.scalars[0].1 = -1.5;
            assert!(opt.load_state(&wrong).is_err(), "{name} step count");
            let mut wrong: OptimizerState = opt.state().unwrap();
            wrong.tensors.pop();
            assert!(opt.load_state(&wrong).is_err(), "{name} tensor count");
            assert_eq!(fingerprint(&ps, &*opt), before, "{name}: no trace");
        }
    }
}

/// `step_scheduled` with the schedule of `next_schedule(lr)`, then `count_replayed_step(lr)`,
/// gives `step(grads, lr)`'s bits, step after step with a changing learning rate.
#[test]
fn scheduled_steps_give_the_eager_bits() {
    for dev in gpu_cuda::testing::devices("scheduled_steps_give_the_eager_bits") {
        for (name, make) in makers() {
            if name == "adamw" && dev == Device::Cpu {
                continue; // AdamW's device schedule is CUDA-only (a typed error on the CPU).
            }
            let (pa, pb) = (params(dev), params(dev));
            let psa: Vec<Tensor> = pa.iter().map(|(t, _)| t.clone()).collect();
            let psb: Vec<Tensor> = pb.iter().map(|(t, _)| t.clone()).collect();
            let (mut eager, mut graphed) = (make(pa), make(pb));
            let schedule = Tensor::from_vec(
                vec![0.0f32; graphed.schedule_len()],
                &[graphed.schedule_len()],
                dev,
            )
            .unwrap();
            for (k, lr) in [0.05f32, 0.05, 0.01, 0.0, 0.03].into_iter().enumerate() {
                eager.step(&grads(&psa, k), lr).unwrap();
                schedule
                    .write_from_host(&graphed.next_schedule(lr).unwrap())
                    .unwrap();
                graphed.step_scheduled(&grads(&psb, k), &schedule).unwrap();
                graphed.count_replayed_step(lr).unwrap();
                assert_eq!(
                    fingerprint(&psa, &*eager),
                    fingerprint(&psb, &*graphed),
                    "{name} on {dev}, step {k}"
                );
            }
        }
    }
}

/// Schedule-Free AdamW: `eval_params` puts `x = lerp(y, z, 1 − 1/β1)` in the parameters, a
/// step there is refused, `train_params` brings `y` back (to rounding); both are no-ops when
/// repeated, and no-ops for AdamW and Prodigy.
#[test]
fn schedule_free_eval_and_train_swap_the_parameters() {
    for dev in gpu_cuda::testing::devices("schedule_free_eval_and_train_swap_the_parameters") {
        let pf = params(dev);
        let ps: Vec<Tensor> = pf.iter().map(|(t, _)| t.clone()).collect();
        let mut opt = ScheduleFreeAdamW::new(pf, ScheduleFreeParams::default()).unwrap();
        run(&mut opt, &ps, 0, 3);
        let y: Vec<Vec<f32>> = ps.iter().map(|p| p.to_vec().unwrap()).collect();
        let z: Vec<Vec<f32>> = opt.state().unwrap().tensors[..2]
            .iter()
            .map(|(_, t)| t.to_vec().unwrap())
            .collect();
        opt.eval_params().unwrap();
        opt.eval_params().unwrap(); // a no-op
        assert!(!opt.is_train_mode());
        let w = 1.0 - 1.0 / 0.9f32 as f64;
        for (i, p) in ps.iter().enumerate() {
            for (e, &x) in p.to_vec().unwrap().iter().enumerate() {
                let want = y[i][e] as f64 + w * (z[i][e] as f64 - y[i][e] as f64);
                assert!((x as f64 - want).abs() <= 1e-6, "x[{i}][{e}] {x} vs {want}");
            }
        }
        let e = opt.step(&grads(&ps, 3), 0.01).unwrap_err();
        assert!(e.to_string().contains("train_params"), "{e}");
        assert!(opt.next_schedule(0.01).is_err());
        opt.train_params().unwrap();
        opt.train_params().unwrap();
        for (i, p) in ps.iter().enumerate() {
            for (e, &v) in p.to_vec().unwrap().iter().enumerate() {
                assert!(
                    (v - y[i][e]).abs() <= 1e-6,
                    "y[{i}][{e}] {v} vs {}",
                    y[i][e]
                );
            }
        }
        run(&mut opt, &ps, 3, 4);
        for (name, make) in makers()
            .into_iter()
            .filter(|(n, _)| *n != "schedule_free_adamw")
        {
            let pf = params(dev);
            let ps: Vec<Tensor> = pf.iter().map(|(t, _)| t.clone()).collect();
            let mut o = make(pf);
            run(&mut *o, &ps, 0, 1);
            let before: Vec<Vec<u32>> = ps.iter().map(bits).collect();
            o.eval_params().unwrap();
            o.train_params().unwrap();
            assert_eq!(ps.iter().map(bits).collect::<Vec<_>>(), before, "{name}");
        }
    }
}

/// Steps `opt` once with zero gradients and checks that exactly the 2-D weights moved.
fn only_matrices_move(ps: &[Tensor], opt: &mut dyn Optimizer, lr: f32) {
    let mut loss = Tensor::zeros(&[], Device::Cpu).unwrap();
    for p in ps {
        let zeros = Tensor::zeros(p.shape(), Device::Cpu).unwrap();
        loss = loss
            .add(&p.mul(&zeros).unwrap().sum_all().unwrap())
            .unwrap();
    }
    let before: Vec<Vec<u32>> = ps.iter().map(bits).collect();
    opt.step(&loss.backward().unwrap(), lr).unwrap();
    for (p, b) in ps.iter().zip(&before) {
        let moved = bits(p) != *b;
        assert_eq!(
            moved,
            p.shape().len() == 2,
            "{} {:?}",
            opt.name(),
            p.shape()
        );
    }
}

/// The `ParamStore` builders give each parameter its decay flag (nanoGPT: 2-D weights only):
/// with zero gradients only weight decay moves a parameter (Prodigy's coupled decay: with a
/// zero gradient and decoupled decay it takes no step at all, `Σ|s| = 0`).
#[test]
fn param_store_builders_decay_2d_weights_only() {
    let store = ParamStore::new(Device::Cpu, 5);
    store.pp("lin").linear(3, 2, true).unwrap();
    let ps: Vec<Tensor> = store.params().iter().map(|p| p.tensor().clone()).collect();
    let mut sf = store
        .schedule_free_adamw(ScheduleFreeParams {
            weight_decay: 0.5,
            ..Default::default()
        })
        .unwrap();
    only_matrices_move(&ps, &mut sf, 0.1);
    let mut pd = store
        .prodigy(ProdigyParams {
            weight_decay: 0.5,
            decouple: false,
            ..Default::default()
        })
        .unwrap();
    only_matrices_move(&ps, &mut pd, 1.0);
    assert_eq!((sf.steps(), pd.steps()), (1, 1));
}
