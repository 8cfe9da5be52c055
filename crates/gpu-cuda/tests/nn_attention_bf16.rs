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
//! A wrong index, mask or formula moves an element by a whole term, many times these bounds
//! at the small lengths.

mod common;

use common::rng;
use gpu_core::cpu::attention_bf16::{
    causal_attention_packed_bf16_bwd, causal_attention_packed_bf16_fwd,
};
use gpu_core::nn::attention::Packed;
use gpu_core::{Backend, BufferInfo, DType, GpuError};
use gpu_cuda::testing::backend_or_skip;
use gpu_cuda::CudaBackend;
use half::bf16;
use rand::{rngs::StdRng, Rng};

const U: f64 = 1.0 / 256.0;
const EPS: f64 = 1.0 / 65536.0;

fn bf16s(r: &mut StdRng, n: usize, scale: f32) -> Vec<bf16> {
    (0..n)
        .map(|_| bf16::from_f32(r.random_range(-scale..scale)))
        .collect()
}

/// Head `h` of block `blk` of batch `bi` of a `[b, t, w·c]` buffer as f64 `[t, d]`.
fn gather(x: &[bf16], p: Packed, w: usize, blk: usize, bi: usize, h: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(p.t * p.d);
    for i in 0..p.t {
        let at = (bi * p.t + i) * w * p.c() + blk * p.c() + h * p.d;
        out.extend(x[at..at + p.d].iter().map(|v| v.to_f64()));
    }
    out
}

/// The bounds of the module docs: `(out, lse, [b, t, 3c] gradient)`, from the inputs and the
/// GPU's `out` and `lse` (as the backward reference takes them).
fn bounds(
    qkv: &[bf16],
    out: &[bf16],
    lse: &[f32],
    dout: &[bf16],
    p: Packed,
    scale: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (t, d, c) = (p.t, p.d, p.c());
    let mut to = vec![0.0; out.len()];
    let mut tl = vec![0.0; lse.len()];
    let mut tg = vec![0.0; qkv.len()];
    for bi in 0..p.b {
        for h in 0..p.heads {
            let [q, k, v] = [0, 1, 2].map(|blk| gather(qkv, p, 3, blk, bi, h));
            let (o, g) = (gather(out, p, 1, 0, bi, h), gather(dout, p, 1, 0, bi, h));
            let (mut eo, mut eq, mut ek, mut ev) = (
                vec![0.0; t * d],
                vec![0.0; t * d],
                vec![0.0; t * d],
                vec![0.0; t * d],
            );
            for i in 0..t {
                let li = lse[(bi * p.heads + h) * t + i] as f64;
                let (mut dl, mut dlabs) = (0.0, 0.0);
                for x in 0..d {
                    dl += g[i * d + x] * o[i * d + x];
                    dlabs += (g[i * d + x] * o[i * d + x]).abs();
                }
                let mut smax = 0.0f64;
                for j in 0..=i {
                    let (mut s, mut sig, mut dp, mut dpabs) = (0.0, 0.0, 0.0, 0.0);
                    for x in 0..d {
                        let qk = q[i * d + x] * k[j * d + x];
                        let gv = g[i * d + x] * v[j * d + x];
                        s += qk;
                        sig += qk.abs();
                        dp += gv;
                        dpabs += gv.abs();
                    }
                    let (s, sig) = (scale * s, scale.abs() * sig);
                    smax = smax.max(sig);
                    let pij = (s - li).exp();
                    let kap = 1.0 + sig + li.abs();
                    let ds = pij * (dp - dl);
                    let e = 2.0 * U * ds.abs() + EPS * pij * (dpabs + dlabs) * kap;
                    let ep = (2.0 * U + EPS * kap) * pij;
                    for x in 0..d {
                        eo[i * d + x] += ep * v[j * d + x].abs();
                        eq[i * d + x] += scale.abs() * e * k[j * d + x].abs();
                        ek[j * d + x] += scale.abs() * e * q[i * d + x].abs();
                        ev[j * d + x] += ep * g[i * d + x].abs();
                    }
                }
                tl[(bi * p.heads + h) * t + i] = EPS * (1.0 + li.abs() + smax);
                for x in 0..d {
                    let at = (bi * t + i) * c + h * d + x;
                    to[at] = eo[i * d + x] + 2.0 * U * o[i * d + x].abs();
                }
            }
            for i in 0..t {
                for (blk, e) in [&eq, &ek, &ev].into_iter().enumerate() {
                    let at = (bi * t + i) * 3 * c + blk * c + h * d;
                    for x in 0..d {
                        tg[at + x] = 1.25 * e[i * d + x];
                    }
                }
            }
        }
    }
    (to, tl, tg)
}

