//! The world model on wgpu: the accelerator's device engine (`Engine::Fused`, the HAL's
//! `WorldOps` from gpu-core's default compositions on the WGSL primitives) and the model's own
//! training step, against the exact f64 reference and the CPU, on adapter 0 (lavapipe in CI;
//! `SKIP` without an adapter unless `HYBRID_REQUIRE_WGPU=1`). Bounds as `device_engine.rs`'s:
//! the rollout within 1e-5 norm-wise relative error, the SVD within 1.1× of the Eckart–Young
//! optimum, the correction within `4·2⁻²⁴·scale·k`; one training step's loss within 1e-5
//! relative of the CPU's (the same f32 ops in another summation order), seed printed.

mod common;

use common::{trained_model, uniform};
use rand::{rngs::StdRng, Rng, SeedableRng};
use rssm::{Engine, GpuAccelerator, LowRank, RssmConfig, SequenceBatch};
use tensor_ops::ndarray::{Array1, Array2};
use tensor_ops::{Device, Tensor};

/// Adapter 0 for test `test` and a generator seeded from its name (`test_seed`), as
/// `common::gpu` gives a CUDA device; `None` where there is no adapter (the test then skips,
/// saying why).
fn wgpu(test: &str) -> Option<(Device, StdRng)> {
    gpu_wgpu::register_device_probe();
    gpu_wgpu::testing::backend_or_skip(test)?;
    let r = StdRng::seed_from_u64(gpu_cuda::testing::test_seed(test));
    Some((Device::Wgpu(0), r))
}

fn cfg(seed: u64) -> RssmConfig {
    RssmConfig {
        feature_dim: 9,
        embed_dim: 12,
        hidden_dim: 16,
        latent_dim: 4,
        head_dim: 10,
        output_dim: 9,
        ensemble: 2,
        seed,
        ..RssmConfig::default()
    }
}

#[test]
fn wgpu_world_model_entry_points_match_the_reference() {
    let Some((dev, mut r)) = wgpu("wgpu_world_model_entry_points_match_the_reference") else {
        return;
    };
    let c = cfg(r.random());
    let m = trained_model(c, r.random());
    let acc = GpuAccelerator::with_model(m.to_device(dev).unwrap());
    let reference = common::on_engine(m, Engine::Reference);
    assert_eq!(acc.engine(), Engine::Fused);
    let (b, t, f) = (3, 2, c.feature_dim);
    let ctx = Tensor::from_vec(uniform(&mut r, b * t * f, 1.0), &[b, t, f], Device::Cpu).unwrap();
    let want = reference.predict_batch(&ctx, 3).unwrap();
    let got = acc.predict_batch(&ctx.to(dev).unwrap(), 3).unwrap();
    assert_eq!(got.mean.device(), dev);
    common::assert_predictions_close("wgpu rollout", &got, &want, 1e-5);

    // The correction, in place on a wgpu tensor.
    let (m_, n_, k) = (6, 5, 2);
    let w0 = uniform(&mut r, m_ * n_, 2.0);
    let u = Array2::from_shape_vec((m_, k), uniform(&mut r, m_ * k, 1.0)).unwrap();
    let s = Array1::from_vec(uniform(&mut r, k, 1.0));
    let v = Array2::from_shape_vec((n_, k), uniform(&mut r, n_ * k, 1.0)).unwrap();
    let corr = LowRank::new(u.clone(), s.clone(), v.clone()).unwrap();
    let w = Tensor::from_vec(w0.clone(), &[m_, n_], dev).unwrap();
    acc.apply_corrections(&w, &corr.to(dev).unwrap()).unwrap();
    let got = w.to_vec().unwrap();
    for i in 0..m_ {
        for j in 0..n_ {
            let terms: Vec<f64> = (0..k)
                .map(|q| f64::from(u[(i, q)] * s[q]) * f64::from(v[(j, q)]))
                .collect();
            let want = f64::from(w0[i * n_ + j]) + terms.iter().sum::<f64>();
            let scale =
                f64::from(w0[i * n_ + j]).abs() + terms.iter().map(|x| x.abs()).sum::<f64>();
            let err = (f64::from(got[i * n_ + j]) - want).abs();
            assert!(
                err <= 4.0 * 2f64.powi(-24) * scale * k as f64,
                "({i}, {j}): {err:e}"
            );
        }
    }

    // The randomized SVD of an exactly rank-2 matrix: its two singular values.
    let a: Vec<f32> = (0..m_ * n_)
        .map(|e| (0..k).map(|q| u[(e / n_, q)] * s[q] * v[(e % n_, q)]).sum())
        .collect();
    let at = Tensor::from_vec(a.clone(), &[m_, n_], Device::Cpu).unwrap();
    let exact = reference
        .compress_residuals(&at, 2, &Default::default())
        .unwrap();
    let got = acc
        .compress_residuals(&at.to(dev).unwrap(), 2, &Default::default())
        .unwrap();
    let (e, g) = (exact.host().unwrap().s, got.host().unwrap().s);
    for q in 0..2 {
        assert!(
            (e[q] - g[q]).abs() <= 1e-5 * e[0],
            "sigma_{q}: {} against {}",
            g[q],
            e[q]
        );
    }
}

#[test]
fn wgpu_world_model_trains_as_on_the_cpu() {
    let Some((dev, mut r)) = wgpu("wgpu_world_model_trains_as_on_the_cpu") else {
        return;
    };
    let c = cfg(r.random());
    let mut on_cpu = trained_model(c, 7);
    let mut on_wgpu = trained_model(c, 7).to_device(dev).unwrap();
    let x = uniform(&mut r, 2 * 4 * c.feature_dim, 1.0);
    let shape = [2, 4, c.feature_dim];
    let lc = on_cpu
        .train_step(
            &SequenceBatch::new(Tensor::from_vec(x.clone(), &shape, Device::Cpu).unwrap()),
            1e-3,
        )
        .unwrap();
    let lw = on_wgpu
        .train_step(
            &SequenceBatch::new(Tensor::from_vec(x, &shape, dev).unwrap()),
            1e-3,
        )
        .unwrap();
    eprintln!("loss: cpu {lc:?}, wgpu {lw:?}");
    let (a, b) = (lc.total as f64, lw.total as f64);
    assert!((a - b).abs() <= 1e-5 * a.abs().max(1.0), "{a} against {b}");
}
