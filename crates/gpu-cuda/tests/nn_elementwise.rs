//! `ElementwiseOps`: CUDA against the CPU reference on fresh random inputs of awkward sizes
//! (outputs poisoned with NaN before each launch), random shapes through proptest, the CPU
//! backward passes against finite differences (`grad`), reductions (`reduce`), data movement
//! (`movement`) and typed errors (`errors`).
//!
//! Tolerances: broadcast binary ops, affine (one fma), relu, max, max backward, copies,
//! permutes and dropout are exact, so they must match bit for bit. Activations run in f32 with
//! CUDA's libm (a few ulp) against an f64 reference: forward rtol 2e-6 (atol 1e-37 for results
//! the f64 reference keeps as f32 subnormals), backward rtol 2e-6 with atol 1e-6 (|dy| <= 1)
//! for the cancellation near the zeros of gelu' and silu'. Sum and Mean accumulate in f32 in a
//! different order than the f64 reference: each element must be within 1e-5·Σ|x| (/n for Mean)
//! of it, a bound on the reassociated f32 sum's error, and the whole within 1e-6·‖Σ|x|‖.

mod common;
#[path = "nn_elementwise/errors.rs"]
mod errors;
#[path = "nn_elementwise/grad.rs"]
mod grad;
#[path = "nn_elementwise/movement.rs"]
mod movement;
#[path = "nn_elementwise/reduce.rs"]
mod reduce;

use common::*;
use gpu_core::nn::elementwise::{
    broadcast_shape, Activation, BinaryKind, ElementwiseOps, ReduceKind,
};
use gpu_core::nn::Primitives;
use gpu_core::Backend;
use gpu_cuda::testing::backend_or_skip;
use rand::{rngs::StdRng, Rng, SeedableRng};

/// What the test bodies need from a backend: the ops under test and `fill` to poison outputs.
trait Dev: ElementwiseOps {}
impl<B: ElementwiseOps> Dev for B {}

// ---- calls: upload, poison the output, run, download -----------------------------------------

fn binary<B: Dev>(
    b: &B,
    op: BinaryKind,
    x: &[f32],
    xs: &[usize],
    y: &[f32],
    ys: &[usize],
) -> Vec<f32> {
    let n = broadcast_shape(xs, ys).unwrap().iter().product();
    run_op(b, [x, y], n, |[x, y], o| {
        b.broadcast_binary(op, x, xs, y, ys, o)
    })
}

fn act_fwd<B: Dev>(b: &B, op: Activation, x: &[f32]) -> Vec<f32> {
    run_op(b, [x], x.len(), |[x], o| b.activation_fwd(op, x, o))
}

fn act_bwd<B: Dev>(b: &B, op: Activation, x: &[f32], y: &[f32], dy: &[f32]) -> Vec<f32> {
    run_op(b, [x, y, dy], x.len(), |[x, y, dy], o| {
        b.activation_bwd(op, x, y, dy, o)
    })
}

fn reduce<B: Dev>(b: &B, op: ReduceKind, x: &[f32], shape: (usize, usize, usize)) -> Vec<f32> {
    let (outer, n, inner) = shape;
    run_op(b, [x], outer * inner, |[x], o| {
        b.reduce_axis(op, x, outer, n, inner, o)
    })
}

fn max_bwd<B: Dev>(
    b: &B,
    x: &[f32],
    y: &[f32],
    dy: &[f32],
    shape: (usize, usize, usize),
) -> Vec<f32> {
    let (outer, n, inner) = shape;
    run_op(b, [x, y, dy], x.len(), |[x, y, dy], o| {
        b.max_axis_bwd((x, y, dy), [outer, n, inner], o)
    })
}

fn permute<B: Dev>(b: &B, x: &[f32], shape: &[usize], perm: &[usize]) -> Vec<f32> {
    run_op(b, [x], x.len(), |[x], o| b.permute(x, shape, perm, o))
}

/// Whether a case of `numel` elements runs on device `dev`. On the CPU a parity body compares
/// the reference with itself, so there it only needs small cases (a smoke test of the body);
/// the large ones, which exist for the GPU's grid-stride loops and split reductions, are
/// skipped to keep unoptimised test builds fast.
fn runs_on(dev: &str, numel: usize) -> bool {
    dev != "cpu" || numel <= 1 << 18
}

/// Asserts bit-identical results (any NaN matches any NaN).
fn assert_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "{what}[{i}]: got {g:e}, want {w:e}"
        );
    }
}

