//! The decode kernels (rotary embedding with its cache writes, attention of new queries against
//! the cache, and its prefill form) against the CPU reference (f64 sines, scores and sums),
//! on fresh random inputs (the seed is printed; replay with `HYBRID_TEST_SEED`): grouped
//! heads, head widths 2 to 256, a sliding window, left padding (a query that sees nothing gets
//! zeros), a rotary position past 131,000 (angles of ~10^5 radians), more slots than one chunk
//! of 64. Without an adapter it prints `SKIP` and returns (fails with `HYBRID_REQUIRE_WGPU=1`).

mod common;

use common::{backend_and_rng, randn, rng, U};
use gpu_core::nn::decode::{
    CacheAttnIn, DecodeDims, DecodeOps, PrefillIn, RopeAppendIn, RopeAppendOut,
};
use gpu_core::{Backend, BufferInfo, CpuBackend, DType, Element};
use gpu_wgpu::testing::backend_or_skip;
use gpu_wgpu::WgpuBackend;

/// A case: the dims, each row's start and slot.
struct Case {
    dims: DecodeDims,
    start: Vec<u32>,
    slot: Vec<u32>,
}

fn dims(b: usize, t: usize, (heads, kv_heads, d): (usize, usize, usize), cap: usize) -> DecodeDims {
    DecodeDims {
        b,
        t,
        heads,
        kv_heads,
        d,
        cap,
        window: None,
    }
}

fn cases() -> Vec<Case> {
    let windowed = DecodeDims {
        window: Some(5),
        ..dims(2, 3, (4, 2, 8), 40)
    };
    vec![
        // Two rows, one left-padded past its first query (zeros), grouped heads.
        Case {
            dims: dims(2, 3, (4, 2, 8), 40),
            start: vec![0, 22],
            slot: vec![10, 20],
        },
        Case {
            dims: windowed,
            start: vec![0, 3],
            slot: vec![10, 30],
        },
        // One new token (decode), the widest head, 150 slots (three chunks).
        Case {
            dims: dims(1, 1, (2, 1, 256), 160),
            start: vec![0],
            slot: vec![149],
        },
        // The narrowest head; multi-query (one key/value head for 3 query heads).
        Case {
            dims: dims(3, 2, (3, 1, 2), 12),
            start: vec![0, 1, 4],
            slot: vec![5, 9, 3],
        },
        // Prefill tiles of 64 queries (three, the last partial), a row left-padded into the
        // second tile; decode over splits of the slots.
        Case {
            dims: dims(2, 150, (4, 2, 64), 200),
            start: vec![0, 70],
            slot: vec![0, 40],
        },
        // A window that starts inside a tile; a head width that is not a multiple of 4.
        Case {
            dims: DecodeDims {
                window: Some(37),
                ..dims(1, 130, (2, 2, 6), 140)
            },
            start: vec![5],
            slot: vec![3],
        },
        // A position past 131,000: angles of ~10^5 radians (decode: 256 splits of 512 slots).
        Case {
            dims: dims(1, 2, (2, 1, 64), 131_080),
            start: vec![0],
            slot: vec![131_070],
        },
    ]
}

/// Rotary frequencies as Llama's: `10000^(−2j/d)`.
fn inv_freq(d: usize) -> Vec<f32> {
    (0..d / 2)
        .map(|j| 10000f32.powf(-2.0 * j as f32 / d as f32))
        .collect()
}

/// `(q_out, k_cache, v_cache)` after `rope_append` on `b`, the caches starting as `caches`.
fn rope<B: DecodeOps + Backend>(
    b: &B,
    c: &Case,
    qkv: &[f32],
    caches: &[f32],
    freq: &[f32],
) -> [Vec<f32>; 3] {
    rope_bufs(b, c, (qkv, caches), freq).map(|x| b.download(&x).unwrap())
}

/// The buffers `(q_out, k_cache, v_cache)` after `rope_append` on `b` in `T`'s dtype (the
/// frequencies f32), the caches starting as `caches`.
fn rope_bufs<B: DecodeOps + Backend, T: Element>(
    b: &B,
    c: &Case,
    (qkv, caches): (&[T], &[T]),
    freq: &[f32],
) -> [B::Buffer; 3] {
    let up = |v: &[T]| b.upload(v).unwrap();
    let (qkv, freq) = (up(qkv), b.upload(freq).unwrap());
    let (start, slot) = (b.upload(&c.start).unwrap(), b.upload(&c.slot).unwrap());
    let mut q = b.allocate(T::DTYPE, c.dims.q_len()).unwrap();
    let (mut k, mut v) = (up(caches), up(caches));
    let x = RopeAppendIn {
        qkv: &qkv,
        inv_freq: &freq,
        start: &start,
        slot: &slot,
        dims: c.dims,
    };
    let out = RopeAppendOut {
        q_out: &mut q,
        k_cache: &mut k,
        v_cache: &mut v,
    };
    b.rope_append(x, out).unwrap();
    [q, k, v]
}

