//! Host time per queued operation (`--only-host`): how long the host spends issuing one small op
//! at each layer of the stack, with no synchronisation in between (the GPU work is tiny and
//! runs behind). Rows: µs of host time per call, median of 5 rounds of 2000 calls.

use crate::Row;
use anyhow::Result;
use gpu_core::nn::Primitives;
use gpu_core::{Backend, DType, Device};
use std::time::Instant;
use tensor_ops::Tensor;

const CALLS: usize = 2000;

fn per_call(mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let gpu = tensor_ops::cuda_backend(0)?;
    let mut rounds = Vec::new();
    for r in 0..6 {
        gpu.synchronize()?;
        let t0 = Instant::now();
        for _ in 0..CALLS {
            f()?;
        }
        let us = t0.elapsed().as_secs_f64() * 1e6 / CALLS as f64;
        gpu.synchronize()?;
        if r > 0 {
            rounds.push(us);
        }
    }
    Ok(benches::median(&rounds))
}

/// [`per_call`] of a tensor op run under `no_grad`, its result dropped.
fn per_untracked_call(f: impl Fn() -> tensor_ops::Result<Tensor>) -> Result<f64> {
    per_call(|| tensor_ops::no_grad(&f).map(drop).map_err(Into::into))
}

pub fn measure() -> Result<Vec<Row>> {
    let d = Device::Cuda(0);
    let gpu = tensor_ops::cuda_backend(0)?;
    let mut rows = Vec::new();
    let mut add = |id: &str, what: &str, us: f64| {
        println!("{id}: {us:.2} µs host time a call ({what})");
        rows.push(crate::row(
            id,
            format!("host µs a call: {what}"),
            us,
            None,
            None,
        ));
    };
    add(
        "host_backend_lookup",
        "tensor_ops::cuda_backend(0)",
        per_call(|| tensor_ops::cuda_backend(0).map(drop).map_err(Into::into))?,
    );
    add(
        "host_alloc_free",
        "pool allocate + drop, 4 f32",
        per_call(|| gpu.allocate(DType::F32, 4).map(drop).map_err(Into::into))?,
    );
    let mut buf = gpu.allocate(DType::F32, 4)?;
    add(
        "host_fill",
        "backend fill of 4 f32 (gate, checks, launch)",
        per_call(|| Ok(gpu.fill(&mut buf, 1.0)?))?,
    );
    let (x, y) = (Tensor::ones(&[4], d)?, Tensor::ones(&[4], d)?);
    add(
        "host_tensor_add_nograd",
        "tensor add of 4 f32, no autograd",
        per_untracked_call(|| x.add(&y))?,
    );
    let w = Tensor::ones(&[4], d)?.requires_grad_()?;
    add(
        "host_tensor_add_grad",
        "tensor add of 4 f32 recorded for autograd",
        per_call(|| w.add(&y).map(drop).map_err(Into::into))?,
    );
    let a = Tensor::ones(&[8, 8], d)?;
    add(
        "host_tensor_matmul",
        "tensor matmul 8×8, no autograd (cuBLAS)",
        per_untracked_call(|| a.matmul(&a))?,
    );
    let ln_w = Tensor::ones(&[8], d)?;
    add(
        "host_tensor_layernorm",
        "tensor layer_norm 8×8, no autograd",
        per_untracked_call(|| a.layer_norm(&ln_w, &ln_w, 1e-5))?,
    );
    Ok(rows)
}
