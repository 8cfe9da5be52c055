//! Export of the project's own GPT ([`crate::gpt::Gpt`]) with its char-level tokenizer to a
//! Hugging Face model directory, which `transformers` (`AutoModelForCausalLM`,
//! `PreTrainedTokenizerFast`), [`crate::CausalLm`] and (Llama) [`crate::Engine`] load.
//! [`export_hf`] picks the format of the model's variant: [`export_gpt2`] for the GPT-2
//! variant, [`export_llama`] for the Llama one.
//!
//! GPT-2 variant:
//! - `config.json`: `GPT2LMHeadModel` with the model's sizes, `n_inner` = the MLP width,
//!   `layer_norm_epsilon` = [`crate::gpt::NORM_EPS`], the exact (erf) GELU (`"gelu"`, the
//!   project's `Tensor::gelu`), the head tied to `wte` (as the project's is), no BOS/EOS ids;
//! - `model.safetensors` (f32): the parameters under `transformers`' names (nanoGPT's names are
//!   the same); the projections transposed from the project's `[out, in]` to Conv1D's
//!   `[in, out]`; zero biases where the model has none (`bias: false`), which is the same
//!   function, since GPT-2 always has them.
//!
//! Llama variant (RMSNorm, RoPE, SwiGLU, separate head, no biases):
//! - `config.json`: `LlamaForCausalLM`, `num_key_value_heads` = `num_attention_heads` (the
//!   project's attention has as many key/value heads as query heads), `head_dim` = width /
//!   heads, `intermediate_size` = [`crate::gpt::GptConfig::mlp_hidden`], `hidden_act` `silu`,
//!   `rms_norm_eps` = [`crate::gpt::NORM_EPS`] (the project's RMSNorm is `x / sqrt(mean(x²) +
//!   eps) · weight`, as HF's), `rope_theta` = [`LLAMA_ROPE_THETA`] with no scaling,
//!   `max_position_embeddings` = the block size, no biases (`attention_bias`, `mlp_bias`
//!   false), the head untied, no BOS/EOS ids;
//! - `model.safetensors` (f32), `[out, in]` as the project stores them: `c_attn`'s rows split
//!   into `q_proj`, `k_proj`, `v_proj` (in that order), `c_proj` → `o_proj`, `w1` →
//!   `gate_proj` (SwiGLU's `silu(w1·x) ∘ w3·x`), `w3` → `up_proj`, `w2` → `down_proj`,
//!   `attention_norm` → `input_layernorm`, `ffn_norm` → `post_attention_layernorm`, `ln_f` →
//!   `model.norm`, `wte` → `model.embed_tokens`, `lm_head` as is. No row permutation: the
//!   project's `Tensor::rope` pairs element `i` with `i + d/2` of a head (rotate-half, angle
//!   `pos · θ^(-2i/d)`), which is HF Llama's layout (the interleaved layout of Meta's
//!   checkpoints is the one HF's convert script permutes).
//!
//! Both:
//! - `tokenizer.json`: a BPE model over the characters with no merges (so every character is
//!   one token, the project's id), no normalizer or pre-tokenizer, and a `Fuse` decoder (tokens
//!   concatenated). Its `unk_token` is `<unk>`, which is not in the vocabulary: encoding a
//!   character outside the vocabulary is then an error in `tokenizers` (Rust and Python:
//!   "Unk token `<unk>` not found in the vocabulary"), so [`crate::Tokenizer::encode`] returns
//!   [`crate::TokenizerError::Encode`] instead of silently dropping the character;
//! - `tokenizer_config.json`: `PreTrainedTokenizerFast`, no clean-up of spaces in decoding, the
//!   context as `model_max_length`.
//!
//! The files are written into a fresh hidden directory beside the target and renamed onto it
//! at the end, so a failed export leaves no partial directory.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::gpt::{CharTokenizer, Gpt, Variant, NORM_EPS};
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde_json::{json, Value};
use tensor_ops::Tensor;
use thiserror::Error;

use crate::config::{Gpt2Activation, ModelConfig};
use crate::error::ModelError;
use crate::expected::expected_tensors;

