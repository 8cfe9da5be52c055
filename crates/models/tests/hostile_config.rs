//! Configs that would hang or exhaust memory (issue 39): a context of one token (perplexity's
//! windows never advanced), and a layer count far beyond the checkpoint's (every layer's
//! tensors were listed, or allocated, before the first missing one was noticed). Each is a
//! typed error, returned quickly; every call runs under a time limit, so a regression fails
//! instead of hanging.

mod hf_fixture;

use std::collections::HashMap;

use hf_fixture::{copy_fixture, within};

use models::gpt::{Gpt, GptConfig, Variant};
use models::{perplexity_windows, CausalLm, Engine, EngineOptions, ModelError, WeightsError};
use tensor_ops::{DType, Device};

/// A copy of fixture `name` whose `config.json` has `key` set to `value`.
fn with_config(name: &str, key: &str, value: serde_json::Value) -> tempfile::TempDir {
    let tmp = copy_fixture(name);
    let text = std::fs::read_to_string(hf_fixture::dir(name).join("config.json")).unwrap();
    let mut cfg: serde_json::Value = serde_json::from_str(&text).unwrap();
    cfg[key] = value;
    std::fs::write(tmp.path().join("config.json"), cfg.to_string()).unwrap();
    tmp
}

#[test]
fn perplexity_windows_cover_every_token_once() {
    assert_eq!(perplexity_windows(10, 4).unwrap(), vec![0..4, 3..7, 6..10]);
    assert_eq!(perplexity_windows(5, 64).unwrap(), vec![0..5]);
    assert!(perplexity_windows(1, 64).unwrap().is_empty());
    for (len, ctx) in [(2, 2), (7, 2), (100, 3), (9, usize::MAX)] {
        let w = perplexity_windows(len, ctx).unwrap();
        let predicted: usize = w.iter().map(|r| r.len() - 1).sum();
        assert_eq!(predicted, len - 1, "{len} tokens, context {ctx}");
        assert!(w.iter().all(|r| r.len() <= ctx && r.len() >= 2));
    }
    for ctx in [0, 1] {
        assert!(matches!(
            perplexity_windows(10, ctx),
            Err(ModelError::ContextTooShort { context }) if context == ctx
        ));
    }
}

/// `max_position_embeddings: 1` spun forever in both engines' perplexity.
#[test]
fn perplexity_with_a_context_of_one_token_is_an_error_in_both_engines() {
    let tmp = with_config("llama3", "max_position_embeddings", 1.into());
    let dir = tmp.path().to_path_buf();
    let reference = within(move || {
        let model = CausalLm::load(&dir, Device::Cpu).unwrap();
        model.perplexity(&[1, 2, 3]).unwrap_err()
    });
    assert!(matches!(
        reference,
        ModelError::ContextTooShort { context: 1 }
    ));
    let dir = tmp.path().to_path_buf();
    let fast = within(move || {
        let opts = EngineOptions {
            dtype: DType::F32,
            batch: 1,
            capacity: 1,
            quant: None,
        };
        let mut engine = Engine::load(&dir, Device::Cpu, opts).unwrap();
        engine.perplexity(&[1, 2, 3]).unwrap_err()
    });
    assert!(matches!(fast, ModelError::ContextTooShort { context: 1 }));
    assert!(fast.to_string().contains("max_position_embeddings is 1"));
}

/// A config claiming far more layers than the checkpoint holds: the first missing layer's
/// tensor, named at once, through both engines, without listing or allocating the rest.
#[test]
fn a_config_claiming_a_billion_layers_fails_fast_naming_the_first_missing_tensor() {
    let cases = [
        ("llama3", "num_hidden_layers", "model.layers.2."),
        ("gpt2", "n_layer", "h.2."),
    ];
    for (name, key, first_missing) in cases {
        for layers in [1_000_000u64, 10_000_000, 1_000_000_000] {
            let tmp = with_config(name, key, layers.into());
            let dir = tmp.path().to_path_buf();
            let (reference, fast) = within(move || {
                let opts = EngineOptions {
                    dtype: DType::F32,
                    batch: 1,
                    capacity: 8,
                    quant: None,
                };
                (
                    CausalLm::load(&dir, Device::Cpu).err().unwrap(),
                    Engine::load(&dir, Device::Cpu, opts).err().unwrap(),
                )
            });
            for e in [reference, fast] {
                match e {
                    ModelError::Weights(WeightsError::MissingTensor(t)) => {
                        assert!(t.starts_with(first_missing), "{name} {layers}: {t}")
                    }
                    other => panic!("{name} {layers}: {other}"),
                }
            }
        }
    }
}

fn tiny(variant: Variant, bias: bool) -> GptConfig {
    GptConfig {
        variant,
        bias,
        n_layer: 2,
        ..GptConfig::tiny(11)
    }
}

#[test]
fn num_params_is_what_the_model_allocates() {
    for (variant, bias) in [
        (Variant::Gpt2, false),
        (Variant::Gpt2, true),
        (Variant::Llama, false),
    ] {
        let cfg = tiny(variant, bias);
        let model = Gpt::new(cfg, 0, Device::Cpu).unwrap();
        assert_eq!(cfg.num_params(), Some(model.num_params()), "{cfg:?}");
    }
}

/// `export-hf` of a `train-gpt --save` file whose metadata claims 10^9 layers (or a wider
/// model than its tensors): refused from the header, before a parameter is allocated.
#[test]
fn a_saved_gpt_whose_metadata_lies_is_refused_before_allocating() {
    let cfg = tiny(Variant::Gpt2, false);
    let model = Gpt::new(cfg, 0, Device::Cpu).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let lies = [
        (
            GptConfig {
                n_layer: 1_000_000_000,
                ..cfg
            },
            "no tensor of layer 2",
        ),
        (
            GptConfig {
                vocab_size: 1 << 40,
                ..cfg
            },
            "parameter elements",
        ),
    ];
    for (lie, says) in lies {
        let meta = HashMap::from([("config".into(), serde_json::to_string(&lie).unwrap())]);
        let path = tmp.path().join("lying.safetensors");
        std::fs::write(&path, model.store().to_safetensors(&meta).unwrap()).unwrap();
        let err = within(move || Gpt::load(&path, Device::Cpu).err().unwrap().to_string());
        assert!(err.contains(says), "{err}");
    }
}
