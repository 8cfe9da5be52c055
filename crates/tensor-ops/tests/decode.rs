//! The decode ops on the CPU reference, against the training ops they must agree with:
//! a prefill through `rope_append` + `cache_attention` is `rope` + `causal_attention` on the
//! `[b·heads, t, d]` layout, and decoding one token at a time gives the rows of the one-pass
//! prefill. Also the typed refusals. (CUDA against this reference: gpu-cuda's `nn_decode.rs`.)

use rand::{rngs::StdRng, Rng, SeedableRng};
use tensor_ops::{CacheView, DType, Device, Tensor};

const DEV: Device = Device::Cpu;

fn rand_vec(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
}

fn u32s(v: &[u32]) -> Tensor {
    Tensor::from_vec(v.to_vec(), &[v.len()], DEV).unwrap()
}

/// An f32 tensor of `shape` holding `v`.
fn f32s(v: Vec<f32>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(v, shape, DEV).unwrap()
}

/// The cache view of `k` and `v` with rows from `start` and new tokens at `slot`, no window.
fn cache_view<'a>(
    k: &'a Tensor,
    v: &'a Tensor,
    start: &'a Tensor,
    slot: &'a Tensor,
) -> CacheView<'a> {
    CacheView {
        k,
        v,
        start,
        slot,
        window: None,
    }
}

/// Row `best` of the 4×4 value cache holding 0..16: what attention returns when it sees only
/// that slot.
fn value_row(best: usize) -> Vec<f32> {
    (0..4).map(|e| (best * 4 + e) as f32).collect()
}

/// `[b, t, heads, d]` (or a `[b, t, cols]` block of it) to `[b·heads, t, d]`.
fn to_heads(
    x: &[f32],
    b: usize,
    t: usize,
    heads: usize,
    d: usize,
    cols: usize,
    off: usize,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(b * heads * t * d);
    for r in 0..b {
        for h in 0..heads {
            for i in 0..t {
                let at = (r * t + i) * cols + off + h * d;
                out.extend_from_slice(&x[at..at + d]);
            }
        }
    }
    out
}

#[test]
fn prefill_is_rope_then_causal_attention() {
    let seed = 7;
    let mut rng = StdRng::seed_from_u64(seed);
    let (b, t, heads, d, cap) = (2, 9, 3, 8, 12);
    let base = 10_000f32;
    let cols = 3 * heads * d;
    let qkv = rand_vec(&mut rng, b * t * cols);
    let inv: Vec<f32> = (0..d / 2)
        .map(|j| base.powf(-2.0 * j as f32 / d as f32))
        .collect();
    let k = Tensor::zeros(&[b, heads, cap, d], DEV).unwrap();
    let v = Tensor::zeros(&[b, heads, cap, d], DEV).unwrap();
    let (start, slot) = (u32s(&[0, 0]), u32s(&[0, 0]));
    let view = cache_view(&k, &v, &start, &slot);
    let x = f32s(qkv.clone(), &[b, t, cols]);
    let freqs = f32s(inv, &[d / 2]);
    let q = x.rope_append(&freqs, view, heads, DType::F32).unwrap();
    let scale = 1.0 / (d as f32).sqrt();
    let out = q.cache_attention(view, t, scale).unwrap().to_vec().unwrap();
    // The prefill's own attention (every row at slot 0) is the same function.
    let pre = q.prefill_attention(&k, &v, &start, None, scale).unwrap();
    assert_eq!(pre.shape(), [b, t, heads * d]);
    assert_eq!(pre.to_vec().unwrap(), out);
    // With left padding too: rows see slots start..=i, a padding query gets zeros.
    let late = u32s(&[4, 9]);
    let late_view = CacheView {
        start: &late,
        ..view
    };
    let pre = q.prefill_attention(&k, &v, &late, None, scale).unwrap();
    let want = q.cache_attention(late_view, t, scale).unwrap();
    assert_eq!(pre.to_vec().unwrap(), want.to_vec().unwrap());
    let pre = pre.to_vec().unwrap();
    assert!(pre[..4 * heads * d].iter().all(|&x| x == 0.0));
    assert!(
        pre[t * heads * d..].iter().all(|&x| x == 0.0),
        "row 1 sees nothing"
    );
    // The training ops on the permuted layout.
    let part = |off| {
        Tensor::from_vec(
            to_heads(&qkv, b, t, heads, d, cols, off),
            &[b, heads, t, d],
            DEV,
        )
        .unwrap()
    };
    let (qr, kr) = (
        part(0).rope(base).unwrap(),
        part(heads * d).rope(base).unwrap(),
    );
    let want = Tensor::causal_attention(&qr, &kr, &part(2 * heads * d))
        .unwrap()
        .to_vec()
        .unwrap();
    let got = to_heads(&out, b, t, heads, d, heads * d, 0);
    // rope's angles are f64 (pos·base^(-2j/d)), rope_append's f32 products as transformers:
    // at positions < 9 they differ by < 9·2^-24 rad, and the attention adds f32 roundings of
    // sums of <= 9 terms of size <= 1: 1e-5 is above both.
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() < 1e-5, "seed {seed}: out[{i}] {g} vs {w}");
    }
}

