//! The tiny GPT the training tests build (a context of 16, two heads, biases on) and the
//! AdamW they train it with (gradient clipping at norm 1), and the transfer budget of a
//! training step on a device.
#![allow(dead_code)]

use models::gpt::{Dataset, Gpt, GptConfig, Variant};
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

/// After a warm-up step (module loads, library handles, pool blocks), one training step of
/// `model` with `opt` (lr 1e-3) on a `[4, block]` batch of `ds` moves only the batch in (x and
/// y, u32) and the loss out through the tensor layer (`transfer_stats`).
pub fn assert_step_moves_only_the_batch_and_the_loss(
    model: &Gpt,
    opt: &mut AdamW,
    ds: &Dataset,
    block: usize,
) {
    let dev = model.device();
    let mut rng = Dataset::rng(2);
    let mut step = |i: u64| -> f32 {
        let (x, y) = ds.batch(false, 4, block, &mut rng, dev).unwrap();
        let loss = model.loss(&x, &y, Some(i)).unwrap();
        let g = loss.backward().unwrap();
        opt.step(&g, 1e-3).unwrap();
        loss.item().unwrap()
    };
    step(0);
    let before = tensor_ops::transfer_stats();
    let loss = step(1);
    let after = tensor_ops::transfer_stats();
    assert!(loss.is_finite());
    assert_eq!(
        after.host_to_device - before.host_to_device,
        2,
        "only x and y go in"
    );
    assert_eq!(
        after.host_to_device_bytes - before.host_to_device_bytes,
        (2 * 4 * block * 4) as u64
    );
    assert_eq!(
        after.device_to_host - before.device_to_host,
        1,
        "only the loss comes out"
    );
    assert_eq!(after.device_to_host_bytes - before.device_to_host_bytes, 4);
}
