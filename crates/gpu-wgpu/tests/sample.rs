//! `sample_rows` on wgpu (`sample.wgsl`) against the CPU reference, token for token and bit
//! for bit in `seen`, on random inputs (the seed is printed; replay with `HYBRID_TEST_SEED`,
//! draw a fresh one with `HYBRID_TEST_SEED=fresh`): f32 and bf16 logits, vocabularies of 1 to
//! 128,256, greedy with and without a repetition penalty, temperature, top-k and top-p and
//! their combinations, partly set `seen` masks, varied counters and offsets; ties, ±0, −∞,
//! subnormal and huge logits, rows with no token; a draw exactly on a token's boundary and a
//! mass above exactly equal to the top-p cut. The emulations inside the kernel are checked one
//! by one in `sample_math.rs`. Without an adapter each test prints `SKIP` and returns (fails
//! with `HYBRID_REQUIRE_WGPU=1`).

mod common;

use common::backend_and_rng;
use gpu_core::nn::sample::{
    draw, draw_target, seen_words, top_p_cut, weight, SampleParams, SampleRows,
};
use gpu_core::nn::SampleOps;
use gpu_core::CpuBackend;
use gpu_wgpu::testing::backend_or_skip;
use gpu_wgpu::WgpuBackend;
use half::bf16;
use rand::rngs::StdRng;
use rand::Rng;

const BASE: SampleParams = gpu_core::testing::PLAIN_SAMPLING;

/// One batch: `[rows, vocab]` logits, the `seen` mask and the counters.
struct Batch {
    logits: Vec<f32>,
    vocab: usize,
    seen: Vec<u32>,
    counter: Vec<u32>,
}

/// `(out, seen)` after `sample_rows` on `b` (bf16: the logits rounded to bf16).
fn sample<B: SampleOps>(b: &B, x: &Batch, as_bf16: bool, p: SampleParams) -> (Vec<u32>, Vec<u32>) {
    let logits = if as_bf16 {
        let h: Vec<bf16> = x.logits.iter().map(|&v| bf16::from_f32(v)).collect();
        b.upload(&h).unwrap()
    } else {
        b.upload(&x.logits).unwrap()
    };
    let mut seen = b.upload(&x.seen).unwrap();
    let counter = b.upload(&x.counter).unwrap();
    let mut out = b.upload(&vec![u32::MAX; x.counter.len()]).unwrap();
    b.sample_rows(
        SampleRows::new(&logits, &mut seen, &counter, &mut out, x.vocab),
        p,
    )
    .unwrap();
    (b.download(&out).unwrap(), b.download(&seen).unwrap())
}

/// Runs `x` under each of `params` in f32 and bf16 on both backends; every token and the
/// final mask must agree. Returns the tokens (f32, per setting) for further checks.
fn agree(g: &WgpuBackend, x: &Batch, params: &[SampleParams], what: &str) -> Vec<Vec<u32>> {
    let mut tokens = Vec::new();
    for &p in params {
        for as_bf16 in [false, true] {
            let want = sample(&CpuBackend, x, as_bf16, p);
            let got = sample(g, x, as_bf16, p);
            assert_eq!(
                got,
                want,
                "{what}: vocab {} rows {} bf16 {as_bf16} {p:?}",
                x.vocab,
                x.counter.len()
            );
            if !as_bf16 {
                tokens.push(want.0);
            }
        }
    }
    tokens
}

/// `rows` rows of logits `scale·u` (u uniform in ±1) with a fifth of the tokens seen, random
/// counters near u32's wrap for some rows.
fn random_batch(r: &mut StdRng, rows: usize, vocab: usize, scale: f32) -> Batch {
    let logits = common::randn(r, rows * vocab, scale);
    let words = seen_words(vocab);
    let seen = (0..rows * words)
        .map(|_| r.random::<u32>() & r.random::<u32>() & r.random::<u32>())
        .collect();
    let counter = (0..rows)
        .map(|_| match r.random_range(0..3) {
            0 => r.random_range(0..16),
            1 => u32::MAX - r.random_range(0..4),
            _ => r.random(),
        })
        .collect();
    Batch {
        logits,
        vocab,
        seen,
        counter,
    }
}

/// The settings the random batches run under: greedy (plain and penalized), temperature,
/// top-k (1, 2, 50, vocab, past vocab), top-p (1e-6, 0.5, 0.95, 1) and combinations.
fn settings(r: &mut StdRng, vocab: usize) -> Vec<SampleParams> {
    let v = vocab as u32;
    let mut p = vec![
        SampleParams {
            temperature: 0.0,
            ..BASE
        },
        SampleParams {
            temperature: 0.0,
            penalty: 1.3,
            ..BASE
        },
        SampleParams {
            temperature: 0.7,
            ..BASE
        },
        SampleParams {
            temperature: 1.5,
            penalty: 0.8,
            ..BASE
        },
    ];
    for top_k in [1, 2, 50, v, v + 7] {
        p.push(SampleParams { top_k, ..BASE });
    }
    for top_p in [1e-6, 0.5, 0.95, 1.0] {
        p.push(SampleParams { top_p, ..BASE });
    }
    p.push(SampleParams {
        temperature: 0.8,
        top_k: 50,
        top_p: 0.9,
        penalty: 1.2,
        ..BASE
    });
    p.push(SampleParams {
        temperature: 2.0,
        top_k: 3,
        top_p: 0.5,
        ..BASE
    });
    for q in &mut p {
        q.seed = r.random();
        q.offset = r.random_range(0..1000);
    }
    p
}

