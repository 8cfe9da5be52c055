//! The committed tiny Hugging Face checkpoints of `tests/fixtures/hf` (made by
//! `scripts/hf_fixtures.py`) and what `transformers` computed for them (`expected.safetensors`),
//! shared by the parity, batch, quantization and engine tests.
#![allow(dead_code)]

use std::path::PathBuf;

use models::{CausalLm, Engine, EngineOptions, ModelError, QuantKind, Sampler, Sampling};
use safetensors::SafeTensors;
use tensor_ops::{DType, Device};

mod checkpoint;

#[allow(unused_imports)] // each test file uses some of the fixtures
pub use checkpoint::{rewrite_checkpoint, write_f32_checkpoint};

/// Every fixture: the Llama family (with sliding windows: `mistral-sw`, `qwen2-sw`) and GPT-2.
/// The engine's weight storages beyond dense f32: bf16, and int8/int4/f16 under f32 or bf16.
pub const STORAGES: [(DType, Option<QuantKind>); 7] = [
    (DType::BF16, None),
    (DType::F32, Some(QuantKind::Int8)),
    (DType::BF16, Some(QuantKind::Int8)),
    (DType::F32, Some(QuantKind::Int4)),
    (DType::BF16, Some(QuantKind::Int4)),
    (DType::F32, Some(QuantKind::F16)),
    (DType::BF16, Some(QuantKind::F16)),
];

pub const FIXTURES: [&str; 8] = [
    "llama3",
    "llama3-bf16",
    "llama-tied",
    "qwen2",
    "mistral",
    "mistral-sw",
    "qwen2-sw",
    "gpt2",
];

/// Runs `check` on the CUDA device, or prints why `test` is skipped there (no GPU).
pub fn on_gpu(test: &str, check: impl FnOnce(Device)) {
    if let Some(dev) = gpu_cuda::testing::gpu_device_or_skip(test) {
        check(dev);
    }
}

/// `cpu_and_gpu_tests!(check, cpu_test, gpu_test)`: the test `cpu_test`, `check` on the CPU,
/// and the test `gpu_test`, `check` through [`on_gpu`] under its own name.
#[macro_export]
macro_rules! cpu_and_gpu_tests {
    ($check:ident, $cpu:ident, $gpu:ident) => {
        #[test]
        fn $cpu() {
            $check(tensor_ops::Device::Cpu);
        }

        #[test]
        fn $gpu() {
            $crate::hf_fixture::on_gpu(stringify!($gpu), $check);
        }
    };
}

/// The folder of every fixture: `$HYBRID_HF_FIXTURES` where set (the GPU bundle's `run.sh`
/// sets it to the copy it carries, since a bundle unpacked on another machine has no source
/// tree), else this crate's `tests/fixtures/hf`.
pub fn root() -> PathBuf {
    std::env::var_os("HYBRID_HF_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf"))
}

/// The fixture directory `name`.
pub fn dir(name: &str) -> PathBuf {
    root().join(name)
}

/// A copy of fixture `name` (config, tokenizer and f32 weights) whose tensor `tensor` holds
/// `value` at the elements `at`: a checkpoint with corrupt weights.
pub fn poisoned_copy(
    name: &str,
    tensor: &str,
    at: std::ops::Range<usize>,
    value: f32,
) -> tempfile::TempDir {
    let files = ["config.json", "tokenizer.json"];
    checkpoint::poisoned(&dir(name), &files, tensor, at, value)
}

/// Asserts that `perplexity` (a reference model's or an engine's) refuses the first token of
/// `ids` alone (nothing to predict) and a text with an id (200) past the fixtures' vocabulary.
pub fn assert_perplexity_refusals(
    ids: &[u32],
    mut perplexity: impl FnMut(&[u32]) -> Result<f64, ModelError>,
) {
    assert!(matches!(perplexity(&ids[..1]), Err(ModelError::EmptyInput)));
    assert!(matches!(
        perplexity(&[0, 200]),
        Err(ModelError::TokenOutOfVocab { .. })
    ));
}

/// A fixture's expectations.
pub struct Expected {
    /// A 12-token prompt.
    pub ids: Vec<u32>,
    /// Its logits `[12, vocab]`.
    pub logits: Vec<f32>,
    /// The prompt and 16 greedy tokens after it.
    pub greedy: Vec<u32>,
    /// Two prompts (the first is `ids`) and their logits.
    pub batch_ids: Vec<u32>,
    pub batch_logits: Vec<f32>,
}

/// Reads fixture `name`'s `expected.safetensors`.
pub fn expected(name: &str) -> Expected {
    let bytes = std::fs::read(dir(name).join("expected.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let ids = |k: &str| -> Vec<u32> {
        st.tensor(k)
            .unwrap()
            .data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
            .collect()
    };
    let f32s = |k: &str| -> Vec<f32> {
        st.tensor(k)
            .unwrap()
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    Expected {
        ids: ids("input_ids"),
        logits: f32s("logits"),
        greedy: ids("greedy"),
        batch_ids: ids("batch_input_ids"),
        batch_logits: f32s("batch_logits"),
    }
}

/// The largest |got − want|, asserted to be at most `rel · max|want|` (the bound each caller
/// states).
pub fn max_err(what: &str, got: &[f32], want: &[f32], rel: f32) -> f32 {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let err = got
        .iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        err <= rel * scale,
        "{what}: max |diff| {err:e} > {rel} · {scale}"
    );
    err
}

/// Runs `f` on a thread; fails the test if it has not returned within 20 s (a hang).
pub fn within<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(20))
        .expect("the call hung (no answer within 20 s)")
}

