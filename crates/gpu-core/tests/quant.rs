//! The CPU reference of the quantized-weight family (`gpu_core::nn::quant`): hand-computed
//! cases, random cases against dequantize-then-f32-matmul (within the f32 summation bound),
//! and hostile inputs (NaN, infinities, overflow, empty calls, every wrong dtype, length and
//! format). A random case prints its seed; `HYBRID_TEST_SEED` replays it.

use gpu_core::nn::quant::{QuantFormat, QuantOps, QuantSpec, QUANT_GROUP};
use gpu_core::{Backend, CpuBackend, CpuStorage, DType, GpuError, MatmulOps, MatmulSpec};
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CPU: CpuBackend = CpuBackend;
const U: f64 = 1.0 / (1u64 << 24) as f64; // f32 unit roundoff

/// Bytes packed little-endian into u32 words (the length a multiple of 4).
fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A weight's three buffers on the CPU.
struct W {
    data: CpuStorage,
    scales: CpuStorage,
    mins: CpuStorage,
}

fn weight(bytes: &[u8], scales: &[f32], mins: &[f32]) -> W {
    W {
        data: CpuStorage::U32(words(bytes)),
        scales: CpuStorage::F32(scales.to_vec()),
        mins: CpuStorage::F32(mins.to_vec()),
    }
}

fn matmul(x: &CpuStorage, w: &W, spec: QuantSpec, out: DType) -> Result<Vec<f32>, GpuError> {
    let mut o = CPU.allocate(out, spec.m * spec.n)?;
    CPU.matmul_quant(x, [&w.data, &w.scales, &w.mins], &mut o, spec)?;
    Ok(to_f32(&o))
}

fn dequantize(w: &W, spec: QuantSpec, out: DType) -> Result<Vec<f32>, GpuError> {
    let mut o = CPU.allocate(out, spec.n * spec.k)?;
    CPU.dequantize([&w.data, &w.scales, &w.mins], &mut o, spec)?;
    Ok(to_f32(&o))
}

fn to_f32(s: &CpuStorage) -> Vec<f32> {
    match s {
        CpuStorage::F32(v) => v.clone(),
        CpuStorage::BF16(v) => v.iter().map(|b| b.to_f32()).collect(),
        _ => panic!("float output"),
    }
}

