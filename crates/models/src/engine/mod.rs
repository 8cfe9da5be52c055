//! The fast inference engine, generic over the model: any [`DecoderModel`] (the Llama family's
//! and GPT-2's fast forwards, `crate::arch`, with weights in bf16 or f32 and fused q/k/v and
//! gate/up projections), held as a `Box<dyn DecoderModel>` and called through the trait (the
//! engine never looks at the architecture). The engine owns what is not the model's: a
//! preallocated key/value cache per layer, each row's slots, prefill of left-padded prompts in
//! one pass, and decoding whose step is captured once as a CUDA graph and replayed, with the
//! choice of the next token on the device (the argmax, or `Tensor::sample_last`: repetition
//! penalty, temperature, top-k, top-p, a seeded Philox draw): one device-to-host copy (the new
//! tokens) per step. On the CPU the same ops run eagerly.
//!
//! Non-finite logits: a row whose logits have a NaN or a +∞, or no finite value (all −∞), has
//! no token to choose, greedy or sampled (the rule of [`crate::Sampler`]: a −∞ among finite
//! logits masks its token). The argmax is `sample_last` at temperature 0, which returns the
//! sentinel `vocab` for such a row in the step's one read-back (no extra copy or sync, inside
//! the captured graph too): the step fails with [`ModelError::NonFiniteLogits`].
//! [`crate::CausalLm`] is the f32 reference it is tested against.

mod generate;
mod perplexity;

pub use perplexity::perplexity_windows;

use std::path::Path;

use tensor_ops::graph::{capture, Graph};
use tensor_ops::{no_grad, DType, Device, SampleParams, Tensor};

use crate::arch::{load_decoder, DecoderModel, DecoderSource, FastPass, KvSlots};
use crate::config::ModelConfig;
use crate::error::{LogitsAt, ModelError};
use crate::quant::QuantKind;
use crate::sample::{Sampler, Sampling};
use crate::weights::Checkpoint;

/// The engine's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineOptions {
    /// The weights' and activations' dtype: bf16 or f32 (norms, softmax and the residual
    /// stream are f32 either way).
    pub dtype: DType,
    /// Rows decoded together.
    pub batch: usize,
    /// Cache slots per row: the longest prompt plus new tokens (at most the context).
    pub capacity: usize,
    /// Quantize the layers' projections to int8 or int4 at load (`models::quant`; the
    /// matmuls dequantize in registers, `Tensor::matmul_quant`); `None`: the engine's dtype.
    pub quant: Option<QuantKind>,
}

/// How a step chooses its token: the argmax, or a draw with these settings.
type Choice = Option<SampleParams>;

/// The argmax as `sample_last` computes it (temperature 0, no penalty): the first maximum, or
/// `vocab` for a row with non-finite logits (see the module doc).
const GREEDY: SampleParams = SampleParams {
    temperature: 0.0,
    top_k: 0,
    top_p: 1.0,
    penalty: 1.0,
    seed: 0,
    offset: 0,
};

/// The captured decode step: its input ids `[batch, 1]` (and their positions, for learned
/// positions), its output (the chosen tokens) `[batch]`, and how it chooses them (a graph
/// replays the settings it was captured with).
struct DecodeGraph {
    graph: Option<Graph>,
    ids: Tensor,
    pos: Option<Tensor>,
    next: Tensor,
    choice: Choice,
}

/// A model ready to generate (see the module doc).
pub struct Engine {
    // Declared first, so the graph is dropped before the buffers it reads.
    decode: Option<DecodeGraph>,
    cfg: ModelConfig,
    model: Box<dyn DecoderModel>,
    opts: EngineOptions,
    device: Device,
    /// Per layer, the key and value caches `[batch, kv_heads, capacity, head_dim]`.
    caches: Vec<(Tensor, Tensor)>,
    /// u32 `[batch]`: each row's first real slot and its next free slot, on the device ...
    start: Tensor,
    slot: Tensor,
    /// u32 `[batch, ⌈vocab/32⌉]`: the tokens each row was prompted with or produced (the
    /// repetition penalty's history), on the device (the sampling op adds its draws) ...
    seen: Tensor,
    /// ... and on the host: the history after the last successful step, written back when a
    /// step fails.
    host_seen: Vec<u32>,
    /// The slot after the prompts (the first new token is step 0 of a generation).
    prefilled: u32,
    /// Where each row stands, as last written to `start` and `slot`.
    host_start: Vec<u32>,
    host_slot: Vec<u32>,
}

