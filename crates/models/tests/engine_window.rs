//! Sliding-window attention (Mistral's `sliding_window`; Qwen2's `use_sliding_window` with
//! `layer_types`) in the reference `CausalLm` and the fast `Engine` on the CPU, with windows
//! shorter than the 12-token prompt: copies of the mistral and qwen2 fixtures with the window
//! set in `config.json` (the weights unchanged). `transformers`' numbers for such models are the
//! `mistral-sw` and `qwen2-sw` fixtures (`scripts/hf_fixtures.py`), checked in `engine.rs` and
//! `parity.rs` once generated.
//!
//! Bound: `3e-4 · max|logit|`, the f32 bound of `parity.rs` (the same f32 functions in other
//! summation orders); the windowed logits are checked to be farther than `3e-3 · max|logit|`
//! from the full-attention model's, so an engine that ignored the window would fail.

mod hf_fixture;

use hf_fixture::{dir, engine_greedy, expected, forward_logits, max_err, reference_greedy};
use models::{CausalLm, Engine, EngineOptions};
use serde_json::{json, Value};
use tensor_ops::{DType, Device};

/// A copy of fixture `name` with `fields` set in its config.
fn variant(name: &str, fields: &[(&str, Value)]) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let src = dir(name);
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    for (k, v) in fields {
        cfg[*k] = v.clone();
    }
    std::fs::write(tmp.path().join("config.json"), cfg.to_string()).unwrap();
    let weights = "model.safetensors";
    std::fs::copy(src.join(weights), tmp.path().join(weights)).unwrap();
    tmp
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

/// The reference and the engine agree on the windowed model in `dir` (fixture `name`'s
/// weights): prompt logits, 16 greedy tokens (decode steps past the window), and a batch with
/// a left-padded row.
fn engines_agree(name: &str, dir: &std::path::Path) {
    let exp = expected(name);
    let reference = CausalLm::load(dir, Device::Cpu).unwrap();
    let want = forward_logits(&reference, &exp.ids);
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let full = max_abs_diff(&want, &exp.logits);
    eprintln!("{name} windowed: {full:e} from the full-attention logits (scale {scale})");
    assert!(full > 3e-3 * scale, "{name}: the window changes little");
    let opts = |batch| EngineOptions {
        dtype: DType::F32,
        batch,
        capacity: 40,
        quant: None,
    };
    let mut e = Engine::load(dir, Device::Cpu, opts(1)).unwrap();
    let got = e.prefill(std::slice::from_ref(&exp.ids), true).unwrap();
    let err = max_err(name, &got.to_vec().unwrap(), &want, 3e-4);
    eprintln!("{name} windowed: engine prompt logits max |diff| {err:e}");
    let new = 16;
    let want_toks = reference_greedy(&reference, &exp.ids, new);
    assert_eq!(
        engine_greedy(&mut e, &exp.ids, new),
        want_toks,
        "{name}: greedy tokens"
    );
    // A batch: the second row left-padded by 3 slots.
    let prompts = vec![exp.ids.clone(), exp.ids[3..].to_vec()];
    let mut e = Engine::load(dir, Device::Cpu, opts(2)).unwrap();
    let last = e.prefill(&prompts, false).unwrap().to_vec().unwrap();
    let vocab = e.config().vocab_size;
    let toks = e.generate_greedy(&prompts, new, &[], |_| {}).unwrap();
    for (r, p) in prompts.iter().enumerate() {
        let want = forward_logits(&reference, p);
        let what = format!("{name} batch row {r}");
        max_err(
            &what,
            &last[r * vocab..(r + 1) * vocab],
            &want[(p.len() - 1) * vocab..],
            3e-4,
        );
        let want_toks = reference_greedy(&reference, p, new);
        assert_eq!(toks[r], want_toks, "{what}: greedy tokens");
    }
}

#[test]
fn mistral_sliding_window_engines_agree() {
    let tmp = variant("mistral", &[("sliding_window", json!(5))]);
    let cfg = models::ModelConfig::from_dir(tmp.path()).unwrap();
    assert!(cfg
        .layer_windows
        .first(cfg.num_layers)
        .iter()
        .all(|w| *w == Some(5)));
    engines_agree("mistral", tmp.path());
}

#[test]
fn qwen2_sliding_layers_engines_agree() {
    let fields = [
        ("use_sliding_window", json!(true)),
        ("sliding_window", json!(4)),
        ("max_window_layers", json!(1)),
        (
            "layer_types",
            json!(["full_attention", "sliding_attention"]),
        ),
    ];
    let tmp = variant("qwen2", &fields);
    let cfg = models::ModelConfig::from_dir(tmp.path()).unwrap();
    assert_eq!(cfg.layer_windows.first(cfg.num_layers), [None, Some(4)]);
    engines_agree("qwen2", tmp.path());
}
