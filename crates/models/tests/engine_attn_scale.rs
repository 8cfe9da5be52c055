//! GPT-2's attention-scale fields (`scale_attn_weights`, `scale_attn_by_inverse_layer_idx`) in
//! the reference `CausalLm` and the fast `Engine` (CPU here; the CUDA runs share the code path
//! above `DecodeOps`, whose scale argument the GPU tests cover).
//!
//! The check is an identity, with no `transformers` run: a model whose config sets
//! `scale_attn_weights: false` and `scale_attn_by_inverse_layer_idx: true` (scores of layer `l`
//! are `q·k / (l + 1)`) equals the default-config model (scores `q·k / √d`) whose query
//! projections (weights and biases, the first `n_embd` columns of `c_attn`) of layer `l` are
//! scaled by `√d / (l + 1)`. Bound: `3e-4 · max|logit|`, the f32 bound of `parity.rs` (the
//! same f32 functions, the scale applied at another point of the same products).

mod hf_fixture;

use hf_fixture::{dir, expected, max_err, rewrite_checkpoint};
use models::{CausalLm, Engine, EngineOptions};
use tensor_ops::{DType, Device};

/// A copy of the gpt2 fixture with `config` fields set and each layer's query projection
/// multiplied by `q_factor(layer)`.
fn gpt2_copy(fields: &[(&str, bool)], q_factor: &dyn Fn(usize) -> f32) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let src = dir("gpt2");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    for (k, v) in fields {
        cfg[*k] = (*v).into();
    }
    let n_embd = cfg["n_embd"].as_u64().unwrap() as usize;
    std::fs::write(tmp.path().join("config.json"), cfg.to_string()).unwrap();
    rewrite_checkpoint(&src, tmp.path(), |name, v| {
        // transformer.h.{l}.attn.c_attn.{weight [n_embd, 3 n_embd], bias [3 n_embd]}
        let layer = name
            .strip_prefix("transformer.h.")
            .and_then(|r| r.split('.').next())
            .and_then(|l| l.parse::<usize>().ok());
        let k = match layer {
            Some(l) if name.contains("attn.c_attn.") => q_factor(l),
            _ => 1.0,
        };
        let cols = *v.shape().last().unwrap();
        v.data()
            .chunks_exact(4)
            .enumerate()
            .flat_map(|(i, c)| {
                let x = f32::from_le_bytes(c.try_into().unwrap());
                let f = if i % cols < n_embd { k } else { 1.0 };
                (f * x).to_le_bytes()
            })
            .collect()
    });
    tmp
}

fn reference_logits(dir: &std::path::Path, ids: &[u32]) -> Vec<f32> {
    let m = CausalLm::load(dir, Device::Cpu).unwrap();
    m.forward(ids, 1, &mut m.new_cache())
        .unwrap()
        .to_vec()
        .unwrap()
}

fn engine_logits(dir: &std::path::Path, ids: &[u32]) -> Vec<f32> {
    let opts = EngineOptions {
        dtype: DType::F32,
        batch: 1,
        capacity: 40,
        quant: None,
    };
    let mut e = Engine::load(dir, Device::Cpu, opts).unwrap();
    let l = e.prefill(&[ids.to_vec()], true).unwrap();
    l.to_vec().unwrap()
}

#[test]
fn gpt2_attention_scale_fields_match_rescaled_queries() {
    let exp = expected("gpt2");
    let cfg = models::ModelConfig::from_dir(&dir("gpt2")).unwrap();
    let sqrt_d = (cfg.head_dim as f32).sqrt();
    let fields = [
        ("scale_attn_weights", false),
        ("scale_attn_by_inverse_layer_idx", true),
    ];
    let flagged = gpt2_copy(&fields, &|_| 1.0);
    let rescaled = gpt2_copy(&[], &|l| sqrt_d / (l + 1) as f32);
    let want = reference_logits(rescaled.path(), &exp.ids);
    // The flags matter: the fixture's own logits are far from the rescaled model's.
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = exp
        .logits
        .iter()
        .zip(&want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(d > 3e-3 * scale, "the rescaling changes little: {d:e}");
    let got = reference_logits(flagged.path(), &exp.ids);
    let err = max_err("reference with the flags", &got, &want, 3e-4);
    eprintln!("reference: max |diff| {err:e} (the fixture's: {d:e})");
    let got = engine_logits(flagged.path(), &exp.ids);
    let err = max_err("engine with the flags", &got, &want, 3e-4);
    eprintln!("engine: max |diff| {err:e}");
}
