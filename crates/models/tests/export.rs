//! The project's GPT (`models::gpt::Gpt`) exported with `export_gpt2` (GPT-2 variant) and
//! `export_llama` (Llama variant; `export_hf` picks) and loaded back by `CausalLm` (and the
//! Llama ones by the fast `Engine` in f32): the same logits and greedy tokens as the project
//! model, the tokenizer's ids and text, and the refusals (non-empty target, the other
//! variant, ...).
//!
//! With `MODELS_EXPORT_KEEP=/some/fresh/dir` set, the exported directories stay there as
//! `<case>/` beside `<case>.json` (the prompt, its ids, our logits and greedy tokens), for
//! `scripts/hf_export_check.py <dir>/<case> PROMPT --compare <dir>/<case>.json`.
//!
//! Logit tolerance: both sides compute the same f32 functions (the same LayerNorm, erf GELU and
//! softmax ops of `tensor_ops`) and differ only in summation order: the project multiplies by
//! `[out, in]` weights and runs the fused causal attention, the export by the transposed Conv1D
//! weights and the masked-softmax attention. A dot product of K terms in f32 is within
//! γ_K·Σ|aᵢbᵢ|, γ_K ≈ K·2⁻²⁴, of the exact one; the widest here has K = 4·32 = 128
//! (γ ≈ 7.6e-6), and a logit goes through ~8 such ops a layer, 3 layers and the head (~26), the
//! norms keeping activations at their weights' scale: within 26·7.6e-6 ≈ 2e-4 of the logits'
//! scale. The bound used is `2e-4 · max|logit|`.
//!
//! The Llama variant: the same f32 functions on both sides (RMSNorm, rotate-half RoPE, SwiGLU,
//! softmax of `tensor_ops`), in other summation orders (the project's fused `c_attn` and
//! causal attention against separate q/k/v projections and the cache attention; the engine's
//! fused q/k/v and gate/up projections, its `rope_append` with the angles from `inv_freq`).
//! The widest dot product is the down projection's, K = 8/3·width rounded up to 8 (≤ 128 for
//! the shapes here, γ ≤ 7.6e-6), the op count the GPT-2 one's: the same `2e-4 · max|logit|`.
//! The RoPE angles are `pos·θ^(-2i/d)` on both sides, computed in f32 in other orders: an angle
//! of at most 32 rad (the context) is within a few ulp (~1e-5 rad), a rotation's error
//! ~1e-5 of its input, the same order as one op's summation error. A wrong layout (interleaved
//! pairs), θ, eps or q/k/v or gate/up order moves the logits by O(1) of their scale.
use std::path::{Path, PathBuf};

use models::gpt::{CharTokenizer, Dataset, Gpt, GptConfig, Variant};
use models::{export_gpt2, export_hf, export_llama, CausalLm, ExportError, Gpt2Activation};
use models::{Architecture, Engine, EngineOptions, ModelError, Sampler, Sampling};
use models::{Tokenizer, TokenizerError};
use rand::{Rng, SeedableRng};
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use tensor_ops::{DType, Device, Tensor};

#[path = "export/llama.rs"]
mod llama;

const TEXT: &str = "First Citizen:\nBefore we proceed any further, hear me speak.\n\n\
All:\nSpeak, speak.\n\nFirst Citizen:\nYou are all resolved rather to die than to famish?\n";
const PROMPT: &str = "Before we ";
const NEW_TOKENS: usize = 20;

fn config(vocab: usize, bias: bool, variant: Variant) -> GptConfig {
    GptConfig {
        variant,
        vocab_size: vocab,
        block_size: 32,
        n_layer: 3,
        n_head: 4,
        n_embd: 32,
        dropout: 0.1,
        bias,
    }
}

/// A model with every parameter drawn at random (norm weights around 1, biases around 0,
/// matrices at a scale that gives decisive logits), so a dropped or misplaced tensor shows.
fn model(bias: bool) -> (Gpt, Dataset) {
    let ds = Dataset::from_text(TEXT, 0.9).unwrap();
    let cfg = config(ds.tokenizer.vocab_size(), bias, Variant::Gpt2);
    (randomized(cfg, if bias { 14 } else { 16 }), ds)
}

