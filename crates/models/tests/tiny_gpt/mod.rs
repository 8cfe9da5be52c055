//! The tiny GPT the training tests build (a context of 16, two heads, biases on) and the
//! AdamW they train it with (gradient clipping at norm 1).
#![allow(dead_code)]

use models::gpt::{Gpt, GptConfig, Variant};
use tensor_ops::optim::{AdamW, AdamWParams};

/// A `variant` GPT over `vocab_size` tokens: `n_layer` layers `n_embd` wide, dropout `dropout`.
pub fn tiny_config(
    variant: Variant,
    vocab_size: usize,
    n_layer: usize,
    n_embd: usize,
    dropout: f32,
) -> GptConfig {
    GptConfig {
        variant,
        vocab_size,
        block_size: 16,
        n_layer,
        n_head: 2,
        n_embd,
        dropout,
        bias: true,
    }
}

/// AdamW (default settings) over `model`'s parameters, gradients clipped at norm 1.
pub fn clipped_adamw(model: &Gpt) -> AdamW {
    model
        .store()
        .adamw(AdamWParams {
            max_grad_norm: Some(1.0),
            ..Default::default()
        })
        .unwrap()
}
