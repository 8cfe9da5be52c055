//! The CPU backend's fast mode (f32 kernels, `gpu_core::cpu::CpuMode::Fast`) trains the GPT as
//! the exact reference does: the same loss and gradients up to f32 rounding, from random
//! weights and batches (seed printed; `HYBRID_TEST_SEED` replays).
//!
//! Bounds: each fast kernel is within a few hundred units of f32 roundoff (`u = 2^-24`, 6e-8)
//! of the reference per output, relative to the size of its summed terms (its own tests,
//! `gpu-core/src/cpu/fast/tests.rs`); through the model's 4 layers forward and backward (about
//! 30 such kernels on each path) those relative errors add up to at most ~30 × 300u ≈ 5e-4 in
//! the worst case, typically √30 × a few u. Measured: gradients differ by at most 5e-7 of their
//! norm, the loss not at all. The thresholds (1e-6 of the loss, 2e-5 of each gradient's norm)
//! sit 40× above that and far below what a wrong kernel gives (O(1)).

use gpu_core::cpu::{with_mode, CpuMode};
use gpu_cuda::testing::test_seed;
use models::gpt::{Dataset, Gpt, GptConfig};
use tensor_ops::{Device, Tensor};

/// `(loss, gradients in parameter order)` of one batch in `mode`.
fn loss_and_grads(model: &Gpt, x: &Tensor, y: &Tensor, mode: CpuMode) -> (f32, Vec<Vec<f32>>) {
    with_mode(mode, || {
        let loss = model.loss(x, y, None).unwrap();
        let g = loss.backward().unwrap();
        let grads = model
            .parameters()
            .iter()
            .map(|(_, p, _)| g.get(p).unwrap().to_vec().unwrap())
            .collect();
        (loss.item().unwrap(), grads)
    })
}

/// A tiny GPT from `seed`, `n_embd` wide with a context of `block`, on a synthetic corpus of
/// 4000 letters (letter `(i·mul + i/div) mod m` at `i`), and one training batch of `rows` rows
/// drawn from `seed`.
fn model_and_batch(
    seed: u64,
    (mul, div, m): (usize, usize, usize),
    n_embd: usize,
    block: usize,
    rows: usize,
) -> (Gpt, Tensor, Tensor) {
    let text: String = (0..4000usize)
        .map(|i| (b'a' + ((i * mul + i / div) % m) as u8) as char)
        .collect();
    let ds = Dataset::from_text(&text, 0.9).unwrap();
    let mut cfg = GptConfig::tiny(ds.tokenizer.vocab_size());
    (cfg.n_embd, cfg.block_size) = (n_embd, block);
    let model = Gpt::new(cfg, seed, Device::Cpu).unwrap();
    let mut rng = Dataset::rng(seed);
    let (x, y) = ds.batch(false, rows, block, &mut rng, Device::Cpu).unwrap();
    (model, x, y)
}

#[test]
fn fast_mode_matches_the_exact_gpt_loss_and_gradients() {
    let seed = test_seed("fast_mode_matches_the_exact_gpt_loss_and_gradients");
    let (model, x, y) = model_and_batch(seed, (7, 13, 23), 32, 16, 3);
    let (lf, gf) = loss_and_grads(&model, &x, &y, CpuMode::Fast);
    let (le, ge) = loss_and_grads(&model, &x, &y, CpuMode::Exact);
    assert!(lf.is_finite() && le.is_finite());
    assert!(
        ((lf - le) / le).abs() <= 1e-6,
        "loss: fast {lf}, exact {le}"
    );
    let mut differs = false;
    for (((name, _, _), f), e) in model.parameters().iter().zip(&gf).zip(&ge) {
        let norm = e.iter().map(|v| (*v as f64).powi(2)).sum::<f64>().sqrt();
        let diff = f
            .iter()
            .zip(e)
            .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
            .sum::<f64>()
            .sqrt();
        assert!(
            diff <= 2e-5 * norm + 1e-12,
            "{name}: |fast − exact| {diff}, |exact| {norm}"
        );
        differs |= diff > 0.0;
    }
    // The modes do run different kernels.
    assert!(differs || lf != le, "fast and exact gave identical results");
}

/// A GPT step run on a worker of the CPU pool (`gpu_core::cpu::on_pool`, as the training
/// binaries run it) gives the same loss and gradients, bit for bit, as one run from the test's
/// own thread, in both modes: the pool only changes who starts each op's parallel loop.
#[test]
fn gpt_step_on_the_pool_is_bit_identical() {
    let seed = test_seed("gpt_step_on_the_pool_is_bit_identical");
    let (model, x, y) = model_and_batch(seed, (5, 11, 21), 64, 32, 12);
    for mode in [CpuMode::Fast, CpuMode::Exact] {
        let (l0, g0) = loss_and_grads(&model, &x, &y, mode);
        let (l1, g1) = gpu_core::cpu::on_pool(|| loss_and_grads(&model, &x, &y, mode));
        assert_eq!(l0.to_bits(), l1.to_bits(), "{mode:?}: loss {l0} vs {l1}");
        for (((name, _, _), a), b) in model.parameters().iter().zip(&g0).zip(&g1) {
            let same = a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits());
            assert!(same, "{mode:?}: gradient of {name} differs on the pool");
        }
    }
}
