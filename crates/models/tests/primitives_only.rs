//! The GPT's training step on `gpu_core::testing::PrimitivesOnly` (the CPU's primitives, every
//! other op from its default body, `tensor_ops::with_primitives_only`) against the CPU
//! backend: the same model, batches and AdamW steps give losses within 1e-4 relative (f32
//! defaults against the CPU's f64 accumulation: a few ulps per op) and parameters within
//! `1e-4·scale + 1e-2·steps·lr` (Adam normalises each gradient entry, so an entry whose
//! gradient is small moves by `lr` times its relative error: 1% of a step allowed). One exception: the key bias
//! (`c_attn.bias` columns `n_embd..2·n_embd`) has an analytically zero gradient (the softmax
//! is invariant to it), so both backends step it by Adam-normalised rounding noise of either
//! sign; it is only required to stay within `steps·lr` of zero on both.
//!
//! With dropout on (p = 0.2 at every site: the embedding, the attention probabilities through
//! the packed attention's default, the residual branches; a fixed dropout seed per step) the
//! masks are the CPU's bit for bit (the same counter-based hash: `gpu-core`'s
//! `tests/side_doors.rs` checks the attention mask entry by entry), so the same bounds hold.

mod tiny_gpt;

use models::gpt::{Dataset, Gpt, Variant};
use tensor_ops::{with_primitives_only, Device};
use tiny_gpt::{clipped_adamw, tiny_config};

/// Losses of three AdamW steps and the parameters after them.
fn train(variant: Variant, dropout: f32) -> (Vec<f32>, Vec<(String, Vec<f32>)>) {
    let text = "the quick brown fox jumps over the lazy dog. ".repeat(40);
    let ds = Dataset::from_text(&text, 0.9).unwrap();
    let cfg = tiny_config(variant, ds.tokenizer.vocab_size(), 2, 32, dropout);
    let model = Gpt::new(cfg, 7, Device::Cpu).unwrap();
    let mut opt = clipped_adamw(&model);
    let mut rng = Dataset::rng(3);
    let mut losses = Vec::new();
    for step in 0..3u64 {
        let (x, y) = ds.batch(false, 4, 16, &mut rng, Device::Cpu).unwrap();
        let seed = (dropout > 0.0).then_some(1000 + step);
        let loss = model.loss(&x, &y, seed).unwrap();
        losses.push(loss.item().unwrap());
        let g = loss.backward().unwrap();
        opt.step(&g, 3e-3).unwrap();
    }
    let params = model
        .parameters()
        .into_iter()
        .map(|(n, t, _)| (n, t.to_vec().unwrap()))
        .collect();
    (losses, params)
}

#[test]
fn gpt_training_steps_on_primitives_only_match_the_cpu() {
    check(0.0);
}

#[test]
fn gpt_training_steps_with_dropout_on_primitives_only_match_the_cpu() {
    check(0.2);
}

fn check(dropout: f32) {
    for variant in [Variant::Gpt2, Variant::Llama] {
        let (want_loss, want) = train(variant, dropout);
        let (got_loss, got) = with_primitives_only(|| train(variant, dropout));
        for (a, b) in got_loss.iter().zip(&want_loss) {
            assert!(
                (a - b).abs() <= 1e-4 * b.abs(),
                "{variant:?} loss {a} vs {b}"
            );
        }
        assert_eq!(got.len(), want.len());
        for ((name, g), (_, w)) in got.iter().zip(&want) {
            let scale = w.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
            for (i, (a, b)) in g.iter().zip(w).enumerate() {
                if name.ends_with("c_attn.bias") && (32..64).contains(&i) {
                    assert!(
                        a.abs() <= 3.0 * 3e-3 && b.abs() <= 3.0 * 3e-3,
                        "{name}: {a}, {b}"
                    );
                    continue;
                }
                assert!(
                    (a - b).abs() <= 1e-4 * scale + 1e-2 * 3.0 * 3e-3,
                    "{variant:?} {name}: {a} vs {b}"
                );
            }
        }
        println!("{variant:?}, dropout {dropout}: losses {got_loss:?} (cpu {want_loss:?})");
    }
}