/// `|got − want| ≤ tol + 2u|want|` elementwise (the second term only where `rounded`), skipping
/// elements for which `skip` holds; a NaN anywhere fails.
fn check<T: Copy + Into<f64>>(
    what: &str,
    got: &[T],
    want: &[T],
    tol: &[f64],
    rounded: bool,
    skip: impl Fn(usize) -> bool,
) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = 0.0f64;
    for (i, ((&g, &w), &t)) in got.iter().zip(want).zip(tol).enumerate() {
        if skip(i) {
            continue;
        }
        let (g, w): (f64, f64) = (g.into(), w.into());
        let tol = t + if rounded { 2.0 * U * w.abs() } else { 0.0 };
        let diff = (g - w).abs();
        assert!(
            diff <= tol,
            "{what}[{i}]: gpu {g}, reference {w}, diff {diff:e} > bound {tol:e}"
        );
        if tol > 0.0 {
            worst = worst.max(diff / tol);
        }
    }
    eprintln!("{what}: worst error / bound {worst:.3}");
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
    gpu.causal_attention_packed_bf16_fwd(&qkv_b, &mut out, &mut lse, p, scale)
        .unwrap();
    let dout_b = gpu.upload(dout).unwrap();
    let mut grad = nan_bf(qkv.len());
    gpu.causal_attention_packed_bf16_bwd(&qkv_b, &out, &lse, &dout_b, &mut grad, p, scale)
        .unwrap();
    Outputs {
        out: gpu.download::<bf16>(&out).unwrap(),
        lse: gpu.download::<f32>(&lse).unwrap(),
        grad: gpu.download::<bf16>(&grad).unwrap(),
    }
}

/// GPU against the reference within the bounds over batches `batches` (each batch is
/// independent, so a slice of the batch is an exact smaller call), skipping sequence `skip_seq`
/// (`b·heads + h` within the slice).
#[allow(clippy::too_many_arguments)]
fn compare(
    what: &str,
    qkv: &[bf16],
    dout: &[bf16],
    got: &Outputs,
    p: Packed,
    scale: f32,
    batches: std::ops::Range<usize>,
    skip_seq: Option<usize>,
) {
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
    let (out, lse) = causal_attention_packed_bf16_fwd(qkv, p, scale).unwrap();
    // The backward reference takes the GPU's forward outputs, as the GPU backward does.
    let grad = causal_attention_packed_bf16_bwd(qkv, &got.out, &got.lse, dout, p, scale).unwrap();
    let (to, tl, tg) = bounds(qkv, &got.out, &got.lse, dout, p, scale as f64);
    let (t, c, d) = (p.t, p.c(), p.d);
    let seq_of_row = |i: usize, w: usize| (i / (t * w * c)) * p.heads + (i % (w * c)) % c / d;
    let is_skipped = |s: usize| skip_seq == Some(s);
    check(
        &format!("{what}: out"),
        &got.out.iter().map(|x| x.to_f32()).collect::<Vec<_>>(),
        &out.iter().map(|x| x.to_f32()).collect::<Vec<_>>(),
        &to,
        false,
        |i| is_skipped(seq_of_row(i, 1)),
    );
    check(&format!("{what}: lse"), &got.lse, &lse, &tl, false, |i| {
        is_skipped(i / t)
    });
    check(
        &format!("{what}: dqkv"),
        &got.grad.iter().map(|x| x.to_f32()).collect::<Vec<_>>(),
        &grad.iter().map(|x| x.to_f32()).collect::<Vec<_>>(),
        &tg,
        true,
        |i| is_skipped(seq_of_row(i, 3)),
    );
}

#[test]
fn gpu_bf16_attention_matches_its_reference_within_the_rounding_bound() {
    let test = "gpu_bf16_attention_matches_its_reference_within_the_rounding_bound";
    let Some(gpu) = backend_or_skip(test) else {
        return;
    };
    let (mut r, _) = rng(test);
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
            compare(&what, &qkv, &dout, &got, p, scale, batches, None);
        }
    }
}

#[test]
fn gpu_bf16_attention_takes_any_finite_scale() {
    // The forward scales scores inside each exponent by |scale| and flips Q's sign for a
    // negative one: negative, zero and tiny scales against the reference.
    let test = "gpu_bf16_attention_takes_any_finite_scale";
    let Some(gpu) = backend_or_skip(test) else {
        return;
    };
    let (mut r, _) = rng(test);
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
            &qkv,
            &dout,
            &got,
            p,
            scale,
            0..p.b,
            None,
        );
    }
}

