//! CUDA's override of `WorldOps::randomized_svd` (the world model's `compress_residuals`):
//! Halko et al.'s randomized SVD on the device (cuBLAS GEMMs, Cholesky QR2 and a one-sided
//! Jacobi small SVD, with cuSOLVER Householder QR and the host's f64 SVD as their fallbacks),
//! and cuSOLVER's own `cusolverDnXgesvdr`, as `SvdMethod` picks.
//!
//! A row-major `m × n` matrix `A` is, read column-major, `X = Aᵀ` (`n × m`, `ld = n`): both
//! algorithms factor `X ≈ Uₓ·S·Vₓᵀ` and return `U = Vₓ`, `V = Uₓ` as row-major `[m, k]` and
//! `[n, k]` buffers, written transposed by the last GEMM (or a transpose), never copied on the
//! host. Host synchronisations: the finiteness and scale check, then (Halko) the one flag word of
//! the fast path, or `R` down and its factors up (the Householder path and the fallback); the
//! info check (gesvdr).

use super::world_svd_graph::Fast;
use crate::backend::CudaBackend;
use crate::cholqr::CHOLQR_MAX_COLS;
use crate::linalg::SolverInfo;
use crate::pool::CudaBuffer;
use crate::small_svd::SMALL_SVD_MAX;
use gpu_core::nn::{SvdMethod, SvdOut, SvdOutcome, SvdSpec};
use gpu_core::{Backend, DType, GpuError, Result};
use nalgebra::DMatrix;

const ENTRY: &str = "randomized_svd";

/// Where the factors go, with the sizes: `(m, n, k, l)`.
struct Target<'a, 'b> {
    out: &'a mut SvdOut<'b, CudaBuffer>,
    dims: (usize, usize, usize, usize),
}

fn alloc(gpu: &CudaBackend, len: usize) -> Result<CudaBuffer> {
    gpu.allocate(DType::F32, len)
}

impl CudaBackend {
    /// `WorldOps::randomized_svd` on CUDA (see the module docs). NaN or Inf is found by the
    /// scan that gives the scale (one synchronisation).
    pub(crate) fn randomized_svd_cuda(
        &self,
        a: &CudaBuffer,
        spec: &SvdSpec,
        mut out: SvdOut<'_, CudaBuffer>,
    ) -> Result<SvdOutcome> {
        spec.check(a, &out)?;
        let Some((scale, scaled)) = gpu_core::nn::defaults::world_svd::scale_input(self, a)? else {
            return Ok(SvdOutcome::NonFiniteInput);
        };
        let x = scaled.as_ref().unwrap_or(a);
        let (m, n, k) = (spec.m, spec.n, spec.rank);
        let mut target = Target {
            out: &mut out,
            dims: (m, n, k, spec.sketch()),
        };
        let householder = |t: &mut Target<'_, '_>| {
            halko(self, (x, scale), spec, Ortho::Householder, t)?
                .ok_or_else(|| GpuError::invalid(ENTRY, "Householder QR reported a breakdown"))
        };
        match spec.method {
            SvdMethod::Halko | SvdMethod::HalkoEager => {
                match halko(self, (x, scale), spec, Ortho::CholQr2, &mut target)? {
                    Some(o) => Ok(o),
                    None => householder(&mut target),
                }
            }
            SvdMethod::HalkoHouseholder => householder(&mut target),
            SvdMethod::CusolverGesvdr => gesvdr(self, (x, scale), spec, &mut target),
            // Refused by `spec.check`.
            SvdMethod::Gram => Err(GpuError::invalid(ENTRY, "Gram is not a randomized SVD")),
        }
    }
}

/// How [`halko`] orthonormalises its sketches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ortho {
    /// Cholesky QR2 where the sketch is at most 64 wide (else Householder).
    CholQr2,
    /// cuSOLVER's Householder QR.
    Householder,
}

