//! bf16 packed causal attention on tensor cores (`causal_attention_packed_bf16_{fwd,bwd}`)
//! against its f64 reference `gpu_core::cpu::attention_bf16` (the kernels' rounding points), on
//! fresh random inputs (seed printed) at the GPT's shape, lengths that are not whole 64-row
//! tiles and t = 1; outputs poisoned with NaN; NaN and inf kept inside their sequence; typed
//! errors for bad arguments. Tests named `gpu_*` skip without a GPU.
//!
//! The bound (u = 2^-8, bf16's unit roundoff; ε = 2^-16, a generous f32 accumulation and exp
//! error for head width 64 and ≤ 256 keys). The kernel and the reference differ only in where
//! they round: the kernel accumulates in f32 and rounds P against its running row max, so a P
//! or dS entry that both round to bf16 may land one bf16 ulp apart, and each output is rounded
//! once from slightly different values. With s_ij = scale·q_i·k_j, σ_ij = |scale|·Σ|q_i∘k_j| (the
//! size of the terms of s_ij), P_ij = exp(s_ij − lse_i) and κ_ij = 1 + σ_ij + |lse_i| (P's
//! relative error is ε·κ_ij):
//! - out_i: |Δ| ≤ u·(2·Σ_j P_ij|v_j| + 2|out_i|) + ε·Σ_j P_ij|v_j|·κ_ij;
//! - lse_i: |Δ| ≤ ε·(1 + |lse_i| + max_j σ_ij);
//! - |ΔdS_ij| ≤ e_ij = 2u·|dS_ij| + ε·P_ij·(Σ|dout_i∘v_j| + Σ|dout_i∘out_i|)·κ_ij and
//!   |ΔP_ij| ≤ (2u + ε·κ_ij)·P_ij, so dq_i: |Δ| ≤ 1.25·|scale|·Σ_j e_ij|k_j| + 2u|dq_i|,
//!   dk_j: 1.25·|scale|·Σ_i e_ij|q_i| + 2u|dk_j|, dv_j: 1.25·Σ_i (2u + εκ_ij)P_ij|dout_i| + 2u|dv_j|
//!   (the 1.25 covers the f32 sums of the rounded terms, ≤ 256·2^-24 of their magnitude).
//!
//! Flush to zero. These bounds are relative: they cannot absorb a value that the kernel flushes
//! to 0 however small it is, and an H200 returned 0 where the reference has a bf16 subnormal
//! (4.6e-40 against a bound of 3e-41, scale 2: a P_ij = exp(s_ij − lse_i) below 2^-126, which
//! the reference keeps, in a gradient; in another run a normal 6.9e-38 lost half to such a P).
//! Let F = 2^-126, the smallest normal number of f32 and of bf16 (they share their exponent
//! range). The kernels are built without `-ftz` or `--use_fast_math` (`xtask build-ptx`: `-O3`
//! only), so their f32 adds, multiplies and FMAs keep subnormals; the instruction that flushes
//! is `ex2.approx.ftz` (every P of the forward and of the backward, and the forward's rescale α
//! of its running sums), whose results below F are +0. The bound does not rely on the subnormal
//! handling of the bf16 conversion (`cvt.rn.bf16x2.f32`) or of the tensor-core product either:
//! it lets both flush their operands, products and partial sums. What a flush costs:
//! - a flushed P_ij is below F(1 + 2^-21) (ex2.approx's relative error), below 2F after the
//!   reference's own rounding to bf16: 2F times whatever multiplies it. A flushed α drops running
//!   sums whose terms are each below 2F of the new row maximum: the same 2F per key, and a key
//!   is lost once at most, so this is not counted twice;
//! - any other flushed value is below F: F times whatever multiplies it.
//!
//! Counting, for each output element, what can be flushed on its way: one operand per term of
//! its sum, the product and the partial sum per term (and in the forward the rescale of the
//! running sum, an f32 multiply, counted anyway: at most one per term), and two at the store
//! (the scaling by `scale` or 1/l, the rounding to bf16). Each element's bound gains:
//! - out_i: 2F·Σ_j |v_j| + 3F per visible key + 2F, and 4F·(i+1)·|out_i| for the normaliser
//!   l ≥ 1/2 (the row maximum's term is 1), which loses < 2F per key;
//! - lse_i: 4F·(i+1) (ln l moves by < 2× l's loss, as l ≥ 1/2);
//! - dS_ij as an operand: f_ij = 2F·(Σ|dout_i∘v_j| + Σ|dout_i∘out_i|) (P flushed inside
//!   P∘(dP − δ)) + F (dS itself flushed), so dq_i: |scale|·Σ_j (f_ij·|k_j| + 2F) + 2F,
//!   dk_j: |scale|·Σ_i (f_ij·|q_i| + 2F) + 2F, and dv_j: Σ_i (2F·|dout_i| + 2F) + 2F.
//!
//! At these inputs (|q|, |k|, |v| ≤ 2, |dout| ≤ 1, t ≤ 256) every such term is below 2^-100
//! (`the_bound_counts_flushed_subnormals_and_still_rejects_a_wrong_term` checks it, and replays
//! the four H200 failures on the CPU): it changes the verdict on no result larger than that.
//!
//! A wrong index, mask or formula moves an element by a whole term, many times these bounds
//! at the small lengths.

