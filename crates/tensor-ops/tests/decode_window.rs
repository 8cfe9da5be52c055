//! The decode family's sliding window (`DecodeDims::window`) on the CPU reference, against a
//! naive attention over explicitly listed visible slots (`max(start, s + 1 − W) ..= s`), with
//! random inputs: windows of 1, 2, shorter than, equal to and longer than the prompt and the
//! cache, left padding, grouped-query heads; the cache attention from a later slot and the
//! prefill. Bound: both sides compute in f64 and round once to f32, in other summation orders
//! over at most `cap` terms of |x| ≤ 1 products, so they agree to a few f32 ulps of values ≤ 1:
//! `1e-6` absolute (about 8 ulps at 1).

use rand::{rngs::StdRng, Rng, SeedableRng};
use tensor_ops::{CacheView, Device, Tensor};

const DEV: Device = Device::Cpu;

struct Case {
    b: usize,
    t: usize,
    heads: usize,
    kv_heads: usize,
    d: usize,
    cap: usize,
}

/// The naive attention of query `(r, i, h)` at slot `s` (row `r` starting at slot `st`): the
/// visible slots listed, softmax in f64; `qrow` is the query's row of `q`, `kvh` its key/value
/// head, `w` the window.
fn naive(
    c: &Case,
    (q, k, v): (&[f32], &[f32], &[f32]),
    (st, s): (usize, usize),
    (qrow, kvh): (usize, usize),
    (w, scale): (Option<usize>, f64),
) -> Vec<f64> {
    let visible: Vec<usize> = (0..=s)
        .filter(|&j| j >= st && w.is_none_or(|w| s - j < w))
        .collect();
    let slot = |buf: &[f32], j: usize, e: usize| buf[(kvh * c.cap + j) * c.d + e] as f64;
    let scores: Vec<f64> = visible
        .iter()
        .map(|&j| {
            (0..c.d)
                .map(|e| q[qrow * c.d + e] as f64 * slot(k, j, e))
                .sum::<f64>()
                * scale
        })
        .collect();
    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let p: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
    let l: f64 = p.iter().sum();
    (0..c.d)
        .map(|e| {
            let acc: f64 = visible
                .iter()
                .zip(&p)
                .map(|(&j, p)| p * slot(v, j, e))
                .sum();
            if l > 0.0 {
                acc / l
            } else {
                0.0
            }
        })
        .collect()
}

fn check(c: &Case, seed: u64, slot0: usize, window: Option<usize>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut rand = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0..1.0)).collect() };
    let cache_len = c.b * c.kv_heads * c.cap * c.d;
    let (q, k, v) = (
        rand(c.b * c.t * c.heads * c.d),
        rand(cache_len),
        rand(cache_len),
    );
    // Left padding: row r starts at slot r (row 0 unpadded).
    let start: Vec<u32> = (0..c.b as u32).collect();
    let slot = vec![slot0 as u32; c.b];
    let tensor = |x: &[f32], shape: &[usize]| Tensor::from_vec(x.to_vec(), shape, DEV).unwrap();
    let (kt, vt) = (
        tensor(&k, &[c.b, c.kv_heads, c.cap, c.d]),
        tensor(&v, &[c.b, c.kv_heads, c.cap, c.d]),
    );
    let qt = tensor(&q, &[c.b, c.t, c.heads, c.d]);
    let u32s = |x: &[u32]| Tensor::from_vec(x.to_vec(), &[x.len()], DEV).unwrap();
    let (st, sl) = (u32s(&start), u32s(&slot));
    let scale = 0.7f32;
    let got = if slot0 == 0 {
        qt.prefill_attention(&kt, &vt, &st, window, scale).unwrap()
    } else {
        let view = CacheView {
            k: &kt,
            v: &vt,
            start: &st,
            slot: &sl,
            window,
        };
        qt.cache_attention(view, slot0 + c.t, scale).unwrap()
    };
    let got = got.to_vec().unwrap();
    let group = c.heads / c.kv_heads;
    for (r, &row_start) in start.iter().enumerate() {
        for i in 0..c.t {
            for h in 0..c.heads {
                let qrow = (r * c.t + i) * c.heads + h;
                let kvh = r * c.kv_heads + h / group;
                let s = slot0 + i;
                let want = naive(
                    c,
                    (&q, &k, &v),
                    (row_start as usize, s),
                    (qrow, kvh),
                    (window, scale as f64),
                );
                for (e, w) in want.iter().enumerate() {
                    let g = got[qrow * c.d + e] as f64;
                    assert!(
                        (g - w).abs() <= 1e-6,
                        "seed {seed} window {window:?} slot {slot0}: row {r} query {i} head {h} [{e}] {g} vs {w}"
                    );
                }
            }
        }
    }
}

#[test]
fn windowed_attention_matches_the_naive_one() {
    let c = Case {
        b: 3,
        t: 9,
        heads: 4,
        kv_heads: 2,
        d: 6,
        cap: 16,
    };
    for (n, window) in [None, Some(1), Some(2), Some(5), Some(9), Some(16), Some(40)]
        .into_iter()
        .enumerate()
    {
        let seed = 1000 + n as u64;
        eprintln!("seed {seed}, window {window:?}");
        check(&c, seed, 0, window); // prefill of 9 tokens
        check(&c, seed, 7, window); // 9 tokens after 7 cached slots
        let one = Case { t: 1, ..c };
        check(&one, seed, 15, window); // a decode step at the cache's last slot
    }
}

#[test]
fn a_window_of_zero_is_refused() {
    let z =
        |shape: &[usize]| Tensor::from_vec(vec![0f32; shape.iter().product()], shape, DEV).unwrap();
    let (q, k) = (z(&[1, 1, 1, 2]), z(&[1, 1, 4, 2]));
    let st = Tensor::from_vec(vec![0u32], &[1], DEV).unwrap();
    assert!(q
        .prefill_attention(&k, &k.clone(), &st, Some(0), 1.0)
        .is_err());
    let view = CacheView {
        k: &k,
        v: &k.clone(),
        start: &st,
        slot: &st,
        window: Some(0),
    };
    assert!(q.cache_attention(view, 1, 1.0).is_err());
}
