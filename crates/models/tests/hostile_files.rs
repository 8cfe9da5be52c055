//! Hostile files where a model directory's files should be (issue 39): a FIFO (whose read
//! would block forever), a symlink to `/dev/zero` (read until memory runs out), a directory
//! (not "missing"), and a model directory that is missing, a file or a device. Each is a typed
//! error naming the culprit, returned without reading it; every call runs under a time limit,
//! so a regression fails instead of hanging.

mod hf_fixture;

use std::path::{Path, PathBuf};

use hf_fixture::{copy_fixture, within};

use models::{
    Architecture, CausalLm, Checkpoint, ConfigError, ModelConfig, ModelError, Tokenizer,
    TokenizerError, WeightsError,
};
use tensor_ops::fsio::FileError;
use tensor_ops::Device;

/// The hostile things to put in place of a file: a FIFO, a symlink to `/dev/zero`, a directory.
const HOSTILE: [&str; 3] = ["fifo", "dev-zero", "directory"];

/// A copy of fixture `name` whose `file` is hostile thing `kind`: the copy (alive while it is
/// held), the file's path and the model directory.
fn hostile_copy(name: &str, file: &str, kind: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = copy_fixture(name);
    let path = tmp.path().join(file);
    replace(&path, kind);
    let dir = tmp.path().to_path_buf();
    (tmp, path, dir)
}

/// Replaces `path` with hostile thing `kind`.
fn replace(path: &Path, kind: &str) {
    std::fs::remove_file(path).unwrap();
    match kind {
        "fifo" => assert!(std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .unwrap()
            .success()),
        "dev-zero" => std::os::unix::fs::symlink("/dev/zero", path).unwrap(),
        _ => std::fs::create_dir(path).unwrap(),
    }
}

/// Whether `e` says that `path` is not a regular file (a directory for `kind` "directory").
fn refuses(e: &FileError, path: &Path, kind: &str) -> bool {
    let right_kind = match kind {
        "directory" => matches!(e, FileError::IsDirectory { .. }),
        _ => matches!(e, FileError::NotRegular { .. }),
    };
    right_kind && e.path() == path
}

#[test]
fn a_fifo_dev_zero_or_directory_as_config_json_is_refused() {
    for kind in HOSTILE {
        let (tmp, path, dir) = hostile_copy("llama3", "config.json", kind);
        match within(move || ModelConfig::from_dir(&dir)) {
            Err(ConfigError::Io { source }) => assert!(refuses(&source, &path, kind), "{source}"),
            other => panic!("{kind}: {other:?}"),
        }
        let dir = tmp.path().to_path_buf();
        let msg = within(move || CausalLm::load(&dir, Device::Cpu).err().unwrap().to_string());
        assert!(
            msg.contains("config.json") && msg.contains("not a regular file"),
            "{msg}"
        );
    }
}

#[test]
fn a_fifo_dev_zero_or_directory_as_tokenizer_json_is_refused() {
    for kind in HOSTILE {
        let (_tmp, path, dir) = hostile_copy("gpt2", "tokenizer.json", kind);
        match within(move || Tokenizer::from_dir(&dir)) {
            Err(TokenizerError::File(e)) => assert!(refuses(&e, &path, kind), "{e}"),
            other => panic!("{kind}: {other:?}"),
        }
    }
}

#[test]
fn a_fifo_dev_zero_or_directory_as_weights_is_refused() {
    for kind in HOSTILE {
        let (_tmp, path, dir) = hostile_copy("llama3", "model.safetensors", kind);
        match within(move || Checkpoint::open(&dir, Architecture::Llama)) {
            Err(WeightsError::File(e)) => assert!(refuses(&e, &path, kind), "{e}"),
            other => panic!("{kind}: {other:?}"),
        }
    }
}

/// `--model /nonexistent`, a file or `/dev/zero`: the model directory is named, not a file
/// inside it.
#[test]
fn a_bad_model_directory_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let dirs = [
        PathBuf::from("/nonexistent-model-dir"),
        file,
        "/dev/zero".into(),
    ];
    for dir in dirs {
        let tok = Tokenizer::from_dir(&dir).unwrap_err().to_string();
        let cfg = ModelConfig::from_dir(&dir).unwrap_err().to_string();
        let d = dir.clone();
        let load = within(move || CausalLm::load(&d, Device::Cpu).err().unwrap());
        assert!(matches!(load, ModelError::Config(ConfigError::Io { .. })));
        let ckpt = Checkpoint::open(&dir, Architecture::Llama).unwrap_err();
        assert!(matches!(ckpt, WeightsError::File(_)), "{ckpt}");
        for msg in [tok, cfg, load.to_string(), ckpt.to_string()] {
            let named = msg.contains(&format!("model directory {}", dir.display()));
            assert!(named && !msg.contains("tokenizer.json"), "{msg}");
        }
    }
}

/// safetensors' own errors (`MetadataIncompleteBuffer`, `TensorInvalidInfo`) are sentences
/// naming the file, not bare variant names.
#[test]
fn safetensors_errors_are_readable_and_name_the_file() {
    let header = r#"{"wte.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}"#;
    let lying = r#"{"wte.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}}"#;
    for (header, data, says) in [
        (header, 28, "does not fill the file"),
        (lying, 20, "do not match its data offsets"),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.resize(bytes.len() + data, 0);
        let path = tmp.path().join("model.safetensors");
        std::fs::write(&path, bytes).unwrap();
        let msg = Checkpoint::open(tmp.path(), Architecture::Gpt2)
            .unwrap_err()
            .to_string();
        assert!(msg.contains(says), "{msg}");
        assert!(msg.contains(&path.display().to_string()), "{msg}");
    }
}
