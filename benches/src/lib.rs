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