#[test]
fn decoding_token_by_token_gives_the_prefill_rows() {
    let mut rng = StdRng::seed_from_u64(11);
    let (t, heads, kvh, d, cap) = (6, 4, 2, 8, 8);
    let cols = (heads + 2 * kvh) * d;
    let qkv = rand_vec(&mut rng, t * cols);
    let freqs = f32s(vec![1.0, 0.1, 0.01, 0.001], &[4]);
    let scale = 0.3;
    let run = |chunks: &[usize]| -> Vec<f32> {
        let k = Tensor::zeros(&[1, kvh, cap, d], DEV).unwrap();
        let v = Tensor::zeros(&[1, kvh, cap, d], DEV).unwrap();
        let start = u32s(&[1]); // slot 0 is padding
        let mut out = Vec::new();
        let mut at = 0;
        for &n in chunks {
            let slot = u32s(&[at as u32]);
            let view = cache_view(&k, &v, &start, &slot);
            let x = f32s(qkv[at * cols..(at + n) * cols].to_vec(), &[1, n, cols]);
            let q = x.rope_append(&freqs, view, heads, DType::F32).unwrap();
            out.extend(
                q.cache_attention(view, cap, scale)
                    .unwrap()
                    .to_vec()
                    .unwrap(),
            );
            at += n;
        }
        out
    };
    let one_pass = run(&[t]);
    let stepwise = run(&[2, 1, 1, 1, 1]);
    assert_eq!(one_pass, stepwise);
    // The padding slot's query sees nothing: zeros.
    assert!(one_pass[..heads * d].iter().all(|&x| x == 0.0));
}

#[test]
fn decode_ops_refuse_bad_arguments() {
    let k = Tensor::zeros(&[1, 1, 4, 4], DEV).unwrap();
    let v = Tensor::zeros(&[1, 1, 4, 4], DEV).unwrap();
    let (start, slot) = (u32s(&[0]), u32s(&[3]));
    let view = cache_view(&k, &v, &start, &slot);
    let freqs = f32s(vec![1.0, 0.5], &[2]);
    let x = f32s(vec![1.0; 2 * 12], &[1, 2, 12]);
    // Two tokens from slot 3 do not fit 4 slots: refused, the cache untouched.
    assert!(x.rope_append(&freqs, view, 1, DType::F32).is_err());
    assert!(k.to_vec().unwrap().iter().all(|&e| e == 0.0));
    // The same buffer as key and value cache, a head count that does not group.
    let same = CacheView { v: &k, ..view };
    assert!(x.rope_append(&freqs, same, 1, DType::F32).is_err());
    let y = f32s(vec![1.0; 16], &[1, 1, 16]);
    assert!(
        y.rope_append(&freqs, view, 3, DType::F32).is_err(),
        "16 columns are not (3 + 2·1)·4"
    );
    // max_end past the cache, a non-finite scale.
    let q = f32s(vec![1.0; 4], &[1, 1, 1, 4]);
    assert!(q.cache_attention(view, 5, 1.0).is_err());
    assert!(q.cache_attention(view, 4, f32::NAN).is_err());
    // A prefill longer than the cache, a non-finite scale, float positions.
    let long = f32s(vec![1.0; 20], &[1, 5, 1, 4]);
    assert!(long.prefill_attention(&k, &v, &start, None, 1.0).is_err());
    assert!(q
        .prefill_attention(&k, &v, &start, None, f32::INFINITY)
        .is_err());
    let fstart = f32s(vec![0.0], &[1]);
    assert!(q.prefill_attention(&k, &v, &fstart, None, 1.0).is_err());
    assert!(
        q.prefill_attention(&k, &k, &start, None, 1.0).is_ok(),
        "reads only"
    );
    // argmax of rows with no columns, of a scalar.
    let e = Tensor::zeros(&[2, 0], DEV).unwrap();
    assert!(e.argmax_last().is_err());
    let a = f32s(vec![1.0, f32::NAN, 3.0, 3.0, 2.0, 3.0], &[2, 3]);
    assert_eq!(a.argmax_last().unwrap().to_vec_u32().unwrap(), vec![1, 0]);
}

