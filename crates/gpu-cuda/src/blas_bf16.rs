//! Row-major bf16 GEMM on cuBLAS's tensor cores with f32 accumulation (`cublasGemmStridedBatchedEx`,
//! compute type `CUBLAS_COMPUTE_32F`): the matmuls of bf16 mixed precision. Inputs are bf16;
//! the output is bf16 (rounded once, from the f32 accumulator) or f32. The same row-major to
//! column-major swap as the f32 GEMM (`crate::blas`). Its reference is
//! [`matmul_bf16_reference`].

use crate::backend::CudaBackend;
use crate::blas::{op_of, row_major_lds};
use crate::pool::CudaBuffer;
use cudarc::cublas::sys;
use gpu_core::{BufferInfo, DType, GpuError, MatmulSpec, Result};
use half::bf16;

const OP: &str = "matmul_bf16";

fn to_i32(v: usize) -> Result<i32> {
    crate::blas::to_i32(OP, v)
}

/// The element counts of A, B and C under `s`, or a typed error when they overflow.
fn lengths(s: &MatmulSpec) -> Result<[usize; 3]> {
    let len = |x: usize, y: usize| {
        s.batch
            .checked_mul(x)
            .and_then(|v| v.checked_mul(y))
            .ok_or_else(|| GpuError::InvalidShape {
                op: OP,
                reason: format!("{s:?} overflows usize"),
            })
    };
    Ok([len(s.m, s.k)?, len(s.k, s.n)?, len(s.m, s.n)?])
}

