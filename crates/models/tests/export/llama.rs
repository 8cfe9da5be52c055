//! The Llama variant exported (through `export_hf`) and loaded by `CausalLm` and by the f32
//! `Engine`, and the check that each of its conventions (RoPE's layout and base, the RMSNorm
//! epsilon, the q/k and gate/up orders) matters; the bound is the parent file's.

use super::*;

/// Llama-variant shapes: (width, heads, layers, context, seed). Head widths 8, 24 and 16;
/// MLP widths 88, 128 and 176.
const LLAMA_SHAPES: [(usize, usize, usize, usize, u64); 3] =
    [(32, 4, 3, 32, 21), (48, 2, 2, 24, 22), (64, 4, 1, 40, 23)];

fn llama_model(shape: (usize, usize, usize, usize, u64)) -> (Gpt, Dataset) {
    let (n_embd, n_head, n_layer, block_size, seed) = shape;
    let ds = Dataset::from_text(TEXT, 0.9).unwrap();
    let cfg = GptConfig {
        variant: Variant::Llama,
        vocab_size: ds.tokenizer.vocab_size(),
        block_size,
        n_layer,
        n_head,
        n_embd,
        dropout: 0.1,
        bias: false,
    };
    (randomized(cfg, seed), ds)
}

/// The Llama variant exported (through `export_hf`) and loaded by `CausalLm` and by the f32
/// `Engine`: the config's conventions, the prompt's logits within `2e-4 · max|logit|` of
/// `Gpt::forward`, the same greedy tokens from both, and the tokenizer's round trip.
#[test]
fn exported_llama_variant_matches_the_project_model() {
    for shape in LLAMA_SHAPES {
        let (gpt, ds) = llama_model(shape);
        let gc = gpt.config;
        let case = format!("llama-{}x{}-{}h", gc.n_layer, gc.n_embd, gc.n_head);
        let (_tmp, dir) = target(&case);
        export_hf(&gpt, &ds.tokenizer, &dir).unwrap();

        let lm = CausalLm::load(&dir, Device::Cpu).unwrap();
        let cfg = lm.config();
        assert_eq!(cfg.architecture, Architecture::Llama);
        assert_eq!(
            (
                cfg.hidden_size,
                cfg.num_layers,
                cfg.num_heads,
                cfg.num_kv_heads
            ),
            (gc.n_embd, gc.n_layer, gc.n_head, gc.n_head)
        );
        assert_eq!(cfg.head_dim, gc.n_embd / gc.n_head);
        assert_eq!(cfg.intermediate_size, gc.mlp_hidden());
        assert_eq!(cfg.max_position_embeddings, gc.block_size);
        assert_eq!(cfg.vocab_size, gc.vocab_size);
        assert_eq!(cfg.norm_eps, 1e-5);
        assert_eq!(cfg.rope_theta, Some(10_000.0));
        assert!(cfg.rope_scaling.is_none());
        assert!(!cfg.tie_word_embeddings && !cfg.attention_bias);

        // The whole context, so every RoPE angle is exercised.
        let v = gc.vocab_size;
        let ids = ds.tokenizer.encode(&TEXT[..gc.block_size]).unwrap();
        let want = gpt_logits(&gpt, &ids);
        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        let tol = 2e-4 * scale;
        let got = lm.forward(&ids, 1, &mut lm.new_cache()).unwrap();
        let err = max_abs_diff(&got.to_vec().unwrap(), &want);
        let opts = EngineOptions {
            dtype: DType::F32,
            batch: 1,
            capacity: gc.block_size,
            quant: None,
        };
        let mut engine = Engine::load(&dir, Device::Cpu, opts).unwrap();
        let e_logits = engine.prefill(std::slice::from_ref(&ids), true).unwrap();
        let e_err = max_abs_diff(&e_logits.to_vec().unwrap(), &want);
        eprintln!(
            "{case}: max |logit| {scale:.4}, max |diff| CausalLm {err:.3e}, Engine {e_err:.3e}, \
             bound {tol:.3e}"
        );
        assert!(
            err <= tol,
            "{case}: CausalLm logits differ by {err} > {tol}"
        );
        assert!(
            e_err <= tol,
            "{case}: Engine logits differ by {e_err} > {tol}"
        );

        // Greedy decoding to the end of the context: the project model's argmax over its
        // full-context forward each step, against both loaders.
        let prompt = ds.tokenizer.encode(PROMPT).unwrap();
        let new = gc.block_size - prompt.len();
        let (ours, min_margin) = project_greedy(&gpt, &prompt, new, v);
        let exported = causal_greedy(&lm, &prompt, new);
        assert_eq!(exported, ours, "{case}: CausalLm greedy tokens");
        let fast = engine
            .generate_greedy(std::slice::from_ref(&prompt), new, &[], |_| {})
            .unwrap();
        assert_eq!(fast[0], ours, "{case}: Engine greedy tokens");
        eprintln!("{case}: {new} greedy tokens equal, smallest top-2 margin {min_margin:.3e}");
        assert!(min_margin > 10.0 * tol, "{case}: margin {min_margin}");

        let tok = models::Tokenizer::from_dir(&dir).unwrap();
        let text_ids = tok.encode(TEXT, false).unwrap();
        assert_eq!(text_ids, ds.tokenizer.encode(TEXT).unwrap());
        assert_eq!(tok.decode(&text_ids, false).unwrap(), TEXT);

        if std::env::var_os("MODELS_EXPORT_KEEP").is_some() {
            let got = lm.forward(&prompt, 1, &mut lm.new_cache()).unwrap();
            let record = serde_json::json!({
                "prompt": PROMPT,
                "prompt_ids": prompt,
                "greedy": exported[..NEW_TOKENS.min(new)],
                "text": ds.tokenizer.decode(&exported[..NEW_TOKENS.min(new)]).unwrap(),
                "logits_shape": [prompt.len(), v],
                "logits": got.to_vec().unwrap(),
            });
            std::fs::write(dir.with_extension("json"), record.to_string()).unwrap();
        }
    }
}

