//! The quantized-weight family (`gpu_core::nn::quant`: `matmul_quant`, `dequantize`) on CUDA
//! against the CPU reference (f64 sums of the exact products), on fresh random packed weights
//! (printed, replayable seed): int8 and int4, m ∈ {1, 2, 3, 4, 7, 16, 17, 40} (the fused kernel up to 4 rows, and
//! dequantize-then-GEMM), k with a short last int4 group and rows that are and are not a
//! multiple of 16 bytes (the 16- and 4-byte load paths), x and out f32 and bf16. Each
//! tolerance is `gpu_cuda::matmul_quant_bound` (derived in `src/nn/quant.rs`), plus two bf16
//! roundings where the output is bf16. Dequantization is exact. Prefill with bf16 x runs in
//! both forms (`gpu_cuda::QgemmForm`: the fused dequantize-GEMM and dequantize-then-cuBLAS) on
//! tile-edge shapes, with NaN, ±inf and ±1e30 in x. Tests named `gpu_*` skip without a GPU.

mod common;

use common::*;
use gpu_core::nn::quant::{QuantFormat, QuantOps, QuantSpec, QUANT_GROUP};
use gpu_core::testing::same_bits;
use gpu_core::{Backend, CpuBackend, DType, GpuError};
use gpu_cuda::testing::backend_or_skip;
use gpu_cuda::{k_splits, matmul_quant_bound, CudaBackend, QgemmForm};
use half::bf16;
use rand::rngs::StdRng;
use rand::Rng;

/// A packed weight on the host: the bytes of its rows, scales and minimums.
struct HostWeight {
    spec: QuantSpec,
    bytes: Vec<u8>,
    scales: Vec<f32>,
    mins: Vec<f32>,
}

impl HostWeight {
    fn random(rng: &mut StdRng, spec: QuantSpec, scale: f32) -> Self {
        let bytes = match spec.format {
            // Finite halves within ±8·scale.
            QuantFormat::F16 => (0..spec.data_len() * 2)
                .flat_map(|_| {
                    half::f16::from_f32(rng.random_range(-8.0 * scale..8.0 * scale)).to_le_bytes()
                })
                .collect(),
            _ => (0..spec.data_len() * 4).map(|_| rng.random()).collect(),
        };
        let scales = (0..spec.scales_len())
            .map(|_| rng.random_range(0.0..scale))
            .collect();
        let mins = (0..spec.mins_len())
            .map(|_| rng.random_range(-8.0 * scale..0.0))
            .collect();
        Self {
            spec,
            bytes,
            scales,
            mins,
        }
    }

    fn words(&self) -> Vec<u32> {
        self.bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    /// data, scales, mins on `b`.
    fn upload<B: Backend>(&self, b: &B) -> [B::Buffer; 3] {
        [
            b.upload(&self.words()).unwrap(),
            b.upload(&self.scales).unwrap(),
            b.upload(&self.mins).unwrap(),
        ]
    }

    /// `|q|·|s| + |m|` of element `(j, t)`: what `T` sums.
    fn magnitude(&self, j: usize, t: usize) -> f64 {
        let k = self.spec.k;
        match self.spec.format {
            QuantFormat::Int8 => {
                (self.bytes[j * k + t] as i8 as f64).abs() * self.scales[j].abs() as f64
            }
            QuantFormat::Int4 => {
                let b = self.bytes[j * k / 2 + t / 2];
                let q = if t.is_multiple_of(2) { b & 15 } else { b >> 4 };
                let g = j * k.div_ceil(QUANT_GROUP) + t / QUANT_GROUP;
                q as f64 * self.scales[g].abs() as f64 + self.mins[g].abs() as f64
            }
            QuantFormat::F16 => {
                let b = 2 * (j * k + t);
                half::f16::from_le_bytes([self.bytes[b], self.bytes[b + 1]])
                    .to_f64()
                    .abs()
            }
        }
    }
}

fn matmul<B: QuantOps>(b: &B, w: &HostWeight, x: &[f32], dt: [DType; 2], m: usize) -> Vec<f32> {
    let spec = QuantSpec { m, ..w.spec };
    let [d, s, mn] = w.upload(b);
    let xb = put(b, x, dt[0]);
    let mut out = put(b, &vec![f32::NAN; m * spec.n], dt[1]);
    b.matmul_quant(&xb, [&d, &s, &mn], &mut out, spec).unwrap();
    get(b, &out)
}

/// (n, k): short int4 groups (72, 200), 4-byte loads (int8 k = 72, 200; int4 k = 72, 200) and
/// 16-byte loads (k = 160 for int4, 256, 2048).
const SHAPES: &[(usize, usize)] = &[(37, 72), (130, 200), (9, 160), (64, 256), (48, 2048)];

/// A product to check: the weight `w` and `m` rows of `x`.
#[derive(Clone, Copy)]
struct Problem<'a> {
    w: &'a HostWeight,
    x: &'a [f32],
    m: usize,
}