#[test]
fn gpu_bf16_attention_keeps_nan_and_inf_in_their_sequence() {
    let test = "gpu_bf16_attention_keeps_nan_and_inf_in_their_sequence";
    let Some(gpu) = backend_or_skip(test) else {
        return;
    };
    let (mut r, _) = rng(test);
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
        &qkv,
        &dout,
        &got,
        p,
        0.125,
        0..2,
        Some(1),
    );
}

#[test]
fn gpu_bf16_attention_rejects_bad_arguments() {
    let test = "gpu_bf16_attention_rejects_bad_arguments";
    let Some(gpu) = backend_or_skip(test) else {
        return;
    };
    let p = Packed {
        b: 2,
        t: 8,
        heads: 2,
        d: 64,
    };
    let (n, c) = (p.n(), p.c());
    let bf = |len: usize| gpu.allocate(DType::BF16, len).unwrap();
    let f32b = |len: usize| gpu.allocate(DType::F32, len).unwrap();
    let qkv = bf(p.b * p.t * 3 * c);
    let (mut out, mut lse, mut g) = (bf(p.b * p.t * c), f32b(n * p.t), bf(p.b * p.t * 3 * c));
    gpu.causal_attention_packed_bf16_fwd(&qkv, &mut out, &mut lse, p, 0.125)
        .unwrap();
    gpu.causal_attention_packed_bf16_bwd(&qkv, &out, &lse, &out, &mut g, p, 0.125)
        .unwrap();
    // Head dimensions other than 64: a typed error saying so.
    let p32 = Packed { d: 32, ..p };
    let e = gpu.causal_attention_packed_bf16_fwd(
        &bf(p.b * p.t * 3 * 64),
        &mut bf(p.b * p.t * 64),
        &mut lse,
        p32,
        0.125,
    );
    assert!(
        matches!(&e, Err(GpuError::InvalidShape { reason, .. }) if reason.contains("d = 64")),
        "{e:?}"
    );
    // Wrong dtypes.
    let e = gpu.causal_attention_packed_bf16_fwd(&f32b(qkv.len()), &mut out, &mut lse, p, 0.125);
    assert!(matches!(e, Err(GpuError::DTypeMismatch { .. })), "{e:?}");
    let mut lse_bf = bf(n * p.t);
    let e = gpu.causal_attention_packed_bf16_fwd(&qkv, &mut out, &mut lse_bf, p, 0.125);
    assert!(matches!(e, Err(GpuError::DTypeMismatch { .. })), "{e:?}");
    let e =
        gpu.causal_attention_packed_bf16_bwd(&qkv, &out, &lse, &out, &mut f32b(g.len()), p, 0.125);
    assert!(matches!(e, Err(GpuError::DTypeMismatch { .. })), "{e:?}");
    // Wrong lengths.
    let e = gpu.causal_attention_packed_bf16_fwd(&bf(qkv.len() - 1), &mut out, &mut lse, p, 0.125);
    assert!(matches!(e, Err(GpuError::ShapeMismatch { .. })), "{e:?}");
    let e = gpu.causal_attention_packed_bf16_bwd(&qkv, &out, &lse, &bf(7), &mut g, p, 0.125);
    assert!(matches!(e, Err(GpuError::ShapeMismatch { .. })), "{e:?}");
    // No heads, a non-finite scale, an overflowing shape.
    let e = gpu.causal_attention_packed_bf16_fwd(
        &qkv,
        &mut out,
        &mut lse,
        Packed { heads: 0, ..p },
        0.125,
    );
    assert!(matches!(e, Err(GpuError::InvalidShape { .. })), "{e:?}");
    let e = gpu.causal_attention_packed_bf16_fwd(&qkv, &mut out, &mut lse, p, f32::INFINITY);
    assert!(e.is_err());
    let huge = Packed {
        b: usize::MAX / 2,
        ..p
    };
    assert!(gpu
        .causal_attention_packed_bf16_fwd(&qkv, &mut out, &mut lse, huge, 0.125)
        .is_err());
    // Empty batch or sequence: nothing to do.
    for e in [Packed { b: 0, ..p }, Packed { t: 0, ..p }] {
        let (qkv0, mut o0, mut l0, mut g0) = (bf(0), bf(0), f32b(0), bf(0));
        gpu.causal_attention_packed_bf16_fwd(&qkv0, &mut o0, &mut l0, e, 0.125)
            .unwrap();
        gpu.causal_attention_packed_bf16_bwd(&qkv0, &o0, &l0, &o0, &mut g0, e, 0.125)
            .unwrap();
    }
}
