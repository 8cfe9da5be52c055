//! The engine's weights: a Llama-family checkpoint with each layer's q/k/v projections fused
//! into one matrix and gate/up into another (one GEMM each), or a GPT-2 one (`super::gpt2`),
//! stored in the engine's dtype (bf16 or f32), or quantized to int8/int4 at load
//! (`models::quant`, from the f32 values; the head and the embedding stay in the engine's dtype
//! and f32); norms stay f32.

use tensor_ops::{DType, Device, QuantWeight, Tensor};

use super::gpt2::Gpt2Weights;
use crate::config::{Architecture, ModelConfig};
use crate::error::ModelError;
use crate::layers::{inv_freq, load};
use crate::quant::{QuantKind, Quantized};
use crate::weights::Checkpoint;

/// A projection's weight `[out, in]`: dense in the engine's dtype, or quantized.
pub(crate) enum Proj {
    Dense(Tensor),
    Quant(QuantWeight),
}

impl Proj {
    /// The projection of `m`, an f32 matrix `[out, in]` on the host: in `dtype` on `dev`, or
    /// quantized to `quant` from its f32 values.
    pub(crate) fn from_host(
        m: &Tensor,
        dev: Device,
        dtype: DType,
        quant: Option<QuantKind>,
    ) -> Result<Proj, ModelError> {
        let &[rows, cols] = m.shape() else {
            return Err(ModelError::Unsupported(format!(
                "a projection of shape {:?} (not a matrix)",
                m.shape()
            )));
        };
        Ok(match quant {
            None => Proj::Dense(m.to(dev)?.to_dtype(dtype)?),
            Some(kind) => {
                let q = Quantized::new(kind, &m.to_vec()?, rows, cols)?;
                Proj::Quant(q.to_device(dev)?)
            }
        })
    }

    /// `x · Wᵀ` in x's dtype.
    pub(crate) fn apply(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        Ok(match self {
            Proj::Dense(w) => x.matmul_t(w, false, true)?,
            Proj::Quant(q) => x.matmul_quant(q)?,
        })
    }

    /// Bytes a product reads of it.
    pub(crate) fn bytes(&self) -> usize {
        let b = |t: &Tensor| t.numel() * t.dtype().size_in_bytes();
        match self {
            Proj::Dense(w) => b(w),
            Proj::Quant(q) => q.parts().iter().map(|t| b(t)).sum(),
        }
    }
}

pub(crate) struct LayerWeights {
    pub input_norm: Tensor,
    /// `[(heads + 2·kv_heads)·d, hidden]`.
    pub qkv: Proj,
    /// `[(heads + 2·kv_heads)·d]` (Qwen2), in the engine's dtype.
    pub qkv_bias: Option<Tensor>,
    pub o: Proj,
    pub post_norm: Tensor,
    /// `[2·intermediate, hidden]`: gate rows, then up rows.
    pub gate_up: Proj,
    pub down: Proj,
}

/// The weights of the engine's model, by family.
pub(crate) enum Weights {
    Llama(LlamaWeights),
    Gpt2(Gpt2Weights),
}

impl Weights {
    pub(crate) fn load(
        cfg: &ModelConfig,
        ck: &Checkpoint,
        dev: Device,
        dtype: DType,
        quant: Option<QuantKind>,
    ) -> Result<Self, ModelError> {
        Ok(match cfg.architecture {
            Architecture::Gpt2 => Weights::Gpt2(Gpt2Weights::load(cfg, ck, dev, dtype, quant)?),
            _ => Weights::Llama(LlamaWeights::load(cfg, ck, dev, dtype, quant)?),
        })
    }

    /// Whether tokens carry learned positions (a pass needs each token's position).
    pub(crate) fn learned_positions(&self) -> bool {
        matches!(self, Weights::Gpt2(_))
    }

    /// Bytes of the weights one decode step reads: every matrix once (the head too, tied or
    /// not); the embeddings' one row per token are left out.
    pub(crate) fn bytes_per_step(&self) -> usize {
        match self {
            Weights::Llama(w) => w.bytes_per_step(),
            Weights::Gpt2(w) => w.bytes_per_step(),
        }
    }
}