/// `matmul_quant` on the GPU: through the trait (`form` `None`: the default form) or with the
/// prefill form given.
fn gpu_matmul(gpu: &CudaBackend, form: Option<QgemmForm>, p: Problem, dt: [DType; 2]) -> Vec<f32> {
    let Problem { w, x, m } = p;
    let Some(form) = form else {
        return matmul(gpu, w, x, dt, m);
    };
    let spec = QuantSpec { m, ..w.spec };
    let [d, s, mn] = w.upload(gpu);
    let xb = put(gpu, x, dt[0]);
    let mut out = put(gpu, &vec![f32::NAN; m * spec.n], dt[1]);
    gpu.matmul_quant_with(form, &xb, [&d, &s, &mn], &mut out, spec)
        .unwrap();
    get(gpu, &out)
}

/// `T = Σ_t |x_it|·(|q_jt·s| + |m|)` of every output (x as the kernel sees it, in `xd`).
fn magnitudes(w: &HostWeight, x: &[f32], xd: DType, m: usize) -> Vec<f64> {
    let (n, k) = (w.spec.n, w.spec.k);
    let xs: Vec<f64> = match xd {
        DType::BF16 => x
            .iter()
            .map(|&v| bf16::from_f32(v).to_f64().abs())
            .collect(),
        _ => x.iter().map(|&v| (v as f64).abs()).collect(),
    };
    (0..m * n)
        .map(|idx| {
            let (i, j) = (idx / n, idx % n);
            (0..k).map(|c| xs[i * k + c] * w.magnitude(j, c)).sum()
        })
        .collect()
}

/// The GPU's `matmul_quant` against the CPU reference on `w` and `x` (`m` rows): within
/// `matmul_quant_bound` (plus two bf16 roundings where out is bf16) where the reference is
/// finite; where it is not (a row of x holding a NaN or an infinity), NaN where it is NaN and
/// the same infinity where it is infinite.
fn check_case(gpu: &CudaBackend, form: Option<QgemmForm>, p: Problem, dt: [DType; 2]) {
    let Problem { w, x, m } = p;
    let spec = QuantSpec { m, ..w.spec };
    let n = spec.n;
    let got = gpu_matmul(gpu, form, p, dt);
    let want = matmul(&CpuBackend, w, x, dt, m);
    let want32 = matmul(&CpuBackend, w, x, [dt[0], DType::F32], m);
    let t = magnitudes(w, x, dt[0], m);
    for idx in 0..m * n {
        let (i, j) = (idx / n, idx % n);
        let (g, r) = (got[idx], want[idx]);
        let at = format!("{spec:?} x/out {dt:?} form {form:?} ({i}, {j}): {g} vs {r}");
        if !r.is_finite() {
            assert!(g.is_nan() == r.is_nan() && (r.is_nan() || g == r), "{at}");
            continue;
        }
        let mut bound = matmul_quant_bound(&spec, dt[0], t[idx]);
        if dt[1] == DType::BF16 {
            // Two roundings to bf16, each within half an ulp (2^-8 relative): the kernel's of
            // its f32 sum (within `bound` of the f32 reference) and the reference's.
            bound += 1.001 * (2.0 * want32[idx].abs() as f64 + bound) / 256.0;
        }
        let err = (g as f64 - r as f64).abs();
        assert!(err <= bound, "{at}: {err:e} > {bound:e}");
    }
}

