//! Attention-probability dropout ([`AttnDropout`]): the mask's statistics, the packed CPU
//! attention (exact and fast modes, f32, and the bf16 reference) against a naive reference that
//! applies the regenerated mask explicitly, its gradients, and `p = 0` against no dropout.

use super::{check, normal, seed, U};
use crate::cpu::attention::{assert_bwd_f64_matches_finite_differences, SeqDrop};
use crate::cpu::attention_bf16::{
    causal_attention_packed_bf16_bwd, causal_attention_packed_bf16_fwd,
};
use crate::cpu::fast::{with_mode, CpuMode};
use crate::cpu::{CpuBackend, CpuStorage};
use crate::nn::attention::{AttnDropout, Packed, PackedSaved};
use crate::Backend;
use half::bf16;
use rand::{rngs::StdRng, Rng, SeedableRng};

/// `k` successes of `n` Bernoulli(`q`) trials lie within 6 standard deviations of `n·q`
/// (a false alarm about once in 10^9).
fn binomial_ok(k: usize, n: usize, q: f64) -> bool {
    let n = n as f64;
    (k as f64 - n * q).abs() <= 6.0 * (n * q * (1.0 - q)).sqrt() + 1.0
}

/// The keep fraction over the causal entries of several sequences is `1 − p` within the
/// binomial bound; neighbouring entries (along a row, along a column), the same entry under
/// two seeds, and the same entry of two sequences are independent (both kept with
/// probability `(1 − p)²`); indices are distinct entries of `[n, t, t]`.
#[test]
fn the_mask_keeps_one_minus_p_independently() {
    let seed = seed("the_mask_keeps_one_minus_p_independently");
    let (n, t) = (4, 96);
    for p in [0.05f32, 0.2, 0.5, 0.9] {
        let d = AttnDropout { p, seed };
        let d2 = AttnDropout { p, seed: seed ^ 1 };
        let q = 1.0 - p as f64;
        let (mut kept, mut all) = (0, 0);
        let mut pairs = [0usize; 4];
        let mut pair_n = [0usize; 4];
        for s in 0..n {
            for i in 0..t {
                for j in 0..=i {
                    let k = d.keep(s, i, j, t);
                    kept += k as usize;
                    all += 1;
                    let others = [
                        (j < i).then(|| d.keep(s, i, j + 1, t)),
                        (i + 1 < t).then(|| d.keep(s, i + 1, j, t)),
                        Some(d2.keep(s, i, j, t)),
                        (s + 1 < n).then(|| d.keep(s + 1, i, j, t)),
                    ];
                    for (w, o) in others.iter().enumerate() {
                        if let Some(o) = o {
                            pair_n[w] += 1;
                            pairs[w] += (k && *o) as usize;
                        }
                    }
                }
            }
        }
        assert!(binomial_ok(kept, all, q), "p={p}: kept {kept} of {all}");
        for (w, name) in ["row", "column", "seed", "sequence"].iter().enumerate() {
            assert!(
                binomial_ok(pairs[w], pair_n[w], q * q),
                "p={p} {name} neighbours: both kept {} of {}",
                pairs[w],
                pair_n[w]
            );
        }
    }
    let mut seen = std::collections::HashSet::new();
    for s in 0..3 {
        for i in 0..7 {
            for j in 0..7 {
                assert!(seen.insert(AttnDropout::index(s, i, j, 7)));
            }
        }
    }
    assert_eq!(AttnDropout::index(2, 3, 4, 7), ((2 * 7 + 3) * 7 + 4) as u64);
    assert!((0..64).all(|j| AttnDropout { p: 0.0, seed }.keep(1, 70, j, 80)));
}

