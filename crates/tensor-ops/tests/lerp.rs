//! `optim::lerp_tensors` (a weight average's update, one fused launch on CUDA) on each device
//! of `gpu_cuda::testing::devices`: against an f64 reference on fresh random inputs from a
//! printed seed, and its refusals, which leave the targets as they were.

use rand::{Rng, SeedableRng};
use tensor_ops::optim::lerp_tensors;
use tensor_ops::{Device, Tensor};

fn random(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-4.0f32..4.0)).collect()
}

/// `t + w·(e − t)` computed in f64 and rounded once differs from the f32 kernel's by at most
/// a few units in the last place of the operands' magnitude: the bound is 4 ulp of
/// `max(|t|, |e|)` (f32 epsilon 2^-23 relative, |w| ≤ 1 here).
#[test]
fn lerp_tensors_matches_the_f64_reference() {
    let seed = gpu_cuda::testing::test_seed("lerp_tensors_matches_the_f64_reference");
    for dev in gpu_cuda::testing::devices("lerp_tensors_matches_the_f64_reference") {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        // Empty, odd, and longer than a block's share; 70 tensors: more than one launch's list.
        let sizes: Vec<usize> = (0..70).map(|i| [0, 1, 7, 1000, 5003][i % 5]).collect();
        let t_host: Vec<Vec<f32>> = sizes.iter().map(|&n| random(&mut rng, n)).collect();
        let e_host: Vec<Vec<f32>> = sizes.iter().map(|&n| random(&mut rng, n)).collect();
        let w = rng.random_range(0.0f32..1.0);
        let mk = |v: &Vec<f32>| Tensor::from_vec(v.clone(), &[v.len()], dev).unwrap();
        let targets: Vec<Tensor> = t_host.iter().map(mk).collect();
        let ends: Vec<Tensor> = e_host.iter().map(mk).collect();
        lerp_tensors(&targets, &ends, w).unwrap();
        for ((t, th), eh) in targets.iter().zip(&t_host).zip(&e_host) {
            for ((got, &a), &b) in t.to_vec().unwrap().iter().zip(th).zip(eh) {
                let want = a as f64 + w as f64 * (b as f64 - a as f64);
                let bound = 4.0 * f32::EPSILON as f64 * (a.abs().max(b.abs()) as f64);
                assert!(
                    (*got as f64 - want).abs() <= bound,
                    "{dev} seed {seed}: lerp({a}, {b}, {w}) = {got}, want {want}"
                );
            }
        }
    }
}

#[test]
fn lerp_tensors_refuses_bad_lists_and_leaves_no_trace() {
    for dev in gpu_cuda::testing::devices("lerp_tensors_refuses_bad_lists_and_leaves_no_trace") {
        let v = |x: &[f32]| Tensor::from_vec(x.to_vec(), &[x.len()], dev).unwrap();
        let (a, b) = (v(&[1.0, 2.0]), v(&[3.0, 4.0]));
        let short = v(&[5.0]);
        let cases: Vec<(Vec<Tensor>, Vec<Tensor>, f32)> = vec![
            (vec![a.clone(), b.clone()], vec![b.clone()], 0.5),
            (vec![a.clone()], vec![short.clone()], 0.5),
            (vec![a.clone(), a.clone()], vec![b.clone(), b.clone()], 0.5),
            (vec![a.clone()], vec![a.clone()], 0.5),
            (vec![a.clone()], vec![b.clone()], f32::NAN),
            (vec![a.clone()], vec![b.clone()], f32::INFINITY),
        ];
        for (t, e, w) in cases {
            assert!(lerp_tensors(&t, &e, w).is_err(), "{dev}: accepted w {w}");
            assert_eq!(a.to_vec().unwrap(), vec![1.0, 2.0]);
        }
        let other = if dev == Device::Cpu {
            None
        } else {
            Some(Device::Cpu)
        };
        if let Some(o) = other {
            let far = Tensor::from_vec(vec![3.0f32, 4.0], &[2], o).unwrap();
            assert!(lerp_tensors(std::slice::from_ref(&a), &[far], 0.5).is_err());
        }
        lerp_tensors(&[], &[], 0.5).unwrap();
        lerp_tensors(std::slice::from_ref(&a), &[b], 0.25).unwrap();
        assert_eq!(a.to_vec().unwrap(), vec![1.5, 2.5]);
    }
}

/// Extreme finite values (±1e30) keep the stated bound; a NaN or an infinity in a target or
/// an end gives a non-finite result there and nowhere else; a tensor of 3,000,001 elements
/// (longer than one launch's piece) is lerped whole.
#[test]
fn lerp_tensors_handles_extreme_values_and_long_tensors() {
    let seed = gpu_cuda::testing::test_seed("lerp_tensors_handles_extreme_values_and_long_tensors");
    for dev in gpu_cuda::testing::devices("lerp_tensors_handles_extreme_values_and_long_tensors") {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let t_host = vec![1e30f32, -1e30, 1e30, f32::NAN, 1.0, f32::INFINITY, 2.0];
        let e_host = vec![-1e30f32, 1e30, 1e30, 1.0, f32::NAN, 1.0, -3.0];
        let t = Tensor::from_vec(t_host.clone(), &[7], dev).unwrap();
        let e = Tensor::from_vec(e_host.clone(), &[7], dev).unwrap();
        lerp_tensors(std::slice::from_ref(&t), &[e], 0.25).unwrap();
        let got = t.to_vec().unwrap();
        for (i, ((&g, &a), &b)) in got.iter().zip(&t_host).zip(&e_host).enumerate() {
            if a.is_finite() && b.is_finite() {
                let want = a as f64 + 0.25 * (b as f64 - a as f64);
                let bound = 4.0 * f32::EPSILON as f64 * (a.abs().max(b.abs()) as f64);
                assert!(
                    (g as f64 - want).abs() <= bound,
                    "{dev} [{i}]: {g}, want {want}"
                );
            } else {
                assert!(!g.is_finite(), "{dev} [{i}]: lerp({a}, {b}) = {g}");
            }
        }
        let n = 3_000_001;
        let th = random(&mut rng, n);
        let eh = random(&mut rng, n);
        let t = Tensor::from_vec(th.clone(), &[n], dev).unwrap();
        let e = Tensor::from_vec(eh.clone(), &[n], dev).unwrap();
        lerp_tensors(std::slice::from_ref(&t), &[e], 0.5).unwrap();
        let got = t.to_vec().unwrap();
        for i in [0, 1, n / 2, n - 2, n - 1] {
            let want = th[i] as f64 + 0.5 * (eh[i] as f64 - th[i] as f64);
            let bound = 4.0 * f32::EPSILON as f64 * (th[i].abs().max(eh[i].abs()) as f64);
            assert!(
                (got[i] as f64 - want).abs() <= bound,
                "{dev} seed {seed} [{i}]"
            );
        }
    }
}
