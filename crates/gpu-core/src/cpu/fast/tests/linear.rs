//! The fast products by a compact weight (`fast/linear.rs`) against the f64 reference, through
//! the backend's ops in the fast mode: `matmul` with a bf16 `Wᵀ`, `matmul_quant` with int8 and
//! int4 weights. Inputs are fresh random values from a printed seed (`HYBRID_TEST_SEED`
//! replays), with hostile shapes (`k` not a multiple of the 16 lanes, of the 2048-input
//! stretch or of the int4 group; `m`, `n` or `k` zero; `k` past 2^17) and NaN/±inf in `x`.
//!
//! Bound: each output sums `k` products of exact-valued f32 operands in f32, so it is within
//! `γ_k·Σ|x·w| + k·2⁻¹⁴⁹` of the exact sum (`γ_k = k·u/(1 − k·u)`, `u = 2⁻²⁴`; the last term
//! covers products that underflow), whatever the order of the additions; a bf16 output adds
//! its rounding, `2⁻⁸·(|exact| + that bound)`. Where the exact sum is NaN or infinite, the
//! output must be the same.

use super::{check, normal, seed, U};
use crate::backend::BufferInfo;
use crate::cpu::fast::linear::{matmul_t, Weight, DIRECT_MAX_M, KC};
use crate::cpu::fast::{with_mode, CpuMode, Isa};
use crate::cpu::{CpuBackend, CpuStorage};
use crate::nn::quant::{QuantFormat, QuantOps, QuantSpec};
use crate::testing::same_bits;
use crate::{MatmulOps, MatmulSpec};
use half::bf16;
use rand::{rngs::StdRng, Rng, SeedableRng};

/// `m` both sides of the direct kernel's limit, and 0.
const MS: [usize; 5] = [0, 1, 5, DIRECT_MAX_M, DIRECT_MAX_M + 3];

/// The exact `x·wᵀ` (f64) and `Σ|x·w|` per output, from the weight's f32 values.
fn exact(x: &[f32], w: &[f32], m: usize, n: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
    crate::testing::exact_xwt(x, w, (m, n, k))
}

/// Checks an f32 or bf16 output against the exact sums with the module's bound.
fn check_out(what: &str, out: &CpuStorage, want: &[f64], mag: &[f64], k: usize) {
    let kf = k as f64;
    let gamma = kf * U / (1.0 - kf * U);
    let sum = |i: usize| gamma * mag[i] + kf * f64::from(f32::from_bits(1));
    match out {
        CpuStorage::F32(o) => check(what, o, want, sum),
        CpuStorage::BF16(o) => {
            let o: Vec<f32> = o.iter().map(|v| v.to_f32()).collect();
            check(what, &o, want, |i| {
                sum(i) + (want[i].abs() + sum(i)) / 256.0
            })
        }
        other => panic!("{what}: output {:?}", other.dtype()),
    }
}

/// `x` as stored in `dtype` and its f32 values, with NaN, +inf and −inf in three rows when
/// `hostile` (and `m ≥ 3`).
fn input(rng: &mut StdRng, m: usize, k: usize, bf: bool, hostile: bool) -> (CpuStorage, Vec<f32>) {
    let mut x = normal(rng, m * k, 0.0, 1.0);
    if bf {
        x.iter_mut().for_each(|v| *v = bf16::from_f32(*v).to_f32());
    }
    if hostile && m >= 3 && k > 0 {
        x[rng.random_range(0..k)] = f32::NAN;
        x[k + rng.random_range(0..k)] = f32::INFINITY;
        x[2 * k + rng.random_range(0..k)] = f32::NEG_INFINITY;
    }
    let stored = if bf {
        CpuStorage::BF16(x.iter().map(|&v| bf16::from_f32(v)).collect())
    } else {
        CpuStorage::F32(x.clone())
    };
    (stored, x)
}