#[path = "nn_attention_bf16/bounds.rs"]
mod bounds;
mod common;

use bounds::{bounds, gather, F};
use common::{bf16s, gpu_and_rng};
use gpu_core::cpu::attention_bf16::{
    causal_attention_packed_bf16_bwd, causal_attention_packed_bf16_fwd,
};
use gpu_core::nn::attention::Packed;
use gpu_core::nn::attention::PackedSaved;
use gpu_core::{Backend, BufferInfo, DType, GpuError};
use gpu_cuda::testing::backend_or_skip;
use gpu_cuda::{CudaBackend, CudaBuffer};
use half::bf16;
use rand::{rngs::StdRng, SeedableRng};

const U: f64 = 1.0 / 256.0;
const EPS: f64 = 1.0 / 65536.0;

/// `|got − want| ≤ tol + 2u|want|` elementwise (the second term only where `rounded`), skipping
/// elements for which `skip` holds; a NaN anywhere fails. The worst error / bound, or the first
/// element out of bounds.
fn check<T: Copy + Into<f64>>(
    what: &str,
    got: &[T],
    want: &[T],
    tol: &[f64],
    rounded: bool,
    skip: impl Fn(usize) -> bool,
) -> Result<f64, String> {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = 0.0f64;
    for (i, ((&g, &w), &t)) in got.iter().zip(want).zip(tol).enumerate() {
        if skip(i) {
            continue;
        }
        let (g, w): (f64, f64) = (g.into(), w.into());
        let tol = t + if rounded { 2.0 * U * w.abs() } else { 0.0 };
        let diff = (g - w).abs();
        // A NaN (in the result or the bound) fails too.
        if diff.is_nan() || tol.is_nan() || diff > tol {
            return Err(format!(
                "{what}[{i}]: gpu {g:e}, reference {w:e}, diff {diff:e} > bound {tol:e}"
            ));
        }
        if tol > 0.0 {
            worst = worst.max(diff / tol);
        }
    }
    Ok(worst)
}

struct Outputs {
    out: Vec<bf16>,
    lse: Vec<f32>,
    grad: Vec<bf16>,
}

