//! Attention-probability dropout on CUDA (`causal_attention_packed{,_bf16}_{fwd,bwd}` with an
//! `AttnDropout`: the `*_drop` kernels) against the CPU backends' packed attention with the same
//! mask (which `gpu-core`'s `attention_dropout` tests check against a naive reference, the
//! mask's statistics and finite differences): f32 on both head-width kernels, bf16 on tensor
//! cores; `p = 0` gives the plain kernels' bits; a device seed offset gives the bits of the
//! summed seed. Tests named `gpu_*` skip without a GPU; every random case prints its seed.

mod common;

use common::*;
use gpu_core::cpu::fast::{with_mode, CpuMode};
use gpu_core::nn::attention::PackedSaved;
use gpu_core::nn::attention::{AttnDropout, Packed};
use gpu_core::{Backend, CpuBackend, DType};
use gpu_cuda::{CudaBackend, DeviceAttnDropout};
use rand::Rng;

/// `[out, lse, dqkv]` of the packed attention of `qkv`, `dout` (f32 values, uploaded as
/// `dtype`) on backend `b` through `fwd`/`bwd`.
type Outs = [Vec<f32>; 3];

/// [`run_cpu`]'s and [`run_gpu`]'s calls on backend `$b` of type `$B` (a macro: the packed
/// attention methods are each backend's own, with its own dropout type; no trait covers them):
/// the `_bf16` kernels for bf16, the f32 ones otherwise, forward then backward.
macro_rules! run_packed {
    ($B:ty, $b:expr, ($qkv:expr, $dout:expr), $p:expr, $dtype:expr, $drop:expr) => {{
        let (b, qkv, dout, p, dtype, drop): (&$B, &[f32], &[f32], Packed, DType, _) =
            ($b, $qkv, $dout, $p, $dtype, $drop);
        let scale = 1.0 / (p.d as f32).sqrt();
        let (x, g) = (put(b, qkv, dtype), put(b, dout, dtype));
        let mut out = b.allocate(dtype, p.b * p.t * p.c()).unwrap();
        let mut lse = b.allocate(DType::F32, p.n() * p.t).unwrap();
        let mut dq = b.allocate(dtype, qkv.len()).unwrap();
        let bf16 = dtype == DType::BF16;
        let fwd = if bf16 {
            <$B>::causal_attention_packed_bf16_fwd
        } else {
            <$B>::causal_attention_packed_fwd
        };
        let bwd = if bf16 {
            <$B>::causal_attention_packed_bf16_bwd
        } else {
            <$B>::causal_attention_packed_bwd
        };
        fwd(b, &x, &mut out, &mut lse, p, scale, drop).unwrap();
        let saved = PackedSaved {
            out: &out,
            lse: &lse,
            dout: &g,
        };
        bwd(b, &x, saved, &mut dq, p, scale, drop).unwrap();
        [get(b, &out), get(b, &lse), get(b, &dq)]
    }};
}

fn run_cpu(qkv: &[f32], dout: &[f32], p: Packed, dtype: DType, drop: Option<AttnDropout>) -> Outs {
    let cpu = CpuBackend;
    with_mode(CpuMode::Exact, || {
        run_packed!(CpuBackend, &cpu, (qkv, dout), p, dtype, drop)
    })
}

fn run_gpu(
    gpu: &CudaBackend,
    (qkv, dout): (&[f32], &[f32]),
    p: Packed,
    dtype: DType,
    drop: Option<DeviceAttnDropout<'_>>,
) -> Outs {
    run_packed!(CudaBackend, gpu, (qkv, dout), p, dtype, drop)
}

fn rms(x: &[f32]) -> f64 {
    (x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / x.len().max(1) as f64).sqrt()
}

/// `|got − want| <= rtol·(|want| + rms(want))` elementwise (the f32 attention tests' bound,
/// `nn_attention.rs`'s `assert_near`), with the norm-wise relative error below `rtol` too.
fn near(what: &str, got: &[f32], want: &[f32], rtol: f64) {
    assert_close(what, got, want, rtol, rtol * rms(want).max(1e-2));
}

