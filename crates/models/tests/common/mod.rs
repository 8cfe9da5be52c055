//! Tiny Hugging Face model directories written with the `safetensors` serializer.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;

use models::{expected_tensors, ModelConfig};
use safetensors::tensor::TensorView;
use safetensors::Dtype;

/// One tensor to write: name, dtype, shape, little-endian bytes.
pub struct Raw {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

pub const LLAMA_GQA: &str = r#"{
  "architectures": ["LlamaForCausalLM"], "vocab_size": 32, "hidden_size": 16,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "intermediate_size": 24, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
  "max_position_embeddings": 64, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
}"#;

pub const QWEN2: &str = r#"{
  "architectures": ["Qwen2ForCausalLM"], "vocab_size": 40, "hidden_size": 8,
  "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
  "intermediate_size": 12, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
  "max_position_embeddings": 32, "tie_word_embeddings": true, "torch_dtype": "bfloat16"
}"#;

pub const MISTRAL: &str = r#"{
  "architectures": ["MistralForCausalLM"], "vocab_size": 32, "hidden_size": 16,
  "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 1,
  "intermediate_size": 32, "rms_norm_eps": 1e-5, "max_position_embeddings": 128,
  "rope_theta": 10000.0, "torch_dtype": "bfloat16", "sliding_window": 4096
}"#;

/// [`MISTRAL`] without a sliding window.
pub const MISTRAL_FULL: &str = r#"{
  "architectures": ["MistralForCausalLM"], "vocab_size": 32, "hidden_size": 16,
  "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 1,
  "intermediate_size": 32, "rms_norm_eps": 1e-5, "max_position_embeddings": 128,
  "rope_theta": 10000.0, "torch_dtype": "bfloat16", "sliding_window": null
}"#;

pub const GPT2: &str = r#"{
  "architectures": ["GPT2LMHeadModel"], "vocab_size": 20, "n_embd": 8, "n_layer": 2,
  "n_head": 2, "n_positions": 16, "layer_norm_epsilon": 1e-5, "torch_dtype": "float32"
}"#;

/// Deterministic values for tensor `k`, element `i`.
pub fn value(k: usize, i: usize) -> f32 {
    ((k * 31 + i) % 17) as f32 * 0.25 - 2.0
}

pub fn encode(values: &[f32], dtype: Dtype) -> Vec<u8> {
    match dtype {
        Dtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Dtype::F16 => values
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect(),
        Dtype::BF16 => values
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect(),
        other => panic!("test helper does not encode {other:?}"),
    }
}

/// The tensors `cfg` implies, filled with `value`, in `dtype`.
pub fn tensors_for(cfg: &ModelConfig, dtype: Dtype) -> Vec<Raw> {
    expected_tensors(cfg)
        .into_iter()
        .enumerate()
        .map(|(k, e)| {
            let n: usize = e.shape.iter().product();
            let vals: Vec<f32> = (0..n).map(|i| value(k, i)).collect();
            Raw {
                name: e.name,
                dtype,
                shape: e.shape,
                bytes: encode(&vals, dtype),
            }
        })
        .collect()
}

pub fn serialize(tensors: &[Raw]) -> Vec<u8> {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|t| {
            let view = TensorView::new(t.dtype, t.shape.clone(), &t.bytes).expect("valid view");
            (t.name.clone(), view)
        })
        .collect();
    safetensors::serialize(views, &None).expect("serialize")
}

pub fn write_config(dir: &Path, json: &str) -> ModelConfig {
    std::fs::write(dir.join("config.json"), json).unwrap();
    ModelConfig::from_json_str(json).expect("test config parses")
}

/// A model directory with one `model.safetensors`.
pub fn write_single(dir: &Path, json: &str, dtype: Dtype) -> ModelConfig {
    let cfg = write_config(dir, json);
    let bytes = serialize(&tensors_for(&cfg, dtype));
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
    cfg
}

/// A model directory with `shards` shard files and `model.safetensors.index.json`.
pub fn write_sharded(dir: &Path, json: &str, dtype: Dtype, shards: usize) -> ModelConfig {
    let cfg = write_config(dir, json);
    let tensors = tensors_for(&cfg, dtype);
    let per = tensors.len().div_ceil(shards);
    let mut map = BTreeMap::new();
    for (s, chunk) in tensors.chunks(per).enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", s + 1, shards);
        for t in chunk {
            map.insert(t.name.clone(), file.clone());
        }
        std::fs::write(dir.join(&file), serialize(chunk)).unwrap();
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    cfg
}
