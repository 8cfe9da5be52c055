//! The Llama family's reference forward, what [`crate::CausalLm`] runs: RMSNorm, rotary
//! positions (with Llama 3's frequency scaling) from host-made tables, grouped-query attention
//! with optional q/k/v biases against a growing cache, a SwiGLU MLP, and a tied or separate
//! head. Weights in `transformers`' names; arithmetic in f32.

use tensor_ops::{Device, Tensor};

use crate::arch::{lm_head, load_layers, RefPass, ReferenceModel};
use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::layers::{
    apply_rope, cached_attention, heads, inv_freq, load, rope_tables, Linear, Masks,
};
use crate::weights::Checkpoint;

struct Layer {
    input_norm: Tensor,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    post_norm: Tensor,
    gate: Linear,
    up: Linear,
    down: Linear,
}

/// A Llama-family model as the f32 reference runs it.
pub(crate) struct LlamaReference {
    cfg: ModelConfig,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    head: Linear,
    freqs: Vec<f32>,
}

impl LlamaReference {
    pub(crate) fn load(
        cfg: &ModelConfig,
        ck: &Checkpoint,
        dev: Device,
    ) -> Result<Self, ModelError> {
        let layers = load_layers(cfg, "model.layers", |p| {
            let lin = |name: &str, bias: bool| Linear::torch(ck, &format!("{p}.{name}"), bias, dev);
            Ok(Layer {
                input_norm: load(ck, &format!("{p}.input_layernorm.weight"), dev)?,
                q: lin("self_attn.q_proj", cfg.attention_bias)?,
                k: lin("self_attn.k_proj", cfg.attention_bias)?,
                v: lin("self_attn.v_proj", cfg.attention_bias)?,
                o: lin("self_attn.o_proj", false)?,
                post_norm: load(ck, &format!("{p}.post_attention_layernorm.weight"), dev)?,
                gate: lin("mlp.gate_proj", false)?,
                up: lin("mlp.up_proj", false)?,
                down: lin("mlp.down_proj", false)?,
            })
        })?;
        let embed = load(ck, "model.embed_tokens.weight", dev)?;
        let head = lm_head(ck, &embed, cfg.tie_word_embeddings, dev)?;
        Ok(LlamaReference {
            cfg: cfg.clone(),
            embed,
            layers,
            norm: load(ck, "model.norm.weight", dev)?,
            head,
            freqs: inv_freq(cfg, cfg.rope_theta.unwrap_or(10_000.0)),
        })
    }
}

impl ReferenceModel for LlamaReference {
    /// Logits `[b, t, vocab]` of `pass.ids` in `pass.slots`, with `pass.caches` extended.
    fn forward(&self, pass: RefPass<'_>) -> Result<Tensor, ModelError> {
        let RefPass { ids, slots, caches } = pass;
        let cfg = &self.cfg;
        let (b, t) = (ids.shape()[0], ids.shape()[1]);
        let eps = cfg.norm_eps as f32;
        let dev = ids.device();
        let (cos, sin) = rope_tables(&self.freqs, &slots.positions(), (b, t), dev)?;
        let mut masks = Masks::new(slots, dev);
        let mut x = self.embed.embedding(ids)?;
        for (i, (l, cache)) in self.layers.iter().zip(caches).enumerate() {
            let a = x.rms_norm(&l.input_norm, eps)?;
            let q = apply_rope(&heads(&l.q.forward(&a)?, cfg.num_heads)?, &cos, &sin)?;
            let k = apply_rope(&heads(&l.k.forward(&a)?, cfg.num_kv_heads)?, &cos, &sin)?;
            let v = heads(&l.v.forward(&a)?, cfg.num_kv_heads)?;
            let mask = masks.get(cfg.layer_windows.get(i))?;
            let y = cached_attention(&q, &k, &v, cache, &mask, cfg.attention_scale(i))?;
            x = x.add(&l.o.forward(&y)?)?;
            let m = x.rms_norm(&l.post_norm, eps)?;
            let g = l.gate.forward(&m)?.silu()?.mul(&l.up.forward(&m)?)?;
            x = x.add(&l.down.forward(&g)?)?;
        }
        self.head.forward(&x.rms_norm(&self.norm, eps)?)
    }

    /// The projections of every layer (not the embedding or the head).
    fn linears_mut(&mut self) -> Vec<&mut Linear> {
        self.layers
            .iter_mut()
            .flat_map(|l| {
                [
                    &mut l.q,
                    &mut l.k,
                    &mut l.v,
                    &mut l.o,
                    &mut l.gate,
                    &mut l.up,
                    &mut l.down,
                ]
            })
            .collect()
    }
}