#[test]
fn bf16_weight_products_are_within_the_f32_sum_bound() {
    let mut rng = StdRng::seed_from_u64(seed("bf16_weight_products"));
    let ks = [0, 1, 15, 17, 300, KC + 5];
    let mut cases = vec![];
    for &m in &MS {
        for &k in &ks {
            cases.push((m, 1 + (m + k) % 37, k));
        }
        cases.push((m, 0, 20));
    }
    for (m, n, k) in cases {
        for (bf_out, hostile) in [(false, false), (true, true)] {
            let w: Vec<bf16> = normal(&mut rng, n * k, 0.0, 0.5)
                .into_iter()
                .map(bf16::from_f32)
                .collect();
            let wf: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
            let (xs, xf) = input(&mut rng, m, k, true, hostile);
            let spec = MatmulSpec {
                batch: 1,
                m,
                n,
                k,
                trans_a: false,
                trans_b: true,
            };
            let mut out = if bf_out {
                CpuStorage::BF16(vec![bf16::ZERO; m * n])
            } else {
                CpuStorage::F32(vec![0.0; m * n])
            };
            with_mode(CpuMode::Fast, || {
                CpuBackend.matmul(spec, &xs, &CpuStorage::BF16(w), &mut out)
            })
            .unwrap();
            let (want, mag) = exact(&xf, &wf, m, n, k);
            check_out(&format!("bf16 {m}x{n}x{k}"), &out, &want, &mag, k);
        }
    }
}

/// A random packed weight of `format` and its dequantized f32 values (the reference's
/// `dequantize`).
fn quant_weight(
    rng: &mut StdRng,
    format: QuantFormat,
    n: usize,
    k: usize,
) -> ([CpuStorage; 3], Vec<f32>) {
    let spec = QuantSpec::weight(format, n, k);
    let data: Vec<u32> = match format {
        // Finite f16 pairs (random bits would include infinities and NaNs).
        QuantFormat::F16 => normal(rng, 2 * spec.data_len(), -1.0, 1.0)
            .chunks_exact(2)
            .map(|p| {
                let h = |v: f32| half::f16::from_f32(v).to_bits() as u32;
                h(p[0]) | h(p[1]) << 16
            })
            .collect(),
        _ => (0..spec.data_len()).map(|_| rng.random()).collect(),
    };
    let scales: Vec<f32> = (0..spec.scales_len())
        .map(|_| rng.random_range(0.001..0.05))
        .collect();
    let mins = normal(rng, spec.mins_len(), -0.1, 0.1);
    let parts = [
        CpuStorage::U32(data),
        CpuStorage::F32(scales),
        CpuStorage::F32(mins),
    ];
    let mut w = CpuStorage::F32(vec![0.0; n * k]);
    let [d, s, mn] = &parts;
    CpuBackend.dequantize([d, s, mn], &mut w, spec).unwrap();
    let CpuStorage::F32(w) = w else {
        unreachable!("an f32 buffer")
    };
    (parts, w)
}

/// One quantized product in `mode` into an f32 or bf16 output.
fn quant_product(
    mode: CpuMode,
    x: &CpuStorage,
    [d, s, mn]: &[CpuStorage; 3],
    spec: QuantSpec,
    bf_out: bool,
) -> CpuStorage {
    let len = spec.m * spec.n;
    let mut out = if bf_out {
        CpuStorage::BF16(vec![bf16::ZERO; len])
    } else {
        CpuStorage::F32(vec![0.0; len])
    };
    with_mode(mode, || {
        CpuBackend.matmul_quant(x, [d, s, mn], &mut out, spec)
    })
    .unwrap();
    out
}