/// Forward and backward on the GPU, every output poisoned with NaN first.
fn run_gpu(gpu: &CudaBackend, qkv: &[bf16], dout: &[bf16], p: Packed, scale: f32) -> Outputs {
    let nan_bf = |n: usize| gpu.upload(&vec![bf16::NAN; n]).unwrap();
    let qkv_b = gpu.upload(qkv).unwrap();
    let (mut out, mut lse) = (
        nan_bf(p.b * p.t * p.c()),
        gpu.upload(&vec![f32::NAN; p.n() * p.t]).unwrap(),
    );
    gpu.causal_attention_packed_bf16_fwd(&qkv_b, &mut out, &mut lse, p, scale, None)
        .unwrap();
    let dout_b = gpu.upload(dout).unwrap();
    let mut grad = nan_bf(qkv.len());
    gpu.causal_attention_packed_bf16_bwd(
        &qkv_b,
        PackedSaved {
            out: &out,
            lse: &lse,
            dout: &dout_b,
        },
        &mut grad,
        p,
        scale,
        None,
    )
    .unwrap();
    Outputs {
        out: gpu.download::<bf16>(&out).unwrap(),
        lse: gpu.download::<f32>(&lse).unwrap(),
        grad: gpu.download::<bf16>(&grad).unwrap(),
    }
}

/// GPU against the reference within the bounds over batches `batches` (each batch is
/// independent, so a slice of the batch is an exact smaller call), skipping sequence `skip_seq`
/// (`b·heads + h` within the slice); panics on the first element out of bounds.
fn compare(
    what: &str,
    (qkv, dout): (&[bf16], &[bf16]),
    got: &Outputs,
    (p, scale): (Packed, f32),
    (batches, skip_seq): (std::ops::Range<usize>, Option<usize>),
) {
    let all = Terms::WithFlush;
    if let Err(e) = judge(what, (qkv, dout), got, (p, scale), (batches, skip_seq), all) {
        panic!("{e}");
    }
}

/// Which terms of the bound [`judge`] counts.
#[derive(Clone, Copy, PartialEq)]
enum Terms {
    /// The rounding bounds and the flush-to-zero terms (what the GPU is held to).
    WithFlush,
    /// The rounding bounds alone (to show that a case needs the flush terms).
    RoundingOnly,
}

/// [`compare`]'s verdict (its arguments and `terms`): `Err` names the first element out of
/// bounds.
fn judge(
    what: &str,
    (qkv, dout): (&[bf16], &[bf16]),
    got: &Outputs,
    (p, scale): (Packed, f32),
    (batches, skip_seq): (std::ops::Range<usize>, Option<usize>),
    terms: Terms,
) -> Result<(), String> {
    let (rows, c, nt) = (batches.start * p.t..batches.end * p.t, p.c(), p.heads * p.t);
    let qkv = &qkv[rows.start * 3 * c..rows.end * 3 * c];
    let dout = &dout[rows.start * c..rows.end * c];
    let got = Outputs {
        out: got.out[rows.start * c..rows.end * c].to_vec(),
        lse: got.lse[batches.start * nt..batches.end * nt].to_vec(),
        grad: got.grad[rows.start * 3 * c..rows.end * 3 * c].to_vec(),
    };
    let p = Packed {
        b: batches.len(),
        ..p
    };
    let (out, lse) = causal_attention_packed_bf16_fwd(qkv, p, scale, None).unwrap();
    // The backward reference takes the GPU's forward outputs, as the GPU backward does.
    let grad =
        causal_attention_packed_bf16_bwd(qkv, &got.out, &got.lse, dout, p, scale, None).unwrap();
    let (round, flush) = bounds(qkv, &got.out, &got.lse, dout, p, scale as f64);
    let sum = |a: &[f64], b: &[f64]| -> Vec<f64> {
        match terms {
            Terms::WithFlush => a.iter().zip(b).map(|(x, y)| x + y).collect(),
            Terms::RoundingOnly => a.to_vec(),
        }
    };
    let (to, tl, tg) = (
        sum(&round.out, &flush.out),
        sum(&round.lse, &flush.lse),
        sum(&round.grad, &flush.grad),
    );
    let (t, c, d) = (p.t, p.c(), p.d);
    let seq_of_row = |i: usize, w: usize| (i / (t * w * c)) * p.heads + (i % (w * c)) % c / d;
    let is_skipped = |s: usize| skip_seq == Some(s);
    let f32s = |x: &[bf16]| x.iter().map(|x| x.to_f32()).collect::<Vec<_>>();
    // A bf16 output of `w` blocks of `c` columns a row (out 1, dqkv 3).
    let check_bf16 = |name: &str, (got, want): (&[bf16], &[bf16]), tol, rounded, w| {
        check(
            &format!("{what}: {name}"),
            &f32s(got),
            &f32s(want),
            tol,
            rounded,
            |i| is_skipped(seq_of_row(i, w)),
        )
    };
    let worst = [
        check_bf16("out", (&got.out, &out), &to, false, 1)?,
        check(&format!("{what}: lse"), &got.lse, &lse, &tl, false, |i| {
            is_skipped(i / t)
        })?,
        check_bf16("dqkv", (&got.grad, &grad), &tg, true, 3)?,
    ];
    eprintln!(
        "{what}: worst error / bound: out {:.3}, lse {:.3}, dqkv {:.3}",
        worst[0], worst[1], worst[2]
    );
    Ok(())
}