/// A model of `cfg` with every parameter drawn at random from `seed` (see [`model`]).
fn randomized(cfg: GptConfig, seed: u64) -> Gpt {
    let gpt = Gpt::new(cfg, 7, Device::Cpu).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut tensors = Vec::new();
    for (name, t, _) in gpt.parameters() {
        let shape = t.shape().to_vec();
        let n: usize = shape.iter().product();
        let values: Vec<f32> = match shape.as_slice() {
            [_] if name.ends_with(".weight") => {
                (0..n).map(|_| rng.random_range(0.8..1.2)).collect()
            }
            [_] => (0..n).map(|_| rng.random_range(-0.1..0.1)).collect(),
            [_, cols] => {
                let s = 2.0 / (*cols as f32).sqrt();
                (0..n).map(|_| rng.random_range(-s..s)).collect()
            }
            _ => panic!("{name}: {shape:?}"),
        };
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        tensors.push((name, shape, bytes));
    }
    let views = tensors.iter().map(|(n, s, b)| {
        (
            n.clone(),
            TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
        )
    });
    gpt.load_weights(&safetensors::serialize(views, &None).unwrap())
        .unwrap();
    gpt
}

/// Where a case is exported: `$MODELS_EXPORT_KEEP/<case>` (kept), else a temporary directory.
fn target(case: &str) -> (Option<tempfile::TempDir>, PathBuf) {
    match std::env::var_os("MODELS_EXPORT_KEEP") {
        Some(keep) => {
            std::fs::create_dir_all(&keep).unwrap();
            (None, Path::new(&keep).join(case))
        }
        None => {
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path().join(case);
            (Some(tmp), dir)
        }
    }
}

fn gpt_logits(gpt: &Gpt, ids: &[u32]) -> Vec<f32> {
    let x = Tensor::from_vec(ids.to_vec(), &[1, ids.len()], Device::Cpu).unwrap();
    gpt.forward(&x, None).unwrap().to_vec().unwrap()
}

/// The first maximum (as `argmax` and the greedy sampler take it).
fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// The gap between the largest logit of `row` and the next.
fn margin(row: &[f32]) -> f32 {
    let mut sorted = row.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    sorted[0] - sorted[1]
}

/// The project model's `new` greedy tokens after `prompt` (its argmax over its full-context
/// forward each step, `v` logits a position) and the smallest top-2 margin of those steps.
fn project_greedy(gpt: &Gpt, prompt: &[u32], new: usize, v: usize) -> (Vec<u32>, f32) {
    let mut ctx = prompt.to_vec();
    let mut min_margin = f32::INFINITY;
    for _ in 0..new {
        let logits = gpt_logits(gpt, &ctx);
        let last = &logits[(ctx.len() - 1) * v..];
        min_margin = min_margin.min(margin(last));
        ctx.push(argmax(last));
    }
    (ctx[prompt.len()..].to_vec(), min_margin)
}

/// The loaded model's `new` greedy tokens after `prompt`.
fn causal_greedy(lm: &CausalLm, prompt: &[u32], new: usize) -> Vec<u32> {
    let mut sampler = Sampler::new(Sampling::default()).unwrap();
    lm.generate(prompt, new, &mut sampler, &[], |_| {}).unwrap()
}

