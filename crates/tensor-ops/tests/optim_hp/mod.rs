//! The hyper-parameters the optimizer tests run each optimizer with (`optimizers.rs` on the
//! CPU, `wgpu.rs` against it): weight decay 0.1 and global-norm clipping at 1, so the clip
//! runs too; Schedule-Free AdamW warms up over 2 steps. The rest are the defaults.

use tensor_ops::optim::{AdamWParams, ProdigyParams, ScheduleFreeParams};

pub fn adamw() -> AdamWParams {
    AdamWParams {
        weight_decay: 0.1,
        max_grad_norm: Some(1.0),
        ..Default::default()
    }
}

pub fn schedule_free() -> ScheduleFreeParams {
    ScheduleFreeParams {
        weight_decay: 0.1,
        warmup_steps: 2,
        max_grad_norm: Some(1.0),
        ..Default::default()
    }
}

pub fn prodigy() -> ProdigyParams {
    ProdigyParams {
        weight_decay: 0.1,
        max_grad_norm: Some(1.0),
        ..Default::default()
    }
}
