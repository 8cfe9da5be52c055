//! The CUDA path of `compress_residuals`: the randomized SVD of [`crate::svd::randomized_svd`]
//! on the device (cuBLAS GEMMs, Cholesky QR2 and a one-sided Jacobi small SVD, with cuSOLVER
//! Householder QR and the host's f64 SVD as their fallbacks),
//! and cuSOLVER's own `cusolverDnXgesvdr` behind the same entry point ([`SvdMethod`]).
//!
//! A row-major `m × n` residual `A` is, read column-major, `X = Aᵀ` (`n × m`, `ld = n`): both
//! algorithms factor `X ≈ Uₓ·S·Vₓᵀ` and return `U = Vₓ`, `V = Uₓ` as row-major `[m, k]` and
//! `[n, k]` tensors, written transposed by the last GEMM (or a transpose), never copied on the
//! host. Host synchronisations: the finiteness and scale check, then (Halko) the one flag word of
//! the fast path, or `R` down and its factors up (the Householder path and the fallback); the
//! info check (gesvdr).

use crate::error::AcceleratorError;
use crate::lowrank::LowRank;
use crate::svd::{full_svd, SvdOptions};
use crate::svd_graph::Fast;
use gpu_cuda::cholqr::CHOLQR_MAX_COLS;
use gpu_cuda::linalg::SolverInfo;
use gpu_cuda::small_svd::SMALL_SVD_MAX;
use gpu_cuda::{CudaBackend, CudaBuffer};
use nalgebra::DMatrix;
use tensor_ops::{no_grad, DType, Device, GpuError, Tensor};

const ENTRY: &str = "compress_residuals";

/// Which randomized SVD `compress_residuals` runs on CUDA (the CPU always runs the
/// `nalgebra` one).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SvdMethod {
    /// Halko, Martinsson and Tropp's algorithm as written in [`crate::svd::randomized_svd`],
    /// on cuBLAS, the final bases (of the sketch and of `Bᵀ`) orthonormalised by Cholesky QR2
    /// and the intermediate ones of the power iterations by one pass of it
    /// (`gpu_cuda::cholqr`), and the small SVD by one-sided Jacobi (`gpu_cuda::small_svd`),
    /// for sketch widths `k + p <= 64`. A
    /// breakdown of Cholesky QR (a sketch too ill-conditioned for f32, an exactly
    /// rank-deficient one) is flagged on the device and read at the call's one
    /// synchronisation; the call is then redone as [`SvdMethod::HalkoHouseholder`]. A zero
    /// singular value among the first `k` sends the small SVD to the host.
    /// Replayed as one CUDA graph from the second call of a shape on (`crate::svd_graph`).
    #[default]
    Halko,
    /// The same as [`SvdMethod::Halko`], with every operation issued one by one instead of
    /// replayed from a captured graph (the results are bit for bit the same): for comparison.
    HalkoEager,
    /// The same algorithm with cuSOLVER's Householder QR (`geqrf` + `orgqr`) at every
    /// orthonormalisation and the small SVD in f64 on the host (nalgebra): unconditionally
    /// stable, and slower (docs/benchmarks.md). On the CPU the same as `Halko`.
    HalkoHouseholder,
    /// cuSOLVER's `cusolverDnXgesvdr` (fp32), with the same oversampling and power iterations
    /// (oversampling capped so that `k + p <= min(m, n)`). CUDA only. Slower than `Halko` on an
    /// H200 at equal error (docs/benchmarks.md), and not exact on exactly low-rank input (a
    /// rank-16 matrix came back with relative error 4.8e-4): kept for comparison.
    CusolverGesvdr,
    /// The short-wide (or tall-skinny) matrix's Gram matrix, one GEMM, its eigen-decomposition
    /// on the host and a second GEMM ([`crate::svd_gram`]), on either device: one pass over the
    /// matrix, for `min(m, n) <= 512`. Directions with `σ <= √(min(m, n)·u)·σ₁` come back as
    /// noise-free zeros (σ = 0): for histories of updates, not for ill-conditioned matrices.
    Gram,
}