/// The unknown-token name of the exported tokenizer: deliberately not in the vocabulary.
const UNK: &str = "<unk>";

/// Why an export was refused; a refused or failed export leaves the file system as it was.
#[derive(Debug, Error)]
pub enum ExportError {
    /// The variant given to the other variant's export ([`export_hf`] picks the right one).
    #[error("a {0:?}-variant model does not export to this format (export_hf picks its own)")]
    UnsupportedVariant(Variant),
    #[error("the tokenizer has {tokenizer} characters but the model's vocabulary is {model}")]
    VocabMismatch { model: usize, tokenizer: usize },
    #[error("{0} exists and is not empty; refusing to overwrite it")]
    DirNotEmpty(PathBuf),
    #[error("{0} exists and is not a directory")]
    NotADirectory(PathBuf),
    #[error("{0} does not name a directory to create")]
    BadTarget(PathBuf),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the model has no parameter `{0}`")]
    MissingParameter(String),
    #[error("parameter `{name}` has shape {found:?}, expected {expected:?}")]
    WrongShape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("parameter `{0}` has no place in the exported checkpoint")]
    UnmappedParameter(String),
    #[error("the tokenizer's characters are not distinct")]
    DuplicateCharacter,
    #[error("cannot serialize {what}: {reason}")]
    Serialize { what: &'static str, reason: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ExportError + '_ {
    move |source| ExportError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The rotary base of the Llama variant: what `gpt::blocks` passes to `Tensor::rope`.
pub const LLAMA_ROPE_THETA: f32 = 10_000.0;

/// Writes `model` and `tokenizer` as a Hugging Face model directory `dir` in its variant's
/// format: [`export_gpt2`] or [`export_llama`].
pub fn export_hf(model: &Gpt, tokenizer: &CharTokenizer, dir: &Path) -> Result<(), ModelError> {
    match model.config.variant {
        Variant::Gpt2 => export_gpt2(model, tokenizer, dir),
        Variant::Llama => export_llama(model, tokenizer, dir),
    }
}

/// Writes `model` (GPT-2 variant) and `tokenizer` as a Hugging Face GPT-2 model directory
/// `dir` (see the module docs). `dir` must not exist or be an empty directory, and its parent
/// must exist. A Llama-variant model, a tokenizer of another vocabulary size and a non-empty
/// target are refused with an [`ExportError`] before anything is written.
pub fn export_gpt2(model: &Gpt, tokenizer: &CharTokenizer, dir: &Path) -> Result<(), ModelError> {
    export_as(
        model,
        tokenizer,
        dir,
        Variant::Gpt2,
        gpt2_config_json,
        gpt2_tensors,
    )
}

/// Writes `model` (Llama variant) and `tokenizer` as a Hugging Face `LlamaForCausalLM`
/// directory `dir` (see the module docs), with the refusals of [`export_gpt2`] (a GPT-2-variant
/// model among them).
pub fn export_llama(model: &Gpt, tokenizer: &CharTokenizer, dir: &Path) -> Result<(), ModelError> {
    export_as(
        model,
        tokenizer,
        dir,
        Variant::Llama,
        llama_config_json,
        llama_tensors,
    )
}

/// The export of a `variant` model: its `config.json` from `config`, the tensors that config
/// implies from `tensors`, the tokenizer's files.
fn export_as(
    model: &Gpt,
    tokenizer: &CharTokenizer,
    dir: &Path,
    variant: Variant,
    config: fn(&Gpt) -> Value,
    tensors: fn(&Gpt, &ModelConfig) -> Result<Vec<Named>, ModelError>,
) -> Result<(), ModelError> {
    let cfg = &model.config;
    if cfg.variant != variant {
        return Err(ExportError::UnsupportedVariant(cfg.variant).into());
    }
    if tokenizer.vocab_size() != cfg.vocab_size {
        return Err(ExportError::VocabMismatch {
            model: cfg.vocab_size,
            tokenizer: tokenizer.vocab_size(),
        }
        .into());
    }
    check_target(dir)?;
    let config = config(model);
    // Our own parser reads the config back: the tensors it implies are the ones written.
    let hf = ModelConfig::from_json_str(&config.to_string())?;
    let tensors = tensors(model, &hf)?;
    let views = tensors
        .iter()
        .map(|(name, shape, bytes)| {
            TensorView::new(Dtype::F32, shape.clone(), bytes).map(|v| (name.as_str(), v))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| serialize_error("model.safetensors", e))?;
    let metadata = Some(HashMap::from([("format".to_string(), "pt".to_string())]));
    let weights = safetensors::serialize(views, &metadata)
        .map_err(|e| serialize_error("model.safetensors", e))?;
    let files = [
        ("config.json", pretty(&config)?),
        ("tokenizer.json", pretty(&tokenizer_json(tokenizer)?)?),
        (
            "tokenizer_config.json",
            pretty(&tokenizer_config_json(model))?,
        ),
        ("model.safetensors", weights),
    ];
    write_atomically(dir, &files)?;
    Ok(())
}

fn serialize_error(what: &'static str, e: impl std::fmt::Debug) -> ExportError {
    ExportError::Serialize {
        what,
        reason: format!("{e:?}"),
    }
}

fn pretty(value: &Value) -> Result<Vec<u8>, ExportError> {
    serde_json::to_vec_pretty(value).map_err(|e| serialize_error("JSON", e))
}

/// An f32 as the f64 of its shortest decimal form (`1e-5f32` → `1e-5`, not `9.99999974e-6`),
/// which reads back as the same f32.
fn short_f64(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(f64::from(x))
}

/// `config.json` of the model (GPT-2 names; dropout as the project applies it: on the
/// embeddings and on the attention and MLP outputs, none on the attention weights).
fn gpt2_config_json(model: &Gpt) -> Value {
    let cfg = &model.config;
    let dropout = short_f64(cfg.dropout);
    json!({
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.block_size,
        "n_embd": cfg.n_embd,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_inner": cfg.mlp_hidden(),
        "activation_function": Gpt2Activation::GeluErf.name(),
        "layer_norm_epsilon": short_f64(NORM_EPS),
        "embd_pdrop": dropout,
        "resid_pdrop": dropout,
        "attn_pdrop": 0.0,
        "initializer_range": 0.02,
        "scale_attn_weights": true,
        "scale_attn_by_inverse_layer_idx": false,
        "reorder_and_upcast_attn": false,
        "tie_word_embeddings": true,
        "bos_token_id": null,
        "eos_token_id": null,
        "use_cache": true,
        "dtype": "float32",
    })
}

/// A tensor to write: name, shape, f32 little-endian bytes.
type Named = (String, Vec<usize>, Vec<u8>);

/// Whether canonical GPT-2 tensor `name` is a Conv1D weight (stored `[in, out]`).
fn is_conv1d_weight(name: &str) -> bool {
    ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]
        .iter()
        .any(|p| name.starts_with("h.") && name.ends_with(&format!(".{p}.weight")))
}

/// The model's parameters by name.
fn params_by_name(model: &Gpt) -> HashMap<String, Tensor> {
    model
        .parameters()
        .into_iter()
        .map(|(name, t, _)| (name, t))
        .collect()
}

/// Every tensor `hf` implies, under its `transformer.`-prefixed name, as f32 little-endian
/// bytes from the model's parameter of the same name (transposed for Conv1D weights; zeros for
/// a bias the model has none of). Every parameter must be used exactly once.
fn gpt2_tensors(model: &Gpt, hf: &ModelConfig) -> Result<Vec<Named>, ModelError> {
    let params = params_by_name(model);
    let mut used = HashSet::new();
    let mut out = Vec::new();
    for e in expected_tensors(hf) {
        let name = format!("transformer.{}", e.name);
        let conv1d = is_conv1d_weight(&e.name);
        let values = match params.get(&name) {
            Some(t) => {
                let want = if conv1d {
                    vec![e.shape[1], e.shape[0]]
                } else {
                    e.shape.clone()
                };
                if t.shape() != want.as_slice() {
                    return Err(ExportError::WrongShape {
                        name,
                        expected: want,
                        found: t.shape().to_vec(),
                    }
                    .into());
                }
                used.insert(name.clone());
                let v = t.to_vec()?;
                if conv1d {
                    transpose(&v, want[0], want[1])
                } else {
                    v
                }
            }
            None if !model.config.bias && e.name.ends_with(".bias") => {
                vec![0.0; e.shape.iter().product()]
            }
            None => return Err(ExportError::MissingParameter(name).into()),
        };
        let bytes = values.iter().flat_map(|x| x.to_le_bytes()).collect();
        out.push((name, e.shape, bytes));
    }
    let mut unused: Vec<_> = params.keys().filter(|n| !used.contains(*n)).collect();
    unused.sort();
    match unused.first() {
        Some(name) => Err(ExportError::UnmappedParameter(name.to_string()).into()),
        None => Ok(out),
    }
}

/// `config.json` of a Llama-variant model (see the module docs).
fn llama_config_json(model: &Gpt) -> Value {
    let cfg = &model.config;
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.mlp_hidden(),
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.n_head,
        "head_dim": cfg.n_embd / cfg.n_head,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.block_size,
        "rms_norm_eps": short_f64(NORM_EPS),
        "rope_theta": short_f64(LLAMA_ROPE_THETA),
        "rope_scaling": null,
        "attention_bias": false,
        "attention_dropout": 0.0,
        "mlp_bias": false,
        "pretraining_tp": 1,
        "initializer_range": 0.02,
        "tie_word_embeddings": false,
        "bos_token_id": null,
        "eos_token_id": null,
        "pad_token_id": null,
        "use_cache": true,
        "dtype": "float32",
    })
}

