//! Packed causal attention on the CPU (`causal_attention_packed_*`): q, k and v read from a fused
//! `[b, t, 3c]` projection, the output written as `[b, t, c]` and the gradient in the
//! projection's layout. Each sequence is gathered into contiguous scratch and run through the
//! same per-sequence code as [`AttentionOps`](crate::nn::AttentionOps) (fast or exact mode), so
//! the results are those of the permuted tensors, bit for bit, without the permute passes.
//! Batches run in parallel (each owns its rows of every output).

use super::attention::{bwd_seq_f64, fwd_seq_f64, narrow, widen, SeqDrop, SeqF64};
use super::{fast, CpuBackend, CpuStorage};
use crate::error::Result;
use crate::nn::attention::{check_packed, AttnDropout, Packed, PackedSaved};
use rayon::prelude::*;

/// Copies head `h` of block `blk` (0 q, 1 k, 2 v) of batch rows `x` (`t` rows of `w·c`) into
/// `dst` `[t, d]`.
fn gather(x: &[f32], p: Packed, w: usize, blk: usize, h: usize, dst: &mut [f32]) {
    let (c, d) = (p.c(), p.d);
    for (i, row) in dst.chunks_exact_mut(d).enumerate() {
        let at = i * w * c + blk * c + h * d;
        row.copy_from_slice(&x[at..at + d]);
    }
}

/// The inverse of [`gather`]: `src` `[t, d]` into head `h` of block `blk` of `x`.
fn scatter(src: &[f32], p: Packed, w: usize, blk: usize, h: usize, x: &mut [f32]) {
    let (c, d) = (p.c(), p.d);
    for (i, row) in src.chunks_exact(d).enumerate() {
        let at = i * w * c + blk * c + h * d;
        x[at..at + d].copy_from_slice(row);
    }
}

impl CpuBackend {
    /// Packed causal attention forward: `qkv` `[b, t, 3c]` → `out` `[b, t, c]`, `lse`
    /// `[b·heads, t]`; the same bits as [`AttentionOps::causal_attention_fwd`] on the permuted
    /// `[b·heads, t, d]` tensors. `drop`: dropout of the attention probabilities
    /// ([`AttnDropout`]; sequence `b·heads + h` of the mask); `None` or `p = 0` is the plain
    /// attention, bit for bit.
    ///
    /// [`AttentionOps::causal_attention_fwd`]: crate::nn::AttentionOps::causal_attention_fwd
    pub fn causal_attention_packed_fwd(
        &self,
        qkv: &CpuStorage,
        out: &mut CpuStorage,
        lse: &mut CpuStorage,
        p: Packed,
        scale: f32,
        drop: Option<AttnDropout>,
    ) -> Result<()> {
        let _p = super::profile::scope("causal_attention_fwd");
        let drop = AttnDropout::active(drop, "causal_attention_packed_fwd")?;
        check_packed(
            "causal_attention_packed_fwd",
            qkv,
            &[&*out],
            lse,
            None,
            p,
            scale,
        )?;
        let (qkv, out, lse) = (qkv.as_f32()?, out.as_f32_mut()?, lse.as_f32_mut()?);
        let (t, d, c) = (p.t, p.d, p.c());
        if p.b == 0 || t == 0 {
            return Ok(());
        }
        let seq = t * d;
        let fast = fast::fast().then(fast::Isa::best);
        let per_batch = out
            .par_chunks_exact_mut(t * c)
            .zip(lse.par_chunks_exact_mut(p.heads * t))
            .enumerate();
        per_batch.for_each_init(
            || vec![0.0f32; 4 * seq + fast::attention::fwd_scratch(t, d)],
            |scr, (bi, (out, lse))| {
                let x = &qkv[bi * t * 3 * c..(bi + 1) * t * 3 * c];
                for h in 0..p.heads {
                    let (qkv_s, rest) = scr.split_at_mut(3 * seq);
                    let (o, tail) = rest.split_at_mut(seq);
                    for blk in 0..3 {
                        gather(x, p, 3, blk, h, &mut qkv_s[blk * seq..(blk + 1) * seq]);
                    }
                    let (q, kv) = qkv_s.split_at(seq);
                    let (k, v) = kv.split_at(seq);
                    let l = &mut lse[h * t..(h + 1) * t];
                    let sd = drop.map(|drop| SeqDrop {
                        drop,
                        s: bi * p.heads + h,
                    });
                    match fast {
                        Some(isa) => fast::attention::fwd_seq(
                            isa,
                            (q, k, v),
                            (o, l),
                            (t, d, scale),
                            tail,
                            sd,
                        ),
                        None => {
                            let dims = (t, d, scale as f64);
                            let (o64, l64) = fwd_seq_f64(&widen(q), &widen(k), &widen(v), dims, sd);
                            narrow(&o64, o);
                            narrow(&l64, l);
                        }
                    }
                    scatter(o, p, 1, 0, h, out);
                }
            },
        );
        Ok(())
    }