#[test]
fn empty_calls_and_extreme_scores() {
    let k = Tensor::zeros(&[1, 1, 4, 4], DEV).unwrap();
    let v = f32s((0..16).map(|i| i as f32).collect(), &[1, 1, 4, 4]);
    let (start, slot) = (u32s(&[0]), u32s(&[0]));
    let view = cache_view(&k, &v, &start, &slot);
    let freqs = f32s(vec![1.0, 0.5], &[2]);
    // No new tokens: empty outputs, the caches untouched.
    let x = Tensor::zeros(&[1, 0, 12], DEV).unwrap();
    let q = x.rope_append(&freqs, view, 1, DType::F32).unwrap();
    assert_eq!(q.shape(), &[1, 0, 1, 4]);
    assert_eq!(q.cache_attention(view, 0, 1.0).unwrap().numel(), 0);
    assert_eq!(
        q.prefill_attention(&k, &v, &start, None, 1.0)
            .unwrap()
            .numel(),
        0
    );
    assert!(k.to_vec().unwrap().iter().all(|&e| e == 0.0));
    // Scores of ±1e30 scale: the softmax subtracts the maximum, so the output is the value row
    // of the best slot, finite; a NaN query gives NaN, not a silent number.
    let kk = Tensor::from_vec(
        [
            [1.0, 0.0, 0.0, 0.0],
            [-1.0, 0.0, 0.0, 0.0],
            [0.5, 0.0, 0.0, 0.0],
            [0.0; 4],
        ]
        .concat(),
        &[1, 1, 4, 4],
        DEV,
    )
    .unwrap();
    let slot3 = u32s(&[3]);
    let big = CacheView {
        k: &kk,
        slot: &slot3,
        ..view
    };
    for (x0, best) in [(1e30f32, 0usize), (-1e30, 1)] {
        let q = f32s(vec![x0, 0.0, 0.0, 0.0], &[1, 1, 1, 4]);
        let out = q.cache_attention(big, 4, 1.0).unwrap().to_vec().unwrap();
        assert_eq!(out, value_row(best), "q[0] = {x0}");
    }
    let q = f32s(vec![f32::NAN, 0.0, 0.0, 0.0], &[1, 1, 1, 4]);
    let out = q.cache_attention(big, 4, 1.0).unwrap().to_vec().unwrap();
    assert!(out.iter().all(|o| o.is_nan()), "{out:?}");
    // The prefill's attention at the same extremes: 4 queries at slots 0..4, query 3 sees all
    // four keys, so its row is the best slot's values; a NaN query's row is NaN.
    let prefill = |x0: f32| -> Vec<f32> {
        let mut qs = vec![0.0f32; 16];
        qs[12] = x0;
        let q = f32s(qs, &[1, 4, 1, 4]);
        q.prefill_attention(&kk, &v, &start, None, 1.0)
            .unwrap()
            .to_vec()
            .unwrap()
    };
    for (x0, best) in [(1e30f32, 0usize), (-1e30, 1)] {
        let out = prefill(x0);
        assert_eq!(out[12..], value_row(best), "q[3][0] = {x0}");
        assert!(out.iter().all(|o| o.is_finite()));
    }
    let out = prefill(f32::NAN);
    assert!(out[12..].iter().all(|o| o.is_nan()) && out[..12].iter().all(|o| o.is_finite()));
}

/// The fused decode ops are the unfused training ops: `add_rms_norm` is `add` then `rms_norm`
/// then the cast (f32 sums of ≤ 48 squares: within 1e-5 relative), `swiglu_packed` is
/// `swiglu` of the two halves.
#[test]
fn fused_decode_ops_are_the_unfused_ones() {
    let mut rng = StdRng::seed_from_u64(17);
    let (rows, cols) = (3, 48);
    let t = f32s;
    let x = t(rand_vec(&mut rng, rows * cols), &[1, rows, cols]);
    let y = t(rand_vec(&mut rng, rows * cols), &[1, rows, cols]);
    let w = t(rand_vec(&mut rng, cols), &[cols]);
    for (yy, dtype) in [(Some(&y), DType::F32), (None, DType::BF16)] {
        let (sum, normed) = x.add_rms_norm(yy, &w, 1e-5, dtype).unwrap();
        let want_sum = yy.map_or(x.clone(), |y| x.add(y).unwrap());
        assert_eq!(sum.to_vec().unwrap(), want_sum.to_vec().unwrap());
        let want = want_sum
            .rms_norm(&w, 1e-5)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let (g, wv) = (
            normed.to_dtype(DType::F32).unwrap().to_vec().unwrap(),
            want.to_dtype(DType::F32).unwrap().to_vec().unwrap(),
        );
        let ulp = if dtype == DType::BF16 {
            1.0 / 128.0
        } else {
            0.0
        };
        for (a, b) in g.iter().zip(&wv) {
            assert!(
                (a - b).abs() <= (1e-5 + ulp) * b.abs() + 1e-30,
                "{a} vs {b} ({dtype})"
            );
        }
    }
    let gu = t(rand_vec(&mut rng, rows * 2 * cols), &[rows, 2 * cols]);
    let got = gu.swiglu_packed().unwrap();
    assert_eq!(got.shape(), &[rows, cols]);
    let want = gu
        .narrow(-1, 0, cols)
        .unwrap()
        .swiglu(&gu.narrow(-1, cols, cols).unwrap())
        .unwrap();
    for (a, b) in got.to_vec().unwrap().iter().zip(&want.to_vec().unwrap()) {
        assert!((a - b).abs() <= 1e-6 * b.abs() + 1e-30, "{a} vs {b}");
    }
    assert!(t(vec![0.0; 3], &[3]).swiglu_packed().is_err());
    assert!(x.add_rms_norm(Some(&w), &w, 1e-5, DType::F32).is_err());
}
