//! Parity of `impl Primitives for WgpuBackend` (the methods kernels.rs did not have, and bf16)
//! against gpu-core's CPU backend or f64 definitions, on fresh random inputs (seed printed;
//! replay with `HYBRID_TEST_SEED`) and hostile ones: empty, single elements, sizes past the
//! workgroup, NaN/±inf, huge values. The bound of each comparison is stated where it is made.

mod common;

use common::{close, randn, rng, same, with_hostile, SIZES, U};
use gpu_core::nn::elementwise::{dropout_keep, BinaryKind, ReduceKind};
use gpu_core::nn::{Activation, Primitives};
use gpu_core::ops::{MatmulOps, MatmulSpec};
use gpu_core::{Backend, CpuBackend, DType, GpuError};
use gpu_wgpu::testing::backend_or_skip;
use gpu_wgpu::WgpuBackend;
use half::bf16;
use rand::seq::SliceRandom;
use rand::Rng;

const C: CpuBackend = CpuBackend;

fn bf(x: &[f32]) -> Vec<bf16> {
    x.iter().map(|&v| bf16::from_f32(v)).collect()
}

fn wide(x: &[bf16]) -> Vec<f32> {
    x.iter().map(|v| v.to_f32()).collect()
}

#[test]
fn copy_blocks_moves_exact_bits_and_keeps_the_rest() {
    let Some(b) = backend_or_skip("copy_blocks_moves_exact_bits_and_keeps_the_rest") else {
        return;
    };
    let mut r = rng("copy_blocks");
    // (outer, len, src_offset, src_stride, dst_offset, dst_stride): empty, single, adjacent
    // blocks at odd offsets (bf16 halves of one word from two blocks), past the workgroup.
    let cases = [
        (0, 5, 0, 5, 0, 5),
        (3, 0, 0, 1, 0, 0),
        (1, 1, 0, 0, 0, 0),
        (1, 7, 3, 0, 5, 99),
        (5, 3, 1, 3, 1, 3),
        (4, 5, 2, 7, 3, 6),
        (37, 300, 11, 301, 7, 333),
        (2, 4099, 1, 4100, 0, 4099),
    ];
    for (outer, len, so, ss, d_o, ds) in cases {
        let sn = if outer == 0 {
            so + len
        } else {
            so + (outer - 1) * ss + len + 1
        };
        let dn = if outer == 0 {
            d_o + len
        } else {
            d_o + (outer - 1) * ds + len + 2
        };
        let src: Vec<u32> = (0..sn).map(|_| r.random()).collect();
        let dst: Vec<u32> = (0..dn).map(|_| r.random()).collect();
        let mut want = dst.clone();
        for o in 0..outer {
            let (s, d) = (so + o * ss, d_o + o * ds);
            want[d..d + len].copy_from_slice(&src[s..s + len]);
        }
        // f32 (random bit patterns, NaNs included): exact bits.
        let f = |v: &[u32]| v.iter().map(|&u| f32::from_bits(u)).collect::<Vec<_>>();
        let s = b.upload(&f(&src)).unwrap();
        let mut d = b.upload(&f(&dst)).unwrap();
        b.copy_blocks(&s, so, ss, &mut d, d_o, ds, outer, len)
            .unwrap();
        let got: Vec<f32> = b.download(&d).unwrap();
        let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, want, "f32 {outer}x{len}");
        // bf16 (random 16-bit patterns): exact bits, neighbours in shared words kept.
        let h = |v: &[u32]| {
            v.iter()
                .map(|&u| bf16::from_bits(u as u16))
                .collect::<Vec<_>>()
        };
        let s = b.upload(&h(&src)).unwrap();
        let mut d = b.upload(&h(&dst)).unwrap();
        b.copy_blocks(&s, so, ss, &mut d, d_o, ds, outer, len)
            .unwrap();
        let got: Vec<bf16> = b.download(&d).unwrap();
        let got: Vec<u16> = got.iter().map(|v| v.to_bits()).collect();
        let want16: Vec<u16> = want.iter().map(|&u| u as u16).collect();
        assert_eq!(got, want16, "bf16 {outer}x{len}");
    }
    // Overlapping destination blocks and blocks past the end are typed errors, as on the CPU.
    let s = b.upload(&[0f32; 10]).unwrap();
    let mut d = b.upload(&[0f32; 10]).unwrap();
    assert!(matches!(
        b.copy_blocks(&s, 0, 2, &mut d, 0, 1, 3, 2),
        Err(GpuError::InvalidArgument { .. })
    ));
    assert!(b.copy_blocks(&s, 0, 5, &mut d, 5, 5, 2, 5).is_err());
}

