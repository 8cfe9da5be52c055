//! The fast kernels against the exact reference: random inputs from a printed seed
//! (`HYBRID_TEST_SEED` replays), hostile inputs (NaN, ±inf, huge, empty), every instruction-set
//! level this host has (the scalar fallback always; levels must agree bit for bit), and the
//! stated error bounds. `u = 2^-24` is f32's unit roundoff.

use super::{math, optim, rows, with_mode, CpuMode, Isa};
use crate::cpu::{CpuBackend, CpuStorage};
use crate::nn::rows::LayerNormBwdIn;
use crate::nn::{Activation, AdamWConfig, OptimOps, Primitives, RowOps};
use crate::testing::{adamw_one, same_bits};
use crate::Backend;
use rand::{rngs::StdRng, Rng, SeedableRng};
use rand_distr::{Distribution, Normal};

mod attention;
mod attention_dropout;
mod cross_entropy;
mod linear;
mod sgemm;

pub(super) const U: f64 = 1.0 / (1u64 << 24) as f64;

/// The seed of a randomised test ([`crate::testing::test_seed`]: fixed per test, printed).
pub(super) fn seed(test: &str) -> u64 {
    crate::testing::test_seed(test)
}

pub(super) fn normal(rng: &mut StdRng, n: usize, mean: f64, std: f64) -> Vec<f32> {
    let d = Normal::new(mean, std).unwrap();
    (0..n).map(|_| d.sample(rng) as f32).collect()
}

/// Runs `f` at every level; asserts all give the same bits as the scalar fallback and returns
/// that result.
pub(super) fn at_every_level(what: &str, f: impl Fn(Isa) -> Vec<f32>) -> Vec<f32> {
    let levels = Isa::available();
    eprintln!("{what}: levels {levels:?}");
    let base = f(Isa::Scalar);
    for &isa in &levels[1..] {
        let got = f(isa);
        let same = got.len() == base.len() && same_bits(&got, &base);
        assert!(same, "{what}: {isa:?} differs from the scalar fallback");
    }
    base
}

/// `got` matches `want` where `want` is not finite (NaN for NaN, the same infinity), and
/// within `bound(i)` elsewhere.
pub(super) fn check(what: &str, got: &[f32], want: &[f64], bound: impl Fn(usize) -> f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() {
            g as f64 == w
        } else {
            (g as f64 - w).abs() <= bound(i)
        };
        assert!(ok, "{what}[{i}]: fast {g}, exact {w}, bound {}", bound(i));
    }
}

/// Random values with the hostile ones mixed in.
pub(super) fn hostile_mix(rng: &mut StdRng, n: usize, std: f64) -> Vec<f32> {
    let mut x = normal(rng, n, 0.0, std);
    x.extend(crate::testing::fixtures::HOSTILE_FLOATS);
    x.extend([1e-30, -40.0, 40.0, f32::MIN_POSITIVE]);
    x
}

#[test]
fn exp_is_within_4_ulp_at_every_level() {
    let mut rng = StdRng::seed_from_u64(seed("exp_is_within_4_ulp_at_every_level"));
    let mut x: Vec<f32> = (0..20_000)
        .map(|_| rng.random_range(-103.0..88.7))
        .collect();
    x.extend([
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        88.72,
        89.0,
        -1e30,
        1e30,
    ]);
    let got = at_every_level("exp", |isa| {
        let mut o = vec![0.0; x.len()];
        math::exp_slice(isa, &x, &mut o);
        o
    });
    // Past f32's range the rounded result is inf.
    let want: Vec<f64> = x
        .iter()
        .map(|&v| (v as f64).exp())
        .map(|w| {
            if w > f32::MAX as f64 {
                f64::INFINITY
            } else {
                w
            }
        })
        .collect();
    // 4 ulp relative for normal results; subnormal results to within 2 of the smallest
    // subnormal (their spacing); results past f32's range must be inf.
    check("exp", &got, &want, |i| {
        let w = want[i];
        if w >= f32::MIN_POSITIVE as f64 {
            4.0 * 2.0 * U * w
        } else {
            2.0 * 1.4e-45
        }
    });
    assert_eq!(got[x.len() - 2], 0.0, "exp(-1e30)");
    assert_eq!(got[x.len() - 1], f32::INFINITY, "exp(1e30)");
}

