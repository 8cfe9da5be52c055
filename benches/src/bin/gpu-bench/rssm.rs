//! The world model's accelerator on the GPU, seed A's table at batch 32 (state encode, the
//! ensemble rollout over 10 steps, randomized SVD, the rank-32 correction), plus the randomized
//! SVDs at the sizes with their reconstruction errors. Timed on tensor-ops' shared
//! backend (the accelerator's stream), with CUDA events around each whole call — host
//! synchronisations inside a call count.

use crate::row;
use anyhow::Result;
use benches::{median, Row};
use gpu_cuda::GpuTimer;
use rssm::{
    Engine, GpuAccelerator, LowRank, Rssm, RssmConfig, SequenceBatch, SvdMethod, SvdOptions,
};
use tensor_ops::{Device, Tensor};

const BATCH: usize = 32;
const STEPS: usize = 10;

/// Median microseconds of `f` over 3 warm-ups and `reps` timed calls.
fn time(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let gpu = tensor_ops::cuda_backend(0)?;
    let timer = GpuTimer::new(&gpu)?;
    for _ in 0..3 {
        f()?;
    }
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        timer.start(&gpu)?;
        f()?;
        samples.push(f64::from(timer.stop(&gpu)?) * 1e3);
    }
    Ok(median(&samples))
}

/// `‖A − U·diag(S)·Vᵀ‖_F / ‖A‖_F` on the device (f32, no TF32).
fn rel_error(a: &Tensor, c: &LowRank) -> Result<f64> {
    let k = c.rank();
    let us = c.u().mul(&c.s().reshape(&[1, k])?)?;
    let diff = a.sub(&us.matmul_t(c.v(), false, true)?)?;
    let sq = |t: &Tensor| -> Result<f64> { Ok(f64::from(t.mul(t)?.sum_all()?.item()?)) };
    Ok((sq(&diff)? / sq(a)?).sqrt())
}

/// The test matrix: `A = G1·G2 + 0.01·N`, `G1` `m × r`, `G2` `r × n`, all Gaussian.
fn low_rank_plus_noise(m: usize, n: usize, r: usize, d: Device) -> Result<Tensor> {
    let g1 = Tensor::randn(&[m, r], 1.0, 1, d)?;
    let g2 = Tensor::randn(&[r, n], 1.0, 2, d)?;
    let noise = Tensor::randn(&[m, n], 0.01, 3, d)?;
    Ok(g1.matmul(&g2)?.add(&noise)?)
}