/// The reference backward with the flushes the bound allows for (module docs), as a stand-in
/// for a GPU gradient on the CPU: P_ij below F is 0 (the kernel's `ex2.approx.ftz`), and so are
/// the bf16 dS entries and outputs below F. The loops are `gpu_core`'s reference's.
fn bwd_flushed(
    qkv: &[bf16],
    out: &[bf16],
    lse: &[f32],
    dout: &[bf16],
    p: Packed,
    scale: f32,
) -> Vec<bf16> {
    let (t, d, c) = (p.t, p.d, p.c());
    let scale = scale as f64;
    let ftz = |x: f64| if x.abs() < F { 0.0 } else { x };
    let round = |x: f64| bf16::from_f64(x).to_f64();
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    let mut grad = vec![bf16::ZERO; qkv.len()];
    for bi in 0..p.b {
        for h in 0..p.heads {
            let [q, k, v] = [0, 1, 2].map(|blk| gather(qkv, p, 3, blk, bi, h));
            let (o, g) = (gather(out, p, 1, 0, bi, h), gather(dout, p, 1, 0, bi, h));
            let (mut gq, mut gk, mut gv) = (vec![0.0; t * d], vec![0.0; t * d], vec![0.0; t * d]);
            for i in 0..t {
                let (qi, gi) = (&q[i * d..][..d], &g[i * d..][..d]);
                let li = lse[(bi * p.heads + h) * t + i] as f64;
                let delta = dot(gi, &o[i * d..][..d]);
                for j in 0..=i {
                    let (kj, vj) = (&k[j * d..][..d], &v[j * d..][..d]);
                    let pij = ftz((scale * dot(qi, kj) - li).exp());
                    let ds = ftz(round(pij * (dot(gi, vj) - delta)));
                    let pr = round(pij);
                    for x in 0..d {
                        gq[i * d + x] += ds * kj[x];
                        gk[j * d + x] += ds * qi[x];
                        gv[j * d + x] += pr * gi[x];
                    }
                }
            }
            gq.iter_mut().chain(gk.iter_mut()).for_each(|x| *x *= scale);
            for (blk, src) in [&gq, &gk, &gv].into_iter().enumerate() {
                for i in 0..t {
                    let at = (bi * t + i) * 3 * c + blk * c + h * d;
                    for x in 0..d {
                        grad[at + x] = bf16::from_f64(ftz(src[i * d + x]));
                    }
                }
            }
        }
    }
    grad
}

