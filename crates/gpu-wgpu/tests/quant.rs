//! f16 weights (`QuantFormat::F16`) on wgpu against the CPU reference, on fresh random halves
//! (the seed is printed; replay with `HYBRID_TEST_SEED`), one in eight subnormal: `dequantize`
//! gives the reference's bits for every one of the 65,536 halves (subnormals, infinities and
//! NaNs included) into f32 and bf16; `matmul_quant` at decode's rows (the matrix–vector kernel,
//! up to 16 rows, k a multiple of 8) and past them (dequantize, then the f32 matmul), x and out in f32 and
//! bf16, within `γ_k·Σ|x·w|` of the exact sum (plus a bf16 rounding where out is bf16, and 2⁻¹²⁶
//! a product where the device flushes subnormal products); the matrix–vector kernel with both
//! loads (`shader-f16`'s where the adapter has it: its hardware conversion may also flush a
//! subnormal half, so those products join the bound); empty calls, `k = 0` and typed errors as
//! on the CPU; int8 and int4 (gpu-core's default) against the CPU. Without an adapter it
//! prints `SKIP` and returns (fails with `HYBRID_REQUIRE_WGPU=1`).

mod common;

use common::{backend_and_rng, close, get, same, U};
use gpu_core::nn::quant::{QuantFormat, QuantOps, QuantSpec};
use gpu_core::{Backend, CpuBackend, DType, GpuError};
use gpu_wgpu::testing::backend_or_skip;
use gpu_wgpu::{F16Loads, WgpuBackend};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::Rng;

/// A weight's three buffers' contents: data words, scales, mins.
type Host = (Vec<u32>, Vec<f32>, Vec<f32>);

/// A random finite half in ±2, one in eight subnormal (any sign).
fn random_half(r: &mut StdRng) -> u16 {
    if r.random_range(0..8) == 0 {
        r.random_range(1u16..0x0400) | (r.random::<u16>() & 0x8000)
    } else {
        f16::from_f32(r.random_range(-2.0..2.0)).to_bits()
    }
}

fn pack(halves: &[u16]) -> Vec<u32> {
    halves
        .chunks_exact(2)
        .map(|p| p[0] as u32 | (p[1] as u32) << 16)
        .collect()
}

/// A random weight of `spec` (f16: [`random_half`]; int8/int4: any bytes, scales in ±0.1).
fn random_weight(r: &mut StdRng, spec: QuantSpec) -> Host {
    let data = match spec.format {
        QuantFormat::F16 => pack(
            &(0..2 * spec.data_len())
                .map(|_| random_half(r))
                .collect::<Vec<_>>(),
        ),
        _ => (0..spec.data_len()).map(|_| r.random()).collect(),
    };
    let scales = (0..spec.scales_len())
        .map(|_| r.random_range(-0.1..0.1))
        .collect();
    let mins = (0..spec.mins_len())
        .map(|_| r.random_range(-0.5..0.5))
        .collect();
    (data, scales, mins)
}

fn upload<B: Backend>(b: &B, (d, s, m): &Host) -> [B::Buffer; 3] {
    [
        b.upload(d).unwrap(),
        b.upload(s).unwrap(),
        b.upload(m).unwrap(),
    ]
}

/// `x` on `b` in `dtype` (bf16 rounded to nearest even).
fn put<B: Backend>(b: &B, x: &[f32], dtype: DType) -> B::Buffer {
    match dtype {
        DType::BF16 => b
            .upload(&x.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>())
            .unwrap(),
        _ => b.upload(x).unwrap(),
    }
}

fn matmul<B: QuantOps>(b: &B, w: &Host, x: &[f32], dt: [DType; 2], spec: QuantSpec) -> Vec<f32> {
    let [d, s, m] = upload(b, w);
    let xb = put(b, x, dt[0]);
    let mut out = put(b, &vec![f32::NAN; spec.m * spec.n], dt[1]);
    b.matmul_quant(&xb, [&d, &s, &m], &mut out, spec).unwrap();
    get(b, &out)
}

fn dequant<B: QuantOps>(b: &B, w: &Host, dtype: DType, spec: QuantSpec) -> Vec<f32> {
    let [d, s, m] = upload(b, w);
    let mut out = put(b, &vec![f32::NAN; spec.n * spec.k], dtype);
    b.dequantize([&d, &s, &m], &mut out, spec).unwrap();
    get(b, &out)
}

