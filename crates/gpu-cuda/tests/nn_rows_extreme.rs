//! `RowOps` norms on rows of extreme scale, on the CPU and on CUDA against the CPU reference
//! (f64, exact on these rows): constant rows (LayerNorm's x − mean must be exactly 0, so y = b),
//! rows whose sums or squares overflow f32 (|x| up to 3e38), and denormal rows. Tolerances are
//! those of `nn_rows` (`nn_rows_util::norm_check`): the kernels are scale-invariant, so the
//! relative error bounds of ordinary rows hold at every scale.

mod common;
mod nn_rows_util;

use common::*;
use nn_rows_util::*;
use rand::rngs::StdRng;
use rand::Rng;

/// Warp mode with scalar and float4 chunks, block mode, and the shared-memory cache limit.
const WIDTHS: &[usize] = &[7, 64, 1025, 6020, 20_000];

fn constant_rows_body<B: Rows>(b: &B, dev: &str, rng: &mut StdRng) {
    for &cols in WIDTHS {
        for c in [1e20f32, -1e20, 3e38, -3e38, 1e-40, 0.0, 7.0] {
            let x = vec![c; 3 * cols];
            norm_check(b, &format!("{dev} const {c:e} x{cols}"), rng, &x, cols);
        }
        // Rows of different constants, one of them mixed with its negation.
        let mut x: Vec<f32> = (0..3 * cols)
            .map(|i| [1e20, -5e19, 2.5][i / cols])
            .collect();
        x[2 * cols] = -2.5;
        norm_check(b, &format!("{dev} mixed consts x{cols}"), rng, &x, cols);
    }
}

fn huge_rows_body<B: Rows>(b: &B, dev: &str, rng: &mut StdRng) {
    for &cols in WIDTHS {
        for (scale, offset) in [(3e20f32, 0.0f32), (3e37, 0.0), (1.7e38, 0.0), (1e19, 1e20)] {
            let x: Vec<f32> = random_vec(rng, 4 * cols, 1.0)
                .iter()
                .map(|v| v * scale + offset)
                .collect();
            let what = format!("{dev} {scale:e}·U(-1,1)+{offset:e} x{cols}");
            norm_check(b, &what, rng, &x, cols);
        }
        // The first element an outlier (the LayerNorm kernel shifts by x[0]), and one nonzero
        // element among zeros (the sharpest cancellation for a shifted sum).
        let mut outlier = random_vec(rng, 2 * cols, 1.0);
        outlier[0] = 1e4;
        outlier[cols] = -3e6;
        norm_check(
            b,
            &format!("{dev} outlier first x{cols}"),
            rng,
            &outlier,
            cols,
        );
        let mut spike = vec![0.0f32; cols];
        spike[0] = 5e3;
        norm_check(b, &format!("{dev} lone spike x{cols}"), rng, &spike, cols);
        // Denormals and a row mixing ±FLT_MAX with small values.
        let tiny: Vec<f32> = (0..2 * cols)
            .map(|_| rng.random_range(-1e-39..1e-39))
            .collect();
        norm_check(b, &format!("{dev} denormal x{cols}"), rng, &tiny, cols);
        let mut wild = random_vec(rng, cols, 1.0);
        wild[0] = f32::MAX;
        wild[cols - 1] = -f32::MAX;
        norm_check(b, &format!("{dev} ±FLT_MAX x{cols}"), rng, &wild, cols);
    }
}

every_device_test!(gpu_norms_are_exact_on_constant_rows, constant_rows_body);

every_device_test!(gpu_norms_handle_rows_that_overflow_f32_sums, huge_rows_body);

/// A NaN or an infinity in a row: LayerNorm's output for that row is all NaN (its mean or
/// variance is undefined), RMSNorm's is whatever the f64 reference gives (NaN for a NaN row;
/// 0 and NaN for a row with +inf, whose rms is inf), on every device, and the other rows are
/// exactly as without it.
fn non_finite_rows_body<B: Rows>(b: &B, dev: &str, rng: &mut StdRng) {
    for &cols in WIDTHS {
        let (w, bias) = (random_vec(rng, cols, 2.0), random_vec(rng, cols, 1.0));
        let clean = random_vec(rng, 3 * cols, 3.0);
        let mut x = clean.clone();
        x[cols + cols / 2] = f32::NAN;
        x[2 * cols + cols - 1] = f32::INFINITY;
        let what = format!("{dev} x{cols}");
        let (y, _, _) = ln_fwd(b, &x, &w, &bias, cols, 1e-5);
        let (y0, _, _) = ln_fwd(b, &clean, &w, &bias, cols, 1e-5);
        assert_eq!(y[..cols], y0[..cols], "{what} layernorm: clean row changed");
        assert!(
            y[cols..].iter().all(|v| v.is_nan()),
            "{what} layernorm: rows with NaN or inf must be NaN"
        );
        let (r, _) = rms_fwd(b, &x, &w, cols, 1e-5);
        let (r0, _) = rms_fwd(b, &clean, &w, cols, 1e-5);
        let (want, _) = rms_fwd(&CPU, &x, &w, cols, 1e-5);
        assert_eq!(r[..cols], r0[..cols], "{what} rmsnorm: clean row changed");
        assert!(
            r[cols..2 * cols].iter().all(|v| v.is_nan()),
            "{what} rmsnorm NaN row"
        );
        for (i, (&g, &e)) in r[2 * cols..].iter().zip(&want[2 * cols..]).enumerate() {
            assert!(
                g.to_bits() == e.to_bits() || (g.is_nan() && e.is_nan()),
                "{what} rmsnorm inf row [{i}]: got {g}, want {e}"
            );
        }
    }
}

every_device_test!(
    gpu_norms_of_rows_with_nan_or_inf_are_nan,
    non_finite_rows_body
);
