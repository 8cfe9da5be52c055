//! Packed causal attention (`causal_attention_packed_{fwd,bwd}`: q, k, v read where a fused
//! `[b, t, 3c]` projection holds them, the output written as `[b, t, c]`, the gradient in the
//! projection's layout) against the plain kernels on the permuted `[b·heads, t, d]` tensors,
//! which `nn_attention.rs` checks against the CPU reference. Both run the same arithmetic in the
//! same order, so they must agree bit for bit: forward output and lse, and dq, dk, dv. Fresh
//! random inputs, outputs poisoned with NaN, both head-width kernels, lengths that are not whole
//! tiles; typed errors for bad arguments. Tests named `gpu_*` skip without a GPU.

mod common;

use common::*;
use gpu_core::nn::attention::Packed;
use gpu_core::nn::attention::{AttnDims, AttnQkv, PackedSaved};
use gpu_core::testing::attention_outputs;
use gpu_core::Backend;
use gpu_cuda::testing::backend_or_skip;
use gpu_cuda::CudaBackend;

/// Block `which` (0 q, 1 k, 2 v) of a `[b, t, w·c]` buffer (`w` blocks) as `[b·h, t, d]`.
fn split(
    x: &[f32],
    (b, t, h, d): (usize, usize, usize, usize),
    w: usize,
    which: usize,
) -> Vec<f32> {
    let c = h * d;
    let mut out = Vec::with_capacity(b * h * t * d);
    for bi in 0..b {
        for hi in 0..h {
            for ti in 0..t {
                let row = (bi * t + ti) * w * c + which * c + hi * d;
                out.extend_from_slice(&x[row..row + d]);
            }
        }
    }
    out
}

/// `[b·h, t, d]` back to `[b, t, h·d]`.
fn merge(x: &[f32], (b, t, h, d): (usize, usize, usize, usize)) -> Vec<f32> {
    let mut out = vec![0.0; b * t * h * d];
    for bi in 0..b {
        for hi in 0..h {
            for ti in 0..t {
                let src = ((bi * h + hi) * t + ti) * d;
                let dst = (bi * t + ti) * h * d + hi * d;
                out[dst..dst + d].copy_from_slice(&x[src..src + d]);
            }
        }
    }
    out
}

fn case(gpu: &CudaBackend, rng: &mut rand::rngs::StdRng, dims: (usize, usize, usize, usize)) {
    let (b, t, h, d) = dims;
    let (n, c) = (b * h, h * d);
    let scale = 1.0 / (d as f32).sqrt();
    let qkv = random_vec(rng, b * t * 3 * c, 1.5);
    let dout = random_vec(rng, b * t * c, 1.0);
    let what = format!("b {b} t {t} heads {h} d {d}");
    // Plain kernels on the permuted tensors.
    let (q, k, v) = (
        up(gpu, &split(&qkv, dims, 3, 0)),
        up(gpu, &split(&qkv, dims, 3, 1)),
        up(gpu, &split(&qkv, dims, 3, 2)),
    );
    let plain = AttnQkv {
        q: &q,
        k: &k,
        v: &v,
    };
    let dout_p = up(gpu, &split(&dout, dims, 1, 0));
    let attn_dims = AttnDims { n, t, d, scale };
    let [out_p, lse_p, dq, dk, dv] =
        attention_outputs(gpu, plain, &dout_p, attn_dims, |len| poisoned(gpu, len)).unwrap();
    // Packed.
    let qkv_b = up(gpu, &qkv);
    let (mut out, mut lse) = (poisoned(gpu, b * t * c), poisoned(gpu, n * t));
    let p = Packed { b, t, heads: h, d };
    gpu.causal_attention_packed_fwd(&qkv_b, &mut out, &mut lse, p, scale, None)
        .unwrap();
    assert_eq!(
        bits(&down(gpu, &out)),
        bits(&merge(&down(gpu, &out_p), dims)),
        "{what}: out"
    );
    assert_eq!(
        bits(&down(gpu, &lse)),
        bits(&down(gpu, &lse_p)),
        "{what}: lse"
    );
    let mut dqkv = poisoned(gpu, b * t * 3 * c);
    let dout_b = up(gpu, &dout);
    gpu.causal_attention_packed_bwd(
        &qkv_b,
        PackedSaved {
            out: &out,
            lse: &lse,
            dout: &dout_b,
        },
        &mut dqkv,
        p,
        scale,
        None,
    )
    .unwrap();
    let got = down(gpu, &dqkv);
    for (i, want) in [dq, dk, dv].iter().enumerate() {
        assert_eq!(
            bits(&split(&got, dims, 3, i)),
            bits(&down(gpu, want)),
            "{what}: gradient block {i}"
        );
    }
}

