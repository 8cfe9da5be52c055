//! Benchmarks of hybrid-trainer. `gpu-bench` (src/bin) measures the GPU's own ceilings, then
//! every kernel with CUDA events, beside PyTorch in the same run; `benches/cpu_ops.rs` covers
//! the CPU reference paths with criterion. This library holds what both share.

use serde::{Deserialize, Serialize};

/// One measured row.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    /// Short id shared with the PyTorch peer (`add`, `softmax`, ...).
    pub id: String,
    /// What was measured, with its size.
    pub what: String,
    /// Median time in microseconds.
    pub median_us: f64,
    /// Bytes moved (each input read once, each output written once), if memory-bound.
    pub bytes: Option<f64>,
    /// Floating-point operations, if compute-bound.
    pub flops: Option<f64>,
}

impl Row {
    /// A row of `median_us` microseconds, with its bytes or FLOPs.
    pub fn new(
        id: &str,
        what: String,
        median_us: f64,
        bytes: Option<f64>,
        flops: Option<f64>,
    ) -> Row {
        Row {
            id: id.into(),
            what,
            median_us,
            bytes,
            flops,
        }
    }

    /// Achieved GB/s, when the row counts bytes.
    pub fn gbps(&self) -> Option<f64> {
        self.bytes.map(|b| b / (self.median_us * 1e-6) / 1e9)
    }

    /// Achieved TFLOP/s, when the row counts FLOPs.
    pub fn tflops(&self) -> Option<f64> {
        self.flops.map(|f| f / (self.median_us * 1e-6) / 1e12)
    }
}

/// The optimiser of the GPT training-step rows, as nanoGPT and the PyTorch peers set it up:
/// AdamW with β2 0.99, weight decay 0.1 and global-norm clipping at 1.0.
pub fn gpt_adamw(model: &models::gpt::Gpt) -> tensor_ops::Result<tensor_ops::optim::AdamW> {
    model.store().adamw(tensor_ops::optim::AdamWParams {
        beta2: 0.99,
        weight_decay: 0.1,
        max_grad_norm: Some(1.0),
        ..Default::default()
    })
}

/// Median microseconds of a full eager training step (forward, backward, clip, AdamW,
/// `loss.item()`) of nanoGPT's shakespeare-char GPT at `batch × block` on `dev`, on random
/// batches from `text`, after 3 untimed steps; and the model's parameter count. The CUDA
/// bench sets TF32 around it; wgpu and the CPU run it as it is.
pub fn gpt_train_step_us(
    dev: tensor_ops::Device,
    text: &str,
    (batch, block, steps): (usize, usize, usize),
) -> anyhow::Result<(f64, usize)> {
    use models::gpt::{Dataset, Gpt, GptConfig};
    let ds = Dataset::from_text(text, 0.9)?;
    let mut cfg = GptConfig::shakespeare_char(ds.tokenizer.vocab_size());
    cfg.block_size = cfg.block_size.max(block);
    let model = Gpt::new(cfg, 1, dev)?;
    let mut opt = gpt_adamw(&model)?;
    let mut rng = Dataset::rng(1);
    let mut times = Vec::new();
    for i in 0..steps + 3 {
        let t0 = std::time::Instant::now();
        let (x, y) = ds.batch(false, batch, block, &mut rng, dev)?;
        let loss = model.loss(&x, &y, Some(i as u64))?;
        let g = loss.backward()?;
        opt.step(&g, 1e-3)?;
        loss.item()?;
        if i >= 3 {
            times.push(t0.elapsed().as_secs_f64() * 1e6);
        }
    }
    Ok((median(&times), model.num_params()))
}

/// Median of a sample (sorted copy); NaN for an empty one.
pub fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_rates() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
        let r = Row {
            id: "x".into(),
            what: "x".into(),
            median_us: 1000.0,
            bytes: Some(4e9),
            flops: None,
        };
        assert!((r.gbps().unwrap() - 4000.0).abs() < 1e-9);
        assert!(r.tflops().is_none());
    }
}
