//! The default of [`WorldOps::randomized_svd`](crate::nn::WorldOps::randomized_svd): Halko,
//! Martinsson and Tropp's randomized subspace iteration with every product by the matrix on the
//! device (the `matmul` primitive) and the `l`-column work on the host in f64: each
//! orthonormalisation is a Householder QR of the downloaded `rows × l` basis, and the small
//! SVD of `B = Qᵀ·A` (`l × n`) is `gpu_core::linalg::full_svd`. The Gaussian test matrix is
//! drawn on the host from the seed. Every Halko variant of [`SvdMethod`] runs this one
//! composition; `CusolverGesvdr` is CUDA's own and refused here.
//!
//! The matrix is first scaled by a power of two (exact) when its largest magnitude is outside
//! `[2^-30, 2^30]`, so that no f32 product overflows or underflows; the singular values are
//! scaled back in f64.

use super::{f32_buf, zip_scalar};
use crate::error::{GpuError, Result};
use crate::nn::elementwise::BinaryKind as K;
use crate::nn::primitives::Primitives;
use crate::nn::world::{SvdMethod, SvdOut, SvdOutcome, SvdSpec, WorldOps};
use crate::ops::MatmulSpec;
use nalgebra::DMatrix;
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

const OP: &str = "randomized_svd";

/// Overwrites the row-major `rows × cols` basis `y` with an orthonormal basis of its columns
/// (the thin Q of a Householder QR in f64).
fn orthonormalize<B: Primitives + ?Sized>(
    b: &B,
    y: &mut B::Buffer,
    (rows, cols): (usize, usize),
) -> Result<()> {
    let host = b.download::<f32>(y)?;
    let m = DMatrix::from_row_iterator(rows, cols, host.into_iter().map(f64::from));
    let q = m.qr().q();
    let back: Vec<f32> = (0..rows)
        .flat_map(|i| (0..cols).map(move |j| (i, j)))
        .map(|(i, j)| q[(i, j)] as f32)
        .collect();
    b.copy_to_device(&back, y)
}

/// `op(x)·y` into a new f32 buffer, `x` row-major `m × n` (`op(x) = xᵀ` when `trans`).
fn times<B: Primitives + ?Sized>(
    b: &B,
    (x, m, n, trans): (&B::Buffer, usize, usize, bool),
    y: &B::Buffer,
    l: usize,
) -> Result<B::Buffer> {
    let (rows, inner) = if trans { (n, m) } else { (m, n) };
    let mut out = f32_buf(b, rows * l)?;
    let spec = MatmulSpec {
        trans_a: trans,
        ..MatmulSpec::new(rows, l, inner)
    };
    b.matmul(spec, x, y, &mut out)?;
    Ok(out)
}

/// The power of two that brings a largest magnitude `max` into `[2^-30, 2^30]` (1 inside).
fn power_of_two_scale(max: f32) -> f32 {
    if max == 0.0 || (2f32.powi(-30)..=2f32.powi(30)).contains(&max) {
        1.0
    } else {
        2f32.powi(-(max.log2().floor() as i32))
    }
}

/// The matrix's scan and exact scaling (see the module docs), for every backend's SVD: `None`
/// when `a` holds NaN or an infinity, else the scale and, unless it is 1, the scaled copy.
pub fn scale_input<B: WorldOps + ?Sized>(
    b: &B,
    a: &B::Buffer,
) -> Result<Option<(f32, Option<B::Buffer>)>> {
    let max = b.max_abs(a)?;
    if !max.is_finite() {
        return Ok(None);
    }
    let scale = power_of_two_scale(max);
    let scaled = (scale != 1.0)
        .then(|| zip_scalar(b, K::Mul, a, scale))
        .transpose()?;
    Ok(Some((scale, scaled)))
}

/// See the module docs.
pub fn randomized_svd<B: WorldOps + ?Sized>(
    b: &B,
    a: &B::Buffer,
    spec: &SvdSpec,
    out: SvdOut<'_, B::Buffer>,
) -> Result<SvdOutcome> {
    spec.check(a, &out)?;
    if spec.method == SvdMethod::CusolverGesvdr {
        return Err(GpuError::invalid(
            OP,
            "cusolverDnXgesvdr runs on CUDA only; other backends run the Halko algorithm \
             (SvdMethod::Halko)",
        ));
    }
    let Some((scale, scaled)) = scale_input(b, a)? else {
        return Ok(SvdOutcome::NonFiniteInput);
    };
    let x = scaled.as_ref().unwrap_or(a);
    let (m, n, k, l) = (spec.m, spec.n, spec.rank, spec.sketch());
    let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed);
    let omega: Vec<f32> = (0..n * l)
        .map(|_| StandardNormal.sample(&mut rng))
        .collect();
    let omega = b.upload(&omega)?;
    let mut y = times(b, (x, m, n, false), &omega, l)?;
    orthonormalize(b, &mut y, (m, l))?;
    for _ in 0..spec.power_iters {
        let mut z = times(b, (x, m, n, true), &y, l)?;
        orthonormalize(b, &mut z, (n, l))?;
        y = times(b, (x, m, n, false), &z, l)?;
        orthonormalize(b, &mut y, (m, l))?;
    }
    // Bᵀ = Xᵀ·Y (n × l) on the device; B = Qᵀ·X (l × n) and its SVD on the host.
    let bt = b.download::<f32>(&times(b, (x, m, n, true), &y, l)?)?;
    let small = DMatrix::from_fn(l, n, |i, j| f64::from(bt[j * l + i]));
    let svd = crate::linalg::full_svd(small)
        .ok_or_else(|| GpuError::invalid(OP, format!("the {l} × {n} core SVD did not converge")))?;
    let (Some(ut), Some(vt)) = (svd.u, svd.v_t) else {
        return Err(GpuError::invalid(OP, "the core SVD gave no vectors"));
    };
    let s: Vec<f32> = (0..k)
        .map(|i| (svd.singular_values[i] / f64::from(scale)) as f32)
        .collect();
    if s.iter().any(|v| !v.is_finite()) {
        return Ok(SvdOutcome::NonFiniteScale);
    }
    // U = Y·Ũ[:, :k] on the device; V = (Vᵀ[:k, :])ᵀ from the host.
    let uk: Vec<f32> = (0..l)
        .flat_map(|i| (0..k).map(move |c| (i, c)))
        .map(|(i, c)| ut[(i, c)] as f32)
        .collect();
    b.matmul(MatmulSpec::new(m, k, l), &y, &b.upload(&uk)?, out.u)?;
    let v: Vec<f32> = (0..n)
        .flat_map(|j| (0..k).map(move |c| (j, c)))
        .map(|(j, c)| vt[(c, j)] as f32)
        .collect();
    b.copy_to_device(&v, out.v)?;
    b.copy_to_device(&s, out.s)?;
    Ok(SvdOutcome::Done)
}
