//! Parity with `transformers` 5.24 on the committed tiny checkpoints of
//! `tests/fixtures/hf` (made by `scripts/hf_fixtures.py`: Llama 3 with rope scaling and GQA, a
//! tied Llama, Qwen2 with q/k/v biases, Mistral with one KV head, GPT-2, and Llama 3 in bf16):
//! the same logits for a prompt and a batch, the same logits decoded token by token through the
//! KV cache as in one pass, and the same 16 greedy tokens.
//!
//! Tolerance: both sides compute the same f32 functions in other summation orders (and other
//! `exp`/`tanh`/`cos`). A dot product of K terms in f32 is within γ_K·Σ|aᵢbᵢ| of the exact one,
//! γ_K ≈ K·2⁻²⁴; the widest sum here has K = 192 (GPT-2's fused q/k/v), so each op is within
//! 1.2e-5 of its operands' scale, and the ~25 ops a logit goes through (2 layers) within
//! 3e-4 of the logits' scale (norms rescale activations to about 1, bounded by their weights).
//! The bound used is `3e-4 · max|logit|`.

mod hf_fixture;

use hf_fixture::{dir, expected, Expected, FIXTURES};
use models::{CausalLm, ModelError, Sampler, Sampling};
use tensor_ops::Device;

fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let tol = 3e-4 * scale;
    let (i, err) = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .enumerate()
        .fold((0, 0f32), |m, (i, e)| if e > m.1 { (i, e) } else { m });
    eprintln!("{what}: max |Δ| {err:.2e} (bound {tol:.2e})");
    assert!(
        err <= tol,
        "{what}: |Δ| {err:e} at {i} ({} against {}) over the bound {tol:e}",
        got[i],
        want[i]
    );
}

/// Runs `check` on every fixture: its name, the model loaded on the CPU, and what
/// `transformers` computed for it.
fn each_fixture(mut check: impl FnMut(&str, &CausalLm, &Expected)) {
    for name in FIXTURES {
        let m = CausalLm::load(&dir(name), Device::Cpu).unwrap();
        check(name, &m, &expected(name));
    }
}

#[test]
fn logits_match_transformers() {
    each_fixture(|name, m, e| {
        let mut cache = m.new_cache();
        let got = m.forward(&e.ids, 1, &mut cache).unwrap().to_vec().unwrap();
        assert_close(&format!("{name} prompt"), &got, &e.logits);
        assert_eq!(cache.len(), e.ids.len());
        let mut cache = m.new_cache();
        let got = m
            .forward(&e.batch_ids, 2, &mut cache)
            .unwrap()
            .to_vec()
            .unwrap();
        assert_close(&format!("{name} batch"), &got, &e.batch_logits);
    });
}

#[test]
fn decoding_through_the_cache_gives_the_one_pass_logits() {
    each_fixture(|name, m, e| {
        let vocab = m.config().vocab_size;
        // The first 5 tokens at once, then one at a time.
        let mut cache = m.new_cache();
        let mut rows = m
            .forward(&e.ids[..5], 1, &mut cache)
            .unwrap()
            .to_vec()
            .unwrap();
        for &t in &e.ids[5..] {
            rows.extend(m.forward(&[t], 1, &mut cache).unwrap().to_vec().unwrap());
        }
        assert_eq!(rows.len(), e.ids.len() * vocab);
        assert_close(&format!("{name} cached"), &rows, &e.logits);
    });
}

#[test]
fn greedy_tokens_match_transformers() {
    each_fixture(|name, m, e| {
        let mut sampler = Sampler::new(Sampling::default()).unwrap();
        let mut streamed = Vec::new();
        let new = m
            .generate(&e.ids, 16, &mut sampler, &[], |t| streamed.push(t))
            .unwrap();
        assert_eq!(new, streamed, "{name}: streamed tokens");
        assert_eq!(new, e.greedy[e.ids.len()..], "{name}: greedy tokens");
    });
}

#[test]
fn bad_inputs_are_typed_errors_that_leave_the_cache_as_it_was() {
    let m = CausalLm::load(&dir("llama3"), Device::Cpu).unwrap();
    let ctx = m.config().max_position_embeddings;
    let mut cache = m.new_cache();
    m.forward(&[1, 2, 3], 1, &mut cache).unwrap();
    let cases: Vec<(Vec<u32>, usize)> = vec![
        (vec![], 1),
        (vec![1, 2], 0),
        (vec![1, 2, 3], 2),
        (vec![1, 96], 1),
        (vec![u32::MAX], 1),
        (vec![5; ctx], 1),
    ];
    for (ids, batch) in cases {
        let e = m.forward(&ids, batch, &mut cache).unwrap_err();
        assert!(
            matches!(
                e,
                ModelError::EmptyInput
                    | ModelError::RaggedBatch(..)
                    | ModelError::TokenOutOfVocab { .. }
                    | ModelError::ContextFull { .. }
            ),
            "{ids:?} / {batch}: {e}"
        );
        assert_eq!(cache.len(), 3, "{ids:?}: the cache changed");
    }
    // A batch of 2 against a cache of 1 row fails inside the layers: still no trace.
    assert!(m.forward(&[1, 2], 2, &mut cache).is_err());
    assert_eq!(cache.len(), 3);
    // The cache still decodes: the next logits are those of the 4-token prompt's last row.
    let next = m.forward(&[4], 1, &mut cache).unwrap().to_vec().unwrap();
    let whole = m
        .forward(&[1, 2, 3, 4], 1, &mut m.new_cache())
        .unwrap()
        .to_vec()
        .unwrap();
    let vocab = m.config().vocab_size;
    assert_close("after refusals", &next, &whole[3 * vocab..]);
    // A prompt and budget beyond the context are refused before any work.
    let mut s = Sampler::new(Sampling::default()).unwrap();
    let e = m
        .generate(&vec![1; ctx], 1, &mut s, &[], |_| {})
        .unwrap_err();
    assert!(matches!(e, ModelError::ContextFull { .. }), "{e}");
}
