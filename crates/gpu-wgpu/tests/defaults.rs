//! Every op family that WgpuBackend takes from gpu-core's defaults (built on its WGSL
//! primitives), against the CPU backend's own op on random inputs: the cases and bounds of
//! gpu-core's `tests/primitives_only.rs`. Each case is one generic function run on both
//! backends; outputs are compared element by element.
//!
//! Bounds: ops whose defaults only move or pick elements (max backward, argmax, the sums of
//! add_rms_norm) are exact; the clipping coefficient, computed on the device, within its own
//! stated bound. The rest run in f32 where the CPU accumulates
//! in f64 and rounds once; each output must be within `rtol·scale` of the CPU's, `scale` the
//! largest magnitude of that output, with `rtol` = 1e-5 for the row ops and 1e-6 for AdamW and
//! lerp (a few f32 roundings per element) and 1e-4 for attention (sums of `t` products), as
//! primitives_only.rs. The reductions here are tree sums of f32 rather than the CPU's.

mod common;

use common::{get, out, rng, up};
use gpu_core::nn::attention::{AttnDims, AttnQkv};
use gpu_core::nn::rows::{LayerNormBwdIn, LogitsIn, RmsNormBwdIn, RowBwdIn};
use gpu_core::nn::{NnOps, ReduceKind};
use gpu_core::testing::{adamw_config, adamw_one, attention_outputs};
use gpu_core::CpuBackend;
use gpu_wgpu::testing::backend_or_skip;
use rand::rngs::StdRng;
use rand::Rng;

/// Named outputs of one case with their relative bound.
type Outs = Vec<(&'static str, f32, Vec<f32>)>;

fn vecs(r: &mut StdRng, n: usize, k: usize) -> Vec<Vec<f32>> {
    (0..k).map(|_| common::randn(r, n, 2.0)).collect()
}

fn check(test: &str, cpu: Outs, gpu: Outs) {
    assert_eq!(cpu.len(), gpu.len());
    for ((name, rtol, w), (_, _, g)) in cpu.iter().zip(&gpu) {
        assert_eq!(g.len(), w.len(), "{test} {name}: lengths");
        let scale = w.iter().fold(1e-30f32, |m, v| m.max(v.abs()));
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            assert!(
                (a - b).abs() <= rtol * scale || common::same(*a, *b),
                "{test} {name}[{i}]: wgpu {a} vs cpu {b} (scale {scale}, rtol {rtol})"
            );
        }
        eprintln!("{test} {name}: {} elements within {rtol}·{scale}", w.len());
    }
}

fn elementwise<B: NnOps>(b: &B, x: &[f32], dy: &[f32]) -> Outs {
    let (outer, n, inner) = (3, 7, 5);
    let xb = up(b, x);
    let mut a = out(b, x.len());
    b.affine(&xb, 1.5, -0.25, &mut a).unwrap();
    let mut y = out(b, outer * inner);
    b.reduce_axis(ReduceKind::Max, &xb, outer, n, inner, &mut y)
        .unwrap();
    let mut dx = out(b, x.len());
    b.max_axis_bwd((&xb, &y, &up(b, dy)), [outer, n, inner], &mut dx)
        .unwrap();
    vec![
        ("affine", 2e-7, get(b, &a)),
        ("max", 0.0, get(b, &y)),
        ("max_axis_bwd", 0.0, get(b, &dx)),
    ]
}

fn rows<B: NnOps>(b: &B, x: &[f32], dy: &[f32], t: &[u32], dl: &[f32], cols: usize) -> Outs {
    let (n, rows) = (x.len(), x.len() / cols);
    let (xb, dyb) = (up(b, x), up(b, dy));
    let mut res = Outs::new();
    let mut y = out(b, n);
    b.softmax_fwd(&xb, &mut y, cols).unwrap();
    let mut d = out(b, n);
    b.softmax_bwd(RowBwdIn { y: &y, dy: &dyb }, &mut d, cols)
        .unwrap();
    res.push(("softmax_fwd", 1e-5, get(b, &y)));
    res.push(("softmax_bwd", 1e-5, get(b, &d)));
    b.log_softmax_fwd(&xb, &mut y, cols).unwrap();
    b.log_softmax_bwd(RowBwdIn { y: &y, dy: &dyb }, &mut d, cols)
        .unwrap();
    res.push(("log_softmax_fwd", 1e-5, get(b, &y)));
    res.push(("log_softmax_bwd", 1e-5, get(b, &d)));
    let tb = b.upload(t).unwrap();
    let mut l = out(b, rows);
    b.cross_entropy_fwd(LogitsIn::new(&xb, &tb, cols), &mut l)
        .unwrap();
    b.cross_entropy_bwd(LogitsIn::new(&xb, &tb, cols), &up(b, dl), &mut d)
        .unwrap();
    res.push(("cross_entropy_fwd", 1e-5, get(b, &l)));
    res.push(("cross_entropy_bwd", 1e-5, get(b, &d)));
    let bad = b.upload(&vec![cols as u32; rows]).unwrap();
    // Refused by the call (CPU), or reported by the next wait (wgpu checks on the device).
    assert!(
        b.cross_entropy_fwd(LogitsIn::new(&xb, &bad, cols), &mut l)
            .is_err()
            || b.synchronize().is_err()
    );
    res
}

