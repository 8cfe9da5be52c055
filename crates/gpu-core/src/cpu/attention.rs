//! [`AttentionOps`] on the CPU: the reference. Straightforward loops over each sequence, every
//! dot product and sum accumulated in f64; the f32 results are rounded once at the end.

use super::{fast, CpuBackend, CpuStorage};
use crate::backend::BufferInfo;
use crate::dtype::DType;
use crate::error::Result;
use crate::nn::attention::{
    check_bwd, check_fwd, resolve_drop, AttentionOps, AttnDims, AttnDropout, AttnQkv, PackedCall,
    PackedSaved,
};
use rayon::prelude::*;

impl AttentionOps for CpuBackend {
    fn causal_attention_fwd(
        &self,
        x: AttnQkv<'_, CpuStorage>,
        (out, lse): (&mut CpuStorage, &mut CpuStorage),
        dims: AttnDims,
    ) -> Result<()> {
        let _p = super::profile::scope("causal_attention_fwd");
        check_fwd(x, out, lse, dims)?;
        let (AttnQkv { q, k, v }, AttnDims { n, t, d, scale }) = (x, dims);
        let (q, k, v) = (q.as_f32()?, k.as_f32()?, v.as_f32()?);
        let (out, lse) = (out.as_f32_mut()?, lse.as_f32_mut()?);
        if n == 0 || t == 0 || d == 0 {
            return Ok(());
        }
        let seq = t * d;
        let outs = out
            .par_chunks_exact_mut(seq)
            .zip(lse.par_chunks_exact_mut(t));
        if fast::fast() {
            let isa = fast::Isa::best();
            let scratch = || vec![0.0f32; fast::attention::fwd_scratch(t, d)];
            outs.enumerate()
                .for_each_init(scratch, |scratch, (b, (out, lse))| {
                    let span = b * seq..(b + 1) * seq;
                    let (q, k, v) = (&q[span.clone()], &k[span.clone()], &v[span]);
                    fast::attention::fwd_seq(
                        isa,
                        (q, k, v),
                        (out, lse),
                        (t, d, scale),
                        scratch,
                        None,
                    );
                });
            return Ok(());
        }
        outs.enumerate().for_each(|(b, (out, lse))| {
            let span = b * seq..(b + 1) * seq;
            let (o, l) = fwd_seq_f64(
                &widen(&q[span.clone()]),
                &widen(&k[span.clone()]),
                &widen(&v[span]),
                (t, d, scale as f64),
                None,
            );
            narrow(&o, out);
            narrow(&l, lse);
        });
        Ok(())
    }

    /// Flash-style backward from the given `out` and `lse` (not recomputed): with
    /// `P_ij = exp(scale·q_i·k_j − lse_i)` for `j <= i` and `D_i = Σ dout_i ∘ out_i`,
    /// `dv_j = Σ_i P_ij dout_i`, `dS_ij = P_ij (dout_i·v_j − D_i)`, `dq_i = scale Σ_j dS_ij k_j`,
    /// `dk_j = scale Σ_i dS_ij q_i`.
    fn causal_attention_bwd(
        &self,
        x: AttnQkv<'_, CpuStorage>,
        saved: PackedSaved<'_, CpuStorage>,
        (dq, dk, dv): (&mut CpuStorage, &mut CpuStorage, &mut CpuStorage),
        dims: AttnDims,
    ) -> Result<()> {
        let _p = super::profile::scope("causal_attention_bwd");
        check_bwd(x, saved, [&*dq, &*dk, &*dv], dims)?;
        let (AttnQkv { q, k, v }, AttnDims { n, t, d, scale }) = (x, dims);
        let PackedSaved { out, lse, dout } = saved;
        let (q, k, v) = (q.as_f32()?, k.as_f32()?, v.as_f32()?);
        let (out, lse, dout) = (out.as_f32()?, lse.as_f32()?, dout.as_f32()?);
        let (dq, dk, dv) = (dq.as_f32_mut()?, dk.as_f32_mut()?, dv.as_f32_mut()?);
        if n == 0 || t == 0 || d == 0 {
            return Ok(());
        }
        let seq = t * d;
        let grads = dq
            .par_chunks_exact_mut(seq)
            .zip(dk.par_chunks_exact_mut(seq));
        let grads = grads.zip(dv.par_chunks_exact_mut(seq));
        if fast::fast() {
            let isa = fast::Isa::best();
            let scratch = || vec![0.0f32; fast::attention::bwd_scratch(t, d)];
            grads
                .enumerate()
                .for_each_init(scratch, |scratch, (b, ((dq, dk), dv))| {
                    let s = b * seq..(b + 1) * seq;
                    let x = (
                        &q[s.clone()],
                        &k[s.clone()],
                        &v[s.clone()],
                        &out[s.clone()],
                        &lse[b * t..(b + 1) * t],
                        &dout[s],
                    );
                    fast::attention::bwd_seq(isa, x, (dq, dk, dv), (t, d, scale), scratch, None);
                });
            return Ok(());
        }
        grads.enumerate().for_each(|(b, ((dq, dk), dv))| {
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
                (t, d, scale as f64),
                None,
            );
            narrow(&grads.0, dq);
            narrow(&grads.1, dk);
            narrow(&grads.2, dv);
        });
        Ok(())
    }

    /// The packed kernels' reference: f32 (`attention_packed.rs`) or bf16 (`attention_bf16.rs`)
    /// by `qkv`'s dtype; a device seed offset is read from its buffer.
    fn attention_packed_fwd(
        &self,
        qkv: &CpuStorage,
        (out, lse): (&mut CpuStorage, &mut CpuStorage),
        call: PackedCall<'_, CpuStorage>,
    ) -> Result<()> {
        let drop = resolve_drop(self, "causal_attention_packed_fwd", call.drop)?;
        let (p, scale) = (call.dims, call.scale);
        if qkv.dtype() == DType::BF16 {
            return self.causal_attention_packed_bf16_fwd(qkv, out, lse, p, scale, drop);
        }
        self.causal_attention_packed_fwd(qkv, out, lse, p, scale, drop)
    }

    fn attention_packed_bwd(
        &self,
        qkv: &CpuStorage,
        s: PackedSaved<'_, CpuStorage>,
        dqkv: &mut CpuStorage,
        call: PackedCall<'_, CpuStorage>,
    ) -> Result<()> {
        let drop = resolve_drop(self, "causal_attention_packed_bwd", call.drop)?;
        let (p, scale) = (call.dims, call.scale);
        if qkv.dtype() == DType::BF16 {
            return self.causal_attention_packed_bf16_bwd(qkv, s, dqkv, p, scale, drop);
        }
        self.causal_attention_packed_bwd(qkv, s, dqkv, p, scale, drop)
    }
}