/// The kernels with dropout in `dtype` against [`run_cpu`] on each case `(b, t, heads, d, p)`:
/// every output [`near`] the reference within `rtol`.
fn dropout_matches_the_cpu(
    test: &str,
    dtype: DType,
    cases: &[(usize, usize, usize, usize, f32)],
    rtol: f64,
) {
    let (gpu, mut r, seed) = skip_unless!(gpu_rng_and_seed(test));
    for &(b, t, heads, d, pd) in cases {
        let p = Packed { b, t, heads, d };
        let qkv = random_vec(&mut r, b * t * 3 * p.c(), 1.5);
        let dout = random_vec(&mut r, b * t * p.c(), 1.0);
        let drop = AttnDropout {
            p: pd,
            seed: r.random(),
        };
        let what = format!("{dtype} {p:?} {drop:?} (test seed {seed})");
        let want = run_cpu(&qkv, &dout, p, dtype, Some(drop));
        let got = run_gpu(&gpu, (&qkv, &dout), p, dtype, Some(drop.into()));
        for (k, name) in ["out", "lse", "dqkv"].iter().enumerate() {
            near(&format!("{what} {name}"), &got[k], &want[k], rtol);
        }
    }
}

/// f32 kernels with dropout against the CPU reference, within the f32 attention tests' bound
/// (rtol 1e-4 against `|want| + rms(want)`: the kernels' f32 sums of at most `t + d` terms of
/// unit-size values, `(t + d)·2^-24 < 2e-5`, plus exp2f's 2 ulp, with a 5x margin). A wrong
/// mask entry moves an element by a whole probability, far outside it.
#[test]
fn gpu_f32_attention_dropout_matches_the_cpu_reference() {
    dropout_matches_the_cpu(
        "gpu_f32_attention_dropout_matches_the_cpu_reference",
        DType::F32,
        &[
            (2, 37, 3, 16, 0.2f32),
            (1, 70, 2, 96, 0.1),
            (2, 130, 2, 64, 0.5),
        ],
        1e-4,
    );
}

/// bf16 tensor-core kernels with dropout against the bf16 CPU reference (the same rounding
/// points). Bound: P·f and dS round to bf16 (u = 2^-8) as operands and each output once, and
/// the kernels may land an operand one bf16 ulp from the reference (the running max; module docs
/// of `gpu_core::cpu::attention_bf16`): 4u = 2^-6 of `|want| + rms(want)` covers the output's
/// rounding, one operand ulp on every term and the f32 accumulation (`nn_attention_bf16.rs`
/// holds the plain kernels to a per-element form of the same terms).
#[test]
fn gpu_bf16_attention_dropout_matches_its_reference() {
    dropout_matches_the_cpu(
        "gpu_bf16_attention_dropout_matches_its_reference",
        DType::BF16,
        &[(2, 77, 2, 64, 0.2f32), (1, 200, 3, 64, 0.6)],
        1.0 / 64.0,
    );
}

/// `p = 0` runs the plain kernels (the bits of no dropout), f32 and bf16; a device seed offset
/// gives the bits of the summed seed, forward and backward.
#[test]
fn gpu_zero_dropout_is_plain_and_offsets_add_to_the_seed() {
    let test = "gpu_zero_dropout_is_plain_and_offsets_add_to_the_seed";
    let (gpu, mut r, seed) = skip_unless!(gpu_rng_and_seed(test));
    let p = Packed {
        b: 2,
        t: 70,
        heads: 2,
        d: 64,
    };
    let qkv = random_vec(&mut r, p.b * p.t * 3 * p.c(), 1.5);
    let dout = random_vec(&mut r, p.b * p.t * p.c(), 1.0);
    let x = (&qkv[..], &dout[..]);
    let (s, off): (u64, u64) = (r.random(), r.random());
    let offsets = gpu
        .upload(&[0u32, 0, off as u32, (off >> 32) as u32])
        .unwrap();
    for dtype in [DType::F32, DType::BF16] {
        let what = format!("{dtype} (test seed {seed})");
        let zero = AttnDropout { p: 0.0, seed: s };
        let plain = run_gpu(&gpu, x, p, dtype, None);
        let z = run_gpu(&gpu, x, p, dtype, Some(zero.into()));
        for k in 0..3 {
            assert_eq!(bits(&z[k]), bits(&plain[k]), "{what}: p = 0, output {k}");
        }
        let summed = AttnDropout {
            p: 0.3,
            seed: s.wrapping_add(off),
        };
        let direct = run_gpu(&gpu, x, p, dtype, Some(summed.into()));
        let via = DeviceAttnDropout {
            drop: AttnDropout { p: 0.3, seed: s },
            offset: Some((&offsets, 1)),
        };
        let via = run_gpu(&gpu, x, p, dtype, Some(via));
        for k in 0..3 {
            assert_eq!(
                bits(&via[k]),
                bits(&direct[k]),
                "{what}: offset, output {k}"
            );
        }
    }
}
