//! `DecodeOps::prefill_attention` on CUDA (the tensor-core flash attention of
//! `kernels/nn_prefill_bf16.cu` for bf16 heads of width 64 or 128; the cache attention otherwise)
//! against the CPU reference (f64), on fresh random inputs (printed, replayable seed): grouped
//! heads, lengths that are not whole 64-row tiles, left padding that ends inside a tile, on a
//! tile boundary or past the prompt (a row that sees nothing gets zeros), negative and zero
//! scales, NaN in the padding, in stale slots past the prompt and at a later position of the
//! diagonal tile (reaching only the rows that see it). Tests named `gpu_*` skip without a GPU.
//!
//! The bound of the tensor-core path (that of `nn_attention_bf16.rs`'s forward, whose
//! arithmetic this kernel shares): u = 2^-8 (bf16's unit roundoff), ε = 2^-16 (a generous f32
//! accumulation and ex2 error for heads up to 128 wide and ≤ 1024 keys: S's sum of 128 products
//! errs by ≤ 128·2^-24 = 2^-17 of its terms' size, each exponent by 2^-22 and the running rescales by as much per
//! tile); with s_ij = scale·q_i·k_j, σ_ij = |scale|·Σ|q_i∘k_j|, P_ij the reference's
//! probabilities and κ_ij = 1 + σ_ij + |lse_i| (the relative error of a P is ε·κ_ij):
//! |Δout_i| ≤ u·(2·Σ_j P_ij|v_j| + 2|out_i|) + ε·Σ_j P_ij|v_j|·κ_ij + 2F·Σ_j|v_j| + 3F·n_i +
//! 2F + 4F·n_i·|out_i| (P rounded to bf16 for P·V; the output rounded to bf16 by the kernel and
//! by the reference; F = 2^-126 for what ex2.approx.ftz flushes, n_i the keys row i sees; see
//! `nn_attention_bf16.rs` for the flush terms). A wrong mask, slot or head mapping moves an
//! output by a whole value, far outside. The fallback path is the cache attention itself: it
//! must equal `cache_attention` with every slot 0, bit for bit.

mod common;

use common::*;
use gpu_core::nn::decode::{CacheAttnIn, PrefillIn};
use gpu_core::nn::decode::{DecodeDims, DecodeOps};
use gpu_core::testing::same_bits;
use gpu_core::{Backend, DType};
use gpu_cuda::testing::backend_or_skip;
use gpu_cuda::CudaBackend;
use half::bf16;
use rand::rngs::StdRng;
use rand::Rng;

const U_BF16: f64 = 1.0 / 256.0;
const EPS: f64 = 1.0 / 65536.0;
const F: f64 = 1.1754943508222875e-38; // 2^-126

/// The inputs of a prefill: queries, the caches and each row's first real slot, the sizes and
/// the scale.
fn prefill_in<'a, Buf>(
    [q, k_cache, v_cache, start]: [&'a Buf; 4],
    dims: DecodeDims,
    scale: f32,
) -> PrefillIn<'a, Buf> {
    PrefillIn {
        q,
        k_cache,
        v_cache,
        start,
        dims,
        scale,
    }
}

fn bf(x: Vec<f32>) -> Vec<f32> {
    x.into_iter().map(|v| bf16::from_f32(v).to_f32()).collect()
}

struct Case {
    dims: DecodeDims,
    q: Vec<f32>,
    kc: Vec<f32>,
    vc: Vec<f32>,
    start: Vec<u32>,
    scale: f32,
}

fn random_case(rng: &mut StdRng, dims: DecodeDims, scale: f32) -> Case {
    let t = dims.t;
    let start = (0..dims.b)
        .map(|_| match rng.random_range(0..5) {
            0 => 0,
            1 => (rng.random_range(0..=t / 64) * 64) as u32, // a tile boundary
            2 => rng.random_range(t..t + 3) as u32,          // nothing to see
            _ => rng.random_range(0..t.max(1)) as u32,
        })
        .collect();
    Case {
        q: bf(random_vec(rng, dims.q_len(), 2.0)),
        kc: bf(random_vec(rng, dims.cache_len(), 2.0)),
        vc: bf(random_vec(rng, dims.cache_len(), 2.0)),
        start,
        scale,
        dims,
    }
}