#[test]
fn every_half_dequantizes_to_the_cpu_bits() {
    let Some(g) = backend_or_skip("every_half_dequantizes_to_the_cpu_bits") else {
        return;
    };
    let halves: Vec<u16> = (0..=u16::MAX).collect();
    let w = (pack(&halves), vec![], vec![]);
    // 65,536 values as 2 rows (the same words, two shapes of the launch).
    for (n, k) in [(1, 65_536), (256, 256)] {
        let spec = QuantSpec::weight(QuantFormat::F16, n, k);
        for dtype in [DType::F32, DType::BF16] {
            let (got, want) = (
                dequant(&g, &w, dtype, spec),
                dequant(&CpuBackend, &w, dtype, spec),
            );
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    same(*a, *b),
                    "{dtype} half {i:#06x}: {a:e} vs the CPU's {b:e}"
                );
            }
        }
    }
}

/// The exact sums and `Σ|x·w|` of every output (gpu-core's f64 reference).
fn exact(x: &[f32], w: &[f32], spec: QuantSpec) -> (Vec<f64>, Vec<f64>) {
    gpu_core::testing::exact_xwt(x, w, (spec.m, spec.n, spec.k))
}

/// (n, k): k a multiple of 8 (the matrix–vector kernel up to 16 rows), and 6 and 202 (not: the
/// dequantize path at every m); one column, a ragged last workgroup, long rows.
const SHAPES: [(usize, usize); 6] = [(1, 8), (37, 72), (130, 200), (9, 6), (64, 2048), (5, 202)];

#[test]
fn f16_products_match_the_cpu_within_the_f32_sum_bound() {
    const T: &str = "f16_products_match_the_cpu_within_the_f32_sum_bound";
    let Some((g, mut r)) = backend_and_rng(T) else {
        return;
    };
    for (n, k) in SHAPES {
        for m in [1, 2, 3, 4, 5, 8, 13, 16, 17] {
            let spec = QuantSpec {
                m,
                n,
                k,
                format: QuantFormat::F16,
            };
            let w = random_weight(&mut r, spec);
            let wf = dequant(&CpuBackend, &w, DType::F32, QuantSpec { m: 0, ..spec });
            let x: Vec<f32> = (0..m * k).map(|_| r.random_range(-3.0..3.0)).collect();
            for dt in [
                [DType::F32, DType::F32],
                [DType::BF16, DType::F32],
                [DType::F32, DType::BF16],
            ] {
                let xs: Vec<f32> = match dt[0] {
                    DType::BF16 => x.iter().map(|&v| bf16::from_f32(v).to_f32()).collect(),
                    _ => x.clone(),
                };
                let (want, mag) = exact(&xs, &wf, spec);
                let got = matmul(&g, &w, &x, dt, spec);
                let gk = k as f64 * U / (1.0 - k as f64 * U);
                for (idx, (&o, (&e, &t))) in got.iter().zip(want.iter().zip(&mag)).enumerate() {
                    let mut bound = gk * t + k as f64 * f32::MIN_POSITIVE as f64;
                    if dt[1] == DType::BF16 {
                        bound += (e.abs() + bound) / 256.0;
                    }
                    let err = (o as f64 - e).abs();
                    assert!(
                        err <= bound,
                        "{spec:?} x/out {dt:?} [{idx}]: {o} vs {e}: {err:e} > {bound:e}"
                    );
                }
            }
        }
    }
}

