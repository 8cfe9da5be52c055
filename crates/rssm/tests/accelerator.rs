//! `GpuAccelerator`: the CPU reference (f64 `nalgebra`) against the tensor-ops path on random
//! weights and inputs (f32, norm-wise relative error < 1e-5) for `encode_state` and
//! `predict_batch` at the sizes; `apply_corrections` (tiled, in place) against the
//! dense product; typed errors for bad input; the CUDA paths (`gpu_*` tests skip with a
//! printed reason where no GPU exists).

mod common;

use common::rel_err;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestRunner};
use rand::{rngs::StdRng, Rng, SeedableRng};
use rssm::correct::apply_tiled;
use rssm::{
    AcceleratorError, Engine, GpuAccelerator, LowRank, Rssm, RssmConfig, RssmError, SequenceBatch,
};
use tensor_ops::ndarray::{Array1, Array2};
use tensor_ops::{Device, Tensor};

const CPU: Device = Device::Cpu;

fn seed(test: &str) -> u64 {
    gpu_cuda::testing::test_seed(test)
}

fn uniform(r: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| r.random_range(-scale..scale)).collect()
}

/// The model (64 → 128, five GRU members of 256) from `seed`, trained one step on a
/// random batch so that it may predict (its weights are still random).
fn model(seed: u64, device: Device) -> Rssm {
    let cfg = RssmConfig {
        seed,
        ..RssmConfig::default()
    };
    let mut m = Rssm::new(cfg, device).unwrap();
    let mut r = StdRng::seed_from_u64(seed);
    let x = Tensor::from_vec(uniform(&mut r, 2 * 3 * 64, 1.0), &[2, 3, 64], device).unwrap();
    m.train_step(&SequenceBatch::new(x), 1e-3).unwrap();
    m
}

fn both(seed: u64) -> (GpuAccelerator, GpuAccelerator) {
    assert_eq!(
        GpuAccelerator::new(CPU).unwrap().engine(),
        Engine::Fast,
        "the CPU default"
    );
    let reference = common::on_engine(model(seed, CPU), Engine::Reference);
    let tensor = common::on_engine(model(seed, CPU), Engine::Tensor);
    (reference, tensor)
}

#[test]
fn encode_state_matches_the_reference_at_batch_32() {
    let s = seed("encode_state_matches_the_reference_at_batch_32");
    let (reference, tensor) = both(s);
    let mut r = StdRng::seed_from_u64(s ^ 1);
    let x = Tensor::from_vec(uniform(&mut r, 32 * 64, 2.0), &[32, 64], CPU).unwrap();
    let a = reference.encode_state(&x).unwrap();
    let b = tensor.encode_state(&x).unwrap();
    assert_eq!(a.shape(), &[32, 128]);
    let e = rel_err(&b.to_vec().unwrap(), &a.to_vec().unwrap());
    eprintln!("encode_state: tensor-ops f32 vs f64 reference, rel err {e:e}");
    assert!(e < 1e-5, "{e:e}");
    assert!(a.to_vec().unwrap().iter().all(|v| *v >= 0.0));
}

#[test]
fn predict_batch_matches_the_reference_over_10_steps_at_batch_32() {
    let s = seed("predict_batch_matches_the_reference_over_10_steps_at_batch_32");
    let (reference, tensor) = both(s);
    let mut r = StdRng::seed_from_u64(s ^ 2);
    let ctx = Tensor::from_vec(uniform(&mut r, 32 * 4 * 64, 1.0), &[32, 4, 64], CPU).unwrap();
    let a = reference.predict_batch(&ctx, 10).unwrap();
    let b = tensor.predict_batch(&ctx, 10).unwrap();
    assert_eq!(a.members.shape(), &[5, 32, 10, 64]);
    common::assert_predictions_close(
        "predict_batch: tensor-ops f32 vs f64 reference",
        &b,
        &a,
        1e-5,
    );
}

