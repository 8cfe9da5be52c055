//! Every defaulted op of [`PrimitivesOnly`] (the CPU's primitives, nothing else) against the
//! CPU backend's own op on random inputs.
//!
//! Bounds: ops whose defaults only move data or pick elements (max backward, gathers,
//! embeddings, the host fallbacks) are exact. The rest run in f32 where the CPU accumulates in
//! f64 and rounds once; each output must be within `rtol·scale` of the CPU's, `scale` the
//! largest magnitude of that output, with `rtol` = 1e-5 for the row ops and AdamW (a few f32
//! roundings per element, `exp(−ln(v)/2)` for `1/sqrt` within `(1 + |ln v|/2)·2^-22`) and
//! 1e-4 for attention (sums of `t` products).

mod common;

use common::adamw_on_copies;
use gpu_core::nn::attention::{AttnDims, AttnQkv, PackedSaved};
use gpu_core::nn::rows::{LayerNormBwdIn, LogitsIn, RmsNormBwdIn, RowBwdIn};
use gpu_core::nn::{AttentionOps, DecodeOps, ElementwiseOps, OptimOps, Primitives, RowOps};
use gpu_core::testing::{adamw_config, PrimitivesOnly};
use gpu_core::{Backend, BufferInfo, CpuBackend, CpuStorage};
use rand::{rngs::StdRng, Rng, SeedableRng};

const P: PrimitivesOnly = PrimitivesOnly;
const C: CpuBackend = CpuBackend;

fn rng(name: &str) -> StdRng {
    let seed = rand::random::<u64>();
    println!("{name}: seed {seed}");
    StdRng::seed_from_u64(seed)
}

fn rand_vec(r: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| r.random_range(-2.0f32..2.0)).collect()
}

fn f32s(x: &[f32]) -> CpuStorage {
    CpuStorage::F32(x.to_vec())
}

fn zeros(n: usize) -> CpuStorage {
    CpuStorage::F32(vec![f32::NAN; n])
}

/// `$body` with `$b` the primitives-only backend, then with `$b` the CPU backend: the pair of
/// results (a macro: the two backends are different types, and a closure cannot be generic).
macro_rules! on_both {
    (|$b:ident| $body:expr) => {
        (
            {
                let $b = &P;
                $body
            },
            {
                let $b = &C;
                $body
            },
        )
    };
}

fn close(what: &str, got: &CpuStorage, want: &CpuStorage, rtol: f32) {
    let (g, w) = (got.as_f32().unwrap(), want.as_f32().unwrap());
    assert_eq!(g.len(), w.len(), "{what}: lengths");
    let scale = w.iter().fold(1e-30f32, |m, v| m.max(v.abs()));
    for (i, (a, b)) in g.iter().zip(w).enumerate() {
        assert!(
            (a - b).abs() <= rtol * scale || a.to_bits() == b.to_bits(),
            "{what}[{i}]: {a} vs {b} (scale {scale})"
        );
    }
}