/// Bound of the fast GELU forward: `|x|·ΔΦ + 2u|y|` with ΔΦ <= 0.5·1.5e-7 (A&S 7.1.26) plus the
/// f32 evaluation (about ten roundings of terms at most 1): 3e-7 in all.
fn gelu_bound(x: f64, y: f64) -> f64 {
    x.abs() * 3e-7 + 2.0 * U * y.abs() + 1e-37
}

#[test]
fn gelu_matches_the_exact_reference() {
    let mut rng = StdRng::seed_from_u64(seed("gelu_matches_the_exact_reference"));
    let x = hostile_mix(&mut rng, 5000, 3.0);
    let dy = normal(&mut rng, x.len(), 0.0, 1.0);
    let fwd = at_every_level("gelu_fwd", |isa| {
        let mut o = vec![0.0; x.len()];
        math::gelu_fwd(isa, &x, &mut o);
        o
    });
    let want: Vec<f64> = x.iter().map(|&v| Activation::Gelu.eval(v as f64)).collect();
    check("gelu_fwd", &fwd, &want, |i| {
        gelu_bound(x[i] as f64, want[i])
    });
    let bwd = at_every_level("gelu_bwd", |isa| {
        let mut o = vec![0.0; x.len()];
        math::gelu_bwd(isa, &x, &dy, &mut o);
        o
    });
    let want: Vec<f64> = x
        .iter()
        .zip(&dy)
        .map(|(&v, &g)| Activation::Gelu.backward(v as f64, 0.0, g as f64))
        .collect();
    // (Φ + xφ)·dy: ΔΦ as above; x·φ(x) with φ's relative error from exp (4 ulp) and from the
    // rounding of x²/2 (x²/2·u): |dy|·(3e-7 + |xφ|·(x²/2 + 10)·u), plus 2u of the result.
    check("gelu_bwd", &bwd, &want, |i| {
        let (xv, g) = (x[i] as f64, dy[i] as f64);
        let phi = 0.398_942_280_4 * (-0.5 * xv * xv).exp();
        let tail = if phi == 0.0 {
            0.0
        } else {
            (xv * phi).abs() * (0.5 * xv * xv + 10.0) * U
        };
        g.abs() * (3e-7 + tail) + 2.0 * U * want[i].abs() + 1e-37
    });
}

/// The backend in fast mode runs the fast GELU (and in exact mode the reference), also on an
/// empty buffer.
#[test]
fn backend_modes_pick_the_kernels() {
    let cpu = CpuBackend;
    let x = cpu.upload(&[0.3f32, -1.7, 2.5]).unwrap();
    let mut o = cpu.allocate(crate::DType::F32, 3).unwrap();
    let run = |mode, o: &mut CpuStorage| {
        with_mode(mode, || cpu.activation_fwd(Activation::Gelu, &x, o)).unwrap();
        o.as_f32().unwrap().to_vec()
    };
    let fast = run(CpuMode::Fast, &mut o);
    let exact = run(CpuMode::Exact, &mut o);
    let mut want = vec![0.0; 3];
    math::gelu_fwd(Isa::best(), x.as_f32().unwrap(), &mut want);
    assert_eq!(fast, want);
    for (i, &v) in [0.3f32, -1.7, 2.5].iter().enumerate() {
        assert_eq!(exact[i], Activation::Gelu.eval(v as f64) as f32);
    }
    let empty = cpu.upload::<f32>(&[]).unwrap();
    let mut eo = cpu.allocate(crate::DType::F32, 0).unwrap();
    with_mode(CpuMode::Fast, || {
        cpu.activation_fwd(Activation::Gelu, &empty, &mut eo)
    })
    .unwrap();
}