/// Widths 64 → 16, hidden 16, latent 4, two members, the default seed.
fn width16() -> RssmConfig {
    RssmConfig {
        embed_dim: 16,
        hidden_dim: 16,
        latent_dim: 4,
        head_dim: 16,
        ensemble: 2,
        ..RssmConfig::default()
    }
}

#[test]
fn the_host_copy_follows_training() {
    let s = seed("the_host_copy_follows_training");
    let cfg = RssmConfig {
        seed: s,
        ..width16()
    };
    for engine in [Engine::Fast, Engine::Reference] {
        let mut acc = common::on_engine(Rssm::new(cfg, CPU).unwrap(), engine);
        let mut r = StdRng::seed_from_u64(s);
        let x = Tensor::from_vec(uniform(&mut r, 2 * 3 * 64, 1.0), &[2, 3, 64], CPU).unwrap();
        let first = x.narrow(1, 0, 1).unwrap().reshape(&[2, 64]).unwrap();
        let before = acc.encode_state(&first);
        let m = acc.model_mut().unwrap();
        m.train_step(&SequenceBatch::new(x.clone()), 1e-2).unwrap();
        let p = acc.predict_batch(&x, 3).unwrap();
        let want = acc.model().unwrap().predict(&x, 3).unwrap();
        let e = rel_err(&p.mean.to_vec().unwrap(), &want.mean.to_vec().unwrap());
        assert!(e < 1e-5, "{engine:?} uses the trained weights: {e:e}");
        let after = acc.encode_state(&first);
        assert_ne!(
            before.unwrap().to_vec().unwrap(),
            after.unwrap().to_vec().unwrap()
        );
    }
}

/// `W + U·diag(S)·Vᵀ` densely in f64, rounded once.
fn dense(w: &Array2<f32>, c: &LowRank) -> Vec<f32> {
    let (m, n) = c.shape();
    let c = c.host().unwrap();
    let mut out = Vec::with_capacity(m * n);
    for i in 0..m {
        for j in 0..n {
            let s: f64 = (0..c.rank())
                .map(|r| f64::from(c.u[(i, r)]) * f64::from(c.s[r]) * f64::from(c.v[(j, r)]))
                .sum();
            out.push((f64::from(w[(i, j)]) + s) as f32);
        }
    }
    out
}

fn random_low_rank(r: &mut StdRng, m: usize, n: usize, k: usize) -> LowRank {
    LowRank::new(
        Array2::from_shape_vec((m, k), uniform(r, m * k, 1.0)).unwrap(),
        Array1::from_vec(uniform(r, k, 2.0)),
        Array2::from_shape_vec((n, k), uniform(r, n * k, 1.0)).unwrap(),
    )
    .unwrap()
}

#[test]
fn apply_corrections_matches_the_dense_product_and_tensor_ops() {
    let s = seed("apply_corrections_matches_the_dense_product_and_tensor_ops");
    let mut r = StdRng::seed_from_u64(s);
    let acc = GpuAccelerator::new(CPU).unwrap();
    let (m, n, k) = (300, 200, 32);
    let c = random_low_rank(&mut r, m, n, k);
    let w0 = Array2::from_shape_vec((m, n), uniform(&mut r, m * n, 1.0)).unwrap();
    let w = Tensor::from_ndarray(&w0, CPU).unwrap();
    acc.apply_corrections(&w, &c).unwrap();
    let got = w.to_vec().unwrap();
    let want = dense(&w0, &c);
    let e = rel_err(&got, &want);
    // The array door gives the same values.
    let mut wa = w0.clone();
    acc.apply_corrections_to_array(wa.view_mut(), &c).unwrap();
    assert_eq!(wa.iter().copied().collect::<Vec<_>>(), got);
    // The tensor-ops path: W + (U ∘ S)·Vᵀ as one f32 GEMM.
    let t = |a: &Array2<f32>| Tensor::from_ndarray(a, CPU).unwrap();
    let us = c.u().mul(c.s()).unwrap();
    let via_ops = t(&w0)
        .add(&us.matmul_t(c.v(), false, true).unwrap())
        .unwrap();
    let e_ops = rel_err(&got, &via_ops.to_vec().unwrap());
    eprintln!(
        "apply_corrections {m}x{n} rank {k}: vs dense f64 {e:e}, vs tensor-ops f32 {e_ops:e}"
    );
    assert!(e < 1e-6, "{e:e}");
    assert!(e_ops < 1e-5, "{e_ops:e}");
}