fn exported_matches_project_model(bias: bool) {
    let case = if bias { "bias" } else { "nobias" };
    let (gpt, ds) = model(bias);
    let (_tmp, dir) = target(case);
    export_gpt2(&gpt, &ds.tokenizer, &dir).unwrap();

    let lm = CausalLm::load(&dir, Device::Cpu).unwrap();
    let cfg = lm.config();
    assert_eq!(cfg.gpt2_activation, Some(Gpt2Activation::GeluErf));
    assert_eq!(cfg.intermediate_size, gpt.config.mlp_hidden());
    assert_eq!(cfg.norm_eps, 1e-5);
    assert!(cfg.tie_word_embeddings);

    // Logits of the prompt.
    let v = gpt.config.vocab_size;
    let prompt = ds.tokenizer.encode(PROMPT).unwrap();
    let want = gpt_logits(&gpt, &prompt);
    let got = lm
        .forward(&prompt, 1, &mut lm.new_cache())
        .unwrap()
        .to_vec()
        .unwrap();
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    let tol = 2e-4 * scale;
    let err = max_abs_diff(&got, &want);
    eprintln!("{case}: max |logit| {scale:.4}, max |diff| {err:.3e}, bound {tol:.3e}");
    assert!(err <= tol, "{case}: logits differ by {err} > {tol}");

    // Greedy decoding: the project model's argmax over its full-context forward each step.
    let (ours, min_margin) = project_greedy(&gpt, &prompt, NEW_TOKENS, v);
    let exported = causal_greedy(&lm, &prompt, NEW_TOKENS);
    eprintln!("{case}: greedy {exported:?}, smallest top-2 margin {min_margin:.3e}");
    assert_eq!(exported, ours, "{case}: greedy tokens");
    // The comparison is decisive: no step is a near tie within the logits' tolerance.
    assert!(min_margin > 10.0 * tol, "{case}: margin {min_margin}");

    // The tokenizer gives the project's ids and the text back; an unknown character is refused.
    let tok = Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(tok.vocab_size(), v);
    let ids = tok.encode(TEXT, false).unwrap();
    assert_eq!(ids, ds.tokenizer.encode(TEXT).unwrap());
    assert_eq!(tok.decode(&ids, false).unwrap(), TEXT);
    assert_eq!(
        tok.encode(PROMPT, true).unwrap(),
        prompt,
        "no special tokens"
    );
    let text = ds.tokenizer.decode(&exported).unwrap();
    assert_eq!(tok.decode(&exported, false).unwrap(), text);
    for unknown in ["Before Q", "€", "tab\there"] {
        assert!(
            ds.tokenizer.encode(unknown).is_err(),
            "{unknown:?} is in the vocabulary"
        );
        let r = tok.encode(unknown, false);
        assert!(
            matches!(r, Err(TokenizerError::Encode(_))),
            "{unknown:?}: {r:?}"
        );
    }

    if std::env::var_os("MODELS_EXPORT_KEEP").is_some() {
        let record = serde_json::json!({
            "prompt": PROMPT,
            "prompt_ids": prompt,
            "greedy": exported,
            "text": text,
            "logits_shape": [prompt.len(), v],
            "logits": got,
        });
        let path = dir.with_extension("json");
        std::fs::write(&path, record.to_string()).unwrap();
        eprintln!("kept {} and {}", dir.display(), path.display());
    }
}

#[test]
fn exported_without_biases_matches_the_project_model() {
    exported_matches_project_model(false);
}

#[test]
fn exported_with_biases_matches_the_project_model() {
    exported_matches_project_model(true);
}

/// A fresh temporary directory and the export target `out` inside it (not created).
fn scratch_target() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("out");
    (tmp, dir)
}

/// The entries of `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_non_empty_target_is_refused_and_left_untouched() {
    let (gpt, ds) = model(false);
    let (tmp, dir) = scratch_target();
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("config.json"), "mine").unwrap();
    match export_gpt2(&gpt, &ds.tokenizer, &dir) {
        Err(ModelError::Export(ExportError::DirNotEmpty(p))) => assert_eq!(p, dir),
        other => panic!("{other:?}"),
    }
    assert_eq!(listing(&dir), ["config.json"]);
    assert_eq!(
        std::fs::read_to_string(dir.join("config.json")).unwrap(),
        "mine"
    );
    // A file in the way is refused too; nothing is left beside either (no staging directory).
    let file = tmp.path().join("file");
    std::fs::write(&file, "x").unwrap();
    let r = export_gpt2(&gpt, &ds.tokenizer, &file);
    assert!(
        matches!(r, Err(ModelError::Export(ExportError::NotADirectory(_)))),
        "{r:?}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "x");
    assert_eq!(listing(tmp.path()), ["file", "out"]);
}

