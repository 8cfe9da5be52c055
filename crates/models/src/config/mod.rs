//! `config.json` of a Hugging Face causal LM, parsed into a typed, validated [`ModelConfig`].

use std::path::Path;

use serde_json::{Map, Value};

mod window;
use tensor_ops::fsio::{self, FileError};
use thiserror::Error;
pub use window::LayerWindows;

/// What [`fsio`]'s errors call a model directory.
pub(crate) const MODEL_DIR: &str = "model directory";

/// Checks that `dir` is an existing directory: a missing path, a file or a device given as a
/// model directory is named as such, not as a file missing inside it.
pub fn check_model_dir(dir: &Path) -> Result<(), FileError> {
    fsio::check_dir(dir, MODEL_DIR)
}

/// The model families this crate knows the weight layout of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// `LlamaForCausalLM` (Llama 2 and 3).
    Llama,
    /// `Qwen2ForCausalLM`: Llama layout with q/k/v biases.
    Qwen2,
    /// `MistralForCausalLM`: Llama layout.
    Mistral,
    /// `GPT2LMHeadModel`: learned positions, LayerNorm, Conv1D (transposed) projections.
    Gpt2,
}

impl Architecture {
    fn from_name(name: &str) -> Result<Self, ConfigError> {
        match name {
            "LlamaForCausalLM" => Ok(Self::Llama),
            "Qwen2ForCausalLM" => Ok(Self::Qwen2),
            "MistralForCausalLM" => Ok(Self::Mistral),
            "GPT2LMHeadModel" => Ok(Self::Gpt2),
            other => Err(ConfigError::UnsupportedArchitecture(other.to_string())),
        }
    }

    /// This family's `config.json` key for a Llama-style key (GPT-2 spells them `n_*`).
    pub fn key(self, llama_key: &'static str) -> &'static str {
        match (self, llama_key) {
            (Self::Gpt2, "hidden_size") => "n_embd",
            (Self::Gpt2, "num_hidden_layers") => "n_layer",
            (Self::Gpt2, "num_attention_heads" | "num_key_value_heads") => "n_head",
            (Self::Gpt2, "intermediate_size") => "n_inner",
            (Self::Gpt2, "max_position_embeddings") => "n_positions",
            _ => llama_key,
        }
    }

    /// Whether the family uses rotary embeddings, RMSNorm and a gated MLP (Llama-like).
    pub fn is_llama_like(self) -> bool {
        !matches!(self, Self::Gpt2)
    }
}

/// GPT-2's MLP activation (`activation_function` in `config.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gpt2Activation {
    /// The tanh approximation, `x/2·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`: `"gelu_new"`
    /// (GPT-2's default) or `"gelu_pytorch_tanh"`.
    GeluTanh,
    /// The exact GELU `x·Φ(x)` (erf): `"gelu"`.
    GeluErf,
}

impl Gpt2Activation {
    fn from_name(name: &str) -> Result<Self, ConfigError> {
        match name {
            "gelu_new" | "gelu_pytorch_tanh" => Ok(Self::GeluTanh),
            "gelu" => Ok(Self::GeluErf),
            other => Err(ConfigError::UnsupportedActivation(other.to_string())),
        }
    }

    /// The `activation_function` value that names this activation.
    pub fn name(self) -> &'static str {
        match self {
            Self::GeluTanh => "gelu_new",
            Self::GeluErf => "gelu",
        }
    }
}

/// Llama 3 rope scaling (`rope_type` or `type` = `"llama3"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeScaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: usize,
}