#[test]
fn elementwise_defaults_match_the_cpu() {
    let mut r = rng("elementwise");
    let (outer, n, inner) = (3, 7, 5);
    let mut x = rand_vec(&mut r, outer * n * inner);
    x[4] = f32::NAN;
    let x = f32s(&x);
    let (mut a, mut b) = (zeros(x.len()), zeros(x.len()));
    P.affine(&x, 1.5, -0.25, &mut a).unwrap();
    C.affine(&x, 1.5, -0.25, &mut b).unwrap();
    close("affine", &a, &b, 2e-7);
    // bf16 in and out: computed in f32 and rounded once, as the CPU; the f32 results differ by
    // at most half an ulp (two roundings against a fused one), so the bf16 ones are equal
    // unless that f32 result lies within it of a bf16 rounding midpoint: one bf16 ulp at most.
    let xb = CpuStorage::BF16(
        x.as_f32()
            .unwrap()
            .iter()
            .map(|&v| half::bf16::from_f32(v))
            .collect(),
    );
    let (mut ab, mut bb) = (
        CpuStorage::BF16(vec![half::bf16::NAN; x.len()]),
        CpuStorage::BF16(vec![half::bf16::NAN; x.len()]),
    );
    P.affine(&xb, 1.5, -0.25, &mut ab).unwrap();
    C.affine(&xb, 1.5, -0.25, &mut bb).unwrap();
    let (CpuStorage::BF16(ab), CpuStorage::BF16(bb)) = (ab, bb) else {
        panic!("bf16 affine: the outputs changed dtype");
    };
    for (i, (p, c)) in ab.iter().zip(&bb).enumerate() {
        let (p, c) = (p.to_f32(), c.to_f32());
        assert!(
            (p - c).abs() <= c.abs() / 128.0 || p.to_bits() == c.to_bits(),
            "bf16 affine[{i}]: {p} vs {c}"
        );
    }
    let (mut y, dy) = (zeros(outer * inner), f32s(&rand_vec(&mut r, outer * inner)));
    C.reduce_axis(gpu_core::nn::ReduceKind::Max, &x, outer, n, inner, &mut y)
        .unwrap();
    P.max_axis_bwd((&x, &y, &dy), [outer, n, inner], &mut a)
        .unwrap();
    C.max_axis_bwd((&x, &y, &dy), [outer, n, inner], &mut b)
        .unwrap();
    close("max_axis_bwd", &a, &b, 0.0);
}

/// `softmax_fwd` (`log_softmax_fwd` when `log`) of `x` on `be`.
fn softmax_fwd<B: RowOps<Buffer = CpuStorage>>(
    be: &B,
    log: bool,
    x: &CpuStorage,
    cols: usize,
) -> CpuStorage {
    let mut out = zeros(x.len());
    if log {
        be.log_softmax_fwd(x, &mut out, cols).unwrap();
    } else {
        be.softmax_fwd(x, &mut out, cols).unwrap();
    }
    out
}

/// `softmax_bwd` (`log_softmax_bwd` when `log`) of the forward output `y` and `dy` on `be`.
fn softmax_bwd<B: RowOps<Buffer = CpuStorage>>(
    be: &B,
    log: bool,
    (y, dy): (&CpuStorage, &CpuStorage),
    cols: usize,
) -> CpuStorage {
    let mut dx = zeros(y.len());
    if log {
        be.log_softmax_bwd(RowBwdIn { y, dy }, &mut dx, cols)
            .unwrap();
    } else {
        be.softmax_bwd(RowBwdIn { y, dy }, &mut dx, cols).unwrap();
    }
    dx
}

#[test]
fn row_defaults_match_the_cpu() {
    let mut r = rng("rows");
    let (rows, cols) = (6, 11);
    let [x, dy] = [0; 2].map(|_| f32s(&rand_vec(&mut r, rows * cols)));
    // softmax, then log-softmax: the forward, then the backward of the CPU's forward output.
    for log in [false, true] {
        let prefix = if log { "log_" } else { "" };
        let (a, y) = on_both!(|be| softmax_fwd(be, log, &x, cols));
        close(&format!("{prefix}softmax_fwd"), &a, &y, 1e-5);
        let (a, b) = on_both!(|be| softmax_bwd(be, log, (&y, &dy), cols));
        close(&format!("{prefix}softmax_bwd"), &a, &b, 1e-5);
    }
    let (mut a, mut b) = (zeros(rows * cols), zeros(rows * cols));
    let t = CpuStorage::U32((0..rows).map(|_| r.random_range(0..cols as u32)).collect());
    let (mut la, mut lb) = (zeros(rows), zeros(rows));
    P.cross_entropy_fwd(LogitsIn::new(&x, &t, cols), &mut la)
        .unwrap();
    C.cross_entropy_fwd(LogitsIn::new(&x, &t, cols), &mut lb)
        .unwrap();
    close("cross_entropy_fwd", &la, &lb, 1e-5);
    let dl = f32s(&rand_vec(&mut r, rows));
    P.cross_entropy_bwd(LogitsIn::new(&x, &t, cols), &dl, &mut a)
        .unwrap();
    C.cross_entropy_bwd(LogitsIn::new(&x, &t, cols), &dl, &mut b)
        .unwrap();
    close("cross_entropy_bwd", &a, &b, 1e-5);
    let bad = CpuStorage::U32(vec![cols as u32; rows]);
    assert!(P
        .cross_entropy_fwd(LogitsIn::new(&x, &bad, cols), &mut la)
        .is_err());
}