#[test]
fn gpu_packed_attention_is_the_plain_kernels_on_permuted_tensors() {
    let (gpu, mut r) = skip_unless!(gpu_and_rng(
        "gpu_packed_attention_is_the_plain_kernels_on_permuted_tensors"
    ));
    // The GPT's shape (6 heads of 64), the 128-wide kernel, ragged lengths, one head, d = 4.
    for dims in [
        (2, 256, 6, 64),
        (1, 130, 2, 128),
        (3, 37, 3, 64),
        (2, 5, 1, 4),
        (1, 33, 4, 96),
        (2, 100, 2, 32),
    ] {
        case(&gpu, &mut r, dims);
    }
}

#[test]
fn gpu_packed_attention_rejects_bad_arguments() {
    let test = "gpu_packed_attention_rejects_bad_arguments";
    let gpu = skip_unless!(backend_or_skip(test));
    let (b, t, h, d) = (2, 8, 2, 8);
    let c = h * d;
    let qkv = up(&gpu, &vec![0.5; b * t * 3 * c]);
    let mut out = poisoned(&gpu, b * t * c);
    let mut lse = poisoned(&gpu, b * h * t);
    let mut fwd = |qkv: &gpu_cuda::CudaBuffer, b, t, heads, d, s| {
        let p = Packed { b, t, heads, d };
        gpu.causal_attention_packed_fwd(qkv, &mut out, &mut lse, p, s, None)
    };
    let short = up(&gpu, &vec![0.5; b * t * 3 * c - 1]);
    let ints = gpu.upload(&vec![0u32; b * t * 3 * c]).unwrap();
    for (what, r) in [
        ("short qkv", fwd(&short, b, t, h, d, 1.0)),
        ("u32 qkv", fwd(&ints, b, t, h, d, 1.0)),
        ("d = 2", fwd(&qkv, b, t, 2 * h * d / 2, 2, 1.0)),
        ("d = 6", fwd(&qkv, b, t, h, 6, 1.0)),
        ("no heads", fwd(&qkv, b, t, 0, d, 1.0)),
        ("NaN scale", fwd(&qkv, b, t, h, d, f32::NAN)),
        ("overflowing sizes", fwd(&qkv, usize::MAX, t, h, d, 1.0)),
    ] {
        assert!(r.is_err(), "{what} was accepted");
    }
    assert!(
        down(&gpu, &out).iter().all(|v| v.is_nan()),
        "a refused call wrote"
    );
    let p = Packed { b, t, heads: h, d };
    gpu.causal_attention_packed_fwd(&qkv, &mut out, &mut lse, p, 1.0, None)
        .unwrap();
    let dout = up(&gpu, &vec![1.0; b * t * c]);
    let mut small = poisoned(&gpu, b * t * c);
    let e = gpu
        .causal_attention_packed_bwd(
            &qkv,
            PackedSaved {
                out: &out,
                lse: &lse,
                dout: &dout,
            },
            &mut small,
            p,
            1.0,
            None,
        )
        .unwrap_err();
    assert!(e.to_string().contains("dqkv"), "{e}");
}
