//! `hybrid-trainer generate` and `perplexity` refusing what they cannot print truthfully:
//! corrupt weights (non-finite logits) and generated ids the tokenizer lacks, on copies of the
//! committed tiny checkpoints of `crates/models/tests/fixtures/hf`.

#[path = "../../models/tests/hf_fixture/checkpoint.rs"]
mod checkpoint;
mod common;

use std::ops::Range;

use assert_cmd::Command;
use common::{binary, char_of, cli_err, fixture, ids};
use safetensors::SafeTensors;

/// A copy of fixture `name` (config, tokenizer, expectations) whose f32 tensor `tensor` holds
/// `value` at the elements `at`.
fn poisoned(name: &str, tensor: &str, at: Range<usize>, value: f32) -> tempfile::TempDir {
    let files = ["config.json", "tokenizer.json", "expected.safetensors"];
    checkpoint::poisoned(&fixture(name), &files, tensor, at, value)
}

/// Corrupt weights (a NaN in `q_proj`, one NaN in `lm_head`) make non-finite logits:
/// `generate` (both engines, greedy and sampled, one prompt or two) fail with
/// a message naming the cause, and print no text on stdout (nor the prompt's echo).
#[test]
fn corrupt_weights_are_refused_and_print_nothing() {
    for tensor in ["model.layers.0.self_attn.q_proj.weight", "lm_head.weight"] {
        let tmp = poisoned("llama3", tensor, 0..1, f32::NAN);
        let d = tmp.path().display().to_string();
        let base = ["--device", "cpu", "generate", "--model", &d];
        let base = base
            .iter()
            .chain(&["--max-new-tokens", "8", "--prompt", "hello"]);
        let engines: [&[&str]; 2] = [&[], &["--engine", "fast", "--dtype", "f32"]];
        let how: [&[&str]; 3] = [&[], &["--temperature", "0.7"], &["--prompt", "hi"]];
        for (engine, how) in engines.iter().flat_map(|e| how.iter().map(move |h| (e, h))) {
            let args: Vec<&str> = base.clone().chain(*engine).chain(*how).copied().collect();
            let out = Command::new(binary()).args(&args).assert().failure();
            let o = out.get_output();
            let (stdout, stderr) = (
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr),
            );
            assert!(
                stderr.contains("non-finite logits") && stderr.contains("step 0"),
                "{args:?}: {stderr}"
            );
            // stdout has the device's lines only: no prompt, no text, no batch rows.
            assert!(
                !stdout.contains("hello") && !stdout.contains("[0]"),
                "{args:?}: printed {stdout:?}"
            );
        }
    }
}

