//! Every `RowOps` backward of the CPU reference against central finite differences of its
//! forward, on small random inputs. The loss is `L = Σ r ∘ forward(x)` for a random `r` (which
//! is then the `dy` of the backward), evaluated in f64 from the f32 outputs; inputs are
//! perturbed in f32 by `h = 5e-3` and the step actually taken is the denominator. Tolerance:
//! `|fd − analytic| <= 1e-2·|analytic| + 2e-3·max|analytic| + 5e-5` elementwise (the last term
//! is the noise floor: f32 rounding of the outputs divided by 2h) and 2e-3 norm-wise (with the
//! same floor); the O(h²) truncation is far below both. RoPE and the embedding
//! are linear: their backward is checked as the adjoint, `⟨f(x), y⟩ = ⟨x, f*(y)⟩`.

mod common;
mod nn_rows_util;

use common::*;
use gpu_core::CpuBackend;
use nn_rows_util::*;
use rand::rngs::StdRng;
use rand::Rng;

const H: f32 = 5e-3;

/// Central differences of `loss` with respect to every element of `x`.
fn fd_grad(x: &[f32], loss: impl Fn(&[f32]) -> f64) -> Vec<f64> {
    let mut xp = x.to_vec();
    (0..x.len())
        .map(|j| {
            let (up, dn) = (x[j] + H, x[j] - H);
            xp[j] = up;
            let lp = loss(&xp);
            xp[j] = dn;
            let lm = loss(&xp);
            xp[j] = x[j];
            (lp - lm) / (up as f64 - dn as f64)
        })
        .collect()
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

/// Asserts the `analytic` gradient of `loss` at `x` matches its central differences
/// ([`fd_grad`]).
fn assert_grad(what: &str, analytic: &[f32], x: &[f32], loss: impl Fn(&[f32]) -> f64) {
    let fd = &fd_grad(x, loss);
    assert_eq!(analytic.len(), fd.len(), "{what}: length");
    let scale = analytic.iter().fold(0.0f64, |m, &a| m.max(a.abs() as f64));
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (i, (&a, &f)) in analytic.iter().zip(fd).enumerate() {
        let d = (a as f64 - f).abs();
        assert!(
            d <= 1e-2 * (a as f64).abs() + 2e-3 * scale + 5e-5,
            "{what}[{i}]: analytic {a}, finite difference {f}"
        );
        num += d * d;
        den += (a as f64).powi(2);
    }
    assert!(
        num.sqrt() <= 2e-3 * den.sqrt() + 5e-5 * (fd.len() as f64).sqrt(),
        "{what}: norm-wise error {:e} vs norm {:e}",
        num.sqrt(),
        den.sqrt()
    );
}

/// Small awkward shapes: one row, one column, odd widths.
const SHAPES: &[(usize, usize)] = &[(1, 1), (1, 5), (3, 7), (2, 16), (4, 3)];

fn targets(rng: &mut StdRng, rows: usize, cols: usize) -> Vec<u32> {
    (0..rows)
        .map(|_| rng.random_range(0..cols as u32))
        .collect()
}

/// Rows (offset by 1) whose variance is at least 0.5, so rstd stays moderate and h is small
/// against the curvature of the normalisation.
fn spread_rows(rng: &mut StdRng, rows: usize, cols: usize) -> Vec<f32> {
    let mut x = Vec::with_capacity(rows * cols);
    for _ in 0..rows {
        let row = loop {
            let r = random_vec(rng, cols, 2.0);
            let mean = r.iter().sum::<f32>() / cols as f32;
            let var = r.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / cols as f32;
            if var >= 0.5 {
                break r;
            }
        };
        x.extend(row.iter().map(|v| v + 1.0));
    }
    x
}

/// A CPU forward and its backward from the forward's output (softmax's or log-softmax's).
type RowFwd = fn(&CpuBackend, &[f32], usize) -> Vec<f32>;
type RowBwd = fn(&CpuBackend, &[f32], &[f32], usize) -> Vec<f32>;

/// `bwd` against finite differences of `Σ r ∘ fwd(x)` on every shape, inputs seeded by `test`.
fn check_softmax_like_bwd(test: &str, what: &str, fwd: RowFwd, bwd: RowBwd) {
    let (mut rng, _) = rng(test);
    let c = &CpuBackend;
    for &(rows, cols) in SHAPES {
        let (x, r) = (
            random_vec(&mut rng, rows * cols, 3.0),
            random_vec(&mut rng, rows * cols, 1.0),
        );
        let y = fwd(c, &x, cols);
        let an = bwd(c, &y, &r, cols);
        assert_grad(&format!("{what} {rows}x{cols}"), &an, &x, |x| {
            dot(&fwd(c, x, cols), &r)
        });
    }
}

#[test]
fn softmax_bwd_matches_finite_differences() {
    let test = "softmax_bwd_matches_finite_differences";
    check_softmax_like_bwd(test, "softmax", softmax, softmax_bwd);
}

#[test]
fn log_softmax_bwd_matches_finite_differences() {
    let test = "log_softmax_bwd_matches_finite_differences";
    check_softmax_like_bwd(test, "log_softmax", log_softmax, log_softmax_bwd);
}

#[test]
fn cross_entropy_bwd_matches_finite_differences() {
    let (mut rng, _) = rng("cross_entropy_bwd_matches_finite_differences");
    let c = &CpuBackend;
    for &(rows, cols) in SHAPES {
        let x = random_vec(&mut rng, rows * cols, 3.0);
        let (t, dl) = (
            targets(&mut rng, rows, cols),
            random_vec(&mut rng, rows, 2.0),
        );
        let an = ce_bwd(c, &x, &t, &dl, cols);
        assert_grad(&format!("cross_entropy {rows}x{cols}"), &an, &x, |x| {
            dot(&ce_fwd(c, x, &t, cols), &dl)
        });
    }
}

#[test]
fn layernorm_bwd_matches_finite_differences() {
    let (mut rng, _) = rng("layernorm_bwd_matches_finite_differences");
    let c = &CpuBackend;
    let eps = 1e-5;
    for &(rows, cols) in SHAPES.iter().filter(|s| s.1 > 1) {
        let x = spread_rows(&mut rng, rows, cols);
        let (w, b) = (
            random_vec(&mut rng, cols, 2.0),
            random_vec(&mut rng, cols, 1.0),
        );
        let r = random_vec(&mut rng, rows * cols, 1.0);
        let (_, mean, rstd) = ln_fwd(c, &x, &w, &b, cols, eps);
        let (dx, dw, db) = ln_bwd(c, NormBwd::layernorm((&x, &w), (&mean, &rstd), &r, cols));
        let what = format!("layernorm {rows}x{cols}");
        assert_grad(&format!("{what} dx"), &dx, &x, |x| {
            dot(&ln_fwd(c, x, &w, &b, cols, eps).0, &r)
        });
        assert_grad(&format!("{what} dw"), &dw, &w, |w| {
            dot(&ln_fwd(c, &x, w, &b, cols, eps).0, &r)
        });
        assert_grad(&format!("{what} db"), &db, &b, |b| {
            dot(&ln_fwd(c, &x, &w, b, cols, eps).0, &r)
        });
    }
}

#[test]
fn rmsnorm_bwd_matches_finite_differences() {
    let (mut rng, _) = rng("rmsnorm_bwd_matches_finite_differences");
    let c = &CpuBackend;
    let eps = 1e-5;
    for &(rows, cols) in SHAPES {
        // |x| in [0.5, 1.5): rstd stays moderate, so h is small against the curvature.
        let x: Vec<f32> = random_vec(&mut rng, rows * cols, 1.0)
            .iter()
            .map(|v| v.signum() * (0.5 + v.abs()))
            .collect();
        let (w, r) = (
            random_vec(&mut rng, cols, 2.0),
            random_vec(&mut rng, rows * cols, 1.0),
        );
        let (_, rstd) = rms_fwd(c, &x, &w, cols, eps);
        let (dx, dw) = rms_bwd(c, NormBwd::rmsnorm((&x, &w), &rstd, &r, cols));
        let what = format!("rmsnorm {rows}x{cols}");
        assert_grad(&format!("{what} dx"), &dx, &x, |x| {
            dot(&rms_fwd(c, x, &w, cols, eps).0, &r)
        });
        assert_grad(&format!("{what} dw"), &dw, &w, |w| {
            dot(&rms_fwd(c, &x, w, cols, eps).0, &r)
        });
    }
}

#[test]
fn rope_inverse_is_the_adjoint() {
    let (mut rng, _) = rng("rope_inverse_is_the_adjoint");
    let c = &CpuBackend;
    for (n, t, d) in [(1, 1, 2), (2, 5, 4), (3, 17, 6), (2, 9, 64)] {
        let (x, y) = (
            random_vec(&mut rng, n * t * d, 1.0),
            random_vec(&mut rng, n * t * d, 1.0),
        );
        let fx = rope(c, &x, n, t, d, 10_000.0, false);
        let bty = rope(c, &y, n, t, d, 10_000.0, true);
        let (lhs, rhs) = (dot(&fx, &y), dot(&x, &bty));
        let mag: f64 = x.iter().zip(&y).map(|(a, b)| (a * b).abs() as f64).sum();
        assert!(
            (lhs - rhs).abs() <= 1e-6 * mag,
            "[{n},{t},{d}]: {lhs} vs {rhs}"
        );
        // A rotation: the inverse undoes it.
        check(
            &format!("rope round trip [{n},{t},{d}]"),
            &rope(c, &fx, n, t, d, 10_000.0, true),
            &x,
            EXACT,
        );
    }
}

#[test]
fn rope_uses_rotate_half_convention() {
    // d = 4, base = 100: pair 0 turns by θ = pos, pair 1 by θ = pos / 10.
    let x = [1.0f32, 2.0, 3.0, 4.0];
    let t = 2;
    let xs: Vec<f32> = x.iter().chain(&x).copied().collect(); // positions 0 and 1
    let out = rope(&CpuBackend, &xs, 1, t, 4, 100.0, false);
    assert_eq!(&out[..4], &x, "position 0 is the identity");
    let (c0, s0, c1, s1) = (1f64.cos(), 1f64.sin(), 0.1f64.cos(), 0.1f64.sin());
    let want = [
        1.0 * c0 - 3.0 * s0,
        2.0 * c1 - 4.0 * s1,
        3.0 * c0 + 1.0 * s0,
        4.0 * c1 + 2.0 * s1,
    ];
    for (g, w) in out[4..].iter().zip(want) {
        assert!((*g as f64 - w).abs() < 1e-6, "{g} vs {w}");
    }
}

#[test]
fn embedding_bwd_is_the_adjoint() {
    let (mut rng, _) = rng("embedding_bwd_is_the_adjoint");
    let c = &CpuBackend;
    for (rows, vocab, dim) in [(1, 1, 1), (9, 4, 3), (40, 7, 8)] {
        let ids: Vec<u32> = (0..rows)
            .map(|_| rng.random_range(0..vocab as u32))
            .collect();
        let table = random_vec(&mut rng, vocab * dim, 1.0);
        let g = random_vec(&mut rng, rows * dim, 1.0);
        let lhs = dot(&emb_fwd(c, &ids, &table, dim), &g);
        let rhs = dot(&table, &emb_bwd(c, &ids, &g, vocab, dim));
        assert!(
            (lhs - rhs).abs() <= 1e-5 * (1.0 + lhs.abs()),
            "{lhs} vs {rhs}"
        );
    }
    // Repeated ids add up; unused rows are zero.
    let dt = emb_bwd(c, &[1, 0, 1], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 3, 2);
    assert_eq!(dt, [3.0, 4.0, 6.0, 8.0, 0.0, 0.0]);
}
