//! The fused causal attention (`src/attention.rs`: q·kᵀ, one row kernel for the masked
//! softmax and its dropout, the products) against the CPU backend's packed attention, forward
//! and backward, f32 and bf16, with and without dropout, on fresh random inputs (the seed is
//! printed; replay with `HYBRID_TEST_SEED`) of lengths around the kernel's 64 threads a row;
//! the dropout mask bit for bit; a NaN key past the diagonal changes nothing (the mask ignores
//! what stands there), one in a query poisons its row only. Without an adapter it prints
//! `SKIP` and returns (fails with `HYBRID_REQUIRE_WGPU=1`).

mod common;

use common::{backend_and_rng, randn, U};
use gpu_core::backend::BufferInfo;
use gpu_core::nn::attention::{AttnDropout, Packed, PackedCall, PackedDrop, PackedSaved};
use gpu_core::nn::AttentionOps;
use gpu_core::testing::{assert_output_is_the_mask, mask_revealing_qkv};
use gpu_core::{CpuBackend, DType};
use gpu_wgpu::testing::backend_or_skip;

/// `(out, lse, dqkv)` of the packed forward and backward on `be`, as f32.
fn packed<B: AttentionOps>(
    be: &B,
    (qkv, dout): (&[f32], &[f32]),
    dtype: DType,
    (p, drop): (Packed, Option<AttnDropout>),
) -> [Vec<f32>; 3] {
    let up = |x: &[f32]| {
        let wide = be.upload(x).unwrap();
        let mut b = be.allocate(dtype, x.len()).unwrap();
        be.cast(&wide, &mut b).unwrap();
        b
    };
    let get = |b: &B::Buffer| {
        let mut wide = be.allocate(DType::F32, b.len()).unwrap();
        be.cast(b, &mut wide).unwrap();
        be.download::<f32>(&wide).unwrap()
    };
    let (qkv, dout) = (up(qkv), up(dout));
    let call = PackedCall {
        dims: p,
        scale: 1.0 / (p.d as f32).sqrt(),
        drop: drop.map(PackedDrop::from),
    };
    let mut out = be.allocate(dtype, p.b * p.t * p.c()).unwrap();
    let mut lse = be.allocate(DType::F32, p.n() * p.t).unwrap();
    be.attention_packed_fwd(&qkv, (&mut out, &mut lse), call)
        .unwrap();
    let mut dqkv = be.allocate(dtype, qkv.len()).unwrap();
    let saved = PackedSaved {
        out: &out,
        lse: &lse,
        dout: &dout,
    };
    be.attention_packed_bwd(&qkv, saved, &mut dqkv, call)
        .unwrap();
    [get(&out), get(&lse), get(&dqkv)]
}

/// `got` against `want` norm-wise per tensor: `|g − w| <= tol·max|w|` (NaN where NaN).
fn check(what: &str, got: &[f32], want: &[f32], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}");
    let scale = want
        .iter()
        .filter(|v| v.is_finite())
        .fold(0.0f64, |a, &v| a.max((v as f64).abs()));
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if w.is_nan() {
            assert!(g.is_nan(), "{what}[{i}]: {g} against NaN");
            continue;
        }
        let err = (g as f64 - w as f64).abs();
        assert!(
            err <= tol * scale,
            "{what}[{i}]: {g} against {w} (tol {})",
            tol * scale
        );
    }
}

const SHAPES: [Packed; 7] = [
    Packed {
        b: 0,
        t: 5,
        heads: 1,
        d: 4,
    },
    Packed {
        b: 1,
        t: 1,
        heads: 1,
        d: 4,
    },
    Packed {
        b: 2,
        t: 7,
        heads: 2,
        d: 8,
    },
    Packed {
        b: 1,
        t: 63,
        heads: 1,
        d: 16,
    },
    Packed {
        b: 2,
        t: 65,
        heads: 3,
        d: 8,
    },
    Packed {
        b: 1,
        t: 130,
        heads: 2,
        d: 32,
    },
    Packed {
        b: 2,
        t: 66,
        heads: 2,
        d: 64,
    },
];

