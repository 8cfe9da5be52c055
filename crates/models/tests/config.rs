//! `config.json` parsing: the four families, defaults, and each typed refusal.

mod common;

use models::{Architecture, ConfigError, Gpt2Activation, ModelConfig};
use serde_json::{json, Value};

fn parse(v: &Value) -> Result<ModelConfig, ConfigError> {
    ModelConfig::from_json_str(&v.to_string())
}

fn with(base: &str, key: &str, value: Value) -> Value {
    let mut v: Value = serde_json::from_str(base).unwrap();
    v[key] = value;
    v
}

fn without(base: &str, key: &str) -> Value {
    let mut v: Value = serde_json::from_str(base).unwrap();
    v.as_object_mut().unwrap().remove(key);
    v
}

#[test]
fn llama3_with_gqa_and_rope_scaling() {
    let c = ModelConfig::from_json_str(common::LLAMA_GQA).unwrap();
    assert_eq!(c.architecture, Architecture::Llama);
    assert_eq!((c.vocab_size, c.hidden_size, c.num_layers), (32, 16, 2));
    assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (4, 2, 4));
    assert_eq!(c.kv_group(), 2);
    assert_eq!(c.intermediate_size, 24);
    assert_eq!(c.norm_eps, 1e-5);
    assert_eq!(c.rope_theta, Some(500000.0));
    assert_eq!(c.max_position_embeddings, 64);
    assert!(!c.tie_word_embeddings && !c.attention_bias);
    assert_eq!(c.torch_dtype.as_deref(), Some("bfloat16"));
    let s = c.rope_scaling.unwrap();
    assert_eq!(
        (s.factor, s.low_freq_factor, s.high_freq_factor),
        (8.0, 1.0, 4.0)
    );
    assert_eq!(s.original_max_position_embeddings, 8192);
}

#[test]
fn llama2_defaults_kv_heads_to_heads_and_legacy_rope_type_key() {
    let c = parse(&without(common::LLAMA_GQA, "num_key_value_heads")).unwrap();
    assert_eq!(c.num_kv_heads, 4);
    let scaling = json!({"type": "llama3", "factor": 2.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 4096});
    let c = parse(&with(common::LLAMA_GQA, "rope_scaling", scaling)).unwrap();
    assert_eq!(c.rope_scaling.unwrap().factor, 2.0);
    let c = parse(&with(common::LLAMA_GQA, "rope_scaling", Value::Null)).unwrap();
    assert_eq!(c.rope_scaling, None);
    let c = parse(&without(common::LLAMA_GQA, "rope_theta")).unwrap();
    assert_eq!(c.rope_theta, Some(10000.0));
}

#[test]
fn qwen2_has_biases_and_ties() {
    let c = ModelConfig::from_json_str(common::QWEN2).unwrap();
    assert_eq!(c.architecture, Architecture::Qwen2);
    assert!(c.attention_bias && c.tie_word_embeddings);
    assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (2, 1, 4));
    assert_eq!(c.rope_theta, Some(1e6));
}

#[test]
fn mistral_parses() {
    let c = ModelConfig::from_json_str(common::MISTRAL).unwrap();
    assert_eq!(c.architecture, Architecture::Mistral);
    assert_eq!(
        (c.num_kv_heads, c.head_dim, c.intermediate_size),
        (1, 4, 32)
    );
    assert!(!c.tie_word_embeddings);
}

#[test]
fn gpt2_names_and_defaults() {
    let c = ModelConfig::from_json_str(common::GPT2).unwrap();
    assert_eq!(c.architecture, Architecture::Gpt2);
    assert_eq!((c.hidden_size, c.num_layers, c.num_heads), (8, 2, 2));
    assert_eq!(
        (c.num_kv_heads, c.head_dim, c.intermediate_size),
        (2, 4, 32)
    );
    assert_eq!(c.max_position_embeddings, 16);
    assert!(c.tie_word_embeddings);
    assert_eq!(c.rope_theta, None);
    assert_eq!(c.torch_dtype.as_deref(), Some("float32"));
    assert_eq!(c.gpt2_activation, Some(Gpt2Activation::GeluTanh));
}

#[test]
fn gpt2_activation_names() {
    let act = |v: Value| parse(&with(common::GPT2, "activation_function", v));
    for (name, want) in [
        ("gelu_new", Gpt2Activation::GeluTanh),
        ("gelu_pytorch_tanh", Gpt2Activation::GeluTanh),
        ("gelu", Gpt2Activation::GeluErf),
    ] {
        assert_eq!(
            act(json!(name)).unwrap().gpt2_activation,
            Some(want),
            "{name}"
        );
    }
    assert_eq!(
        act(Value::Null).unwrap().gpt2_activation,
        Some(Gpt2Activation::GeluTanh)
    );
    match act(json!("relu")) {
        Err(ConfigError::UnsupportedActivation(name)) => assert_eq!(name, "relu"),
        other => panic!("{other:?}"),
    }
    match act(json!(3)) {
        Err(ConfigError::BadField { field, .. }) => assert_eq!(field, "activation_function"),
        other => panic!("{other:?}"),
    }
    let llama = ModelConfig::from_json_str(common::LLAMA_GQA).unwrap();
    assert_eq!(llama.gpt2_activation, None);
}

