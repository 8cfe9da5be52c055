//! Parity of the reductions, argmax, dropout, bf16 matmul and the trait's dtype checks of
//! `impl Primitives for WgpuBackend` against gpu-core's CPU backend (see trait_primitives.rs
//! for the rest), on fresh random inputs (seed printed; replay with `HYBRID_TEST_SEED`) and
//! hostile ones. The bound of each comparison is stated where it is made.

mod common;

use common::{bf, close, flushed, get, randn, rng, same, with_hostile, SIZES, U};
use gpu_core::nn::elementwise::{dropout_keep, ReduceKind};
use gpu_core::nn::{Activation, Primitives};
use gpu_core::ops::{MatmulOps, MatmulSpec};
use gpu_core::{Backend, CpuBackend, DType, GpuError};
use gpu_wgpu::testing::backend_or_skip;
use gpu_wgpu::WgpuBackend;
use half::bf16;
use rand::Rng;

const C: CpuBackend = CpuBackend;

fn wide(x: &[bf16]) -> Vec<f32> {
    x.iter().map(|v| v.to_f32()).collect()
}

#[test]
fn reduce_axis_matches_the_cpu() {
    let Some(b) = backend_or_skip("reduce_axis_matches_the_cpu") else {
        return;
    };
    let mut r = rng("reduce_axis");
    let shapes = [
        (0, 3, 2),
        (2, 0, 3),
        (1, 1, 1),
        (4, 3, 7),
        (3, 257, 1),
        (2, 5, 300),
        (1, 4099, 1),
        // The longest reduction one thread does alone (256), with many outputs.
        (3, 256, 70),
        (2, 2, 2),
    ];
    for (outer, n, inner) in shapes {
        let mut x = randn(&mut r, outer * n * inner, 100.0);
        if (outer, n, inner) == (2, 2, 2) {
            // Max of −0 and +0 is +0 in either order; NaN and ±inf columns.
            x = vec![
                -0.0,
                f32::NAN,
                0.0,
                -0.0,
                f32::INFINITY,
                1.0,
                2.0,
                f32::NEG_INFINITY,
            ];
        } else if x.len() > inner * 2 {
            x[0] = f32::NAN;
            x[inner + 1] = f32::INFINITY;
        }
        for op in [ReduceKind::Sum, ReduceKind::Mean, ReduceKind::Max] {
            let mut o = b.allocate(DType::F32, outer * inner).unwrap();
            let xd = b.upload(&x).unwrap();
            if n == 0 && op != ReduceKind::Sum {
                let e = b.reduce_axis(op, &xd, outer, n, inner, &mut o);
                assert!(matches!(e, Err(GpuError::InvalidShape { .. })));
                continue;
            }
            b.reduce_axis(op, &xd, outer, n, inner, &mut o).unwrap();
            let got: Vec<f32> = b.download(&o).unwrap();
            let mut oc = C.allocate(DType::F32, outer * inner).unwrap();
            C.reduce_axis(op, &C.upload(&x).unwrap(), outer, n, inner, &mut oc)
                .unwrap();
            let want: Vec<f32> = C.download(&oc).unwrap();
            for (g, (o, j)) in (0..outer)
                .flat_map(|o| (0..inner).map(move |j| (o, j)))
                .enumerate()
            {
                let col = (0..n).map(|k| x[o * n * inner + k * inner + j].abs() as f64);
                // Bound: Max exact; Sum n·2^-24·Σ|x| (f32 tree sum against the CPU's f64 sum
                // rounded once), Mean that over n plus one rounding.
                let tol = match op {
                    ReduceKind::Max => 0.0,
                    ReduceKind::Sum => n as f64 * U * col.sum::<f64>(),
                    ReduceKind::Mean => {
                        (n as f64 * U * col.sum::<f64>()) / n as f64 + U * want[g].abs() as f64
                    }
                };
                let ok = if op == ReduceKind::Max {
                    same(got[g], want[g])
                } else {
                    close(got[g], want[g] as f64, tol)
                };
                assert!(
                    ok,
                    "{op:?} {outer}x{n}x{inner} [{g}]: {} vs {}",
                    got[g], want[g]
                );
            }
            // bf16: within one bf16 ulp (2^-8 relative) plus the f32 bound of the CPU's result.
            let xh = bf(&x);
            let mut o = b.allocate(DType::BF16, outer * inner).unwrap();
            b.reduce_axis(op, &b.upload(&xh).unwrap(), outer, n, inner, &mut o)
                .unwrap();
            let got: Vec<bf16> = b.download(&o).unwrap();
            let mut oc = C.allocate(DType::BF16, outer * inner).unwrap();
            C.reduce_axis(op, &C.upload(&xh).unwrap(), outer, n, inner, &mut oc)
                .unwrap();
            let want: Vec<bf16> = C.download(&oc).unwrap();
            for (g, w) in got.iter().zip(&want) {
                let (g, w) = (g.to_f32(), w.to_f32());
                let abs: f64 = xh
                    .iter()
                    .map(|v| v.to_f32().abs() as f64)
                    .filter(|v| v.is_finite())
                    .sum();
                let tol = w.abs() as f64 / 256.0 + n as f64 * U * abs;
                assert!(
                    close(g, w as f64, tol),
                    "bf16 {op:?} {outer}x{n}x{inner}: {g} vs {w}"
                );
            }
        }
    }
}

