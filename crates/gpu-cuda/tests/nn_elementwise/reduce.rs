//! Reductions: Sum, Mean and Max over an axis against the CPU reference (hostile sums with
//! infinities, NaN and values near f32's range among them), Max's backward pass, and Sum as
//! the adjoint of broadcasting.

use super::*;

/// `(outer, n, inner)`: empty outputs and an empty axis, single elements, rows (inner = 1) of
/// odd and float4 widths, long rows that are split across blocks, narrow and wide columns,
/// columns wider than a block, many short rows, a bias gradient (a split column reduction),
/// more items than one pass of the capped grid, rows enough for a warp a row (float4 and
/// scalar loads), float4 columns narrower than a warp, and columns split in clusters.
const REDUCE_CASES: &[(usize, usize, usize)] = &[
    (0, 5, 3),
    (3, 0, 2),
    (2, 3, 0),
    (1, 1, 1),
    (7, 31, 1),
    (3, 1023, 1),
    (2, 1024, 1),
    (1, 1 << 20, 1),
    (2, (1 << 20) + 7, 1),
    (5, 17, 33),
    (1, 100_000, 3),
    (64, 128, 64),
    (1000, 3, 1),
    (4, 4099, 1),
    (3, 5, 1025),
    (2, 70_001, 1),
    (1, 4096, 32),
    (300, 1, 7),
    (300_000, 3, 1),
    (20_000, 2, 64),
    (1, 8192, 768),
    (2500, 1000, 1),
    (2500, 1001, 1),
    (3, 50, 12),
    // Split float4 columns that sm_90 reduces in thread-block clusters: tiles of 16 and 32
    // units, three outer items, a last tile of one unit.
    (1, 512, 4096),
    (3, 200, 2048),
    (1, 600, 4100),
];

/// Checks a Sum (`div` 1) or Mean (`div` n) against the reference: each element within
/// `1e-5·Σ|x|/div` (a bound on the error of an f32 sum in any order at these lengths), and the
/// whole within `1e-6·‖Σ|x|/div‖` (the typical error of a tree-shaped sum is a few ulp of Σ|x|;
/// measuring against ‖Σ|x|‖ rather than ‖Σx‖ keeps cancellation from making this flaky).
fn assert_sum_close(what: &str, got: &[f32], want: &[f32], abs_sum: &[f32], div: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (i, ((&g, &w), &s)) in got.iter().zip(want).zip(abs_sum).enumerate() {
        let scale = s as f64 / div;
        let d = (g as f64 - w as f64).abs();
        assert!(
            d <= 1e-5 * scale + 1e-30,
            "{what}[{i}]: got {g:e}, want {w:e}, diff {d:e}, Σ|x|/div {scale:e}"
        );
        num += d * d;
        den += scale * scale;
    }
    assert!(
        num.sqrt() <= 1e-6 * den.sqrt(),
        "{what}: ‖got − want‖ = {:e} > 1e-6·‖Σ|x|‖ = {:e}",
        num.sqrt(),
        1e-6 * den.sqrt()
    );
}

/// Sums and means whose inputs hold, in five different outputs: +inf; +inf and −inf (NaN); a
/// NaN; 1e30 among values near 1 (finite, and within the same `1e-5·Σ|x|` bound); two 3e38 of
/// the same sign (+inf in any order: nothing near 1 brings the sum back under f32's range).
/// Non-finite outputs must match the reference's exactly (NaN for NaN, the same infinity),
/// every other output stays within the bound: nothing leaks into the other outputs.
fn hostile_sums<B: Dev>(b: &B, dev: &str, x: &[f32], shape: (usize, usize, usize)) {
    let (outer, n, inner) = shape;
    let mut x = x.to_vec();
    let at = |u: usize, j: usize| ((u / inner) * n + j) * inner + u % inner;
    let outs = outer * inner;
    let specials: [&[(usize, f32)]; 5] = [
        &[(0, f32::INFINITY)],
        &[(0, f32::INFINITY), (n - 1, f32::NEG_INFINITY)],
        &[(n / 2, f32::NAN)],
        &[(0, 1e30)],
        &[(0, 3e38), (n - 1, 3e38)],
    ];
    for (u, list) in specials.iter().enumerate().take(outs) {
        for &(j, v) in list.iter() {
            x[at(u, j)] = v;
        }
    }
    let abs: Vec<f32> = x.iter().map(|v| v.abs()).collect();
    let abs_sum = reduce(&CPU, ReduceKind::Sum, &abs, shape);
    for (op, div) in [(ReduceKind::Sum, 1.0), (ReduceKind::Mean, n as f64)] {
        let got = reduce(b, op, &x, shape);
        let want = reduce(&CPU, op, &x, shape);
        for (i, ((&g, &w), &s)) in got.iter().zip(&want).zip(&abs_sum).enumerate() {
            let what = format!("{dev} hostile {op:?} {shape:?}[{i}]: got {g:e}, want {w:e}");
            if !w.is_finite() {
                assert!(g == w || (g.is_nan() && w.is_nan()), "{what}");
            } else {
                assert!(
                    (g as f64 - w as f64).abs() <= 1e-5 * s as f64 / div + 1e-30,
                    "{what}"
                );
            }
        }
    }
}

