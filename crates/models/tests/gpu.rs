//! The project's GPT (`models::gpt`) on CUDA against the CPU reference: a whole GPT step
//! (loss and every gradient, both variants), and the transfer budget of a training step (moved
//! from tensor-ops' `gpu.rs` with the GPT). Tests named `gpu_*` skip with a printed reason
//! where no GPU exists.

mod tiny_gpt;

use gpu_cuda::testing::{gpu_device_or_skip as gpu, rel_err};
use models::gpt::{Dataset, Gpt, GptConfig, Variant};
use tensor_ops::Device;
use tiny_gpt::{assert_step_moves_only_the_batch_and_the_loss, clipped_adamw};

fn small_cfg(variant: Variant, vocab: usize) -> GptConfig {
    GptConfig {
        variant,
        vocab_size: vocab,
        block_size: 32,
        n_layer: 2,
        n_head: 4,
        n_embd: 64,
        dropout: 0.1,
        bias: true,
    }
}

#[test]
fn gpu_gpt_step_matches_the_cpu() {
    let Some(dev) = gpu("gpu_gpt_step_matches_the_cpu") else {
        return;
    };
    let text = "To be, or not to be, that is the question: ".repeat(50);
    let ds = Dataset::from_text(&text, 0.9).unwrap();
    for variant in [Variant::Gpt2, Variant::Llama] {
        let cfg = small_cfg(variant, ds.tokenizer.vocab_size());
        let (mc, mg) = (
            Gpt::new(cfg, 11, Device::Cpu).unwrap(),
            Gpt::new(cfg, 11, dev).unwrap(),
        );
        let (x, y) = ds
            .batch(false, 4, 32, &mut Dataset::rng(5), Device::Cpu)
            .unwrap();
        let lc = mc.loss(&x, &y, Some(9)).unwrap();
        let lg = mg
            .loss(&x.to(dev).unwrap(), &y.to(dev).unwrap(), Some(9))
            .unwrap();
        let (vc, vg) = (lc.item().unwrap(), lg.item().unwrap());
        assert!(
            ((vc - vg) / vc).abs() < 1e-5,
            "{variant:?} loss {vc} vs {vg}"
        );
        let (gc, gg) = (lc.backward().unwrap(), lg.backward().unwrap());
        for ((name, pc, _), (_, pg, _)) in mc.parameters().iter().zip(mg.parameters()) {
            let e = rel_err(
                &gg.get(&pg).unwrap().to_vec().unwrap(),
                &gc.get(pc).unwrap().to_vec().unwrap(),
            );
            assert!(e < 1e-4, "{variant:?} {name}: grad rel err {e:e}");
        }
    }
}

#[test]
fn gpu_training_step_moves_only_the_batch_and_the_loss() {
    let Some(dev) = gpu("gpu_training_step_moves_only_the_batch_and_the_loss") else {
        return;
    };
    let text = "It was the best of times, it was the worst of times. ".repeat(100);
    let ds = Dataset::from_text(&text, 0.9).unwrap();
    let model = Gpt::new(small_cfg(Variant::Gpt2, ds.tokenizer.vocab_size()), 1, dev).unwrap();
    let mut opt = clipped_adamw(&model);
    assert_step_moves_only_the_batch_and_the_loss(&model, &mut opt, &ds, 32);
}
