//! `hybrid-trainer generate` as a user runs it, on the committed tiny checkpoints of
//! `crates/models/tests/fixtures/hf` (random weights, a character tokenizer of their 96 ids):
//! greedy text equal to `transformers`' greedy tokens, streamed to stdout; bad settings and
//! directories are clear errors.

use std::path::PathBuf;

use assert_cmd::Command;
use safetensors::SafeTensors;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models/tests/fixtures/hf")
        .join(name)
}

/// The fixtures' character of each id (printable ASCII, then the newline).
fn char_of(id: u32) -> char {
    if id < 95 {
        char::from(32 + id as u8)
    } else {
        '\n'
    }
}

fn ids(st: &SafeTensors, key: &str) -> Vec<u32> {
    st.tensor(key)
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
        .collect()
}

#[test]
fn greedy_generation_prints_transformers_tokens() {
    for name in ["llama3", "qwen2", "gpt2"] {
        let dir = fixture(name);
        let bytes = std::fs::read(dir.join("expected.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let (prompt, greedy) = (ids(&st, "input_ids"), ids(&st, "greedy"));
        let text: String = prompt.iter().map(|&i| char_of(i)).collect();
        let want: String = greedy.iter().map(|&i| char_of(i)).collect();
        let out = Command::cargo_bin("hybrid-trainer")
            .unwrap()
            .args(["--device", "cpu", "generate", "--model"])
            .arg(&dir)
            .args(["--prompt", &text, "--max-new-tokens", "16", "--ignore-eos"])
            .assert()
            .success();
        let stdout = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
        assert!(
            stdout.ends_with(&format!("{want}\n")),
            "{name}: {stdout:?} does not end with {want:?}"
        );
        let stderr = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
        assert!(stderr.contains("16 new tokens"), "{name}: {stderr}");
    }
}

#[test]
fn bad_generate_calls_are_clear_errors() {
    let dir = fixture("llama3");
    let d = dir.to_str().unwrap();
    let long = "a".repeat(80); // the context is 64
    let empty = tempfile::tempdir().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--model", d, "--prompt", "hi", "--temperature=-1"],
            "temperature",
        ),
        (
            vec!["--model", d, "--prompt", "hi", "--top-p", "0"],
            "top-p",
        ),
        (
            vec!["--model", d, "--prompt", "hi", "--top-k", "0"],
            "top-k",
        ),
        (vec!["--model", d, "--prompt", &long], "context"),
        (
            vec!["--model", d, "--prompt", "hi", "--max-new-tokens", "100"],
            "context",
        ),
        (
            vec!["--model", empty.path().to_str().unwrap(), "--prompt", "hi"],
            "tokenizer",
        ),
        (
            vec!["--model", d, "--prompt", "hi", "--temperature", "hot"],
            "invalid value",
        ),
    ];
    for (args, says) in cases {
        let out = Command::cargo_bin("hybrid-trainer")
            .unwrap()
            .args(["--device", "cpu", "generate"])
            .args(&args)
            .assert()
            .failure();
        let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

#[test]
fn perplexity_and_quantized_runs_from_the_cli() {
    let dir = fixture("gpt2");
    let tmp = tempfile::tempdir().unwrap();
    let text = tmp.path().join("text.txt");
    std::fs::write(
        &text,
        "To be, or not to be, that is the question.\n".repeat(4),
    )
    .unwrap();
    let ppl = |extra: &[&str]| -> f64 {
        let out = Command::cargo_bin("hybrid-trainer")
            .unwrap()
            .args(["--device", "cpu", "perplexity", "--model"])
            .arg(&dir)
            .arg("--text")
            .arg(&text)
            .args(extra)
            .assert()
            .success();
        let stdout = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
        let line = stdout
            .lines()
            .find(|l| l.starts_with("perplexity "))
            .unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    let (full, int8, int4) = (
        ppl(&[]),
        ppl(&["--quant", "int8"]),
        ppl(&["--quant", "int4"]),
    );
    // Random weights: about the vocabulary's 96, and the formats move it.
    assert!(full > 10.0 && full.is_finite(), "{full}");
    assert!(int8 != full && int4 != full, "{full} {int8} {int4}");
    Command::cargo_bin("hybrid-trainer")
        .unwrap()
        .args(["--device", "cpu", "generate", "--model"])
        .arg(&dir)
        .args([
            "--prompt",
            "To be",
            "--max-new-tokens",
            "4",
            "--quant",
            "int4",
        ])
        .assert()
        .success();
    for bad in [vec!["--quant", "int9"], vec!["--max-tokens", "x"]] {
        let out = Command::cargo_bin("hybrid-trainer")
            .unwrap()
            .args(["--device", "cpu", "perplexity", "--model"])
            .arg(&dir)
            .arg("--text")
            .arg(&text)
            .args(&bad)
            .assert()
            .failure();
        let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
        assert!(err.contains("invalid value"), "{bad:?}: {err}");
    }
    // A missing text file is a clear error.
    let out = Command::cargo_bin("hybrid-trainer")
        .unwrap()
        .args(["--device", "cpu", "perplexity", "--model"])
        .arg(&dir)
        .args(["--text", "/nonexistent/text.txt"])
        .assert()
        .failure();
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(err.contains("reading /nonexistent/text.txt"), "{err}");
}

#[test]
fn a_trained_gpt_exports_and_generates() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("text.txt");
    std::fs::write(
        &data,
        "To be, or not to be, that is the question:\n".repeat(40),
    )
    .unwrap();
    let saved = tmp.path().join("gpt.safetensors");
    let run = |args: Vec<String>| {
        let out = Command::cargo_bin("hybrid-trainer")
            .unwrap()
            .args(&args)
            .assert()
            .success();
        String::from_utf8_lossy(&out.get_output().stdout).into_owned()
    };
    let s = |x: &str| x.to_string();
    let p = |x: &std::path::Path| x.display().to_string();
    run(vec![
        s("--device"),
        s("cpu"),
        s("train-gpt"),
        s("--data"),
        p(&data),
        s("--layers"),
        s("2"),
        s("--heads"),
        s("2"),
        s("--embd"),
        s("32"),
        s("--block"),
        s("32"),
        s("--batch"),
        s("4"),
        s("--iters"),
        s("60"),
        s("--warmup"),
        s("5"),
        s("--lr"),
        s("3e-3"),
        s("--dropout"),
        s("0"),
        s("--eval-interval"),
        s("60"),
        s("--eval-iters"),
        s("2"),
        s("--sample"),
        s("0"),
        s("--save"),
        p(&saved),
    ]);
    let hf = tmp.path().join("hf");
    let out = run(vec![
        s("export-hf"),
        s("--model"),
        p(&saved),
        s("--data"),
        p(&data),
        s("--out"),
        p(&hf),
    ]);
    assert!(out.contains("wrote"), "{out}");
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert!(hf.join(f).is_file(), "{f}");
    }
    let out = Command::cargo_bin("hybrid-trainer")
        .unwrap()
        .args(["--device", "cpu", "generate", "--model"])
        .arg(&hf)
        .args(["--prompt", "To be, or not to", "--max-new-tokens", "8"])
        .assert()
        .success();
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(err.contains("8 new tokens"), "{err}");
    // Exporting again into the now non-empty directory is refused.
    let again = Command::cargo_bin("hybrid-trainer")
        .unwrap()
        .args(["export-hf", "--model"])
        .arg(&saved)
        .arg("--data")
        .arg(&data)
        .arg("--out")
        .arg(&hf)
        .assert()
        .failure();
    let err = String::from_utf8_lossy(&again.get_output().stderr).into_owned();
    assert!(
        err.contains("not empty") || err.contains("non-empty"),
        "{err}"
    );
}

#[test]
fn several_prompts_decode_as_one_batch_with_each_rows_own_text() {
    let dir = fixture("qwen2");
    let single = |p: &str| -> String {
        let out = Command::cargo_bin("hybrid-trainer")
            .unwrap()
            .args(["--device", "cpu", "generate", "--model"])
            .arg(&dir)
            .args(["--prompt", p, "--max-new-tokens", "10", "--ignore-eos"])
            .assert()
            .success();
        let stdout = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
        // The text is the last line (device lines come first), newlines in it aside: take the
        // whole output after the prompt's first occurrence.
        let at = stdout.find(p).unwrap();
        stdout[at..].trim_end_matches('\n').to_string()
    };
    let prompts = ["Hello there", "Hi"];
    let out = Command::cargo_bin("hybrid-trainer")
        .unwrap()
        .args(["--device", "cpu", "generate", "--model"])
        .arg(&dir)
        .args(["--prompt", prompts[0], "--prompt", prompts[1]])
        .args(["--max-new-tokens", "10", "--ignore-eos"])
        .assert()
        .success();
    let stdout = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    for (i, p) in prompts.iter().enumerate() {
        let want = format!("[{i}] {}", single(p));
        assert!(stdout.contains(&want), "row {i}: {stdout:?} lacks {want:?}");
    }
}
