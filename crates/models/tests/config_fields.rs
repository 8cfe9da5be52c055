//! `config.json` fields that change `transformers`' output: each one is implemented (the
//! sliding window, GPT-2's attention scales) or refused with a typed error naming it.

mod common;

use models::{ConfigError, ModelConfig};
use serde_json::{json, Value};

fn parse(v: &Value) -> Result<ModelConfig, ConfigError> {
    ModelConfig::from_json_str(&v.to_string())
}

fn with(base: &str, pairs: &[(&str, Value)]) -> Value {
    let mut v: Value = serde_json::from_str(base).unwrap();
    for (key, value) in pairs {
        v[*key] = value.clone();
    }
    v
}

/// The field an unsupported-field refusal names, or a panic with the error.
fn refused_field(r: Result<ModelConfig, ConfigError>) -> (&'static str, String) {
    match r {
        Err(ConfigError::UnsupportedField { field, value, .. }) => (field, value),
        other => panic!("expected an unsupported-field refusal, got {other:?}"),
    }
}

const LLAMA_FAMILY: [&str; 3] = [common::LLAMA_GQA, common::QWEN2, common::MISTRAL_FULL];

#[test]
fn hidden_act_other_than_silu_is_refused() {
    for base in LLAMA_FAMILY {
        assert!(parse(&with(base, &[("hidden_act", json!("silu"))])).is_ok());
        assert!(parse(&with(base, &[("hidden_act", Value::Null)])).is_ok());
        for act in ["gelu", "relu", "no_such_activation"] {
            let (field, value) = refused_field(parse(&with(base, &[("hidden_act", json!(act))])));
            assert_eq!(field, "hidden_act");
            assert!(value.contains(act), "{value}");
        }
        let (field, _) = refused_field(parse(&with(base, &[("hidden_act", json!(3))])));
        assert_eq!(field, "hidden_act");
    }
}

#[test]
fn partial_rotary_factor_other_than_one_is_refused() {
    for base in LLAMA_FAMILY {
        assert!(parse(&with(base, &[("partial_rotary_factor", json!(1.0))])).is_ok());
        let (field, value) =
            refused_field(parse(&with(base, &[("partial_rotary_factor", json!(0.5))])));
        assert_eq!((field, value.as_str()), ("partial_rotary_factor", "0.5"));
        // transformers 5 may nest it in rope_parameters.
        let nested = json!({"rope_theta": 10000.0, "rope_type": "default",
            "partial_rotary_factor": 0.25});
        let (field, _) = refused_field(parse(&with(base, &[("rope_parameters", nested)])));
        assert_eq!(field, "partial_rotary_factor");
    }
}

#[test]
fn mlp_bias_is_refused() {
    for base in LLAMA_FAMILY {
        assert!(parse(&with(base, &[("mlp_bias", json!(false))])).is_ok());
        let (field, value) = refused_field(parse(&with(base, &[("mlp_bias", json!(true))])));
        assert_eq!((field, value.as_str()), ("mlp_bias", "true"));
    }
}

#[test]
fn gpt2_attention_scale_fields() {
    let c = parse(&with(common::GPT2, &[])).unwrap();
    assert_eq!(c.attention_scale(1), 0.5); // head_dim 4
    let off = [("scale_attn_weights", json!(false))];
    assert_eq!(
        parse(&with(common::GPT2, &off)).unwrap().attention_scale(1),
        1.0
    );
    let inv = [("scale_attn_by_inverse_layer_idx", json!(true))];
    let c = parse(&with(common::GPT2, &inv)).unwrap();
    assert_eq!((c.attention_scale(0), c.attention_scale(1)), (0.5, 0.25));
    let up = [("reorder_and_upcast_attn", json!(true))];
    assert_eq!(
        parse(&with(common::GPT2, &up)).unwrap().attention_scale(0),
        0.5
    );
    let bad = [("scale_attn_weights", json!("yes"))];
    assert!(matches!(
        parse(&with(common::GPT2, &bad)),
        Err(ConfigError::BadField {
            field: "scale_attn_weights",
            ..
        })
    ));
}