fn norms<B: NnOps>(b: &B, x: &[f32], dy: &[f32], w: &[f32], bias: &[f32], cols: usize) -> Outs {
    let (n, rows) = (x.len(), x.len() / cols);
    let (xb, dyb, wb) = (up(b, x), up(b, dy), up(b, w));
    let (mut y, mut mean, mut rstd) = (out(b, n), out(b, rows), out(b, rows));
    b.layernorm_fwd(
        (&xb, &wb, &up(b, bias)),
        (&mut y, &mut mean, &mut rstd),
        cols,
        1e-5,
    )
    .unwrap();
    let mut res: Outs = vec![
        ("layernorm y", 1e-5, get(b, &y)),
        ("layernorm rstd", 1e-5, get(b, &rstd)),
    ];
    let (mut dx, mut dw, mut db) = (out(b, n), out(b, cols), out(b, cols));
    b.layernorm_bwd(
        LayerNormBwdIn {
            x: &xb,
            w: &wb,
            mean: &mean,
            rstd: &rstd,
            dy: &dyb,
        },
        (&mut dx, &mut dw, &mut db),
        cols,
    )
    .unwrap();
    res.push(("layernorm dx", 1e-5, get(b, &dx)));
    res.push(("layernorm dw", 1e-5, get(b, &dw)));
    res.push(("layernorm db", 1e-5, get(b, &db)));
    b.rmsnorm_fwd(&xb, &wb, &mut y, &mut rstd, cols, 1e-6)
        .unwrap();
    res.push(("rmsnorm y", 1e-5, get(b, &y)));
    b.rmsnorm_bwd(
        RmsNormBwdIn {
            x: &xb,
            w: &wb,
            rstd: &rstd,
            dy: &dyb,
        },
        (&mut dx, &mut dw),
        cols,
    )
    .unwrap();
    res.push(("rmsnorm dx", 1e-5, get(b, &dx)));
    res.push(("rmsnorm dw", 1e-5, get(b, &dw)));
    for (inverse, name) in [(false, "rope"), (true, "rope inverse")] {
        b.rope(&xb, &mut y, [1, rows, cols], (10000.0, inverse))
            .unwrap();
        res.push((name, 1e-6, get(b, &y)));
    }
    res
}

fn attention<B: NnOps>(b: &B, qkvd: &[Vec<f32>], [n, t, d]: [usize; 3]) -> Outs {
    let scale = 1.0 / (d as f32).sqrt();
    let [q, k, v, dout] = [0, 1, 2, 3].map(|i| up(b, &qkvd[i]));
    let inputs = AttnQkv {
        q: &q,
        k: &k,
        v: &v,
    };
    let dims = AttnDims { n, t, d, scale };
    let [o, lse, dq, dk, dv] =
        attention_outputs(b, inputs, &dout, dims, |len| out(b, len)).unwrap();
    vec![
        ("attention out", 1e-4, get(b, &o)),
        ("attention lse", 1e-5, get(b, &lse)),
        ("attention dq", 1e-4, get(b, &dq)),
        ("attention dk", 1e-4, get(b, &dk)),
        ("attention dv", 1e-4, get(b, &dv)),
    ]
}

fn decode<B: NnOps>(b: &B, v: &[Vec<f32>], rows: usize, i: usize) -> Outs {
    let mut a = out(b, rows * i);
    b.swiglu_packed(&up(b, &v[0]), &mut a, i).unwrap();
    let (x, y, w) = (up(b, &v[1]), up(b, &v[2]), up(b, &v[3][..i]));
    let (mut s, mut nrm) = (out(b, rows * i), out(b, rows * i));
    b.add_rms_norm((&x, Some(&y), &w), (&mut s, &mut nrm), i, 1e-6)
        .unwrap();
    // Without the residual: the sum is x itself.
    let (mut s0, mut n0) = (out(b, rows * i), out(b, rows * i));
    b.add_rms_norm((&x, None, &w), (&mut s0, &mut n0), i, 1e-6)
        .unwrap();
    let mut ids = b.upload(&vec![9u32; rows]).unwrap();
    b.argmax_rows(&x, &mut ids, i).unwrap();
    let ids: Vec<u32> = b.download(&ids).unwrap();
    vec![
        ("swiglu_packed", 1e-6, get(b, &a)),
        ("add_rms_norm sum", 0.0, get(b, &s)),
        ("add_rms_norm normed", 1e-5, get(b, &nrm)),
        ("add_rms_norm sum, no y", 0.0, get(b, &s0)),
        ("add_rms_norm normed, no y", 1e-5, get(b, &n0)),
        ("argmax_rows", 0.0, ids.iter().map(|&v| v as f32).collect()),
    ]
}