/// The shape-relevant hyper-parameters of a checkpoint, whatever the family's key names.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    /// Key/value heads (grouped-query attention); equals `num_heads` when the config omits it.
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    /// RMSNorm epsilon (Llama family) or LayerNorm epsilon (GPT-2).
    pub norm_eps: f64,
    /// Rotary base; `None` for GPT-2 (learned positions).
    pub rope_theta: Option<f64>,
    pub rope_scaling: Option<RopeScaling>,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Whether q/k/v projections carry biases (always for Qwen2, `attention_bias` for Llama).
    pub attention_bias: bool,
    /// `torch_dtype` (or the newer `dtype`) as written, e.g. `"bfloat16"`.
    pub torch_dtype: Option<String>,
    /// GPT-2's MLP activation (`gelu_new` when the config omits it); `None` for the Llama
    /// family (SwiGLU).
    pub gpt2_activation: Option<Gpt2Activation>,
    /// The end-of-sequence ids (`eos_token_id`: a number, a list, null or absent).
    pub eos_token_ids: Vec<u32>,
    /// Whether the attention scores are divided by √head_dim (GPT-2's `scale_attn_weights`;
    /// always for the Llama family).
    pub scale_attn_weights: bool,
    /// Whether layer `l`'s scores are also divided by `l + 1` (GPT-2's
    /// `scale_attn_by_inverse_layer_idx`; never for the Llama family).
    pub scale_attn_by_inverse_layer_idx: bool,
    /// Which layers attend through a sliding window, and how wide ([`LayerWindows::get`]).
    pub layer_windows: LayerWindows,
}

/// Why a `config.json` was refused.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The model directory or its `config.json` is missing or not what it should be.
    #[error(transparent)]
    Io {
        #[from]
        source: FileError,
    },
    #[error("malformed config JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("config JSON is not an object")]
    NotAnObject,
    #[error("unsupported architecture `{0}` (supported: LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM, GPT2LMHeadModel)")]
    UnsupportedArchitecture(String),
    #[error("config field `{0}` is missing")]
    MissingField(&'static str),
    #[error("config field `{field}` is invalid: {reason}")]
    BadField { field: &'static str, reason: String },
    #[error("config field `{0}` is 0")]
    Zero(&'static str),
    #[error("{heads} attention heads do not divide hidden size {hidden}")]
    HeadsDoNotDivideHidden { heads: usize, hidden: usize },
    #[error("{kv_heads} key/value heads do not divide {heads} attention heads")]
    KvHeadsDoNotDivideHeads { kv_heads: usize, heads: usize },
    #[error(
        "unsupported activation_function `{0}` (supported: gelu_new, gelu_pytorch_tanh, gelu)"
    )]
    UnsupportedActivation(String),
    #[error("bad rope_scaling: {0}")]
    BadRopeScaling(String),
    /// A field whose value changes `transformers`' output in a way this crate does not
    /// implement (reading it and going on would give other numbers).
    #[error("config field `{field}` = {value} is not supported: {reason}")]
    UnsupportedField {
        field: &'static str,
        value: String,
        reason: &'static str,
    },
}

pub(crate) type Obj = Map<String, Value>;

impl ModelConfig {
    /// Reads `<dir>/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self, ConfigError> {
        fsio::check_dir(dir, MODEL_DIR)?;
        let text = fsio::read_to_string(&dir.join("config.json"), "config", fsio::JSON_MAX)?;
        Self::from_json_str(&text)
    }

    /// Parses and validates the text of a `config.json`.
    pub fn from_json_str(text: &str) -> Result<Self, ConfigError> {
        let value: Value = serde_json::from_str(text)?;
        let obj = value.as_object().ok_or(ConfigError::NotAnObject)?;
        let architecture = Architecture::from_name(architecture_name(obj)?)?;
        let config = match architecture {
            Architecture::Gpt2 => parse_gpt2(obj)?,
            arch => parse_llama_like(obj, arch)?,
        };
        config.validate()?;
        Ok(config)
    }

    /// The factor of layer `layer`'s attention scores `q·k` (0-based layer): `1/√head_dim`
    /// unless GPT-2's `scale_attn_weights` is false, further divided by `layer + 1` under
    /// GPT-2's `scale_attn_by_inverse_layer_idx`, as `transformers` computes it.
    pub fn attention_scale(&self, layer: usize) -> f32 {
        let mut scale = if self.scale_attn_weights {
            1.0 / (self.head_dim as f32).sqrt()
        } else {
            1.0
        };
        if self.scale_attn_by_inverse_layer_idx {
            scale /= (layer + 1) as f32;
        }
        scale
    }

    /// Query heads per key/value head.
    pub fn kv_group(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let nonzero = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_layers),
            ("num_attention_heads", self.num_heads),
            ("num_key_value_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("intermediate_size", self.intermediate_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        if let Some((name, _)) = nonzero.iter().find(|(_, v)| *v == 0) {
            return Err(ConfigError::Zero(self.architecture.key(name)));
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(ConfigError::KvHeadsDoNotDivideHeads {
                kv_heads: self.num_kv_heads,
                heads: self.num_heads,
            });
        }
        if !(self.norm_eps.is_finite() && self.norm_eps > 0.0) {
            return bad(
                "norm epsilon",
                format!("{} is not a positive number", self.norm_eps),
            );
        }
        match self.rope_theta {
            Some(t) if !(t.is_finite() && t > 0.0) => {
                bad("rope_theta", format!("{t} is not a positive number"))
            }
            _ => Ok(()),
        }
    }
}