/// A random weight of `spec` (scales up to 0.1) and a random x of `spec.m` rows (in ±2).
fn random_problem(rng: &mut StdRng, spec: QuantSpec) -> (HostWeight, Vec<f32>) {
    let w = HostWeight::random(rng, spec, 0.1);
    let x = random_vec(rng, spec.m * spec.k, 2.0);
    (w, x)
}

fn matmul_case(gpu: &CudaBackend, rng: &mut StdRng, spec: QuantSpec, dt: [DType; 2]) {
    let (w, x) = random_problem(rng, spec);
    let m = spec.m;
    check_case(gpu, None, Problem { w: &w, x: &x, m }, dt);
}

/// [`check_case`] of bf16 `x` in both prefill forms, out f32 and bf16.
fn check_prefill_forms(gpu: &CudaBackend, p: Problem) {
    for od in [DType::F32, DType::BF16] {
        for form in FORMS {
            check_case(gpu, Some(form), p, [DType::BF16, od]);
        }
    }
}

#[test]
fn gpu_matmul_quant_matches_cpu() {
    let (gpu, mut rng) = skip_unless!(gpu_and_rng("gpu_matmul_quant_matches_cpu"));
    for format in FORMATS {
        for &(n, k) in SHAPES {
            for m in [1, 2, 3, 4, 7, 16, 17, 40] {
                for xd in [DType::F32, DType::BF16] {
                    for od in [DType::F32, DType::BF16] {
                        let spec = QuantSpec { m, n, k, format };
                        matmul_case(&gpu, &mut rng, spec, [xd, od]);
                    }
                }
            }
        }
    }
}

/// f16 weights have no CUDA kernel: the HAL's default (dequantized through the host, exact;
/// then cuBLAS) at decode and prefill sizes, within `matmul_quant_bound`'s f32 bound.
#[test]
fn gpu_f16_weights_take_the_default_and_match_cpu() {
    let (gpu, mut rng) = skip_unless!(gpu_and_rng(
        "gpu_f16_weights_take_the_default_and_match_cpu"
    ));
    for &(n, k) in SHAPES {
        for m in [1, 4, 17] {
            for xd in [DType::F32, DType::BF16] {
                let spec = QuantSpec {
                    m,
                    n,
                    k,
                    format: QuantFormat::F16,
                };
                matmul_case(&gpu, &mut rng, spec, [xd, DType::F32]);
            }
        }
        let w = HostWeight::random(&mut rng, QuantSpec::weight(QuantFormat::F16, n, k), 1.0);
        let (g, c) = (
            dequant(&gpu, &w, DType::F32),
            dequant(&CpuBackend, &w, DType::F32),
        );
        assert!(same_bits(&g, &c));
    }
}

/// Tile edges of the fused dequantize-GEMM (blocks of 64 rows of x × 128 weight rows, k steps of
/// 64): (m, n) below, at and past a tile; k = 64 and 128 take its 16-byte copies, 8, 68 (int8
/// only: k % 8 == 4), 136 and 520 the narrow ones, and 136 and 520 end int4 rows on a short group.
const GEMM_MN: &[(usize, usize)] = &[
    (5, 1),
    (17, 127),
    (64, 128),
    (65, 129),
    (130, 300),
    (5, 300),
    (130, 1),
];
const GEMM_K: &[usize] = &[8, 64, 68, 128, 136, 520];
const FORMS: [QgemmForm; 2] = [QgemmForm::Fused, QgemmForm::Dequant];
const FORMATS: [QuantFormat; 2] = [QuantFormat::Int8, QuantFormat::Int4];