/// `a` scaled by a power of two (exact) when its largest magnitude `max` is outside
/// `[2^-30, 2^30]`, and the factor: f32 products, norms and Householder vectors of the
/// iteration then neither overflow nor underflow.
fn normalised(a: &Tensor, max: f32) -> Result<(Tensor, f32), AcceleratorError> {
    if max == 0.0 || (2f32.powi(-30)..=2f32.powi(30)).contains(&max) {
        return Ok((a.clone(), 1.0));
    }
    let scale = 2f32.powi(-(max.log2().floor() as i32));
    Ok((no_grad(|| a.mul_scalar(scale))?, scale))
}

fn alloc(gpu: &CudaBackend, len: usize) -> Result<CudaBuffer, GpuError> {
    use gpu_core::Backend;
    gpu.allocate(DType::F32, len)
}

fn upload(gpu: &CudaBackend, data: &[f32]) -> Result<CudaBuffer, GpuError> {
    use gpu_core::Backend;
    gpu.upload(data)
}

fn ordinal(a: &Tensor) -> Result<usize, AcceleratorError> {
    match a.device() {
        Device::Cuda(i) => Ok(i),
        d => Err(AcceleratorError::InvalidArgument {
            entry: ENTRY,
            reason: format!("the CUDA path got a tensor on {d}"),
        }),
    }
}