/// A copy of fixture `name` in a fresh temporary directory.
pub fn copy_fixture(name: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(dir(name).join(f), tmp.path().join(f)).unwrap();
    }
    tmp
}

/// The engine's `new` greedy tokens after the one prompt `ids`.
pub fn engine_greedy(e: &mut Engine, ids: &[u32], new: usize) -> Vec<u32> {
    let mut toks = e
        .generate_greedy(&[ids.to_vec()], new, &[], |_| {})
        .unwrap();
    toks.remove(0)
}

/// The reference's logits of every position of `ids`.
pub fn forward_logits(m: &CausalLm, ids: &[u32]) -> Vec<f32> {
    m.forward(ids, 1, &mut m.new_cache())
        .unwrap()
        .to_vec()
        .unwrap()
}

/// The reference's `new` greedy tokens after `ids`.
pub fn reference_greedy(m: &CausalLm, ids: &[u32], new: usize) -> Vec<u32> {
    let mut greedy = Sampler::new(Sampling::default()).unwrap();
    m.generate(ids, new, &mut greedy, &[], |_| {}).unwrap()
}

/// The reference's logits of every position of `ids` and its `new` greedy tokens after them.
pub fn reference_logits_and_greedy(m: &CausalLm, ids: &[u32], new: usize) -> (Vec<f32>, Vec<u32>) {
    (forward_logits(m, ids), reference_greedy(m, ids, new))
}

/// Greedy tokens the f32 decoding comparisons against the CPU check.
pub const DECODE_NEW: usize = 12;

/// Their prompt logits' bound relative to `max|logit|` (each caller's module docs say why).
pub const DECODE_REL: f32 = 1e-5;

/// The fixtures they decode: each Llama variant (tied embeddings, q/k/v biases, sliding
/// windows) and GPT-2.
pub const DECODE_NAMES: [&str; 5] = ["llama3", "llama-tied", "qwen2", "mistral-sw", "gpt2"];

/// A decoder's prompt logits and greedy tokens.
pub type Decoded = (Vec<f32>, Vec<u32>);

/// A decoder run on fixture `name`, prompt `ids`, on a device.
pub type DecodeRun = fn(&str, &[u32], Device) -> Decoded;

/// The reference's prompt logits (computed on `dev`) and greedy tokens on `dev`.
pub fn decode_reference(name: &str, ids: &[u32], dev: Device) -> Decoded {
    let m = CausalLm::load(&dir(name), dev).unwrap();
    let logits = m.forward(ids, 1, &mut m.new_cache()).unwrap();
    assert_eq!(logits.device(), dev);
    let toks = reference_greedy(&m, ids, DECODE_NEW);
    (logits.to_vec().unwrap(), toks)
}

/// The fast engine of fixture `name` on `dev` in f32 (no quantization), for `batch` rows of
/// `capacity` cache slots.
pub fn f32_engine(name: &str, dev: Device, batch: usize, capacity: usize) -> Engine {
    let opts = EngineOptions {
        dtype: DType::F32,
        batch,
        capacity,
        quant: None,
    };
    Engine::load(&dir(name), dev, opts).unwrap()
}

/// The fast engine's (f32) prompt logits (computed on `dev`) and greedy tokens on `dev`.
pub fn decode_engine(name: &str, ids: &[u32], dev: Device) -> Decoded {
    let mut e = f32_engine(name, dev, 1, 40);
    let prompt = [ids.to_vec()];
    let logits = e.prefill(&prompt, true).unwrap();
    assert_eq!(logits.device(), dev);
    let logits = logits.to_vec().unwrap();
    let toks = e.generate_greedy(&prompt, DECODE_NEW, &[], |_| {}).unwrap();
    (logits, toks[0].clone())
}

/// Each fixture of [`DECODE_NAMES`] decoded by the reference and by the engine on the CPU and
/// through `got` (the run on the backend under test, `label` in the messages): the greedy
/// tokens must be the CPU's and `transformers`' exactly, the prompt logits within
/// `DECODE_REL · max|logit|` of the CPU's (printed).
pub fn assert_decoding_matches_the_cpu(
    label: &str,
    got: impl Fn(DecodeRun, &str, &[u32]) -> Decoded,
) {
    let runs: [(&str, DecodeRun); 2] = [("CausalLm", decode_reference), ("Engine", decode_engine)];
    for name in DECODE_NAMES {
        let exp = expected(name);
        let (ids, hf) = (&exp.ids, &exp.greedy[exp.ids.len()..][..DECODE_NEW]);
        for (what, run) in runs {
            let what = format!("{name} {what} f32, {label} vs CPU");
            let (want, want_toks) = run(name, ids, Device::Cpu);
            let (got, toks) = got(run, name, ids);
            let err = max_err(&what, &got, &want, DECODE_REL);
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            eprintln!(
                "{what}: prompt logits max |diff| {err:e} ({:e} of max|logit|), tokens {toks:?}",
                err / scale
            );
            assert_eq!(toks, want_toks, "{what}: greedy tokens");
            assert_eq!(toks, hf, "{what}: transformers' greedy tokens");
        }
    }
}