fn bad_field(r: Result<ModelConfig, ConfigError>) -> &'static str {
    match r {
        Err(ConfigError::BadField { field, .. } | ConfigError::UnsupportedField { field, .. }) => {
            field
        }
        other => panic!("expected a refusal naming a field, got {other:?}"),
    }
}

/// Every layer's window of `c`.
fn windows(c: &ModelConfig) -> Vec<Option<usize>> {
    c.layer_windows.first(c.num_layers)
}

#[test]
fn sliding_window_layers() {
    // Mistral: every layer slides when the window is set.
    let c = parse(&with(common::MISTRAL_FULL, &[("sliding_window", json!(6))])).unwrap();
    assert_eq!(windows(&c), [Some(6)]);
    assert_eq!(
        windows(&parse(&with(common::MISTRAL_FULL, &[])).unwrap()),
        [None]
    );
    // Qwen2 (2 layers here): only with use_sliding_window, from max_window_layers on.
    let two = [
        ("num_hidden_layers", json!(2)),
        ("sliding_window", json!(4)),
    ];
    let qwen = |extra: &[(&str, Value)]| {
        let mut f = two.to_vec();
        f.extend_from_slice(extra);
        parse(&with(common::QWEN2, &f))
    };
    // Qwen2.5 ships use_sliding_window: false with a window: no window.
    let off = qwen(&[
        ("use_sliding_window", json!(false)),
        ("max_window_layers", json!(0)),
    ]);
    assert_eq!(windows(&off.unwrap()), [None, None]);
    let on = qwen(&[
        ("use_sliding_window", json!(true)),
        ("max_window_layers", json!(1)),
    ]);
    assert_eq!(windows(&on.unwrap()), [None, Some(4)]);
    // layer_types rules.
    let types = json!(["sliding_attention", "full_attention"]);
    let ruled = qwen(&[
        ("use_sliding_window", json!(true)),
        ("layer_types", types.clone()),
    ]);
    assert_eq!(windows(&ruled.unwrap()), [Some(4), None]);
    let m = with(
        common::MISTRAL_FULL,
        &[
            ("sliding_window", json!(3)),
            ("layer_types", json!(["full_attention"])),
        ],
    );
    assert_eq!(windows(&parse(&m).unwrap()), [None]);
    // A sliding layer with no window (Qwen2's use_sliding_window false) is refused.
    assert_eq!(bad_field(qwen(&[("layer_types", types)])), "layer_types");
}

#[test]
fn bad_sliding_window_and_layer_types_are_refused() {
    for w in [json!(0), json!(-4), json!(2.5), json!("4")] {
        let v = with(common::MISTRAL_FULL, &[("sliding_window", w)]);
        assert_eq!(bad_field(parse(&v)), "sliding_window");
    }
    // Llama has no sliding window in transformers: refused rather than ignored.
    let v = with(common::LLAMA_GQA, &[("sliding_window", json!(8))]);
    assert_eq!(bad_field(parse(&v)), "sliding_window");
    assert!(parse(&with(common::LLAMA_GQA, &[("sliding_window", Value::Null)])).is_ok());
    let w = ("sliding_window", json!(3));
    for types in [
        json!(["full_attention"]),
        json!(["full_attention", "chunked_attention"]),
        json!("full_attention"),
    ] {
        let v = with(common::LLAMA_GQA, &[("layer_types", types)]);
        assert_eq!(bad_field(parse(&v)), "layer_types");
        let v = with(
            common::MISTRAL_FULL,
            &[
                w.clone(),
                ("num_hidden_layers", json!(2)),
                ("layer_types", json!(["full_attention"])),
            ],
        );
        assert_eq!(bad_field(parse(&v)), "layer_types");
    }
}

/// Parsing stores the windows by rule, not per layer: a config claiming 2^50 layers (whose
/// tensors the loader then finds missing) allocates nothing for them here. A per-layer list
/// would ask for 2^54 bytes and abort.
#[test]
fn a_huge_layer_count_allocates_no_window_list() {
    let layers = 1usize << 50;
    let fields = [
        ("num_hidden_layers", json!(layers)),
        ("sliding_window", json!(4)),
    ];
    let c = parse(&with(common::MISTRAL_FULL, &fields)).unwrap();
    assert_eq!(c.layer_windows.get(layers - 1), Some(4));
    assert_eq!(c.layer_windows.get(0), Some(4));
}