pub(crate) fn measure(reps: usize, only_svd: bool) -> Result<Vec<Row>> {
    let d = Device::Cuda(0);
    let mut rows = Vec::new();
    if only_svd {
        let acc = GpuAccelerator::new(d)?;
        svd_rows(&acc, reps, &mut rows)?;
        return Ok(rows);
    }
    let mut model = Rssm::new(RssmConfig::default(), d)?;
    let x = Tensor::randn(&[2, 3, 64], 1.0, 4, d)?;
    model.train_step(&SequenceBatch::new(x), 1e-4)?;
    let tensor = GpuAccelerator::with_model(model.to_device(d)?).with_engine(Engine::Tensor)?;
    let acc = GpuAccelerator::with_model(model);
    let features = Tensor::randn(&[BATCH, 64], 1.0, 5, d)?;
    let us = time(reps, || Ok(acc.encode_state(&features).map(drop)?))?;
    rows.push(row(
        "rssm_encode",
        format!("state encode, batch {BATCH} (64 → 128)"),
        us,
        None,
        None,
    ));
    let context = features.reshape(&[BATCH, 1, 64])?;
    let us = time(reps, || Ok(acc.predict_batch(&context, STEPS).map(drop)?))?;
    rows.push(row(
        "rssm_rollout",
        format!("ensemble rollout, 5 members × {STEPS} steps, batch {BATCH} (fused kernel)"),
        us,
        None,
        None,
    ));
    let us = time(reps.min(10), || {
        Ok(tensor.predict_batch(&context, STEPS).map(drop)?)
    })?;
    rows.push(row(
        "rssm_rollout_tensor",
        format!("ensemble rollout, 5 members × {STEPS} steps, batch {BATCH} (tensor-ops ops)"),
        us,
        None,
        None,
    ));
    // The fused kernel alone (random weights at the model's sizes), 10 and 1 imagined steps.
    {
        use gpu_core::Backend;
        let gpu = tensor_ops::cuda_backend(0)?;
        for (steps, batch) in [(STEPS, BATCH), (1, BATCH), (STEPS, 1)] {
            let c = RssmConfig::default();
            let dims = rssm::rollout_dims(&c, batch, 1, steps);
            let w = Tensor::randn(&[c.ensemble * dims.member_len()], 0.05, 8, d)?;
            let e = Tensor::randn(&[batch, c.embed_dim], 1.0, 9, d)?;
            let mut out = gpu.allocate(
                gpu_core::DType::F32,
                c.ensemble * batch * steps * c.output_dim,
            )?;
            let mut mean = gpu.allocate(gpu_core::DType::F32, batch * steps * c.output_dim)?;
            let mut dis = gpu.allocate(gpu_core::DType::F32, batch * steps)?;
            let us = time(reps, || {
                w.with_cuda_buffer(|g, wb| {
                    e.with_cuda_buffer(|_, eb| {
                        g.rssm_rollout_fused(&dims, wb, eb, &mut out, &mut mean, &mut dis)
                    })
                })?;
                Ok(())
            })?;
            rows.push(row(
                &format!("rssm_rollout_kernel_{steps}_b{batch}"),
                format!("the fused rollout kernel alone, {steps} steps, batch {batch}"),
                us,
                None,
                None,
            ));
        }
    }
    svd_rows(&acc, reps, &mut rows)?;
    let n = 1024;
    let a = low_rank_plus_noise(n, n, 32, d)?;
    let c = acc.compress_residuals(&a, 32, &SvdOptions::default())?;
    let w = Tensor::randn(&[n, n], 1.0, 6, d)?;
    let us = time(reps, || Ok(acc.apply_corrections(&w, &c)?))?;
    rows.push(row(
        "correction_1024_k32",
        "W += U·diag(S)·Vᵀ in place, rank 32, 1024²".into(),
        us,
        Some(2.0 * (n * n * 4) as f64),
        Some(2.0 * (n * n * 32) as f64),
    ));
    Ok(rows)
}

/// The randomized SVD rows: every CUDA method at the two sizes, with their errors.
fn svd_rows(acc: &GpuAccelerator, reps: usize, rows: &mut Vec<Row>) -> Result<()> {
    let d = Device::Cuda(0);
    for (m, n, k) in [(1024, 1024, 32), (4096, 4096, 64)] {
        let a = low_rank_plus_noise(m, n, k, d)?;
        for (name, method, p) in [
            ("svd", SvdMethod::Halko, 0),
            ("svd_eager", SvdMethod::HalkoEager, 0),
            ("svd_householder", SvdMethod::HalkoHouseholder, 0),
            ("gesvdr", SvdMethod::CusolverGesvdr, 0),
        ] {
            let opts = SvdOptions {
                oversample: p,
                power_iters: 2,
                seed: 7,
                method,
            };
            let c = acc.compress_residuals(&a, k, &opts)?;
            let err = rel_error(&a, &c)?;
            let us = time(reps.min(20), || {
                Ok(acc.compress_residuals(&a, k, &opts).map(drop)?)
            })?;
            let id = format!("{name}_{m}_k{k}");
            let what = format!("{method:?} rank {k} of {m}² (p {p}, q 2), rel err {err:.3e}");
            rows.push(row(&id, what, us, None, None));
        }
    }
    Ok(())
}
