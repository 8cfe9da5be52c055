//! Parity of `impl Primitives for WgpuBackend` (the methods kernels.rs did not have, and bf16)
//! against gpu-core's CPU backend or f64 definitions, on fresh random inputs (seed printed;
//! replay with `HYBRID_TEST_SEED`) and hostile ones: empty, single elements, sizes past the
//! workgroup, NaN/±inf, huge values. The bound of each comparison is stated where it is made.

mod common;

use common::{bf, close, flushed, ftz, randn, rng, same, with_hostile, SIZES, U};
use gpu_core::nn::elementwise::BinaryKind;
use gpu_core::nn::BlockCopy;
use gpu_core::nn::{Activation, Primitives};
use gpu_core::{Backend, CpuBackend, DType, Element, GpuError};
use gpu_wgpu::testing::backend_or_skip;
use gpu_wgpu::WgpuBackend;
use half::bf16;
use rand::seq::SliceRandom;
use rand::Rng;

const C: CpuBackend = CpuBackend;

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
        let copy = BlockCopy {
            src_offset: so,
            src_stride: ss,
            dst_offset: d_o,
            dst_stride: ds,
            outer,
            len,
        };
        // f32 (random bit patterns, NaNs included): exact bits.
        let f = |v: &[u32]| v.iter().map(|&u| f32::from_bits(u)).collect::<Vec<_>>();
        let got = copied(&b, &f(&src), &f(&dst), copy);
        let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, want, "f32 {outer}x{len}");
        // bf16 (random 16-bit patterns): exact bits, neighbours in shared words kept.
        let h = |v: &[u32]| {
            v.iter()
                .map(|&u| bf16::from_bits(u as u16))
                .collect::<Vec<_>>()
        };
        let got = copied(&b, &h(&src), &h(&dst), copy);
        let got: Vec<u16> = got.iter().map(|v| v.to_bits()).collect();
        let want16: Vec<u16> = want.iter().map(|&u| u as u16).collect();
        assert_eq!(got, want16, "bf16 {outer}x{len}");
    }
    // Overlapping destination blocks and blocks past the end are typed errors, as on the CPU.
    let s = b.upload(&[0f32; 10]).unwrap();
    let mut d = b.upload(&[0f32; 10]).unwrap();
    assert!(matches!(
        b.copy_blocks(
            &s,
            &mut d,
            BlockCopy {
                src_offset: 0,
                src_stride: 2,
                dst_offset: 0,
                dst_stride: 1,
                outer: 3,
                len: 2
            }
        ),
        Err(GpuError::InvalidArgument { .. })
    ));
    assert!(b
        .copy_blocks(
            &s,
            &mut d,
            BlockCopy {
                src_offset: 0,
                src_stride: 5,
                dst_offset: 5,
                dst_stride: 5,
                outer: 2,
                len: 5
            }
        )
        .is_err());
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
    let mut cases: Vec<(Vec<usize>, Vec<usize>)> = shapes
        .into_iter()
        .map(|sh| {
            let mut perm: Vec<usize> = (0..sh.len()).collect();
            perm.shuffle(&mut r);
            (sh, perm)
        })
        .collect();
    // The last axis kept and a multiple of 4 (moved as vec4s): the attention's head split and
    // merge, an identity, rank 1, an empty one.
    cases.extend([
        (vec![2, 3, 4, 8], vec![0, 2, 1, 3]),
        (vec![2, 4, 3, 8], vec![0, 2, 1, 3]),
        (vec![3, 2, 12], vec![1, 0, 2]),
        (vec![5, 4], vec![0, 1]),
        (vec![4], vec![0]),
        (vec![0, 4], vec![1, 0]),
        (vec![2, 0, 4], vec![1, 0, 2]),
    ]);
    for (sh, perm) in cases {
        let n: usize = sh.iter().product();
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
            let want = broadcast(&C, op, (&a, &sa), (&bv, &sb), n);
            // The same on the inputs a flushing device reads (subnormals as zero).
            let want_ftz = broadcast(&C, op, (&ftz(&a), &sa), (&ftz(&bv), &sb), n);
            let got = broadcast(&b, op, (&a, &sa), (&bv, &sb), n);
            for i in 0..n {
                let ok = |w: f32| binary_ok(op, got[i], w) || flushed(&[], got[i], w);
                assert!(
                    ok(want[i]) || ok(want_ftz[i]),
                    "{op:?} {sa:?} {sb:?} [{i}]: {} vs {}",
                    got[i],
                    want[i]
                );
            }
            // bf16: the CPU's f32 result rounded once (1 bf16 ulp more for Div).
            let (ah, bh) = (bf(&a), bf(&bv));
            let want = broadcast(&C, op, (&ah, &sa), (&bh, &sb), n);
            // The same on flushed inputs (a bf16 subnormal widens to an f32 subnormal).
            let (af, bff) = (bf(&ftz(&a)), bf(&ftz(&bv)));
            let want_ftz = broadcast(&C, op, (&af, &sa), (&bff, &sb), n);
            let got = broadcast(&b, op, (&ah, &sa), (&bh, &sb), n);
            for i in 0..n {
                let g = got[i].to_f32();
                let ok = |w: f32| {
                    let div = op == BinaryKind::Div && close(g, w as f64, w.abs() as f64 / 128.0);
                    same(g, w) || div || flushed(&[], g, w)
                };
                let (w, wf) = (want[i].to_f32(), want_ftz[i].to_f32());
                assert!(ok(w) || ok(wf), "bf16 {op:?} [{i}]: {g} vs {w}");
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

/// `dst` after `b.copy_blocks` of `src` into it with `copy`, through the device.
fn copied<T: Element>(b: &WgpuBackend, src: &[T], dst: &[T], copy: BlockCopy) -> Vec<T> {
    let s = b.upload(src).unwrap();
    let mut d = b.upload(dst).unwrap();
    b.copy_blocks(&s, &mut d, copy).unwrap();
    b.download(&d).unwrap()
}

/// `op(x, y)` of `x` (shape `sx`) and `y` (shape `sy`) broadcast to `n` elements, computed in
/// `T` on backend `be`.
fn broadcast<B: Primitives, T: Element>(
    be: &B,
    op: BinaryKind,
    (x, sx): (&[T], &[usize]),
    (y, sy): (&[T], &[usize]),
    n: usize,
) -> Vec<T> {
    let mut o = be.allocate(T::DTYPE, n).unwrap();
    let (xd, yd) = (be.upload(x).unwrap(), be.upload(y).unwrap());
    be.broadcast_binary(op, &xd, sx, &yd, sy, &mut o).unwrap();
    be.download(&o).unwrap()
}