/// A naive f64 reference of one sequence with an explicit mask: `P = softmax`, `P̃ = P∘F`,
/// `out = P̃·V`; backward `dv = P̃ᵀ·dO`, `dP = (dO·Vᵀ)∘F`, `dS = P∘(dP − rowsum(dP∘P))`,
/// `dq = scale·dS·K`, `dk = scale·dSᵀ·Q` (the row term summed directly, not as `dO·O`).
/// Returns `[out, dq, dk, dv]` and the same with every term's absolute value summed.
fn naive(
    x: [&[f64]; 4],
    (t, d, sc): (usize, usize, f64),
    f: &dyn Fn(usize, usize) -> f64,
) -> [Vec<f64>; 8] {
    let [q, k, v, dout] = x;
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    let row = |m: &'_ [f64], i: usize| -> Vec<f64> { m[i * d..(i + 1) * d].to_vec() };
    let mut p = vec![0.0; t * t];
    for i in 0..t {
        let s: Vec<f64> = (0..=i).map(|j| sc * dot(&row(q, i), &row(k, j))).collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
        for j in 0..=i {
            p[i * t + j] = (s[j] - m).exp() / z;
        }
    }
    let mut r: [Vec<f64>; 8] = std::array::from_fn(|_| vec![0.0; t * d]);
    for i in 0..t {
        let dp: Vec<f64> = (0..=i)
            .map(|j| dot(&row(dout, i), &row(v, j)) * f(i, j))
            .collect();
        let dpa: Vec<f64> = (0..=i)
            .map(|j| {
                (0..d)
                    .map(|e| (dout[i * d + e] * v[j * d + e]).abs())
                    .sum::<f64>()
                    * f(i, j)
            })
            .collect();
        let rs: f64 = (0..=i).map(|j| dp[j] * p[i * t + j]).sum();
        let rsa: f64 = (0..=i).map(|j| dpa[j] * p[i * t + j]).sum();
        for j in 0..=i {
            let (pij, pd) = (p[i * t + j], p[i * t + j] * f(i, j));
            let (ds, dsa) = (pij * (dp[j] - rs), pij * (dpa[j] + rsa));
            for e in 0..d {
                r[0][i * d + e] += pd * v[j * d + e];
                r[4][i * d + e] += (pd * v[j * d + e]).abs();
                r[1][i * d + e] += sc * ds * k[j * d + e];
                r[5][i * d + e] += (sc * dsa * k[j * d + e]).abs();
                r[2][j * d + e] += sc * ds * q[i * d + e];
                r[6][j * d + e] += (sc * dsa * q[i * d + e]).abs();
                r[3][j * d + e] += pd * dout[i * d + e];
                r[7][j * d + e] += (pd * dout[i * d + e]).abs();
            }
        }
    }
    r
}

struct Case {
    p: Packed,
    scale: f32,
    qkv: Vec<f32>,
    dout: Vec<f32>,
}

impl Case {
    fn new(rng: &mut StdRng, p: Packed) -> Case {
        Case {
            p,
            scale: 1.0 / (p.d as f32).sqrt(),
            qkv: normal(rng, p.b * p.t * 3 * p.c(), 0.0, 1.0),
            dout: normal(rng, p.b * p.t * p.c(), 0.0, 1.0),
        }
    }

    /// Head `h` of block `blk` of batch `bi` of a `[b, t, w·c]` buffer, in f64 `[t, d]`.
    fn head(&self, x: &[f32], w: usize, blk: usize, bi: usize, h: usize) -> Vec<f64> {
        let (t, d, c) = (self.p.t, self.p.d, self.p.c());
        (0..t)
            .flat_map(|i| {
                let at = (bi * t + i) * w * c + blk * c + h * d;
                x[at..at + d].iter().map(|&v| v as f64)
            })
            .collect()
    }

    /// `[out, dqkv, lse]` of the CPU backend's packed f32 attention in `mode`.
    fn run(&self, mode: CpuMode, drop: Option<AttnDropout>) -> [Vec<f32>; 3] {
        let cpu = CpuBackend;
        let p = self.p;
        with_mode(mode, || {
            let qkv = cpu.upload(&self.qkv).unwrap();
            let dout = cpu.upload(&self.dout).unwrap();
            let z = |len| cpu.allocate(crate::DType::F32, len).unwrap();
            let (mut out, mut lse) = (z(p.b * p.t * p.c()), z(p.n() * p.t));
            cpu.causal_attention_packed_fwd(&qkv, &mut out, &mut lse, p, self.scale, drop)
                .unwrap();
            let mut g = z(self.qkv.len());
            cpu.causal_attention_packed_bwd(
                &qkv,
                PackedSaved {
                    out: &out,
                    lse: &lse,
                    dout: &dout,
                },
                &mut g,
                p,
                self.scale,
                drop,
            )
            .unwrap();
            let o = |s: &CpuStorage| s.as_f32().unwrap().to_vec();
            [o(&out), o(&g), o(&lse)]
        })
    }

    /// The naive reference of every head, scattered back to `[out, dqkv]` layouts, with the
    /// matching magnitudes: `[out, dqkv, |out|, |dqkv|]`.
    fn reference(&self, drop: AttnDropout) -> [Vec<f64>; 4] {
        let p = self.p;
        let (t, d, c) = (p.t, p.d, p.c());
        let mut r = [
            vec![0.0; p.b * t * c],
            vec![0.0; self.qkv.len()],
            vec![0.0; p.b * t * c],
            vec![0.0; self.qkv.len()],
        ];
        for bi in 0..p.b {
            for h in 0..p.heads {
                let s = bi * p.heads + h;
                let [q, k, v] = [0, 1, 2].map(|blk| self.head(&self.qkv, 3, blk, bi, h));
                let g = self.head(&self.dout, 1, 0, bi, h);
                let f = |i: usize, j: usize| drop.factor(s, i, j, t) as f64;
                let n = naive([&q, &k, &v, &g], (t, d, self.scale as f64), &f);
                for i in 0..t {
                    for e in 0..d {
                        let o = (bi * t + i) * c + h * d + e;
                        r[0][o] = n[0][i * d + e];
                        r[2][o] = n[4][i * d + e];
                        for blk in 0..3 {
                            let at = (bi * t + i) * 3 * c + blk * c + h * d + e;
                            r[1][at] = n[1 + blk][i * d + e];
                            r[3][at] = n[5 + blk][i * d + e];
                        }
                    }
                }
            }
        }
        r
    }
}

