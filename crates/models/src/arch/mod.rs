//! The Hugging Face architectures, one folder each ([`llama`]: Llama 2 and 3, Qwen2, Mistral;
//! [`gpt2`]: GPT-2), each holding both of its forwards: the f32 reference that
//! [`crate::CausalLm`] runs (`reference.rs`, on the shared blocks of `crate::layers`) and the
//! fast forward with its weights that the [`crate::Engine`] runs (`fast.rs`, on the shared
//! pieces of [`fast`]).
//!
//! Dispatch is by trait, never by a `match` in a forward pass or an engine step:
//! - [`DecoderModel`] is the fast model: loaded from a config and a checkpoint, it runs a batch
//!   of new positions into the engine's key/value cache and returns their logits; it says the
//!   bytes one decode step reads and whether tokens carry learned positions. The engine (cache,
//!   slots, CUDA graphs, sampler) holds a `Box<dyn DecoderModel>` and knows no architecture.
//! - `ReferenceModel` (crate-internal: its cache and slots are the reference's own types) is
//!   the reference forward; [`crate::CausalLm`] holds a `Box<dyn ReferenceModel>`.
//!
//! The one `match` on [`Architecture`] for each is here: [`load_decoder`] and
//! `load_reference`, exhaustive, so a new architecture fails to build until it has both.

pub mod fast;
pub mod gpt2;
pub mod llama;

use tensor_ops::{DType, Device, Tensor};

use crate::cache::LayerCache;
use crate::config::{Architecture, ModelConfig};
use crate::error::ModelError;
use crate::layers::{Linear, Slots};
use crate::quant::QuantKind;
use crate::weights::Checkpoint;

pub use fast::{FastPass, KvSlots};
pub use gpt2::Gpt2Fast;
pub use llama::LlamaFast;

/// What a fast model is loaded from and how: the model of `cfg` from `ck` onto `device`, the
/// projections in `dtype` (bf16 or f32), or quantized to `quant` from their f32 values; norms
/// f32.
#[derive(Clone, Copy)]
pub struct DecoderSource<'a> {
    /// The model's config.
    pub cfg: &'a ModelConfig,
    /// Its opened checkpoint.
    pub ck: &'a Checkpoint,
    /// Where the weights go.
    pub device: Device,
    /// The projections' dtype.
    pub dtype: DType,
    /// The projections' quantization, when quantized.
    pub quant: Option<QuantKind>,
}

impl DecoderSource<'_> {
    /// The checkpoint's tensor `name` on the device, as stored (f32).
    pub(crate) fn f32(&self, name: &str) -> Result<Tensor, ModelError> {
        crate::layers::load(self.ck, name, self.device)
    }

    /// The checkpoint's tensor `name` on the device, in the projections' dtype.
    pub(crate) fn in_dtype(&self, name: &str) -> Result<Tensor, ModelError> {
        Ok(self.f32(name)?.to_dtype(self.dtype)?)
    }
}

/// A decoder-only model as the fast engine runs it (see the module doc).
pub trait DecoderModel: Send + Sync {
    /// The model `src` describes (see [`DecoderSource`]).
    fn load(src: DecoderSource<'_>) -> Result<Self, ModelError>
    where
        Self: Sized;

    /// The config it was loaded from.
    fn config(&self) -> &ModelConfig;

    /// The dtype of its projections and activations (the cache's dtype).
    fn dtype(&self) -> DType;

    /// The logits of the pass's tokens, written into its cache ([`FastPass`]): `[b, t, vocab]`,
    /// or `[b, 1, vocab]` of the last position when `pass.last_only`.
    fn forward(&self, pass: &FastPass<'_>) -> Result<Tensor, ModelError>;

    /// Bytes of the weights one decode step reads: every matrix once (the head too, tied or
    /// not); the embeddings' one row per token are left out.
    fn bytes_per_step(&self) -> usize;

    /// Whether tokens carry learned positions (a pass then needs [`FastPass::pos`]).
    fn learned_positions(&self) -> bool;
}

/// The fast model of `src.cfg`'s architecture (see [`DecoderModel::load`]).
pub fn load_decoder(src: DecoderSource<'_>) -> Result<Box<dyn DecoderModel>, ModelError> {
    Ok(match src.cfg.architecture {
        Architecture::Gpt2 => Box::new(Gpt2Fast::load(src)?),
        Architecture::Llama | Architecture::Qwen2 | Architecture::Mistral => {
            Box::new(LlamaFast::load(src)?)
        }
    })
}

/// A decoder-only model as the f32 reference runs it.
/// `layer(prefix)` for each of the model's layers, `prefix` its checkpoint name (`{stem}.{i}`).
pub(crate) fn load_layers<T>(
    cfg: &ModelConfig,
    stem: &str,
    layer: impl Fn(&str) -> Result<T, ModelError>,
) -> Result<Vec<T>, ModelError> {
    (0..cfg.num_layers)
        .map(|i| layer(&format!("{stem}.{i}")))
        .collect()
}

/// The output head: the embedding when `tied`, else the checkpoint's `lm_head`.
pub(crate) fn lm_head(
    ck: &Checkpoint,
    embed: &Tensor,
    tied: bool,
    dev: Device,
) -> Result<Linear, ModelError> {
    if tied {
        Ok(Linear::tied(embed.clone()))
    } else {
        Linear::torch(ck, "lm_head", false, dev)
    }
}

/// One forward pass of a [`ReferenceModel`]: what it reads and the caches it extends.
pub(crate) struct RefPass<'a> {
    /// Token ids, u32 `[b, t]`.
    pub ids: &'a Tensor,
    /// Where the tokens stand (after `slots.start` cached ones, each row's padding).
    pub slots: &'a Slots<'a>,
    /// One cache per layer, holding `slots.start` slots; the pass extends them.
    pub caches: &'a mut [LayerCache],
}

pub(crate) trait ReferenceModel: Send + Sync {
    /// Logits `[b, t, vocab]` of `pass.ids` in `pass.slots`, with `pass.caches` extended.
    fn forward(&self, pass: RefPass<'_>) -> Result<Tensor, ModelError>;

    /// The projections of every layer (not the embeddings or the head).
    fn linears_mut(&mut self) -> Vec<&mut Linear>;
}

/// The reference model of `cfg`'s architecture, f32 on `device`.
pub(crate) fn load_reference(
    cfg: &ModelConfig,
    ck: &Checkpoint,
    device: Device,
) -> Result<Box<dyn ReferenceModel>, ModelError> {
    Ok(match cfg.architecture {
        Architecture::Gpt2 => Box::new(gpt2::Gpt2Reference::load(cfg, ck, device)?),
        Architecture::Llama | Architecture::Qwen2 | Architecture::Mistral => {
            Box::new(llama::LlamaReference::load(cfg, ck, device)?)
        }
    })
}
