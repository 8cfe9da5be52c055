//! `Engine::perplexity` (the fast engine's logits, the log-softmax in f64 on the host) against
//! `CausalLm::perplexity` (the f32 reference; its log-softmax in f32 on the device, summed in
//! f64), on the committed fixtures (the Llama family and GPT-2), over a text of several
//! context windows.
//!
//! Bound: the mean NLL moves by at most the largest change of one token's NLL, and a
//! log-softmax entry moves by at most twice the largest change of its row's logits. The f32
//! engine and the reference each compute their logits within `3e-4 · max|logit|` of the exact
//! function (the bound of `parity.rs` and `engine.rs`), so within `6e-4 · max|logit|` of each
//! other: `|ln ppl_engine − ln ppl_ref| ≤ 2 · 6e-4 · max|logit|` (max over every window's
//! logits). The f32 log-softmax of the reference adds rounding of a few ulp of `ln Σ exp`
//! (~1e-6 here), far inside that. The quantized engine (f32 activations, int8/int4
//! projections dequantized in the matmul) computes from the same dequantized values as the
//! reference after `quantize`: the same bound. The bf16 engine: `0.07 · max|logit|` of the
//! exact logits (the bound of `engine.rs`), so `2 · (0.07 + 3e-4) · max|logit|`.

mod hf_fixture;

use hf_fixture::{dir, expected, poisoned_copy, FIXTURES};
use models::{CausalLm, Engine, EngineOptions, LogitsAt, ModelError, QuantKind};
use tensor_ops::{DType, Device};

/// A text of `2·ctx + 7` tokens: three windows, the last one short.
fn text(m: &CausalLm) -> Vec<u32> {
    let (ctx, vocab) = (
        m.config().max_position_embeddings,
        m.config().vocab_size as u32,
    );
    (0..(2 * ctx + 7) as u32)
        .map(|i| (i * 37 + i * i / 5) % vocab)
        .collect()
}

/// The largest |logit| of the reference over the windows `perplexity` scores.
fn scale(m: &CausalLm, ids: &[u32]) -> f64 {
    let ctx = m.config().max_position_embeddings;
    let mut max = 0f32;
    let mut start = 0;
    while start + 1 < ids.len() {
        let w = &ids[start..(start + ctx).min(ids.len())];
        let l = m
            .forward(w, 1, &mut m.new_cache())
            .unwrap()
            .to_vec()
            .unwrap();
        max = l.iter().fold(max, |a, v| a.max(v.abs()));
        start += w.len() - 1;
    }
    max as f64
}

fn engine(name: &str, dtype: DType, capacity: usize, quant: Option<QuantKind>) -> Engine {
    let opts = EngineOptions {
        dtype,
        batch: 1,
        capacity,
        quant,
    };
    Engine::load(&dir(name), Device::Cpu, opts).unwrap()
}

#[test]
fn engine_perplexity_matches_the_reference() {
    for name in FIXTURES {
        for quant in [None, Some(QuantKind::Int8), Some(QuantKind::Int4)] {
            let mut reference = CausalLm::load(&dir(name), Device::Cpu).unwrap();
            if let Some(kind) = quant {
                reference.quantize(kind).unwrap();
            }
            let ids = text(&reference);
            let ctx = reference.config().max_position_embeddings;
            let want = reference.perplexity(&ids).unwrap();
            let s = scale(&reference, &ids);
            for (dtype, rel) in [(DType::F32, 3e-4), (DType::BF16, 0.07)] {
                let what = format!("{name} {dtype} {quant:?}");
                let got = engine(name, dtype, ctx, quant).perplexity(&ids).unwrap();
                let tol = 2.0 * (rel + 3e-4) * s;
                let diff = (got.ln() - want.ln()).abs();
                eprintln!(
                    "{what}: perplexity {got:.6} against {want:.6}, |Δ ln| {diff:.3e} \
                     (bound {tol:.3e})"
                );
                assert!(diff <= tol, "{what}: perplexity {got} against {want}");
            }
        }
    }
}

