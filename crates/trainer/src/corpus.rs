//! The training corpus: the default tinyshakespeare text embedded gzip-compressed in the binary
//! (checked by length and SHA-256 when decompressed), or a UTF-8 file read from disk.
//! `data/README.md` says where the embedded text comes from.

use std::io::Read;
use std::path::Path;

use anyhow::{ensure, Context, Result};
use flate2::read::GzDecoder;
use sha2::{Digest, Sha256};

/// The name shown in reports.
pub const DEFAULT_CORPUS_NAME: &str = "tinyshakespeare (embedded)";

/// The embedded corpus, gzip -9 of `data/tinyshakespeare.txt`.
const DEFAULT_CORPUS_GZ: &[u8] = include_bytes!("../data/tinyshakespeare.txt.gz");

/// Length in bytes of the uncompressed default corpus.
pub const DEFAULT_CORPUS_LEN: usize = 1_115_394;

/// SHA-256 of the uncompressed default corpus, lowercase hex.
pub const DEFAULT_CORPUS_SHA256: &str =
    "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed";

/// Decompresses the embedded corpus, checks its length and SHA-256 and returns it.
pub fn default_corpus() -> Result<String> {
    let mut bytes = Vec::with_capacity(DEFAULT_CORPUS_LEN);
    GzDecoder::new(DEFAULT_CORPUS_GZ)
        .read_to_end(&mut bytes)
        .context("decompressing the embedded tinyshakespeare corpus")?;
    ensure!(
        bytes.len() == DEFAULT_CORPUS_LEN,
        "embedded corpus has {} bytes, expected {DEFAULT_CORPUS_LEN}",
        bytes.len()
    );
    let digest = hex(&Sha256::digest(&bytes));
    ensure!(
        digest == DEFAULT_CORPUS_SHA256,
        "embedded corpus SHA-256 is {digest}, expected {DEFAULT_CORPUS_SHA256}"
    );
    String::from_utf8(bytes).context("embedded corpus is not UTF-8")
}

/// Reads `path` as UTF-8, with a clear error naming the file.
pub fn read_corpus(path: &Path) -> Result<String> {
    Ok(tensor_ops::fsio::read_to_string(
        path,
        "corpus",
        tensor_ops::fsio::TEXT_MAX,
    )?)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_corpus_has_expected_length_and_hash() {
        let text = default_corpus().unwrap();
        assert_eq!(text.len(), DEFAULT_CORPUS_LEN);
        assert_eq!(hex(&Sha256::digest(text.as_bytes())), DEFAULT_CORPUS_SHA256);
        assert!(text.starts_with("First Citizen:"));
    }

    #[test]
    fn missing_corpus_file_is_an_error_naming_the_path() {
        let path = std::env::temp_dir().join(format!(
            "hybrid-trainer-no-such-corpus-{}.txt",
            std::process::id()
        ));
        let err = read_corpus(&path).unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains(&path.display().to_string()), "{msg}");
    }

    #[test]
    fn non_utf8_corpus_file_is_an_error_naming_the_path() {
        let path = std::env::temp_dir().join(format!(
            "hybrid-trainer-bad-utf8-{}.txt",
            std::process::id()
        ));
        std::fs::write(&path, [0x66, 0xff, 0xfe]).unwrap();
        let err = read_corpus(&path).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert!(format!("{err:#}").contains(&path.display().to_string()));
    }

    #[test]
    fn read_corpus_reads_a_utf8_file() {
        let path = std::env::temp_dir().join(format!(
            "hybrid-trainer-corpus-ok-{}.txt",
            std::process::id()
        ));
        std::fs::write(&path, "héllo\n").unwrap();
        let text = read_corpus(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(text, "héllo\n");
    }
}