#[test]
fn the_bound_counts_flushed_subnormals_and_still_rejects_a_wrong_term() {
    // CPU only. The inputs of the four H200 failures of gpu_bf16_attention_takes_any_finite_scale
    // (their seeds, the fifth draw: scale 2); the reference forward stands in for the GPU's,
    // `bwd_flushed` for its gradient.
    let p = Packed {
        b: 2,
        t: 140,
        heads: 2,
        d: 64,
    };
    let scale = 2.0f32;
    for (n, seed) in [
        4820999636731116303u64,
        16620796392207610066,
        10333563914720841520,
        3282134797516376775,
    ]
    .into_iter()
    .enumerate()
    {
        let mut r = StdRng::seed_from_u64(seed);
        let mut draw = || {
            let qkv = bf16s(&mut r, p.b * p.t * 3 * p.c(), 2.0);
            (qkv, bf16s(&mut r, p.b * p.t * p.c(), 1.0))
        };
        for _ in 0..4 {
            draw();
        }
        let (qkv, dout) = draw();
        let (out, lse) = causal_attention_packed_bf16_fwd(&qkv, p, scale, None).unwrap();
        let exact =
            causal_attention_packed_bf16_bwd(&qkv, &out, &lse, &dout, p, scale, None).unwrap();
        let flushed = bwd_flushed(&qkv, &out, &lse, &dout, p, scale);
        // Some P_ij (or dS_ij) falls below F: the flushed gradient differs from the reference.
        assert!(exact != flushed, "seed {seed}: nothing flushed, no test");
        let outputs = |out: &[bf16], lse: &[f32], grad: &[bf16]| Outputs {
            out: out.to_vec(),
            lse: lse.to_vec(),
            grad: grad.to_vec(),
        };
        let what = format!("seed {seed}");
        let verdict = |got: &Outputs, terms| {
            judge(&what, (&qkv, &dout), got, (p, scale), (0..p.b, None), terms)
        };
        // The rounding bounds alone reject the flushed gradient (the H200 failure, on the CPU);
        // the flush terms admit it.
        let got = outputs(&out, &lse, &flushed);
        let e = verdict(&got, Terms::RoundingOnly).expect_err("the flushes need the flush terms");
        eprintln!("rounding bounds alone: {e}");
        verdict(&got, Terms::WithFlush).unwrap();
        // The flush terms are below 2^-100 everywhere: they admit no error in a larger result.
        let (_, flush) = bounds(&qkv, &out, &lse, &dout, p, scale as f64);
        let most =
            (flush.out.iter().chain(&flush.lse).chain(&flush.grad)).fold(0.0f64, |a, &b| a.max(b));
        assert!(
            most < 2f64.powi(-100),
            "{what}: largest flush term {most:e}"
        );
        if n > 0 {
            continue;
        }
        // Whole-term errors are still rejected. A mask error: dv of key 0 (sequence 0) without
        // query 0's term, P_00·dout_0 = dout_0 (row 0 sees key 0 alone, so P_00 = 1).
        let mut grad = flushed.clone();
        let c = p.c();
        for x in 0..p.d {
            let dv = &mut grad[2 * c + x];
            *dv = bf16::from_f64(dv.to_f64() - dout[x].to_f64());
        }
        let e = verdict(&outputs(&out, &lse, &grad), Terms::WithFlush).expect_err("missing term");
        assert!(e.contains("dqkv"), "{e}");
        // An index error: row 0's lse replaced by row 1's.
        let mut lse1 = lse.clone();
        lse1[0] = lse[1];
        let e = verdict(&outputs(&out, &lse1, &flushed), Terms::WithFlush).expect_err("wrong row");
        assert!(e.contains("lse"), "{e}");
    }
}

