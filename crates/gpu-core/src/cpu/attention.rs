//! [`AttentionOps`] on the CPU: the reference. Straightforward loops over each sequence, every
//! dot product and sum accumulated in f64; the f32 results are rounded once at the end.

use super::{CpuBackend, CpuStorage};
use crate::error::Result;
use crate::nn::attention::{check_bwd, check_fwd, AttentionOps};

impl AttentionOps for CpuBackend {
    fn causal_attention_fwd(
        &self,
        q: &CpuStorage,
        k: &CpuStorage,
        v: &CpuStorage,
        out: &mut CpuStorage,
        lse: &mut CpuStorage,
        n: usize,
        t: usize,
        d: usize,
        scale: f32,
    ) -> Result<()> {
        check_fwd(q, k, v, out, lse, n, t, d, scale)?;
        let (q, k, v) = (q.as_f32()?, k.as_f32()?, v.as_f32()?);
        let (out, lse) = (out.as_f32_mut()?, lse.as_f32_mut()?);
        let seq = t * d;
        for b in 0..n {
            let span = b * seq..(b + 1) * seq;
            let (o, l) = fwd_seq_f64(
                &widen(&q[span.clone()]),
                &widen(&k[span.clone()]),
                &widen(&v[span.clone()]),
                t,
                d,
                scale as f64,
            );
            narrow(&o, &mut out[span]);
            narrow(&l, &mut lse[b * t..(b + 1) * t]);
        }
        Ok(())
    }

    /// Flash-style backward from the given `out` and `lse` (not recomputed): with
    /// `P_ij = exp(scale·q_i·k_j − lse_i)` for `j <= i` and `D_i = Σ dout_i ∘ out_i`,
    /// `dv_j = Σ_i P_ij dout_i`, `dS_ij = P_ij (dout_i·v_j − D_i)`, `dq_i = scale Σ_j dS_ij k_j`,
    /// `dk_j = scale Σ_i dS_ij q_i`.
    fn causal_attention_bwd(
        &self,
        q: &CpuStorage,
        k: &CpuStorage,
        v: &CpuStorage,
        out: &CpuStorage,
        lse: &CpuStorage,
        dout: &CpuStorage,
        dq: &mut CpuStorage,
        dk: &mut CpuStorage,
        dv: &mut CpuStorage,
        n: usize,
        t: usize,
        d: usize,
        scale: f32,
    ) -> Result<()> {
        check_bwd(q, k, v, out, lse, dout, dq, dk, dv, n, t, d, scale)?;
        let (q, k, v) = (q.as_f32()?, k.as_f32()?, v.as_f32()?);
        let (out, lse, dout) = (out.as_f32()?, lse.as_f32()?, dout.as_f32()?);
        let (dq, dk, dv) = (dq.as_f32_mut()?, dk.as_f32_mut()?, dv.as_f32_mut()?);
        let seq = t * d;
        for b in 0..n {
            let span = b * seq..(b + 1) * seq;
            let w = |x: &[f32]| widen(&x[span.clone()]);
            let grads = bwd_seq_f64(
                &SeqF64 {
                    q: &w(q),
                    k: &w(k),
                    v: &w(v),
                    out: &w(out),
                    lse: &widen(&lse[b * t..(b + 1) * t]),
                    dout: &w(dout),
                },
                t,
                d,
                scale as f64,
            );
            narrow(&grads.0, &mut dq[span.clone()]);
            narrow(&grads.1, &mut dk[span.clone()]);
            narrow(&grads.2, &mut dv[span]);
        }
        Ok(())
    }
}

fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

fn narrow(x: &[f64], out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v as f32;
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Causal attention of one sequence in f64: returns `(out [t, d], lse [t])`.
pub(crate) fn fwd_seq_f64(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    t: usize,
    d: usize,
    scale: f64,
) -> (Vec<f64>, Vec<f64>) {
    let (mut out, mut lse) = (vec![0.0; t * d], vec![0.0; t]);
    let row = |i: usize| i * d..(i + 1) * d;
    let mut s = vec![0.0f64; t];
    for i in 0..t {
        for j in 0..=i {
            s[j] = scale * dot(&q[row(i)], &k[row(j)]);
        }
        let m = s[..=i].iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
        let sum: f64 = s[..=i].iter().map(|&x| (x - m).exp()).sum();
        lse[i] = m + sum.ln();
        let o = &mut out[i * d..(i + 1) * d];
        for j in 0..=i {
            let p = (s[j] - lse[i]).exp();
            for (oc, &vc) in o.iter_mut().zip(&v[row(j)]) {
                *oc += p * vc;
            }
        }
    }
    (out, lse)
}

/// One sequence's backward inputs, in f64.
pub(crate) struct SeqF64<'a> {
    pub q: &'a [f64],
    pub k: &'a [f64],
    pub v: &'a [f64],
    pub out: &'a [f64],
    pub lse: &'a [f64],
    pub dout: &'a [f64],
}