#[test]
fn gpu_matmul_quant_prefill_forms_match_cpu_at_tile_edges() {
    let (gpu, mut rng) = skip_unless!(gpu_and_rng(
        "gpu_matmul_quant_prefill_forms_match_cpu_at_tile_edges"
    ));
    for format in FORMATS {
        for &(m, n) in GEMM_MN {
            for &k in GEMM_K {
                if !k.is_multiple_of(format.values_per_word()) {
                    continue;
                }
                let (w, x) = random_problem(&mut rng, QuantSpec { m, n, k, format });
                check_prefill_forms(&gpu, Problem { w: &w, x: &x, m });
            }
        }
    }
}

/// NaN, +inf and -inf in x (in both row tiles, and in a short last k step) make the rows that
/// hold them NaN or the reference's infinity, and no other: every other row stays within the
/// bound, in both prefill forms.
#[test]
fn gpu_matmul_quant_prefill_nonfinite_x_stays_in_its_row() {
    let (gpu, mut rng) = skip_unless!(gpu_and_rng(
        "gpu_matmul_quant_prefill_nonfinite_x_stays_in_its_row"
    ));
    let (m, n, k) = (65, 129, 136);
    for format in FORMATS {
        let (w, mut x) = random_problem(&mut rng, QuantSpec { m, n, k, format });
        for (i, c, v) in [
            (3, 5, f32::NAN),
            (9, 130, f32::INFINITY),
            (64, 0, f32::NEG_INFINITY),
        ] {
            x[i * k + c] = v;
        }
        for od in [DType::F32, DType::BF16] {
            for form in FORMS {
                let p = Problem { w: &w, x: &x, m };
                check_case(&gpu, Some(form), p, [DType::BF16, od]);
                let got = gpu_matmul(&gpu, Some(form), p, [DType::BF16, od]);
                for i in [3, 9, 64] {
                    let row = &got[i * n..(i + 1) * n];
                    assert!(row.iter().all(|v| !v.is_finite()), "{form:?} {od} row {i}");
                }
                assert!(
                    got[3 * n..4 * n].iter().all(|v| v.is_nan()),
                    "{form:?} {od}"
                );
            }
        }
    }
}

/// |x| up to 1e30 (products near 1e31, sums far below f32's overflow): finite and within the
/// bound (relative to `T`, which grows with x), in both prefill forms.
#[test]
fn gpu_matmul_quant_prefill_huge_x_within_bound() {
    let (gpu, mut rng) = skip_unless!(gpu_and_rng("gpu_matmul_quant_prefill_huge_x_within_bound"));
    let (m, n, k) = (17, 129, 520);
    for format in FORMATS {
        let (w, mut x) = random_problem(&mut rng, QuantSpec { m, n, k, format });
        for v in &mut x[..k] {
            *v *= 1e30;
        }
        for i in 1..m {
            let c = rng.random_range(0..k);
            x[i * k + c] = if i % 2 == 0 { 1e30 } else { -1e30 };
        }
        check_prefill_forms(&gpu, Problem { w: &w, x: &x, m });
    }
}

/// The two prefill forms against each other (out f32): each is within `matmul_quant_bound` of
/// the reference, so they differ by at most twice that.
#[test]
fn gpu_matmul_quant_fused_and_dequant_forms_agree() {
    let (gpu, mut rng) = skip_unless!(gpu_and_rng(
        "gpu_matmul_quant_fused_and_dequant_forms_agree"
    ));
    for format in FORMATS {
        for (m, n, k) in [(64, 256, 512), (130, 300, 520), (17, 1000, 2048)] {
            let spec = QuantSpec { m, n, k, format };
            let (w, x) = random_problem(&mut rng, spec);
            let dt = [DType::BF16, DType::F32];
            let p = Problem { w: &w, x: &x, m };
            let fused = gpu_matmul(&gpu, Some(QgemmForm::Fused), p, dt);
            let deq = gpu_matmul(&gpu, Some(QgemmForm::Dequant), p, dt);
            let t = magnitudes(&w, &x, DType::BF16, m);
            for (idx, (a, b)) in fused.iter().zip(&deq).enumerate() {
                let bound = 2.0 * matmul_quant_bound(&spec, DType::BF16, t[idx]);
                let err = (*a as f64 - *b as f64).abs();
                assert!(
                    err <= bound,
                    "{spec:?} [{idx}]: {a} vs {b}: {err:e} > {bound:e}"
                );
            }
        }
    }
}