#[test]
fn norm_and_rope_defaults_match_the_cpu() {
    let mut r = rng("norms");
    let (rows, cols) = (5, 16);
    let [x, dy] = [0; 2].map(|_| f32s(&rand_vec(&mut r, rows * cols)));
    let (w, bias) = (f32s(&rand_vec(&mut r, cols)), f32s(&rand_vec(&mut r, cols)));
    let n = rows * cols;
    let (mut ya, mut ma, mut ra) = (zeros(n), zeros(rows), zeros(rows));
    let (mut yb, mut mb, mut rb) = (zeros(n), zeros(rows), zeros(rows));
    P.layernorm_fwd((&x, &w, &bias), (&mut ya, &mut ma, &mut ra), cols, 1e-5)
        .unwrap();
    C.layernorm_fwd((&x, &w, &bias), (&mut yb, &mut mb, &mut rb), cols, 1e-5)
        .unwrap();
    close("layernorm y", &ya, &yb, 1e-5);
    close("layernorm rstd", &ra, &rb, 1e-5);
    let ([da, dwa, dba], [db, dwb, dbb]) = on_both!(|be| {
        let (mut dx, mut dw, mut db) = (zeros(n), zeros(cols), zeros(cols));
        let input = LayerNormBwdIn {
            x: &x,
            w: &w,
            mean: &mb,
            rstd: &rb,
            dy: &dy,
        };
        be.layernorm_bwd(input, (&mut dx, &mut dw, &mut db), cols)
            .unwrap();
        [dx, dw, db]
    });
    close("layernorm dx", &da, &db, 1e-5);
    close("layernorm dw", &dwa, &dwb, 1e-5);
    close("layernorm db", &dba, &dbb, 1e-5);
    P.rmsnorm_fwd(&x, &w, &mut ya, &mut ra, cols, 1e-6).unwrap();
    C.rmsnorm_fwd(&x, &w, &mut yb, &mut rb, cols, 1e-6).unwrap();
    close("rmsnorm y", &ya, &yb, 1e-5);
    let ([da, dwa], [db, dwb]) = on_both!(|be| {
        let (mut dx, mut dw) = (zeros(n), zeros(cols));
        let input = RmsNormBwdIn {
            x: &x,
            w: &w,
            rstd: &rb,
            dy: &dy,
        };
        be.rmsnorm_bwd(input, (&mut dx, &mut dw), cols).unwrap();
        [dx, dw]
    });
    close("rmsnorm dx", &da, &db, 1e-5);
    close("rmsnorm dw", &dwa, &dwb, 1e-5);
    for inverse in [false, true] {
        P.rope(&x, &mut ya, [1, rows, cols], (10000.0, inverse))
            .unwrap();
        C.rope(&x, &mut yb, [1, rows, cols], (10000.0, inverse))
            .unwrap();
        close("rope", &ya, &yb, 1e-6);
    }
}