fn run<B: Backend + DecodeOps>(be: &B, c: &Case, dtype: DType) -> Vec<f32> {
    let (q, k, v) = (
        put(be, &c.q, dtype),
        put(be, &c.kc, dtype),
        put(be, &c.vc, dtype),
    );
    let st = be.upload(&c.start).unwrap();
    let mut out = put(be, &vec![f32::NAN; c.dims.q_len()], dtype);
    be.prefill_attention(prefill_in([&q, &k, &v, &st], c.dims, c.scale), &mut out)
        .unwrap();
    get(be, &out)
}

/// The row statistics of the bound above for query `i` of row `r`, head `h`: the keys it
/// sees, their probabilities P_j and relative-error factors κ_j (computed once a row: the
/// bound of each element is then one pass over the keys).
struct RowStats {
    keys: std::ops::Range<usize>,
    base: usize,
    p: Vec<f64>,
    kappa: Vec<f64>,
}

fn row_stats(c: &Case, r: usize, i: usize, h: usize) -> RowStats {
    let DecodeDims {
        t,
        heads,
        kv_heads,
        d,
        cap,
        ..
    } = c.dims;
    let qrow = ((r * t + i) * heads + h) * d;
    let base = (r * kv_heads + h / (heads / kv_heads)) * cap;
    let keys = c.dims.first_visible(c.start[r] as usize, i)..i + 1;
    let scale = c.scale as f64;
    let (mut s, mut sigma) = (vec![], vec![]);
    for j in keys.clone() {
        let (dot, abs) = (0..d).fold((0f64, 0f64), |(a, b), x| {
            let p = c.q[qrow + x] as f64 * c.kc[(base + j) * d + x] as f64;
            (a + p, b + p.abs())
        });
        s.push(scale * dot);
        sigma.push(scale.abs() * abs);
    }
    let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = m + s.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
    RowStats {
        keys,
        base,
        p: s.iter().map(|x| (x - lse).exp()).collect(),
        kappa: sigma.iter().map(|x| 1.0 + x + lse.abs()).collect(),
    }
}

/// The bound above for output element `e` of a row with statistics `st`.
fn bound(c: &Case, st: &RowStats, e: usize, out: f64) -> f64 {
    let d = c.dims.d;
    let (mut pv, mut pvk, mut sv) = (0f64, 0f64, 0f64);
    for (n, j) in st.keys.clone().enumerate() {
        let v = (c.vc[(st.base + j) * d + e] as f64).abs();
        pv += st.p[n] * v;
        pvk += st.p[n] * v * st.kappa[n];
        sv += v;
    }
    let n = st.keys.len() as f64;
    U_BF16 * (2.0 * pv + 2.0 * out.abs())
        + EPS * pvk
        + 2.0 * F * sv
        + 3.0 * F * n
        + 2.0 * F
        + 4.0 * F * n * out.abs()
}

fn check_case(gpu: &CudaBackend, c: &Case, what: &str) {
    let (got, want) = (run(gpu, c, DType::BF16), run(&CPU, c, DType::BF16));
    let DecodeDims { b, t, heads, d, .. } = c.dims;
    for r in 0..b {
        for i in 0..t {
            for h in 0..heads {
                let padding = (i as u32) < c.start[r];
                let st = (!padding).then(|| row_stats(c, r, i, h));
                for e in 0..d {
                    let at = ((r * t + i) * heads + h) * d + e;
                    let (g, w) = (got[at] as f64, want[at] as f64);
                    let Some(st) = &st else {
                        assert_eq!(g, 0.0, "{what}: padding query [{r},{i},{h},{e}] got {g}");
                        continue;
                    };
                    let bd = bound(c, st, e, w);
                    assert!(
                        (g - w).abs() <= bd,
                        "{what}: out[{r},{i},{h},{e}] got {g} want {w} bound {bd:e} (start {})",
                        c.start[r]
                    );
                }
            }
        }
    }
}

/// (b, t, heads, kv_heads, cap): whole and partial tiles, t = 1, grouped and plain heads.
const SHAPES: &[(usize, usize, usize, usize, usize)] = &[
    (1, 1, 4, 2, 8),
    (2, 63, 4, 1, 70),
    (1, 64, 2, 2, 64),
    (3, 65, 8, 2, 300),
    (2, 200, 6, 3, 256),
    (1, 512, 4, 1, 600),
    (1, 1000, 2, 1, 1024),
];