/// The rank-`rank` randomized SVD of the f32 CUDA tensor `a` `[m, n]` (shape, rank and device
/// checked by the caller) by `opts.method`. NaN or Inf is [`AcceleratorError::NonFinite`]
/// (found by the same reduction that gives the scale: one synchronisation).
pub(crate) fn randomized_svd_cuda(
    a: &Tensor,
    rank: usize,
    opts: &SvdOptions,
) -> Result<LowRank, AcceleratorError> {
    let Some(max) = crate::layers::max_abs_if_finite(a)? else {
        return Err(AcceleratorError::NonFinite {
            entry: ENTRY,
            what: "residual",
        });
    };
    let (x, scale) = normalised(a, max)?;
    match opts.method {
        SvdMethod::Halko | SvdMethod::HalkoEager => {
            match halko(&x, scale, rank, opts, Ortho::CholQr2)? {
                Some(f) => Ok(f),
                None => halko(&x, scale, rank, opts, Ortho::Householder)?.ok_or_else(|| {
                    AcceleratorError::InvalidArgument {
                        entry: ENTRY,
                        reason: "Householder QR reported a breakdown".into(),
                    }
                }),
            }
        }
        SvdMethod::HalkoHouseholder => halko(&x, scale, rank, opts, Ortho::Householder)?
            .ok_or_else(|| AcceleratorError::InvalidArgument {
                entry: ENTRY,
                reason: "Householder QR reported a breakdown".into(),
            }),
        SvdMethod::CusolverGesvdr => gesvdr(&x, scale, rank, opts),
        SvdMethod::Gram => crate::svd_gram::gram_svd(a, rank),
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

/// What the device part of [`halko`] ended with.
enum Outcome {
    /// Cholesky QR broke down: redo with Householder QR.
    Redo,
    /// Everything on the device: `U`, `S` (unscaled), `V`.
    Done(CudaBuffer, CudaBuffer, CudaBuffer),
    /// The small SVD is the host's to take: `Y`, `Q₂` and `R`.
    Host(CudaBuffer, CudaBuffer, Vec<f64>),
    /// The fast path failed with this error.
    Failed(AcceleratorError),
}

/// Halko et al. on the device; see the module docs for the layout. `None` when Cholesky QR
/// broke down (nothing is returned from that attempt; the caller redoes it with Householder).
fn halko(
    a: &Tensor,
    scale: f32,
    k: usize,
    opts: &SvdOptions,
    ortho: Ortho,
) -> Result<Option<LowRank>, AcceleratorError> {
    let (m, n) = (a.shape()[0], a.shape()[1]);
    let (r, c) = (n, m);
    let l = k.saturating_add(opts.oversample).min(m.min(n));
    let dev = ordinal(a)?;
    let gpu = tensor_ops::cuda_backend(dev)?;
    // The fast path: Cholesky QR2 and the small SVD on the device (both take l <= 64).
    let fast = ortho == Ortho::CholQr2 && l <= CHOLQR_MAX_COLS.min(SMALL_SVD_MAX);
    // Sketch, power iterations, Bᵀ = Xᵀ·Y and the R of its QR, all queued on the stream.
    let outcome = a.with_cuda_buffer(|gpu, x| {
        if fast {
            let eager = opts.method == SvdMethod::HalkoEager;
            let dims = (m, n, k, l);
            return Ok(
                match crate::svd_graph::halko_fast(gpu, x, dims, scale, opts, eager) {
                    Ok(Fast::Redo) => Outcome::Redo,
                    Ok(Fast::Done(u, s, v)) => Outcome::Done(u, s, v),
                    Ok(Fast::Host(y, q2, small)) => Outcome::Host(y, q2, small),
                    Err(e) => Outcome::Failed(e),
                },
            );
        }
        // Householder QR (cuSOLVER): 2 QRs per power iteration, one for the sketch, one for
        // Bᵀ; 2 info slots each.
        let mut info = SolverInfo::new(gpu, 2 * (2 * opts.power_iters + 2))?;
        let mut ortho = |(rows, cols): (usize, usize), q: &mut CudaBuffer| {
            gpu.orthonormalize_cm((rows, cols), (q, rows), &mut info)
        };
        let mut omega = alloc(gpu, c * l)?;
        gpu.fill_randn(&mut omega, opts.seed)?;
        let mut y = alloc(gpu, r * l)?;
        let mut z = alloc(gpu, c * l)?;
        // The two products of the iteration: Y = X·Z (r × l) and Z = Xᵀ·Y (c × l).
        let x_times = |z: &CudaBuffer, y: &mut CudaBuffer| {
            gpu.gemm_cm((false, false), (r, l, c), 1.0, (x, r), (z, c), 0.0, (y, r))
        };
        let xt_times = |y: &CudaBuffer, z: &mut CudaBuffer| {
            gpu.gemm_cm((true, false), (c, l, r), 1.0, (x, r), (y, r), 0.0, (z, c))
        };
        x_times(&omega, &mut y)?;
        ortho((r, l), &mut y)?;
        for _ in 0..opts.power_iters {
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
        let small: Vec<f64> = gpu_core::Backend::download::<f32>(gpu, &rr)?
            .into_iter()
            .map(f64::from)
            .collect();
        Ok(Outcome::Host(y, z, small))
    })?;
    let (y, q2, small) = match outcome {
        Outcome::Failed(e) => return Err(e),
        Outcome::Redo => return Ok(None),
        Outcome::Done(u, s, v) => {
            return Ok(Some(LowRank::trusted(
                Tensor::from_cuda_buffer(u, &[m, k], dev)?,
                Tensor::from_cuda_buffer(s, &[k], dev)?,
                Tensor::from_cuda_buffer(v, &[n, k], dev)?,
            )))
        }
        Outcome::Host(y, q2, small) => (y, q2, small),
    };
    // X ≈ Y·B, Bᵀ = Q₂·R, R = Ũ·Σ·Ṽᵀ  ⇒  X ≈ (Y·Ṽ)·Σ·(Q₂·Ũ)ᵀ, and A = Xᵀ ≈ (Q₂·Ũ)·Σ·(Y·Ṽ)ᵀ.
    let rm = DMatrix::from_vec(l, l, small);
    let svd = full_svd(rm)?;
    let (ut, vt) = match (svd.u, svd.v_t) {
        (Some(u), Some(vt)) => (u, vt),
        _ => {
            return Err(AcceleratorError::InvalidArgument {
                entry: ENTRY,
                reason: "the small SVD did not produce its factors".into(),
            })
        }
    };
    // Ũ and Ṽ's first k columns, column-major l × k.
    let ur: Vec<f32> = ut.columns(0, k).iter().map(|&v| v as f32).collect();
    let vr: Vec<f32> = vt
        .rows(0, k)
        .transpose()
        .iter()
        .map(|&v| v as f32)
        .collect();
    let s: Vec<f32> = svd
        .singular_values
        .rows(0, k)
        .iter()
        .map(|&v| (v / f64::from(scale)) as f32)
        .collect();
    let (ur, vr) = (upload(&gpu, &ur)?, upload(&gpu, &vr)?);
    let (u_out, v_out) = factors(&gpu, (m, n, k, l), (&ur, &vr), (&q2, &y))?;
    finish(u_out, s, v_out, (m, n, k), dev).map(Some)
}

/// Row-major `U` `[m, k]` (column-major `Uᵀ`, `k × m` = `Ũₖᵀ·Q₂ᵀ`) and `V` `[n, k]` (`Ṽₖᵀ·Yᵀ`)
/// from the small factors (column-major `l × k`) and the two bases.
fn factors(
    gpu: &CudaBackend,
    (m, n, k, l): (usize, usize, usize, usize),
    (ur, vr): (&CudaBuffer, &CudaBuffer),
    (q2, y): (&CudaBuffer, &CudaBuffer),
) -> Result<(CudaBuffer, CudaBuffer), GpuError> {
    let mut u_out = alloc(gpu, m * k)?;
    let mut v_out = alloc(gpu, n * k)?;
    factors_into(
        gpu,
        (m, n, k, l),
        (ur, vr),
        (q2, y),
        (&mut u_out, &mut v_out),
    )?;
    Ok((u_out, v_out))
}

/// [`factors`] into given buffers (queued only).
pub(crate) fn factors_into(
    gpu: &CudaBackend,
    (m, n, k, l): (usize, usize, usize, usize),
    (ur, vr): (&CudaBuffer, &CudaBuffer),
    (q2, y): (&CudaBuffer, &CudaBuffer),
    (u_out, v_out): (&mut CudaBuffer, &mut CudaBuffer),
) -> Result<(), GpuError> {
    let (r, c) = (n, m);
    let tt = (true, true);
    gpu.gemm_cm(tt, (k, c, l), 1.0, (ur, l), (q2, c), 0.0, (u_out, k))?;
    gpu.gemm_cm(tt, (k, r, l), 1.0, (vr, l), (y, r), 0.0, (v_out, k))
}

/// The factors as tensors; `s` descending, finite (the caller checked the input).
fn finish(
    u: CudaBuffer,
    s: Vec<f32>,
    v: CudaBuffer,
    (m, n, k): (usize, usize, usize),
    dev: usize,
) -> Result<LowRank, AcceleratorError> {
    if s.iter().any(|x| !x.is_finite()) {
        return Err(AcceleratorError::NonFinite {
            entry: ENTRY,
            what: "the singular values (the residual's scale overflows f32)",
        });
    }
    Ok(LowRank::trusted(
        Tensor::from_cuda_buffer(u, &[m, k], dev)?,
        Tensor::from_vec(s, &[k], Device::Cuda(dev))?,
        Tensor::from_cuda_buffer(v, &[n, k], dev)?,
    ))
}

/// `cusolverDnXgesvdr` on a copy of `a` (it destroys its input).
fn gesvdr(
    a: &Tensor,
    scale: f32,
    k: usize,
    opts: &SvdOptions,
) -> Result<LowRank, AcceleratorError> {
    let (m, n) = (a.shape()[0], a.shape()[1]);
    let (r, c) = (n, m);
    let p = opts.oversample.min(m.min(n) - k);
    let dev = ordinal(a)?;
    let (u, s, v) = a.with_cuda_buffer(|gpu, x| {
        let mut info = SolverInfo::new(gpu, 1)?;
        let mut xc = alloc(gpu, r * c)?;
        gpu.copy_buffer(x, &mut xc)?;
        let mut s = alloc(gpu, r.min(c))?;
        let mut ux = alloc(gpu, r * r)?;
        let mut vx = alloc(gpu, c * c)?;
        let iters = (k, p, opts.power_iters);
        gpu.gesvdr_cm((r, c), &mut xc, iters, &mut s, &mut ux, &mut vx, &mut info)?;
        info.check(gpu, ENTRY)?;
        // U = Vₓ's first k columns (c × k), V = Uₓ's (r × k), written transposed.
        let mut u = alloc(gpu, m * k)?;
        let mut v = alloc(gpu, n * k)?;
        gpu.transpose_cm((c, k), (&vx, c), (&mut u, k))?;
        gpu.transpose_cm((r, k), (&ux, r), (&mut v, k))?;
        let s: Vec<f32> = gpu_core::Backend::download(gpu, &s)?;
        Ok((u, s, v))
    })?;
    let s = s[..k].iter().map(|&x| x / scale).collect();
    finish(u, s, v, (m, n, k), dev)
}