/// Backward of one sequence in f64 (see [`AttentionOps::causal_attention_bwd`] on the CPU):
/// returns `(dq, dk, dv)`, each `[t, d]`.
pub(crate) fn bwd_seq_f64(
    x: &SeqF64<'_>,
    t: usize,
    d: usize,
    scale: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let row = |i: usize| i * d..(i + 1) * d;
    let (mut dq, mut dk, mut dv) = (vec![0.0; t * d], vec![0.0; t * d], vec![0.0; t * d]);
    for i in 0..t {
        let delta = dot(&x.dout[row(i)], &x.out[row(i)]);
        for j in 0..=i {
            let p = (scale * dot(&x.q[row(i)], &x.k[row(j)]) - x.lse[i]).exp();
            let ds = p * (dot(&x.dout[row(i)], &x.v[row(j)]) - delta);
            for c in 0..d {
                dv[j * d + c] += p * x.dout[i * d + c];
                dq[i * d + c] += scale * ds * x.k[j * d + c];
                dk[j * d + c] += scale * ds * x.q[i * d + c];
            }
        }
    }
    (dq, dk, dv)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    fn loss(o: &[f64], w: &[f64]) -> f64 {
        dot(o, w)
    }

    /// The f64 backward against central differences of the f64 forward, for every input element
    /// (`L = Σ out ∘ w`, so `dout = w`); h = 1e-6 leaves truncation and rounding near 1e-9.
    #[test]
    fn backward_matches_finite_differences_in_f64() {
        let mut rng = StdRng::seed_from_u64(7);
        for (t, d) in [(1, 4), (5, 4), (9, 8)] {
            let mut r = |len: usize| -> Vec<f64> {
                (0..len).map(|_| rng.random_range(-1.0..1.0)).collect()
            };
            let (q, k, v, w) = (r(t * d), r(t * d), r(t * d), r(t * d));
            let scale = 0.7;
            let (out, lse) = fwd_seq_f64(&q, &k, &v, t, d, scale);
            let seq = SeqF64 {
                q: &q,
                k: &k,
                v: &v,
                out: &out,
                lse: &lse,
                dout: &w,
            };
            let (dq, dk, dv) = bwd_seq_f64(&seq, t, d, scale);
            let h = 1e-6;
            for (which, grad) in [(0, &dq), (1, &dk), (2, &dv)] {
                for e in 0..t * d {
                    let eval = |delta: f64| {
                        let mut xs = [q.clone(), k.clone(), v.clone()];
                        xs[which][e] += delta;
                        loss(&fwd_seq_f64(&xs[0], &xs[1], &xs[2], t, d, scale).0, &w)
                    };
                    let fd = (eval(h) - eval(-h)) / (2.0 * h);
                    assert!(
                        (fd - grad[e]).abs() <= 1e-7 + 1e-6 * fd.abs(),
                        "t={t} d={d} input {which} elem {e}: fd {fd}, analytic {}",
                        grad[e]
                    );
                }
            }
        }
    }

    #[test]
    fn single_key_copies_v_and_lse_is_the_score() {
        let (q, k, v) = (
            [1.0, 2.0, 0.0, 1.0],
            [0.5, 0.5, 1.0, -1.0],
            [3.0, 4.0, 5.0, 6.0],
        );
        let (out, lse) = fwd_seq_f64(&q, &k, &v, 1, 4, 2.0);
        assert_eq!(out, vec![3.0, 4.0, 5.0, 6.0]);
        assert!((lse[0] - 2.0 * (0.5 + 1.0 + 0.0 - 1.0)).abs() < 1e-15);
    }
}