/// The fixture's prompt (`expected.safetensors`) as text.
fn prompt_of(name: &str) -> String {
    let bytes = std::fs::read(fixture(name).join("expected.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    ids(&st, "input_ids").into_iter().map(char_of).collect()
}

/// The commands on a poisoned copy of llama3, each failing: `generate` (its prompt) on both
/// engines, greedy and sampled, `perplexity` (of its prompt) on both, `check-hf`. Each's
/// args and stderr; none printed the prompt or a perplexity on stdout.
fn refusals(dir: &std::path::Path) -> Vec<(Vec<String>, String)> {
    let (d, prompt) = (dir.display().to_string(), prompt_of("llama3"));
    let text = dir.join("text.txt");
    std::fs::write(&text, &prompt).unwrap();
    let t = text.display().to_string();
    let gen = [
        "generate",
        "--model",
        &d,
        "--prompt",
        &prompt,
        "--max-new-tokens",
        "8",
    ];
    let ppl = ["perplexity", "--model", &d, "--text", &t];
    let (fast, sampled) = (
        ["--engine", "fast", "--dtype", "f32"],
        ["--temperature", "0.8"],
    );
    let runs: [Vec<&str>; 7] = [
        gen.to_vec(),
        [&gen[..], &sampled].concat(),
        [&gen[..], &fast].concat(),
        [&gen[..], &fast, &sampled].concat(),
        ppl.to_vec(),
        [&ppl[..], &fast].concat(),
        vec!["check-hf", "--model", &d],
    ];
    let run = |run: &Vec<&str>| {
        let args: Vec<String> = ["--device", "cpu"]
            .iter()
            .chain(run)
            .map(|s| s.to_string())
            .collect();
        let out = Command::new(binary()).args(&args).assert().failure();
        let o = out.get_output();
        let stdout = String::from_utf8_lossy(&o.stdout);
        let printed = stdout.contains(&prompt) || stdout.contains("perplexity");
        assert!(!printed, "{args:?}: printed {stdout:?}");
        (args, String::from_utf8_lossy(&o.stderr).into_owned())
    };
    runs.iter().map(run).collect()
}

/// The error names the poisoned tensor and its count (a NaN in `q_proj`, a +inf in the
/// embedding row of the prompt's first token, one NaN in `lm_head`) on every command.
#[test]
fn the_poisoned_tensor_is_named() {
    let first = prompt_of("llama3").chars().next().unwrap();
    let row = (u32::from(first) - 32) as usize * 64; // its row (hidden size 64)
    let cases = [
        (
            "model.layers.0.self_attn.q_proj.weight",
            0,
            f32::NAN,
            "1 NaN",
        ),
        ("model.embed_tokens.weight", row, f32::INFINITY, "1 +inf"),
        ("lm_head.weight", 0, f32::NAN, "1 NaN"),
    ];
    for (tensor, at, value, count) in cases {
        let tmp = poisoned("llama3", tensor, at..at + 1, value);
        let named = format!("non-finite weight: tensor `{tensor}` holds {count}");
        for (args, stderr) in refusals(tmp.path()) {
            assert!(
                stderr.contains("non-finite logits") && stderr.contains(&named),
                "{args:?}: {stderr}"
            );
        }
    }
}

/// Finite weights that overflow (1e38 across a row of `q_proj`): non-finite logits whose error
/// names no tensor and says the weights are finite.
#[test]
fn overflowing_finite_weights_name_no_tensor() {
    let tmp = poisoned(
        "llama3",
        "model.layers.0.self_attn.q_proj.weight",
        0..64,
        1e38,
    );
    for (args, stderr) in refusals(tmp.path()) {
        assert!(
            stderr.contains("non-finite logits")
                && stderr.contains("every weight is finite: the activations overflowed")
                && !stderr.contains("tensor `"),
            "{args:?}: {stderr}"
        );
    }
}

/// `perplexity` of corrupt weights (one NaN in `lm_head`): a message naming the cause and a
/// non-zero exit on both engines, never "perplexity NaN".
#[test]
fn perplexity_of_corrupt_weights_is_refused() {
    let tmp = poisoned("llama3", "lm_head.weight", 0..1, f32::NAN);
    let d = tmp.path().display().to_string();
    let text = tmp.path().join("text.txt");
    std::fs::write(&text, "hello there, general").unwrap();
    let t = text.display().to_string();
    let base = ["--device", "cpu", "perplexity", "--model", &d, "--text", &t];
    for engine in [&[][..], &["--engine", "fast", "--dtype", "f32"]] {
        let out = Command::new(binary())
            .args(base.iter().chain(engine))
            .assert()
            .failure();
        let o = out.get_output();
        let stdout = String::from_utf8_lossy(&o.stdout);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(
            stderr.contains("non-finite logits") && stderr.contains("predicting token 1"),
            "{engine:?}: {stderr}"
        );
        assert!(!stdout.contains("perplexity"), "{engine:?}: {stdout}");
    }
}

/// A tokenizer without a token the model generates (its vocabulary smaller than the model's,
/// as with a checkpoint's padding rows): `generate` fails naming the id on both engines, one
/// prompt (streamed) or two, instead of leaving the token out of the text.
#[test]
fn a_generated_id_the_tokenizer_lacks_is_an_error() {
    let src = fixture("llama3");
    let bytes = std::fs::read(src.join("expected.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (prompt, greedy) = (ids(&st, "input_ids"), ids(&st, "greedy"));
    let gone = *greedy[prompt.len()..]
        .iter()
        .find(|id| !prompt.contains(id))
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(src.join(f), tmp.path().join(f)).unwrap();
    }
    let mut tok: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("tokenizer.json")).unwrap()).unwrap();
    let vocab = tok["model"]["vocab"].as_object_mut().unwrap();
    vocab.retain(|_, id| id.as_u64() != Some(u64::from(gone)));
    std::fs::write(tmp.path().join("tokenizer.json"), tok.to_string()).unwrap();
    let d = tmp.path().display().to_string();
    let text: String = prompt.iter().map(|&i| char_of(i)).collect();
    let base = [
        "--device", "cpu", "generate", "--model", &d, "--prompt", &text,
    ];
    let base = base
        .iter()
        .chain(&["--max-new-tokens", "16", "--ignore-eos"]);
    let engines: [&[&str]; 2] = [&[], &["--engine", "fast", "--dtype", "f32"]];
    let rows: [&[&str]; 2] = [&[], &["--prompt", "hi"]];
    for (engine, rows) in engines
        .iter()
        .flat_map(|e| rows.iter().map(move |r| (e, r)))
    {
        let args: Vec<&str> = base.clone().chain(*engine).chain(*rows).copied().collect();
        let err = cli_err(&args);
        assert!(
            err.contains(&format!("cannot decode token id {gone}")),
            "{args:?}: {err}"
        );
    }
}