/// The attention's output on `b` (`prefill`: `prefill_attention`, slots from 0).
fn attend<B: DecodeOps + Backend>(
    b: &B,
    c: &Case,
    [q, k, v]: [&[f32]; 3],
    prefill: bool,
    scale: f32,
) -> Vec<f32> {
    let up = |x: &[f32]| b.upload(x).unwrap();
    let (q, k, v) = (up(q), up(k), up(v));
    let (start, slot) = (b.upload(&c.start).unwrap(), b.upload(&c.slot).unwrap());
    let mut out = b.allocate(DType::F32, c.dims.q_len()).unwrap();
    if prefill {
        let x = PrefillIn {
            q: &q,
            k_cache: &k,
            v_cache: &v,
            start: &start,
            dims: c.dims,
            scale,
        };
        b.prefill_attention(x, &mut out).unwrap();
    } else {
        let end = c.slot.iter().map(|&s| s as usize + c.dims.t).max().unwrap();
        let max_end = end.min(c.dims.cap);
        let x = CacheAttnIn {
            q: &q,
            k_cache: &k,
            v_cache: &v,
            start: &start,
            slot: &slot,
            dims: c.dims,
            max_end,
            scale,
        };
        b.cache_attention(x, &mut out).unwrap();
    }
    b.download(&out).unwrap()
}

#[test]
fn rope_append_matches_the_cpu() {
    let Some((g, mut r)) = backend_and_rng("rope_append_matches_the_cpu") else {
        return;
    };
    for c in cases() {
        let qkv = randn(&mut r, c.dims.qkv_len(), 2.0);
        let caches = randn(&mut r, c.dims.cache_len(), 1.0);
        for freq in [inv_freq(c.dims.d), vec![]] {
            let got = rope(&g, &c, &qkv, &caches, &freq);
            let want = rope(&CpuBackend, &c, &qkv, &caches, &freq);
            // Bound: a rotated value x0·cos − x1·sin from sines and cosines within 4 ulps
            // (the angle reduced in three fma steps, then polynomials), two products and a
            // sum: 16·2^-24·(|x0| + |x1|) ≤ 16·2^-24·4 with |x| ≤ 2. Values are copied.
            let tol = 64.0 * U;
            for (name, gv, wv) in [("q", 0, 0), ("k", 1, 1), ("v", 2, 2)] {
                for (i, (a, b)) in got[gv].iter().zip(&want[wv]).enumerate() {
                    assert!(
                        ((a - b) as f64).abs() <= tol,
                        "{:?} {name}[{i}]: {a} against {b} (inv_freq {})",
                        c.dims,
                        freq.len()
                    );
                }
            }
        }
    }
}

/// `(max |v|, δ)`: the largest value and the largest error bound of a score,
/// `(d + 4)·2^-24·|scale|·Σ_e |q_e·k_je|` over every query and slot.
fn score_bound(c: &Case, q: &[f32], k: &[f32], scale: f32) -> f64 {
    let d = c.dims.d;
    let worst_q: f64 = q
        .chunks(d)
        .map(|row| row.iter().map(|x| x.abs() as f64).sum::<f64>())
        .fold(0.0, f64::max);
    let worst_k = k.iter().map(|x| x.abs() as f64).fold(0.0, f64::max);
    (d as f64 + 4.0) * U * scale.abs() as f64 * worst_q * worst_k
}