#[test]
fn random_rows_match_the_cpu_token_for_token() {
    let Some((g, mut r)) = backend_and_rng("random_rows_match_the_cpu_token_for_token") else {
        return;
    };
    for (vocab, rows) in [(1, 3), (31, 16), (32, 5), (33, 11), (1000, 7)] {
        for scale in [3.0, 12.0] {
            let x = random_batch(&mut r, rows, vocab, scale);
            let all = settings(&mut r, vocab);
            let tokens = agree(&g, &x, &all, "random");
            // The draws do vary (a row of a wide vocabulary at temperature 1.5).
            if vocab >= 1000 && scale == 3.0 {
                let t = &tokens[3];
                assert!(t.iter().any(|&v| v != t[0]), "{t:?}");
            }
        }
    }
}

#[test]
fn large_vocabularies_match_the_cpu() {
    let Some((g, mut r)) = backend_and_rng("large_vocabularies_match_the_cpu") else {
        return;
    };
    for (vocab, rows) in [(50257, 2), (128256, 1)] {
        let x = random_batch(&mut r, rows, vocab, 8.0);
        let all = settings(&mut r, vocab);
        // Greedy penalized, temperature, top-k 50 and past vocab, top-p 0.95, a combination.
        let some: Vec<SampleParams> = [1, 3, 6, 8, 11, 13].iter().map(|&i| all[i]).collect();
        agree(&g, &x, &some, "large");
    }
}

/// Row `kind` of the hostile batch: ties, ±0, −∞, subnormal and huge values, and the rows
/// with no token (a NaN, a +∞, all −∞).
fn hostile_row(r: &mut StdRng, kind: usize, vocab: usize) -> Vec<f32> {
    let pick = |r: &mut StdRng, set: &[f32]| -> Vec<f32> {
        (0..vocab)
            .map(|_| set[r.random_range(0..set.len())])
            .collect()
    };
    let mut row = match kind {
        0 => pick(r, &[-1.0, 0.0, 1.0, 2.0]),
        1 => pick(r, &[0.0, -0.0, -0.0, -1.0]),
        2 => vec![5.0; vocab],
        3 => pick(r, &[f32::NEG_INFINITY, 0.5, -0.25, 3.0]),
        4 => vec![f32::NEG_INFINITY; vocab],
        5 => pick(
            r,
            &[1e-40, -1e-40, 0.0, -0.0, 1e-45, 2e-45, f32::MIN_POSITIVE],
        ),
        6 => pick(r, &[1e30, -1e30, 0.0]),
        7 => pick(r, &[1e37, -1e37, 1.0]),
        8 => pick(r, &[3.0, 1.0, 1.0, 1.0, -2.0]),
        9 => {
            let mut v = vec![f32::NEG_INFINITY; vocab];
            v[r.random_range(0..vocab)] = -7.0;
            v
        }
        _ => common::randn(r, vocab, 4.0),
    };
    // A NaN or +∞ somewhere: no token, `seen` kept.
    match kind {
        10 => row[r.random_range(0..vocab)] = f32::NAN,
        11 => row[r.random_range(0..vocab)] = f32::INFINITY,
        _ => {}
    }
    row
}

/// Kinds of [`hostile_row`].
const KINDS: usize = 13;

#[test]
fn hostile_rows_match_the_cpu() {
    let Some((g, mut r)) = backend_and_rng("hostile_rows_match_the_cpu") else {
        return;
    };
    let t = |temperature: f32| SampleParams {
        temperature,
        ..BASE
    };
    let mut params = vec![
        t(0.0),
        SampleParams {
            penalty: 2.0,
            ..t(0.0)
        },
        t(0.01),
        t(1.0),
        t(1e-3),
        // 1/t overflows every |z| past 3.4e8; 1/t subnormal (every product a subnormal one).
        t(1e-30),
        t(3e38),
        SampleParams { top_k: 2, ..t(1.0) },
        SampleParams { top_k: 5, ..t(0.5) },
        SampleParams {
            top_p: 0.5,
            ..t(1.0)
        },
        SampleParams {
            top_p: 1e-6,
            top_k: 3,
            ..t(1.0)
        },
        // A seen positive logit times 1000: 1e37 overflows.
        SampleParams {
            penalty: 1e-3,
            top_p: 0.9,
            ..t(1.0)
        },
    ];
    for p in &mut params {
        p.seed = r.random();
    }
    for vocab in [1, 40, 600] {
        let logits: Vec<f32> = (0..KINDS)
            .flat_map(|k| hostile_row(&mut r, k, vocab))
            .collect();
        let mut x = random_batch(&mut r, KINDS, vocab, 1.0);
        x.logits = logits;
        let tokens = agree(&g, &x, &params, "hostile");
        // All −∞, a NaN, a +∞: no token at any setting.
        for t in &tokens {
            assert_eq!([t[4], t[10], t[11]], [vocab as u32; 3], "{t:?}");
        }
    }
}

