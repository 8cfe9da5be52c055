//! A tiny tokenizer built with the `tokenizers` API, saved as `tokenizer.json` and loaded back.

use models::{Tokenizer, TokenizerError};
use tokenizers::models::wordlevel::WordLevel;
use tokenizers::pre_tokenizers::whitespace::Whitespace;

fn tiny(dir: &std::path::Path) {
    let words = ["[UNK]", "the", "cat", "sat", "on", "mat"];
    let vocab = words.iter().enumerate();
    let vocab = vocab.map(|(i, w)| (w.to_string(), i as u32)).collect();
    let model = WordLevel::builder()
        .vocab(vocab)
        .unk_token("[UNK]".into())
        .build()
        .unwrap();
    let mut tok = tokenizers::Tokenizer::new(model);
    tok.with_pre_tokenizer(Some(Whitespace {}));
    tok.save(dir.join("tokenizer.json"), false).unwrap();
}

#[test]
fn saved_tokenizer_loads_and_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    tiny(dir.path());
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tok.vocab_size(), 6);
    let ids = tok.encode("the cat sat on the mat", false).unwrap();
    assert_eq!(ids, vec![1, 2, 3, 4, 1, 5]);
    assert_eq!(tok.decode(&ids, false).unwrap(), "the cat sat on the mat");
    assert_eq!(tok.encode("the dog", false).unwrap(), vec![1, 0]);
    assert_eq!(tok.token_to_id("mat"), Some(5));
}

#[test]
fn missing_tokenizer_file() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        Tokenizer::from_dir(dir.path()),
        Err(TokenizerError::Missing(_))
    ));
}

#[test]
fn bad_tokenizer_file() {
    let dir = tempfile::tempdir().unwrap();
    for text in ["not json", "{}", r#"{"model": {"type": "Nonsense"}}"#] {
        std::fs::write(dir.path().join("tokenizer.json"), text).unwrap();
        let r = Tokenizer::from_dir(dir.path());
        assert!(
            matches!(r, Err(TokenizerError::Bad { .. })),
            "{text}: {r:?}"
        );
    }
}
