//! The Llama family in the fast engine: each layer's q/k/v projections fused into one matrix
//! (with Qwen2's biases) and gate/up into another (one GEMM each), stored in the engine's dtype
//! (bf16 or f32), or quantized to int8/int4 at load (`models::quant`, from the f32 values; the
//! head and the embedding stay in the engine's dtype and f32); norms stay f32. The forward
//! fuses each residual add with the next RMSNorm, and rotates q and k while it appends k and v
//! to the cache (`rope_append`).

use tensor_ops::{DType, Device, Tensor};

use crate::arch::fast::{bytes, FastPass, Proj};
use crate::arch::{DecoderModel, DecoderSource};
use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::layers::{inv_freq, load};

struct LayerWeights {
    input_norm: Tensor,
    /// `[(heads + 2·kv_heads)·d, hidden]`.
    qkv: Proj,
    /// `[(heads + 2·kv_heads)·d]` (Qwen2), in the engine's dtype.
    qkv_bias: Option<Tensor>,
    o: Proj,
    post_norm: Tensor,
    /// `[2·intermediate, hidden]`: gate rows, then up rows.
    gate_up: Proj,
    down: Proj,
}

/// A Llama-family model (Llama 2 and 3, Qwen2, Mistral) as the fast engine runs it.
pub struct LlamaFast {
    cfg: ModelConfig,
    dtype: DType,
    /// f32 `[vocab, hidden]` (the embedding lookup reads f32 tables; one row per token).
    embed: Tensor,
    layers: Vec<LayerWeights>,
    norm: Tensor,
    /// The head `[vocab, hidden]`: the embedding itself when tied.
    head: Tensor,
    /// f32 `[d/2]`, Llama 3's scaling applied.
    inv_freq: Tensor,
}

impl DecoderModel for LlamaFast {
    fn load(src: DecoderSource<'_>) -> Result<Self, ModelError> {
        let (cfg, dev, dtype) = (src.cfg, src.device, src.dtype);
        let w = |name: &str| src.in_dtype(name);
        let f32_of = |name: &str| src.f32(name);
        // The tensors of `names` stacked by rows: in the engine's dtype, or quantized from
        // their f32 values on the host.
        let proj = |names: &[String]| -> Result<Proj, ModelError> {
            let Some(kind) = src.quant else {
                let parts = names.iter().map(|n| w(n)).collect::<Result<Vec<_>, _>>()?;
                let refs: Vec<&Tensor> = parts.iter().collect();
                return Ok(Proj::Dense(Tensor::cat(&refs, 0)?));
            };
            let parts = names
                .iter()
                .map(|n| load(src.ck, n, Device::Cpu))
                .collect::<Result<Vec<_>, _>>()?;
            let refs: Vec<&Tensor> = parts.iter().collect();
            Proj::from_host(&Tensor::cat(&refs, 0)?, dev, dtype, Some(kind))
        };
        let layers = crate::arch::load_layers(cfg, "model.layers", |p| {
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
        })?;
        let embed = f32_of("model.embed_tokens.weight")?;
        let head = if cfg.tie_word_embeddings {
            embed.to_dtype(dtype)?
        } else {
            w("lm_head.weight")?
        };
        let freqs = inv_freq(cfg, cfg.rope_theta.unwrap_or(10_000.0));
        Ok(LlamaFast {
            cfg: cfg.clone(),
            dtype,
            embed,
            layers,
            norm: f32_of("model.norm.weight")?,
            head,
            inv_freq: Tensor::from_vec(freqs.clone(), &[freqs.len()], dev)?,
        })
    }

    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn dtype(&self) -> DType {
        self.dtype
    }

    fn learned_positions(&self) -> bool {
        false
    }

    fn forward(&self, pass: &FastPass<'_>) -> Result<Tensor, ModelError> {
        let cfg = &self.cfg;
        let (eps, dt) = (cfg.norm_eps as f32, self.dtype);
        let mut x = self.embed.embedding(pass.ids)?;
        // Each block's output waits to be added to the residual stream `x` by the next norm
        // (`add_rms_norm`: the add and the norm in one kernel).
        let mut pending: Option<Tensor> = None;
        for (i, (l, kv)) in self.layers.iter().zip(pass.kv.layers).enumerate() {
            let view = pass.kv.view(kv, cfg.layer_windows.get(i));
            let (sum, a) = x.add_rms_norm(pending.as_ref(), &l.input_norm, eps, dt)?;
            let mut qkv = l.qkv.apply(&a)?;
            if let Some(b) = &l.qkv_bias {
                qkv = qkv.add(b)?;
            }
            let q = qkv.rope_append(&self.inv_freq, view, cfg.num_heads, dt)?;
            let y = pass.attention(&q, view, cfg.attention_scale(i))?;
            let (sum, m) = sum.add_rms_norm(Some(&l.o.apply(&y)?), &l.post_norm, eps, dt)?;
            let g = l.gate_up.apply(&m)?.swiglu_packed()?;
            pending = Some(l.down.apply(&g)?);
            x = sum;
        }
        let t = pass.ids.shape()[1];
        if pass.last_only && t > 1 {
            x = x.narrow(1, t - 1, 1)?;
            pending = pending.map(|p| p.narrow(1, t - 1, 1)).transpose()?;
        }
        let (_, h) = x.add_rms_norm(pending.as_ref(), &self.norm, eps, dt)?;
        Ok(h.matmul_t(&self.head, false, true)?)
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
