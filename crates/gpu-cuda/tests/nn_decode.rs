//! The decode family (`gpu_core::nn::decode`: `rope_append`, `cache_attention`, `argmax_rows`)
//! on CUDA against the CPU reference (f64 sums), on fresh random inputs (printed, replayable
//! seed), every f32/bf16 combination, grouped-query heads, several cache chunks, windows that
//! start late (left padding) or are empty, and untouched cache slots that must keep their
//! values. Each tolerance is the error bound stated at its check. Tests named `gpu_*` skip
//! without a GPU.

mod common;

use common::*;
use gpu_core::nn::decode::DecodeOps;
use gpu_core::nn::decode::{CacheAttnIn, DecodeDims, RopeAppendIn, RopeAppendOut};
use gpu_core::nn::Primitives;
use gpu_core::{Backend, CpuBackend, DType};
use gpu_cuda::testing::backend_or_skip;
use gpu_cuda::CudaBackend;
use half::bf16;
use rand::rngs::StdRng;
use rand::Rng;

const U: f64 = 1.0 / (1u64 << 24) as f64; // f32 unit roundoff
const BF16_REL: f64 = 1.0 / 128.0; // one bf16 ulp, relative (8 significant bits)

/// The stored value of `x` in `dtype` (what an upload keeps).
fn stored(x: &[f32], dtype: DType) -> Vec<f32> {
    match dtype {
        DType::BF16 => x.iter().map(|&v| bf16::from_f32(v).to_f32()).collect(),
        _ => x.to_vec(),
    }
}

/// The inputs of a rope-append: the fused projection, the frequencies, each row's first
/// real and first new slot, and the sizes.
fn rope_in<'a, Buf>(
    qkv: &'a Buf,
    inv_freq: &'a Buf,
    start: &'a Buf,
    slot: &'a Buf,
    dims: DecodeDims,
) -> RopeAppendIn<'a, Buf> {
    RopeAppendIn {
        qkv,
        inv_freq,
        start,
        slot,
        dims,
    }
}

/// The outputs of a rope-append: the rotated queries and the two caches.
fn rope_out<'a, Buf>(
    q_out: &'a mut Buf,
    k_cache: &'a mut Buf,
    v_cache: &'a mut Buf,
) -> RopeAppendOut<'a, Buf> {
    RopeAppendOut {
        q_out,
        k_cache,
        v_cache,
    }
}

const DTYPES: [DType; 2] = [DType::F32, DType::BF16];

/// Random row positions: `slot[r] + t <= cap`; `start[r]` anywhere up to `slot[r] + t + 2`,
/// so some windows start late and some queries see nothing.
fn positions(rng: &mut StdRng, b: usize, t: usize, cap: usize) -> (Vec<u32>, Vec<u32>) {
    let slot: Vec<u32> = (0..b)
        .map(|_| rng.random_range(0..=cap - t) as u32)
        .collect();
    let start = slot
        .iter()
        .map(|&s| match rng.random_range(0..4) {
            0 => 0,
            1 => rng.random_range(0..=s + t as u32 + 2),
            _ => rng.random_range(0..=s),
        })
        .collect();
    (start, slot)
}

/// The dims of a random case: (b, t, heads, kv_heads, d, cap).
type Shape = (usize, usize, usize, usize, usize, usize);

/// The dims of the random cases.
const SHAPES: &[Shape] = &[
    (1, 1, 4, 2, 64, 700),
    (3, 1, 8, 2, 128, 300),
    (2, 5, 3, 1, 6, 40),
    (2, 37, 4, 4, 64, 600),
    (1, 3, 2, 1, 192, 520),
    (1, 2, 18, 1, 16, 1300),
    (2, 1, 14, 2, 64, 200),
    (1, 4, 4, 4, 8, 70),
];

/// Every shape of [`SHAPES`] with every choice of `N` storage dtypes from [`DTYPES`], in the
/// order of nested loops (shape outermost, then the first dtype; the last dtype varies fastest).
fn shapes_and_dtypes<const N: usize>() -> impl Iterator<Item = (Shape, [DType; N])> {
    let combos = DTYPES.len().pow(N as u32);
    SHAPES.iter().flat_map(move |&shape| {
        (0..combos).map(move |i| {
            let digit = |k: usize| (i / DTYPES.len().pow((N - 1 - k) as u32)) % DTYPES.len();
            (shape, std::array::from_fn(|k| DTYPES[digit(k)]))
        })
    })
}

