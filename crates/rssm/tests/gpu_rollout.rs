//! The fused CUDA rollout (`Engine::Fused`, one cooperative kernel) against the f64 reference
//! and the tensor-ops path, on fresh random weights and contexts (seed printed;
//! `HYBRID_TEST_SEED` replays), at the sizes and at odd ones that exercise every
//! partial tile (rows beyond 32 and not a multiple of 4, hidden widths not a multiple of 8).

mod common;
use common::uniform;
use rand::{rngs::StdRng, SeedableRng};
use rssm::{Engine, GpuAccelerator, Rssm, RssmConfig, SequenceBatch};
use tensor_ops::{Device, Tensor};

fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    gpu_cuda::testing::rel_err(&a.to_vec().unwrap(), &b.to_vec().unwrap())
}

/// A model of `cfg` trained two steps at a large rate (weights away from their init), on the
/// CPU.
fn model(cfg: RssmConfig, r: &mut StdRng) -> Rssm {
    let mut m = Rssm::new(cfg, Device::Cpu).unwrap();
    let f = cfg.feature_dim;
    for _ in 0..2 {
        let x = Tensor::from_vec(uniform(r, 3 * 4 * f, 1.5), &[3, 4, f], Device::Cpu).unwrap();
        m.train_step(&SequenceBatch::new(x), 3e-2).unwrap();
    }
    m
}

#[test]
fn gpu_fused_rollout_matches_the_f64_reference_and_tensor_ops() {
    let test = "gpu_fused_rollout_matches_the_f64_reference_and_tensor_ops";
    let Some(gpu) = gpu_cuda::testing::gpu_device_or_skip(test) else {
        return;
    };
    let seed = gpu_cuda::testing::test_seed(test);
    let mut r = StdRng::seed_from_u64(seed);
    let odd = RssmConfig {
        feature_dim: 24,
        embed_dim: 20,
        hidden_dim: 44,
        latent_dim: 6,
        head_dim: 36,
        output_dim: 24,
        ensemble: 3,
        seed: seed ^ 1,
        ..RssmConfig::default()
    };
    let default = RssmConfig {
        seed: seed ^ 2,
        ..RssmConfig::default()
    };
    // Sizes other than the default's on the cluster kernel's tensor-core paths (multiples of 8):
    // 8 blocks a member, the GRU's gates on FMA (its gate scratch does not fit a 64-wide head
    // row), the head and decoder fcs and the outputs on tensor cores.
    let mid = RssmConfig {
        feature_dim: 40,
        embed_dim: 64,
        hidden_dim: 128,
        latent_dim: 16,
        head_dim: 64,
        output_dim: 40,
        ensemble: 4,
        seed: seed ^ 3,
        ..RssmConfig::default()
    };
    // (config, batch, context, steps)
    let cases = [
        (default, 32, 1, 10),
        (default, 37, 3, 4),
        (odd, 1, 1, 1),
        (default, 3, 2, 5),
        (odd, 7, 2, 2),
        (odd, 70, 5, 3),
        (mid, 32, 2, 6),
        (mid, 5, 1, 3),
    ];
    for (cfg, b, t, n) in cases {
        let m = model(cfg, &mut r);
        let reference = GpuAccelerator::with_model(m.to_device(Device::Cpu).unwrap());
        let fused = GpuAccelerator::with_model(m.to_device(gpu).unwrap());
        assert_eq!(fused.engine(), Engine::Fused);
        let tensor = common::on_engine(m.to_device(gpu).unwrap(), Engine::Tensor);
        let f = cfg.feature_dim;
        let ctx =
            Tensor::from_vec(uniform(&mut r, b * t * f, 2.0), &[b, t, f], Device::Cpu).unwrap();
        let want = reference.predict_batch(&ctx, n).unwrap();
        let got = fused.predict_batch(&ctx.to(gpu).unwrap(), n).unwrap();
        let via_ops = tensor.predict_batch(&ctx.to(gpu).unwrap(), n).unwrap();
        assert_eq!(got.members.shape(), [cfg.ensemble, b, n, cfg.output_dim]);
        assert_eq!(got.mean.shape(), [b, n, cfg.output_dim]);
        assert_eq!(got.disagreement.shape(), [b, n]);
        // The bound: f32 against the f64 reference, norm-wise. The cluster kernel's
        // products are 3×TF32 (f32's accuracy: a head and tail split, three products), never
        // plain TF32, whose 2^-11 operand rounding this bound would not admit.
        let case = format!("seed {seed}, B {b} T {t} N {n} H {}", cfg.hidden_dim);
        common::assert_predictions_close(&format!("{case}: vs f64 reference"), &got, &want, 1e-5);
        common::assert_predictions_close(&format!("{case}: vs tensor-ops"), &got, &via_ops, 1e-5);
    }
}

