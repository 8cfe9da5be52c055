//! What the GPT's graph tests share: a small corpus, a tiny GPT config, bit patterns and
//! batches on which every kernel of a training step is deterministic.

#![allow(dead_code)]

use models::gpt::{GptConfig, Variant};
use rand::{rngs::StdRng, Rng};
use tensor_ops::Tensor;

pub const TEXT: &str = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\n\
                        Speak, speak.\n\nFirst Citizen:\nYou are all resolved rather to die than \
                        to famish?\n\nAll:\nResolved. resolved.\n";

/// 2 layers, 2 heads, context 16, dropout 0.2, no biases, width `width`.
pub fn config(variant: Variant, vocab: usize, width: usize) -> GptConfig {
    GptConfig {
        variant,
        vocab_size: vocab,
        block_size: 16,
        n_layer: 2,
        n_head: 2,
        n_embd: width,
        dropout: 0.2,
        bias: false,
    }
}

pub fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec().unwrap().iter().map(|v| v.to_bits()).collect()
}

/// Inputs and targets of `n` tokens in which no id occurs more than twice. A batch this small
/// (fewer than 8 rows per id) takes the embedding backward's atomic path (`kernels/nn_embed.cu`;
/// large batches of a small vocabulary take the fixed-order one): the order of three or more
/// additions into one entry varies from run to run, so two eager runs could differ in the last
/// bits. Two additions into a zeroed entry commute exactly, so with such batches every kernel of
/// the step is deterministic and the graph and eager runs must agree bit for bit.
pub fn at_most_twice(r: &mut StdRng, vocab: usize, n: usize) -> (Vec<u32>, Vec<u32>) {
    let mut draw = || {
        let mut ids: Vec<u32> = (0..vocab as u32).chain(0..vocab as u32).collect();
        for i in (1..ids.len()).rev() {
            ids.swap(i, r.random_range(0..=i));
        }
        ids.truncate(n);
        ids
    };
    (draw(), draw())
}
