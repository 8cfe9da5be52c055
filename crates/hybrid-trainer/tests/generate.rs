//! `hybrid-trainer generate` as a user runs it, on the committed tiny checkpoints of
//! `crates/models/tests/fixtures/hf` (random weights, a character tokenizer of their 96 ids):
//! greedy text equal to `transformers`' greedy tokens, streamed to stdout; bad settings and
//! directories are clear errors.

mod common;

use std::path::PathBuf;

use common::{cli_err, cli_ok, fixture, generate_args, prompt_and_greedy_text};

/// A fresh temp directory holding `text.txt` (a line of Hamlet, 40 times); the directory and
/// the paths of `text.txt`, of `model` and of `hf` in it.
fn hamlet_dir(model: &str) -> (tempfile::TempDir, String, String, String) {
    let tmp = tempfile::tempdir().unwrap();
    let path = |f: &str| tmp.path().join(f).display().to_string();
    let (data, saved, hf) = (path("text.txt"), path(model), path("hf"));
    std::fs::write(
        &data,
        "To be, or not to be, that is the question:\n".repeat(40),
    )
    .unwrap();
    (tmp, data, saved, hf)
}

/// Trains a 2-layer GPT on the CPU on `data` for `iters` steps (evaluated once, at the end;
/// `extra` flags such as `--variant`) and saves it to `saved`.
fn train_tiny_gpt(data: &str, saved: &str, iters: &str, extra: &[&str]) {
    let args = [
        "--device",
        "cpu",
        "train-gpt",
        "--data",
        data,
        "--layers",
        "2",
        "--heads",
        "2",
        "--embd",
        "32",
        "--block",
        "32",
        "--batch",
        "4",
        "--iters",
        iters,
        "--warmup",
        "5",
        "--lr",
        "3e-3",
        "--dropout",
        "0",
        "--eval-interval",
        iters,
        "--eval-iters",
        "2",
        "--sample",
        "0",
        "--save",
        saved,
    ];
    cli_ok(args.iter().chain(extra));
}

/// `export-hf` of the model saved at `saved` (its tokenizer from `data`) into `hf`.
fn export_hf_args<'a>(saved: &'a str, data: &'a str, hf: &'a str) -> [&'a str; 7] {
    ["export-hf", "--model", saved, "--data", data, "--out", hf]
}

#[test]
fn greedy_generation_prints_transformers_tokens() {
    for name in ["llama3", "qwen2", "gpt2"] {
        let (d, text, want) = prompt_and_greedy_text(name);
        let base = generate_args("cpu", &d, &text, "16");
        let (stdout, stderr) = cli_ok(base.iter().chain(&["--ignore-eos"]));
        assert!(
            stdout.ends_with(&format!("{want}\n")),
            "{name}: {stdout:?} does not end with {want:?}"
        );
        assert!(stderr.contains("16 new tokens"), "{name}: {stderr}");
    }
}

/// `--engine fast` (f32) streams the same greedy text as transformers, and the same text when
/// it samples with top-k 1; a seeded draw replays; with `--quant` it prints the reference's
/// text.
#[test]
fn the_fast_engine_prints_transformers_tokens() {
    for name in ["llama3", "qwen2", "gpt2"] {
        let (d, text, want) = prompt_and_greedy_text(name);
        let base = generate_args("cpu", &d, &text, "16");
        let fast = ["--ignore-eos", "--engine", "fast", "--dtype", "f32"];
        let args: Vec<&str> = base.iter().chain(&fast).copied().collect();
        let sample_k1 = ["--temperature", "0.7", "--top-k", "1"];
        for extra in [&[][..], &sample_k1[..]] {
            let (stdout, stderr) = cli_ok(args.iter().chain(extra));
            assert!(
                stdout.ends_with(&format!("{want}\n")),
                "{name} {extra:?}: {stdout:?} does not end with {want:?}"
            );
            assert!(stderr.contains("16 new tokens"), "{name}: {stderr}");
        }
        let seeded = ["--temperature", "1.5", "--top-p", "0.9", "--seed", "5"];
        let once = cli_ok(args.iter().chain(&seeded)).0;
        assert_eq!(
            once,
            cli_ok(args.iter().chain(&seeded)).0,
            "{name}: a seed replays"
        );
    }
    // Quantized projections: the fast engine (kept quantized) prints the reference's text
    // (computed from the dequantized weights).
    for (name, q) in [
        ("llama3", "int8"),
        ("llama3", "int4"),
        ("gpt2", "int8"),
        ("gpt2", "int4"),
    ] {
        let d = fixture(name).display().to_string();
        let base: Vec<&str> = generate_args("cpu", &d, "hello", "12")
            .iter()
            .chain(&["--ignore-eos", "--quant", q])
            .copied()
            .collect();
        let fast = ["--engine", "fast", "--dtype", "f32"];
        let want = cli_ok(&base).0;
        assert_eq!(
            cli_ok(base.iter().chain(&fast)).0,
            want,
            "{name} --quant {q}"
        );
    }
}