/// Asserts `|got − want| <= rtol·|want| + atol` elementwise (NaN and ±inf must match exactly)
/// and its norm-wise form `‖got − want‖ <= rtol·‖want‖ + atol·√n` over the finite elements (a
/// plain relative bound would fail where `want` cancels to ~0, e.g. silu' near x = −2.4).
fn assert_near(what: &str, got: &[f32], want: &[f32], rtol: f64, atol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let (mut num, mut den, mut finite) = (0.0f64, 0.0f64, 0usize);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if !w.is_finite() {
            assert!(
                (w.is_nan() && g.is_nan()) || g == w,
                "{what}[{i}]: got {g:e}, want {w:e}"
            );
            continue;
        }
        finite += 1;
        let d = (g as f64 - w as f64).abs();
        assert!(
            g.is_finite() && d <= rtol * (w as f64).abs() + atol,
            "{what}[{i}]: got {g:e}, want {w:e}, diff {d:e}"
        );
        num += d * d;
        den += (w as f64) * (w as f64);
    }
    let bound = rtol * den.sqrt() + atol * (finite as f64).sqrt();
    assert!(
        num.sqrt() <= bound,
        "{what}: norm-wise error {:e} > {bound:e} (‖want‖ {:e})",
        num.sqrt(),
        den.sqrt()
    );
}

// ---- broadcasting ----------------------------------------------------------------------------

/// Shape pairs covering every kernel path: same shapes, trailing bias (either side, float4 and
/// scalar widths), one value per row, scalars, the general N-d path, 6 dims, zero sizes, and
/// sizes past a million.
fn broadcast_cases() -> Vec<(Vec<usize>, Vec<usize>)> {
    let mut v: Vec<(Vec<usize>, Vec<usize>)> = SIZES.iter().map(|&n| (vec![n], vec![n])).collect();
    let more: &[(&[usize], &[usize])] = &[
        (&[5, 7], &[7]),
        (&[3, 4], &[4]),
        (&[2, 3, 1023], &[1023]),
        (&[3, 4099], &[1, 4099]),
        (&[257, 4096], &[4096]),
        (&[64, 1], &[1]),
        (&[8], &[6, 8]),
        (&[3], &[2, 5, 3]),
        (&[6, 5], &[6, 1]),
        (&[4, 8], &[4, 1]),
        (&[4, 1], &[4, 8]),
        (&[1024, 1025], &[1024, 1]),
        (&[1000], &[]),
        (&[], &[1001]),
        (&[1], &[7, 3]),
        (&[], &[]),
        (&[2, 1], &[1, 3]),
        (&[2, 4, 3, 3], &[2, 1, 3, 3]),
        (&[3, 1, 5], &[1, 4, 1]),
        (&[2, 1, 3, 1, 2, 5], &[1, 2, 1, 4, 2, 1]),
        (&[64, 1, 128], &[1, 32, 128]),
        (&[0], &[0]),
        (&[4, 0], &[1, 0]),
        (&[3, 0, 2], &[2]),
    ];
    v.extend(more.iter().map(|(a, b)| (a.to_vec(), b.to_vec())));
    v
}

/// `n` values in ±10 with every 17th a zero, so Div sees x/0 and 0/0.
fn with_zeros(rng: &mut StdRng, n: usize) -> Vec<f32> {
    let mut v = random_vec(rng, n, 10.0);
    v.iter_mut().step_by(17).for_each(|x| *x = 0.0);
    v
}

fn broadcast_body<B: Dev>(b: &B, dev: &str, rng: &mut StdRng) {
    for (xs, ys) in broadcast_cases() {
        if !runs_on(dev, broadcast_shape(&xs, &ys).unwrap().iter().product()) {
            continue;
        }
        let x = with_zeros(rng, xs.iter().product());
        let y = with_zeros(rng, ys.iter().product());
        for op in BinaryKind::ALL {
            let what = format!("{dev} {op:?} {xs:?} {ys:?}");
            assert_bits(
                &what,
                &binary(b, op, &x, &xs, &y, &ys),
                &binary(&CPU, op, &x, &xs, &y, &ys),
            );
        }
    }
}

every_device_test!(gpu_broadcast_binary_matches_cpu, broadcast_body);