/// `rope_append` on random inputs, on the GPU and the reference; `rope: false` passes an
/// empty `inv_freq` (no rotation, GPT-2's cache write).
fn rope_case(gpu: &CudaBackend, rng: &mut StdRng, shape: Shape, dt: [DType; 3], rope: bool) {
    let (b, t, heads, kv_heads, d, cap) = shape;
    let dims = decode_dims(shape, None);
    let what = format!("{dims:?} qkv/q/cache {dt:?} rope {rope}");
    let qkv = random_vec(rng, dims.qkv_len(), 2.0);
    let theta = [10_000f64, 500_000.0][rng.random_range(0..2)];
    let freq: Vec<f32> = (0..d / 2)
        .filter(|_| rope)
        .map(|j| theta.powf(-2.0 * j as f64 / d as f64) as f32)
        .collect();
    let (start, slot) = positions(rng, b, t, cap);
    let kc0 = random_vec(rng, dims.cache_len(), 1.0);
    let vc0 = random_vec(rng, dims.cache_len(), 1.0);
    let run = |be_cpu: Option<&CpuBackend>| -> [Vec<f32>; 3] {
        macro_rules! go {
            ($be:expr) => {{
                let be = $be;
                let (x, f) = (put(be, &qkv, dt[0]), be.upload(&freq).unwrap());
                let (st, sl) = (be.upload(&start).unwrap(), be.upload(&slot).unwrap());
                let mut q = put(be, &vec![f32::NAN; dims.q_len()], dt[1]);
                let (mut kc, mut vc) = (put(be, &kc0, dt[2]), put(be, &vc0, dt[2]));
                be.rope_append(
                    rope_in(&x, &f, &st, &sl, dims),
                    rope_out(&mut q, &mut kc, &mut vc),
                )
                .unwrap();
                [get(be, &q), get(be, &kc), get(be, &vc)]
            }};
        }
        match be_cpu {
            Some(c) => go!(c),
            None => go!(gpu),
        }
    };
    let (want, got) = (run(Some(&CPU)), run(None));
    if !rope {
        // Without rotation q and k are copied as v is (cos 1, sin 0: `x·1 − y·0` is `x`), each
        // rounded once to its output's dtype on both sides: equal exactly.
        assert_eq!(got, want, "{what}");
        return;
    }
    // The angles are the same f32 products on both sides; sincosf is within 2 ulp (absolute
    // error <= 2^-23 = 2u) and the rotation's two products and sum add 3 roundings, against an
    // f64 reference rounded once: the f32 results differ by at most
    // δ = (|x0| + |x1|)·5u + u·|ref|. A bf16 store adds at most one bf16 ulp: 2^-7·(|ref| + δ).
    // The values (v) are copied, so they are equal exactly, and so are the slots not written.
    let x = stored(&qkv, dt[0]);
    let cols = dims.qkv_cols();
    let bound = |tok: usize, head: usize, j: usize, r: f64, out: DType| {
        let row = &x[tok * cols + head * d..];
        let jj = j % (d / 2);
        let pair = row[jj].abs() as f64 + row[jj + d / 2].abs() as f64;
        let delta = pair * 5.0 * U + U * r.abs();
        delta
            + if out == DType::BF16 {
                BF16_REL * (r.abs() + delta)
            } else {
                0.0
            }
    };
    for (i, (&g, &w)) in got[0].iter().zip(&want[0]).enumerate() {
        let (tok, head, j) = (i / (heads * d), i / d % heads, i % d);
        let b = bound(tok, head, j, w as f64, dt[1]);
        assert!(
            (g as f64 - w as f64).abs() <= b,
            "{what}: q[{i}] got {g} want {w} bound {b:e}"
        );
    }
    let mut kbound = vec![0f64; dims.cache_len()];
    for (r, &first) in slot.iter().enumerate() {
        for i in 0..t {
            let s = first as usize + i;
            for g in 0..kv_heads {
                for j in 0..d {
                    let at = ((r * kv_heads + g) * cap + s) * d + j;
                    kbound[at] = bound(r * t + i, heads + g, j, want[1][at] as f64, dt[2]);
                }
            }
        }
    }
    for (i, ((&g, &w), &bd)) in got[1].iter().zip(&want[1]).zip(&kbound).enumerate() {
        assert!(
            (g as f64 - w as f64).abs() <= bd,
            "{what}: k_cache[{i}] got {g} want {w} bound {bd:e}"
        );
    }
    assert_eq!(got[2], want[2], "{what}: v_cache (copies) differ");
}