#[test]
fn argmax_rows_is_the_first_max_with_nan_largest() {
    let Some(b) = backend_or_skip("argmax_rows_is_the_first_max_with_nan_largest") else {
        return;
    };
    let mut r = rng("argmax_rows");
    for (rows, cols) in [
        (0, 3),
        (0, 300),
        (1, 1),
        (5, 7),
        (300, 3),
        (3, 257),
        (2, 4099),
        (6, 1000),
        (5, 128256),
    ] {
        let mut x = randn(&mut r, rows * cols, 3.0);
        // Small integers: ties between the maxima of a row.
        x.iter_mut().step_by(2).for_each(|v| *v = v.round());
        if rows >= 5 && cols >= 3 {
            x[cols + 2] = f32::NAN; // row 1: a NaN wins over everything after it
            x[cols + cols - 1] = f32::NAN;
            x[2 * cols..3 * cols].fill(f32::NEG_INFINITY); // row 2: all −inf → 0
            x[3 * cols + 1] = f32::INFINITY;
            x[4 * cols..5 * cols].fill(1.0); // row 4: all tied → 0
        }
        for dtype in [DType::F32, DType::BF16] {
            let (xd, xc) = match dtype {
                DType::F32 => (b.upload(&x).unwrap(), C.upload(&x).unwrap()),
                _ => (b.upload(&bf(&x)).unwrap(), C.upload(&bf(&x)).unwrap()),
            };
            let mut o = b.upload(&vec![u32::MAX; rows]).unwrap();
            b.argmax_rows(&xd, &mut o, cols).unwrap();
            let mut oc = C.upload(&vec![0u32; rows]).unwrap();
            C.argmax_rows(&xc, &mut oc, cols).unwrap();
            // Exact: the same index.
            assert_eq!(
                b.download::<u32>(&o).unwrap(),
                C.download::<u32>(&oc).unwrap(),
                "{rows}x{cols} {dtype}"
            );
        }
    }
    let x = b.upload(&[1f32; 4]).unwrap();
    let mut o = b.upload(&[0u32; 2]).unwrap();
    assert!(b.argmax_rows(&x, &mut o, 0).is_err());
    let mut f = b.allocate(DType::F32, 2).unwrap();
    assert!(b.argmax_rows(&x, &mut f, 2).is_err());
}

#[test]
fn dropout_masks_are_bit_identical_to_the_cpu_hash() {
    let Some(b) = backend_or_skip("dropout_masks_are_bit_identical_to_the_cpu_hash") else {
        return;
    };
    let mut r = rng("dropout");
    let mut seeds: Vec<u64> = vec![0, 1, 42, u64::MAX, 1 << 63, 0xD1B5_4A32_D192_ED03];
    seeds.extend((0..14).map(|_| r.random::<u64>()));
    let ps = [
        0.0f32,
        1e-6,
        0.1,
        0.2,
        0.5,
        0.5 + 3.0 / 16_777_216.0,
        0.9,
        0.999,
    ];
    let n = 20_011;
    let ones = b.upload(&vec![1f32; n]).unwrap();
    let mut out = b.allocate(DType::F32, n).unwrap();
    for &seed in &seeds {
        for &p in &ps {
            b.dropout(&ones, p, seed, &mut out).unwrap();
            let got: Vec<f32> = b.download(&out).unwrap();
            let s = 1.0f32 / (1.0 - p);
            for (i, &g) in got.iter().enumerate() {
                let keep = dropout_keep(seed, i as u64, p);
                assert!(
                    g.to_bits() == if keep { s.to_bits() } else { 0 },
                    "seed {seed} p {p} i {i}: {g}"
                );
            }
        }
    }
    // Values: bit-identical to the CPU's dropout, f32 and bf16, hostile values and sizes.
    for n in SIZES {
        let x = with_hostile(randn(&mut r, n, 1e3));
        let seed = r.random::<u64>();
        for dtype in [DType::F32, DType::BF16] {
            let (xd, xc) = match dtype {
                DType::F32 => (b.upload(&x).unwrap(), C.upload(&x).unwrap()),
                _ => (b.upload(&bf(&x)).unwrap(), C.upload(&bf(&x)).unwrap()),
            };
            let (mut o, mut oc) = (b.allocate(dtype, n).unwrap(), C.allocate(dtype, n).unwrap());
            b.dropout(&xd, 0.3, seed, &mut o).unwrap();
            C.dropout(&xc, 0.3, seed, &mut oc).unwrap();
            let (g, w) = (get(&b, &o), get(&C, &oc));
            // Bit for bit, but for subnormal values, which WGSL lets the device flush.
            let xs = match dtype {
                DType::F32 => x.clone(),
                _ => wide(&bf(&x)),
            };
            for (i, (a, c)) in g.iter().zip(&w).enumerate() {
                assert!(
                    same(*a, *c) || flushed(&[xs[i]], *a, *c),
                    "{dtype} n {n} seed {seed} [{i}]: {a} against {c}"
                );
            }
        }
    }
    assert!(b.dropout(&ones, 1.0, 0, &mut out).is_err());
}

