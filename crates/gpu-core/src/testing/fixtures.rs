//! Fixtures the test suites of several crates share: comparisons and problem data that the CPU
//! fast kernels', the device backends' and the model crates' tests would otherwise each restate.

use super::attention_fwd_bwd;
use crate::error::Result;
use crate::nn::attention::{AttnDims, AttnQkv};
use crate::nn::optim::AdamWConfig;
use crate::nn::AttentionOps;

/// Whether `a` and `b` hold the same bits element by element (over the shorter of the two, as
/// `zip` pairs them): NaN payloads and the sign of zero count.
pub fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// The hostile floats the backends' edge-case tests mix into their inputs first: NaN, both
/// infinities, both zeros and a huge value of each sign (each suite appends its own extras).
pub const HOSTILE_FLOATS: [f32; 7] = [
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    0.0,
    -0.0,
    1e30,
    -1e30,
];

/// One causal-attention problem: its sizes and scale, inputs `q`, `k`, `v` of shape
/// `[n, t, d]`, and the output gradient `dout` of the same shape.
#[derive(Debug, Clone, PartialEq)]
pub struct AttnProblem {
    /// Sequences, positions, head dimension and score scale.
    pub dims: AttnDims,
    /// Queries.
    pub q: Vec<f32>,
    /// Keys.
    pub k: Vec<f32>,
    /// Values.
    pub v: Vec<f32>,
    /// Output gradient.
    pub dout: Vec<f32>,
}

impl AttnProblem {
    /// A problem of shape `[n, t, d]` with scale `1/√d` whose tensors `draw(len, amplitude)`
    /// fills in the order `q`, `k` (amplitude `amp`), `v`, `dout` (amplitude 1).
    pub fn draw(
        (n, t, d): (usize, usize, usize),
        amp: f32,
        mut draw: impl FnMut(usize, f32) -> Vec<f32>,
    ) -> Self {
        let len = n * t * d;
        let scale = 1.0 / (d as f32).sqrt();
        Self {
            dims: AttnDims { n, t, d, scale },
            q: draw(len, amp),
            k: draw(len, amp),
            v: draw(len, 1.0),
            dout: draw(len, 1.0),
        }
    }

    /// The problem's shape and scale, for messages.
    pub fn what(&self) -> String {
        let AttnDims { n, t, d, scale } = self.dims;
        format!("n={n} t={t} d={d} scale={scale}")
    }
}

/// The AdamW settings the optimizer tests use: the usual moments (`β1` 0.9, `β2` 0.999,
/// `ε` 1e-8) at learning rate `lr` and step `step`.
pub const fn adamw_config(lr: f32, step: u32) -> AdamWConfig {
    AdamWConfig {
        lr,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        step,
    }
}

/// [`attention_fwd_bwd`] into fresh outputs, each made by `alloc(len)` in the order `out`,
/// `lse`, `dq`, `dk`, `dv`: returns `[out, lse, dq, dk, dv]`.
pub fn attention_outputs<B: AttentionOps>(
    b: &B,
    x: AttnQkv<'_, B::Buffer>,
    dout: &B::Buffer,
    dims: AttnDims,
    mut alloc: impl FnMut(usize) -> B::Buffer,
) -> Result<[B::Buffer; 5]> {
    let len = dims.n * dims.t * dims.d;
    let (mut out, mut lse) = (alloc(len), alloc(dims.n * dims.t));
    let (mut dq, mut dk, mut dv) = (alloc(len), alloc(len), alloc(len));
    let grads = (&mut dq, &mut dk, &mut dv);
    attention_fwd_bwd(b, x, dout, (&mut out, &mut lse), grads, dims)?;
    Ok([out, lse, dq, dk, dv])
}