fn reduce_body<B: Dev>(b: &B, dev: &str, rng: &mut StdRng) {
    for &shape in REDUCE_CASES {
        let (outer, n, inner) = shape;
        if !runs_on(dev, outer * n * inner) {
            continue;
        }
        let mut x = random_vec(rng, outer * n * inner, 1.0);
        let abs: Vec<f32> = x.iter().map(|v| v.abs()).collect();
        let abs_sum = reduce(&CPU, ReduceKind::Sum, &abs, shape);
        for op in [ReduceKind::Sum, ReduceKind::Mean] {
            if n == 0 && op == ReduceKind::Mean {
                continue;
            }
            let div = if op == ReduceKind::Mean {
                n as f64
            } else {
                1.0
            };
            assert_sum_close(
                &format!("{dev} {op:?} {shape:?}"),
                &reduce(b, op, &x, shape),
                &reduce(&CPU, op, &x, shape),
                &abs_sum,
                div,
            );
        }
        if n == 0 {
            continue;
        }
        hostile_sums(b, dev, &x, shape);
        // Max is exact. Make one column all -inf and put a NaN in another.
        if outer * inner >= 2 {
            for i in 0..n {
                x[i * inner] = f32::NEG_INFINITY;
            }
            x[(outer * n - 1) * inner + inner - 1] = f32::NAN;
        }
        let got = reduce(b, ReduceKind::Max, &x, shape);
        let want = reduce(&CPU, ReduceKind::Max, &x, shape);
        let what = format!("{dev} Max {shape:?}");
        assert_eq!(got.len(), want.len(), "{what}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                g == w || (g.is_nan() && w.is_nan()),
                "{what}[{i}]: {g} vs {w}"
            );
        }
        // Zeros of both signs among negatives: +0 counts above −0 in any order, so the bits
        // match whatever order the device combines in.
        let zeros: Vec<f32> = x
            .iter()
            .map(|&v| match rng.random_range(0..3) {
                0 => -0.0,
                1 => 0.0,
                _ => -v.abs() - 1.0,
            })
            .collect();
        assert_bits(
            &format!("{dev} Max of signed zeros {shape:?}"),
            &reduce(b, ReduceKind::Max, &zeros, shape),
            &reduce(&CPU, ReduceKind::Max, &zeros, shape),
        );
    }
}

every_device_test!(gpu_reduce_axis_matches_cpu, reduce_body);

fn max_bwd_body<B: Dev>(b: &B, dev: &str, rng: &mut StdRng) {
    for &shape in REDUCE_CASES.iter().filter(|s| s.1 > 0) {
        let (outer, n, inner) = shape;
        if !runs_on(dev, outer * n * inner) {
            continue;
        }
        // Values on a grid of 1/4 in ±4: ties are everywhere, so "first maximum" matters.
        let mut x: Vec<f32> = random_vec(rng, outer * n * inner, 4.0)
            .iter()
            .map(|v| (v * 4.0).round() / 4.0)
            .collect();
        if x.len() > 5 {
            let mid = x.len() / 2;
            x[mid] = f32::NAN;
        }
        let y = reduce(&CPU, ReduceKind::Max, &x, shape);
        let dy = random_vec(rng, outer * inner, 1.0);
        assert_bits(
            &format!("{dev} max_axis_bwd {shape:?}"),
            &max_bwd(b, &x, &y, &dy, shape),
            &max_bwd(&CPU, &x, &y, &dy, shape),
        );
    }
}

every_device_test!(gpu_max_axis_bwd_matches_cpu, max_bwd_body);

/// ⟨sum_axis(x), y⟩ = ⟨x, broadcast(y)⟩: Sum over an axis is the adjoint of broadcasting along
/// it (the broadcast made with `broadcast_binary(Add, 0, y)`, which must copy y exactly).
fn adjoint_body<B: Dev>(b: &B, dev: &str, rng: &mut StdRng) {
    for shape in [
        (3, 5, 7),
        (1, 1000, 1),
        (4, 33, 65),
        (2, 4099, 3),
        (1, 1 << 16, 1),
    ] {
        let (outer, n, inner) = shape;
        let x = random_vec(rng, outer * n * inner, 1.0);
        let y = random_vec(rng, outer * inner, 1.0);
        let zeros = vec![0.0f32; x.len()];
        let yb = binary(
            b,
            BinaryKind::Add,
            &zeros,
            &[outer, n, inner],
            &y,
            &[outer, 1, inner],
        );
        for (k, &v) in yb.iter().enumerate() {
            let (o, j) = (k / (n * inner), k % inner);
            assert_eq!(v, y[o * inner + j], "{dev} broadcast {shape:?} [{k}]");
        }
        let s = reduce(b, ReduceKind::Sum, &x, shape);
        let dot = |p: &[f32], q: &[f32]| -> f64 {
            p.iter().zip(q).map(|(&a, &c)| a as f64 * c as f64).sum()
        };
        let (lhs, rhs) = (dot(&s, &y), dot(&x, &yb));
        let scale: f64 = x.iter().zip(&yb).map(|(a, c)| (a * c).abs() as f64).sum();
        assert!(
            (lhs - rhs).abs() <= 1e-5 * scale,
            "{dev} {shape:?}: <sum x, y> = {lhs}, <x, bcast y> = {rhs}"
        );
    }
}

every_device_test!(gpu_reduce_sum_is_the_adjoint_of_broadcasting, adjoint_body);
