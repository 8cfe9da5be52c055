//! Fast causal attention against the exact reference, through the backend in both modes.

use super::{at_every_level, check, normal, seed, U};
use crate::cpu::fast::{attention, with_mode, CpuMode, Isa};
use crate::cpu::{CpuBackend, CpuStorage};
use crate::nn::attention::{AttnDims, AttnQkv};
use crate::testing::{attention_outputs, AttnProblem};
use crate::Backend;
use rand::{rngs::StdRng, SeedableRng};

/// `[out, lse, dq, dk, dv]` of the backend in `mode` (the backward from that mode's forward).
fn run(c: &AttnProblem, mode: CpuMode) -> [Vec<f32>; 5] {
    let cpu = CpuBackend;
    with_mode(mode, || {
        let up = |v: &[f32]| cpu.upload(v).unwrap();
        let z = |len| cpu.allocate(crate::DType::F32, len).unwrap();
        let (q, k, v, dout) = (up(&c.q), up(&c.k), up(&c.v), up(&c.dout));
        let x = AttnQkv {
            q: &q,
            k: &k,
            v: &v,
        };
        let outs = attention_outputs(&cpu, x, &dout, c.dims, z).unwrap();
        outs.map(|s: CpuStorage| s.as_f32().unwrap().to_vec())
    })
}

/// The magnitudes the bounds are built from, in f64 from the inputs: per row `i` the largest
/// `|scale|·Σ_c |q_ic k_jc|` (the score's absolute terms), and the probabilities `P_ij`.
fn magnitudes(c: &AttnProblem, b: usize, lse: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let (t, d) = (c.dims.t, c.dims.d);
    let at = |x: &[f32], i: usize, j: usize| x[(b * t + i) * d + j] as f64;
    let mut smax = vec![0.0f64; t];
    let mut p = vec![0.0f64; t * t];
    for i in 0..t {
        for j in 0..=i {
            let (mut s, mut sa) = (0.0, 0.0);
            for e in 0..d {
                s += at(&c.q, i, e) * at(&c.k, j, e);
                sa += (at(&c.q, i, e) * at(&c.k, j, e)).abs();
            }
            smax[i] = f64::max(smax[i], c.dims.scale.abs() as f64 * sa);
            p[i * t + j] = (c.dims.scale as f64 * s - lse[b * t + i] as f64).exp();
        }
    }
    (smax, p)
}

fn case(rng: &mut StdRng, n: usize, t: usize, d: usize) -> AttnProblem {
    AttnProblem::draw((n, t, d), 1.5, |len, std| normal(rng, len, 0.0, std as f64))
}

/// Bounds (f64 magnitudes from the exact results): a score is a sum of `d` products, off by
/// `ε_s = (d + 2)·u·smax_i`; a probability `exp(s − lse)` is then off by a relative
/// `ε_p = 2ε_s + (t + 8)·u` (the score, the row's max and log-sum, exp's 4 ulp, the sum of `t`
/// terms). Each output is a sum over `j` of terms `w_j·x_j` off by `(ε_p + (t + d)·u)` of
/// `Σ|w_j x_j|`.
#[test]
fn attention_matches_the_exact_reference() {
    let mut rng = StdRng::seed_from_u64(seed("attention_matches_the_exact_reference"));
    for (n, t, d) in [(0, 4, 4), (3, 1, 4), (2, 17, 8), (2, 64, 32), (1, 33, 12)] {
        let c = case(&mut rng, n, t, d);
        let (fast, exact) = (run(&c, CpuMode::Fast), run(&c, CpuMode::Exact));
        let e = |k: usize| -> Vec<f64> { exact[k].iter().map(|&v| v as f64).collect() };
        let what = format!("attention n={n} t={t} d={d}");
        let sc = c.dims.scale.abs() as f64;
        let mut bounds: [Vec<f64>; 5] = Default::default();
        for b in 0..n {
            let (smax, p) = magnitudes(&c, b, &exact[1]);
            let at = |x: &[f32], i: usize, e: usize| x[(b * t + i) * d + e] as f64;
            let eps_p = |i: usize| 2.0 * (d as f64 + 2.0) * U * smax[i] + (t as f64 + 8.0) * U;
            let k_out = |i: usize| eps_p(i) + (t + d) as f64 * U;
            // dS_ij = P_ij (dout_i·v_j − D_i): its absolute size, and its error through P.
            let dov = |i: usize, j: usize| {
                (0..d)
                    .map(|e| (at(&c.dout, i, e) * at(&c.v, j, e)).abs())
                    .sum::<f64>()
            };
            let delta = |i: usize| {
                (0..d)
                    .map(|e| (at(&c.dout, i, e) * exact[0][(b * t + i) * d + e] as f64).abs())
                    .sum::<f64>()
            };
            let ds_abs = |i: usize, j: usize| p[i * t + j] * (dov(i, j) + delta(i));
            for i in 0..t {
                bounds[1].push(eps_p(i) * 4.0 + 4.0 * U * (exact[1][b * t + i] as f64).abs());
                for e in 0..d {
                    let s_out: f64 = (0..=i).map(|j| p[i * t + j] * at(&c.v, j, e).abs()).sum();
                    bounds[0].push(k_out(i) * s_out + 1e-30);
                    let s_dq: f64 = (0..=i).map(|j| ds_abs(i, j) * at(&c.k, j, e).abs()).sum();
                    bounds[2].push(2.0 * sc * k_out(i) * s_dq + 1e-30);
                }
            }
            for j in 0..t {
                for e in 0..d {
                    let s_dk: f64 = (j..t)
                        .map(|i| k_out(i) * ds_abs(i, j) * at(&c.q, i, e).abs())
                        .sum();
                    bounds[3].push(2.0 * sc * s_dk + 1e-30);
                    let s_dv: f64 = (j..t)
                        .map(|i| k_out(i) * p[i * t + j] * at(&c.dout, i, e).abs())
                        .sum();
                    bounds[4].push(s_dv + 1e-30);
                }
            }
        }
        for (k, name) in ["out", "lse", "dq", "dk", "dv"].iter().enumerate() {
            check(&format!("{what} {name}"), &fast[k], &e(k), |i| bounds[k][i]);
        }
    }
}