#[test]
fn gpu_fused_rollout_follows_weight_updates_and_rejects_bad_input() {
    let Some((gpu, mut r)) =
        common::gpu("gpu_fused_rollout_follows_weight_updates_and_rejects_bad_input")
    else {
        return;
    };
    let cfg = RssmConfig::default();
    let mut acc = GpuAccelerator::with_model(model(cfg, &mut r).to_device(gpu).unwrap());
    let ctx = Tensor::from_vec(uniform(&mut r, 8 * 2 * 64, 1.0), &[8, 2, 64], gpu).unwrap();
    let before = acc.predict_batch(&ctx, 3).unwrap().mean.to_vec().unwrap();
    // Training changes the weights: the packed copy must follow.
    let x = Tensor::from_vec(uniform(&mut r, 2 * 3 * 64, 1.0), &[2, 3, 64], gpu).unwrap();
    acc.model_mut()
        .unwrap()
        .train_step(&SequenceBatch::new(x), 1e-2)
        .unwrap();
    let after = acc.predict_batch(&ctx, 3).unwrap();
    assert_ne!(before, after.mean.to_vec().unwrap());
    let reference =
        GpuAccelerator::with_model(acc.model().unwrap().to_device(Device::Cpu).unwrap());
    let want = reference
        .predict_batch(&ctx.to(Device::Cpu).unwrap(), 3)
        .unwrap();
    assert!(rel_err(&after.mean, &want.mean) < 1e-5);
    // Bad input: typed errors, on the fused path too.
    assert!(acc.predict_batch(&ctx, 0).is_err());
    let wide = Tensor::zeros(&[8, 2, 65], gpu).unwrap();
    assert!(acc.predict_batch(&wide, 2).is_err());
    let mut v = vec![0.0f32; 4 * 64];
    v[5] = f32::NAN;
    let nan = Tensor::from_vec(v, &[4, 1, 64], gpu).unwrap();
    assert!(acc.predict_batch(&nan, 2).is_err());
    assert!(acc.predict_batch(&ctx.to(Device::Cpu).unwrap(), 2).is_err());
    // The host engines run only on the CPU; the device engine runs anywhere.
    assert!(GpuAccelerator::new(gpu)
        .unwrap()
        .with_engine(Engine::Fast)
        .is_err());
    assert!(GpuAccelerator::new(Device::Cpu)
        .unwrap()
        .with_engine(Engine::Fused)
        .is_ok());
}

#[test]
fn gpu_a_model_too_large_for_the_fused_kernel_takes_the_default_composition() {
    let Some((gpu, mut r)) =
        common::gpu("gpu_a_model_too_large_for_the_fused_kernel_takes_the_default_composition")
    else {
        return;
    };
    // Hidden 1024: the GRU slice and staged rows need more shared memory than a block may have.
    let cfg = RssmConfig {
        hidden_dim: 1024,
        ensemble: 2,
        ..RssmConfig::default()
    };
    let dims = rssm::rollout_dims(&cfg, 3, 2, 2);
    let backend = tensor_ops::cuda_backend(0).unwrap();
    assert!(!backend.rssm_rollout_fits(&dims));
    let m = model(cfg, &mut r);
    let reference = common::on_engine(m.to_device(Device::Cpu).unwrap(), Engine::Reference);
    let fused = GpuAccelerator::with_model(m.to_device(gpu).unwrap());
    assert_eq!(fused.engine(), Engine::Fused);
    let ctx = Tensor::from_vec(uniform(&mut r, 3 * 2 * 64, 1.0), &[3, 2, 64], Device::Cpu).unwrap();
    let want = reference.predict_batch(&ctx, 2).unwrap();
    let got = fused.predict_batch(&ctx.to(gpu).unwrap(), 2).unwrap();
    common::assert_predictions_close("hidden 1024 (the default composition)", &got, &want, 1e-5);
}
