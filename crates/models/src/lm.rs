//! A causal language model loaded from a Hugging Face model directory, run with a KV cache:
//! [`CausalLm::forward`] for logits, [`CausalLm::generate`] for tokens. The f32 reference the
//! fast [`crate::Engine`] is tested against: each architecture's reference forward
//! (`crate::arch::*::reference`) behind the crate's `ReferenceModel` trait, chosen once at load.

use std::path::Path;

use tensor_ops::{no_grad, Device, Tensor};

use crate::arch::{load_reference, RefPass, ReferenceModel};
use crate::cache::KvCache;
use crate::config::ModelConfig;
use crate::error::{LogitsAt, ModelError};
use crate::layers::Slots;
use crate::quant::QuantKind;
use crate::sample::{usable, Sampler};
use crate::weights::Checkpoint;

/// A loaded model: its config and weights (f32) on one device.
pub struct CausalLm {
    cfg: ModelConfig,
    model: Box<dyn ReferenceModel>,
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
        let model = load_reference(&cfg, ck, device)?;
        Ok(CausalLm { cfg, model, device })
    }

    /// Rounds every layer's projection weights (not the embeddings or the head) to `kind`
    /// and computes from the dequantized values from then on: the accuracy of the format (its
    /// perplexity), not its speed or memory (the weights stay f32 here). Returns the bytes the
    /// quantized projections take. All or nothing: a weight that cannot be quantized (not
    /// finite) leaves the model as it was.
    pub fn quantize(&mut self, kind: QuantKind) -> Result<usize, ModelError> {
        let mut linears = self.model.linears_mut();
        let new = linears
            .iter()
            .map(|l| l.quantized(kind))
            .collect::<Result<Vec<_>, _>>()?;
        let mut bytes = 0;
        for (l, (w, b)) in linears.iter_mut().zip(new) {
            l.set_weight(w);
            bytes += b;
        }
        Ok(bytes)
    }

    /// The perplexity of `ids` (`exp` of the mean negative log-likelihood of each token after
    /// its predecessors), in windows of the model's context, each from an empty cache. A row of
    /// non-finite logits is [`ModelError::NonFiniteLogits`] at the position it predicts.
    pub fn perplexity(&self, ids: &[u32]) -> Result<f64, ModelError> {
        if ids.len() < 2 {
            return Err(ModelError::EmptyInput);
        }
        let ctx = self.cfg.max_position_embeddings;
        let vocab = self.cfg.vocab_size;
        let (mut nll, mut n) = (0f64, 0usize);
        // Windows overlap by one token, so every token but the first is predicted once.
        for range in crate::engine::perplexity_windows(ids.len(), ctx)? {
            let start = range.start;
            let w = &ids[range];
            let lp = self
                .forward(w, 1, &mut self.new_cache())?
                .log_softmax()?
                .to_vec()?;
            for (i, &next) in w[1..].iter().enumerate() {
                // A NaN in a row of the log-softmax: a NaN or +∞ logit, or none finite (the
                // rows `usable` refuses; finite logits and −∞ give finite values or −∞).
                if lp[i * vocab..(i + 1) * vocab].iter().any(|v| v.is_nan()) {
                    let at = LogitsAt::Position(start + i + 1);
                    return Err(ModelError::NonFiniteLogits(at));
                }
                nll -= lp[i * vocab + next as usize] as f64;
                n += 1;
            }
        }
        Ok((nll / n as f64).exp())
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
        let pads = if cache.is_empty() {
            vec![0; batch]
        } else {
            cache.pads.clone()
        };
        self.forward_padded(ids, batch, &pads, cache)
    }

    /// [`CausalLm::forward`] of rows left-padded by `pads` slots each (a row's padding is
    /// masked out and its tokens numbered from 0 after it, as `transformers` does with an
    /// attention mask). The first pass fixes the padding of the cache: later passes must give
    /// the same, and every row needs a real token in the first pass.
    pub fn forward_padded(
        &self,
        ids: &[u32],
        batch: usize,
        pads: &[usize],
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
        let fits = pads.len() == batch
            && if start == 0 {
                pads.iter().all(|&p| p < t)
            } else {
                pads == cache.pads.as_slice()
            };
        if !fits {
            return Err(ModelError::BadPadding(format!(
                "{pads:?} for {batch} rows of {t} tokens after {start} (cached padding {:?})",
                cache.pads
            )));
        }
        let x = Tensor::from_vec(ids.to_vec(), &[batch, t], self.device)?;
        let slots = Slots { start, t, pads };
        // The layers extend a copy of the cache (shared tensors), kept only on success.
        let mut work = cache.layers.clone();
        let pass = RefPass {
            ids: &x,
            slots: &slots,
            caches: &mut work,
        };
        let logits = no_grad(|| self.model.forward(pass))?;
        cache.layers = work;
        cache.pads = pads.to_vec();
        Ok(logits)
    }

    /// Generates up to `max_new` tokens after each of `prompts` in one batch (left-padded to
    /// the longest), sampling each row with `sampler` in row order; a row stops at a token in
    /// `stop` (it is fed on, its later tokens dropped). Each row's tokens are those it would
    /// get alone, up to the arithmetic's rounding.
    pub fn generate_batch(
        &self,
        prompts: &[&[u32]],
        max_new: usize,
        sampler: &mut Sampler,
        stop: &[u32],
    ) -> Result<Vec<Vec<u32>>, ModelError> {
        let longest = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
        if prompts.is_empty() || prompts.iter().any(|p| p.is_empty()) {
            return Err(ModelError::EmptyInput);
        }
        let mut cache = self.new_cache();
        let need = longest.saturating_add(max_new);
        if need > cache.context() {
            return Err(ModelError::ContextFull {
                have: 0,
                more: need,
                context: cache.context(),
            });
        }
        let pads: Vec<usize> = prompts.iter().map(|p| longest - p.len()).collect();
        let mut input: Vec<u32> = prompts
            .iter()
            .flat_map(|p| std::iter::repeat_n(0, longest - p.len()).chain(p.iter().copied()))
            .collect();
        let mut history: Vec<Vec<u32>> = prompts.iter().map(|p| p.to_vec()).collect();
        let mut out = vec![Vec::new(); prompts.len()];
        let mut done = vec![false; prompts.len()];
        let vocab = self.cfg.vocab_size;
        for step in 0..max_new {
            let b = prompts.len();
            let t = input.len() / b;
            let logits = self.forward_padded(&input, b, &pads, &mut cache)?;
            let last = logits.narrow(1, t - 1, 1)?.to_vec()?;
            input.clear();
            for r in 0..b {
                let row = &last[r * vocab..(r + 1) * vocab];
                if !usable(row) {
                    return Err(ModelError::NonFiniteLogits(LogitsAt::Step { step, row: r }));
                }
                let tok = sampler.sample(row, &history[r])?;
                input.push(tok);
                if !done[r] {
                    out[r].push(tok);
                    history[r].push(tok);
                    done[r] = stop.contains(&tok);
                }
            }
            if done.iter().all(|&d| d) {
                break;
            }
        }
        Ok(out)
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
        for step in 0..max_new {
            let logits = self.forward(&input, 1, &mut cache)?;
            let t = input.len();
            let last = logits.narrow(1, t - 1, 1)?.to_vec()?;
            if !usable(&last) {
                return Err(ModelError::NonFiniteLogits(LogitsAt::Step { step, row: 0 }));
            }
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
