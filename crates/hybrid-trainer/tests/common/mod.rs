//! What the command-line tests share: the committed tiny Hugging Face fixtures and the binary,
//! both found where the GPU bundle puts them when it runs there (no source tree, no cargo), and
//! the runners and decoders of the fixtures' character tokenizer.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::PathBuf;

use assert_cmd::Command;
use safetensors::SafeTensors;

/// Fixture `name`: under `$HYBRID_HF_FIXTURES` where set (the GPU bundle carries them), else
/// in `crates/models`.
pub fn fixture(name: &str) -> PathBuf {
    std::env::var_os("HYBRID_HF_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/tests/fixtures/hf")
        })
        .join(name)
}

/// The binary: `$HYBRID_TRAINER_BIN` in the GPU bundle (no cargo there), else cargo's.
pub fn binary() -> PathBuf {
    std::env::var_os("HYBRID_TRAINER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_hybrid-trainer")))
}

/// Runs the CLI with `args`; `(stdout, stderr)` of a success (panics on failure).
pub fn cli_ok<I, S>(args: I) -> (String, String)
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let out = Command::new(binary()).args(args).assert().success();
    let o = out.get_output();
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Runs the CLI with `args`, which must fail; its stderr.
pub fn cli_err<I, S>(args: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let out = Command::new(binary()).args(args).assert().failure();
    String::from_utf8_lossy(&out.get_output().stderr).into_owned()
}

/// The fixtures' character of each id (printable ASCII, then the newline).
pub fn char_of(id: u32) -> char {
    if id < 95 {
        char::from(32 + id as u8)
    } else {
        '\n'
    }
}

/// The i64 token ids stored under `key` in an expectations file, as u32.
pub fn ids(st: &SafeTensors, key: &str) -> Vec<u32> {
    st.tensor(key)
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
        .collect()
}

/// Fixture `name`'s directory, its prompt as text and the prompt with transformers' 16 greedy
/// tokens after it, as text.
pub fn prompt_and_greedy_text(name: &str) -> (String, String, String) {
    let dir = fixture(name);
    let bytes = std::fs::read(dir.join("expected.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (prompt, greedy) = (ids(&st, "input_ids"), ids(&st, "greedy"));
    let text: String = prompt.iter().map(|&i| char_of(i)).collect();
    let want: String = greedy.iter().map(|&i| char_of(i)).collect();
    (dir.display().to_string(), text, want)
}

/// `generate`'s leading flags: on `device`, `model`'s continuation of `prompt` by at most
/// `max_new` tokens.
pub fn generate_args<'a>(
    device: &'a str,
    model: &'a str,
    prompt: &'a str,
    max_new: &'a str,
) -> [&'a str; 9] {
    [
        "--device",
        device,
        "generate",
        "--model",
        model,
        "--prompt",
        prompt,
        "--max-new-tokens",
        max_new,
    ]
}

/// A small corpus in a fresh temp file (removed on drop).
pub struct Corpus(pub PathBuf);

/// `--device device train-gpt --data data` with the one-layer GPT of the training tests
/// (block 16, 2 heads, 16 wide); the caller adds the run's flags.
pub fn tiny_gpt<'a>(device: &'a str, data: &'a str) -> Vec<&'a str> {
    vec![
        "--device",
        device,
        "train-gpt",
        "--data",
        data,
        "--block",
        "16",
        "--layers",
        "1",
        "--heads",
        "2",
        "--embd",
        "16",
    ]
}

impl Corpus {
    pub fn new(test: &str) -> Corpus {
        let path =
            std::env::temp_dir().join(format!("hybrid-trainer-{test}-{}.txt", std::process::id()));
        std::fs::write(
            &path,
            "the quick brown fox jumps over the lazy dog. ".repeat(40),
        )
        .unwrap();
        Corpus(path)
    }
}

impl Drop for Corpus {
    fn drop(&mut self) {
        std::fs::remove_file(&self.0).ok();
    }
}

/// The `iter N: loss X` lines of `train-gpt`'s output, in order: `(N, X as printed)`.
pub fn loss_lines(out: &str) -> Vec<(u32, &str)> {
    out.lines()
        .filter_map(|l| {
            let (it, rest) = l.strip_prefix("iter ")?.split_once(": loss ")?;
            Some((it.parse().ok()?, rest.split(',').next()?))
        })
        .collect()
}
