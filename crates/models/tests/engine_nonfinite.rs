//! Corrupt weights (a NaN in `q_proj`, an inf in the embeddings, one NaN in `lm_head`) make
//! non-finite logits: generation refuses them as `ModelError::NonFiniteLogits`, on the
//! reference and on the fast engine, greedy and sampled, at the first token (the prefill's)
//! and at a decode step, instead of choosing a token (the argmax of a row with a NaN is the
//! NaN's index: token 0 for ever). A refused greedy step leaves no trace. Tests named `gpu_*`
//! skip without a GPU.

mod hf_fixture;

use hf_fixture::{dir, expected, on_gpu, poisoned_copy};
use models::{
    CausalLm, Engine, EngineOptions, LogitsAt, ModelConfig, ModelError, Sampler, Sampling,
};
use tensor_ops::{DType, Device};

/// (fixture, tensor, element, value) of each corruption; the embedding's is in the row of the
/// prompt's first token, so that every position's logits are poisoned through attention.
fn cases() -> Vec<(&'static str, &'static str, usize, f32)> {
    let first = expected("llama3").ids[0] as usize;
    let hidden = ModelConfig::from_dir(&dir("llama3")).unwrap().hidden_size;
    vec![
        (
            "llama3",
            "model.layers.0.self_attn.q_proj.weight",
            0,
            f32::NAN,
        ),
        (
            "llama3",
            "model.embed_tokens.weight",
            first * hidden,
            f32::INFINITY,
        ),
        ("llama3", "lm_head.weight", 7, f32::NAN),
        ("mistral", "lm_head.weight", 0, f32::NAN),
        ("gpt2", "transformer.h.0.attn.c_attn.weight", 3, f32::NAN),
    ]
}

fn sampled() -> Sampling {
    Sampling {
        temperature: 0.8,
        top_k: Some(5),
        seed: 3,
        ..Sampling::default()
    }
}

fn at_first_token(r: &Result<impl std::fmt::Debug, ModelError>) -> bool {
    let first = LogitsAt::Step { step: 0, row: 0 };
    matches!(r, Err(ModelError::NonFiniteLogits(at)) if *at == first)
}

/// The reference refuses to generate from every corrupt copy, one row or a batch.
#[test]
fn reference_refuses_non_finite_logits() {
    for (name, tensor, at, value) in cases() {
        let tmp = poisoned_copy(name, tensor, at..at + 1, value);
        let m = CausalLm::load(tmp.path(), Device::Cpu).unwrap();
        let ids = expected(name).ids;
        for s in [Sampling::default(), sampled()] {
            let mut sm = Sampler::new(s).unwrap();
            let r = m.generate(&ids, 8, &mut sm, &[], |_| {});
            assert!(at_first_token(&r), "{name} {tensor} {s:?}: {r:?}");
            let msg = r.unwrap_err().to_string();
            assert!(
                msg.contains("non-finite logits") && msg.contains("step 0"),
                "{msg}"
            );
            let r = m.generate_batch(&[&ids, &ids[3..]], 8, &mut sm, &[]);
            assert!(at_first_token(&r), "{name} {tensor} batch {s:?}: {r:?}");
        }
    }
}

fn fast(dir: &std::path::Path, dev: Device, dtype: DType) -> Engine {
    let opts = EngineOptions {
        dtype,
        batch: 2,
        capacity: 40,
        quant: None,
    };
    Engine::load(dir, dev, opts).unwrap()
}

/// The fast engine refuses the first token of every corrupt copy, greedy and sampled.
fn fast_refuses_non_finite_logits(dev: Device) {
    for (name, tensor, at, value) in cases() {
        let tmp = poisoned_copy(name, tensor, at..at + 1, value);
        let ids = expected(name).ids;
        let prompts = vec![ids.clone(), ids[3..].to_vec()];
        for dtype in [DType::F32, DType::BF16] {
            let mut e = fast(tmp.path(), dev, dtype);
            for s in [Sampling::default(), sampled()] {
                let r = e.generate(&prompts, 8, &[], &s, |_| {});
                assert!(
                    at_first_token(&r),
                    "{dev} {name} {tensor} {dtype} {s:?}: {r:?}"
                );
            }
        }
    }
}

/// A greedy decode step whose row 0 reads a token with a NaN embedding (the prompts do not
/// contain it) is refused at that step and row, and leaves no trace: the steps after it give
/// what an engine that never tried it gives (on CUDA, the graphed step's read-back).
fn fast_refuses_a_greedy_decode_step(dev: Device) {
    let poison = 90u32;
    let hidden = ModelConfig::from_dir(&dir("llama3")).unwrap().hidden_size;
    let at = poison as usize * hidden;
    let tmp = poisoned_copy(
        "llama3",
        "model.embed_tokens.weight",
        at..at + hidden,
        f32::NAN,
    );
    let ids = expected("llama3").ids;
    assert!(!ids.contains(&poison));
    let prompts = vec![ids.clone(), ids[3..].to_vec()];
    let run = |fail: bool| -> Vec<Vec<u32>> {
        let mut e = fast(tmp.path(), dev, DType::F32);
        e.prefill(&prompts, false).unwrap();
        let mut next = vec![4, 5];
        let mut out = vec![];
        for step in 1..8usize {
            if fail && step % 3 == 1 {
                let r = e.decode_greedy(&[poison, next[1]]);
                let want = LogitsAt::Step { step, row: 0 };
                assert!(
                    matches!(&r, Err(ModelError::NonFiniteLogits(at)) if *at == want),
                    "{dev}: step {step}: {r:?}"
                );
            }
            next = e.decode_greedy(&next).unwrap();
            assert!(
                !next.contains(&poison),
                "{dev}: the clean run read the poison"
            );
            out.push(next.clone());
        }
        out
    };
    assert_eq!(run(true), run(false), "{dev}: a refused step left a trace");
}

#[test]
fn engine_refuses_non_finite_logits_on_the_cpu() {
    fast_refuses_non_finite_logits(Device::Cpu);
}

#[test]
fn engine_refuses_a_greedy_decode_step_on_the_cpu() {
    fast_refuses_a_greedy_decode_step(Device::Cpu);
}

#[test]
fn gpu_engine_refuses_non_finite_logits() {
    on_gpu("gpu_engine_refuses_non_finite_logits", |dev| {
        fast_refuses_non_finite_logits(dev);
        fast_refuses_a_greedy_decode_step(dev);
    });
}