/// Both loads of the f16 matrix–vector kernel (`Native` where the adapter offers `shader-f16`)
/// against the exact sums, m from 1 to 16; a subnormal half's product may be flushed by
/// `Native`.
#[test]
fn f16_gemv_loads_match_the_cpu() {
    const T: &str = "f16_gemv_loads_match_the_cpu";
    let Some((g, mut r)) = backend_and_rng(T) else {
        return;
    };
    let mut loads = vec![F16Loads::Decode];
    if g.has_shader_f16() {
        loads.push(F16Loads::Native);
    } else {
        eprintln!("{T}: the adapter has no shader-f16: Native not run");
    }
    for (n, k) in [(1, 8), (37, 72), (130, 200), (64, 2048)] {
        for m in 1..=16 {
            let spec = QuantSpec {
                m,
                n,
                k,
                format: QuantFormat::F16,
            };
            let w = random_weight(&mut r, spec);
            let wf = dequant(&CpuBackend, &w, DType::F32, QuantSpec { m: 0, ..spec });
            let x: Vec<f32> = (0..m * k).map(|_| r.random_range(-3.0..3.0)).collect();
            let (want, mag) = exact(&x, &wf, spec);
            let sub: Vec<f32> = wf
                .iter()
                .map(|&v| if v.abs() < 6.1e-5 { v } else { 0.0 })
                .collect();
            let (_, sub_mag) = exact(&x, &sub, spec);
            for &l in &loads {
                let got = gemv_with(&g, l, &w, &x, spec);
                let gk = k as f64 * U / (1.0 - k as f64 * U);
                for (idx, &o) in got.iter().enumerate() {
                    let mut bound = gk * mag[idx] + k as f64 * f32::MIN_POSITIVE as f64;
                    if l == F16Loads::Native {
                        bound += sub_mag[idx] * (1.0 + gk);
                    }
                    let err = (o as f64 - want[idx]).abs();
                    assert!(
                        err <= bound,
                        "{l:?} {spec:?} [{idx}]: {o} vs {}: {err:e} > {bound:e}",
                        want[idx]
                    );
                }
            }
        }
    }
    // Shapes the kernel does not take are typed errors, not launches.
    let spec = QuantSpec {
        m: 17,
        n: 2,
        k: 8,
        format: QuantFormat::F16,
    };
    let w = random_weight(&mut r, spec);
    let (xb, d) = (
        g.upload(&[0.5f32; 17 * 8]).unwrap(),
        g.upload(&w.0).unwrap(),
    );
    let mut out = g.allocate(DType::F32, 17 * 2).unwrap();
    let e = g.matmul_f16_with(F16Loads::Decode, &xb, &d, &mut out, spec);
    assert!(matches!(e, Err(GpuError::Unsupported { .. })), "{e:?}");
}

fn gemv_with(g: &WgpuBackend, loads: F16Loads, w: &Host, x: &[f32], spec: QuantSpec) -> Vec<f32> {
    let (xb, d) = (g.upload(x).unwrap(), g.upload(&w.0).unwrap());
    let mut out = g.upload(&vec![f32::NAN; spec.m * spec.n]).unwrap();
    g.matmul_f16_with(loads, &xb, &d, &mut out, spec).unwrap();
    g.download::<f32>(&out).unwrap()
}

/// Hostile activations: a NaN, ±inf and ±1e30 in x (rows of their own) give, at decode's rows
/// and past them, NaN where the CPU gives NaN, the CPU's infinity where it is infinite, and
/// elsewhere the f32 sum's bound; the other rows are untouched by them.
#[test]
fn f16_hostile_activations_match_the_cpu() {
    const T: &str = "f16_hostile_activations_match_the_cpu";
    let Some((g, mut r)) = backend_and_rng(T) else {
        return;
    };
    for m in [4, 6] {
        let spec = QuantSpec {
            m,
            n: 37,
            k: 72,
            format: QuantFormat::F16,
        };
        let w = random_weight(&mut r, spec);
        let mut x: Vec<f32> = (0..m * 72).map(|_| r.random_range(-3.0..3.0)).collect();
        for (row, v) in [f32::NAN, f32::INFINITY, -1e30, 1e30]
            .into_iter()
            .enumerate()
        {
            x[row * 72 + 5] = v;
        }
        let wf = dequant(&CpuBackend, &w, DType::F32, QuantSpec { m: 0, ..spec });
        let (want, mag) = exact(&x, &wf, spec);
        let got = matmul(&g, &w, &x, [DType::F32; 2], spec);
        let gk = 72.0 * U / (1.0 - 72.0 * U);
        for (i, &o) in got.iter().enumerate() {
            let tol = gk * mag[i] + 72.0 * f32::MIN_POSITIVE as f64;
            let e = want[i];
            assert!(
                close(o, e, tol),
                "m {m} [{i}]: {o} vs the exact {e} (±{tol:e})"
            );
        }
    }
}