fn optim<B: NnOps>(b: &B, v: &[Vec<f32>]) -> Outs {
    let [mut p, g, mut m, mut var] = [0, 1, 2, 3].map(|i| up(b, &v[i]));
    let cfg = adamw_config(1e-2, 3);
    let scale = up(b, &[2.0, 0.5]);
    adamw_one((&mut p, &g, &mut m, &mut var), 0.1, Some(&scale), |bufs| {
        b.adamw_step(bufs, cfg)
    })
    .unwrap();
    let mut res: Outs = vec![
        ("adamw p", 1e-6, get(b, &p)),
        ("adamw m", 1e-6, get(b, &m)),
        ("adamw v", 1e-6, get(b, &var)),
    ];
    let mut l = up(b, &v[0]);
    b.lerp_params(&mut [&mut l], &[&g], 0.3).unwrap();
    res.push(("lerp", 1e-6, get(b, &l)));
    let mut c = out(b, 2);
    b.clip_coefficient(&[&g, &up(b, &v[0])], 1.0, &mut c)
        .unwrap();
    // The coefficient on the device: an f32 tree sum of the 74 squares, a sqrt and a division
    // (each within 2.5 ulp by WGSL): ≤ (74/2 + 6)·2^-24 relative ≈ 2.6e-6; NVIDIA's driver
    // is 1 ulp off the CPU's here.
    res.push(("clip", 3e-6, get(b, &c)));
    b.synchronize().unwrap();
    res
}

#[test]
fn elementwise_defaults_match_the_cpu() {
    let Some(w) = backend_or_skip("elementwise_defaults_match_the_cpu") else {
        return;
    };
    let mut r = rng("elementwise_defaults");
    let mut x = common::randn(&mut r, 3 * 7 * 5, 2.0);
    x[4] = f32::NAN;
    let dy = common::randn(&mut r, 15, 2.0);
    check(
        "elementwise",
        elementwise(&CpuBackend, &x, &dy),
        elementwise(&w, &x, &dy),
    );
}

#[test]
fn row_defaults_match_the_cpu() {
    let Some(w) = backend_or_skip("row_defaults_match_the_cpu") else {
        return;
    };
    let mut r = rng("row_defaults");
    // The primitives_only shape, and one past the workgroup.
    for (rows, cols) in [(6, 11), (3, 300)] {
        let [x, dy] = [0; 2].map(|_| common::randn(&mut r, rows * cols, 2.0));
        let t: Vec<u32> = (0..rows).map(|_| r.random_range(0..cols as u32)).collect();
        let dl = common::randn(&mut r, rows, 2.0);
        let cpu = rows_case(&CpuBackend, &x, &dy, &t, &dl, cols);
        check("rows", cpu, rows_case(&w, &x, &dy, &t, &dl, cols));
    }
}

fn rows_case<B: NnOps>(b: &B, x: &[f32], dy: &[f32], t: &[u32], dl: &[f32], c: usize) -> Outs {
    rows(b, x, dy, t, dl, c)
}

#[test]
fn norm_and_rope_defaults_match_the_cpu() {
    let Some(w) = backend_or_skip("norm_and_rope_defaults_match_the_cpu") else {
        return;
    };
    let mut r = rng("norm_defaults");
    let (rows, cols) = (5, 16);
    let [x, dy] = [0; 2].map(|_| common::randn(&mut r, rows * cols, 2.0));
    let [wt, bias] = [0; 2].map(|_| common::randn(&mut r, cols, 2.0));
    let cpu = norms(&CpuBackend, &x, &dy, &wt, &bias, cols);
    check("norms", cpu, norms(&w, &x, &dy, &wt, &bias, cols));
}

#[test]
fn attention_defaults_match_the_cpu() {
    let Some(w) = backend_or_skip("attention_defaults_match_the_cpu") else {
        return;
    };
    let mut r = rng("attention_defaults");
    let dims = [3, 9, 8];
    let v = vecs(&mut r, dims.iter().product(), 4);
    check(
        "attention",
        attention(&CpuBackend, &v, dims),
        attention(&w, &v, dims),
    );
}

#[test]
fn decode_and_optimiser_defaults_match_the_cpu() {
    let Some(w) = backend_or_skip("decode_and_optimiser_defaults_match_the_cpu") else {
        return;
    };
    let mut r = rng("decode_optim_defaults");
    // A row narrower than a workgroup of 64, and one that loops over it.
    for (rows, i) in [(4, 6), (3, 300), (2, 2048), (1, 4099)] {
        let mut v = vecs(&mut r, rows * 2 * i, 4);
        v[1].truncate(rows * i);
        v[2].truncate(rows * i);
        check(
            "decode",
            decode(&CpuBackend, &v, rows, i),
            decode(&w, &v, rows, i),
        );
    }
    let mut o = vecs(&mut r, 37, 4);
    o[3].iter_mut().for_each(|x| *x = x.abs());
    check("optim", optim(&CpuBackend, &o), optim(&w, &o));
}