#[test]
fn apply_tiled_is_exact_for_any_tile_and_shape() {
    let test = "apply_tiled_is_exact_for_any_tile_and_shape";
    let mut runner = TestRunner::new(Config {
        cases: 48,
        rng_seed: RngSeed::Fixed(seed(test)),
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (1usize..70, 1usize..70, 1usize..6, 1usize..80, any::<u64>());
    runner
        .run(&strategy, |(m, n, k, tile, s)| {
            let mut r = StdRng::seed_from_u64(s);
            let c = random_low_rank(&mut r, m, n, k);
            let w0 = Array2::from_shape_vec((m, n), uniform(&mut r, m * n, 1.0)).unwrap();
            let mut w = w0.clone();
            apply_tiled(w.view_mut(), &c, tile).unwrap();
            // Each element is the same f64 sum rounded once: equal up to the f64 summation
            // order inside a tile, far below f32's resolution.
            let got: Vec<f32> = w.iter().copied().collect();
            prop_assert!(rel_err(&got, &dense(&w0, &c)) < 1e-6);
            Ok(())
        })
        .unwrap();
}

#[test]
fn apply_corrections_works_on_views_in_place() {
    // A transposed view and a sub-block of a larger array are updated in place.
    let mut r = StdRng::seed_from_u64(5);
    let c = random_low_rank(&mut r, 6, 4, 2);
    let mut big = Array2::<f32>::zeros((8, 10));
    let acc = GpuAccelerator::new(CPU).unwrap();
    acc.apply_corrections_to_array(big.slice_mut(tensor_ops::ndarray::s![1..7, 3..7]), &c)
        .unwrap();
    let want = c.to_dense().unwrap();
    for i in 0..8 {
        for j in 0..10 {
            let inside = (1..7).contains(&i) && (3..7).contains(&j);
            let v = if inside { want[(i - 1, j - 3)] } else { 0.0 };
            assert!(
                (big[(i, j)] - v).abs() <= 1e-6 * (1.0 + v.abs()),
                "({i}, {j})"
            );
        }
    }
    let mut t = Array2::<f32>::zeros((4, 6));
    acc.apply_corrections_to_array(t.view_mut().reversed_axes(), &c)
        .unwrap();
    assert!(
        rel_err(
            t.t().iter().copied().collect::<Vec<_>>().as_slice(),
            want.iter().copied().collect::<Vec<_>>().as_slice()
        ) < 1e-6
    );
}

#[test]
fn apply_corrections_rejects_bad_input_and_leaves_the_weights() {
    let acc = GpuAccelerator::new(CPU).unwrap();
    let mut r = StdRng::seed_from_u64(6);
    let c = random_low_rank(&mut r, 5, 4, 2);
    let mut w = Array2::<f32>::ones((5, 3));
    assert!(matches!(
        acc.apply_corrections_to_array(w.view_mut(), &c),
        Err(AcceleratorError::Shape {
            what: "weights",
            ..
        })
    ));
    let mut w = Array2::<f32>::ones((5, 4));
    w[(2, 2)] = f32::NAN;
    let before = w.clone();
    assert!(matches!(
        acc.apply_corrections_to_array(w.view_mut(), &c),
        Err(AcceleratorError::NonFinite {
            what: "the weights",
            ..
        })
    ));
    assert!(w
        .iter()
        .zip(&before)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
    // A correction whose sum leaves the f32 range: refused, nothing written.
    let huge = LowRank::new(
        Array2::from_elem((5, 1), 1e30),
        Array1::from_elem(1, 1e30),
        Array2::from_elem((4, 1), 1.0),
    )
    .unwrap();
    let mut w = Array2::<f32>::ones((5, 4));
    let e = acc
        .apply_corrections_to_array(w.view_mut(), &huge)
        .unwrap_err();
    assert!(matches!(e, AcceleratorError::NonFinite { .. }), "{e}");
    assert!(w.iter().all(|&x| x == 1.0));
    assert!(matches!(
        apply_tiled(w.view_mut(), &c, 0),
        Err(AcceleratorError::InvalidArgument { .. })
    ));
}

#[test]
fn model_entry_points_reject_bad_input_with_typed_errors() {
    let none = GpuAccelerator::new(CPU).unwrap();
    let x = Tensor::zeros(&[2, 64], CPU).unwrap();
    assert!(matches!(
        none.encode_state(&x),
        Err(AcceleratorError::NoModel {
            entry: "encode_state"
        })
    ));
    let ctx = Tensor::zeros(&[2, 3, 64], CPU).unwrap();
    assert!(matches!(
        none.predict_batch(&ctx, 2),
        Err(AcceleratorError::NoModel { .. })
    ));
    let cfg = width16();
    for engine in [Engine::Reference, Engine::Fast, Engine::Tensor] {
        let mut acc = common::on_engine(Rssm::new(cfg, CPU).unwrap(), engine);
        // Untrained: no prediction (encoding is a fixed feature map and works).
        let e = acc.predict_batch(&ctx, 2).unwrap_err();
        assert!(
            matches!(e, AcceleratorError::Model(RssmError::Untrained)),
            "{engine:?}: {e}"
        );
        assert!(acc.encode_state(&x).is_ok());
        acc.model_mut()
            .unwrap()
            .train_step(&SequenceBatch::new(ctx.clone()), 1e-3)
            .unwrap();
        // Wrong feature width.
        let e = acc
            .encode_state(&Tensor::zeros(&[2, 65], CPU).unwrap())
            .unwrap_err();
        assert!(
            matches!(
                e,
                AcceleratorError::Model(RssmError::FeatureWidth {
                    expected: 64,
                    got: 65,
                    ..
                })
            ),
            "{engine:?}: {e}"
        );
        assert!(e.to_string().contains("expected width 64, got 65"));
        let e = acc
            .predict_batch(&Tensor::zeros(&[2, 3, 32], CPU).unwrap(), 2)
            .unwrap_err();
        assert!(
            matches!(e, AcceleratorError::Model(RssmError::FeatureWidth { .. })),
            "{e}"
        );
        // Wrong rank, empty batch.
        for shape in [&[64][..], &[2, 3, 64], &[0, 64]] {
            let n: usize = shape.iter().product();
            let t = Tensor::from_vec(vec![0.0f32; n], shape, CPU).unwrap();
            assert!(
                matches!(acc.encode_state(&t), Err(AcceleratorError::Shape { .. })),
                "{engine:?} {shape:?}"
            );
        }
        assert!(matches!(
            acc.predict_batch(&x, 2),
            Err(AcceleratorError::Model(RssmError::Shape { .. }))
        ));
        assert!(matches!(
            acc.predict_batch(&Tensor::zeros(&[2, 0, 64], CPU).unwrap(), 2),
            Err(AcceleratorError::Model(RssmError::Empty { .. }))
        ));
        // NaN and Inf.
        for bad in [f32::NAN, f32::INFINITY] {
            let mut v = vec![0.5f32; 2 * 64];
            v[70] = bad;
            let t = Tensor::from_vec(v, &[2, 64], CPU).unwrap();
            assert!(
                matches!(
                    acc.encode_state(&t),
                    Err(AcceleratorError::NonFinite {
                        what: "features",
                        ..
                    })
                ),
                "{engine:?} {bad}"
            );
            let c = t.reshape(&[2, 1, 64]).unwrap();
            assert!(matches!(
                acc.predict_batch(&c, 2),
                Err(AcceleratorError::Model(RssmError::NonFinite { .. }))
            ));
        }
        // No steps.
        assert!(matches!(
            acc.predict_batch(&ctx, 0),
            Err(AcceleratorError::Model(RssmError::Empty { .. }))
        ));
    }
}

#[test]
fn gpu_entry_points_match_the_cpu_reference() {
    let Some(b) = gpu_cuda::testing::backend_or_skip("gpu_entry_points_match_the_cpu_reference")
    else {
        return;
    };
    let gpu = Device::Cuda(b.info().ordinal);
    let s = seed("gpu_entry_points_match_the_cpu_reference");
    let reference = common::on_engine(model(s, CPU), Engine::Reference);
    let on_gpu = GpuAccelerator::with_model(model(s, CPU).to_device(gpu).unwrap());
    assert_eq!(on_gpu.engine(), Engine::Fused, "the CUDA default");
    let mut r = StdRng::seed_from_u64(s ^ 3);
    let x = Tensor::from_vec(uniform(&mut r, 32 * 64, 2.0), &[32, 64], CPU).unwrap();
    let a = reference.encode_state(&x).unwrap();
    let g = on_gpu.encode_state(&x.to(gpu).unwrap()).unwrap();
    assert_eq!(g.device(), gpu);
    let e = rel_err(&g.to_vec().unwrap(), &a.to_vec().unwrap());
    eprintln!("encode_state on {gpu} vs f64 reference: rel err {e:e}");
    assert!(e < 1e-5, "{e:e}");
    let ctx = Tensor::from_vec(uniform(&mut r, 32 * 4 * 64, 1.0), &[32, 4, 64], CPU).unwrap();
    let pa = reference.predict_batch(&ctx, 10).unwrap();
    let pg = on_gpu.predict_batch(&ctx.to(gpu).unwrap(), 10).unwrap();
    let label = format!("predict_batch on {gpu} vs f64 reference");
    common::assert_predictions_close(&label, &pg, &pa, 1e-5);
    // Inputs on the CPU handed to the CUDA accelerator: a device mismatch, named.
    for e in [
        on_gpu.encode_state(&x).unwrap_err(),
        on_gpu.predict_batch(&ctx, 2).unwrap_err(),
    ] {
        assert!(matches!(e, AcceleratorError::DeviceMismatch { .. }), "{e}");
    }
    // Factors on the CPU handed to the CUDA accelerator: a device mismatch, named.
    let c = random_low_rank(&mut r, 8, 6, 2);
    let w = Tensor::zeros(&[8, 6], gpu).unwrap();
    assert!(matches!(
        on_gpu.apply_corrections(&w, &c),
        Err(AcceleratorError::DeviceMismatch {
            what: "the correction",
            ..
        })
    ));
    for engine in [Engine::Reference, Engine::Fast] {
        assert!(GpuAccelerator::new(gpu)
            .unwrap()
            .with_engine(engine)
            .is_err());
    }
    let mut cpu_acc = GpuAccelerator::new(CPU).unwrap();
    assert!(matches!(
        cpu_acc.set_model(model(s, gpu)),
        Err(AcceleratorError::DeviceMismatch { .. })
    ));
}

#[test]
fn the_reference_model_rejects_bad_input_with_typed_errors() {
    use rssm::reference::HostRssm;
    let host = HostRssm::from_model(&Rssm::new(common::tiny_config(), CPU).unwrap()).unwrap();
    common::assert_host_engine_errors(&host, |p| assert!(p.is_ok()), f32::NAN);
}