/// Weights of every byte and scales from subnormal to near overflow (15·s past f32 gives inf
/// on both): the kernel rounds `q·s` and `+ m` as the CPU does, bf16 once from that f32.
#[test]
fn gpu_dequantize_matches_cpu_exactly() {
    let (gpu, mut rng) = skip_unless!(gpu_and_rng("gpu_dequantize_matches_cpu_exactly"));
    for format in FORMATS {
        for &(n, k) in SHAPES {
            let spec = QuantSpec::weight(format, n, k);
            let mut w = HostWeight::random(&mut rng, spec, 1.0);
            for s in w.scales.iter_mut().chain(w.mins.iter_mut()) {
                *s *= [1.0, 1e-40, 3e37, 1e38][rng.random_range(0..4)];
            }
            for od in [DType::F32, DType::BF16] {
                let (g, c) = (dequant(&gpu, &w, od), dequant(&CpuBackend, &w, od));
                assert_eq!(g.len(), n * k);
                for (i, (a, b)) in g.iter().zip(&c).enumerate() {
                    assert!(
                        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                        "{spec:?} {od} [{i}]: {a} vs {b}"
                    );
                }
            }
        }
    }
}

fn dequant<B: QuantOps>(b: &B, w: &HostWeight, dtype: DType) -> Vec<f32> {
    let [d, s, m] = w.upload(b);
    let mut out = put(b, &vec![f32::NAN; w.spec.n * w.spec.k], dtype);
    b.dequantize([&d, &s, &m], &mut out, w.spec).unwrap();
    get(b, &out)
}

#[test]
fn gpu_quant_empty_calls_and_k_zero() {
    let gpu = skip_unless!(backend_or_skip("gpu_quant_empty_calls_and_k_zero"));
    for format in FORMATS {
        for (m, n, k) in [(0, 5, 8), (3, 0, 8), (0, 0, 0), (2, 3, 0), (9, 3, 0)] {
            let spec = QuantSpec { m, n, k, format };
            let w = HostWeight {
                spec,
                bytes: vec![0; spec.data_len() * 4],
                scales: vec![1.0; spec.scales_len()],
                mins: vec![1.0; spec.mins_len()],
            };
            for od in [DType::F32, DType::BF16] {
                let got = matmul(&gpu, &w, &vec![1.0; m * k], [DType::BF16, od], m);
                assert_eq!(got, vec![0.0; m * n], "{spec:?} {od}");
                assert!(dequant(&gpu, &w, od).is_empty() || k > 0);
            }
        }
    }
}

