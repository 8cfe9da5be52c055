//! Optimiser steps over many parameters at once.

use crate::backend::Backend;
use crate::error::Result;

/// AdamW hyper-parameters for one step (PyTorch's `torch.optim.AdamW` semantics: decoupled
/// weight decay `p -= lr·wd·p`, bias-corrected moments).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// 1-based step number, for the bias corrections.
    pub step: u32,
}

/// Multi-tensor optimiser operations.
pub trait OptimOps: Backend {
    /// Global-norm clipping coefficient, computed on the device: writes
    /// `out[0] = sqrt(Σ over all grads of g²)` and `out[1] = min(1, max_norm / (out[0] + 1e-6))`.
    /// `out` holds 2 f32. No host transfer on CUDA.
    fn clip_coefficient(
        &self,
        grads: &[&Self::Buffer],
        max_norm: f32,
        out: &mut Self::Buffer,
    ) -> Result<()>;

    /// One fused AdamW step over every parameter: with `g = grads[i] · grad_scale[1]` when
    /// `grad_scale` is given (the [`OptimOps::clip_coefficient`] output; else `g = grads[i]`):
    /// `m = β1·m + (1−β1)·g`, `v = β2·v + (1−β2)·g²`, `p -= lr·wd[i]·p`,
    /// `p -= lr · (m/(1−β1^step)) / (sqrt(v/(1−β2^step)) + eps)`. One kernel launch on CUDA.
    fn adamw_step(
        &self,
        params: &mut [&mut Self::Buffer],
        grads: &[&Self::Buffer],
        m: &mut [&mut Self::Buffer],
        v: &mut [&mut Self::Buffer],
        weight_decay: &[f32],
        grad_scale: Option<&Self::Buffer>,
        cfg: AdamWConfig,
    ) -> Result<()>;
}