fn seed(test: &str) -> StdRng {
    let seed = std::env::var("HYBRID_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    println!("{test}: seed {seed} (HYBRID_TEST_SEED={seed} replays it)");
    StdRng::seed_from_u64(seed)
}

/// A random f16 value: finite, in ±2, one in 8 subnormal (any sign).
fn random_half(r: &mut StdRng) -> half::f16 {
    if r.random_range(0..8) == 0 {
        half::f16::from_bits(r.random_range(1u16..0x0400) | (r.random::<u16>() & 0x8000))
    } else {
        half::f16::from_f32(r.random_range(-2.0..2.0))
    }
}

/// A random packed weight: any bytes (f16: finite halves, [`random_half`]), scales in ±2,
/// int4 minimums in ±2.
fn random_weight(r: &mut StdRng, spec: QuantSpec) -> W {
    let bytes: Vec<u8> = match spec.format {
        QuantFormat::F16 => (0..spec.data_len() * 2)
            .flat_map(|_| random_half(r).to_le_bytes())
            .collect(),
        _ => (0..spec.data_len() * 4).map(|_| r.random()).collect(),
    };
    let scales: Vec<f32> = (0..spec.scales_len())
        .map(|_| r.random_range(-2.0..2.0))
        .collect();
    let mins: Vec<f32> = (0..spec.mins_len())
        .map(|_| r.random_range(-2.0..2.0))
        .collect();
    weight(&bytes, &scales, &mins)
}

#[test]
fn int8_and_int4_by_hand() {
    // int8, 2 rows of 4: bytes 1, -2, 3, -127 and 0, 127, -1, 5; scales 0.5 and 2.
    let w8 = weight(&[1, 254, 3, 129, 0, 127, 255, 5], &[0.5, 2.0], &[]);
    let spec = QuantSpec::weight(QuantFormat::Int8, 2, 4);
    let want = [0.5, -1.0, 1.5, -63.5, 0.0, 254.0, -2.0, 10.0];
    assert_eq!(dequantize(&w8, spec, DType::F32).unwrap(), want);
    let x = CpuStorage::F32(vec![1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 2.0]);
    let out = matmul(&x, &w8, QuantSpec { m: 2, ..spec }, DType::F32).unwrap();
    assert_eq!(out, [-62.5, 262.0, -126.5, 20.0]);
    // int4, 1 row of 8 (one short group): bytes 0x21 = values 1, 2; 0xf0 = 0, 15; scale 0.25,
    // min -1: w = q/4 − 1.
    let w4 = weight(&[0x21, 0xf0, 0x00, 0x0f], &[0.25], &[-1.0]);
    let spec = QuantSpec::weight(QuantFormat::Int4, 1, 8);
    let want = [-0.75, -0.5, -1.0, 2.75, -1.0, -1.0, 2.75, -1.0];
    assert_eq!(dequantize(&w4, spec, DType::F32).unwrap(), want);
    let x = CpuStorage::BF16(vec![bf16::ONE; 8]);
    let out = matmul(&x, &w4, QuantSpec { m: 1, ..spec }, DType::BF16).unwrap();
    assert_eq!(out, [0.25]);
}

#[test]
fn f16_by_hand() {
    // 1 row of 4: 1.0, -2.5, 65504 (f16's largest) and 2⁻²⁴ (its smallest subnormal), widened
    // exactly; element 2i in the low half of word i.
    let halves = [0x3c00u16, 0xc100, 0x7bff, 0x0001];
    let bytes: Vec<u8> = halves.iter().flat_map(|h| h.to_le_bytes()).collect();
    let w = weight(&bytes, &[], &[]);
    let spec = QuantSpec::weight(QuantFormat::F16, 1, 4);
    let tiny = 2f32.powi(-24);
    assert_eq!(
        dequantize(&w, spec, DType::F32).unwrap(),
        [1.0, -2.5, 65504.0, tiny]
    );
    let x = CpuStorage::F32(vec![2.0, 2.0, 1.0, 2f32.powi(24)]);
    let out = matmul(&x, &w, QuantSpec { m: 1, ..spec }, DType::F32).unwrap();
    assert_eq!(out, [2.0 - 5.0 + 65504.0 + 1.0]);
    // f16's infinity and NaN propagate: inf·1 = inf; NaN·1, 0·inf and NaN·0 are NaN.
    let bytes: Vec<u8> = [0x7c00u16, 0x3c00, 0x7e00, 0x3c00]
        .iter()
        .flat_map(|h| h.to_le_bytes())
        .collect();
    let w = weight(&bytes, &[], &[]);
    let spec = QuantSpec::weight(QuantFormat::F16, 2, 2);
    let x = CpuStorage::F32(vec![1.0, 1.0, 0.0, 1.0]);
    let out = matmul(&x, &w, QuantSpec { m: 2, ..spec }, DType::F32).unwrap();
    assert_eq!(out[0], f32::INFINITY);
    assert!(out[1..].iter().all(|v| v.is_nan()), "{out:?}");
}

#[test]
fn int4_groups_change_every_128_inputs_and_the_last_is_short() {
    let (n, k) = (2, 2 * QUANT_GROUP + 72);
    let spec = QuantSpec::weight(QuantFormat::Int4, n, k);
    assert_eq!((spec.scales_len(), spec.data_len()), (6, n * k / 8));
    // Every nibble 1; group g of row r has scale g + 1 and min 10·r.
    let w = weight(
        &vec![0x11; n * k / 2],
        &[1.0, 2.0, 3.0, 1.0, 2.0, 3.0],
        &[0.0, 0.0, 0.0, 10.0, 10.0, 10.0],
    );
    let d = dequantize(&w, spec, DType::F32).unwrap();
    for (i, &v) in d.iter().enumerate() {
        let (r, c) = (i / k, i % k);
        assert_eq!(
            v,
            (c / QUANT_GROUP + 1) as f32 + 10.0 * r as f32,
            "({r}, {c})"
        );
    }
}

/// Random cases against dequantize + the f32 matmul of `CpuBackend` (f32 sums): both are
/// within `γ_k·Σ|x·w|` (f32 summation of k exact products, γ_k = k·u/(1 − k·u)) of the exact
/// sum, the reference also within half an ulp, so they differ by at most
/// `(γ_k + u)·Σ|x·w|`, plus half a bf16 ulp of the output where it is bf16.
#[test]
fn random_cases_match_dequantize_then_matmul() {
    let mut r = seed("random_cases_match_dequantize_then_matmul");
    for (m, n, k) in [
        (1, 5, 8),
        (3, 7, 72),
        (2, 3, 200),
        (4, 9, 256),
        (5, 2, 1032),
    ] {
        for format in [QuantFormat::Int8, QuantFormat::Int4, QuantFormat::F16] {
            let spec = QuantSpec { m, n, k, format };
            let w = random_weight(&mut r, spec);
            let xs: Vec<f32> = (0..m * k).map(|_| r.random_range(-3.0..3.0)).collect();
            let deq = dequantize(&w, spec, DType::F32).unwrap();
            let mut want = CPU.allocate(DType::F32, m * n).unwrap();
            let s = MatmulSpec {
                trans_b: true,
                ..MatmulSpec::new(m, n, k)
            };
            CPU.matmul(
                s,
                &CpuStorage::F32(xs.clone()),
                &CpuStorage::F32(deq.clone()),
                &mut want,
            )
            .unwrap();
            let want = to_f32(&want);
            for out_dtype in [DType::F32, DType::BF16] {
                let got = matmul(&CpuStorage::F32(xs.clone()), &w, spec, out_dtype).unwrap();
                let ku = k as f64 * U;
                for (idx, (&g, &e)) in got.iter().zip(&want).enumerate() {
                    let (i, j) = (idx / n, idx % n);
                    let mag: f64 = (0..k)
                        .map(|t| (xs[i * k + t] as f64 * deq[j * k + t] as f64).abs())
                        .sum();
                    let mut bound = (ku / (1.0 - ku) + U) * mag;
                    if out_dtype == DType::BF16 {
                        bound += (e.abs() as f64 + bound) / 256.0;
                    }
                    let err = (g as f64 - e as f64).abs();
                    assert!(
                        err <= bound,
                        "{spec:?} {out_dtype}: ({i}, {j}) {g} vs {e}: {err:e} > {bound:e}"
                    );
                }
            }
        }
    }
}

#[test]
fn bf16_outputs_are_the_f32_values_rounded_once() {
    let mut r = seed("bf16_outputs_are_the_f32_values_rounded_once");
    let spec = QuantSpec::weight(QuantFormat::Int4, 3, 264);
    let w = random_weight(&mut r, spec);
    let f = dequantize(&w, spec, DType::F32).unwrap();
    let b = dequantize(&w, spec, DType::BF16).unwrap();
    for (x, y) in f.iter().zip(&b) {
        assert_eq!(bf16::from_f32(*x).to_f32().to_bits(), y.to_bits());
    }
}

#[test]
fn hostile_values_propagate_as_ieee_says() {
    let spec = QuantSpec {
        m: 2,
        n: 2,
        k: 4,
        format: QuantFormat::Int8,
    };
    // Row 0 of W has an infinite scale (and a zero byte: 0·inf = NaN); row 1 is finite.
    let w = weight(&[1, 0, 0, 0, 1, 1, 1, 1], &[f32::INFINITY, 1e38], &[]);
    let x = CpuStorage::F32(vec![f32::NAN, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]);
    let out = matmul(&x, &w, spec, DType::F32).unwrap();
    assert!(out.iter().take(3).all(|v| v.is_nan()), "{out:?}");
    // 4·1e38 is past f32 (and bf16): +inf, rounded once from the exact f64 sum.
    assert_eq!(out[3], f32::INFINITY);
    assert_eq!(matmul(&x, &w, spec, DType::BF16).unwrap()[3], f32::INFINITY);
    // A sum whose partial sums leave f32's range but whose total does not: exact in f64.
    let w = weight(&[127, 127, 129, 129], &[f32::MAX / 128.0], &[]);
    let x = CpuStorage::F32(vec![1.0, 1.0, 1.0, 1.0]);
    let one = QuantSpec { m: 1, n: 1, ..spec };
    assert_eq!(matmul(&x, &w, one, DType::F32).unwrap(), [0.0]);
}

#[test]
fn empty_calls_and_k_zero() {
    for format in [QuantFormat::Int8, QuantFormat::Int4, QuantFormat::F16] {
        for (m, n, k) in [(0, 3, 8), (2, 0, 8), (0, 0, 0)] {
            let spec = QuantSpec { m, n, k, format };
            let w = random_weight(&mut StdRng::seed_from_u64(1), spec);
            let x = CpuStorage::F32(vec![1.0; m * k]);
            assert!(matmul(&x, &w, spec, DType::F32).unwrap().is_empty());
        }
        // k = 0: sums of nothing.
        let spec = QuantSpec {
            m: 2,
            n: 3,
            k: 0,
            format,
        };
        let w = weight(
            &[],
            &vec![1.0; spec.scales_len()],
            &vec![0.0; spec.mins_len()],
        );
        let x = CpuStorage::F32(vec![]);
        assert_eq!(matmul(&x, &w, spec, DType::BF16).unwrap(), [0.0; 6]);
    }
}

fn err_of(x: &CpuStorage, w: &W, spec: QuantSpec, out: DType) -> GpuError {
    matmul(x, w, spec, out).expect_err("refused")
}

#[test]
fn wrong_dtypes_lengths_and_formats_are_typed_errors() {
    let spec = QuantSpec {
        m: 1,
        n: 2,
        k: 8,
        format: QuantFormat::Int4,
    };
    let ok = random_weight(&mut StdRng::seed_from_u64(2), spec);
    let x = CpuStorage::F32(vec![0.5; 8]);
    assert!(matmul(&x, &ok, spec, DType::F32).is_ok());
    let bad_data = W {
        data: CpuStorage::F32(vec![0.0; 2]),
        ..weight(&[0; 8], &[1.0; 2], &[0.0; 2])
    };
    assert!(matches!(
        err_of(&x, &bad_data, spec, DType::F32),
        GpuError::DTypeMismatch { .. }
    ));
    let bad_scales = W {
        scales: CpuStorage::BF16(vec![bf16::ONE; 2]),
        ..weight(&[0; 8], &[1.0; 2], &[0.0; 2])
    };
    assert!(matches!(
        err_of(&x, &bad_scales, spec, DType::F32),
        GpuError::DTypeMismatch { .. }
    ));
    let u32x = CpuStorage::U32(vec![0; 8]);
    assert!(matches!(
        err_of(&u32x, &ok, spec, DType::F32),
        GpuError::UnsupportedDType { .. }
    ));
    assert!(matches!(
        err_of(&x, &ok, spec, DType::U32),
        GpuError::UnsupportedDType { .. }
    ));
    for (bytes, scales, mins) in [
        (&[0u8; 4][..], &[1.0f32; 2][..], &[0.0f32; 2][..]),
        (&[0; 8], &[1.0; 1], &[0.0; 2]),
        (&[0; 8], &[1.0; 2], &[0.0; 3]),
    ] {
        assert!(matches!(
            err_of(&x, &weight(bytes, scales, mins), spec, DType::F32),
            GpuError::ShapeMismatch { .. }
        ));
    }
    let short_x = CpuStorage::F32(vec![0.5; 7]);
    assert!(matches!(
        err_of(&short_x, &ok, spec, DType::F32),
        GpuError::ShapeMismatch { .. }
    ));
    // The int4 buffers under the int8 format (data of n·k/4 words and no mins expected) and
    // under the f16 format (data of n·k/2 words and no scales expected).
    for format in [QuantFormat::Int8, QuantFormat::F16] {
        let spec = QuantSpec { format, ..spec };
        assert!(
            matches!(
                err_of(&x, &ok, spec, DType::F32),
                GpuError::ShapeMismatch { .. }
            ),
            "{format:?}"
        );
    }
    // k not a multiple of 4 (int8), 8 (int4) or 2 (f16); sizes past 2^31.
    for (format, k) in [
        (QuantFormat::Int8, 6),
        (QuantFormat::Int4, 12),
        (QuantFormat::F16, 7),
    ] {
        let s = QuantSpec { format, k, ..spec };
        assert!(matches!(
            err_of(&x, &ok, s, DType::F32),
            GpuError::InvalidShape { .. }
        ));
    }
    let huge = QuantSpec {
        n: 1 << 28,
        k: 1 << 8,
        ..spec
    };
    assert!(matches!(
        err_of(&x, &ok, huge, DType::F32),
        GpuError::InvalidShape { .. }
    ));
    let mut o = CPU.allocate(DType::F32, 15).unwrap();
    assert!(matches!(
        CPU.dequantize([&ok.data, &ok.scales, &ok.mins], &mut o, spec),
        Err(GpuError::ShapeMismatch { .. })
    ));
}