/// Every refusal of the CPU is the same typed error on CUDA.
#[test]
fn gpu_quant_wrong_dtypes_lengths_and_formats_are_typed_errors() {
    let gpu = skip_unless!(backend_or_skip(
        "gpu_quant_wrong_dtypes_lengths_and_formats_are_typed_errors"
    ));
    let spec = QuantSpec {
        m: 2,
        n: 3,
        k: 16,
        format: QuantFormat::Int4,
    };
    let w = HostWeight {
        spec,
        bytes: vec![0x35; spec.data_len() * 4],
        scales: vec![0.5; spec.scales_len()],
        mins: vec![-1.0; spec.mins_len()],
    };
    let [d, s, m] = w.upload(&gpu);
    let x = put(&gpu, &[1.0; 32], DType::BF16);
    let f = |v: &[f32]| gpu.upload(v).unwrap();
    let mut out = put(&gpu, &[0.0; 6], DType::F32);
    assert!(gpu.matmul_quant(&x, [&d, &s, &m], &mut out, spec).is_ok());
    let words_as_f32 = f(&[0.0; 6]);
    let cases: Vec<(&str, gpu_core::Result<()>)> = vec![
        (
            "f32 data",
            gpu.matmul_quant(&x, [&words_as_f32, &s, &m], &mut out, spec),
        ),
        (
            "bf16 scales",
            gpu.matmul_quant(
                &x,
                [&d, &put(&gpu, &[0.5; 3], DType::BF16), &m],
                &mut out,
                spec,
            ),
        ),
        (
            "short scales",
            gpu.matmul_quant(&x, [&d, &f(&[0.5; 2]), &m], &mut out, spec),
        ),
        (
            "int8 format on int4 buffers",
            gpu.matmul_quant(
                &x,
                [&d, &s, &m],
                &mut out,
                QuantSpec {
                    format: QuantFormat::Int8,
                    ..spec
                },
            ),
        ),
        (
            "k not a multiple of 8",
            gpu.matmul_quant(&x, [&d, &s, &m], &mut out, QuantSpec { k: 12, ..spec }),
        ),
        (
            "u32 x",
            gpu.matmul_quant(
                &gpu.upload(&[1u32; 32]).unwrap(),
                [&d, &s, &m],
                &mut out,
                spec,
            ),
        ),
        (
            "short out",
            gpu.dequantize([&d, &s, &m], &mut f(&[0.0; 47]), spec),
        ),
    ];
    for (what, r) in cases {
        let e = r.expect_err(what);
        assert!(
            matches!(
                e,
                GpuError::DTypeMismatch { .. }
                    | GpuError::ShapeMismatch { .. }
                    | GpuError::InvalidShape { .. }
                    | GpuError::UnsupportedDType { .. }
            ),
            "{what}: {e}"
        );
    }
}

/// A captured graph replays the fused kernel and the prefill path (dequantize into a pool
/// scratch, then cuBLAS) with the values the buffers hold at replay time.
#[test]
fn gpu_quant_launches_are_captured_by_a_graph() {
    let (gpu, mut rng) = skip_unless!(gpu_and_rng("gpu_quant_launches_are_captured_by_a_graph"));
    for m in [1, 16] {
        let spec = QuantSpec {
            m,
            n: 64,
            k: 256,
            format: QuantFormat::Int4,
        };
        let w = HostWeight::random(&mut rng, spec, 0.1);
        let [d, s, mn] = w.upload(&gpu);
        let mut x = put(&gpu, &random_vec(&mut rng, m * 256, 1.0), DType::BF16);
        let mut out = put(&gpu, &vec![f32::NAN; m * 64], DType::BF16);
        let graph = gpu
            .capture(|g| g.matmul_quant(&x, [&d, &s, &mn], &mut out, spec))
            .unwrap();
        let x_new: Vec<bf16> = random_vec(&mut rng, m * 256, 1.0)
            .iter()
            .map(|&v| bf16::from_f32(v))
            .collect();
        gpu.copy_to_device(&x_new, &mut x).unwrap();
        gpu.launch_graph(&graph).unwrap();
        let mut eager = put(&gpu, &vec![f32::NAN; m * 64], DType::BF16);
        gpu.matmul_quant(&x, [&d, &s, &mn], &mut eager, spec)
            .unwrap();
        assert_eq!(get(&gpu, &out), get(&gpu, &eager), "m = {m}");
    }
}

/// The fused GEMM's k split (no GPU needed): every k step in exactly one split, no split
/// empty, at least 4 steps a split unless k itself is shorter, one split where the tiles
/// already give two blocks a multiprocessor.
#[test]
fn k_splits_cover_every_step_once() {
    for sms in [1, 2, 78, 132] {
        for tiles in (1..40).chain([100, 263, 264, 265, 1000]) {
            for k in (8usize..=20000)
                .step_by(8 * 37)
                .chain([8, 64, 520, 2048, 8192])
            {
                let steps = k.div_ceil(64);
                let (splits, sps) = k_splits(tiles, k, sms);
                let at = format!("tiles {tiles} k {k} sms {sms}: ({splits}, {sps})");
                assert!(splits >= 1 && sps >= 1, "{at}");
                assert!(splits * sps >= steps && (splits - 1) * sps < steps, "{at}");
                assert!(sps >= 4.min(steps), "{at}");
                if tiles >= 2 * sms {
                    assert_eq!(splits, 1, "{at}");
                }
            }
        }
    }
}
