//! The NN rows of gpu-bench (issue 3): activations, softmax / LayerNorm / RMSNorm forward and
//! backward at 8192×4096, causal attention at B64 H6 T256 D64, AdamW over the 10.7M parameters
//! of nanoGPT's shakespeare-char model, and that model's full training step.

use crate::{row, Bench, COLS, ROWS};
use anyhow::Result;
use benches::Row;
use gpu_core::nn::attention::{AttnDims, AttnQkv, PackedSaved};
use gpu_core::nn::optim::AdamWBuffers;
use gpu_core::nn::rows::{LayerNormBwdIn, RmsNormBwdIn, RowBwdIn};
use gpu_core::nn::{Activation, AdamWConfig, AttentionOps, OptimOps, Primitives, RowOps};
use gpu_cuda::CudaBuffer;
use models::gpt::{Dataset, Gpt, GptConfig};
use std::time::Instant;
use tensor_ops::{Device, Precision};

pub fn measure(b: &Bench) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    let (n, cols) = (ROWS * COLS, COLS);
    let nb = (n * 4) as f64;
    let size = format!("{ROWS}×{COLS} f32");
    let xs = [b.random(n)?, b.random(n)?];
    let dys = [b.random(n)?, b.random(n)?];
    let mut o = b.out(n)?;
    for (id, op) in [("gelu", Activation::Gelu), ("silu", Activation::Silu)] {
        let us = b.time(|i| b.gpu.activation_fwd(op, &xs[i % 2], &mut o))?;
        rows.push(row(
            id,
            format!("{id} forward {size}"),
            us,
            Some(2.0 * nb),
            None,
        ));
    }
    // Softmax backward on a real softmax output.
    let mut y = b.out(n)?;
    b.gpu.softmax_fwd(&xs[0], &mut y, cols)?;
    let us = b.time(|i| {
        let (y, dy) = (&y, &dys[i % 2]);
        b.gpu.softmax_bwd(RowBwdIn { y, dy }, &mut o, cols)
    })?;
    rows.push(row(
        "softmax_bwd",
        format!("softmax backward {size} (y, dy in; dx out)"),
        us,
        Some(3.0 * nb),
        None,
    ));
    norms(b, &mut rows, (&xs, &dys), (&mut o, &mut y))?;
    drop((xs, dys, o, y));
    attention(b, &mut rows)?;
    adamw(b, &mut rows)?;
    Ok(rows)
}

/// The LayerNorm and RMSNorm rows, on the inputs `xs` and output gradients `dys` (two of each,
/// alternated between runs) with the scratch outputs `o` and `y`.
fn norms(
    b: &Bench,
    rows: &mut Vec<Row>,
    (xs, dys): (&[CudaBuffer; 2], &[CudaBuffer; 2]),
    (o, y): (&mut CudaBuffer, &mut CudaBuffer),
) -> Result<()> {
    let (n, cols) = (ROWS * COLS, COLS);
    let nb = (n * 4) as f64;
    let size = format!("{ROWS}×{COLS} f32");
    let (w, bias) = (b.random(cols)?, b.random(cols)?);
    let (mut mean, mut rstd) = (b.out(ROWS)?, b.out(ROWS)?);
    let us = b.time(|i| {
        b.gpu.layernorm_fwd(
            (&xs[i % 2], &w, &bias),
            (&mut *o, &mut mean, &mut rstd),
            cols,
            1e-5,
        )
    })?;
    rows.push(row(
        "layernorm_fwd",
        format!("layernorm forward with saved stats {size}"),
        us,
        Some(2.0 * nb),
        None,
    ));
    b.gpu.layernorm_fwd(
        (&xs[0], &w, &bias),
        (&mut *y, &mut mean, &mut rstd),
        cols,
        1e-5,
    )?;
    let (mut dw, mut db) = (b.out(cols)?, b.out(cols)?);
    let us = b.time(|i| {
        b.gpu.layernorm_bwd(
            LayerNormBwdIn {
                x: &xs[0],
                w: &w,
                mean: &mean,
                rstd: &rstd,
                dy: &dys[i % 2],
            },
            (&mut *o, &mut dw, &mut db),
            cols,
        )
    })?;
    rows.push(row(
        "layernorm_bwd",
        format!("layernorm backward {size} (x, dy in; dx out)"),
        us,
        Some(3.0 * nb),
        None,
    ));
    let us = b.time(|i| {
        b.gpu
            .rmsnorm_fwd(&xs[i % 2], &w, &mut *o, &mut rstd, cols, 1e-5)
    })?;
    rows.push(row(
        "rmsnorm_fwd",
        format!("rmsnorm forward {size}"),
        us,
        Some(2.0 * nb),
        None,
    ));
    b.gpu
        .rmsnorm_fwd(&xs[0], &w, &mut *y, &mut rstd, cols, 1e-5)?;
    let us = b.time(|i| {
        b.gpu.rmsnorm_bwd(
            RmsNormBwdIn {
                x: &xs[0],
                w: &w,
                rstd: &rstd,
                dy: &dys[i % 2],
            },
            (&mut *o, &mut dw),
            cols,
        )
    })?;
    rows.push(row(
        "rmsnorm_bwd",
        format!("rmsnorm backward {size} (x, dy in; dx out)"),
        us,
        Some(3.0 * nb),
        None,
    ));
    Ok(())
}