/// Bytes of a tensor's elements.
pub(crate) fn bytes(t: &Tensor) -> usize {
    t.numel() * t.dtype().size_in_bytes()
}

pub(crate) struct LlamaWeights {
    /// f32 `[vocab, hidden]` (the embedding lookup reads f32 tables; one row per token).
    pub embed: Tensor,
    pub layers: Vec<LayerWeights>,
    pub norm: Tensor,
    /// The head `[vocab, hidden]`: the embedding itself when tied.
    pub head: Tensor,
    /// f32 `[d/2]`, Llama 3's scaling applied.
    pub inv_freq: Tensor,
}

impl LlamaWeights {
    fn load(
        cfg: &ModelConfig,
        ck: &Checkpoint,
        dev: Device,
        dtype: DType,
        quant: Option<QuantKind>,
    ) -> Result<Self, ModelError> {
        let w = |name: &str| -> Result<Tensor, ModelError> {
            Ok(load(ck, name, dev)?.to_dtype(dtype)?)
        };
        let f32_of = |name: &str| load(ck, name, dev);
        // The tensors of `names` stacked by rows: in the engine's dtype, or quantized from
        // their f32 values on the host.
        let proj = |names: &[String]| -> Result<Proj, ModelError> {
            let Some(kind) = quant else {
                let parts = names.iter().map(|n| w(n)).collect::<Result<Vec<_>, _>>()?;
                let refs: Vec<&Tensor> = parts.iter().collect();
                return Ok(Proj::Dense(Tensor::cat(&refs, 0)?));
            };
            let parts = names
                .iter()
                .map(|n| load(ck, n, Device::Cpu))
                .collect::<Result<Vec<_>, _>>()?;
            let refs: Vec<&Tensor> = parts.iter().collect();
            Proj::from_host(&Tensor::cat(&refs, 0)?, dev, dtype, Some(kind))
        };
        let layers = (0..cfg.num_layers)
            .map(|i| {
                let p = format!("model.layers.{i}");
                let a = format!("{p}.self_attn");
                let qkv_bias = if cfg.attention_bias {
                    let (bq, bk, bv) = (
                        w(&format!("{a}.q_proj.bias"))?,
                        w(&format!("{a}.k_proj.bias"))?,
                        w(&format!("{a}.v_proj.bias"))?,
                    );
                    Some(Tensor::cat(&[&bq, &bk, &bv], 0)?)
                } else {
                    None
                };
                let names = |parts: &[&str]| -> Vec<String> {
                    parts.iter().map(|n| format!("{p}.{n}.weight")).collect()
                };
                Ok(LayerWeights {
                    input_norm: f32_of(&format!("{p}.input_layernorm.weight"))?,
                    qkv: proj(&names(&[
                        "self_attn.q_proj",
                        "self_attn.k_proj",
                        "self_attn.v_proj",
                    ]))?,
                    qkv_bias,
                    o: proj(&names(&["self_attn.o_proj"]))?,
                    post_norm: f32_of(&format!("{p}.post_attention_layernorm.weight"))?,
                    gate_up: proj(&names(&["mlp.gate_proj", "mlp.up_proj"]))?,
                    down: proj(&names(&["mlp.down_proj"]))?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let embed = f32_of("model.embed_tokens.weight")?;
        let head = if cfg.tie_word_embeddings {
            embed.to_dtype(dtype)?
        } else {
            w("lm_head.weight")?
        };
        let freqs = inv_freq(cfg, cfg.rope_theta.unwrap_or(10_000.0));
        Ok(LlamaWeights {
            embed,
            layers,
            norm: f32_of("model.norm.weight")?,
            head,
            inv_freq: Tensor::from_vec(freqs.clone(), &[freqs.len()], dev)?,
        })
    }

    fn bytes_per_step(&self) -> usize {
        let b = bytes;
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                b(&l.input_norm)
                    + l.qkv.bytes()
                    + l.qkv_bias.as_ref().map_or(0, b)
                    + l.o.bytes()
                    + b(&l.post_norm)
                    + l.gate_up.bytes()
                    + l.down.bytes()
            })
            .sum();
        layers + b(&self.norm) + b(&self.head)
    }
}