/// The project parameter a Llama checkpoint tensor comes from, and which third of its rows
/// (`c_attn` holds q, k and v stacked), or `None` for a name the mapping does not know.
fn llama_source(hf_name: &str) -> Option<(String, Option<usize>)> {
    let whole = |s: &str| Some((s.to_string(), None));
    match hf_name {
        "model.embed_tokens.weight" => return whole("transformer.wte.weight"),
        "model.norm.weight" => return whole("transformer.ln_f.weight"),
        "lm_head.weight" => return whole("lm_head.weight"),
        _ => {}
    }
    let (layer, tail) = hf_name.strip_prefix("model.layers.")?.split_once('.')?;
    let (src, part) = match tail {
        "self_attn.q_proj.weight" => ("attn.c_attn.weight", Some(0)),
        "self_attn.k_proj.weight" => ("attn.c_attn.weight", Some(1)),
        "self_attn.v_proj.weight" => ("attn.c_attn.weight", Some(2)),
        "self_attn.o_proj.weight" => ("attn.c_proj.weight", None),
        "mlp.gate_proj.weight" => ("mlp.w1.weight", None),
        "mlp.up_proj.weight" => ("mlp.w3.weight", None),
        "mlp.down_proj.weight" => ("mlp.w2.weight", None),
        "input_layernorm.weight" => ("attention_norm.weight", None),
        "post_attention_layernorm.weight" => ("ffn_norm.weight", None),
        _ => return None,
    };
    Some((format!("transformer.h.{layer}.{src}"), part))
}