#[test]
fn gpu_rope_append_matches_cpu() {
    let (gpu, mut rng) = skip_unless!(gpu_and_rng("gpu_rope_append_matches_cpu"));
    for (shape, dt) in shapes_and_dtypes() {
        rope_case(&gpu, &mut rng, shape, dt, true);
        rope_case(&gpu, &mut rng, shape, dt, false);
    }
}

fn attention_case(
    gpu: &CudaBackend,
    rng: &mut StdRng,
    shape: Shape,
    dt: [DType; 2],
    window: Option<usize>,
) {
    let (b, t, heads, kv_heads, d, cap) = shape;
    let dims = decode_dims(shape, window);
    let what = format!("{dims:?} q/cache {dt:?}");
    let scale = 1.0 / (d as f32).sqrt();
    let q = stored(&random_vec(rng, dims.q_len(), 3.0), dt[0]);
    let kc = stored(&random_vec(rng, dims.cache_len(), 3.0), dt[1]);
    let vc = stored(&random_vec(rng, dims.cache_len(), 1.0), dt[1]);
    let (start, slot) = positions(rng, b, t, cap);
    let max_end = slot.iter().map(|&s| s as usize + t).max().unwrap_or(0);
    macro_rules! go {
        ($be:expr) => {{
            let be = $be;
            let (qb, kb, vb) = (put(be, &q, dt[0]), put(be, &kc, dt[1]), put(be, &vc, dt[1]));
            let (st, sl) = (be.upload(&start).unwrap(), be.upload(&slot).unwrap());
            let mut out = put(be, &vec![f32::NAN; dims.q_len()], dt[0]);
            be.cache_attention(
                CacheAttnIn {
                    q: &qb,
                    k_cache: &kb,
                    v_cache: &vb,
                    start: &st,
                    slot: &sl,
                    dims,
                    max_end,
                    scale,
                },
                &mut out,
            )
            .unwrap();
            get(be, &out)
        }};
    }
    let (want, got) = (go!(&CPU), go!(gpu));
    // Bound per query row, from the kernel's f32 arithmetic against the f64 reference: each
    // score s_j = scale·q·k_j errs by at most e_s = (γ_d + 2u)·S, S = scale·max_j Σ|q_e k_je|;
    // w_j = exp(s_j − m) then errs relatively by η = 2·e_s + u·2S + 4u (the max's error, the
    // subtraction's rounding, expf's 2 ulp); the normalised sum Σ w_j v_j / Σ w_j errs by at
    // most (2η + 2γ_n)·max|v| (n = window + chunk count + 2 additions), and a bf16 output
    // adds one bf16 ulp.
    let group = heads / kv_heads;
    let gamma = |n: usize| n as f64 * U / (1.0 - n as f64 * U);
    for r in 0..b {
        for i in 0..t {
            let s = slot[r] as usize + i;
            for h in 0..heads {
                let row = ((r * t + i) * heads + h) * d;
                let base = (r * kv_heads + h / group) * cap;
                let first = dims.first_visible(start[r] as usize, s);
                let window = first..(s + 1).max(first);
                let (mut big_s, mut vmax) = (0f64, 0f64);
                for j in window.clone() {
                    let dot: f64 = (0..d)
                        .map(|e| (q[row + e] as f64 * kc[(base + j) * d + e] as f64).abs())
                        .sum();
                    big_s = big_s.max(scale as f64 * dot);
                    for e in 0..d {
                        vmax = vmax.max((vc[(base + j) * d + e] as f64).abs());
                    }
                }
                let e_s = (gamma(d) + 2.0 * U) * big_s;
                let eta = 2.0 * e_s + 2.0 * U * big_s + 4.0 * U;
                let n = window.len() + max_end.div_ceil(64) + 2;
                for e in 0..d {
                    let (g, w) = (got[row + e] as f64, want[row + e] as f64);
                    let mut bd = (2.0 * eta + 2.0 * gamma(n)) * vmax;
                    if dt[0] == DType::BF16 {
                        bd += BF16_REL * (w.abs() + bd);
                    }
                    assert!(
                        (g - w).abs() <= bd,
                        "{what}: out[{r},{i},{h},{e}] got {g} want {w} bound {bd:e} (window {window:?})"
                    );
                }
            }
        }
    }
}