/// Bound (f32): each output is a few chained f32 sums of `t` or `d` terms (scores, the
/// softmax's sum, P·v, dP, the row term, dS·k) against the CPU's own f32 sums in another
/// order: `(8(t + d) + 64)·2^-24` of each tensor's largest magnitude (softmax weights are at
/// most 1, so the terms are bounded by that scale). bf16: the CPU rounds the same f32 values
/// to bf16 once, so two neighbouring bf16 values: 2^-7 (the CPU's bf16 attention takes d = 64
/// only: the other shapes run in f32).
#[test]
fn fused_packed_attention_matches_the_cpu() {
    let name = "fused_packed_attention_matches_the_cpu";
    let Some((g, mut r)) = backend_and_rng(name) else {
        return;
    };
    for p in SHAPES {
        let qkv = randn(&mut r, p.b * p.t * 3 * p.c(), 2.0);
        let dout = randn(&mut r, p.b * p.t * p.c(), 1.0);
        let drops = [
            None,
            Some(AttnDropout {
                p: 0.2,
                seed: 0x5eed_1234_abcd,
            }),
        ];
        let dtypes = if p.d == 64 {
            vec![DType::F32, DType::BF16]
        } else {
            vec![DType::F32]
        };
        for (dtype, drop) in dtypes.into_iter().flat_map(|d| drops.map(|x| (d, x))) {
            let what = format!("{p:?} {dtype} {drop:?}");
            let got = packed(&g, (&qkv, &dout), dtype, (p, drop));
            let want = packed(&CpuBackend, (&qkv, &dout), dtype, (p, drop));
            let tol = match dtype {
                DType::F32 => (8.0 * (p.t + p.d) as f64 + 64.0) * U,
                _ => 1.0 / 128.0,
            };
            for (i, part) in ["out", "lse", "dqkv"].iter().enumerate() {
                let tol = if i == 1 {
                    (8.0 * (p.t + p.d) as f64 + 64.0) * U
                } else {
                    tol
                };
                check(&format!("{what} {part}"), &got[i], &want[i], tol);
            }
        }
    }
}

/// With `q = k = 0` the probabilities of query `i` are `1/(i+1)`, and with `v` of head `h`
/// holding key `j`'s one-hot the output is the dropped probability matrix: the mask, entry by
/// entry, is `AttnDropout::keep`'s.
#[test]
fn the_attention_dropout_mask_is_the_cpus_bit_for_bit() {
    let name = "the_attention_dropout_mask_is_the_cpus_bit_for_bit";
    let Some(g) = backend_or_skip(name) else {
        return;
    };
    let p = Packed {
        b: 3,
        t: 70,
        heads: 2,
        d: 128,
    };
    let qkv = mask_revealing_qkv(p);
    let dout = vec![0.0f32; p.b * p.t * p.c()];
    let drop = AttnDropout {
        p: 0.3,
        seed: gpu_core::testing::test_seed(name),
    };
    let [out, _, _] = packed(&g, (&qkv, &dout), DType::F32, (p, Some(drop)));
    let kept = assert_output_is_the_mask("wgpu", &out, p, drop);
    println!("{kept} kept");
}

/// A NaN in key 3 of head 0 leaves queries 0–2 of that head as the CPU computes them
/// (finite); a NaN in query 5 of head 1 makes that row's output and lse NaN, as on the CPU.
#[test]
fn poisoned_keys_past_the_diagonal_change_nothing() {
    let name = "poisoned_keys_past_the_diagonal_change_nothing";
    let Some((g, mut r)) = backend_and_rng(name) else {
        return;
    };
    let p = Packed {
        b: 1,
        t: 9,
        heads: 2,
        d: 8,
    };
    let (c, ld) = (p.c(), 3 * p.c());
    let mut qkv = randn(&mut r, p.t * ld, 2.0);
    qkv[3 * ld + c] = f32::NAN; // key 3, head 0
    qkv[5 * ld + p.d] = f32::NAN; // query 5, head 1
    let dout = randn(&mut r, p.t * c, 1.0);
    let got = packed(&g, (&qkv, &dout), DType::F32, (p, None));
    let want = packed(&CpuBackend, (&qkv, &dout), DType::F32, (p, None));
    for i in 0..3 {
        let row = &got[0][i * c..][..p.d];
        assert!(
            row.iter().all(|v| v.is_finite()),
            "query {i} of head 0: {row:?}"
        );
        assert!(got[1][i].is_finite(), "lse of query {i}");
    }
    assert!(got[0][5 * c + p.d..][..p.d].iter().all(|v| v.is_nan()));
    assert!(got[1][p.t + 5].is_nan());
    let tol = (8.0 * (p.t + p.d) as f64 + 64.0) * U;
    check("out", &got[0], &want[0], tol);
    check("lse", &got[1], &want[1], tol);
}
