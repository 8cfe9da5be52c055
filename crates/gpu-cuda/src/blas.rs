//! Row-major f32 GEMM on cuBLAS (column-major underneath), single and strided-batched.
//!
//! Row-major `C = op(A)·op(B)` is column-major `Cᵀ = op(B)ᵀ·op(A)ᵀ`, so cuBLAS is called with
//! the operands swapped and no data is copied or transposed; `trans_a`/`trans_b` become cuBLAS's
//! own transpose flags.

use crate::backend::CudaBackend;
use crate::pool::CudaBuffer;
use cudarc::cublas::{result, sys};
use gpu_core::{GpuError, MatmulSpec, Result};

pub(crate) fn to_i32(op: &'static str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| GpuError::InvalidShape {
        op,
        reason: format!("dimension {v} exceeds cuBLAS's i32 range"),
    })
}

/// cuBLAS's transpose flag for a row-major operand's `trans`.
pub(crate) fn op_of(t: bool) -> sys::cublasOperation_t {
    if t {
        sys::cublasOperation_t::CUBLAS_OP_T
    } else {
        sys::cublasOperation_t::CUBLAS_OP_N
    }
}

/// The leading dimensions cuBLAS sees for row-major `A` and `B` under `s`: a row-major matrix
/// is its column-major transpose, whose leading dimension is the row length.
pub(crate) fn row_major_lds(s: &MatmulSpec, (m, n, k): (i32, i32, i32)) -> (i32, i32) {
    (if s.trans_a { m } else { k }, if s.trans_b { k } else { n })
}

fn blas_err(call: &'static str) -> impl Fn(result::CublasError) -> GpuError {
    move |e| GpuError::cuda(call, e)
}

impl CudaBackend {
    /// `C = op(A)·op(B)` (see [`MatmulSpec`]); the spec is validated by the caller.
    pub(crate) fn sgemm(
        &self,
        s: MatmulSpec,
        a: &CudaBuffer,
        b: &CudaBuffer,
        c: &mut CudaBuffer,
    ) -> Result<()> {
        if s.batch == 0 || s.m == 0 || s.n == 0 {
            return Ok(());
        }
        if s.k == 0 {
            return self.memset32(c, 0);
        }
        let (m, n, k) = (
            to_i32("matmul", s.m)?,
            to_i32("matmul", s.n)?,
            to_i32("matmul", s.k)?,
        );
        let batch = to_i32("matmul", s.batch)?;
        self.check_owned("matmul", &[a, b, c])?;
        let (op, (lda_row, ldb_row)) = (op_of, row_major_lds(&s, (m, n, k)));
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (_blas, handle) = self.blas_bound()?;
        let mode = if self.tf32() {
            sys::cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH
        } else {
            sys::cublasMath_t::CUBLAS_DEFAULT_MATH
        };
        // SAFETY: the handle is live and bound to this backend's stream.
        unsafe { sys::cublasSetMathMode(handle, mode) }
            .result()
            .map_err(blas_err("cublasSetMathMode"))?;
        let (pa, pb, pc) = (
            a.device_ptr() as *const f32,
            b.device_ptr() as *const f32,
            c.device_ptr() as *mut f32,
        );
        // SAFETY: the buffers hold batch·m·k, batch·k·n and batch·m·n f32 elements (validated by
        // `MatmulSpec::validate`), and the leading dimensions and strides above address exactly
        // those elements.
        unsafe {
            if s.batch == 1 {
                result::sgemm(
                    handle,
                    op(s.trans_b),
                    op(s.trans_a),
                    n,
                    m,
                    k,
                    &alpha,
                    pb,
                    ldb_row,
                    pa,
                    lda_row,
                    &beta,
                    pc,
                    n,
                )
                .map_err(blas_err("cublasSgemm"))
            } else {
                result::sgemm_strided_batched(
                    handle,
                    op(s.trans_b),
                    op(s.trans_a),
                    n,
                    m,
                    k,
                    &alpha,
                    pb,
                    ldb_row,
                    (s.k * s.n) as i64,
                    pa,
                    lda_row,
                    (s.m * s.k) as i64,
                    &beta,
                    pc,
                    n,
                    (s.m * s.n) as i64,
                    batch,
                )
                .map_err(blas_err("cublasSgemmStridedBatched"))
            }
        }
    }
}
