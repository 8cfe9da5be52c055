//! The fast engine over the `DecoderModel` trait (issue 40, item 4): an engine built from a
//! model loaded by `models::arch::load_decoder` is the engine `Engine::load` builds (the same
//! logits, bit for bit, and the same greedy tokens); the trait is open to a model the crate
//! does not know (a wrapper that counts the passes: one prefill, then one per decode step);
//! and a model whose dtype is not the engine's is refused.

mod hf_fixture;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use hf_fixture::dir;
use models::arch::{load_decoder, DecoderSource, FastPass};
use models::{Checkpoint, DecoderModel, Engine, EngineOptions, ModelConfig, ModelError};
use tensor_ops::{DType, Device, Tensor};

fn opts(dtype: DType) -> EngineOptions {
    EngineOptions {
        dtype,
        batch: 1,
        capacity: 24,
        quant: None,
    }
}

/// The model of `cfg` from `ck` on the CPU, its projections in `dtype`, not quantized.
fn on_cpu<'a>(cfg: &'a ModelConfig, ck: &'a Checkpoint, dtype: DType) -> DecoderSource<'a> {
    DecoderSource {
        cfg,
        ck,
        device: Device::Cpu,
        dtype,
        quant: None,
    }
}

fn model(name: &str, dtype: DType) -> Box<dyn DecoderModel> {
    let cfg = ModelConfig::from_dir(&dir(name)).unwrap();
    let ck = Checkpoint::open_checked(&dir(name), &cfg).unwrap();
    load_decoder(on_cpu(&cfg, &ck, dtype)).unwrap()
}

/// The prompt's logits and 6 greedy tokens after it.
fn run(e: &mut Engine) -> (Vec<f32>, Vec<u32>) {
    let prompt = vec![1u32, 5, 9, 2];
    let logits = e.prefill(std::slice::from_ref(&prompt), true).unwrap();
    let logits = logits.to_dtype(DType::F32).unwrap().to_vec().unwrap();
    let tokens = e.generate_greedy(&[prompt], 6, &[], |_| {}).unwrap();
    (logits, tokens[0].clone())
}

#[test]
fn an_engine_from_a_loaded_model_is_the_loaded_engine() {
    for name in ["llama3", "qwen2", "mistral-sw", "gpt2"] {
        for dtype in [DType::F32, DType::BF16] {
            let m = model(name, dtype);
            assert_eq!(m.learned_positions(), name == "gpt2", "{name}");
            assert_eq!(m.dtype(), dtype);
            let mut a = Engine::from_model(m, Device::Cpu, opts(dtype)).unwrap();
            let mut b = Engine::load(&dir(name), Device::Cpu, opts(dtype)).unwrap();
            assert_eq!(a.weight_bytes_per_step(), b.weight_bytes_per_step());
            assert_eq!(run(&mut a), run(&mut b), "{name} in {dtype}");
        }
    }
}

/// A model the crate does not know: another model's forward, counting its passes.
struct Counting {
    inner: Box<dyn DecoderModel>,
    passes: Arc<AtomicUsize>,
}

impl DecoderModel for Counting {
    fn load(src: DecoderSource<'_>) -> Result<Self, ModelError> {
        Ok(Counting {
            inner: load_decoder(src)?,
            passes: Arc::default(),
        })
    }

    fn config(&self) -> &ModelConfig {
        self.inner.config()
    }

    fn dtype(&self) -> DType {
        self.inner.dtype()
    }

    fn forward(&self, pass: &FastPass<'_>) -> Result<Tensor, ModelError> {
        self.passes.fetch_add(1, Ordering::Relaxed);
        self.inner.forward(pass)
    }

    fn bytes_per_step(&self) -> usize {
        self.inner.bytes_per_step()
    }

    fn learned_positions(&self) -> bool {
        self.inner.learned_positions()
    }
}

#[test]
fn the_engine_runs_a_model_it_does_not_know() {
    for name in ["llama3", "gpt2"] {
        let cfg = ModelConfig::from_dir(&dir(name)).unwrap();
        let ck = Checkpoint::open_checked(&dir(name), &cfg).unwrap();
        let m = Counting::load(on_cpu(&cfg, &ck, DType::F32)).unwrap();
        let passes = m.passes.clone();
        let mut e = Engine::from_model(Box::new(m), Device::Cpu, opts(DType::F32)).unwrap();
        let mut plain = Engine::load(&dir(name), Device::Cpu, opts(DType::F32)).unwrap();
        let (logits, tokens) = run(&mut e);
        // `run`: a prefill of all positions, then a generation of 6 tokens (its own prefill
        // and 5 eager decode steps on the CPU).
        assert_eq!(passes.load(Ordering::Relaxed), 1 + 1 + 5, "{name}");
        assert_eq!((logits, tokens), run(&mut plain), "{name}");
    }
}

#[test]
fn a_model_in_another_dtype_is_refused() {
    let m = model("llama3", DType::BF16);
    let err = Engine::from_model(m, Device::Cpu, opts(DType::F32))
        .err()
        .unwrap();
    assert!(matches!(err, ModelError::Unsupported(_)), "{err}");
}