#[test]
fn gpu_bf16_attention_matches_its_reference_within_the_rounding_bound() {
    let (gpu, mut r) = skip_unless!(gpu_and_rng(
        "gpu_bf16_attention_matches_its_reference_within_the_rounding_bound"
    ));
    // The GPT's shape, ragged lengths around the 64-row tile, one row, one head.
    for (b, t, heads) in [
        (4, 256, 6),
        (3, 37, 2),
        (1, 1, 3),
        (2, 130, 1),
        (1, 64, 2),
        (2, 65, 1),
    ] {
        let p = Packed { b, t, heads, d: 64 };
        let scale = 0.125;
        let qkv = bf16s(&mut r, b * t * 3 * p.c(), 2.0);
        let dout = bf16s(&mut r, b * t * p.c(), 1.0);
        let got = run_gpu(&gpu, &qkv, &dout, p, scale);
        // The reference is slow in debug builds: at the GPT's shape, the first and last batch.
        let what = format!("b {b} t {t} heads {heads}");
        let checked = if b > 2 && t > 128 {
            [(0, 1), (b - 1, b)]
        } else {
            [(0, b), (0, 0)]
        };
        for (lo, hi) in checked.into_iter().filter(|(lo, hi)| lo < hi) {
            let batches = lo..hi;
            compare(&what, (&qkv, &dout), &got, (p, scale), (batches, None));
        }
    }
}

#[test]
fn gpu_bf16_attention_takes_any_finite_scale() {
    // The forward scales scores inside each exponent by |scale| and flips Q's sign for a
    // negative one: negative, zero and tiny scales against the reference.
    let (gpu, mut r) = skip_unless!(gpu_and_rng("gpu_bf16_attention_takes_any_finite_scale"));
    let p = Packed {
        b: 2,
        t: 140,
        heads: 2,
        d: 64,
    };
    for scale in [-0.3f32, 0.0, -0.0, 1e-3, 2.0] {
        let qkv = bf16s(&mut r, p.b * p.t * 3 * p.c(), 2.0);
        let dout = bf16s(&mut r, p.b * p.t * p.c(), 1.0);
        let got = run_gpu(&gpu, &qkv, &dout, p, scale);
        compare(
            &format!("scale {scale}"),
            (&qkv, &dout),
            &got,
            (p, scale),
            (0..p.b, None),
        );
    }
}

#[test]
fn gpu_bf16_attention_keeps_nan_and_inf_in_their_sequence() {
    let (gpu, mut r) = skip_unless!(gpu_and_rng(
        "gpu_bf16_attention_keeps_nan_and_inf_in_their_sequence"
    ));
    let p = Packed {
        b: 2,
        t: 50,
        heads: 2,
        d: 64,
    };
    let c = p.c();
    let mut qkv = bf16s(&mut r, p.b * p.t * 3 * c, 2.0);
    let dout = bf16s(&mut r, p.b * p.t * c, 1.0);
    // Sequence 1 (batch 0, head 1): a NaN in q of row 10, an infinity in k of row 20.
    qkv[10 * 3 * c + 64 + 3] = bf16::NAN;
    qkv[20 * 3 * c + c + 64 + 5] = bf16::INFINITY;
    let got = run_gpu(&gpu, &qkv, &dout, p, 0.125);
    // The poisoned sequence is non-finite somewhere; every other one finite and correct.
    let head1 = |i: usize, w: usize| i / (p.t * w * c) == 0 && (i % (w * c)) % c / 64 == 1;
    assert!(got
        .out
        .iter()
        .enumerate()
        .any(|(i, x)| head1(i, 1) && !x.is_finite()));
    assert!(got
        .out
        .iter()
        .enumerate()
        .all(|(i, x)| head1(i, 1) || x.is_finite()));
    assert!(got
        .grad
        .iter()
        .enumerate()
        .all(|(i, x)| head1(i, 3) || x.is_finite()));
    compare(
        "non-finite sequence 1",
        (&qkv, &dout),
        &got,
        (p, 0.125),
        (0..2, Some(1)),
    );
}