#[test]
fn attention_defaults_match_the_cpu() {
    let mut r = rng("attention");
    let (n, t, d) = (3, 9, 8);
    let scale = 1.0 / (d as f32).sqrt();
    let [q, k, v, dout] = [0; 4].map(|_| f32s(&rand_vec(&mut r, n * t * d)));
    let qkv = || AttnQkv {
        q: &q,
        k: &k,
        v: &v,
    };
    let dims = AttnDims { n, t, d, scale };
    let ((oa, la), (ob, lb)) = on_both!(|be| {
        let (mut o, mut l) = (zeros(n * t * d), zeros(n * t));
        be.causal_attention_fwd(qkv(), (&mut o, &mut l), dims)
            .unwrap();
        (o, l)
    });
    close("attention out", &oa, &ob, 1e-4);
    close("attention lse", &la, &lb, 1e-5);
    let saved = || PackedSaved {
        out: &ob,
        lse: &lb,
        dout: &dout,
    };
    let ([qa, ka, va], [qb, kb, vb]) = on_both!(|be| {
        let [mut dq, mut dk, mut dv] = [0; 3].map(|_| zeros(n * t * d));
        be.causal_attention_bwd(qkv(), saved(), (&mut dq, &mut dk, &mut dv), dims)
            .unwrap();
        [dq, dk, dv]
    });
    close("attention dq", &qa, &qb, 1e-4);
    close("attention dk", &ka, &kb, 1e-4);
    close("attention dv", &va, &vb, 1e-4);
}

#[test]
fn decode_and_optimiser_defaults_match_the_cpu() {
    let mut r = rng("decode-optim");
    let (rows, i) = (4, 6);
    let gu = f32s(&rand_vec(&mut r, rows * 2 * i));
    let (mut a, mut b) = (zeros(rows * i), zeros(rows * i));
    P.swiglu_packed(&gu, &mut a, i).unwrap();
    C.swiglu_packed(&gu, &mut b, i).unwrap();
    close("swiglu_packed", &a, &b, 1e-6);
    let (x, y, w) = (
        f32s(&rand_vec(&mut r, rows * i)),
        f32s(&rand_vec(&mut r, rows * i)),
        f32s(&rand_vec(&mut r, i)),
    );
    let (mut sa, mut na, mut sb, mut nb) = (
        zeros(rows * i),
        zeros(rows * i),
        zeros(rows * i),
        zeros(rows * i),
    );
    P.add_rms_norm((&x, Some(&y), &w), (&mut sa, &mut na), i, 1e-6)
        .unwrap();
    C.add_rms_norm((&x, Some(&y), &w), (&mut sb, &mut nb), i, 1e-6)
        .unwrap();
    close("add_rms_norm sum", &sa, &sb, 0.0);
    close("add_rms_norm normed", &na, &nb, 1e-5);
    let (mut ia, mut ib) = (
        CpuStorage::U32(vec![9; rows]),
        CpuStorage::U32(vec![9; rows]),
    );
    P.argmax_rows(&x, &mut ia, i).unwrap();
    C.argmax_rows(&x, &mut ib, i).unwrap();
    assert_eq!(ia, ib);
    let len = 37;
    let init = |r: &mut StdRng| f32s(&rand_vec(r, len));
    let (p0, g0) = (init(&mut r), init(&mut r));
    let v0 = f32s(
        &rand_vec(&mut r, len)
            .iter()
            .map(|v| v.abs())
            .collect::<Vec<_>>(),
    );
    let m0 = init(&mut r);
    let cfg = adamw_config(1e-2, 3);
    let scale = f32s(&[2.0, 0.5]);
    let state = (&p0, &m0, &v0, &g0);
    let [pa, ma, va] = adamw_on_copies(state, &scale, |b| P.adamw_step(b, cfg).unwrap());
    let [pb, mb, vb] = adamw_on_copies(state, &scale, |b| C.adamw_step(b, cfg).unwrap());
    close("adamw p", &pa, &pb, 1e-6);
    close("adamw m", &ma, &mb, 1e-6);
    close("adamw v", &va, &vb, 1e-6);
    let (mut la, mut lb) = (p0.clone(), p0.clone());
    P.lerp_params(&mut [&mut la], &[&g0], 0.3).unwrap();
    C.lerp_params(&mut [&mut lb], &[&g0], 0.3).unwrap();
    close("lerp", &la, &lb, 1e-6);
    let (mut ca, mut cb) = (zeros(2), zeros(2));
    P.clip_coefficient(&[&g0, &p0], 1.0, &mut ca).unwrap();
    C.clip_coefficient(&[&g0, &p0], 1.0, &mut cb).unwrap();
    close("clip", &ca, &cb, 0.0);
    let _ = P.synchronize();
}