#[test]
fn engine_perplexity_counts_every_window_and_refuses_what_it_cannot_score() {
    let reference = CausalLm::load(&dir("llama3"), Device::Cpu).unwrap();
    let ids = text(&reference);
    let ctx = reference.config().max_position_embeddings;
    let mut e = engine("llama3", DType::F32, ctx, None);
    let p = e.perplexity(&ids).unwrap();
    assert!(p.is_finite() && p > 1.0, "{p}");
    assert_ne!(p, e.perplexity(&ids[..ctx]).unwrap(), "every window counts");
    // The same again: each window is a fresh prefill.
    assert_eq!(p, e.perplexity(&ids).unwrap());
    hf_fixture::assert_perplexity_refusals(&ids, |ids| e.perplexity(ids));
    // A text shorter than the context needs only its own length of cache ...
    let mut short = engine("llama3", DType::F32, 10, None);
    let want = reference.perplexity(&ids[..10]).unwrap();
    let got = short.perplexity(&ids[..10]).unwrap();
    let tol = 2.0 * 6e-4 * scale(&reference, &ids[..10]);
    assert!((got.ln() - want.ln()).abs() <= tol, "{got} against {want}");
    // ... a longer one a whole window, and the engine must decode one row.
    assert!(matches!(
        short.perplexity(&ids[..11]),
        Err(ModelError::ContextFull { more: 11, .. })
    ));
    let opts = EngineOptions {
        dtype: DType::F32,
        batch: 2,
        capacity: ctx,
        quant: None,
    };
    let mut two = Engine::load(&dir("llama3"), Device::Cpu, opts).unwrap();
    assert!(matches!(
        two.perplexity(&ids),
        Err(ModelError::Unsupported(_))
    ));
}

/// Corrupt weights are a typed error at the first position whose prediction they poison, on
/// both engines, never a perplexity of NaN: one NaN in `lm_head` (every row: position 1), and
/// a NaN embedding of a token that first comes in the second window (at `ctx + 3`): a position
/// of the second window, at the latest `ctx + 4` (the poisoned row's prediction; the reference
/// refuses from the window's first, `ctx`: its masked attention weighs the NaN value by 0,
/// which is NaN).
#[test]
fn perplexity_refuses_non_finite_logits() {
    let ctx = CausalLm::load(&dir("llama3"), Device::Cpu)
        .unwrap()
        .config()
        .max_position_embeddings;
    let (poison, hidden) = (90u32, 64);
    let clean = expected("llama3").ids;
    assert!(!clean.contains(&poison));
    let mut ids: Vec<u32> = clean.iter().copied().cycle().take(ctx + 9).collect();
    ids[ctx + 3] = poison;
    let at = poison as usize * hidden;
    let cases = [
        (
            poisoned_copy("llama3", "lm_head.weight", 5..6, f32::NAN),
            1..=1,
        ),
        (
            poisoned_copy(
                "llama3",
                "model.embed_tokens.weight",
                at..at + hidden,
                f32::NAN,
            ),
            ctx..=ctx + 4,
        ),
    ];
    for (tmp, want) in cases {
        let refused = |r: &Result<f64, ModelError>| matches!(r, Err(ModelError::NonFiniteLogits(LogitsAt::Position(p))) if want.contains(p));
        let r = CausalLm::load(tmp.path(), Device::Cpu)
            .unwrap()
            .perplexity(&ids);
        assert!(refused(&r), "reference, {want:?}: {r:?}");
        for dtype in [DType::F32, DType::BF16] {
            let opts = EngineOptions {
                dtype,
                batch: 1,
                capacity: ctx,
                quant: None,
            };
            let r = Engine::load(tmp.path(), Device::Cpu, opts)
                .unwrap()
                .perplexity(&ids);
            assert!(refused(&r), "engine {dtype}, {want:?}: {r:?}");
        }
    }
}