/// A random shape of `rank` dims in 1..=max (0 with `empty`).
fn shape(r: &mut rand::rngs::StdRng, rank: usize, max: usize) -> Vec<usize> {
    (0..rank).map(|_| r.random_range(1..=max)).collect()
}

#[test]
fn permute_matches_the_cpu_every_rank() {
    let Some(b) = backend_or_skip("permute_matches_the_cpu_every_rank") else {
        return;
    };
    let mut r = rng("permute");
    let mut shapes: Vec<Vec<usize>> = (0..=6).map(|k| shape(&mut r, k, 5)).collect();
    shapes.extend([vec![3, 0, 2], vec![1, 1], vec![17, 257], vec![3, 1000, 2]]);
    for sh in shapes {
        let n: usize = sh.iter().product();
        let mut perm: Vec<usize> = (0..sh.len()).collect();
        perm.shuffle(&mut r);
        let x = with_hostile(randn(&mut r, n, 10.0));
        let mut oc = C.allocate(DType::F32, n).unwrap();
        C.permute(&C.upload(&x).unwrap(), &sh, &perm, &mut oc)
            .unwrap();
        let want: Vec<f32> = C.download(&oc).unwrap();
        let mut o = b.allocate(DType::F32, n).unwrap();
        b.permute(&b.upload(&x).unwrap(), &sh, &perm, &mut o)
            .unwrap();
        let got: Vec<f32> = b.download(&o).unwrap();
        // Exact: a permutation moves values.
        assert!(
            got.iter().zip(&want).all(|(g, w)| same(*g, *w)),
            "{sh:?} {perm:?}"
        );
        let mut o = b.allocate(DType::BF16, n).unwrap();
        b.permute(&b.upload(&bf(&x)).unwrap(), &sh, &perm, &mut o)
            .unwrap();
        let got: Vec<bf16> = b.download(&o).unwrap();
        assert!(got
            .iter()
            .zip(&want)
            .all(|(g, w)| same(g.to_f32(), bf16::from_f32(*w).to_f32())));
    }
    let x = b.upload(&[0f32; 6]).unwrap();
    let mut o = b.allocate(DType::F32, 6).unwrap();
    assert!(b.permute(&x, &[2, 3], &[0, 0], &mut o).is_err());
    assert!(b
        .permute(&x, &[1; 7], &[0, 1, 2, 3, 4, 5, 6], &mut o)
        .is_err());
}

/// The same bits, or both NaN, or (Div) within 3 ulps: WGSL allows 2.5 ulps for `/`.
fn binary_ok(op: BinaryKind, g: f32, w: f32) -> bool {
    same(g, w) || (op == BinaryKind::Div && close(g, w as f64, 3.0 * U * 2.0 * w.abs() as f64))
}