/// Every tensor `hf` (a Llama config) implies, as f32 little-endian bytes from the model's
/// parameter [`llama_source`] names (a third of `c_attn`'s rows for q, k, v). Every parameter
/// must be used, and every tensor found.
fn llama_tensors(model: &Gpt, hf: &ModelConfig) -> Result<Vec<Named>, ModelError> {
    let params = params_by_name(model);
    let mut used = HashSet::new();
    let mut out = Vec::new();
    for e in expected_tensors(hf) {
        let Some((src, part)) = llama_source(&e.name) else {
            return Err(ExportError::MissingParameter(e.name).into());
        };
        let Some(t) = params.get(&src) else {
            return Err(ExportError::MissingParameter(src).into());
        };
        let mut want = e.shape.clone();
        if part.is_some() {
            want[0] *= 3;
        }
        if t.shape() != want.as_slice() {
            return Err(ExportError::WrongShape {
                name: src,
                expected: want,
                found: t.shape().to_vec(),
            }
            .into());
        }
        let v = t.to_vec()?;
        let n: usize = e.shape.iter().product();
        let values = match part {
            Some(i) => &v[i * n..(i + 1) * n],
            None => &v[..],
        };
        let bytes = values.iter().flat_map(|x| x.to_le_bytes()).collect();
        out.push((e.name, e.shape, bytes));
        used.insert(src);
    }
    let mut unused: Vec<_> = params.keys().filter(|n| !used.contains(*n)).collect();
    unused.sort();
    match unused.first() {
        Some(name) => Err(ExportError::UnmappedParameter(name.to_string()).into()),
        None => Ok(out),
    }
}