/// `x` widened to f64.
pub(super) fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

/// `x` rounded to f32 into `out`.
pub(super) fn narrow(x: &[f64], out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v as f32;
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `out[j] = dot(a, rows[j])` for the rows of `rows` (`a.len()` wide), bit for bit: four rows at
/// a time, each with its own accumulator summed in the same order as [`dot`] (from −0, as
/// `Iterator::sum` starts), which only lets the CPU overlap the four dependency chains.
fn dots(a: &[f64], rows: &[f64], out: &mut [f64]) {
    let d = a.len();
    for (j, o) in out.chunks_exact_mut(4).enumerate() {
        let r = &rows[4 * j * d..][..4 * d];
        let (r0, r1, r2, r3) = (&r[..d], &r[d..2 * d], &r[2 * d..3 * d], &r[3 * d..]);
        let mut acc = [-0.0f64; 4];
        for c in 0..d {
            acc[0] += a[c] * r0[c];
            acc[1] += a[c] * r1[c];
            acc[2] += a[c] * r2[c];
            acc[3] += a[c] * r3[c];
        }
        o.copy_from_slice(&acc);
    }
    let done = out.len() / 4 * 4;
    for (j, o) in out.iter_mut().enumerate().skip(done) {
        *o = dot(a, &rows[j * d..][..d]);
    }
}

/// The attention dropout of one sequence: `drop`'s mask of sequence `s`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SeqDrop {
    pub drop: AttnDropout,
    pub s: usize,
}

impl SeqDrop {
    /// The factor of entry `(i, j)` of a sequence of length `t` (`1/(1 − p)` in f32, or 0).
    pub fn factor(self, i: usize, j: usize, t: usize) -> f64 {
        self.factor_f32(i, j, t) as f64
    }

    /// [`SeqDrop::factor`] in f32.
    pub fn factor_f32(self, i: usize, j: usize, t: usize) -> f32 {
        self.drop.factor(self.s, i, j, t)
    }
}