#[test]
fn gpu_prefill_attention_matches_cpu() {
    let (gpu, mut rng) = skip_unless!(gpu_and_rng("gpu_prefill_attention_matches_cpu"));
    for (&(b, t, heads, kv_heads, cap), d) in SHAPES.iter().flat_map(|s| [(s, 64), (s, 128)]) {
        let dims = decode_dims((b, t, heads, kv_heads, d, cap), None);
        for scale in [0.125f32, -0.3, 0.0, 1.0] {
            let c = random_case(&mut rng, dims, scale);
            check_case(
                &gpu,
                &c,
                &format!("{dims:?} scale {scale} start {:?}", c.start),
            );
        }
    }
}

/// Sliding windows (1, 2, within a tile, a tile, across tiles, the prompt, past the cache) on
/// the shapes above, heads of width 64 and 128, with the same bound: the window's bound is a
/// mask like the start's, and key tiles wholly before a query tile's window are skipped.
#[test]
fn gpu_prefill_attention_sliding_window_matches_cpu() {
    const NAME: &str = "gpu_prefill_attention_sliding_window_matches_cpu";
    let (gpu, mut rng) = skip_unless!(gpu_and_rng(NAME));
    for (&(b, t, heads, kv_heads, cap), d) in SHAPES.iter().flat_map(|s| [(s, 64), (s, 128)]) {
        for window in [1, 2, 5, 64, 100, t, cap + 7] {
            let dims = decode_dims((b, t, heads, kv_heads, d, cap), Some(window));
            let c = random_case(&mut rng, dims, 0.125);
            let what = format!("{dims:?} start {:?}", c.start);
            check_case(&gpu, &c, &what);
        }
    }
}

/// NaN in the padding slots and in stale slots past the prompt reaches nothing; NaN in the
/// value of a later position of the diagonal tile reaches only the rows at or after it (heads
/// of width 64 and 128; at 128 the infinity sits in the second half of the row).
#[test]
fn gpu_prefill_attention_keeps_nan_where_it_belongs() {
    let (gpu, mut rng) = skip_unless!(gpu_and_rng(
        "gpu_prefill_attention_keeps_nan_where_it_belongs"
    ));
    for d in [64, 128] {
        nan_case(&gpu, &mut rng, d);
    }
}

fn nan_case(gpu: &CudaBackend, rng: &mut StdRng, d: usize) {
    let dims = decode_dims((2, 150, 4, 2, d, 200), None);
    let mut c = random_case(rng, dims, 0.125);
    c.start = vec![37, 0];
    let slot = |r: usize, g: usize, j: usize| ((r * 2 + g) * dims.cap + j) * d;
    for g in 0..2 {
        for j in (0..37).chain(150..200) {
            c.kc[slot(0, g, j) + 5] = f32::NAN;
            c.vc[slot(0, g, j) + d - 9] = f32::INFINITY;
        }
        for j in 150..200 {
            c.kc[slot(1, g, j)] = f32::NAN;
            c.vc[slot(1, g, j)] = f32::NAN;
        }
    }
    // Row 1: position 140 (inside the diagonal tile 128..191) has an infinite value.
    let col = d - 3;
    c.vc[slot(1, 0, 140) + col] = f32::INFINITY;
    let got = run(gpu, &c, DType::BF16);
    let want = run(&CPU, &c, DType::BF16);
    let at_of = |at: usize| (at / (150 * 4 * d), at / (4 * d) % 150, at / d % 4, at % d);
    for (at, (&g, &w)) in got.iter().zip(&want).enumerate() {
        let (r, i, h, e) = at_of(at);
        let sees_inf = r == 1 && h < 2 && i >= 140;
        if sees_inf {
            assert!(
                !g.is_finite() || e != col,
                "d {d}: [{r},{i},{h},{e}] {g} should not be finite"
            );
        } else {
            assert!(g.is_finite(), "d {d}: [{r},{i},{h},{e}] got {g}, want {w}");
        }
    }
    // Rows that do not see the infinite value keep their bits.
    let mut clean = c;
    clean.vc[slot(1, 0, 140) + col] = 0.0;
    let again = run(gpu, &clean, DType::BF16);
    for (at, (&g, &h)) in got.iter().zip(&again).enumerate() {
        let (r, i, head, _) = at_of(at);
        if !(r == 1 && head < 2 && i >= 140) {
            assert_eq!(
                g.to_bits(),
                h.to_bits(),
                "d {d}: element {at} moved by a NaN it cannot see"
            );
        }
    }
}