#[test]
fn gpu_cache_attention_matches_cpu() {
    let (gpu, mut rng) = skip_unless!(gpu_and_rng("gpu_cache_attention_matches_cpu"));
    for (shape, dt) in shapes_and_dtypes() {
        attention_case(&gpu, &mut rng, shape, dt, None);
    }
}

/// The same with sliding windows (1, 2, shorter than a chunk, a chunk and more, past the
/// cache): chunks wholly before a query's window write the empty partial, and the bound is
/// the one above over the window's slots.
#[test]
fn gpu_cache_attention_sliding_window_matches_cpu() {
    const NAME: &str = "gpu_cache_attention_sliding_window_matches_cpu";
    let (gpu, mut rng) = skip_unless!(gpu_and_rng(NAME));
    for &shape in SHAPES {
        for window in [1, 2, 37, 64, 300, shape.5 + 5] {
            for dt in [[DType::F32, DType::F32], [DType::BF16, DType::BF16]] {
                attention_case(&gpu, &mut rng, shape, dt, Some(window));
            }
        }
    }
}

#[test]
fn gpu_argmax_rows_matches_cpu() {
    let (gpu, mut rng) = skip_unless!(gpu_and_rng("gpu_argmax_rows_matches_cpu"));
    for &cols in &[1usize, 31, 1024, 1025, 128_256] {
        for dtype in DTYPES {
            let rows = 5;
            let mut x = random_vec(&mut rng, rows * cols, 10.0);
            // Row 1: ties at the maximum (the first must win); row 2: a NaN (it wins); row 3: all
            // -inf (index 0); row 4: few distinct values (many ties in bf16).
            if cols > 3 {
                x[cols + cols / 2] = 100.0;
                x[cols + cols - 1] = 100.0;
                x[2 * cols + cols / 3] = f32::NAN;
                x[2 * cols + cols - 1] = f32::NAN;
            }
            x[3 * cols..4 * cols].fill(f32::NEG_INFINITY);
            for v in &mut x[4 * cols..] {
                *v = v.round().clamp(-2.0, 2.0);
            }
            let run = |want: bool| -> Vec<u32> {
                macro_rules! go {
                    ($be:expr) => {{
                        let be = $be;
                        let xb = put(be, &x, dtype);
                        let mut out = be.upload(&vec![u32::MAX; rows]).unwrap();
                        be.argmax_rows(&xb, &mut out, cols).unwrap();
                        be.download::<u32>(&out).unwrap()
                    }};
                }
                if want {
                    go!(&CPU)
                } else {
                    go!(&gpu)
                }
            };
            assert_eq!(run(false), run(true), "cols {cols} {dtype:?}");
        }
    }
}

/// What only the device knows it cannot report: a slot past the cache. The CPU refuses it
/// (typed error, nothing written); CUDA skips the write and leaves the cache as it was.
#[test]
fn gpu_slot_past_the_cache_writes_nothing() {
    let gpu = skip_unless!(backend_or_skip("gpu_slot_past_the_cache_writes_nothing"));
    let dims = decode_dims((1, 2, 2, 1, 4, 3), None);
    macro_rules! go {
        ($be:expr) => {{
            let be = $be;
            let x = be.upload(&vec![1f32; dims.qkv_len()]).unwrap();
            let f = be.upload(&[1f32, 0.5]).unwrap();
            let (st, sl) = (be.upload(&[0u32]).unwrap(), be.upload(&[2u32]).unwrap());
            let mut q = be.upload(&vec![0f32; dims.q_len()]).unwrap();
            let mut kc = be.upload(&vec![7f32; dims.cache_len()]).unwrap();
            let mut vc = be.upload(&vec![7f32; dims.cache_len()]).unwrap();
            let r = be.rope_append(
                rope_in(&x, &f, &st, &sl, dims),
                rope_out(&mut q, &mut kc, &mut vc),
            );
            (
                r,
                be.download::<f32>(&kc).unwrap(),
                be.download::<f32>(&vc).unwrap(),
            )
        }};
    }
    let (r, kc, vc) = go!(&CPU);
    assert!(
        r.is_err(),
        "the CPU must refuse slot 2 + 2 tokens in 3 slots"
    );
    assert!(kc.iter().chain(&vc).all(|&v| v == 7.0));
    let (r, kc, vc) = go!(&gpu);
    r.unwrap();
    // Slot 2 (the first token) is written; slot 3 is past the cache and skipped.
    assert!(kc[..8].iter().chain(&vc[..8]).all(|&v| v == 7.0));
    assert_eq!(&vc[8..], &[1.0; 4]);
}
