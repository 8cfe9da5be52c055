//! `check-hf --engine fast`: [`models::Engine`] as a [`LogitsEngine`].

use std::path::Path;

use models::{Engine, EngineOptions, ModelConfig, ModelError};
use tensor_ops::{DType, Device};

use crate::check_hf::{CheckHfError, LogitsEngine};

/// Cache slots the checks need at most: a prompt of 32 and 64 greedy tokens, with room.
const CAPACITY: usize = 256;

/// The fast engine, rebuilt (cheaply: same weights) for each prompt from an empty cache.
pub struct FastEngine {
    engine: Engine,
    device: Device,
}

impl FastEngine {
    pub fn load(dir: &Path, device: Device, dtype: DType) -> Result<Self, CheckHfError> {
        let cfg = ModelConfig::from_dir(dir).map_err(ModelError::from)?;
        let opts = EngineOptions {
            dtype,
            batch: 1,
            capacity: CAPACITY.min(cfg.max_position_embeddings),
            quant: None,
        };
        Ok(FastEngine {
            engine: Engine::load(dir, device, opts)?,
            device,
        })
    }
}

impl LogitsEngine for FastEngine {
    fn describe(&self) -> String {
        format!(
            "fast engine ({}) on {}",
            self.engine.options().dtype,
            self.device
        )
    }

    fn prompt_logits(&mut self, ids: &[u32]) -> Result<Vec<f32>, CheckHfError> {
        let logits = self.engine.prefill(&[ids.to_vec()], true)?;
        Ok(logits
            .to_dtype(DType::F32)
            .and_then(|l| l.to_vec())
            .map_err(ModelError::from)?)
    }

    fn greedy(&mut self, ids: &[u32], n: usize) -> Result<Vec<u32>, CheckHfError> {
        let mut out = self
            .engine
            .generate_greedy(&[ids.to_vec()], n, &[], |_| {})?;
        Ok(out.pop().unwrap_or_default())
    }
}
