//! `tokenizer.json` (the Hugging Face `tokenizers` format), loaded offline.

use std::path::{Path, PathBuf};

use tensor_ops::fsio::{self, FileError};
use thiserror::Error;

use crate::config::MODEL_DIR;

/// Why a tokenizer could not be loaded or used.
#[derive(Debug, Error)]
pub enum TokenizerError {
    #[error("tokenizer file {0} is missing")]
    Missing(PathBuf),
    /// The model directory or the tokenizer file is not what it should be.
    #[error(transparent)]
    File(FileError),
    #[error("bad tokenizer file {path}: {reason}")]
    Bad { path: PathBuf, reason: String },
    #[error("cannot encode: {0}")]
    Encode(String),
    #[error("cannot decode: {0}")]
    Decode(String),
    /// An id the tokenizer has no token for (e.g. a padding row of a model whose vocabulary is
    /// larger than its tokenizer's, as many checkpoints' are): never dropped silently.
    #[error(
        "cannot decode token id {id}: the tokenizer has no such token (its vocabulary has {vocab})"
    )]
    UnknownId { id: u32, vocab: usize },
}

/// A loaded `tokenizer.json`.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .finish()
    }
}

impl Tokenizer {
    /// Loads `<dir>/tokenizer.json`.
    pub fn from_dir(dir: &Path) -> Result<Self, TokenizerError> {
        fsio::check_dir(dir, MODEL_DIR).map_err(TokenizerError::File)?;
        Self::from_file(&dir.join("tokenizer.json"))
    }

    /// Loads a `tokenizer.json` file.
    pub fn from_file(path: &Path) -> Result<Self, TokenizerError> {
        let bytes = fsio::read(path, "tokenizer", fsio::JSON_MAX).map_err(|e| match e {
            FileError::Missing { path, .. } => TokenizerError::Missing(path),
            e => TokenizerError::File(e),
        })?;
        let inner = tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| TokenizerError::Bad {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        Ok(Self { inner })
    }

    /// Wraps an already built `tokenizers::Tokenizer`.
    pub fn from_inner(inner: tokenizers::Tokenizer) -> Self {
        Self { inner }
    }

    /// Token ids of `text`; `add_special` adds the post-processor's special tokens (e.g. BOS).
    /// Text the tokenizer cannot encode is a [`TokenizerError::Encode`]: e.g. a character
    /// outside the vocabulary of a tokenizer written by [`crate::export_gpt2`].
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let enc = self
            .inner
            .encode(text, add_special)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`; `skip_special` drops special tokens. An id the tokenizer has no token
    /// for is [`TokenizerError::UnknownId`] (`tokenizers` would leave it out of the text).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        if let Some(&id) = ids.iter().find(|&&id| self.inner.id_to_token(id).is_none()) {
            return Err(TokenizerError::UnknownId {
                id,
                vocab: self.vocab_size(),
            });
        }
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| TokenizerError::Decode(e.to_string()))
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Id of a token, if in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }
}