#[test]
fn an_empty_existing_target_is_filled() {
    let (gpt, ds) = model(true);
    let (tmp, dir) = scratch_target();
    std::fs::create_dir(&dir).unwrap();
    export_gpt2(&gpt, &ds.tokenizer, &dir).unwrap();
    let want = [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ];
    assert_eq!(listing(&dir), want);
    assert_eq!(listing(tmp.path()), ["out"]);
}

#[test]
fn the_other_variant_a_foreign_tokenizer_and_a_missing_parent_are_refused() {
    let ds = Dataset::from_text(TEXT, 0.9).unwrap();
    let vocab = ds.tokenizer.vocab_size();
    let (tmp, dir) = scratch_target();

    let llama = Gpt::new(config(vocab, false, Variant::Llama), 1, Device::Cpu).unwrap();
    let gpt2 = Gpt::new(config(vocab, false, Variant::Gpt2), 1, Device::Cpu).unwrap();
    type Export = fn(&Gpt, &CharTokenizer, &Path) -> Result<(), ModelError>;
    let crossed: [(&Gpt, Export, Variant); 2] = [
        (&llama, export_gpt2, Variant::Llama),
        (&gpt2, export_llama, Variant::Gpt2),
    ];
    for (model, export, variant) in crossed {
        let r = export(model, &ds.tokenizer, &dir);
        assert!(
            matches!(
                r,
                Err(ModelError::Export(ExportError::UnsupportedVariant(v))) if v == variant
            ),
            "{r:?}"
        );
    }
    let r = export_llama(&llama, &other_tokenizer(), &dir);
    assert!(
        matches!(
            r,
            Err(ModelError::Export(ExportError::VocabMismatch { .. }))
        ),
        "{r:?}"
    );

    let other = Dataset::from_text("abc abc abc abc abc", 0.9).unwrap();
    let gpt = Gpt::new(config(vocab, true, Variant::Gpt2), 1, Device::Cpu).unwrap();
    let r = export_gpt2(&gpt, &other.tokenizer, &dir);
    match r {
        Err(ModelError::Export(ExportError::VocabMismatch { model, tokenizer })) => {
            assert_eq!((model, tokenizer), (vocab, other.tokenizer.vocab_size()))
        }
        other => panic!("{other:?}"),
    }

    let r = export_gpt2(&gpt, &ds.tokenizer, &tmp.path().join("missing/out"));
    assert!(
        matches!(r, Err(ModelError::Export(ExportError::Io { .. }))),
        "{r:?}"
    );
    assert!(listing(tmp.path()).is_empty(), "{:?}", listing(tmp.path()));
}

/// `activation_function` is read and applied: the exported `"gelu"` (erf) matches the project
/// model, the same weights under `"gelu_new"` (tanh) do not (GELU's two forms differ by up to
/// ~5e-4 per activation, far above the ~1e-6 the summation order gives).
#[test]
fn the_configured_activation_is_applied() {
    let (gpt, ds) = model(true);
    let (_tmp, dir) = scratch_target();
    export_gpt2(&gpt, &ds.tokenizer, &dir).unwrap();
    let prompt = ds.tokenizer.encode(PROMPT).unwrap();
    let want = gpt_logits(&gpt, &prompt);
    let diff = |dir: &Path| {
        let lm = CausalLm::load(dir, Device::Cpu).unwrap();
        let got = lm.forward(&prompt, 1, &mut lm.new_cache()).unwrap();
        let got = got.to_vec().unwrap();
        got.iter()
            .zip(&want)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
    };
    let erf = diff(&dir);
    let path = dir.join("config.json");
    let config = std::fs::read_to_string(&path).unwrap();
    let tanh = config.replace("\"gelu\"", "\"gelu_new\"");
    assert_ne!(config, tanh);
    std::fs::write(&path, tanh).unwrap();
    let tanh = diff(&dir);
    eprintln!("max |diff| to the project model: erf {erf:.3e}, tanh {tanh:.3e}");
    assert!(erf < 1e-5 && tanh > 1e-4, "erf {erf}, tanh {tanh}");
}

fn other_tokenizer() -> CharTokenizer {
    Dataset::from_text("abc abc abc abc abc", 0.9)
        .unwrap()
        .tokenizer
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}