/// Causal attention of one sequence in f64: returns `(out [t, d], lse [t])`; with `drop`, each
/// probability times its mask factor before `P·V` (`lse` stays the undropped softmax's).
pub(crate) fn fwd_seq_f64(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    (t, d, scale): (usize, usize, f64),
    drop: Option<SeqDrop>,
) -> (Vec<f64>, Vec<f64>) {
    let (mut out, mut lse) = (vec![0.0; t * d], vec![0.0; t]);
    let row = |i: usize| i * d..(i + 1) * d;
    let mut s = vec![0.0f64; t];
    for i in 0..t {
        dots(&q[row(i)], &k[..(i + 1) * d], &mut s[..=i]);
        for sj in &mut s[..=i] {
            *sj *= scale;
        }
        let m = s[..=i].iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
        let sum: f64 = s[..=i].iter().map(|&x| (x - m).exp()).sum();
        lse[i] = m + sum.ln();
        let o = &mut out[i * d..(i + 1) * d];
        for j in 0..=i {
            let mut p = (s[j] - lse[i]).exp();
            if let Some(dr) = drop {
                p *= dr.factor(i, j, t);
            }
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
/// returns `(dq, dk, dv)`, each `[t, d]`. With `drop` (factor `f_ij` of [`SeqDrop`]):
/// `dv_j = Σ_i P_ij f_ij dout_i` and `dS_ij = P_ij (f_ij dout_i·v_j − D_i)`. `D_i` is still
/// `dout_i·out_i` of the dropped output: `Σ_j P_ij f_ij (dout_i·v_j) = dout_i·Σ_j P_ij f_ij v_j
/// = dout_i·out_i`, which is the `Σ_j P_ij dP_ij` of the softmax's backward with
/// `dP_ij = f_ij dout_i·v_j`.
pub(crate) fn bwd_seq_f64(
    x: &SeqF64<'_>,
    (t, d, scale): (usize, usize, f64),
    drop: Option<SeqDrop>,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let row = |i: usize| i * d..(i + 1) * d;
    let (mut dq, mut dk, mut dv) = (vec![0.0; t * d], vec![0.0; t * d], vec![0.0; t * d]);
    let (mut qk, mut dov) = (vec![0.0f64; t], vec![0.0f64; t]);
    for i in 0..t {
        let (qi, doi) = (&x.q[row(i)], &x.dout[row(i)]);
        let delta = dot(doi, &x.out[row(i)]);
        dots(qi, &x.k[..(i + 1) * d], &mut qk[..=i]);
        dots(doi, &x.v[..(i + 1) * d], &mut dov[..=i]);
        for j in 0..=i {
            let p = (scale * qk[j] - x.lse[i]).exp();
            // pd: the dropped probability (the factor of dout in dv); dov[j]·f: dP.
            let (ds, pd) = match drop {
                None => (p * (dov[j] - delta), p),
                Some(dr) => {
                    let f = dr.factor(i, j, t);
                    (p * (dov[j] * f - delta), p * f)
                }
            };
            // `scale * ds * k` is `(scale * ds) * k`: hoisting the product changes no bit.
            let sds = scale * ds;
            let kj = &x.k[row(j)];
            for (c, dqc) in dq[row(i)].iter_mut().enumerate() {
                *dqc += sds * kj[c];
            }
            let (dvj, dkj) = (&mut dv[row(j)], &mut dk[row(j)]);
            for c in 0..d {
                dvj[c] += pd * doi[c];
                dkj[c] += sds * qi[c];
            }
        }
    }
    (dq, dk, dv)
}

/// Draws `q`, `k`, `v` and `w` (`[t, d]`, uniform in [-1, 1)) and checks the f64 backward with
/// the mask `drop` against central differences of the f64 forward with the same mask, for every
/// input element (`L = Σ out ∘ w`, so `dout = w`): within `1e-7 + 1e-6·|fd|`.
#[cfg(test)]
pub(crate) fn assert_bwd_f64_matches_finite_differences(
    rng: &mut rand::rngs::StdRng,
    dims: (usize, usize, f64),
    drop: Option<SeqDrop>,
) {
    use rand::Rng;
    let (t, d, _) = dims;
    let mut r =
        |len: usize| -> Vec<f64> { (0..len).map(|_| rng.random_range(-1.0..1.0)).collect() };
    let (q, k, v, w) = (r(t * d), r(t * d), r(t * d), r(t * d));
    let (out, lse) = fwd_seq_f64(&q, &k, &v, dims, drop);
    let seq = SeqF64 {
        q: &q,
        k: &k,
        v: &v,
        out: &out,
        lse: &lse,
        dout: &w,
    };
    let (dq, dk, dv) = bwd_seq_f64(&seq, dims, drop);
    let h = 1e-6;
    for (which, grad) in [(0, &dq), (1, &dk), (2, &dv)] {
        for e in 0..t * d {
            let eval = |delta: f64| {
                let mut xs = [q.clone(), k.clone(), v.clone()];
                xs[which][e] += delta;
                dot(&fwd_seq_f64(&xs[0], &xs[1], &xs[2], dims, drop).0, &w)
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

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, SeedableRng};

    /// The f64 backward against central differences of the f64 forward, for every input element
    /// (`L = Σ out ∘ w`, so `dout = w`); h = 1e-6 leaves truncation and rounding near 1e-9.
    #[test]
    fn backward_matches_finite_differences_in_f64() {
        let mut rng = StdRng::seed_from_u64(7);
        for (t, d) in [(1, 4), (5, 4), (9, 8)] {
            assert_bwd_f64_matches_finite_differences(&mut rng, (t, d, 0.7), None);
        }
    }

    #[test]
    fn single_key_copies_v_and_lse_is_the_score() {
        let (q, k, v) = (
            [1.0, 2.0, 0.0, 1.0],
            [0.5, 0.5, 1.0, -1.0],
            [3.0, 4.0, 5.0, 6.0],
        );
        let (out, lse) = fwd_seq_f64(&q, &k, &v, (1, 4, 2.0), None);
        assert_eq!(out, vec![3.0, 4.0, 5.0, 6.0]);
        assert!((lse[0] - 2.0 * (0.5 + 1.0 + 0.0 - 1.0)).abs() < 1e-15);
    }
}
