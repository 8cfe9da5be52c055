//! Batched decoding of prompts of different lengths: left padding is masked out and each row
//! is numbered from 0 after it, so a padded row gives its own logits and its own greedy tokens;
//! padding that does not fit is a typed error that changes nothing.

mod hf_fixture;

use hf_fixture::dir;
use models::{CausalLm, ModelError, Sampler, Sampling};
use tensor_ops::Device;

const NAMES: [&str; 4] = ["llama3", "qwen2", "mistral", "gpt2"];

fn prompts() -> Vec<Vec<u32>> {
    vec![
        (0..12).map(|i| (i * 7 + 3) % 96).collect(),
        (0..5).map(|i| (i * 11 + 1) % 96).collect(),
        vec![42],
    ]
}

/// The bound of `tests/parity.rs` (the same f32 functions in another summation order: masked
/// keys add exact zeros to the softmax's sums).
fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    hf_fixture::max_err(what, got, want, 3e-4);
}

#[test]
fn padded_rows_give_their_own_logits() {
    for name in NAMES {
        let m = CausalLm::load(&dir(name), Device::Cpu).unwrap();
        let vocab = m.config().vocab_size;
        let ps = prompts();
        let longest = ps.iter().map(Vec::len).max().unwrap();
        let pads: Vec<usize> = ps.iter().map(|p| longest - p.len()).collect();
        let ids: Vec<u32> = ps
            .iter()
            .flat_map(|p| std::iter::repeat_n(0, longest - p.len()).chain(p.iter().copied()))
            .collect();
        let mut cache = m.new_cache();
        let all = m
            .forward_padded(&ids, ps.len(), &pads, &mut cache)
            .unwrap()
            .to_vec()
            .unwrap();
        for (r, p) in ps.iter().enumerate() {
            let own = m
                .forward(p, 1, &mut m.new_cache())
                .unwrap()
                .to_vec()
                .unwrap();
            let row = &all[(r * longest + pads[r]) * vocab..(r + 1) * longest * vocab];
            assert_close(&format!("{name} row {r}"), row, &own);
        }
    }
}

#[test]
fn batched_greedy_tokens_are_each_rows_own() {
    for name in NAMES {
        let m = CausalLm::load(&dir(name), Device::Cpu).unwrap();
        let ps = prompts();
        let refs: Vec<&[u32]> = ps.iter().map(Vec::as_slice).collect();
        let mut s = Sampler::new(Sampling::default()).unwrap();
        let batched = m.generate_batch(&refs, 12, &mut s, &[]).unwrap();
        for (r, p) in ps.iter().enumerate() {
            let mut s = Sampler::new(Sampling::default()).unwrap();
            let alone = m.generate(p, 12, &mut s, &[], |_| {}).unwrap();
            assert_eq!(batched[r], alone, "{name} row {r}");
        }
        // A stop token ends its row only.
        let stop = batched[1][2];
        let mut s = Sampler::new(Sampling::default()).unwrap();
        let stopped = m.generate_batch(&refs, 12, &mut s, &[stop]).unwrap();
        let cut = batched[1].iter().position(|&t| t == stop).unwrap();
        assert_eq!(
            stopped[1],
            batched[1][..=cut],
            "{name}: row 1 stops at its stop token"
        );
        // And a single row's generation stops at its stop token, which it returns.
        let mut s = Sampler::new(Sampling::default()).unwrap();
        let alone = m.generate(&ps[1], 12, &mut s, &[stop], |_| {}).unwrap();
        assert_eq!(
            alone,
            batched[1][..=cut],
            "{name}: generate stops at its stop token"
        );
    }
}

#[test]
fn padding_that_does_not_fit_is_refused_and_changes_nothing() {
    let m = CausalLm::load(&dir("llama3"), Device::Cpu).unwrap();
    let mut cache = m.new_cache();
    for (ids, batch, pads) in [
        (vec![1, 2, 3, 4], 2, vec![0]),
        (vec![1, 2, 3, 4], 2, vec![2, 0]),
        (vec![1, 2, 3, 4], 2, vec![0, 5]),
    ] {
        let e = m
            .forward_padded(&ids, batch, &pads, &mut cache)
            .unwrap_err();
        assert!(matches!(e, ModelError::BadPadding(_)), "{pads:?}: {e}");
        assert!(cache.is_empty());
    }
    m.forward_padded(&[0, 1, 2, 3], 2, &[1, 0], &mut cache)
        .unwrap();
    let e = m
        .forward_padded(&[5, 6], 2, &[0, 0], &mut cache)
        .unwrap_err();
    assert!(matches!(e, ModelError::BadPadding(_)), "{e}");
    assert_eq!(cache.len(), 2);
    m.forward_padded(&[5, 6], 2, &[1, 0], &mut cache).unwrap();
    assert_eq!(cache.len(), 3);
    let mut s = Sampler::new(Sampling::default()).unwrap();
    assert!(matches!(
        m.generate_batch(&[&[1], &[]], 2, &mut s, &[]),
        Err(ModelError::EmptyInput)
    ));
    assert!(matches!(
        m.generate_batch(&[], 2, &mut s, &[]),
        Err(ModelError::EmptyInput)
    ));
}