/// The packed CPU attention with dropout against the naive reference, both modes. Bounds: the
/// exact mode is the f64 computation rounded once, so within `u·|x| + (2u + γ)·m` of the naive
/// value, `m` the sum of the absolute terms, `2u·m` for the backward's `D_i = dout_i·out_i`
/// taken from the f32 `out` (each `out` element within `u` of its f64 value; `m` bounds the
/// `P·|D|` terms), `u·|lse|max·m` for the backward's `P = exp(s − lse)` from the f32 `lse`
/// (a relative error of `|lse|·u` in every `P`), and `γ = 1e-12` for the f64 arithmetic (sums of at most `t + d` terms of
/// scores below 40 in magnitude: `(t + d + 8)·2^-53·40 < 1e-12`); the fast mode's terms carry
/// the relative error of the fast attention test's bound, `ε = 2(d + 2)·u·smax + 2(t + d + 8)·u`
/// with `smax = 8·scale·d` (|q|, |k| < 8 in these draws of N(0, 1): the bound checks it), times
/// 2 for the backward's two factors.
#[test]
fn packed_attention_with_dropout_matches_the_naive_reference() {
    let mut rng = StdRng::seed_from_u64(seed(
        "packed_attention_with_dropout_matches_the_naive_reference",
    ));
    for (b, t, heads, d, pd) in [
        (2, 9, 2, 8, 0.3f32),
        (1, 37, 3, 16, 0.1),
        (2, 20, 1, 64, 0.6),
    ] {
        let p = Packed { b, t, heads, d };
        let c = Case::new(&mut rng, p);
        assert!(c.qkv.iter().all(|x| x.abs() < 8.0));
        let drop = AttnDropout {
            p: pd,
            seed: rng.random(),
        };
        let r = c.reference(drop);
        let smax = 8.0 * 8.0 * c.scale as f64 * d as f64;
        let eps = 2.0 * (d as f64 + 2.0) * U * smax + 2.0 * (t + d + 8) as f64 * U;
        for (mode, k) in [(CpuMode::Exact, 0.0), (CpuMode::Fast, 1.0)] {
            let got = c.run(mode, Some(drop));
            let lmax = got[2].iter().fold(0.0f64, |a, &l| a.max(l.abs() as f64));
            let what = format!("{mode:?} b={b} t={t} heads={heads} d={d} p={pd} {drop:?}");
            for (o, name) in [(0, "out"), (1, "dqkv")] {
                let m = &r[2 + o];
                let bound = |i: usize| {
                    U * r[o][i].abs() + ((2.0 + lmax) * U + 1e-12) * m[i] + k * 2.0 * eps * m[i]
                };
                check(&format!("{what} {name}"), &got[o], &r[o], bound);
            }
        }
    }
}

/// `p = 0` gives the bits of no dropout (f32 in both modes, and the bf16 reference), and
/// `None` the bits of the plain call.
#[test]
fn zero_dropout_is_no_dropout_bit_for_bit() {
    let mut rng = StdRng::seed_from_u64(seed("zero_dropout_is_no_dropout_bit_for_bit"));
    let p = Packed {
        b: 2,
        t: 21,
        heads: 2,
        d: 64,
    };
    let c = Case::new(&mut rng, p);
    let zero = Some(AttnDropout { p: 0.0, seed: 5 });
    for mode in [CpuMode::Exact, CpuMode::Fast] {
        assert_eq!(c.run(mode, zero), c.run(mode, None), "{mode:?}");
    }
    let qkv: Vec<bf16> = c.qkv.iter().map(|&x| bf16::from_f32(x)).collect();
    let dout: Vec<bf16> = c.dout.iter().map(|&x| bf16::from_f32(x)).collect();
    let run = |drop| {
        let (o, l) = causal_attention_packed_bf16_fwd(&qkv, p, c.scale, drop).unwrap();
        let g = causal_attention_packed_bf16_bwd(&qkv, &o, &l, &dout, p, c.scale, drop).unwrap();
        (o, l, g)
    };
    assert_eq!(run(zero), run(None));
}

/// The f64 backward with a given mask against central differences of the f64 forward with the
/// same mask (`L = Σ out ∘ w`); h = 1e-6 leaves truncation and rounding near 1e-9.
#[test]
fn dropout_backward_matches_finite_differences_in_f64() {
    let mut rng = StdRng::seed_from_u64(seed("dropout_backward_matches_finite_differences_in_f64"));
    for (t, d, p) in [(6, 4, 0.4f32), (9, 8, 0.25)] {
        let sd = Some(SeqDrop {
            drop: AttnDropout { p, seed: 99 },
            s: 3,
        });
        assert_bwd_f64_matches_finite_differences(&mut rng, (t, d, 0.7), sd);
    }
}