#[test]
fn cache_and_prefill_attention_match_the_cpu() {
    let Some((g, mut r)) = backend_and_rng("cache_and_prefill_attention_match_the_cpu") else {
        return;
    };
    for c in cases() {
        let q = randn(&mut r, c.dims.q_len(), 2.0);
        let k = randn(&mut r, c.dims.cache_len(), 2.0);
        let v = randn(&mut r, c.dims.cache_len(), 1.0);
        let scale = 1.0 / (c.dims.d as f32).sqrt();
        let delta = score_bound(&c, &q, &k, scale);
        let slots = c.dims.cap as f64;
        // Bound: each weight exp(score − max)/Σ is off by ≤ 2δ + (slots + 8)·2^-24 relative
        // (the scores' error, then the exponentials' and the sums' roundings); the output, a
        // weighted average of values ≤ 1, by that much.
        let tol = 2.0 * delta + (slots + 8.0) * 4.0 * U;
        for prefill in [false, true] {
            let got = attend(&g, &c, [&q, &k, &v], prefill, scale);
            let want = attend(&CpuBackend, &c, [&q, &k, &v], prefill, scale);
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    ((a - b) as f64).abs() <= tol,
                    "{:?} prefill {prefill} out[{i}]: {a} against {b} (tol {tol:e})",
                    c.dims
                );
            }
            // A NaN in the first query makes its head's output NaN on both backends, and only
            // that head's.
            let mut qn = q.clone();
            qn[0] = f32::NAN;
            let gn = attend(&g, &c, [&qn, &k, &v], prefill, scale);
            let wn = attend(&CpuBackend, &c, [&qn, &k, &v], prefill, scale);
            let d = c.dims.d;
            assert!(gn[..d]
                .iter()
                .zip(&wn[..d])
                .all(|(a, b)| a.is_nan() == b.is_nan()));
            assert!(
                gn[d..] == got[d..],
                "{:?}: a NaN reached another head",
                c.dims
            );
            // A query that sees nothing (row 1 of the first case, left-padded past it) gets 0.
            if !prefill && c.start.get(1) == Some(&22) {
                let row = c.dims.t * c.dims.heads * c.dims.d;
                assert!(got[row..row + c.dims.d].iter().all(|&x| x == 0.0));
            }
        }
    }
}

/// As CUDA's kernels (and unlike the CPU, which refuses the call), a slot past the cache is
/// skipped: nothing is written there or anywhere else, and attention sees nothing past the
/// cache; a bf16 cache runs through the default.
#[test]
fn slots_past_the_cache_are_skipped_and_bf16_takes_the_default() {
    let Some(g) = backend_or_skip("slots_past_the_cache_are_skipped_and_bf16_takes_the_default")
    else {
        return;
    };
    let c = Case {
        dims: dims(1, 3, (2, 1, 4), 8),
        start: vec![0],
        slot: vec![6],
    };
    let mut r = rng("slots_past_the_cache");
    let qkv = randn(&mut r, c.dims.qkv_len(), 1.0);
    let caches = randn(&mut r, c.dims.cache_len(), 1.0);
    let [_, k, v] = rope(&g, &c, &qkv, &caches, &inv_freq(4));
    // Slots 6 and 7 written, the third token's slot 8 is past the cache: slots 0..6 unchanged.
    assert_eq!(k[..24], caches[..24]);
    assert_eq!(v[..24], caches[..24]);
    assert_ne!(k[24..], caches[24..]);
    let out = attend(&g, &c, [&qkv[..c.dims.q_len()], &k, &v], false, 0.5);
    assert!(out.iter().all(|x| x.is_finite()));
    // bf16: the default through the host, the same as the CPU's.
    let bf =
        |x: &[f32]| -> Vec<half::bf16> { x.iter().map(|&v| half::bf16::from_f32(v)).collect() };
    let ok = Case { slot: vec![2], ..c };
    let [q, _, vc] = rope_bufs(&g, &ok, (&bf(&qkv), &bf(&caches)), &inv_freq(4));
    assert_eq!(q.dtype(), DType::BF16);
    let v16: Vec<half::bf16> = g.download(&vc).unwrap();
    assert_eq!(v16[8..12], bf(&qkv[12..16])[..]);
}

/// The backend's own buffers only.
#[test]
fn a_foreign_buffer_is_refused() {
    let Some(g) = backend_or_skip("decode_foreign_buffer") else {
        return;
    };
    let Ok(other) = WgpuBackend::new(0) else {
        return;
    };
    let c = dims(1, 1, (1, 1, 2), 2);
    let q = other.upload(&[0f32; 2]).unwrap();
    let kv = g.upload(&[0f32; 4]).unwrap();
    let ids = g.upload(&[0u32]).unwrap();
    let mut out = g.allocate(DType::F32, 2).unwrap();
    let x = CacheAttnIn {
        q: &q,
        k_cache: &kv,
        v_cache: &kv,
        start: &ids,
        slot: &ids,
        dims: c,
        max_end: 1,
        scale: 1.0,
    };
    assert!(g.cache_attention(x, &mut out).is_err());
}
