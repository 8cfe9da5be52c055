//! Weight-only quantization of a loaded model and its perplexity, on the committed tiny
//! checkpoints: the perplexity matches the one `transformers`' logits give, quantizing moves the
//! logits (int4 further than int8), and a weight that cannot be quantized leaves the model as it
//! was.

mod hf_fixture;

use gpu_core::testing::same_bits;
use hf_fixture::dir;
use models::{CausalLm, ModelError, QuantKind};
use tensor_ops::Device;

fn expected(name: &str) -> (Vec<u32>, Vec<f32>) {
    let e = hf_fixture::expected(name);
    (e.ids, e.logits)
}

fn logits(m: &CausalLm, ids: &[u32]) -> Vec<f32> {
    m.forward(ids, 1, &mut m.new_cache())
        .unwrap()
        .to_vec()
        .unwrap()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

#[test]
fn perplexity_matches_the_one_of_transformers_logits() {
    for name in ["llama3", "qwen2", "gpt2"] {
        let m = CausalLm::load(&dir(name), Device::Cpu).unwrap();
        let (ids, want_logits) = expected(name);
        let vocab = m.config().vocab_size;
        // exp(mean NLL) from transformers' logits, in f64.
        let mut nll = 0f64;
        for i in 0..ids.len() - 1 {
            let row = &want_logits[i * vocab..(i + 1) * vocab];
            let max = row.iter().fold(f32::MIN, |a, &b| a.max(b)) as f64;
            let lse = max
                + row
                    .iter()
                    .map(|&v| (v as f64 - max).exp())
                    .sum::<f64>()
                    .ln();
            nll += lse - row[ids[i + 1] as usize] as f64;
        }
        let want = (nll / (ids.len() - 1) as f64).exp();
        let got = m.perplexity(&ids).unwrap();
        // The logits agree within 3e-4 of their scale (tests/parity.rs); a log-softmax moves
        // by at most twice a logit's error, so the mean NLL by 2·3e-4·max|logit|.
        let scale = want_logits.iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
        let tol = 2.0 * 3e-4 * scale;
        assert!(
            (got.ln() - want.ln()).abs() <= tol,
            "{name}: perplexity {got} against {want}"
        );
    }
}

#[test]
fn perplexity_over_several_windows_predicts_every_token_once() {
    let m = CausalLm::load(&dir("gpt2"), Device::Cpu).unwrap();
    let ctx = m.config().max_position_embeddings;
    let ids: Vec<u32> = (0..(2 * ctx + 7) as u32).map(|i| (i * 37) % 96).collect();
    let p = m.perplexity(&ids).unwrap();
    assert!(p.is_finite() && p > 1.0, "{p}");
    // The first window alone is a different mean: the windows are all counted.
    assert_ne!(p, m.perplexity(&ids[..ctx]).unwrap());
    hf_fixture::assert_perplexity_refusals(&ids, |ids| m.perplexity(ids));
}

/// Asserts that quantizing to `a` moved the logits of `name` less than quantizing to `b`
/// (each a kind's name and its largest logit difference).
fn moved_less(name: &str, (a, da): (&str, f32), (b, db): (&str, f32)) {
    assert!(
        da < db,
        "{name}: {a} moved the logits by {da} and {b} by {db}"
    );
}

#[test]
fn quantizing_moves_the_logits_int4_further_than_int8_and_int8_than_f16() {
    for name in ["llama3", "mistral", "gpt2"] {
        let (ids, _) = expected(name);
        let full = CausalLm::load(&dir(name), Device::Cpu).unwrap();
        let base = logits(&full, &ids);
        let mut diffs = Vec::new();
        for kind in [QuantKind::Int8, QuantKind::Int4, QuantKind::F16] {
            let mut m = CausalLm::load(&dir(name), Device::Cpu).unwrap();
            let bytes = m.quantize(kind).unwrap();
            assert!(bytes > 0);
            let d = max_diff(&logits(&m, &ids), &base);
            assert!(d > 0.0, "{name} {kind:?}: quantizing changed nothing");
            diffs.push((d, bytes));
        }
        moved_less(name, ("int8", diffs[0].0), ("int4", diffs[1].0));
        assert!(diffs[1].1 < diffs[0].1, "{name}: int4 is smaller");
        moved_less(name, ("f16", diffs[2].0), ("int8", diffs[0].0));
        assert!(diffs[0].1 < diffs[2].1, "{name}: int8 is smaller than f16");
    }
}

#[test]
fn a_weight_that_cannot_be_quantized_leaves_the_model_as_it_was() {
    // llama3 with one NaN in the second layer's down projection.
    let poisoned = "model.layers.1.mlp.down_proj.weight";
    let tmp = hf_fixture::poisoned_copy("llama3", poisoned, 0..1, f32::NAN);
    let (ids, _) = expected("llama3");
    let mut m = CausalLm::load(tmp.path(), Device::Cpu).unwrap();
    let before = logits(&m, &ids[..4]);
    for kind in [QuantKind::Int8, QuantKind::Int4, QuantKind::F16] {
        let e = m.quantize(kind).unwrap_err();
        assert!(matches!(e, ModelError::Quant(_)), "{e}");
        let after = logits(&m, &ids[..4]);
        assert!(
            same_bits(&before, &after),
            "{kind:?}: a refused quantization changed the model"
        );
    }
}

/// A weight past f16's range (finite, so int8 and int4 take it) is refused by f16 alone, by the
/// engine too, and the model is left as it was.
#[test]
fn a_weight_beyond_f16_is_refused_by_f16_alone() {
    let poisoned = "model.layers.0.self_attn.o_proj.weight";
    let tmp = hf_fixture::poisoned_copy("llama3", poisoned, 3..4, 1e6);
    let (ids, _) = expected("llama3");
    let mut m = CausalLm::load(tmp.path(), Device::Cpu).unwrap();
    let before = logits(&m, &ids[..4]);
    let e = m.quantize(QuantKind::F16).unwrap_err();
    assert!(
        matches!(e, ModelError::Quant(ref s) if s.contains("f16")),
        "{e}"
    );
    let after = logits(&m, &ids[..4]);
    assert!(same_bits(&before, &after));
    let opts = models::EngineOptions {
        dtype: tensor_ops::DType::F32,
        batch: 1,
        capacity: 16,
        quant: Some(QuantKind::F16),
    };
    let e = models::Engine::load(tmp.path(), Device::Cpu, opts)
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(e, ModelError::Quant(_)), "{e}");
    for kind in [QuantKind::Int8, QuantKind::Int4] {
        m.quantize(kind).unwrap();
    }
}