/// The exported conventions are the ones that match: each of RoPE's pair layout (interleaved
/// instead of rotate-half, i.e. q/k rows permuted as HF's convert script does for Meta's
/// checkpoints), its base, the RMSNorm epsilon, q and k swapped and gate and up swapped moves
/// the logits far outside the bound.
#[test]
fn every_llama_convention_matters() {
    let (gpt, ds) = llama_model(LLAMA_SHAPES[0]);
    let (_tmp, dir) = scratch_target();
    export_llama(&gpt, &ds.tokenizer, &dir).unwrap();
    let ids = ds.tokenizer.encode(&TEXT[..gpt.config.block_size]).unwrap();
    let want = gpt_logits(&gpt, &ids);
    let tol = 2e-4 * want.iter().fold(0f32, |m, x| m.max(x.abs()));
    let diff = |dir: &Path| {
        let lm = CausalLm::load(dir, Device::Cpu).unwrap();
        let got = lm.forward(&ids, 1, &mut lm.new_cache()).unwrap();
        max_abs_diff(&got.to_vec().unwrap(), &want)
    };
    assert!(diff(&dir) <= tol);

    let cfg_path = dir.join("config.json");
    let config = std::fs::read_to_string(&cfg_path).unwrap();
    for (from, to) in [
        ("\"rope_theta\": 10000.0", "\"rope_theta\": 500000.0"),
        ("\"rms_norm_eps\": 0.00001", "\"rms_norm_eps\": 0.1"),
    ] {
        let edited = config.replace(from, to);
        assert_ne!(edited, config, "{from}");
        std::fs::write(&cfg_path, edited).unwrap();
        let d = diff(&dir);
        eprintln!("{to}: max |diff| {d:.3e} (bound {tol:.3e})");
        assert!(d > 10.0 * tol, "{to}: {d}");
    }
    std::fs::write(&cfg_path, &config).unwrap();

    // Tensors edited in place: rows of q and k permuted to the interleaved layout; q ↔ k;
    // gate ↔ up.
    let st_path = dir.join("model.safetensors");
    let bytes = std::fs::read(&st_path).unwrap();
    let hd = gpt.config.n_embd / gpt.config.n_head;
    let interleave = |name: &str, v: Vec<f32>, cols: usize| -> Vec<f32> {
        if !(name.ends_with("q_proj.weight") || name.ends_with("k_proj.weight")) {
            return v;
        }
        // HF's convert permute: row j·2 + s of a head ← row s·d/2 + j.
        let mut out = v.clone();
        for h in 0..v.len() / cols / hd {
            for j in 0..hd / 2 {
                for s in 0..2 {
                    let (to, from) = (h * hd + 2 * j + s, h * hd + s * hd / 2 + j);
                    out[to * cols..(to + 1) * cols]
                        .copy_from_slice(&v[from * cols..(from + 1) * cols]);
                }
            }
        }
        out
    };
    let swap = |a: &'static str, b: &'static str| {
        move |name: &str| {
            if name.ends_with(a) {
                name.replace(a, b)
            } else if name.ends_with(b) {
                name.replace(b, a)
            } else {
                name.to_string()
            }
        }
    };
    type Rename = Box<dyn Fn(&str) -> String>;
    let cases: Vec<(&str, Rename, bool)> = vec![
        (
            "interleaved RoPE rows",
            Box::new(|n: &str| n.to_string()),
            true,
        ),
        (
            "q and k swapped",
            Box::new(swap("q_proj.weight", "k_proj.weight")),
            false,
        ),
        (
            "gate and up swapped",
            Box::new(swap("gate_proj.weight", "up_proj.weight")),
            false,
        ),
    ];
    for (what, rename, permute) in cases {
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut tensors = Vec::new();
        for (name, view) in st.tensors() {
            let v: Vec<f32> = view
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            let shape = view.shape().to_vec();
            let v = if permute {
                interleave(&name, v, shape[shape.len() - 1])
            } else {
                v
            };
            let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            tensors.push((rename(&name), shape, b));
        }
        let views = tensors.iter().map(|(n, s, b)| {
            (
                n.clone(),
                TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
            )
        });
        std::fs::write(&st_path, safetensors::serialize(views, &None).unwrap()).unwrap();
        let d = diff(&dir);
        eprintln!("{what}: max |diff| {d:.3e} (bound {tol:.3e})");
        assert!(d > 10.0 * tol, "{what}: {d}");
    }
}
