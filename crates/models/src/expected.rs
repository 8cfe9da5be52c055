//! The tensor names and shapes a [`ModelConfig`] implies, per architecture, as Hugging Face
//! `transformers` saves them.

use crate::config::{Architecture, ModelConfig};

/// One tensor the checkpoint must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedTensor {
    pub name: String,
    pub shape: Vec<usize>,
}

fn t(name: String, shape: &[usize]) -> ExpectedTensor {
    ExpectedTensor {
        name,
        shape: shape.to_vec(),
    }
}

/// Every tensor the config implies, in a stable order.
pub fn expected_tensors(cfg: &ModelConfig) -> Vec<ExpectedTensor> {
    expected_iter(cfg).collect()
}

/// [`expected_tensors`], one layer's tensors listed at a time: a config claiming 10^9 layers
/// costs nothing until the layers are walked, and a check that stops at the first missing
/// tensor stops there.
pub fn expected_iter(cfg: &ModelConfig) -> impl Iterator<Item = ExpectedTensor> + '_ {
    let (head, layer, tail): (_, fn(&ModelConfig, usize, &mut Vec<ExpectedTensor>), _) =
        match cfg.architecture {
            Architecture::Gpt2 => (gpt2_head(cfg), gpt2_layer, gpt2_tail(cfg)),
            _ => (llama_head(cfg), llama_layer, llama_tail(cfg)),
        };
    let layers = (0..cfg.num_layers).flat_map(move |l| {
        let mut out = Vec::new();
        layer(cfg, l, &mut out);
        out
    });
    head.into_iter().chain(layers).chain(tail)
}

/// Names a loader may find and skip: non-parameter buffers some exporters saved (GPT-2's causal
/// mask `h.N.attn.bias` / `h.N.attn.masked_bias`, old Llama `rotary_emb.inv_freq`).
pub fn is_ignored_buffer(name: &str) -> bool {
    name.ends_with(".attn.bias")
        || name.ends_with(".attn.masked_bias")
        || name.ends_with(".rotary_emb.inv_freq")
}

fn llama_head(cfg: &ModelConfig) -> Vec<ExpectedTensor> {
    let (h, v) = (cfg.hidden_size, cfg.vocab_size);
    vec![t("model.embed_tokens.weight".into(), &[v, h])]
}

fn llama_tail(cfg: &ModelConfig) -> Vec<ExpectedTensor> {
    let (h, v) = (cfg.hidden_size, cfg.vocab_size);
    let mut out = vec![t("model.norm.weight".into(), &[h])];
    if !cfg.tie_word_embeddings {
        out.push(t("lm_head.weight".into(), &[v, h]));
    }
    out
}

fn llama_layer(cfg: &ModelConfig, layer: usize, out: &mut Vec<ExpectedTensor>) {
    let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
    let q = cfg.num_heads * cfg.head_dim;
    let kv = cfg.num_kv_heads * cfg.head_dim;
    let p = format!("model.layers.{layer}");
    for (proj, rows) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
        out.push(t(format!("{p}.self_attn.{proj}.weight"), &[rows, h]));
        if cfg.attention_bias {
            out.push(t(format!("{p}.self_attn.{proj}.bias"), &[rows]));
        }
    }
    out.push(t(format!("{p}.self_attn.o_proj.weight"), &[h, q]));
    out.push(t(format!("{p}.mlp.gate_proj.weight"), &[i, h]));
    out.push(t(format!("{p}.mlp.up_proj.weight"), &[i, h]));
    out.push(t(format!("{p}.mlp.down_proj.weight"), &[h, i]));
    out.push(t(format!("{p}.input_layernorm.weight"), &[h]));
    out.push(t(format!("{p}.post_attention_layernorm.weight"), &[h]));
}

fn gpt2_head(cfg: &ModelConfig) -> Vec<ExpectedTensor> {
    let (h, v) = (cfg.hidden_size, cfg.vocab_size);
    vec![
        t("wte.weight".into(), &[v, h]),
        t("wpe.weight".into(), &[cfg.max_position_embeddings, h]),
    ]
}

fn gpt2_tail(cfg: &ModelConfig) -> Vec<ExpectedTensor> {
    let (h, v) = (cfg.hidden_size, cfg.vocab_size);
    let mut out = vec![t("ln_f.weight".into(), &[h]), t("ln_f.bias".into(), &[h])];
    if !cfg.tie_word_embeddings {
        out.push(t("lm_head.weight".into(), &[v, h]));
    }
    out
}

/// GPT-2 projections are Conv1D: weights are stored `[in, out]`, the transpose of `nn.Linear`.
fn gpt2_layer(cfg: &ModelConfig, layer: usize, out: &mut Vec<ExpectedTensor>) {
    let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
    let p = format!("h.{layer}");
    let mats = [
        ("attn.c_attn", h, 3 * h),
        ("attn.c_proj", h, h),
        ("mlp.c_fc", h, i),
        ("mlp.c_proj", i, h),
    ];
    for (name, inp, outp) in mats {
        out.push(t(format!("{p}.{name}.weight"), &[inp, outp]));
        out.push(t(format!("{p}.{name}.bias"), &[outp]));
    }
    for ln in ["ln_1", "ln_2"] {
        out.push(t(format!("{p}.{ln}.weight"), &[h]));
        out.push(t(format!("{p}.{ln}.bias"), &[h]));
    }
}
