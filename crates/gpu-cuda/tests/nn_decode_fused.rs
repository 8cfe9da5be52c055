//! The fused ops of a decode step (`DecodeOps::add_rms_norm`, `DecodeOps::swiglu_packed`) on
//! CUDA against the CPU reference (f64, one rounding), on fresh random inputs (printed,
//! replayable seed), every f32/bf16 combination. Tests named `gpu_*` skip without a GPU.
//! Bounds (u = 2^-24):
//! - `sum = x + y`: both round the exact sum once to f32: equal bit for bit;
//! - `normed`: the kernel's sum of `cols` squares (fmaf, tree) is within `cols·u` relative
//!   (non-negative terms), the mean, `+ eps` and `rsqrtf` (2 ulp) add `4u`, the square root
//!   halves the relative error of its argument, and the two products add `2u`: within
//!   `(cols/2 + 8)·u` of the reference, relative; a bf16 output adds one bf16 ulp (`2^-7`,
//!   both sides rounding to nearest from values that may straddle a tie);
//! - `swiglu_packed`: `expf` (2 ulp), `1 +`, the division and the product: within `8u`
//!   relative, plus one bf16 ulp for a bf16 output.

mod common;

use common::*;
use gpu_core::nn::decode::DecodeOps;
use gpu_core::{Backend, CpuBackend, DType};
use gpu_cuda::testing::backend_or_skip;

const U: f64 = 1.0 / (1u64 << 24) as f64;
const BF16_ULP: f64 = 1.0 / 128.0;
const DTYPES: [DType; 2] = [DType::F32, DType::BF16];

/// `|got − want| ≤ rel·|want| + 1e-30` elementwise, with the first offender named.
fn within(what: &str, got: &[f32], want: &[f32], rel: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let bound = rel * (w as f64).abs() + 1e-30;
        assert!(
            ((g as f64) - (w as f64)).abs() <= bound,
            "{what}: element {i}: {g} vs {w} (bound {bound:e})"
        );
    }
}

#[test]
fn gpu_add_rms_norm_matches_cpu() {
    let (gpu, mut rng) = skip_unless!(gpu_and_rng("gpu_add_rms_norm_matches_cpu"));
    for &(rows, cols) in &[(1usize, 64usize), (3, 1000), (16, 2048), (2, 4099), (5, 1)] {
        let x = random_vec(&mut rng, rows * cols, 3.0);
        let y = random_vec(&mut rng, rows * cols, 3.0);
        let w = random_vec(&mut rng, cols, 2.0);
        for y_dtype in [None, Some(DType::F32), Some(DType::BF16)] {
            for out in DTYPES {
                macro_rules! go {
                    ($be:expr) => {{
                        let be = $be;
                        let (xb, wb) = (be.upload(&x).unwrap(), be.upload(&w).unwrap());
                        let yb = y_dtype.map(|d| put(be, &y, d));
                        let mut sum = be.upload(&vec![f32::NAN; rows * cols]).unwrap();
                        let mut normed = put(be, &vec![f32::NAN; rows * cols], out);
                        be.add_rms_norm(
                            (&xb, yb.as_ref(), &wb),
                            (&mut sum, &mut normed),
                            cols,
                            1e-5,
                        )
                        .unwrap();
                        (be.download::<f32>(&sum).unwrap(), get(be, &normed))
                    }};
                }
                let (ws, wn) = go!(&CpuBackend);
                let (gs, gn) = go!(&gpu);
                let what = format!("{rows}x{cols} y {y_dtype:?} out {out}");
                assert_eq!(gs, ws, "{what}: sums");
                let mut rel = (cols as f64 / 2.0 + 8.0) * U;
                if out == DType::BF16 {
                    rel += BF16_ULP;
                }
                within(&what, &gn, &wn, rel);
            }
        }
    }
}

#[test]
fn gpu_swiglu_packed_matches_cpu() {
    let (gpu, mut rng) = skip_unless!(gpu_and_rng("gpu_swiglu_packed_matches_cpu"));
    for &(rows, i) in &[(1usize, 8192usize), (16, 1000), (3, 1), (2, 70_001)] {
        let mut gu = random_vec(&mut rng, rows * 2 * i, 12.0);
        gu[0] = -200.0; // silu → −0, the far tail
        for ti in DTYPES {
            for to in DTYPES {
                macro_rules! go {
                    ($be:expr) => {{
                        let be = $be;
                        let g = put(be, &gu, ti);
                        let mut out = put(be, &vec![f32::NAN; rows * i], to);
                        be.swiglu_packed(&g, &mut out, i).unwrap();
                        get(be, &out)
                    }};
                }
                let want = go!(&CpuBackend);
                let got = go!(&gpu);
                let rel = 8.0 * U + if to == DType::BF16 { BF16_ULP } else { 0.0 };
                within(&format!("{rows}x{i} {ti}->{to}"), &got, &want, rel);
            }
        }
    }
}

#[test]
fn gpu_fused_ops_refuse_bad_buffers() {
    let gpu = skip_unless!(backend_or_skip("gpu_fused_ops_refuse_bad_buffers"));
    let x = gpu.upload(&[1f32; 6]).unwrap();
    let w = gpu.upload(&[1f32; 3]).unwrap();
    let mut sum = gpu.upload(&[0f32; 6]).unwrap();
    let mut n = gpu.upload(&[0f32; 6]).unwrap();
    let short = gpu.upload(&[1f32; 5]).unwrap();
    assert!(gpu
        .add_rms_norm((&x, Some(&short), &w), (&mut sum, &mut n), 3, 1e-5)
        .is_err());
    assert!(gpu
        .add_rms_norm((&x, None, &w), (&mut sum, &mut n), 4, 1e-5)
        .is_err());
    assert!(gpu
        .add_rms_norm((&x, None, &w), (&mut sum, &mut n), 3, f32::NAN)
        .is_err());
    let mut out = gpu.upload(&[0f32; 2]).unwrap();
    assert!(gpu.swiglu_packed(&x, &mut out, 2).is_err());
    assert!(gpu.swiglu_packed(&x, &mut out, 0).is_err());
}