#[test]
fn bad_generate_calls_are_clear_errors() {
    let d = fixture("llama3").display().to_string();
    let long = "a".repeat(80); // the context is 64
    let empty = tempfile::tempdir().unwrap();
    let e = empty.path().display().to_string();
    let cases: [(&[&str], &str); 7] = [
        (
            &["--model", &d, "--prompt", "hi", "--temperature=-1"],
            "temperature",
        ),
        (&["--model", &d, "--prompt", "hi", "--top-p", "0"], "top-p"),
        (&["--model", &d, "--prompt", "hi", "--top-k", "0"], "top-k"),
        (&["--model", &d, "--prompt", &long], "context"),
        (
            &["--model", &d, "--prompt", "hi", "--max-new-tokens", "100"],
            "context",
        ),
        (&["--model", &e, "--prompt", "hi"], "tokenizer"),
        (
            &["--model", &d, "--prompt", "hi", "--temperature", "hot"],
            "invalid value",
        ),
    ];
    for (args, says) in cases {
        let err = cli_err(["--device", "cpu", "generate"].iter().chain(args));
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

#[test]
fn perplexity_and_quantized_runs_from_the_cli() {
    let d = fixture("gpt2").display().to_string();
    let tmp = tempfile::tempdir().unwrap();
    let text = tmp.path().join("text.txt");
    std::fs::write(
        &text,
        "To be, or not to be, that is the question.\n".repeat(4),
    )
    .unwrap();
    let t = text.display().to_string();
    let base = perplexity_args(&d, &t);
    let ppl = |extra: &[&str]| perplexity_of(&d, &t, extra);
    let (full, int8, int4) = (
        ppl(&[]),
        ppl(&["--quant", "int8"]),
        ppl(&["--quant", "int4"]),
    );
    // Random weights: about the vocabulary's 96, and the formats move it.
    assert!(full > 10.0 && full.is_finite(), "{full}");
    assert!(int8 != full && int4 != full, "{full} {int8} {int4}");
    cli_ok(
        generate_args("cpu", &d, "To be", "4")
            .iter()
            .chain(&["--quant", "int4"]),
    );
    for bad in [["--quant", "int9"], ["--max-tokens", "x"]] {
        let err = cli_err(base.iter().chain(&bad));
        assert!(err.contains("invalid value"), "{bad:?}: {err}");
    }
    let err = cli_err(perplexity_args(&d, "/nonexistent/t.txt"));
    assert!(err.contains("/nonexistent/t.txt does not exist"), "{err}");
}

#[test]
fn a_trained_gpt_exports_and_generates() {
    let (tmp, data, saved, hf) = hamlet_dir("gpt.safetensors");
    train_tiny_gpt(&data, &saved, "60", &[]);
    let export = export_hf_args(&saved, &data, &hf);
    let (out, _) = cli_ok(export);
    assert!(out.contains("wrote"), "{out}");
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert!(tmp.path().join("hf").join(f).is_file(), "{f}");
    }
    let (_, err) = cli_ok(generate_args("cpu", &hf, "To be, or not to", "8"));
    assert!(err.contains("8 new tokens"), "{err}");
    // Exporting again into the now non-empty directory is refused.
    let err = cli_err(export);
    assert!(
        err.contains("not empty") || err.contains("non-empty"),
        "{err}"
    );
}

#[test]
fn several_prompts_decode_as_one_batch_with_each_rows_own_text() {
    let d = fixture("qwen2").display().to_string();
    let gen = [
        "--device",
        "cpu",
        "generate",
        "--model",
        &d,
        "--max-new-tokens",
        "10",
        "--ignore-eos",
    ];
    let single = |p: &str| -> String {
        let (stdout, _) = cli_ok(gen.iter().chain(&["--prompt", p]));
        // Device lines come first: the text is the output from the prompt on.
        let at = stdout.find(p).unwrap();
        stdout[at..].trim_end_matches('\n').to_string()
    };
    let prompts = ["Hello there", "Hi"];
    let (stdout, _) = cli_ok(
        gen.iter()
            .chain(&["--prompt", prompts[0], "--prompt", prompts[1]]),
    );
    for (i, p) in prompts.iter().enumerate() {
        let want = format!("[{i}] {}", single(p));
        assert!(stdout.contains(&want), "row {i}: {stdout:?} lacks {want:?}");
    }
}

/// A Llama-variant GPT trained here, exported (`export-hf` picks `LlamaForCausalLM`) and
/// scored by `perplexity` through both engines: the fast engine in f32 (the log-softmax in f64
/// on the host) gives the reference's perplexity, plain and with int8 projections. Bound: the
/// two compute the same f32 functions in other summation orders (logits within 6e-4 of their
/// scale of each other, `models/tests/engine_perplexity.rs`), so `ln ppl` within
/// 2·6e-4·max|logit|; with logits up to 12 (the largest of the 1500-step tinyshakespeare model
/// of docs/inference.md; 40 steps here give smaller ones) that is 1.5e-2, and the printed
/// figures' 4 decimals add ~1e-4 (measured: equal to the last digit). bf16 rounds every
/// matmul's operands (≈ 0.07 of the logits' scale at worst, which bounds nothing here), so it
/// is only required to be close (10%). GPT-2 (the committed fixture, random weights, on the
/// same text) scores the same through both engines, within the same bound.
#[test]
fn a_trained_llama_variant_exports_and_the_fast_engine_scores_it() {
    let (tmp, data, saved, hf) = hamlet_dir("llama.safetensors");
    train_tiny_gpt(&data, &saved, "40", &["--variant", "llama"]);
    let (out, _) = cli_ok(export_hf_args(&saved, &data, &hf));
    assert!(out.contains("Llama variant"), "{out}");
    let config = std::fs::read_to_string(tmp.path().join("hf/config.json")).unwrap();
    assert!(config.contains("LlamaForCausalLM"), "{config}");
    let ppl = |extra: &[&str]| perplexity_of(&hf, &data, extra);
    let reference = ppl(&[]);
    let fast = ppl(&["--engine", "fast", "--dtype", "f32"]);
    let ref8 = ppl(&["--quant", "int8"]);
    let fast8 = ppl(&["--engine", "fast", "--dtype", "f32", "--quant", "int8"]);
    let bf16 = ppl(&["--engine", "fast"]);
    eprintln!("reference {reference}, fast f32 {fast}, int8 {ref8} / {fast8}, fast bf16 {bf16}");
    // Trained: well below the vocabulary's size.
    assert!(reference > 1.0 && reference < 10.0, "{reference}");
    for (got, want) in [(fast, reference), (fast8, ref8)] {
        assert!((got / want).ln().abs() <= 1.5e-2, "{got} against {want}");
    }
    assert!((bf16 / reference).ln().abs() <= 0.1, "{bf16}");
    let gpt2 = fixture("gpt2").display().to_string();
    let gpt2_ppl = |extra: &[&str]| perplexity_of(&gpt2, &data, extra);
    let (want, got) = (
        gpt2_ppl(&[]),
        gpt2_ppl(&["--engine", "fast", "--dtype", "f32"]),
    );
    eprintln!("gpt2: reference {want}, fast f32 {got}");
    assert!(
        (got / want).ln().abs() <= 1.5e-2,
        "gpt2: {got} against {want}"
    );
}

/// `perplexity` of `model` on `text` on the CPU.
fn perplexity_args<'a>(model: &'a str, text: &'a str) -> [&'a str; 7] {
    [
        "--device",
        "cpu",
        "perplexity",
        "--model",
        model,
        "--text",
        text,
    ]
}

