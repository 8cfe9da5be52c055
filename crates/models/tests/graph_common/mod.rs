//! What the GPT's graph tests share: a small corpus, a tiny GPT config, bit patterns and
//! batches on which every kernel of a training step is deterministic.

#![allow(dead_code)]

use models::gpt::{Dataset, Gpt, GptConfig, GraphedStep, Variant};
use rand::{rngs::StdRng, Rng};
use tensor_ops::optim::Optimizer;
use tensor_ops::{Device, Tensor};

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

/// The GPU (`None`, the reason printed, where there is none), the dataset of [`TEXT`] and its
/// vocabulary size.
pub fn gpu_dataset(test: &str) -> Option<(Device, Dataset, usize)> {
    let dev = gpu_cuda::testing::gpu_device_or_skip(test)?;
    let ds = Dataset::from_text(TEXT, 0.8).unwrap();
    let vocab = ds.tokenizer.vocab_size();
    Some((dev, ds, vocab))
}

/// [`gpu_dataset`] with the test's seed: the GPU, the seed, the dataset and its vocabulary size.
pub fn gpu_setup(test: &str) -> Option<(Device, u64, Dataset, usize)> {
    let (dev, ds, vocab) = gpu_dataset(test)?;
    Some((dev, gpu_cuda::testing::test_seed(test), ds, vocab))
}

/// The dataset of [`TEXT`] and a width-32 model of `variant` on it, seed 1, on the CPU.
pub fn cpu_model(variant: Variant) -> (Dataset, Gpt) {
    let ds = Dataset::from_text(TEXT, 0.8).unwrap();
    let model = Gpt::new(
        config(variant, ds.tokenizer.vocab_size(), 32),
        1,
        Device::Cpu,
    )
    .unwrap();
    (ds, model)
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

/// One eager step of `eager` with `opt_e` and one replay of `step` with `opt_g`, both on the
/// `[batch, block]` batch `(x, y)` with dropout seed `drop_seed` at `lr`: the loss and the
/// gradient norm must have the same bits (`what` names the step in the messages).
pub fn step_twins<E: Optimizer + ?Sized, G: Optimizer + ?Sized>(
    (eager, opt_e): (&Gpt, &mut E),
    (step, opt_g): (&GraphedStep, &mut G),
    (x, y, dims): (&[u32], &[u32], [usize; 2]),
    (drop_seed, lr): (u64, f32),
    what: &str,
) {
    let dev = eager.device();
    let xt = Tensor::from_vec(x.to_vec(), &dims, dev).unwrap();
    let yt = Tensor::from_vec(y.to_vec(), &dims, dev).unwrap();
    let loss = eager.loss(&xt, &yt, Some(drop_seed)).unwrap();
    opt_e.step(&loss.backward().unwrap(), lr).unwrap();
    step.step(opt_g, x, y, drop_seed, lr).unwrap();
    assert_eq!(
        loss.item().unwrap().to_bits(),
        step.loss().item().unwrap().to_bits(),
        "{what}: loss"
    );
    assert_eq!(
        opt_e.last_grad_norm().unwrap().map(f32::to_bits),
        opt_g.last_grad_norm().unwrap().map(f32::to_bits),
        "{what}: gradient norm"
    );
}

/// Every parameter of `eager` has the bits of the same parameter of `graphed` after the five
/// steps (`label` and `seed` name the run in the messages).
pub fn assert_same_parameters(eager: &Gpt, graphed: &Gpt, label: &str, seed: u64) {
    for ((name, a, _), (_, b, _)) in eager.parameters().iter().zip(&graphed.parameters()) {
        assert_eq!(
            bits(a),
            bits(b),
            "{label} {name} after 5 steps (seed {seed})"
        );
    }
}
