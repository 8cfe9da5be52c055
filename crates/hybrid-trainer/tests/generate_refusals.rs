//! `hybrid-trainer generate` and `perplexity` refusing what they cannot print truthfully:
//! corrupt weights (non-finite logits) and generated ids the tokenizer lacks, on copies of the
//! committed tiny checkpoints of `crates/models/tests/fixtures/hf`.

use std::path::PathBuf;

use assert_cmd::Command;
use safetensors::SafeTensors;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models/tests/fixtures/hf")
        .join(name)
}

/// The binary: `$HYBRID_TRAINER_BIN` in the GPU bundle (no cargo there), else cargo's.
fn binary() -> PathBuf {
    std::env::var_os("HYBRID_TRAINER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_hybrid-trainer")))
}

/// Runs the CLI with `args`, which must fail; its stderr.
fn cli_err(args: &[&str]) -> String {
    let out = Command::new(binary()).args(args).assert().failure();
    String::from_utf8_lossy(&out.get_output().stderr).into_owned()
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

/// A copy of fixture `name` whose f32 tensor `tensor` holds `value` at element `at`.
fn poisoned(name: &str, tensor: &str, at: usize, value: f32) -> tempfile::TempDir {
    let src = fixture(name);
    let tmp = tempfile::tempdir().unwrap();
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(src.join(f), tmp.path().join(f)).unwrap();
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| {
            let mut b = v.data().to_vec();
            if n == tensor {
                b[at * 4..at * 4 + 4].copy_from_slice(&value.to_le_bytes());
            }
            (n, v.shape().to_vec(), b)
        })
        .collect();
    let views = data.iter().map(|(n, shape, b)| {
        let v = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), b);
        (n.clone(), v.unwrap())
    });
    let out = safetensors::serialize(views, &None).unwrap();
    std::fs::write(tmp.path().join("model.safetensors"), out).unwrap();
    tmp
}

/// Corrupt weights (a NaN in `q_proj`, one NaN in `lm_head`) make non-finite logits:
/// `generate` (both engines, greedy and sampled, one prompt or two) fail with
/// a message naming the cause, and print no text on stdout (nor the prompt's echo).
#[test]
fn corrupt_weights_are_refused_and_print_nothing() {
    for tensor in ["model.layers.0.self_attn.q_proj.weight", "lm_head.weight"] {
        let tmp = poisoned("llama3", tensor, 0, f32::NAN);
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

/// `perplexity` of corrupt weights (one NaN in `lm_head`): a message naming the cause and a
/// non-zero exit on both engines, never "perplexity NaN".
#[test]
fn perplexity_of_corrupt_weights_is_refused() {
    let tmp = poisoned("llama3", "lm_head.weight", 0, f32::NAN);
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