pub(crate) fn bad<T>(field: &'static str, reason: String) -> Result<T, ConfigError> {
    Err(ConfigError::BadField { field, reason })
}

fn architecture_name(obj: &Obj) -> Result<&str, ConfigError> {
    let archs = obj
        .get("architectures")
        .ok_or(ConfigError::MissingField("architectures"))?;
    match archs
        .as_array()
        .and_then(|a| a.first())
        .and_then(Value::as_str)
    {
        Some(name) => Ok(name),
        None => bad("architectures", "expected a non-empty list of names".into()),
    }
}

pub(crate) fn opt_usize(obj: &Obj, key: &'static str) -> Result<Option<usize>, ConfigError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
            Some(n) => Ok(Some(n)),
            None => bad(key, format!("{v} is not a non-negative integer")),
        },
    }
}

pub(crate) fn req_usize(obj: &Obj, key: &'static str) -> Result<usize, ConfigError> {
    opt_usize(obj, key)?.ok_or(ConfigError::MissingField(key))
}

fn opt_f64(obj: &Obj, key: &'static str) -> Result<Option<f64>, ConfigError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| ConfigError::BadField {
            field: key,
            reason: format!("{v} is not a number"),
        }),
    }
}

pub(crate) fn opt_bool(obj: &Obj, key: &'static str, default: bool) -> Result<bool, ConfigError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => bad(key, format!("{v} is not a boolean")),
    }
}

/// `eos_token_id`: a number, a list of numbers, null or absent; anything else is a bad field.
fn eos_token_ids(obj: &Obj) -> Result<Vec<u32>, ConfigError> {
    let bad = |v: &Value| ConfigError::BadField {
        field: "eos_token_id",
        reason: format!("{v} is not a token id or a list of them"),
    };
    let id = |v: &Value| {
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| bad(v))
    };
    match obj.get("eos_token_id") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a.iter().map(id).collect(),
        Some(v) => Ok(vec![id(v)?]),
    }
}

fn torch_dtype(obj: &Obj) -> Option<String> {
    let v = obj.get("torch_dtype").or_else(|| obj.get("dtype"))?;
    v.as_str().map(str::to_string)
}

/// Head size: `head_dim` when given, else hidden / heads, which must divide evenly.
fn head_dim(
    obj: &Obj,
    arch: Architecture,
    hidden: usize,
    heads: usize,
) -> Result<usize, ConfigError> {
    if let Some(d) = opt_usize(obj, "head_dim")? {
        return Ok(d);
    }
    if heads == 0 {
        return Err(ConfigError::Zero(arch.key("num_attention_heads")));
    }
    if !hidden.is_multiple_of(heads) {
        return Err(ConfigError::HeadsDoNotDivideHidden { heads, hidden });
    }
    Ok(hidden / heads)
}