#[test]
fn bad_arguments_are_refused_as_on_the_cpu() {
    let Some(g) = backend_or_skip("bad_arguments_are_refused_as_on_the_cpu") else {
        return;
    };
    gpu_core::testing::check_sample_rows_refusals(&g);
}

/// The adjacent f32 `(t, u)` in `[lo, hi]` (negative) with `f(weight(t))` true and
/// `f(weight(u))` false, for `f` true at `lo` and turning false once; `None` if not at `hi`.
fn turn(lo: f32, hi: f32, f: impl Fn(u64) -> bool) -> Option<(f32, f32)> {
    // Negative floats: larger bits are more negative.
    let (mut a, mut b) = (hi.to_bits(), lo.to_bits());
    if f(weight(f32::from_bits(a))) {
        return None;
    }
    while b - a > 1 {
        let m = a + (b - a) / 2;
        if f(weight(f32::from_bits(m))) {
            b = m;
        } else {
            a = m;
        }
    }
    Some((f32::from_bits(b), f32::from_bits(a)))
}

/// One row of `logits` at counter `n` under `p` on both backends (f32): the tokens.
fn one_row(g: &WgpuBackend, logits: Vec<f32>, n: &[u32], p: SampleParams) -> Vec<u32> {
    let vocab = logits.len();
    let rows = n.len();
    let x = Batch {
        logits: logits.repeat(rows),
        vocab,
        seen: vec![0; rows * seen_words(vocab)],
        counter: n.to_vec(),
    };
    let want = sample(&CpuBackend, &x, false, p);
    assert_eq!(sample(g, &x, false, p), want, "vocab {vocab} {p:?}");
    want.0
}

#[test]
fn a_draw_on_a_boundary_takes_the_next_token() {
    let Some(g) = backend_or_skip("a_draw_on_a_boundary_takes_the_next_token") else {
        return;
    };
    // Token 0 of weight W0, then the maximum (2^40): a draw R with ⌊R·(W0 + 2^40)/2^64⌋ = W0
    // exactly lands on the boundary and must take token 1. Search counters for an R whose W0
    // some logit has.
    let seed = 12345u64;
    let mut found = None;
    for n in 0..2_000_000u32 {
        let r = draw(seed, n, 0);
        if r >= 1 << 62 {
            continue;
        }
        let over = |w: u64| draw_target(r, w + (1 << 40)) > w;
        if let Some((_, x)) = turn(-28.0, -1e-3, over) {
            if draw_target(r, weight(x) + (1 << 40)) == weight(x) {
                found = Some((n, x));
                break;
            }
        }
    }
    let (n, x) = found.expect("no counter lands on a boundary");
    eprintln!("counter {n}: logit {x} of weight {}", weight(x));
    let p = SampleParams { seed, ..BASE };
    // Both tokens in one thread's chunk (vocab 512: two a thread), then in two chunks.
    for vocab in [512, 2] {
        let mut l = vec![f32::NEG_INFINITY; vocab];
        l[0] = x;
        l[1] = 0.0;
        assert_eq!(one_row(&g, l, &[n], p), [1]);
    }
}

#[test]
fn mass_above_equal_to_the_top_p_cut_stops_the_cut() {
    let Some(g) = backend_or_skip("mass_above_equal_to_the_top_p_cut_stops_the_cut") else {
        return;
    };
    // The maximum (2^40), a token A of weight near 2^38, then small tokens that make the total
    // Z such that ⌊0.8·Z⌋ = 2^40 exactly: the mass above A equals the cut, so A is cut.
    let p = 0.8f32;
    let one = 1u64 << 40;
    let z = (one as f64 / p as f64) as u64 - 2;
    let z = (z..z + 8).find(|&z| top_p_cut(p, z) == one).unwrap();
    let (xa, _) = turn(-2.0, -1.0, |w| w <= z - one).unwrap();
    let mut rest = z - one - weight(xa);
    let mut l = vec![0.0, xa];
    for x in [-20.0f32, -25.0, -27.6] {
        let w = weight(x);
        l.extend(std::iter::repeat_n(x, (rest / w) as usize));
        rest %= w;
    }
    assert_eq!(rest, 0);
    let sum: u64 = l.iter().map(|&v| weight(v)).sum();
    assert_eq!((sum, weight(-27.6)), (z, 1));
    let n: Vec<u32> = (0..16).collect();
    let at = |top_p| SampleParams { top_p, ..BASE };
    assert_eq!(one_row(&g, l.clone(), &n, at(p)), [0; 16]);
    // Just above the cut, A stays and is drawn.
    let above = f32::from_bits(p.to_bits() + 1);
    assert!(one_row(&g, l, &n, at(above)).contains(&1));
}