/// The Householder path's device part: sketch, power iterations, `Bᵀ = Xᵀ·Y` and the `R` of
/// its QR, returning `Y`, `Q₂` and `R` (summed in f64 on the host).
fn householder_part(
    gpu: &CudaBackend,
    x: &CudaBuffer,
    spec: &SvdSpec,
    (m, n, l): (usize, usize, usize),
) -> Result<(CudaBuffer, CudaBuffer, Vec<f64>)> {
    let (r, c) = (n, m);
    // 2 QRs per power iteration, one for the sketch, one for Bᵀ; 2 info slots each.
    let mut info = SolverInfo::new(gpu, 2 * (2 * spec.power_iters + 2))?;
    let mut ortho = |(rows, cols): (usize, usize), q: &mut CudaBuffer| {
        gpu.orthonormalize_cm((rows, cols), (q, rows), &mut info)
    };
    let mut omega = alloc(gpu, c * l)?;
    gpu.fill_randn(&mut omega, spec.seed)?;
    let mut y = alloc(gpu, r * l)?;
    let mut z = alloc(gpu, c * l)?;
    // The two products of the iteration: Y = X·Z (r × l) and Z = Xᵀ·Y (c × l).
    let x_times = |z: &CudaBuffer, y: &mut CudaBuffer| times_x(gpu, (x, r, c, l), false, z, y);
    let xt_times = |y: &CudaBuffer, z: &mut CudaBuffer| times_x(gpu, (x, r, c, l), true, y, z);
    x_times(&omega, &mut y)?;
    ortho((r, l), &mut y)?;
    for _ in 0..spec.power_iters {
        xt_times(&y, &mut z)?;
        ortho((c, l), &mut z)?;
        x_times(&z, &mut y)?;
        ortho((r, l), &mut y)?;
    }
    // Bᵀ = Xᵀ·Y (c × l); keep a copy, orthonormalise it to Q₂ and take R = Q₂ᵀ·Bᵀ.
    xt_times(&y, &mut z)?;
    gpu.copy_buffer(&z, &mut omega)?;
    ortho((c, l), &mut z)?;
    let mut rr = alloc(gpu, l * l)?;
    gpu.gemm_tn_parts_cm(c, (l, l), (&z, c), (&omega, c), c.max(1), &mut rr)?;
    info.check(gpu, ENTRY)?;
    let small = gpu
        .download::<f32>(&rr)?
        .into_iter()
        .map(f64::from)
        .collect();
    Ok((y, z, small))
}

/// Halko et al. on the device; see the module docs for the layout. `None` when Cholesky QR
/// broke down (nothing is written from that attempt; the caller redoes it with Householder).
fn halko(
    gpu: &CudaBackend,
    (x, scale): (&CudaBuffer, f32),
    spec: &SvdSpec,
    ortho: Ortho,
    t: &mut Target<'_, '_>,
) -> Result<Option<SvdOutcome>> {
    let (m, n, k, l) = t.dims;
    // The fast path: Cholesky QR2 and the small SVD on the device (both take l <= 64).
    let fast = ortho == Ortho::CholQr2 && l <= CHOLQR_MAX_COLS.min(SMALL_SVD_MAX);
    let (y, q2, small) = if fast {
        let eager = spec.method == SvdMethod::HalkoEager;
        let dims = (m, n, k, l);
        match super::world_svd_graph::halko_fast(gpu, x, dims, (scale, eager), spec, t.out)? {
            Fast::Redo => return Ok(None),
            Fast::Done => return Ok(Some(SvdOutcome::Done)),
            Fast::Host(y, q2, small) => (y, q2, small),
        }
    } else {
        householder_part(gpu, x, spec, (m, n, l))?
    };
    // X ≈ Y·B, Bᵀ = Q₂·R, R = Ũ·Σ·Ṽᵀ  ⇒  X ≈ (Y·Ṽ)·Σ·(Q₂·Ũ)ᵀ, and A = Xᵀ ≈ (Q₂·Ũ)·Σ·(Y·Ṽ)ᵀ.
    let svd = gpu_core::linalg::full_svd(DMatrix::from_vec(l, l, small)).ok_or_else(|| {
        GpuError::invalid(ENTRY, format!("the {l} × {l} core SVD did not converge"))
    })?;
    let (Some(ut), Some(vt)) = (svd.u, svd.v_t) else {
        return Err(GpuError::invalid(ENTRY, "the core SVD gave no vectors"));
    };
    // Ũ and Ṽ's first k columns, column-major l × k.
    let ur: Vec<f32> = ut.columns(0, k).iter().map(|&v| v as f32).collect();
    let vr: Vec<f32> = vt
        .rows(0, k)
        .transpose()
        .iter()
        .map(|&v| v as f32)
        .collect();
    let s: Vec<f32> = (0..k)
        .map(|i| (svd.singular_values[i] / f64::from(scale)) as f32)
        .collect();
    if s.iter().any(|x| !x.is_finite()) {
        return Ok(Some(SvdOutcome::NonFiniteScale));
    }
    let (ur, vr) = (gpu.upload(&ur)?, gpu.upload(&vr)?);
    let outs = (&mut *t.out.u, &mut *t.out.v);
    factors_into(gpu, (m, n, k, l), (&ur, &vr), (&q2, &y), outs)?;
    gpu.copy_to_device(&s, t.out.s)?;
    Ok(Some(SvdOutcome::Done))
}