impl CudaBackend {
    /// `C = op(A)·op(B)` (see [`MatmulSpec`]) for bf16 `A` and `B`, accumulated in f32 on tensor
    /// cores; `C` is bf16 or f32. Queued only.
    pub fn matmul_bf16(
        &self,
        s: MatmulSpec,
        a: &CudaBuffer,
        b: &CudaBuffer,
        c: &mut CudaBuffer,
    ) -> Result<()> {
        for (name, buf) in [("A", a.dtype()), ("B", b.dtype())] {
            if buf != DType::BF16 {
                return Err(GpuError::invalid(
                    OP,
                    format!("{name} must be bf16, got {buf}"),
                ));
            }
        }
        let c_type = match c.dtype() {
            DType::BF16 => sys::cudaDataType::CUDA_R_16BF,
            DType::F32 => sys::cudaDataType::CUDA_R_32F,
            other => {
                return Err(GpuError::invalid(
                    OP,
                    format!("C must be bf16 or f32, got {other}"),
                ))
            }
        };
        let [ea, eb, ec] = lengths(&s)?;
        for (name, want, got) in [("A", ea, a.len()), ("B", eb, b.len()), ("C", ec, c.len())] {
            gpu_core::ops::check_count(OP, name, got, want)?;
        }
        self.check_owned(OP, &[a, b, c])?;
        if s.batch == 0 || s.m == 0 || s.n == 0 {
            return Ok(());
        }
        if s.k == 0 {
            return match c.dtype() {
                DType::F32 => self.memset32(c, 0),
                _ => self.memset16(c, 0),
            };
        }
        let (m, n, k, batch) = (to_i32(s.m)?, to_i32(s.n)?, to_i32(s.k)?, to_i32(s.batch)?);
        if let Some(rows) = skinny_rows(&s) {
            return self.gemv_bf16(s, rows, a, b, c);
        }
        let stride = |v: usize| i64::try_from(v).map_err(|_| GpuError::invalid(OP, "stride"));
        let (sa, sb, sc) = (stride(s.m * s.k)?, stride(s.k * s.n)?, stride(s.m * s.n)?);
        let (op, (lda_row, ldb_row)) = (op_of, row_major_lds(&s, (m, n, k)));
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (_blas, handle) = self.blas_bound()?;
        // SAFETY: the buffers hold batch·m·k and batch·k·n bf16 and batch·m·n elements of C's
        // type (checked above); the leading dimensions and strides address exactly those; the
        // scalars are f32 as CUBLAS_COMPUTE_32F requires.
        unsafe {
            sys::cublasGemmStridedBatchedEx(
                handle,
                op(s.trans_b),
                op(s.trans_a),
                n,
                m,
                k,
                (&alpha as *const f32).cast(),
                b.device_ptr() as *const std::ffi::c_void,
                sys::cudaDataType::CUDA_R_16BF,
                ldb_row,
                sb,
                a.device_ptr() as *const std::ffi::c_void,
                sys::cudaDataType::CUDA_R_16BF,
                lda_row,
                sa,
                (&beta as *const f32).cast(),
                c.device_ptr() as *mut std::ffi::c_void,
                c_type,
                n,
                sc,
                batch,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .result()
        .map_err(|e| GpuError::cuda("cublasGemmStridedBatchedEx", e))
    }
}

/// Rows of x the skinny kernels take (`nn_gemv_bf16.cu`): a single product of at most 4 rows
/// against a `[n, k]` weight (`trans_b`, PyTorch's Linear layout) with `k` a multiple of 8,
/// which is how a decode step at batch <= 4 multiplies. Measured on an H200 in a Llama-3.2-1B
/// decode step: at 1 row these kernels beat cuBLAS (2.47 against 2.81 ms a step); at 16 rows
/// they lost (7.2 against 3.0 ms: every lane re-reads x's 16 rows from L1), so wider products
/// stay on cuBLAS. `None`: cuBLAS.
fn skinny_rows(s: &MatmulSpec) -> Option<usize> {
    let fits = s.batch == 1 && !s.trans_a && s.trans_b && s.k.is_multiple_of(8);
    [1, 2, 4].into_iter().find(|&r| s.m <= r).filter(|_| fits)
}

/// How the skinny kernels split a product (`nn_gemv_bf16.cu`): `Warp`, each warp two weight
/// rows over all of k; `Split(r)`, each block of 256 threads `r` rows with k split over its
/// threads (more loads in flight when n is small). `HYBRID_GEMV=warp|split4|split8` picks one
/// for a comparison; the default is `split4`. The quantized kernels (`nn_gemv_q.cu`) follow:
/// the warp form for `warp`, their split-k form (4 rows a block) otherwise. Their prefill form
/// (more rows) has its own switch, `HYBRID_QGEMM=auto|fused|dequant` ([`crate::qgemm_form`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GemvForm {
    Warp,
    Split(usize),
}

pub(crate) fn gemv_form() -> GemvForm {
    static FORM: std::sync::OnceLock<GemvForm> = std::sync::OnceLock::new();
    *FORM.get_or_init(|| match std::env::var("HYBRID_GEMV").as_deref() {
        Ok("warp") => GemvForm::Warp,
        Ok("split8") => GemvForm::Split(8),
        _ => GemvForm::Split(4),
    })
}

impl CudaBackend {
    /// `C = A·Bᵀ` for a skinny bf16 `A` `[m, k]` (m <= `rows`) and `B` `[n, k]`, by the kernels
    /// of `nn_gemv_bf16.cu`. Arguments checked by [`CudaBackend::matmul_bf16`].
    fn gemv_bf16(
        &self,
        s: MatmulSpec,
        rows: usize,
        a: &CudaBuffer,
        b: &CudaBuffer,
        c: &mut CudaBuffer,
    ) -> Result<()> {
        const WARPS: usize = 8; // GEMV_WARPS
        let form = gemv_form();
        let (rows_per_block, prefix) = match form {
            GemvForm::Warp => (WARPS * 2, String::from("gemv_bf16")),
            GemvForm::Split(r) => (r, format!("gemv_bf16_sk{r}")),
        };
        let blocks = s.n.div_ceil(rows_per_block);
        let cfg = crate::launch::LaunchConfig {
            grid_dim: (
                u32::try_from(blocks).map_err(|_| GpuError::invalid(OP, "n"))?,
                1,
                1,
            ),
            block_dim: ((WARPS * 32) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let tag = if c.dtype() == DType::BF16 { 'b' } else { 'f' };
        let name = format!("{prefix}_m{rows}_{tag}");
        let args = [
            a.into(),
            b.into(),
            (&*c).into(),
            crate::launch::KernelArg::U32(s.m as u32),
            crate::launch::KernelArg::U32(s.n as u32),
            crate::launch::KernelArg::U32(s.k as u32),
        ];
        // SAFETY: gemv_bf16[_skS]_mR_X(const bf16* x, const bf16* w, TO* out, u32 m, u32 n,
        // u32 k): x holds m·k bf16, w n·k bf16 and out m·n elements of TO (lengths checked by
        // matmul_bf16, each below 2^31 by to_i32); k is a multiple of 8, so every 16-byte load
        // at a row offset of a 256-byte-aligned pool buffer is aligned; m <= R, the template's
        // row count; the warp form's warps read rows j0..j0+2, the split form's blocks rows
        // j0..j0+S, of those below n only, and write out[i·n + j] for i < m, j < n; 256
        // threads a block (GEMV_WARPS warps), as both forms assume.
        unsafe { self.launch(&name, cfg, &args) }
    }
}

/// The `k` exact products `a_it·b_tj` (as f64) of entry `(p, i, j)` of `op(A)·op(B)` under
/// `s`, for row-major bf16 operands: what [`matmul_bf16_reference`] sums, and what a test's
/// error bound takes the magnitudes of.
pub fn matmul_bf16_terms<'a>(
    s: &'a MatmulSpec,
    (a, b): (&'a [bf16], &'a [bf16]),
    (p, i, j): (usize, usize, usize),
) -> impl Iterator<Item = f64> + 'a {
    let (a, b) = (&a[p * s.m * s.k..], &b[p * s.k * s.n..]);
    (0..s.k).map(move |t| {
        let x = if s.trans_a {
            a[t * s.m + i]
        } else {
            a[i * s.k + t]
        };
        let y = if s.trans_b {
            b[j * s.k + t]
        } else {
            b[t * s.n + j]
        };
        f64::from(x.to_f32()) * f64::from(y.to_f32())
    })
}

/// The reference of [`CudaBackend::matmul_bf16`]: the exact products of the bf16 inputs summed
/// in f64, as f32 (the caller rounds to bf16 where the kernel's output is bf16). Row-major,
/// `s` already validated.
pub fn matmul_bf16_reference(s: MatmulSpec, a: &[bf16], b: &[bf16]) -> Vec<f32> {
    let mut out = vec![0.0f32; s.batch * s.m * s.n];
    for p in 0..s.batch {
        for i in 0..s.m {
            for j in 0..s.n {
                let sum: f64 = matmul_bf16_terms(&s, (a, b), (p, i, j)).sum();
                out[(p * s.m + i) * s.n + j] = sum as f32;
            }
        }
    }
    out
}