#[test]
fn bf16_matmul_accumulates_in_f32_and_rounds_once() {
    let Some(b) = backend_or_skip("bf16_matmul_accumulates_in_f32_and_rounds_once") else {
        return;
    };
    let mut r = rng("bf16_matmul");
    for (batch, m, n, k) in [
        (1, 1, 1, 1),
        (1, 0, 3, 4),
        (1, 3, 4, 0),
        (2, 17, 33, 65),
        (1, 5, 300, 257),
    ] {
        for (ta, tb) in [(false, false), (true, true), (false, true)] {
            let spec = MatmulSpec {
                batch,
                m,
                n,
                k,
                trans_a: ta,
                trans_b: tb,
            };
            let a = bf(&randn(&mut r, batch * m * k, 4.0));
            let bm = bf(&randn(&mut r, batch * k * n, 4.0));
            let (ad, bd) = (b.upload(&a).unwrap(), b.upload(&bm).unwrap());
            let (ac, bc) = (C.upload(&a).unwrap(), C.upload(&bm).unwrap());
            let abs: f64 = 16.0 * k as f64; // Σ|a||b| <= k·4·4
            for dtype in [DType::F32, DType::BF16] {
                let mut c = b.allocate(dtype, batch * m * n).unwrap();
                b.fill(&mut c, f32::NAN).unwrap();
                b.matmul(spec, &ad, &bd, &mut c).unwrap();
                let mut cc = C.allocate(dtype, batch * m * n).unwrap();
                C.matmul(spec, &ac, &bc, &mut cc).unwrap();
                let (g, w) = (get(&b, &c), get(&C, &cc));
                // Bound: 2(k+1)·2^-24·Σ|a||b| (both sides' f32 accumulation), plus one bf16
                // ulp of the result when it is rounded to bf16.
                for (x, y) in g.iter().zip(&w) {
                    let tol = 2.0 * (k as f64 + 1.0) * U * abs
                        + if dtype == DType::BF16 {
                            y.abs() as f64 / 256.0
                        } else {
                            0.0
                        };
                    assert!(close(*x, *y as f64, tol), "{spec:?} {dtype}: {x} vs {y}");
                }
            }
        }
    }
    // Mixed operand dtypes are refused, as on the CPU.
    let a = b.upload(&[bf16::ONE; 4]).unwrap();
    let f = b.upload(&[1f32; 4]).unwrap();
    let mut c = b.allocate(DType::F32, 4).unwrap();
    assert!(matches!(
        b.matmul(MatmulSpec::new(2, 2, 2), &a, &f, &mut c),
        Err(GpuError::DTypeMismatch { .. })
    ));
}

#[test]
fn cast_and_fill_through_the_trait_reject_what_the_cpu_rejects() {
    let Some(b) = backend_or_skip("cast_and_fill_through_the_trait_reject_what_the_cpu_rejects")
    else {
        return;
    };
    let u = b.upload(&[1u32, 2]).unwrap();
    let mut f = b.allocate(DType::F32, 2).unwrap();
    assert!(matches!(
        Primitives::cast(&b, &u, &mut f),
        Err(GpuError::UnsupportedDType { .. })
    ));
    let other = WgpuBackend::new(0).unwrap();
    let mut g = other.allocate(DType::F32, 2).unwrap();
    assert!(matches!(
        b.activation_fwd(Activation::Relu, &f, &mut g),
        Err(GpuError::ForeignBuffer { .. })
    ));
    let h = b.upload(&[half::f16::ONE; 2]).unwrap();
    let mut h2 = b.allocate(DType::F16, 2).unwrap();
    assert!(matches!(
        b.activation_fwd(Activation::Relu, &h, &mut h2),
        Err(GpuError::UnsupportedDType { .. })
    ));
}