/// A NaN in one query poisons that row's outputs (and, through the backward, every key and
/// value it attends to), exactly where the reference has NaN; an infinite value gives NaN rows
/// as in the reference.
#[test]
fn attention_propagates_nan_and_inf_as_the_reference() {
    let mut rng = StdRng::seed_from_u64(seed("attention_propagates_nan_and_inf_as_the_reference"));
    let mut c = case(&mut rng, 2, 9, 8);
    c.q[3 * 8 + 2] = f32::NAN;
    c.v[9 * 8 + 5 * 8 + 1] = f32::INFINITY;
    let (fast, exact) = (run(&c, CpuMode::Fast), run(&c, CpuMode::Exact));
    for k in 0..5 {
        let nan_f: Vec<bool> = fast[k].iter().map(|v| !v.is_finite()).collect();
        let nan_e: Vec<bool> = exact[k].iter().map(|v| !v.is_finite()).collect();
        assert_eq!(nan_f, nan_e, "output {k}: non-finite pattern");
        assert!(
            nan_e.iter().any(|&b| b),
            "output {k}: the test has non-finite values"
        );
    }
}

/// One sequence through the per-sequence kernels at `isa`: `[out, lse, dq, dk, dv]`.
fn run_seq(c: &AttnProblem, isa: Isa) -> [Vec<f32>; 5] {
    let (t, d) = (c.dims.t, c.dims.d);
    let (mut out, mut lse) = (vec![0.0; t * d], vec![0.0; t]);
    let len = attention::fwd_scratch(t, d).max(attention::bwd_scratch(t, d));
    let mut scratch = vec![0.0; len];
    let dims = (t, d, c.dims.scale);
    let (q, k, v) = (&c.q[..t * d], &c.k[..t * d], &c.v[..t * d]);
    attention::fwd_seq(
        isa,
        (q, k, v),
        (&mut out, &mut lse),
        dims,
        &mut scratch,
        None,
    );
    let (mut dq, mut dk, mut dv) = (vec![0.0; t * d], vec![0.0; t * d], vec![0.0; t * d]);
    let x = (q, k, v, &out[..], &lse[..], &c.dout[..t * d]);
    attention::bwd_seq(
        isa,
        x,
        (&mut dq, &mut dk, &mut dv),
        dims,
        &mut scratch,
        None,
    );
    [out, lse, dq, dk, dv]
}

/// The per-sequence kernels give the same bits at every level, the scalar fallback included
/// (shapes with whole and partial register blocks of rows and columns).
#[test]
fn attention_levels_agree_bit_for_bit() {
    let mut rng = StdRng::seed_from_u64(seed("attention_levels_agree_bit_for_bit"));
    for (t, d) in [(21, 12), (22, 36)] {
        let c = case(&mut rng, 1, t, d);
        at_every_level("attention", |isa: Isa| run_seq(&c, isa).concat());
    }
}

/// Each output is one chain of fused multiply-adds in index order, whatever block computes it:
/// the first `t − 1` rows of a causal attention (out, lse, dq) depend only on those rows, so a
/// sequence of `t` rows (the last four rows one register block) and the same sequence less its
/// last row (those rows single) give the same bits.
#[test]
fn attention_rows_do_not_depend_on_the_blocking() {
    let mut rng = StdRng::seed_from_u64(seed("attention_rows_do_not_depend_on_the_blocking"));
    for (t, d) in [(20, 32), (20, 20)] {
        let mut long = case(&mut rng, 1, t, d);
        long.dout[(t - 1) * d] = f32::NAN; // reaches no earlier row of out, lse or dq
        let short = AttnProblem {
            dims: AttnDims {
                t: t - 1,
                ..long.dims
            },
            q: long.q[..(t - 1) * d].to_vec(),
            k: long.k[..(t - 1) * d].to_vec(),
            v: long.v[..(t - 1) * d].to_vec(),
            dout: long.dout[..(t - 1) * d].to_vec(),
        };
        let (a, b) = (run_seq(&long, Isa::best()), run_seq(&short, Isa::best()));
        for (k, name) in [(0, "out"), (1, "lse"), (2, "dq")] {
            let rows = if k == 1 { t - 1 } else { (t - 1) * d };
            let bits = |v: &[f32]| v[..rows].iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a[k]), bits(&b[k]), "t={t} d={d} {name}");
        }
    }
}
