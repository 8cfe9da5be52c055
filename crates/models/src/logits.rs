//! [`LogitsEngine`]: what both inference engines offer a checker — the logits of a prompt and
//! greedy tokens after it — so that `check-hf` (and anything else comparing the engines with
//! `transformers`) runs either one: [`CausalLm`] (the f32 reference on tensor-ops) and
//! [`FastLogits`] (the fast [`Engine`], f32 or bf16).

use std::path::Path;

use tensor_ops::{DType, Device};

use crate::{CausalLm, Engine, EngineOptions, ModelConfig, ModelError, Sampler, Sampling};

/// An engine under test: logits of a prompt and greedy tokens after it.
pub trait LogitsEngine {
    /// What the engine is, for a report ("f32 reference engine on cuda:0").
    fn describe(&self) -> String;
    /// The logits `[ids.len(), vocab]` (row-major) of `ids` as one row from an empty cache.
    fn prompt_logits(&mut self, ids: &[u32]) -> Result<Vec<f32>, ModelError>;
    /// `n` greedy tokens after `ids` (no stop token).
    fn greedy(&mut self, ids: &[u32], n: usize) -> Result<Vec<u32>, ModelError>;
}

impl LogitsEngine for CausalLm {
    fn describe(&self) -> String {
        format!("f32 reference engine on {}", self.device())
    }

    fn prompt_logits(&mut self, ids: &[u32]) -> Result<Vec<f32>, ModelError> {
        let logits = self.forward(ids, 1, &mut self.new_cache())?;
        Ok(logits.to_vec()?)
    }

    fn greedy(&mut self, ids: &[u32], n: usize) -> Result<Vec<u32>, ModelError> {
        let mut sampler = Sampler::new(Sampling::default())?;
        self.generate(ids, n, &mut sampler, &[], |_| {})
    }
}

/// Cache slots a check needs at most: a prompt of 32 and 64 greedy tokens, with room.
const CAPACITY: usize = 256;

/// The fast engine as a [`LogitsEngine`]: batch 1, every prompt from an empty cache.
pub struct FastLogits {
    engine: Engine,
    device: Device,
}

impl FastLogits {
    /// The fast engine for the model in `dir` on `device`, storing its weights in `dtype`.
    pub fn load(dir: &Path, device: Device, dtype: DType) -> Result<Self, ModelError> {
        let cfg = ModelConfig::from_dir(dir)?;
        let opts = EngineOptions {
            dtype,
            batch: 1,
            capacity: CAPACITY.min(cfg.max_position_embeddings),
            quant: None,
        };
        Ok(FastLogits {
            engine: Engine::load(dir, device, opts)?,
            device,
        })
    }
}

impl LogitsEngine for FastLogits {
    fn describe(&self) -> String {
        format!(
            "fast engine ({}) on {}",
            self.engine.options().dtype,
            self.device
        )
    }

    fn prompt_logits(&mut self, ids: &[u32]) -> Result<Vec<f32>, ModelError> {
        let logits = self.engine.prefill(&[ids.to_vec()], true)?;
        Ok(logits.to_dtype(DType::F32).and_then(|l| l.to_vec())?)
    }

    fn greedy(&mut self, ids: &[u32], n: usize) -> Result<Vec<u32>, ModelError> {
        let mut out = self
            .engine
            .generate_greedy(&[ids.to_vec()], n, &[], |_| {})?;
        Ok(out.pop().unwrap_or_default())
    }
}
