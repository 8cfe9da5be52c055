//! A tiny tokenizer built with the `tokenizers` API, saved as `tokenizer.json` and loaded back.

use models::{Tokenizer, TokenizerError};
use tokenizers::models::bpe::BPE;
use tokenizers::models::wordlevel::WordLevel;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
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

/// GPT-2 style: byte-level BPE, whose pre-tokenizer needs the regex engine (fancy-regex here).
#[test]
fn byte_level_bpe_round_trips() {
    let tokens = [
        "h", "e", "l", "o", "\u{120}", "w", "r", "d", "he", "ll", "hell", "hello",
    ];
    let vocab = tokens.iter().enumerate();
    let vocab: tokenizers::models::bpe::Vocab =
        vocab.map(|(i, t)| (t.to_string(), i as u32)).collect();
    let merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o")];
    let merges = merges.iter().map(|(a, b)| (a.to_string(), b.to_string()));
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges.collect())
        .build()
        .unwrap();
    let mut tok = tokenizers::Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tok.with_decoder(Some(ByteLevel::default()));
    let dir = tempfile::tempdir().unwrap();
    tok.save(dir.path().join("tokenizer.json"), true).unwrap();
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    let ids = tok.encode("hello world", false).unwrap();
    assert_eq!(ids, vec![11, 4, 5, 3, 6, 2, 7]);
    assert_eq!(tok.decode(&ids, false).unwrap(), "hello world");
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

/// An id past the tokenizer's vocabulary (a model's padding rows: its `vocab_size` may exceed
/// the tokenizer's) is a typed error naming it, not a token silently left out of the text.
#[test]
fn decoding_an_unknown_id_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    tiny(dir.path());
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    for ids in [&[1, 6][..], &[7], &[2, u32::MAX, 3]] {
        let r = tok.decode(ids, true);
        let want = *ids.iter().find(|&&i| i >= 6).unwrap();
        assert!(
            matches!(r, Err(TokenizerError::UnknownId { id, vocab: 6 }) if id == want),
            "{ids:?}: {r:?}"
        );
        let msg = r.unwrap_err().to_string();
        assert!(msg.contains(&format!("token id {want}")), "{msg}");
    }
    assert_eq!(tok.decode(&[1, 5], true).unwrap(), "the mat");
}