/// Infinite and NaN halves reach the outputs as IEEE says (the kernel decodes them itself).
#[test]
fn f16_infinities_and_nans_propagate() {
    let Some(g) = backend_or_skip("f16_infinities_and_nans_propagate") else {
        return;
    };
    // Rows of 8: row 0 holds +inf, row 1 a NaN, row 2 -inf and ones, row 3 ones.
    let mut h = vec![0x3c00u16; 32];
    h[3] = 0x7c00;
    h[8 + 5] = 0x7e01;
    h[16] = 0xfc00;
    let w = (pack(&h), vec![], vec![]);
    let spec = QuantSpec {
        m: 1,
        n: 4,
        k: 8,
        format: QuantFormat::F16,
    };
    let got = matmul(&g, &w, &[1.0; 8], [DType::F32; 2], spec);
    assert_eq!(got[0], f32::INFINITY);
    assert!(got[1].is_nan());
    assert_eq!(got[2], f32::NEG_INFINITY);
    assert_eq!(got[3], 8.0);
}

#[test]
fn empty_calls_k_zero_and_typed_errors_as_on_the_cpu() {
    let Some(g) = backend_or_skip("empty_calls_k_zero_and_typed_errors_as_on_the_cpu") else {
        return;
    };
    let f16 = |m, n, k| QuantSpec {
        m,
        n,
        k,
        format: QuantFormat::F16,
    };
    for spec in [f16(0, 3, 8), f16(2, 0, 8), f16(0, 0, 0)] {
        let w = (vec![0; spec.data_len()], vec![], vec![]);
        assert!(matmul(&g, &w, &vec![1.0; spec.m * spec.k], [DType::F32; 2], spec).is_empty());
    }
    let empty = (vec![], vec![], vec![]);
    assert_eq!(
        matmul(&g, &empty, &[], [DType::F32; 2], f16(2, 3, 0)),
        [0.0; 6]
    );
    // Wrong inputs: the same typed error as the CPU's (they share the check).
    let spec = f16(1, 2, 8);
    let ok: Host = (vec![0x3c00_3c00; 8], vec![], vec![]);
    let cases: [(Host, Vec<f32>, QuantSpec); 4] = [
        ((vec![0; 7], vec![], vec![]), vec![1.0; 8], spec),
        ((ok.0.clone(), vec![1.0; 2], vec![]), vec![1.0; 8], spec),
        (ok.clone(), vec![1.0; 7], spec),
        (ok.clone(), vec![1.0; 7], f16(1, 2, 7)),
    ];
    for (w, x, spec) in cases {
        let cpu = try_matmul(&CpuBackend, &w, &x, spec).unwrap_err();
        let gpu = try_matmul(&g, &w, &x, spec).unwrap_err();
        assert_eq!(format!("{gpu:?}"), format!("{cpu:?}"), "{spec:?}");
    }
}

fn try_matmul<B: QuantOps>(b: &B, w: &Host, x: &[f32], spec: QuantSpec) -> Result<(), GpuError> {
    let [d, s, m] = upload(b, w);
    let xb = b.upload(x)?;
    let mut out = b.allocate(DType::F32, spec.m * spec.n)?;
    b.matmul_quant(&xb, [&d, &s, &m], &mut out, spec)
}

/// int8 and int4 take gpu-core's default on wgpu: the CPU's dequantized values exactly, and
/// products within the f32 bound.
#[test]
fn int8_and_int4_defaults_match_the_cpu() {
    const T: &str = "int8_and_int4_defaults_match_the_cpu";
    let Some((g, mut r)) = backend_and_rng(T) else {
        return;
    };
    for format in [QuantFormat::Int8, QuantFormat::Int4] {
        let spec = QuantSpec {
            m: 3,
            n: 9,
            k: 264,
            format,
        };
        let w = random_weight(&mut r, spec);
        let ws = QuantSpec { m: 0, ..spec };
        let (got, wf) = (
            dequant(&g, &w, DType::F32, ws),
            dequant(&CpuBackend, &w, DType::F32, ws),
        );
        assert!(got.iter().zip(&wf).all(|(a, b)| same(*a, *b)), "{format:?}");
        let x: Vec<f32> = (0..spec.m * spec.k)
            .map(|_| r.random_range(-1.0..1.0))
            .collect();
        let (want, mag) = exact(&x, &wf, spec);
        let got = matmul(&g, &w, &x, [DType::F32; 2], spec);
        let gk = spec.k as f64 * U / (1.0 - spec.k as f64 * U);
        for ((&o, &e), &t) in got.iter().zip(&want).zip(&mag) {
            let bound = gk * t + spec.k as f64 * f32::MIN_POSITIVE as f64;
            assert!((o as f64 - e).abs() <= bound, "{format:?}: {o} vs {e}");
        }
    }
}