#[test]
fn mode_defaults_to_exact_and_overrides_nest() {
    assert_eq!(CpuMode::parse(" Fast "), Some(CpuMode::Fast));
    assert_eq!(CpuMode::parse("exact"), Some(CpuMode::Exact));
    assert_eq!(CpuMode::parse("fastest"), None);
    // Tests never call `set_mode`, so the process-wide mode is the default.
    assert_eq!(super::mode(), CpuMode::Exact);
    with_mode(CpuMode::Fast, || {
        assert_eq!(super::mode(), CpuMode::Fast);
        with_mode(CpuMode::Exact, || assert_eq!(super::mode(), CpuMode::Exact));
        assert_eq!(super::mode(), CpuMode::Fast);
    });
    assert_eq!(super::mode(), CpuMode::Exact);
}

/// LayerNorm forward and backward, fast against exact, through the backend, on rows whose
/// mean is large against their spread (the hard case for the mean), with hostile rows.
#[test]
fn layernorm_matches_the_exact_reference() {
    let mut rng = StdRng::seed_from_u64(seed("layernorm_matches_the_exact_reference"));
    let cpu = CpuBackend;
    for (rows_n, cols) in [(0, 8), (1, 1), (5, 7), (37, 128), (4, 300)] {
        let n = rows_n * cols;
        let mut x = normal(&mut rng, n, 3.0, 1.5);
        if rows_n == 5 {
            x[cols + 2] = f32::NAN;
            x[2 * cols] = f32::INFINITY;
        }
        let w = normal(&mut rng, cols, 1.0, 0.5);
        let b = normal(&mut rng, cols, 0.0, 0.5);
        let dy = normal(&mut rng, n, 0.0, 1.0);
        let up = |v: &[f32]| cpu.upload(v).unwrap();
        let (xs, ws, bs, dys) = (up(&x), up(&w), up(&b), up(&dy));
        let run = |mode| {
            with_mode(mode, || {
                let z = |len| cpu.allocate(crate::DType::F32, len).unwrap();
                let (mut y, mut mean, mut rstd) = (z(n), z(rows_n), z(rows_n));
                cpu.layernorm_fwd((&xs, &ws, &bs), (&mut y, &mut mean, &mut rstd), cols, 1e-5)
                    .unwrap();
                let (mut dx, mut dw, mut db) = (z(n), z(cols), z(cols));
                cpu.layernorm_bwd(
                    LayerNormBwdIn {
                        x: &xs,
                        w: &ws,
                        mean: &mean,
                        rstd: &rstd,
                        dy: &dys,
                    },
                    (&mut dx, &mut dw, &mut db),
                    cols,
                )
                .unwrap();
                let v = |s: &CpuStorage| s.as_f32().unwrap().to_vec();
                [v(&y), v(&mean), v(&rstd), v(&dx), v(&dw), v(&db)]
            })
        };
        let fast = run(CpuMode::Fast);
        let exact = run(CpuMode::Exact);
        let e = |k: usize| -> Vec<f64> { exact[k].iter().map(|&v| v as f64).collect() };
        let nf = cols as f64;
        // Per row: Σ|x|/n, the size of the terms of the mean.
        let absmean: Vec<f64> = (0..rows_n)
            .map(|r| {
                x[r * cols..][..cols]
                    .iter()
                    .map(|v| v.abs() as f64)
                    .sum::<f64>()
                    / nf
            })
            .collect();
        let (rstd, mean) = (e(2), e(1));
        let xhat = |i: usize| (x[i] as f64 - mean[i / cols]) * rstd[i / cols];
        // mean: n·u·Σ|x|/n; x̂: rs·Δμ + |x̂|·(2n + 8)·u (the variance's sum and the sqrt);
        // y = x̂·w + b: |w|·Δx̂ + 2u·(|x̂ w| + |b|).
        let k = (2.0 * nf + 16.0) * U;
        let dxhat = |i: usize| rstd[i / cols] * k * absmean[i / cols] + xhat(i).abs() * k;
        let what = format!("layernorm {rows_n}x{cols}");
        check(&format!("{what} mean"), &fast[1], &mean, |r| k * absmean[r]);
        check(&format!("{what} y"), &fast[0], &e(0), |i| {
            let c = i % cols;
            let (wv, bv) = (w[c].abs() as f64, b[c].abs() as f64);
            wv * dxhat(i) + 2.0 * U * (xhat(i).abs() * wv + bv) + 1e-30
        });
        // dx = rs·(g − (Σg + x̂·Σg·x̂)/n), g = dy·w: each sum of n terms off by n·u of its
        // absolute terms, x̂ off by Δx̂; scaled by rs.
        check(&format!("{what} dx"), &fast[3], &e(3), |i| {
            let (r, c) = (i / cols, i % cols);
            let g = |j: usize| (dy[r * cols + j] * w[j]).abs() as f64;
            let sg: f64 = (0..cols).map(g).sum();
            let sgx: f64 = (0..cols).map(|j| g(j) * xhat(r * cols + j).abs()).sum();
            let mx = (0..cols).map(|j| dxhat(r * cols + j)).fold(0.0, f64::max);
            rstd[r] * (k * (g(c) + (sg + xhat(i).abs() * sgx + sg * mx) / nf + sgx / nf))
                + rstd[r] * dxhat(i) * sgx / nf
                + 1e-30
        });
        // dw, db: sums over the rows of dy·x̂ and dy: (rows + 4)·u of the absolute terms,
        // plus Δx̂ per term.
        let kr = (rows_n as f64 + 4.0) * U;
        check(&format!("{what} dw"), &fast[4], &e(4), |c| {
            (0..rows_n)
                .map(|r| {
                    let i = r * cols + c;
                    (dy[i] as f64).abs() * (kr * xhat(i).abs() + dxhat(i))
                })
                .sum::<f64>()
                + 1e-30
        });
        check(&format!("{what} db"), &fast[5], &e(5), |c| {
            kr * (0..rows_n)
                .map(|r| (dy[r * cols + c] as f64).abs())
                .sum::<f64>()
                + 1e-30
        });
    }
}