/// An independent reference: unravel each output index and re-ravel it into both operands.
fn naive_broadcast(op: BinaryKind, x: &[f32], xs: &[usize], y: &[f32], ys: &[usize]) -> Vec<f32> {
    let out = broadcast_shape(xs, ys).unwrap();
    let offset = |shape: &[usize], idx: &[usize]| {
        let pad = idx.len() - shape.len();
        shape.iter().enumerate().fold(0, |acc, (k, &d)| {
            acc * d + if d == 1 { 0 } else { idx[k + pad] }
        })
    };
    let n: usize = out.iter().product();
    (0..n)
        .map(|mut i| {
            let mut idx = vec![0; out.len()];
            for k in (0..out.len()).rev() {
                idx[k] = i % out[k];
                i /= out[k];
            }
            op.eval(x[offset(xs, &idx)], y[offset(ys, &idx)])
        })
        .collect()
}

#[test]
fn gpu_broadcast_binary_random_shapes() {
    use proptest::prelude::*;
    use proptest::test_runner::TestRunner;
    let gpu = backend_or_skip("gpu_broadcast_binary_random_shapes");
    let strategy = (
        prop::collection::vec(0usize..=4, 0..=6),
        0usize..=6,
        0usize..=6,
        any::<u8>(),
        any::<u8>(),
        0usize..4,
        any::<u64>(),
    );
    let mut runner = TestRunner::new(proptest_config("gpu_broadcast_binary_random_shapes", 96));
    runner
        .run(&strategy, |(out, ra, rb, ma, mb, op, seed)| {
            // Each operand keeps a suffix of the output's dims, each either as is or as 1.
            let pick = |rank: usize, mask: u8| -> Vec<usize> {
                let rank = rank.min(out.len());
                (out.len() - rank..out.len())
                    .map(|k| if mask >> k & 1 == 1 { out[k] } else { 1 })
                    .collect()
            };
            let (xs, ys) = (pick(ra, ma), pick(rb, mb));
            let op = BinaryKind::ALL[op];
            let mut rng = StdRng::seed_from_u64(seed);
            let x = with_zeros(&mut rng, xs.iter().product());
            let y = with_zeros(&mut rng, ys.iter().product());
            let want = naive_broadcast(op, &x, &xs, &y, &ys);
            let cpu = binary(&CPU, op, &x, &xs, &y, &ys);
            assert_bits(&format!("cpu {op:?} {xs:?} {ys:?}"), &cpu, &want);
            if let Some(g) = &gpu {
                let got = binary(g, op, &x, &xs, &y, &ys);
                assert_bits(&format!("cuda {op:?} {xs:?} {ys:?}"), &got, &want);
            }
            Ok(())
        })
        .unwrap();
}

// ---- activations and affine ------------------------------------------------------------------

/// Inputs in ±8 led by special values; for Log, their absolute values with one negative.
fn activation_input(rng: &mut StdRng, op: Activation, n: usize) -> Vec<f32> {
    let special = [
        0.0,
        -0.0,
        80.0,
        -80.0,
        100.0,
        -100.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        16.0,
        -16.0,
        1e-30,
        -1.2785, // near silu's minimum, where silu' crosses zero
        -0.7518, // near where gelu' crosses zero
    ];
    let mut x = random_vec(rng, n, 8.0);
    if n > special.len() {
        x[..special.len()].copy_from_slice(&special);
    }
    if op == Activation::Log {
        x.iter_mut().for_each(|v| *v = v.abs());
        if let Some(v) = x.last_mut() {
            *v = -1.0;
        }
    }
    x
}

fn activations_body<B: Dev>(b: &B, dev: &str, rng: &mut StdRng) {
    for &n in SIZES.iter().filter(|&&n| runs_on(dev, n)) {
        for &op in Activation::ALL {
            let x = activation_input(rng, op, n);
            let dy = random_vec(rng, n, 1.0);
            let y = act_fwd(&CPU, op, &x);
            let what = format!("{dev} {op:?} n={n}");
            assert_near(&format!("{what} fwd"), &act_fwd(b, op, &x), &y, 2e-6, 1e-37);
            assert_near(
                &format!("{what} bwd"),
                &act_bwd(b, op, &x, &y, &dy),
                &act_bwd(&CPU, op, &x, &y, &dy),
                2e-6,
                1e-6,
            );
        }
    }
}

every_device_test!(gpu_activations_fwd_bwd_match_cpu, activations_body);

fn affine<B: Dev>(b: &B, x: &[f32], mul: f32, add: f32) -> Vec<f32> {
    run_op(b, [x], x.len(), |[x], o| b.affine(x, mul, add, o))
}

fn affine_body<B: Dev>(b: &B, dev: &str, rng: &mut StdRng) {
    for &n in SIZES.iter().filter(|&&n| runs_on(dev, n)) {
        let x = random_vec(rng, n, 100.0);
        for (mul, add) in [
            (2.5, -1.0),
            (0.0, 3.0),
            (-1.0, 0.0),
            (1e-3, 1e3),
            (0.1, 0.2),
        ] {
            assert_bits(
                &format!("{dev} affine {mul}·x+{add} n={n}"),
                &affine(b, &x, mul, add),
                &affine(&CPU, &x, mul, add),
            );
        }
    }
}