/// The perplexity `hybrid-trainer perplexity` prints for `model` on `text` (on the CPU), with
/// `extra` flags.
fn perplexity_of(model: &str, text: &str, extra: &[&str]) -> f64 {
    let (stdout, _) = cli_ok(perplexity_args(model, text).iter().chain(extra));
    let line = stdout
        .lines()
        .find(|l| l.starts_with("perplexity "))
        .unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The end-of-sequence token ends the text without being printed, on both engines, streamed
/// (one prompt) and per row (two): a copy of the mistral fixture whose `eos_token_id` is the
/// 4th token of transformers' greedy continuation (the fixture's tokenizer does not mark it
/// special, so `skip_special_tokens` alone would print it; the reference did, the fast engine
/// did not).
#[test]
fn both_engines_end_the_text_at_eos_without_printing_it() {
    let (src, text, want) = prompt_and_greedy_text("mistral");
    let src = PathBuf::from(src);
    let cont: Vec<char> = want.chars().skip(text.chars().count()).collect();
    let eos_at = (3..cont.len())
        .find(|&i| !cont[..i].contains(&cont[i]))
        .unwrap();
    let eos = if cont[eos_at] == '\n' {
        95
    } else {
        cont[eos_at] as u32 - 32
    };
    let tmp = tempfile::tempdir().unwrap();
    for f in ["model.safetensors", "tokenizer.json"] {
        std::fs::copy(src.join(f), tmp.path().join(f)).unwrap();
    }
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
    cfg["eos_token_id"] = eos.into();
    std::fs::write(tmp.path().join("config.json"), cfg.to_string()).unwrap();
    let d = tmp.path().display().to_string();
    let before: String = cont[..eos_at].iter().collect();
    let base = generate_args("cpu", &d, &text, "16");
    let base = base.iter();
    let fast = ["--engine", "fast", "--dtype", "f32"];
    let one = format!("{text}{before}\n");
    let two = format!("[0] {text}{before}\n");
    for (rows, want) in [(&[][..], &one), (&["--prompt", "hi"][..], &two)] {
        let (reference, stderr) = cli_ok(base.clone().chain(rows));
        assert!(reference.contains(want.as_str()), "{reference:?}: {want:?}");
        let n = format!("{} new tokens", eos_at + 1);
        assert!(!rows.is_empty() || stderr.contains(&n), "{stderr}");
        let (got, _) = cli_ok(base.clone().chain(rows).chain(&fast));
        // Two prompts: row 0's text (the other row has no EOS, the engines are both f32).
        assert!(
            got.contains(want.as_str()),
            "{rows:?}: {got:?} against {reference:?}"
        );
        if rows.is_empty() {
            assert_eq!(got, reference, "one prompt: the engines' texts");
        }
    }
}