/// `[rows, cols]` row-major → `[cols, rows]` row-major.
fn transpose(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..cols)
        .flat_map(|c| (0..rows).map(move |r| v[r * cols + c]))
        .collect()
}

/// `tokenizer.json`: every character a token with the project's id (see the module docs).
fn tokenizer_json(tok: &CharTokenizer) -> Result<Value, ModelError> {
    let mut vocab = serde_json::Map::new();
    for id in 0..tok.vocab_size() {
        let ch = tok.decode(&[id as u32])?;
        if vocab.insert(ch, json!(id)).is_some() {
            return Err(ExportError::DuplicateCharacter.into());
        }
    }
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": {"type": "Fuse"},
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": UNK,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": false,
            "vocab": vocab,
            "merges": [],
        },
    }))
}

fn tokenizer_config_json(model: &Gpt) -> Value {
    json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": false,
        "model_max_length": model.config.block_size,
    })
}

/// `dir` may be created: it does not exist, or is an empty directory.
fn check_target(dir: &Path) -> Result<(), ExportError> {
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io(dir)(e)),
        Ok(m) if !m.is_dir() => Err(ExportError::NotADirectory(dir.to_path_buf())),
        Ok(_) => match std::fs::read_dir(dir).map_err(io(dir))?.next() {
            None => Ok(()),
            Some(_) => Err(ExportError::DirNotEmpty(dir.to_path_buf())),
        },
    }
}

/// A directory removed with its contents when dropped, unless kept.
struct Staging {
    path: PathBuf,
    keep: bool,
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.keep {
            // Best effort: the directory is ours and hidden; nothing else can be done here.
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// A fresh hidden directory `.{name}.export-{pid}-{n}` in `parent`.
fn staging_dir(parent: &Path, name: &str) -> Result<Staging, ExportError> {
    let pid = std::process::id();
    let mut n = 0u32;
    loop {
        let path = parent.join(format!(".{name}.export-{pid}-{n}"));
        match std::fs::create_dir(&path) {
            Ok(()) => return Ok(Staging { path, keep: false }),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
            Err(e) => return Err(io(&path)(e)),
        }
    }
}

/// Writes `files` into a staging directory beside `dir` (each synced to disk), then renames
/// it onto `dir` (which must not exist or be empty: on Unix the rename replaces an empty
/// directory and fails on a non-empty one). On any failure the staging directory is removed.
fn write_atomically(dir: &Path, files: &[(&str, Vec<u8>)]) -> Result<(), ExportError> {
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| ExportError::BadTarget(dir.to_path_buf()))?;
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut staging = staging_dir(parent, name)?;
    for (file, bytes) in files {
        let path = staging.path.join(file);
        let mut f = std::fs::File::create(&path).map_err(io(&path))?;
        f.write_all(bytes).map_err(io(&path))?;
        f.sync_all().map_err(io(&path))?;
    }
    std::fs::rename(&staging.path, dir).map_err(|e| match check_target(dir) {
        // Something appeared at `dir` since it was checked.
        Err(refusal @ (ExportError::DirNotEmpty(_) | ExportError::NotADirectory(_))) => refusal,
        _ => io(dir)(e),
    })?;
    staging.keep = true;
    Ok(())
}