/// The LayerNorm kernels give the same bits at every level (the backend uses the best).
#[test]
fn layernorm_levels_agree_bit_for_bit() {
    let mut rng = StdRng::seed_from_u64(seed("layernorm_levels_agree_bit_for_bit"));
    let (r, c) = (9, 40);
    let x = normal(&mut rng, r * c, 0.5, 2.0);
    let w = normal(&mut rng, c, 1.0, 0.3);
    let dy = normal(&mut rng, r * c, 0.0, 1.0);
    at_every_level("layernorm", |isa| {
        let (mut y, mut m, mut s) = (vec![0.0; r * c], vec![0.0; r], vec![0.0; r]);
        rows::layernorm_fwd(isa, (&x, &w, &w), &mut y, (&mut m, &mut s), c, 1e-5);
        let mut dx = vec![0.0; r * c];
        rows::layernorm_dx(isa, &x, &w, (&m, &s), &dy, &mut dx, c);
        let (mut dw, mut db) = (vec![0.0; 24], vec![0.0; 24]);
        rows::layernorm_dwdb(isa, &x, (&m, &s), &dy, (&mut dw, &mut db), c, 16);
        [y, m, s, dx, dw, db].concat()
    });
}

/// AdamW and the clip norm, fast against exact through the backend, with hostile gradients.
#[test]
fn adamw_and_clip_match_the_exact_reference() {
    let mut rng = StdRng::seed_from_u64(seed("adamw_and_clip_match_the_exact_reference"));
    let cpu = CpuBackend;
    let n = 20_000;
    let p0 = normal(&mut rng, n, 0.0, 0.1);
    let m0 = normal(&mut rng, n, 0.0, 1e-3);
    let v0: Vec<f32> = normal(&mut rng, n, 0.0, 1e-3)
        .iter()
        .map(|x| x * x)
        .collect();
    let mut g = normal(&mut rng, n, 0.0, 1.0);
    g[7] = f32::NAN;
    g[8] = f32::INFINITY;
    let cfg = AdamWConfig {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.99,
        eps: 1e-8,
        step: 3,
    };
    let run = |mode| {
        with_mode(mode, || {
            let up = |v: &[f32]| cpu.upload(v).unwrap();
            let (mut p, mut m, mut v, gs) = (up(&p0), up(&m0), up(&v0), up(&g));
            let mut clip = cpu.allocate(crate::DType::F32, 2).unwrap();
            let finite = up(&g[10..]);
            cpu.clip_coefficient(&[&finite, &finite], 1.0, &mut clip)
                .unwrap();
            adamw_one((&mut p, &gs, &mut m, &mut v), 0.1, Some(&clip), |bufs| {
                cpu.adamw_step(bufs, cfg)
            })
            .unwrap();
            let o = |s: &CpuStorage| s.as_f32().unwrap().to_vec();
            [o(&p), o(&m), o(&v), o(&clip)]
        })
    };
    let (fast, exact) = (run(CpuMode::Fast), run(CpuMode::Exact));
    // The norm: f64 sums of 2·(n − 10) squares in another order, then one rounding to f32.
    let e = |k: usize| -> Vec<f64> { exact[k].iter().map(|&v| v as f64).collect() };
    check("clip", &fast[3], &e(3), |i| {
        2.0 * U * exact[3][i].abs() as f64
    });
    let coef = exact[3][1] as f64;
    // Per element, each value off by a few roundings of its terms (f32 throughout, about 12
    // operations): 12u of the sum of the terms' magnitudes.
    check("m", &fast[1], &e(1), |i| {
        12.0 * U * (0.9 * m0[i].abs() as f64 + 0.1 * (g[i] as f64 * coef).abs())
    });
    check("v", &fast[2], &e(2), |i| {
        12.0 * U * (0.99 * v0[i] as f64 + 0.01 * (g[i] as f64 * coef).powi(2))
    });
    // p = p0·decay − U, U = step·m/den, den = √v·c + eps: m's error is 12u of its terms'
    // magnitude M (not of m, which may cancel: the bound once used |m| and failed on a seed
    // where it did), den's at most 9u of itself (√ halves v's 12u; the scaling and eps add two
    // roundings), the division and the product two more: |δU| <= 12u·step·M/den + 11u·|U| <=
    // 23u·step·M/den. With 2u for p0·decay and u for the subtraction: 24u·(|p0| + step·M/den).
    check("p", &fast[0], &e(0), |i| {
        let terms = 0.9 * m0[i].abs() as f64 + 0.1 * (g[i] as f64 * coef).abs();
        let upd = 1e-3 / (1.0 - 0.9f64.powi(3)) * terms
            / ((exact[2][i] as f64).sqrt() / (1.0 - 0.99f64.powi(3)).sqrt() + 1e-8);
        24.0 * U * (p0[i].abs() as f64 + upd)
    });
    at_every_level("adamw", |isa| {
        let (mut p, mut m, mut v) = (p0.clone(), m0.clone(), v0.clone());
        let s = optim::AdamWScalars {
            coef: 0.5,
            beta1: 0.9,
            beta2: 0.99,
            eps: 1e-8,
            decay: 0.9999,
            step_size: 1e-3,
            bc2_sqrt: 0.2,
        };
        optim::adamw(isa, &mut p, &mut m, &mut v, &g, s);
        let mut sq = 0.0;
        optim::sum_squares(isa, &g[10..], &mut sq);
        [p, m, v, vec![sq as f32]].concat()
    });
}
