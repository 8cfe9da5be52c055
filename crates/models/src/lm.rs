//! A causal language model loaded from a Hugging Face model directory, run with a KV cache:
//! [`CausalLm::forward`] for logits, [`CausalLm::generate`] for tokens.

use std::path::Path;

use tensor_ops::{no_grad, Device, Tensor};

use crate::cache::KvCache;
use crate::config::{Architecture, ModelConfig};
use crate::error::ModelError;
use crate::gpt2::Gpt2;
use crate::llama::Llama;
use crate::sample::Sampler;
use crate::weights::Checkpoint;

enum Family {
    Llama(Llama),
    Gpt2(Gpt2),
}

/// A loaded model: its config and weights (f32) on one device.
pub struct CausalLm {
    cfg: ModelConfig,
    family: Family,
    device: Device,
}

impl CausalLm {
    /// Loads `dir` (`config.json`, `model.safetensors` or shards with their index) onto
    /// `device`. The weights are checked against the config before any is read.
    pub fn load(dir: &Path, device: Device) -> Result<Self, ModelError> {
        let cfg = ModelConfig::from_dir(dir)?;
        let ck = Checkpoint::open_checked(dir, &cfg)?;
        Self::from_checkpoint(cfg, &ck, device)
    }

    /// Builds the model of `cfg` from an opened checkpoint.
    pub fn from_checkpoint(
        cfg: ModelConfig,
        ck: &Checkpoint,
        device: Device,
    ) -> Result<Self, ModelError> {
        let family = match cfg.architecture {
            Architecture::Gpt2 => Family::Gpt2(Gpt2::load(&cfg, ck, device)?),
            _ => Family::Llama(Llama::load(&cfg, ck, device)?),
        };
        Ok(CausalLm {
            cfg,
            family,
            device,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// An empty cache for this model, at most its context long.
    pub fn new_cache(&self) -> KvCache {
        KvCache::new(self.cfg.num_layers, self.cfg.max_position_embeddings)
    }

    /// The logits `[batch, t, vocab]` of `ids` (`batch` rows of `t` tokens, row-major) after
    /// what `cache` holds, which grows by `t` positions. Out-of-vocabulary ids, an empty input,
    /// a batch that does not split into rows and a context overflow are typed errors; a refused
    /// or failed call leaves the cache as it was.
    pub fn forward(
        &self,
        ids: &[u32],
        batch: usize,
        cache: &mut KvCache,
    ) -> Result<Tensor, ModelError> {
        if ids.is_empty() || batch == 0 {
            return Err(ModelError::EmptyInput);
        }
        if !ids.len().is_multiple_of(batch) {
            return Err(ModelError::RaggedBatch(ids.len(), batch));
        }
        let vocab = self.cfg.vocab_size;
        if let Some((at, &id)) = ids.iter().enumerate().find(|(_, &id)| id as usize >= vocab) {
            return Err(ModelError::TokenOutOfVocab { id, at, vocab });
        }
        let t = ids.len() / batch;
        cache.reserve(t)?;
        let start = cache.len();
        let x = Tensor::from_vec(ids.to_vec(), &[batch, t], self.device)?;
        // The layers extend a copy of the cache (shared tensors), kept only on success.
        let mut work = cache.layers.clone();
        let logits = no_grad(|| match &self.family {
            Family::Llama(m) => m.forward(&x, start, &mut work),
            Family::Gpt2(m) => m.forward(&x, start, &mut work),
        })?;
        cache.layers = work;
        Ok(logits)
    }

    /// Generates up to `max_new` tokens after `prompt` (one row) with `sampler`, calling
    /// `on_token` with each as it is chosen (streaming); returns the new tokens. Each step reads
    /// the last position's logits to the host (one copy of `vocab` floats). Stops early at a
    /// token in `stop`.
    pub fn generate(
        &self,
        prompt: &[u32],
        max_new: usize,
        sampler: &mut Sampler,
        stop: &[u32],
        mut on_token: impl FnMut(u32),
    ) -> Result<Vec<u32>, ModelError> {
        let mut cache = self.new_cache();
        let need = prompt.len().saturating_add(max_new);
        if need > cache.context() {
            return Err(ModelError::ContextFull {
                have: 0,
                more: need,
                context: cache.context(),
            });
        }
        let mut history = prompt.to_vec();
        let mut out = Vec::with_capacity(max_new);
        let mut input = prompt.to_vec();
        for _ in 0..max_new {
            let logits = self.forward(&input, 1, &mut cache)?;
            let t = input.len();
            let last = logits.narrow(1, t - 1, 1)?.to_vec()?;
            let tok = sampler.sample(&last, &history)?;
            on_token(tok);
            out.push(tok);
            history.push(tok);
            if stop.contains(&tok) {
                break;
            }
            input = vec![tok];
        }
        Ok(out)
    }
}