#[test]
fn broadcast_binary_matches_the_cpu() {
    let Some(b) = backend_or_skip("broadcast_binary_matches_the_cpu") else {
        return;
    };
    let mut r = rng("broadcast_binary");
    let mut pairs: Vec<(Vec<usize>, Vec<usize>)> = vec![
        (vec![], vec![]),
        (vec![0, 3], vec![3]),
        (vec![2, 1, 4], vec![3, 1]),
        (vec![1], vec![5, 1, 1, 1, 1, 7]),
        (vec![17, 257], vec![17, 1]),
        (vec![4099], vec![1]),
    ];
    for _ in 0..12 {
        let rank = r.random_range(0..=6);
        let full = shape(&mut r, rank, 6);
        let cut = |r: &mut rand::rngs::StdRng| -> Vec<usize> {
            let skip = r.random_range(0..=full.len());
            full[skip..]
                .iter()
                .map(|&d| if r.random_bool(0.4) { 1 } else { d })
                .collect()
        };
        pairs.push((cut(&mut r), cut(&mut r)));
    }
    for (sa, sb) in pairs {
        let out_shape = gpu_core::nn::elementwise::broadcast_shape(&sa, &sb).unwrap();
        let (na, nb, n) = (
            sa.iter().product(),
            sb.iter().product(),
            out_shape.iter().product(),
        );
        let a = with_hostile(randn(&mut r, na, 10.0));
        let mut bv = randn(&mut r, nb, 10.0);
        bv.iter_mut().step_by(3).for_each(|v| *v = 0.0);
        for op in BinaryKind::ALL {
            let mut oc = C.allocate(DType::F32, n).unwrap();
            let (ac, bc) = (C.upload(&a).unwrap(), C.upload(&bv).unwrap());
            C.broadcast_binary(op, &ac, &sa, &bc, &sb, &mut oc).unwrap();
            let want: Vec<f32> = C.download(&oc).unwrap();
            let mut o = b.allocate(DType::F32, n).unwrap();
            let (ad, bd) = (b.upload(&a).unwrap(), b.upload(&bv).unwrap());
            b.broadcast_binary(op, &ad, &sa, &bd, &sb, &mut o).unwrap();
            let got: Vec<f32> = b.download(&o).unwrap();
            for i in 0..n {
                assert!(
                    binary_ok(op, got[i], want[i]),
                    "{op:?} {sa:?} {sb:?} [{i}]: {} vs {}",
                    got[i],
                    want[i]
                );
            }
            // bf16: the CPU's f32 result rounded once (1 bf16 ulp more for Div).
            let (ah, bh) = (bf(&a), bf(&bv));
            let mut oc = C.allocate(DType::BF16, n).unwrap();
            C.broadcast_binary(
                op,
                &C.upload(&ah).unwrap(),
                &sa,
                &C.upload(&bh).unwrap(),
                &sb,
                &mut oc,
            )
            .unwrap();
            let want: Vec<bf16> = C.download(&oc).unwrap();
            let mut o = b.allocate(DType::BF16, n).unwrap();
            b.broadcast_binary(
                op,
                &b.upload(&ah).unwrap(),
                &sa,
                &b.upload(&bh).unwrap(),
                &sb,
                &mut o,
            )
            .unwrap();
            let got: Vec<bf16> = b.download(&o).unwrap();
            for i in 0..n {
                let (g, w) = (got[i].to_f32(), want[i].to_f32());
                let div = op == BinaryKind::Div && close(g, w as f64, w.abs() as f64 / 128.0);
                assert!(same(g, w) || div, "bf16 {op:?} [{i}]: {g} vs {w}");
            }
        }
    }
    let x = b.upload(&[0f32; 6]).unwrap();
    let mut o = b.allocate(DType::F32, 6).unwrap();
    assert!(matches!(
        b.broadcast_binary(BinaryKind::Add, &x, &[2, 3], &x, &[3, 2], &mut o),
        Err(GpuError::InvalidShape { .. })
    ));
}

/// Bound of the f32 activations against the f64 definitions: 2^-17 relative plus 2^-20
/// absolute (times |dy| for the backward): Vulkan's exp/log are 3 + 2|x| ulps, erfc's
/// approximation 1.2e-7 plus `exp(−z²)`'s ulp(z²) for |z| <= 6, a few f32 roundings.
fn act_tol(want: f64, dy: f64) -> f64 {
    want.abs() * 128.0 * U + 16.0 * U * dy.abs().max(1.0)
}