every_device_test!(gpu_affine_matches_cpu, affine_body);

/// Inputs larger than one pass of the capped grids (16 blocks of 256 threads per SM, so 2.2M
/// elements for the float4 kernels on 132 SMs), so every grid-stride loop takes several turns.
fn grid_stride_body<B: Dev>(b: &B, dev: &str, rng: &mut StdRng) {
    let n = 5_200_003;
    if !runs_on(dev, n) {
        return;
    }
    let (x, y) = (with_zeros(rng, n), with_zeros(rng, n));
    for (xs, ys) in [
        (vec![n], vec![n]),
        (vec![5000, 1024], vec![1024]),
        (vec![4800, 1025], vec![4800, 1]),
        (vec![128, 1, 96], vec![1, 96, 96]),
    ] {
        let (x, y) = (&x[..xs.iter().product()], &y[..ys.iter().product()]);
        let what = format!("{dev} Div {xs:?} {ys:?}");
        assert_bits(
            &what,
            &binary(b, BinaryKind::Div, x, &xs, y, &ys),
            &binary(&CPU, BinaryKind::Div, x, &xs, y, &ys),
        );
    }
    let relu = Activation::Relu;
    let r = act_fwd(&CPU, relu, &x);
    assert_bits(&format!("{dev} relu"), &act_fwd(b, relu, &x), &r);
    let dx = act_bwd(b, relu, &x, &r, &y);
    assert_bits(
        &format!("{dev} relu'"),
        &dx,
        &act_bwd(&CPU, relu, &x, &r, &y),
    );
    let mut o = poisoned(b, n);
    b.dropout(&up(b, &x), 0.25, 5, &mut o).unwrap();
    let mut want = poisoned(&CPU, n);
    CPU.dropout(&up(&CPU, &x), 0.25, 5, &mut want).unwrap();
    assert_bits(&format!("{dev} dropout"), &down(b, &o), &down(&CPU, &want));
}

every_device_test!(gpu_grid_stride_loops_cover_large_inputs, grid_stride_body);

/// `dropout_offset` (the seed completed on the device, for CUDA graphs) is `dropout` with the
/// seed `seed + offsets[index]`, wrapping: bit for bit against the CPU reference, for offsets
/// that carry into the high word and wrap past 2^64, at every index of the offsets buffer; an
/// index past its end or a buffer of another dtype is a typed error.
#[test]
fn gpu_dropout_with_a_device_offset_is_dropout_with_the_summed_seed() {
    let (gpu, mut r) = skip_unless!(gpu_and_rng(
        "gpu_dropout_with_a_device_offset_is_dropout_with_the_summed_seed"
    ));
    let n = 4099; // a scalar tail after the float4 body
    let x = random_vec(&mut r, n, 3.0);
    let xb = up(&gpu, &x);
    let cases = [
        (5u64, 0u64),
        (r.random(), r.random()),
        (u64::MAX, 2),
        (0xFFFF_FFFF, 1),
    ];
    let words: Vec<u32> = cases
        .iter()
        .flat_map(|&(_, o)| [o as u32, (o >> 32) as u32])
        .collect();
    let offsets = gpu.upload(&words).unwrap();
    for (k, &(seed, off)) in cases.iter().enumerate() {
        let mut o = poisoned(&gpu, n);
        gpu.dropout_offset(&xb, 0.3, seed, (&offsets, k), &mut o)
            .unwrap();
        let mut want = poisoned(&CPU, n);
        CPU.dropout(&up(&CPU, &x), 0.3, seed.wrapping_add(off), &mut want)
            .unwrap();
        assert_bits(
            &format!("dropout seed {seed} offset {off} (entry {k})"),
            &down(&gpu, &o),
            &down(&CPU, &want),
        );
    }
    let mut o = poisoned(&gpu, n);
    let floats = up(&gpu, &[1.0f32, 2.0]);
    for (bad, k) in [(&offsets, 4), (&offsets, usize::MAX), (&floats, 0)] {
        let e = gpu
            .dropout_offset(&xb, 0.3, 1, (bad, k), &mut o)
            .unwrap_err();
        assert!(e.to_string().contains("offsets"), "{e}");
    }
    assert!(
        down(&gpu, &o).iter().all(|v| v.is_nan()),
        "a refused call wrote"
    );
}
