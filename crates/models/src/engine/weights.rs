//! The engine's weights: a Llama-family checkpoint with each layer's q/k/v projections fused
//! into one matrix and gate/up into another (one GEMM each), stored in the engine's dtype
//! (bf16 or f32); norms stay f32.

use tensor_ops::{DType, Device, Tensor};

use crate::config::{Architecture, ModelConfig};
use crate::error::ModelError;
use crate::layers::{inv_freq, load};
use crate::weights::Checkpoint;

pub(crate) struct LayerWeights {
    pub input_norm: Tensor,
    /// `[(heads + 2·kv_heads)·d, hidden]`.
    pub qkv: Tensor,
    /// `[(heads + 2·kv_heads)·d]` (Qwen2), in the engine's dtype.
    pub qkv_bias: Option<Tensor>,
    pub o: Tensor,
    pub post_norm: Tensor,
    /// `[2·intermediate, hidden]`: gate rows, then up rows.
    pub gate_up: Tensor,
    pub down: Tensor,
}

pub(crate) struct Weights {
    /// f32 `[vocab, hidden]` (the embedding lookup reads f32 tables; one row per token).
    pub embed: Tensor,
    pub layers: Vec<LayerWeights>,
    pub norm: Tensor,
    /// The head `[vocab, hidden]`: the embedding itself when tied.
    pub head: Tensor,
    /// f32 `[d/2]`, Llama 3's scaling applied.
    pub inv_freq: Tensor,
}

impl Weights {
    pub(crate) fn load(
        cfg: &ModelConfig,
        ck: &Checkpoint,
        dev: Device,
        dtype: DType,
    ) -> Result<Self, ModelError> {
        if cfg.architecture == Architecture::Gpt2 {
            return Err(ModelError::Unsupported(
                "the engine runs the Llama family (Llama, Qwen2, Mistral); GPT-2 runs on CausalLm"
                    .into(),
            ));
        }
        let w = |name: &str| -> Result<Tensor, ModelError> {
            Ok(load(ck, name, dev)?.to_dtype(dtype)?)
        };
        let f32_of = |name: &str| load(ck, name, dev);
        let layers = (0..cfg.num_layers)
            .map(|i| {
                let p = format!("model.layers.{i}");
                let a = format!("{p}.self_attn");
                let (q, k, v) = (
                    w(&format!("{a}.q_proj.weight"))?,
                    w(&format!("{a}.k_proj.weight"))?,
                    w(&format!("{a}.v_proj.weight"))?,
                );
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
                let (gate, up) = (
                    w(&format!("{p}.mlp.gate_proj.weight"))?,
                    w(&format!("{p}.mlp.up_proj.weight"))?,
                );
                Ok(LayerWeights {
                    input_norm: f32_of(&format!("{p}.input_layernorm.weight"))?,
                    qkv: Tensor::cat(&[&q, &k, &v], 0)?,
                    qkv_bias,
                    o: w(&format!("{a}.o_proj.weight"))?,
                    post_norm: f32_of(&format!("{p}.post_attention_layernorm.weight"))?,
                    gate_up: Tensor::cat(&[&gate, &up], 0)?,
                    down: w(&format!("{p}.mlp.down_proj.weight"))?,
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
        Ok(Weights {
            embed,
            layers,
            norm: f32_of("model.norm.weight")?,
            head,
            inv_freq: Tensor::from_vec(freqs.clone(), &[freqs.len()], dev)?,
        })
    }

    /// Bytes of the weights one decode step reads: every matrix once (the head too, tied or
    /// not); the embedding's one row per token is left out.
    pub(crate) fn bytes_per_step(&self) -> usize {
        let b = |t: &Tensor| t.numel() * t.dtype().size_in_bytes();
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                b(&l.input_norm)
                    + b(&l.qkv)
                    + l.qkv_bias.as_ref().map_or(0, b)
                    + b(&l.o)
                    + b(&l.post_norm)
                    + b(&l.gate_up)
                    + b(&l.down)
            })
            .sum();
        layers + b(&self.norm) + b(&self.head)
    }
}