pub(crate) fn unsupported<T>(
    field: &'static str,
    value: &Value,
    reason: &'static str,
) -> Result<T, ConfigError> {
    Err(ConfigError::UnsupportedField {
        field,
        value: value.to_string(),
        reason,
    })
}

/// Refuses the Llama family's fields whose other values this crate does not implement:
/// `hidden_act` other than `"silu"` (the gated MLP's activation), `partial_rotary_factor`
/// other than 1 (top level or in transformers 5's `rope_parameters`), `mlp_bias: true`.
fn refuse_llama_variants(obj: &Obj) -> Result<(), ConfigError> {
    match obj.get("hidden_act") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == "silu" => {}
        Some(v) => return unsupported("hidden_act", v, "only silu (SwiGLU) is implemented"),
    }
    let nested = obj.get("rope_parameters").and_then(Value::as_object);
    for o in std::iter::once(obj).chain(nested) {
        match o.get("partial_rotary_factor") {
            None | Some(Value::Null) => {}
            Some(v) if v.as_f64() == Some(1.0) => {}
            Some(v) => {
                return unsupported(
                    "partial_rotary_factor",
                    v,
                    "rotary embeddings over the whole head only",
                )
            }
        }
    }
    if opt_bool(obj, "mlp_bias", false)? {
        return unsupported(
            "mlp_bias",
            &Value::Bool(true),
            "MLP projections carry no bias",
        );
    }
    Ok(())
}

fn parse_llama_like(obj: &Obj, architecture: Architecture) -> Result<ModelConfig, ConfigError> {
    refuse_llama_variants(obj)?;
    let hidden_size = req_usize(obj, "hidden_size")?;
    let num_heads = req_usize(obj, "num_attention_heads")?;
    let qwen = architecture == Architecture::Qwen2;
    Ok(ModelConfig {
        architecture,
        vocab_size: req_usize(obj, "vocab_size")?,
        hidden_size,
        num_layers: req_usize(obj, "num_hidden_layers")?,
        num_heads,
        num_kv_heads: opt_usize(obj, "num_key_value_heads")?.unwrap_or(num_heads),
        head_dim: head_dim(obj, architecture, hidden_size, num_heads)?,
        intermediate_size: req_usize(obj, "intermediate_size")?,
        norm_eps: opt_f64(obj, "rms_norm_eps")?.unwrap_or(1e-6),
        rope_theta: Some(rope_theta(obj)?),
        rope_scaling: match obj.get("rope_scaling") {
            None | Some(Value::Null) => rope_parameters_scaling(obj)?,
            given => rope_scaling(given)?,
        },
        max_position_embeddings: req_usize(obj, "max_position_embeddings")?,
        tie_word_embeddings: opt_bool(obj, "tie_word_embeddings", false)?,
        attention_bias: qwen || opt_bool(obj, "attention_bias", false)?,
        torch_dtype: torch_dtype(obj),
        eos_token_ids: eos_token_ids(obj)?,
        gpt2_activation: None,
        layer_windows: window::parse(obj, architecture)?,
        scale_attn_weights: true,
        scale_attn_by_inverse_layer_idx: false,
    })
}

fn parse_gpt2(obj: &Obj) -> Result<ModelConfig, ConfigError> {
    let hidden_size = req_usize(obj, "n_embd")?;
    let num_heads = req_usize(obj, "n_head")?;
    Ok(ModelConfig {
        architecture: Architecture::Gpt2,
        vocab_size: req_usize(obj, "vocab_size")?,
        hidden_size,
        num_layers: req_usize(obj, "n_layer")?,
        num_heads,
        num_kv_heads: num_heads,
        head_dim: head_dim(obj, Architecture::Gpt2, hidden_size, num_heads)?,
        intermediate_size: opt_usize(obj, "n_inner")?.unwrap_or(4 * hidden_size),
        norm_eps: opt_f64(obj, "layer_norm_epsilon")?.unwrap_or(1e-5),
        rope_theta: None,
        rope_scaling: None,
        max_position_embeddings: req_usize(obj, "n_positions")?,
        tie_word_embeddings: opt_bool(obj, "tie_word_embeddings", true)?,
        attention_bias: true,
        torch_dtype: torch_dtype(obj),
        eos_token_ids: eos_token_ids(obj)?,
        gpt2_activation: Some(gpt2_activation(obj)?),
        layer_windows: LayerWindows::None,
        scale_attn_weights: opt_bool(obj, "scale_attn_weights", true)?,
        // `reorder_and_upcast_attn` is accepted and ignored: it only computes the same
        // scores in f32 under autocast, and every score here is f32 already.
        scale_attn_by_inverse_layer_idx: opt_bool(obj, "scale_attn_by_inverse_layer_idx", false)?,
    })
}