impl Engine {
    /// Loads `dir` onto `device` (see [`crate::CausalLm::load`] for the checks).
    pub fn load(dir: &Path, device: Device, opts: EngineOptions) -> Result<Self, ModelError> {
        let cfg = ModelConfig::from_dir(dir)?;
        let ck = Checkpoint::open_checked(dir, &cfg)?;
        Self::from_checkpoint(cfg, &ck, device, opts)
    }

    /// Builds the engine of `cfg` from an opened checkpoint: the model of its architecture
    /// (`crate::arch::load_decoder`), then [`Engine::from_model`]. Options are checked before
    /// any weight is read.
    pub fn from_checkpoint(
        cfg: ModelConfig,
        ck: &Checkpoint,
        device: Device,
        opts: EngineOptions,
    ) -> Result<Self, ModelError> {
        check_options(&cfg, device, opts)?;
        let src = DecoderSource {
            cfg: &cfg,
            ck,
            device,
            dtype: opts.dtype,
            quant: opts.quant,
        };
        let model = no_grad(|| load_decoder(src))?;
        Self::from_model(model, device, opts)
    }

    /// The engine of a loaded `model` (on `device`, in `opts.dtype`; its `opts.quant` is what
    /// it was loaded with): the caches and slots for `opts.batch` rows of `opts.capacity`.
    pub fn from_model(
        model: Box<dyn DecoderModel>,
        device: Device,
        opts: EngineOptions,
    ) -> Result<Self, ModelError> {
        let cfg = model.config().clone();
        check_options(&cfg, device, opts)?;
        if model.dtype() != opts.dtype {
            return Err(ModelError::Unsupported(format!(
                "a model in {} for an engine in {}",
                model.dtype(),
                opts.dtype
            )));
        }
        let shape = [opts.batch, cfg.num_kv_heads, opts.capacity, cfg.head_dim];
        let caches = (0..cfg.num_layers)
            .map(|_| {
                let z = || Tensor::zeros(&shape, device)?.to_dtype(opts.dtype);
                Ok((z()?, z()?))
            })
            .collect::<Result<Vec<_>, tensor_ops::GpuError>>()?;
        let zeros = vec![0u32; opts.batch];
        let words = cfg.vocab_size.div_ceil(32);
        Ok(Engine {
            decode: None,
            seen: Tensor::from_vec(vec![0u32; opts.batch * words], &[opts.batch, words], device)?,
            host_seen: vec![0u32; opts.batch * words],
            prefilled: 0,
            start: Tensor::from_vec(zeros.clone(), &[opts.batch], device)?,
            slot: Tensor::from_vec(zeros.clone(), &[opts.batch], device)?,
            host_start: zeros.clone(),
            host_slot: zeros,
            cfg,
            model,
            opts,
            device,
            caches,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn options(&self) -> EngineOptions {
        self.opts
    }

    /// Bytes of weights one decode step reads (the bandwidth limit's numerator).
    pub fn weight_bytes_per_step(&self) -> usize {
        self.model.bytes_per_step()
    }

    /// Logits of `ids` `[b, t]` (u32) after what the caches hold (each row at its `slot`),
    /// written into the caches: the model's forward of the pass ([`FastPass`] says what
    /// `pos`, `max_end`, `last_only` and `fresh` are).
    fn forward(
        &self,
        ids: &Tensor,
        pos: Option<&Tensor>,
        max_end: usize,
        last_only: bool,
        fresh: bool,
    ) -> Result<Tensor, ModelError> {
        self.model.forward(&FastPass {
            ids,
            pos,
            kv: KvSlots {
                layers: &self.caches,
                start: &self.start,
                slot: &self.slot,
            },
            max_end,
            last_only,
            fresh,
        })
    }

    /// Checks token ids against the vocabulary.
    fn check_ids(&self, ids: &[u32]) -> Result<(), ModelError> {
        let vocab = self.cfg.vocab_size;
        match ids.iter().position(|&id| id as usize >= vocab) {
            Some(at) => Err(ModelError::TokenOutOfVocab {
                id: ids[at],
                at,
                vocab,
            }),
            None => Ok(()),
        }
    }

    /// Starts a new generation: `prompts` (one per batch row, 1 ..= capacity tokens each)
    /// left-padded to the longest, run through the model in one pass into the caches (and the
    /// prompts' tokens into the repetition penalty's history). Returns
    /// the logits `[batch, vocab]` of each row's last token on the device (or all positions'
    /// `[batch, t, vocab]` when `all`). A refused call changes nothing.
    pub fn prefill(&mut self, prompts: &[Vec<u32>], all: bool) -> Result<Tensor, ModelError> {
        let b = self.opts.batch;
        if prompts.len() != b {
            return Err(ModelError::BadPadding(format!(
                "{} prompts for an engine of batch {b}",
                prompts.len()
            )));
        }
        let t = prompts.iter().map(Vec::len).max().unwrap_or(0);
        if prompts.iter().any(Vec::is_empty) {
            return Err(ModelError::EmptyInput);
        }
        if t > self.opts.capacity {
            return Err(ModelError::ContextFull {
                have: 0,
                more: t,
                context: self.opts.capacity,
            });
        }
        let mut ids = Vec::with_capacity(b * t);
        for p in prompts {
            self.check_ids(p)?;
            ids.extend(std::iter::repeat_n(0, t - p.len()));
            ids.extend_from_slice(p);
        }
        let start: Vec<u32> = prompts.iter().map(|p| (t - p.len()) as u32).collect();
        let words = self.cfg.vocab_size.div_ceil(32);
        let mut seen = vec![0u32; b * words];
        for (r, p) in prompts.iter().enumerate() {
            for &id in p {
                seen[r * words + id as usize / 32] |= 1 << (id % 32);
            }
        }
        let learned = self.model.learned_positions();
        let pos = learned.then(|| self.positions(&start, t)).transpose()?;
        self.seen.write_from_host(&seen)?;
        self.host_seen = seen;
        self.prefilled = t as u32;
        self.start.write_from_host(&start)?;
        self.slot.write_from_host(&vec![0u32; b])?;
        self.host_slot = vec![0; b];
        self.host_start = start;
        let ids = Tensor::from_vec(ids, &[b, t], self.device)?;
        let logits = no_grad(|| self.forward(&ids, pos.as_ref(), t, !all, true))?;
        self.host_slot = vec![t as u32; b];
        Ok(if all {
            logits
        } else {
            logits.reshape(&[b, self.cfg.vocab_size])?
        })
    }

    /// The positions `[b, t]` of a prefill of `t` slots whose rows start at `start`: slot
    /// `i` of row `r` is at `i − start[r]` (0 on padding), as the reference numbers them.
    fn positions(&self, start: &[u32], t: usize) -> Result<Tensor, ModelError> {
        let pos = start
            .iter()
            .flat_map(|&s| (0..t as u32).map(move |i| i.saturating_sub(s)))
            .collect();
        Ok(Tensor::from_vec(pos, &[start.len(), t], self.device)?)
    }

    /// One greedy decode step: [`Engine::decode`] choosing the argmax.
    pub fn decode_greedy(&mut self, tokens: &[u32]) -> Result<Vec<u32>, ModelError> {
        self.decode(tokens, &Sampling::default())
    }

    /// One decode step: feeds `tokens` (one per row) at each row's next slot and returns the
    /// next token of each row, chosen on the device as `sampling` says (the argmax at
    /// temperature 0 without a penalty; else `Tensor::sample_last`, whose draw for the token
    /// after slot `s` is Philox's at counter `s`, so a seed replays a generation). On CUDA the
    /// step is a CUDA graph (captured at the first call, again when the settings change) and
    /// this is one host-to-device write of the ids and slots (and positions, for learned
    /// positions), one replay and one device-to-host copy of the result. A step that fails (a
    /// row with no token to choose: [`ModelError::NonFiniteLogits`] when its logits are not
    /// finite, `ModelError::BadSampling` when the settings overflow finite ones) leaves the
    /// engine as it
    /// was: the rows stay at their slots and the penalty's history is restored.
    pub fn decode(&mut self, tokens: &[u32], sampling: &Sampling) -> Result<Vec<u32>, ModelError> {
        let choice = choice(sampling)?;
        let b = self.opts.batch;
        if tokens.len() != b {
            return Err(ModelError::RaggedBatch(tokens.len(), b));
        }
        self.check_ids(tokens)?;
        let have = self.host_slot.iter().copied().max().unwrap_or(0) as usize;
        if have + 1 > self.opts.capacity {
            return Err(ModelError::ContextFull {
                have,
                more: 1,
                context: self.opts.capacity,
            });
        }
        if self.decode.as_ref().is_none_or(|d| d.choice != choice) {
            self.decode = None;
            self.decode = Some(self.build_decode(choice)?);
        }
        let d = self.decode.as_ref().expect("built above");
        d.ids.write_from_host(tokens)?;
        if let Some(pos) = &d.pos {
            let at: Vec<u32> = self
                .host_slot
                .iter()
                .zip(&self.host_start)
                .map(|(&s, &st)| s.saturating_sub(st))
                .collect();
            pos.write_from_host(&at)?;
        }
        self.slot.write_from_host(&self.host_slot)?;
        let next = match &d.graph {
            Some(g) => {
                g.replay()?;
                d.next.to_vec_u32().map_err(ModelError::from)
            }
            None => self.eager_step(d, choice),
        };
        let step = (self.host_slot[0] + 1).saturating_sub(self.prefilled) as usize;
        let next = next.and_then(|n| match self.refused_row(&n) {
            None => Ok(n),
            Some(row) => Err(self.refusal(row, step, choice, || self.eager_step(d, None))),
        });
        match next {
            Ok(next) => {
                // The step is taken: the rows move on and their tokens join the history.
                self.host_slot.iter_mut().for_each(|s| *s += 1);
                self.mark_seen(&next);
                Ok(next)
            }
            Err(e) => {
                // Nothing moved: the next step rewrites the slots this one wrote (the rows'
                // slots are written from the host each step); the history the sampling op
                // marked for the other rows is restored.
                self.seen.write_from_host(&self.host_seen)?;
                Err(e)
            }
        }
    }

    /// Adds each row's chosen token to the host's copy of the history (the sampling op marked
    /// the device's).
    fn mark_seen(&mut self, next: &[u32]) {
        let words = self.cfg.vocab_size.div_ceil(32);
        for (r, &tok) in next.iter().enumerate() {
            self.host_seen[r * words + tok as usize / 32] |= 1 << (tok % 32);
        }
    }

    /// The decode step run eagerly (no graph) on the inputs `d` holds: each row's next token.
    fn eager_step(&self, d: &DecodeGraph, choice: Choice) -> Result<Vec<u32>, ModelError> {
        Ok(no_grad(|| self.step(&d.ids, d.pos.as_ref(), choice))?.to_vec_u32()?)
    }

    /// The first row that had no token to choose (`sample_last` gave `vocab`), if any.
    fn refused_row(&self, next: &[u32]) -> Option<usize> {
        next.iter().position(|&t| t as usize >= self.cfg.vocab_size)
    }

    /// Why `row` had no token to choose at `step`: its logits are not finite
    /// ([`ModelError::NonFiniteLogits`]), unless the step sampled (`choice`) and the argmax of
    /// the same logits (`greedy`, recomputed only on this failure) finds a token in that row:
    /// then the settings overflowed finite logits ([`ModelError::BadSampling`]).
    fn refusal(
        &self,
        row: usize,
        step: usize,
        choice: Choice,
        greedy: impl FnOnce() -> Result<Vec<u32>, ModelError>,
    ) -> ModelError {
        if let Some(p) = choice {
            if greedy().is_ok_and(|g| self.refused_row(&g[row..=row]).is_none()) {
                return ModelError::BadSampling(format!(
                    "temperature {} and repetition penalty {} overflow row {row}'s logits at \
                     step {step} (finite, but not once scaled)",
                    p.temperature, p.penalty
                ));
            }
        }
        ModelError::NonFiniteLogits(LogitsAt::Step { step, row })
    }

    /// The token of each row of `logits` `[batch, vocab]`, chosen as `choice` says, with the
    /// draw at each row's `slot` plus `offset`.
    fn choose(&self, logits: &Tensor, choice: Choice, offset: u32) -> Result<Tensor, ModelError> {
        let p = choice.unwrap_or(GREEDY);
        Ok(logits.sample_last(&self.seen, &self.slot, SampleParams { offset, ..p })?)
    }

    /// The decode step's work: logits of one token per row, and each row's next token `[batch]`.
    fn step(
        &self,
        ids: &Tensor,
        pos: Option<&Tensor>,
        choice: Choice,
    ) -> Result<Tensor, ModelError> {
        let logits = self.forward(ids, pos, self.opts.capacity, true, false)?;
        let logits = logits.reshape(&[self.opts.batch, self.cfg.vocab_size])?;
        self.choose(&logits, choice, 0)
    }

    /// The input tensor of the decode step and, on CUDA, its captured graph.
    fn build_decode(&self, choice: Choice) -> Result<DecodeGraph, ModelError> {
        let b = self.opts.batch;
        // The ids' recorded host bound (vocab − 1, attained) stays true for every id written
        // later: they are checked against the vocabulary first.
        let top = self.cfg.vocab_size as u32 - 1;
        let ids = Tensor::from_vec(vec![top; b], &[b, 1], self.device)?;
        // Likewise the positions' (capacity − 1, attained): a decode step's slots are below
        // the capacity, and a position is at most its slot.
        let last = self.opts.capacity as u32 - 1;
        let pos = self
            .model
            .learned_positions()
            .then(|| Tensor::from_vec(vec![last; b], &[b, 1], self.device))
            .transpose()?;
        match self.device {
            Device::Cuda(_) => {
                let (graph, next) = capture(self.device, || {
                    no_grad(|| self.step(&ids, pos.as_ref(), choice)).map_err(op_err)
                })?;
                Ok(DecodeGraph {
                    graph: Some(graph),
                    ids,
                    pos,
                    next,
                    choice,
                })
            }
            Device::Cpu | Device::Wgpu(_) => Ok(DecodeGraph {
                graph: None,
                next: Tensor::from_vec(vec![0u32; b], &[b], self.device)?,
                ids,
                pos,
                choice,
            }),
        }
    }
}

/// Refuses a dtype other than bf16 and f32, an empty batch or cache, a cache longer than the
/// context of `cfg`, and f16 weights on CUDA (no kernel there: the HAL's default goes through
/// the host, which a decode graph cannot capture; CUDA's half-width type is bf16).
fn check_options(cfg: &ModelConfig, device: Device, opts: EngineOptions) -> Result<(), ModelError> {
    if opts.quant == Some(QuantKind::F16) && matches!(device, Device::Cuda(_)) {
        return Err(ModelError::Unsupported(
            "f16 weights on CUDA (use --dtype bf16 there; f16 runs on wgpu and the CPU)".into(),
        ));
    }
    if !matches!(opts.dtype, DType::BF16 | DType::F32) {
        return Err(ModelError::Unsupported(format!(
            "engine dtype {} (bf16 or f32)",
            opts.dtype
        )));
    }
    if opts.batch == 0 || opts.capacity == 0 || opts.capacity > cfg.max_position_embeddings {
        return Err(ModelError::Unsupported(format!(
            "batch {} and capacity {} (both >= 1, capacity <= the context of {})",
            opts.batch, opts.capacity, cfg.max_position_embeddings
        )));
    }
    Ok(())
}

/// How `sampling` chooses (checked as the reference's sampler checks it): the argmax at
/// temperature 0 without a penalty, else a draw.
fn choice(sampling: &Sampling) -> Result<Choice, ModelError> {
    Sampler::new(*sampling)?;
    let s = sampling;
    if s.temperature == 0.0 && s.repetition_penalty == 1.0 {
        return Ok(None);
    }
    Ok(Some(SampleParams {
        temperature: s.temperature,
        top_k: s.top_k.map_or(0, |k| k.min(u32::MAX as usize) as u32),
        top_p: s.top_p,
        penalty: s.repetition_penalty,
        seed: s.seed,
        offset: 0,
    }))
}

fn op_err(e: ModelError) -> tensor_ops::GpuError {
    match e {
        ModelError::Op(g) => g,
        other => tensor_ops::GpuError::invalid("decode step", other.to_string()),
    }
}