#[test]
fn activations_match_their_definitions() {
    let Some(b) = backend_or_skip("activations_match_their_definitions") else {
        return;
    };
    let mut r = rng("activations");
    for &op in Activation::ALL {
        for n in SIZES {
            let mut x = with_hostile(randn(&mut r, n, 8.0));
            if op == Activation::Log {
                x.iter_mut().skip(10).for_each(|v| *v = v.abs() + 1e-3);
            }
            let mut dy = randn(&mut r, n, 4.0);
            if n > 5 {
                dy[5] = f32::NAN;
            }
            let y: Vec<f32> = x.iter().map(|&v| op.eval(v as f64) as f32).collect();
            let xd = b.upload(&x).unwrap();
            let mut out = b.allocate(DType::F32, n).unwrap();
            b.fill(&mut out, 7.0).unwrap();
            b.activation_fwd(op, &xd, &mut out).unwrap();
            let got: Vec<f32> = b.download(&out).unwrap();
            let (yd, dyd) = (b.upload(&y).unwrap(), b.upload(&dy).unwrap());
            let mut dx = b.allocate(DType::F32, n).unwrap();
            b.activation_bwd(op, &xd, &yd, &dyd, &mut dx).unwrap();
            let gdx: Vec<f32> = b.download(&dx).unwrap();
            for i in 0..n {
                // Subnormal inputs may be flushed by the device (WGSL allows it).
                if x[i].is_subnormal() {
                    continue;
                }
                let want = op.eval(x[i] as f64);
                assert!(
                    close(got[i], want, act_tol(want, 1.0)),
                    "{op:?}({}) = {} want {want}",
                    x[i],
                    got[i]
                );
                let want = op.backward(x[i] as f64, y[i] as f64, dy[i] as f64);
                assert!(
                    close(gdx[i], want, act_tol(want, dy[i] as f64)),
                    "{op:?}'({}, {}, {}) = {} want {want}",
                    x[i],
                    y[i],
                    dy[i],
                    gdx[i]
                );
            }
            // bf16: within 2 bf16 ulps (2^-7 relative) of the CPU's bf16 result.
            let (xh, yh, dyh) = (bf(&x), bf(&y), bf(&dy));
            let cpu_f = |xs: &[bf16]| -> Vec<bf16> {
                let mut o = C.allocate(DType::BF16, n).unwrap();
                C.activation_fwd(op, &C.upload(xs).unwrap(), &mut o)
                    .unwrap();
                C.download(&o).unwrap()
            };
            let mut o = b.allocate(DType::BF16, n).unwrap();
            b.activation_fwd(op, &b.upload(&xh).unwrap(), &mut o)
                .unwrap();
            let got: Vec<bf16> = b.download(&o).unwrap();
            let mut oc = C.allocate(DType::BF16, n).unwrap();
            let up = |v: &[bf16]| C.upload(v).unwrap();
            C.activation_bwd(op, &up(&xh), &up(&yh), &up(&dyh), &mut oc)
                .unwrap();
            let wdx: Vec<bf16> = C.download(&oc).unwrap();
            let mut o2 = b.allocate(DType::BF16, n).unwrap();
            let upw = |v: &[bf16]| b.upload(v).unwrap();
            b.activation_bwd(op, &upw(&xh), &upw(&yh), &upw(&dyh), &mut o2)
                .unwrap();
            let gdx: Vec<bf16> = b.download(&o2).unwrap();
            for (i, (g, w)) in got
                .iter()
                .zip(cpu_f(&xh))
                .chain(gdx.iter().zip(wdx))
                .enumerate()
            {
                let (g, w) = (g.to_f32(), w.to_f32());
                let tol = w.abs() as f64 / 128.0 + 16.0 * U * 4.0;
                assert!(
                    close(g, w as f64, tol) || xh[i % n.max(1)].to_f32().is_subnormal(),
                    "bf16 {op:?} [{i}]: {g} vs {w}"
                );
            }
        }
    }
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
    for (rows, cols) in [(0, 3), (1, 1), (5, 7), (300, 3), (3, 257), (2, 4099)] {
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
            let (g, w) = match dtype {
                DType::F32 => (
                    b.download::<f32>(&o).unwrap(),
                    C.download::<f32>(&oc).unwrap(),
                ),
                _ => (
                    wide(&b.download(&o).unwrap()),
                    wide(&C.download(&oc).unwrap()),
                ),
            };
            assert!(
                g.iter().zip(&w).all(|(a, c)| same(*a, *c)),
                "{dtype} n {n} seed {seed}"
            );
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
                let (g, w) = match dtype {
                    DType::F32 => (
                        b.download::<f32>(&c).unwrap(),
                        C.download::<f32>(&cc).unwrap(),
                    ),
                    _ => (
                        wide(&b.download(&c).unwrap()),
                        wide(&C.download(&cc).unwrap()),
                    ),
                };
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