#[test]
fn gpu_bf16_attention_rejects_bad_arguments() {
    let gpu = skip_unless!(backend_or_skip("gpu_bf16_attention_rejects_bad_arguments"));
    let p = Packed {
        b: 2,
        t: 8,
        heads: 2,
        d: 64,
    };
    let (n, c) = (p.n(), p.c());
    let bf = |len: usize| gpu.allocate(DType::BF16, len).unwrap();
    let f32b = |len: usize| gpu.allocate(DType::F32, len).unwrap();
    // The two calls at scale 0.125, without dropout; `saved` is `[out, lse, dout]`.
    let fwd = |qkv: &CudaBuffer, out: &mut CudaBuffer, lse: &mut CudaBuffer, p: Packed| {
        gpu.causal_attention_packed_bf16_fwd(qkv, out, lse, p, 0.125, None)
    };
    let bwd = |qkv: &CudaBuffer, saved: [&CudaBuffer; 3], g: &mut CudaBuffer, p: Packed| {
        let [out, lse, dout] = saved;
        let saved = PackedSaved { out, lse, dout };
        gpu.causal_attention_packed_bf16_bwd(qkv, saved, g, p, 0.125, None)
    };
    let qkv = bf(p.b * p.t * 3 * c);
    let (mut out, mut lse, mut g) = (bf(p.b * p.t * c), f32b(n * p.t), bf(p.b * p.t * 3 * c));
    fwd(&qkv, &mut out, &mut lse, p).unwrap();
    bwd(&qkv, [&out, &lse, &out], &mut g, p).unwrap();
    // Head dimensions other than 64: a typed error saying so.
    let p32 = Packed { d: 32, ..p };
    let e = fwd(
        &bf(p.b * p.t * 3 * 64),
        &mut bf(p.b * p.t * 64),
        &mut lse,
        p32,
    );
    assert!(
        matches!(&e, Err(GpuError::InvalidShape { reason, .. }) if reason.contains("d = 64")),
        "{e:?}"
    );
    // Wrong dtypes.
    let e = fwd(&f32b(qkv.len()), &mut out, &mut lse, p);
    assert!(matches!(e, Err(GpuError::DTypeMismatch { .. })), "{e:?}");
    let mut lse_bf = bf(n * p.t);
    let e = fwd(&qkv, &mut out, &mut lse_bf, p);
    assert!(matches!(e, Err(GpuError::DTypeMismatch { .. })), "{e:?}");
    let e = bwd(&qkv, [&out, &lse, &out], &mut f32b(g.len()), p);
    assert!(matches!(e, Err(GpuError::DTypeMismatch { .. })), "{e:?}");
    // Wrong lengths.
    let e = fwd(&bf(qkv.len() - 1), &mut out, &mut lse, p);
    assert!(matches!(e, Err(GpuError::ShapeMismatch { .. })), "{e:?}");
    let e = bwd(&qkv, [&out, &lse, &bf(7)], &mut g, p);
    assert!(matches!(e, Err(GpuError::ShapeMismatch { .. })), "{e:?}");
    // No heads, a non-finite scale, an overflowing shape.
    let e = fwd(&qkv, &mut out, &mut lse, Packed { heads: 0, ..p });
    assert!(matches!(e, Err(GpuError::InvalidShape { .. })), "{e:?}");
    let e = gpu.causal_attention_packed_bf16_fwd(&qkv, &mut out, &mut lse, p, f32::INFINITY, None);
    assert!(e.is_err());
    let huge = Packed {
        b: usize::MAX / 2,
        ..p
    };
    assert!(fwd(&qkv, &mut out, &mut lse, huge).is_err());
    // Empty batch or sequence: nothing to do.
    for e in [Packed { b: 0, ..p }, Packed { t: 0, ..p }] {
        let (qkv0, mut o0, mut l0, mut g0) = (bf(0), bf(0), f32b(0), bf(0));
        fwd(&qkv0, &mut o0, &mut l0, e).unwrap();
        bwd(&qkv0, [&o0, &l0, &o0], &mut g0, e).unwrap();
    }
}