#[test]
fn quantized_products_are_within_the_f32_sum_bound() {
    let mut rng = StdRng::seed_from_u64(seed("quantized_products"));
    for format in [QuantFormat::Int8, QuantFormat::Int4, QuantFormat::F16] {
        // int8 rows are multiples of 4 inputs, int4 of 8, f16 of 2: none of these of 16, 128
        // or KC.
        let ks = match format {
            QuantFormat::Int8 => [0, 4, 132, 1004, KC + 20],
            QuantFormat::Int4 => [0, 8, 136, 392, KC + 136],
            QuantFormat::F16 => [0, 2, 130, 1002, KC + 18],
        };
        for &m in &MS {
            for (c, &k) in ks.iter().enumerate() {
                let n = [0, 1, 31, 9, 20][(c + m) % 5];
                let (parts, wf) = quant_weight(&mut rng, format, n, k);
                let spec = QuantSpec { m, n, k, format };
                let bf_in = c % 2 == 1;
                let (x, xf) = input(&mut rng, m, k, bf_in, m % 2 == 1);
                let (want, mag) = exact(&xf, &wf, m, n, k);
                let what = format!("{format:?} {m}x{n}x{k}");
                for bf_out in [false, true] {
                    let fast = quant_product(CpuMode::Fast, &x, &parts, spec, bf_out);
                    check_out(&what, &fast, &want, &mag, k);
                }
                // The exact mode is still the f64 reference: the exact sum rounded once (±0 alike).
                let reference = quant_product(CpuMode::Exact, &x, &parts, spec, false);
                let rounded: Vec<f32> = want.iter().map(|&v| v as f32).collect();
                let same = |a: &f32, b: &f32| a == b || a.is_nan() && b.is_nan();
                assert!(
                    reference
                        .as_f32()
                        .unwrap()
                        .iter()
                        .zip(&rounded)
                        .all(|(a, b)| same(a, b)),
                    "{what}: the exact mode is not the f64 reference"
                );
            }
        }
    }
}

#[test]
fn huge_k_stays_within_the_bound() {
    let mut rng = StdRng::seed_from_u64(seed("huge_k"));
    let k = (1 << 17) + 8;
    for m in [2, DIRECT_MAX_M + 1] {
        let (parts, wf) = quant_weight(&mut rng, QuantFormat::Int4, 3, k);
        let (x, xf) = input(&mut rng, m, k, false, false);
        let (want, mag) = exact(&xf, &wf, m, 3, k);
        let spec = QuantSpec {
            m,
            n: 3,
            k,
            format: QuantFormat::Int4,
        };
        let fast = quant_product(CpuMode::Fast, &x, &parts, spec, false);
        check_out(&format!("int4 {m}x3x{k}"), &fast, &want, &mag, k);
    }
}

/// The direct kernel's outputs at `isa` for the rows of `x` (`m × k`).
fn direct(isa: Isa, x: &[f32], w: Weight<'_>, m: usize, threads: usize) -> Vec<f32> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let mut y = vec![f32::NAN; m * w.dims().0];
    pool.install(|| matmul_t(isa, x, m, w, &mut y)).unwrap();
    y
}

#[test]
fn the_direct_kernel_gives_the_same_bits_at_every_level_thread_count_and_m() {
    let mut rng = StdRng::seed_from_u64(seed("direct_kernel_bits"));
    let (m, n, k) = (DIRECT_MAX_M - 3, 23, KC + 264);
    let (parts, _) = quant_weight(&mut rng, QuantFormat::Int4, n, k);
    let [d, s, mn] = &parts;
    let w = Weight::Quant {
        spec: QuantSpec::weight(QuantFormat::Int4, n, k),
        data: d.as_u32().unwrap(),
        scales: s.as_f32().unwrap(),
        mins: mn.as_f32().unwrap(),
    };
    let mut x = normal(&mut rng, m * k, 0.0, 1.0);
    x[5] = f32::NAN;
    let base = direct(Isa::Scalar, &x, w, m, 1);
    for isa in Isa::available() {
        for threads in [1, 3] {
            let got = direct(isa, &x, w, m, threads);
            assert!(same_bits(&got, &base), "{isa:?}, {threads} threads");
        }
        // Each row alone gives its row of the batched product.
        for i in [0, 4, m - 1] {
            let row = direct(isa, &x[i * k..][..k], w, 1, 2);
            assert!(
                same_bits(&row, &base[i * n..][..n]),
                "{isa:?}, row {i} alone"
            );
        }
    }
    assert!(base[..n].iter().all(|v| v.is_nan()), "NaN in x's row 0");
    assert!(base[n..].iter().all(|v| v.is_finite()));
}
