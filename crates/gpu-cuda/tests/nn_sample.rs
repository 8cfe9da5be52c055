//! Token sampling (`gpu_core::nn::sample`) on CUDA against the CPU reference: the same tokens
//! and the same `seen` bitmask, bit for bit (the op is specified in fixed-point weights and a
//! fixed sequence of IEEE operations, so no tolerance applies), on fresh random inputs
//! (printed, replayable seed): vocabularies from 1 to Qwen2's 151 936, f32 and bf16 logits,
//! every setting (greedy, temperatures, top-k with ties, top-p, repetition penalty), masked
//! (−∞) tokens, NaN and overflowing rows. Tests named `gpu_*` skip without a GPU.

mod common;

use common::*;
use gpu_core::nn::sample::{seen_words, SampleOps, SampleParams, SampleRows};
use gpu_core::{Backend, CpuBackend, DType};
use gpu_cuda::testing::backend_or_skip;
use rand::rngs::StdRng;
use rand::Rng;

/// Runs `steps` calls on the same buffers (the bitmask grows); returns every call's tokens and
/// the final bitmask.
fn run<B: SampleOps>(
    be: &B,
    logits: &[f32],
    dtype: DType,
    (vocab, seen, counter): (usize, &[u32], &[u32]),
    p: SampleParams,
    steps: u32,
) -> (Vec<Vec<u32>>, Vec<u32>) {
    let l = put(be, logits, dtype);
    let mut s = be.upload(seen).unwrap();
    let c = be.upload(counter).unwrap();
    let mut o = be.allocate(DType::U32, counter.len()).unwrap();
    let tokens = (0..steps)
        .map(|i| {
            let p = SampleParams {
                offset: p.offset.wrapping_add(i),
                ..p
            };
            be.sample_rows(SampleRows::new(&l, &mut s, &c, &mut o, vocab), p)
                .unwrap();
            be.download::<u32>(&o).unwrap()
        })
        .collect();
    (tokens, be.download(&s).unwrap())
}

/// Random logits of `rows × vocab` in one of several shapes of distribution.
fn logits(rng: &mut StdRng, rows: usize, vocab: usize, kind: u32) -> Vec<f32> {
    let mut x = random_vec(rng, rows * vocab, 8.0);
    match kind {
        // Few distinct values: many ties at every cut.
        1 => x.iter_mut().for_each(|v| *v = v.round()),
        // A peaked row: one token far above the rest.
        2 => x[rng.random_range(0..rows * vocab)] = 60.0,
        // Masked tokens.
        3 => x
            .iter_mut()
            .filter(|v| **v < -4.0)
            .for_each(|v| *v = f32::NEG_INFINITY),
        // Huge logits: the temperature may overflow them.
        4 => x.iter_mut().for_each(|v| *v *= 4e37),
        _ => {}
    }
    if kind == 5 && rows > 1 {
        x[vocab + vocab / 2] = f32::NAN;
    }
    x
}

fn params(rng: &mut StdRng, vocab: usize) -> SampleParams {
    let pick = |rng: &mut StdRng, v: &[f32]| v[rng.random_range(0..v.len())];
    SampleParams {
        temperature: pick(rng, &[0.0, 0.3, 0.7, 1.0, 1.6]),
        top_k: [0, 1, 5, 50, vocab.saturating_sub(1), vocab + 3][rng.random_range(0..6)] as u32,
        top_p: pick(rng, &[1.0, 1.0, 0.95, 0.9, 0.5, 0.05]),
        penalty: pick(rng, &[1.0, 1.3, 0.8]),
        seed: rng.random(),
        offset: rng.random(),
    }
}

#[test]
fn gpu_sample_rows_matches_cpu_bit_for_bit() {
    let (gpu, mut rng) = skip_unless!(gpu_and_rng("gpu_sample_rows_matches_cpu_bit_for_bit"));
    let mut cases = 0;
    for &vocab in &[1usize, 3, 33, 1000, 1025, 32_000, 128_256, 151_936] {
        for case in 0..6 {
            let rows = rng.random_range(1..=3);
            let dtype = [DType::F32, DType::BF16][case % 2];
            let x = logits(&mut rng, rows, vocab, case as u32);
            let seen: Vec<u32> = (0..rows * seen_words(vocab))
                .map(|_| rng.random::<u32>() & rng.random::<u32>() & rng.random::<u32>())
                .collect();
            let counter: Vec<u32> = (0..rows).map(|_| rng.random()).collect();
            let p = params(&mut rng, vocab);
            let inputs = (vocab, seen.as_slice(), counter.as_slice());
            let want = run(&CpuBackend, &x, dtype, inputs, p, 3);
            let got = run(&gpu, &x, dtype, inputs, p, 3);
            assert_eq!(
                got, want,
                "vocab {vocab}, {rows} rows, {dtype}, kind {case}, {p:?}"
            );
            cases += 1;
        }
    }
    println!("{cases} cases equal");
}

#[test]
fn gpu_sample_rows_empty_batch_and_bad_buffers() {
    let gpu = skip_unless!(backend_or_skip(
        "gpu_sample_rows_empty_batch_and_bad_buffers"
    ));
    let p = SampleParams {
        seed: 1,
        ..gpu_core::testing::PLAIN_SAMPLING
    };
    let e = gpu.upload::<f32>(&[]).unwrap();
    let mut es = gpu.upload::<u32>(&[]).unwrap();
    let ec = gpu.upload::<u32>(&[]).unwrap();
    let mut eo = gpu.upload::<u32>(&[]).unwrap();
    gpu.sample_rows(SampleRows::new(&e, &mut es, &ec, &mut eo, 10), p)
        .unwrap();
    let l = gpu.upload(&[0.0f32; 6]).unwrap();
    let c = gpu.upload(&[0u32; 2]).unwrap();
    let mut s = gpu.upload(&[0u32; 2]).unwrap();
    let mut o = gpu.upload(&[9u32; 2]).unwrap();
    let mut short = gpu.upload(&[0u32; 1]).unwrap();
    assert!(gpu_core::testing::refuses(
        &gpu,
        SampleRows::new(&l, &mut short, &c, &mut o, 3),
        p
    ));
    assert!(gpu_core::testing::refuses(
        &gpu,
        SampleRows::new(&l, &mut s, &c, &mut o, 4),
        p
    ));
    let nan = SampleParams {
        temperature: f32::NAN,
        ..p
    };
    assert!(gpu_core::testing::refuses(
        &gpu,
        SampleRows::new(&l, &mut s, &c, &mut o, 3),
        nan
    ));
    assert_eq!(gpu.download::<u32>(&o).unwrap(), [9, 9]);
}