/// Other head widths and dtypes run the cache attention with every slot 0: the same bits.
#[test]
fn gpu_prefill_attention_falls_back_to_the_cache_attention() {
    let (gpu, mut rng) = skip_unless!(gpu_and_rng(
        "gpu_prefill_attention_falls_back_to_the_cache_attention"
    ));
    for (d, dtype) in [
        (96, DType::BF16),
        (64, DType::F32),
        (128, DType::F32),
        (32, DType::BF16),
    ] {
        let dims = decode_dims((2, 70, 4, 2, d, 80), None);
        let c = random_case(&mut rng, dims, 0.1);
        let got = run(&gpu, &c, dtype);
        let (q, k, v) = (
            put(&gpu, &c.q, dtype),
            put(&gpu, &c.kc, dtype),
            put(&gpu, &c.vc, dtype),
        );
        let st = gpu.upload(&c.start).unwrap();
        let sl = gpu.upload(&[0u32; 2]).unwrap();
        let mut out = put(&gpu, &vec![f32::NAN; dims.q_len()], dtype);
        gpu.cache_attention(
            CacheAttnIn {
                q: &q,
                k_cache: &k,
                v_cache: &v,
                start: &st,
                slot: &sl,
                dims,
                max_end: 70,
                scale: 0.1,
            },
            &mut out,
        )
        .unwrap();
        let want = get(&gpu, &out);
        assert!(
            same_bits(&got, &want),
            "d {d} {dtype:?}: not the cache attention's bits"
        );
    }
}

/// An empty call (no rows, or no queries) succeeds on both widths of the tensor-core path and
/// leaves the caches as they were.
#[test]
fn gpu_prefill_attention_empty_calls_succeed() {
    let gpu = skip_unless!(backend_or_skip("gpu_prefill_attention_empty_calls_succeed"));
    for d in [64, 128] {
        for (b, t) in [(0, 5), (2, 0)] {
            let dims = decode_dims((b, t, 2, 1, d, 8), None);
            let cache: Vec<f32> = (0..dims.cache_len()).map(|i| i as f32).collect();
            let (q, k, v) = (
                put(&gpu, &vec![0f32; dims.q_len()], DType::BF16),
                put(&gpu, &cache, DType::BF16),
                put(&gpu, &cache, DType::BF16),
            );
            let st = gpu.upload(&vec![0u32; b]).unwrap();
            let mut out = put(&gpu, &[], DType::BF16);
            gpu.prefill_attention(prefill_in([&q, &k, &v, &st], dims, 0.5), &mut out)
                .unwrap_or_else(|e| panic!("d {d} b {b} t {t}: {e}"));
            assert_eq!(get(&gpu, &k), bf(cache.clone()), "d {d} b {b} t {t}");
        }
    }
}

/// Bad arguments are typed errors and write nothing.
#[test]
fn gpu_prefill_attention_refuses_bad_arguments() {
    let gpu = skip_unless!(backend_or_skip(
        "gpu_prefill_attention_refuses_bad_arguments"
    ));
    // A cache (8) shorter than the prompt (10).
    let dims = decode_dims((1, 10, 2, 1, 64, 8), None);
    let z = |n: usize| put(&gpu, &vec![0f32; n], DType::BF16);
    let (q, k, v) = (z(dims.q_len()), z(dims.cache_len()), z(dims.cache_len()));
    let st = gpu.upload(&[0u32]).unwrap();
    let mut out = put(&gpu, &vec![7f32; dims.q_len()], DType::BF16);
    assert!(gpu
        .prefill_attention(prefill_in([&q, &k, &v, &st], dims, 1.0), &mut out)
        .is_err());
    let ok = DecodeDims { cap: 10, ..dims };
    let (k, v) = (z(ok.cache_len()), z(ok.cache_len()));
    assert!(gpu
        .prefill_attention(prefill_in([&q, &k, &v, &st], ok, f32::NAN), &mut out)
        .is_err());
    let f = gpu.upload(&[0f32]).unwrap();
    assert!(gpu
        .prefill_attention(prefill_in([&q, &k, &v, &f], ok, 1.0), &mut out)
        .is_err());
    assert!(get(&gpu, &out).iter().all(|&x| x == 7.0));
}