/// The causal attention rows.
fn attention(b: &Bench, rows: &mut Vec<Row>) -> Result<()> {
    // Causal attention, B64 H6 T256 D64: FLOPs counted as PyTorch's causal half, 4·n·t²·d/2.
    let (nh, t, d) = (64 * 6, 256, 64);
    let len = nh * t * d;
    let (q, k, v) = (b.random(len)?, b.random(len)?, b.random(len)?);
    let mut out = b.out(len)?;
    let mut lse = b.out(nh * t)?;
    let scale = 1.0 / (d as f32).sqrt();
    let fwd_flops = 4.0 * nh as f64 * (t * t) as f64 * d as f64 / 2.0;
    let us = b.time(|_| {
        b.gpu.causal_attention_fwd(
            AttnQkv {
                q: &q,
                k: &k,
                v: &v,
            },
            (&mut out, &mut lse),
            AttnDims { n: nh, t, d, scale },
        )
    })?;
    rows.push(row(
        "attn_fwd",
        "causal attention forward B64 H6 T256 D64 f32".into(),
        us,
        None,
        Some(fwd_flops),
    ));
    let dout = b.random(len)?;
    let (mut dq, mut dk, mut dv) = (b.out(len)?, b.out(len)?, b.out(len)?);
    let us = b.time(|_| {
        b.gpu.causal_attention_bwd(
            AttnQkv {
                q: &q,
                k: &k,
                v: &v,
            },
            PackedSaved {
                out: &out,
                lse: &lse,
                dout: &dout,
            },
            (&mut dq, &mut dk, &mut dv),
            AttnDims { n: nh, t, d, scale },
        )
    })?;
    rows.push(row(
        "attn_bwd",
        "causal attention backward B64 H6 T256 D64 f32".into(),
        us,
        None,
        Some(2.5 * fwd_flops),
    ));
    Ok(())
}

/// The AdamW row.
fn adamw(b: &Bench, rows: &mut Vec<Row>) -> Result<()> {
    // AdamW over nanoGPT shakespeare-char's parameter shapes (10.7M).
    let model = Gpt::new(GptConfig::shakespeare_char(65), 1, Device::Cpu)?;
    let shapes: Vec<usize> = model
        .store()
        .params()
        .iter()
        .map(|p| p.tensor().numel())
        .collect();
    let total: usize = shapes.iter().sum();
    let mk = |fill: bool| -> Result<Vec<CudaBuffer>> {
        shapes
            .iter()
            .map(|&s| {
                if fill {
                    b.random(s)
                } else {
                    let mut z = b.out(s)?;
                    b.gpu.fill(&mut z, 0.0)?;
                    Ok(z)
                }
            })
            .collect()
    };
    let (mut p, g, mut m, mut vv) = (mk(true)?, mk(true)?, mk(false)?, mk(false)?);
    let wd: Vec<f32> = vec![0.1; shapes.len()];
    let mut step = 0;
    let us = b.time(|_| {
        step += 1;
        let mut pr: Vec<&mut CudaBuffer> = p.iter_mut().collect();
        let gr: Vec<&CudaBuffer> = g.iter().collect();
        let mut mr: Vec<&mut CudaBuffer> = m.iter_mut().collect();
        let mut vr: Vec<&mut CudaBuffer> = vv.iter_mut().collect();
        let cfg = AdamWConfig {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.99,
            eps: 1e-8,
            step,
        };
        b.gpu.adamw_step(
            AdamWBuffers {
                params: &mut pr,
                grads: &gr,
                m: &mut mr,
                v: &mut vr,
                weight_decay: &wd,
                grad_scale: None,
            },
            cfg,
        )
    })?;
    // Reads p, g, m, v and writes p, m, v: 7 × 4 bytes per parameter.
    rows.push(row(
        "adamw",
        format!(
            "fused AdamW over {:.1}M params ({} tensors)",
            total as f64 / 1e6,
            shapes.len()
        ),
        us,
        Some(7.0 * 4.0 * total as f64),
        None,
    ));
    Ok(())
}