    /// The backward of [`CpuBackend::causal_attention_packed_fwd`]: `dqkv` (the layout of
    /// `qkv`) gets dq, dk and dv; the same bits as
    /// [`AttentionOps::causal_attention_bwd`] on the permuted tensors; `drop` as the
    /// forward's (the mask is regenerated from it).
    ///
    /// [`AttentionOps::causal_attention_bwd`]: crate::nn::AttentionOps::causal_attention_bwd
    pub fn causal_attention_packed_bwd(
        &self,
        qkv: &CpuStorage,
        saved: PackedSaved<'_, CpuStorage>,
        dqkv: &mut CpuStorage,
        p: Packed,
        scale: f32,
        drop: Option<AttnDropout>,
    ) -> Result<()> {
        let PackedSaved { out, lse, dout } = saved;
        let _p = super::profile::scope("causal_attention_bwd");
        let op = "causal_attention_packed_bwd";
        let drop = AttnDropout::active(drop, op)?;
        check_packed(op, qkv, &[out, dout], lse, Some(&*dqkv), p, scale)?;
        let (qkv, out, lse, dout) = (qkv.as_f32()?, out.as_f32()?, lse.as_f32()?, dout.as_f32()?);
        let dqkv = dqkv.as_f32_mut()?;
        let (t, d, c) = (p.t, p.d, p.c());
        if p.b == 0 || t == 0 {
            return Ok(());
        }
        let seq = t * d;
        let fast = fast::fast().then(fast::Isa::best);
        dqkv.par_chunks_exact_mut(t * 3 * c)
            .enumerate()
            .for_each_init(
                || vec![0.0f32; 8 * seq + fast::attention::bwd_scratch(t, d)],
                |scr, (bi, g)| {
                    let x = &qkv[bi * t * 3 * c..(bi + 1) * t * 3 * c];
                    let (o_rows, do_rows) =
                        (&out[bi * t * c..][..t * c], &dout[bi * t * c..][..t * c]);
                    for h in 0..p.heads {
                        let (ins, rest) = scr.split_at_mut(5 * seq);
                        let (grads, tail) = rest.split_at_mut(3 * seq);
                        for blk in 0..3 {
                            gather(x, p, 3, blk, h, &mut ins[blk * seq..(blk + 1) * seq]);
                        }
                        gather(o_rows, p, 1, 0, h, &mut ins[3 * seq..4 * seq]);
                        gather(do_rows, p, 1, 0, h, &mut ins[4 * seq..5 * seq]);
                        let s = |i: usize| &ins[i * seq..(i + 1) * seq];
                        let l = &lse[(bi * p.heads + h) * t..][..t];
                        let (dq, dkv) = grads.split_at_mut(seq);
                        let (dk, dv) = dkv.split_at_mut(seq);
                        let sd = drop.map(|drop| SeqDrop {
                            drop,
                            s: bi * p.heads + h,
                        });
                        match fast {
                            Some(isa) => {
                                let xin = (s(0), s(1), s(2), s(3), l, s(4));
                                fast::attention::bwd_seq(
                                    isa,
                                    xin,
                                    (dq, dk, dv),
                                    (t, d, scale),
                                    tail,
                                    sd,
                                )
                            }
                            None => {
                                let w: Vec<Vec<f64>> = (0..5).map(|i| widen(s(i))).collect();
                                let x64 = SeqF64 {
                                    q: &w[0],
                                    k: &w[1],
                                    v: &w[2],
                                    out: &w[3],
                                    lse: &widen(l),
                                    dout: &w[4],
                                };
                                let gr = bwd_seq_f64(&x64, (t, d, scale as f64), sd);
                                for (dst, src) in
                                    [(&mut *dq, &gr.0), (&mut *dk, &gr.1), (&mut *dv, &gr.2)]
                                {
                                    narrow(src, dst);
                                }
                            }
                        }
                        for (blk, gsrc) in [&*dq, &*dk, &*dv].into_iter().enumerate() {
                            scatter(gsrc, p, 3, blk, h, g);
                        }
                    }
                },
            );
        Ok(())
    }
}