/// The two products of a power iteration over `X` (column-major `r × c`, `r` apart) with `l`
/// columns, queued: `dst = X·src` (`r × l` from `c × l`), or `dst = Xᵀ·src` (`c × l` from
/// `r × l`) when `t`.
pub(crate) fn times_x(
    gpu: &CudaBackend,
    (x, r, c, l): (&CudaBuffer, usize, usize, usize),
    t: bool,
    src: &CudaBuffer,
    dst: &mut CudaBuffer,
) -> Result<()> {
    let (rows, inner) = if t { (c, r) } else { (r, c) };
    gpu.gemm_cm(
        (t, false),
        (rows, l, inner),
        (1.0, 0.0),
        (x, r),
        (src, inner),
        (dst, rows),
    )
}

/// Row-major `U` `[m, k]` (column-major `Uᵀ`, `k × m` = `Ũₖᵀ·Q₂ᵀ`) and `V` `[n, k]` (`Ṽₖᵀ·Yᵀ`)
/// from the small factors (column-major `l × k`) and the two bases, into given buffers (queued
/// only).
pub(crate) fn factors_into(
    gpu: &CudaBackend,
    (m, n, k, l): (usize, usize, usize, usize),
    (ur, vr): (&CudaBuffer, &CudaBuffer),
    (q2, y): (&CudaBuffer, &CudaBuffer),
    (u_out, v_out): (&mut CudaBuffer, &mut CudaBuffer),
) -> Result<()> {
    let (r, c) = (n, m);
    let tt = (true, true);
    gpu.gemm_cm(tt, (k, c, l), (1.0, 0.0), (ur, l), (q2, c), (u_out, k))?;
    gpu.gemm_cm(tt, (k, r, l), (1.0, 0.0), (vr, l), (y, r), (v_out, k))
}

/// `cusolverDnXgesvdr` on a copy of `x` (it destroys its input).
fn gesvdr(
    gpu: &CudaBackend,
    (x, scale): (&CudaBuffer, f32),
    spec: &SvdSpec,
    t: &mut Target<'_, '_>,
) -> Result<SvdOutcome> {
    let (m, n, k, _) = t.dims;
    let (r, c) = (n, m);
    let p = spec.oversample.min(m.min(n) - k);
    let mut info = SolverInfo::new(gpu, 1)?;
    let mut xc = alloc(gpu, r * c)?;
    gpu.copy_buffer(x, &mut xc)?;
    let mut s = alloc(gpu, r.min(c))?;
    let mut ux = alloc(gpu, r * r)?;
    let mut vx = alloc(gpu, c * c)?;
    let iters = (k, p, spec.power_iters);
    gpu.gesvdr_cm(
        (r, c),
        &mut xc,
        iters,
        (&mut s, &mut ux, &mut vx),
        &mut info,
    )?;
    info.check(gpu, ENTRY)?;
    // U = Vₓ's first k columns (c × k), V = Uₓ's (r × k), written transposed.
    gpu.transpose_cm((c, k), (&vx, c), (&mut *t.out.u, k))?;
    gpu.transpose_cm((r, k), (&ux, r), (&mut *t.out.v, k))?;
    let s: Vec<f32> = gpu.download::<f32>(&s)?[..k]
        .iter()
        .map(|&x| x / scale)
        .collect();
    if s.iter().any(|x| !x.is_finite()) {
        return Ok(SvdOutcome::NonFiniteScale);
    }
    gpu.copy_to_device(&s, t.out.s)?;
    Ok(SvdOutcome::Done)
}