/// Median milliseconds of a full training step (forward, backward, clip, AdamW, loss.item())
/// of nanoGPT's shakespeare-char GPT, batch 64 × 256, on random-token batches from `text`.
pub fn train_step(gpu_ordinal: usize, text: &str, steps: usize, tf32: bool) -> Result<Row> {
    let dev = Device::Cuda(gpu_ordinal);
    tensor_ops::cuda_backend(gpu_ordinal)?.set_tf32(tf32);
    let measured = benches::gpt_train_step_us(dev, text, (64, 256, steps));
    tensor_ops::cuda_backend(gpu_ordinal)?.set_tf32(false);
    let (us, params) = measured?;
    let tokens = 64.0 * 256.0;
    let id = if tf32 { "gpt_step_tf32" } else { "gpt_step" };
    let what = format!(
        "GPT train step, shakespeare-char config ({:.1}M params, batch 64×256){}: {:.0}K tok/s",
        params as f64 / 1e6,
        if tf32 { ", TF32 matmuls" } else { ", fp32" },
        tokens / (us * 1e-6) / 1e3
    );
    Ok(crate::row(id, what, us, None, None))
}

/// Steps queued back to back with the loss read every 10 (a training loop with a log
/// interval), in TF32 and in bf16 mixed precision: mean time a step, median of 5 rounds after
/// one untimed round; eager (`gpt_pipe_{tf32,bf16}`, PyTorch eager's ids) and replaying the
/// captured step (`gpt_pipe_{tf32,bf16}_graph`; PyTorch's `torch.compile` rows are
/// `gpt_pipe_{tf32,bf16}_compile`).
pub fn pipelined_steps(gpu_ordinal: usize, text: &str) -> Result<Vec<Row>> {
    let dev = Device::Cuda(gpu_ordinal);
    tensor_ops::cuda_backend(gpu_ordinal)?.set_tf32(true);
    let ds = Dataset::from_text(text, 0.9)?;
    let cfg = GptConfig::shakespeare_char(ds.tokenizer.vocab_size());
    let mut rows = Vec::new();
    let runs = [Precision::Tf32, Precision::Bf16]
        .into_iter()
        .flat_map(|p| [(p, false), (p, true)]);
    for (precision, graphed) in runs {
        let mut model = Gpt::new(cfg, 1, dev)?;
        model.set_precision(precision)?;
        let mut opt = benches::gpt_adamw(&model)?;
        let step = if graphed {
            Some(models::gpt::GraphedStep::capture(
                &model, &mut opt, 64, 256,
            )?)
        } else {
            None
        };
        let mut rng = Dataset::rng(1);
        let mut i = 0u64;
        let mut times = Vec::new();
        for round in 0..6 {
            gpu_core::Backend::synchronize(&tensor_ops::cuda_backend(gpu_ordinal)?)?;
            let t0 = Instant::now();
            let mut last = None;
            for _ in 0..10 {
                i += 1;
                last = Some(match &step {
                    Some(g) => {
                        let (x, y) = ds.batch_ids(false, 64, 256, &mut rng)?;
                        g.step(&mut opt, &x, &y, i, 1e-3)?;
                        g.loss().clone()
                    }
                    None => {
                        let (x, y) = ds.batch(false, 64, 256, &mut rng, dev)?;
                        let loss = model.loss(&x, &y, Some(i))?;
                        let g = loss.backward()?;
                        opt.step(&g, 1e-3)?;
                        loss.detach()
                    }
                });
            }
            if let Some(l) = last {
                l.item()?;
            }
            if round > 0 {
                times.push(t0.elapsed().as_secs_f64() * 1e6 / 10.0);
            }
        }
        let us = benches::median(&times);
        let tokens = 64.0 * 256.0;
        let (id, how) = if graphed {
            (
                format!("gpt_pipe_{precision}_graph"),
                "one captured CUDA graph a step",
            )
        } else {
            (format!("gpt_pipe_{precision}"), "eager")
        };
        let what = format!(
            "GPT train step, shakespeare-char, {precision}, loss read every 10 steps, {how}: {:.0}K tok/s",
            tokens / (us * 1e-6) / 1e3
        );
        rows.push(crate::row(&id, what, us, None, None));
    }
    tensor_ops::cuda_backend(gpu_ordinal)?.set_tf32(false);
    Ok(rows)
}