/// `activation_function`, `gelu_new` (transformers' GPT-2 default) when absent or null.
fn gpt2_activation(obj: &Obj) -> Result<Gpt2Activation, ConfigError> {
    match obj.get("activation_function") {
        None | Some(Value::Null) => Ok(Gpt2Activation::GeluTanh),
        Some(Value::String(name)) => Gpt2Activation::from_name(name),
        Some(v) => bad("activation_function", format!("{v} is not a string")),
    }
}

/// The rotary base: `rope_theta`, or (transformers 5) `rope_parameters.rope_theta`, else 10000.
fn rope_theta(obj: &Obj) -> Result<f64, ConfigError> {
    if let Some(t) = opt_f64(obj, "rope_theta")? {
        return Ok(t);
    }
    match obj.get("rope_parameters") {
        Some(Value::Object(p)) => Ok(opt_f64(p, "rope_theta")?.unwrap_or(10_000.0)),
        _ => Ok(10_000.0),
    }
}

/// transformers 5's `rope_parameters` (the base and the scaling in one object): its scaling,
/// `None` for `rope_type` "default" or none given.
fn rope_parameters_scaling(obj: &Obj) -> Result<Option<RopeScaling>, ConfigError> {
    match obj.get("rope_parameters") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(p)) if p.get("rope_type").or_else(|| p.get("type")).is_none() => {
            Ok(None)
        }
        given => rope_scaling(given),
    }
}

/// `rope_scaling`: absent/null, or Llama 3's `{"rope_type": "llama3", ...}`.
fn rope_scaling(value: Option<&Value>) -> Result<Option<RopeScaling>, ConfigError> {
    let obj = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(obj)) => obj,
        Some(v) => return Err(ConfigError::BadRopeScaling(format!("{v} is not an object"))),
    };
    let kind = obj.get("rope_type").or_else(|| obj.get("type"));
    match kind.and_then(Value::as_str) {
        Some("llama3") => llama3_scaling(obj).map(Some),
        Some("default") => Ok(None),
        Some(other) => Err(ConfigError::BadRopeScaling(format!(
            "rope type `{other}` is not supported (only llama3)"
        ))),
        None => Err(ConfigError::BadRopeScaling("no rope_type".into())),
    }
}

fn llama3_scaling(obj: &Obj) -> Result<RopeScaling, ConfigError> {
    let num = |key: &str| {
        obj.get(key)
            .and_then(Value::as_f64)
            .filter(|x| x.is_finite() && *x > 0.0)
            .ok_or_else(|| ConfigError::BadRopeScaling(format!("`{key}` missing or not > 0")))
    };
    let s = RopeScaling {
        factor: num("factor")?,
        low_freq_factor: num("low_freq_factor")?,
        high_freq_factor: num("high_freq_factor")?,
        original_max_position_embeddings: obj
            .get("original_max_position_embeddings")
            .and_then(Value::as_u64)
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| *n > 0)
            .ok_or_else(|| {
                ConfigError::BadRopeScaling(
                    "`original_max_position_embeddings` missing or 0".into(),
                )
            })?,
    };
    if s.low_freq_factor >= s.high_freq_factor {
        return Err(ConfigError::BadRopeScaling(format!(
            "low_freq_factor {} must be below high_freq_factor {}",
            s.low_freq_factor, s.high_freq_factor
        )));
    }
    Ok(s)
}