#[test]
fn explicit_head_dim_is_kept() {
    let c = parse(&with(common::MISTRAL, "head_dim", json!(8))).unwrap();
    assert_eq!(c.head_dim, 8);
}

#[test]
fn unsupported_architecture_is_named() {
    let v = with(common::LLAMA_GQA, "architectures", json!(["BertModel"]));
    match parse(&v) {
        Err(ConfigError::UnsupportedArchitecture(name)) => assert_eq!(name, "BertModel"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn missing_fields_are_named() {
    for key in [
        "architectures",
        "hidden_size",
        "num_attention_heads",
        "vocab_size",
    ] {
        match parse(&without(common::LLAMA_GQA, key)) {
            Err(ConfigError::MissingField(k)) => assert_eq!(k, key),
            other => panic!("{key}: {other:?}"),
        }
    }
    assert!(matches!(
        parse(&without(common::GPT2, "n_embd")),
        Err(ConfigError::MissingField("n_embd"))
    ));
}

#[test]
fn zero_heads_layers_hidden() {
    let cases = [
        ("num_attention_heads", "num_attention_heads"),
        ("num_hidden_layers", "num_hidden_layers"),
        ("hidden_size", "hidden_size"),
        ("num_key_value_heads", "num_key_value_heads"),
    ];
    for (key, named) in cases {
        match parse(&with(common::LLAMA_GQA, key, json!(0))) {
            Err(ConfigError::Zero(k)) => assert_eq!(k, named),
            other => panic!("{key}: {other:?}"),
        }
    }
    for key in ["n_head", "n_layer", "n_embd", "n_positions"] {
        match parse(&with(common::GPT2, key, json!(0))) {
            Err(ConfigError::Zero(k)) => assert_eq!(k, key),
            other => panic!("{key}: {other:?}"),
        }
    }
}

#[test]
fn heads_must_divide_hidden_and_kv_heads_must_divide_heads() {
    match parse(&with(common::LLAMA_GQA, "num_attention_heads", json!(3))) {
        Err(ConfigError::HeadsDoNotDivideHidden {
            heads: 3,
            hidden: 16,
        }) => {}
        other => panic!("{other:?}"),
    }
    match parse(&with(common::LLAMA_GQA, "num_key_value_heads", json!(3))) {
        Err(ConfigError::KvHeadsDoNotDivideHeads {
            kv_heads: 3,
            heads: 4,
        }) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_rope_scaling() {
    let good = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
    let mut cases = vec![
        json!("llama3"),
        json!({"factor": 8.0}),
        json!({"rope_type": "yarn"}),
    ];
    for (key, bad) in [
        ("factor", json!(0.0)),
        ("low_freq_factor", json!(5.0)),
        ("high_freq_factor", json!("x")),
        ("original_max_position_embeddings", json!(0)),
    ] {
        let mut s = good.clone();
        s[key] = bad;
        cases.push(s);
    }
    for s in cases {
        let r = parse(&with(common::LLAMA_GQA, "rope_scaling", s.clone()));
        assert!(
            matches!(r, Err(ConfigError::BadRopeScaling(_))),
            "{s}: {r:?}"
        );
    }
}

#[test]
fn malformed_json_and_bad_values() {
    assert!(matches!(
        ModelConfig::from_json_str("{\"architectures\": ["),
        Err(ConfigError::Json(_))
    ));
    assert!(matches!(
        ModelConfig::from_json_str("[1]"),
        Err(ConfigError::NotAnObject)
    ));
    for (key, v) in [("hidden_size", json!(-16)), ("rms_norm_eps", json!("tiny"))] {
        let r = parse(&with(common::LLAMA_GQA, key, v));
        assert!(
            matches!(r, Err(ConfigError::BadField { .. })),
            "{key}: {r:?}"
        );
    }
    let r = parse(&with(common::LLAMA_GQA, "architectures", json!([])));
    assert!(matches!(
        r,
        Err(ConfigError::BadField {
            field: "architectures",
            ..
        })
    ));
}

#[test]
fn from_dir_reports_a_missing_file() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        ModelConfig::from_dir(dir.path()),
        Err(ConfigError::Io { .. })
    ));
}

#[test]
fn eos_token_id_as_a_number_a_list_null_or_absent() {
    for base in [common::LLAMA_GQA, common::GPT2] {
        let ids = |v: Value| parse(&with(base, "eos_token_id", v)).map(|c| c.eos_token_ids);
        assert_eq!(ids(json!(2)).unwrap(), vec![2]);
        assert_eq!(ids(json!([128001, 128009])).unwrap(), vec![128001, 128009]);
        assert_eq!(ids(Value::Null).unwrap(), Vec::<u32>::new());
        assert!(parse(&without(base, "eos_token_id"))
            .unwrap()
            .eos_token_ids
            .is_empty());
        for bad in [
            json!("2"),
            json!(-1),
            json!(1.5),
            json!([2, "x"]),
            json!(1u64 << 40),
        ] {
            let e = ids(bad.clone()).unwrap_err();
            assert!(
                matches!(
                    e,
                    ConfigError::BadField {
                        field: "eos_token_id",
                        ..
                    }
                ),
                "{bad}: {e}"
            );
        }
    }
}
