//! Dense linear algebra on column-major f32 matrices for low-rank work (randomized SVD and
//! low-rank updates): general GEMM with `alpha`/`beta` and leading dimensions, transposes and
//! diagonal scaling (cuBLAS), Householder QR (cuSOLVER `geqrf` + `orgqr`) and cuSOLVER's own
//! randomized SVD (`cusolverDnXgesvdr`).
//!
//! A matrix is `(buffer, rows, cols, ld)`: element `(i, j)` at `i + j·ld`. A row-major `m × n`
//! tensor is the column-major `n × m` matrix of its transpose (`ld = n`). Every entry validates
//! the shapes against the buffers' lengths and owners before anything is queued, so the unsafe
//! library calls only see addresses inside their buffers. GEMMs here never use TF32: the
//! factorizations they feed need full f32 products.

use crate::backend::CudaBackend;
use crate::blas::op_of;
use crate::launch::KernelArg;
use crate::pool::CudaBuffer;
use cudarc::cublas::sys as blas;
use cudarc::cusolver::{result as solver_result, sys as solver};
use gpu_core::{Backend, BufferInfo, DType, GpuError, Result};
use std::os::raw::c_int;

/// Checks that `buf` holds a column-major `rows × cols` f32 matrix with leading dimension `ld`.
pub(crate) fn check_mat(
    op: &'static str,
    what: &str,
    buf: &CudaBuffer,
    rows: usize,
    cols: usize,
    ld: usize,
) -> Result<()> {
    if buf.dtype() != DType::F32 {
        return Err(GpuError::invalid(op, format!("{what} must hold f32")));
    }
    if ld < rows.max(1) {
        return Err(GpuError::invalid(
            op,
            format!("{what}: leading dimension {ld} below its {rows} rows"),
        ));
    }
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let need = ld
        .checked_mul(cols - 1)
        .and_then(|x| x.checked_add(rows))
        .ok_or_else(|| GpuError::invalid(op, format!("{what}: size overflows")))?;
    if buf.len() < need {
        return Err(GpuError::shape(
            op,
            format!("{what}: at least {need} elements for {rows}×{cols} (ld {ld})"),
            buf.len(),
        ));
    }
    Ok(())
}

pub(crate) fn int(op: &'static str, v: usize) -> Result<c_int> {
    c_int::try_from(v).map_err(|_| GpuError::invalid(op, format!("{v} exceeds the i32 range")))
}

fn blas_ok(call: &'static str, s: blas::cublasStatus_t) -> Result<()> {
    s.result().map_err(|e| GpuError::cuda(call, e))
}

fn solver_ok(call: &'static str, s: solver::cusolverStatus_t) -> Result<()> {
    s.result().map_err(|e| GpuError::cuda(call, e))
}

/// Slots of an info buffer that the cuSOLVER calls of one algorithm write (0 = success).
#[derive(Debug)]
pub struct SolverInfo {
    buf: CudaBuffer,
    next: usize,
}

impl SolverInfo {
    /// Room for `slots` calls.
    pub fn new(gpu: &CudaBackend, slots: usize) -> Result<SolverInfo> {
        let mut buf = gpu.allocate(DType::U32, slots.max(1))?;
        gpu.memset32(&mut buf, 0)?;
        Ok(SolverInfo { buf, next: 0 })
    }

    fn slot(&mut self, op: &'static str) -> Result<*mut c_int> {
        if self.next >= self.buf.len() {
            return Err(GpuError::invalid(op, "the solver info buffer is full"));
        }
        let p = self.buf.device_ptr() + (self.next * 4) as u64;
        self.next += 1;
        Ok(p as *mut c_int)
    }

    /// Reads the slots back (one synchronisation) and errors on the first failed call.
    pub fn check(&self, gpu: &CudaBackend, op: &'static str) -> Result<()> {
        let v: Vec<u32> = gpu.download(&self.buf)?;
        match v.iter().take(self.next).find(|&&x| x != 0) {
            None => Ok(()),
            Some(&x) => Err(GpuError::invalid(
                op,
                format!(
                    "cuSOLVER reported info {} (a bad argument or no convergence)",
                    x as i32
                ),
            )),
        }
    }
}

impl CudaBackend {
    /// The cuBLAS handle, locked, bound to this backend's stream and set to full f32 products
    /// (no TF32: the factorizations these GEMMs feed need them).
    fn blas_full_f32(
        &self,
    ) -> Result<(
        crate::gate::Locked<'_, cudarc::cublas::CudaBlas>,
        blas::cublasHandle_t,
    )> {
        let (guard, handle) = self.blas_bound()?;
        // SAFETY: the handle is live and bound to this backend's stream.
        blas_ok("cublasSetMathMode", unsafe {
            blas::cublasSetMathMode(handle, blas::cublasMath_t::CUBLAS_DEFAULT_MATH)
        })?;
        Ok((guard, handle))
    }

    /// Fills the f32 `out` with the standard normal stream `seed`: element `i` is
    /// [`gpu_core::nn::elementwise::randn_at`]`(seed, i)` to within 3e-6 (the kernel's f32
    /// `logf`/`sqrtf`/`cospif` against the reference's f64). The sketches of a randomized SVD
    /// are drawn here, on the device, instead of on the host and copied.
    pub fn fill_randn(&self, out: &mut CudaBuffer, seed: u64) -> Result<()> {
        const OP: &str = "fill_randn";
        check_mat(OP, "out", out, out.len(), 1, out.len().max(1))?;
        self.check_owned(OP, &[out])?;
        let n = out.len();
        if n == 0 {
            return Ok(());
        }
        let args = [
            KernelArg::from(&mut *out),
            KernelArg::U64(n as u64),
            KernelArg::U64(seed),
        ];
        // SAFETY: randn_f32(float* out, u64 n, u64 seed); `out` holds n f32.
        unsafe { self.launch("randn_f32", self.stride_grid(n), &args) }
    }

    /// `C = alpha·op(A)·op(B) + beta·C` on column-major matrices: `op(A)` is `m × k`, `op(B)`
    /// `k × n`, `C` `m × n`. With `beta = 1` it updates `C` in place, one output tile at a time
    /// inside cuBLAS. Full f32 (never TF32).
    pub fn gemm_cm(
        &self,
        (ta, tb): (bool, bool),
        (m, n, k): (usize, usize, usize),
        (alpha, beta): (f32, f32),
        (a, lda): (&CudaBuffer, usize),
        (b, ldb): (&CudaBuffer, usize),
        (c, ldc): (&mut CudaBuffer, usize),
    ) -> Result<()> {
        const OP: &str = "gemm_cm";
        let (ar, ac) = if ta { (k, m) } else { (m, k) };
        let (br, bc) = if tb { (n, k) } else { (k, n) };
        check_mat(OP, "A", a, ar, ac, lda)?;
        check_mat(OP, "B", b, br, bc, ldb)?;
        check_mat(OP, "C", c, m, n, ldc)?;
        self.check_owned(OP, &[a, b, c])?;
        if m == 0 || n == 0 {
            return Ok(());
        }
        let (m, n, k) = (int(OP, m)?, int(OP, n)?, int(OP, k)?);
        let (lda, ldb, ldc) = (int(OP, lda)?, int(OP, ldb)?, int(OP, ldc)?);
        let (_guard, handle) = self.blas_full_f32()?;
        // SAFETY: `check_mat` showed every operand's buffer holds its matrix at its leading
        // dimension (with k = 0, cuBLAS reads nothing and scales C by beta).
        blas_ok("cublasSgemm", unsafe {
            blas::cublasSgemm_v2(
                handle,
                op_of(ta),
                op_of(tb),
                m,
                n,
                k,
                &alpha,
                a.device_ptr() as *const f32,
                lda,
                b.device_ptr() as *const f32,
                ldb,
                &beta,
                c.device_ptr() as *mut f32,
                ldc,
            )
        })
    }

    /// `AᵀB` as a sum of parts, for tall `A` (`rows × m`) and `B` (`rows × n`), column-major:
    /// part `s` is `A_sᵀ·B_s` over rows `[s·chunk, (s + 1)·chunk)` (the last part takes the
    /// remainder), written back to back (`m × n` each, `ld = m`) into `parts`; returns their
    /// count, `⌈rows / chunk⌉`. One strided-batched GEMM (and one more for a remainder)
    /// instead of one GEMM whose few output tiles would each run the whole length alone: the
    /// sum is left to the consumer (`chol_rinv_f32` and `jacobi_svd_f32` add them in f64).
    pub fn gemm_tn_parts_cm(
        &self,
        rows: usize,
        (m, n): (usize, usize),
        (a, lda): (&CudaBuffer, usize),
        (b, ldb): (&CudaBuffer, usize),
        chunk: usize,
        parts: &mut CudaBuffer,
    ) -> Result<usize> {
        const OP: &str = "gemm_tn_parts_cm";
        if chunk == 0 {
            return Err(GpuError::invalid(OP, "chunk must be positive"));
        }
        check_mat(OP, "A", a, rows, m, lda)?;
        check_mat(OP, "B", b, rows, n, ldb)?;
        let count = rows.div_ceil(chunk);
        let mn = m
            .checked_mul(n)
            .ok_or_else(|| GpuError::invalid(OP, "m × n overflows"))?;
        let need = mn
            .checked_mul(count)
            .ok_or_else(|| GpuError::invalid(OP, "parts overflow"))?;
        check_mat(OP, "parts", parts, need.max(1), 1, need.max(1))?;
        self.check_owned(OP, &[a, b, parts])?;
        if mn == 0 || rows == 0 {
            return Ok(count);
        }
        let full = rows / chunk;
        let rest = rows - full * chunk;
        let (mi, ni, lda_i, ldb_i) = (int(OP, m)?, int(OP, n)?, int(OP, lda)?, int(OP, ldb)?);
        let stride = |v: usize| i64::try_from(v).map_err(|_| GpuError::invalid(OP, "stride"));
        let (sc, sp) = (stride(chunk)?, stride(mn)?);
        let (_guard, handle) = self.blas_full_f32()?;
        // `batch` products of `k` rows each, the first starting at row `row` and writing part
        // `part`.
        let products = |k: usize, row: usize, part: usize, batch: usize| -> Result<()> {
            let (one, zero) = (1.0f32, 0.0f32);
            let (ki, bi) = (int(OP, k)?, int(OP, batch)?);
            // SAFETY: product s reads rows [row + s·k, row + (s + 1)·k) of A and B, inside them
            // (row + batch·k <= rows, checked with their leading dimensions above), and writes
            // part `part + s`, inside `parts` (count·m·n elements, checked).
            blas_ok("cublasSgemmStridedBatched", unsafe {
                blas::cublasSgemmStridedBatched(
                    handle,
                    blas::cublasOperation_t::CUBLAS_OP_T,
                    blas::cublasOperation_t::CUBLAS_OP_N,
                    mi,
                    ni,
                    ki,
                    &one,
                    (a.device_ptr() as *const f32).wrapping_add(row),
                    lda_i,
                    sc,
                    (b.device_ptr() as *const f32).wrapping_add(row),
                    ldb_i,
                    sc,
                    &zero,
                    (parts.device_ptr() as *mut f32).wrapping_add(part * mn),
                    mi,
                    sp,
                    bi,
                )
            })
        };
        if full > 0 {
            products(chunk, 0, 0, full)?;
        }
        if rest > 0 {
            products(rest, full * chunk, full, 1)?;
        }
        Ok(count)
    }

    /// `C = Aᵀ` for a column-major `rows × cols` `A`; `C` is `cols × rows`.
    pub fn transpose_cm(
        &self,
        (rows, cols): (usize, usize),
        (a, lda): (&CudaBuffer, usize),
        (c, ldc): (&mut CudaBuffer, usize),
    ) -> Result<()> {
        const OP: &str = "transpose_cm";
        check_mat(OP, "A", a, rows, cols, lda)?;
        check_mat(OP, "C", c, cols, rows, ldc)?;
        self.check_owned(OP, &[a, c])?;
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let (r, cl, lda, ldc) = (int(OP, rows)?, int(OP, cols)?, int(OP, lda)?, int(OP, ldc)?);
        let (_guard, handle) = self.blas_bound()?;
        let (one, zero) = (1.0f32, 0.0f32);
        // SAFETY: shapes checked above; with beta = 0, B is not read (C is passed for it, as
        // cuBLAS allows when beta is zero and the shapes match).
        blas_ok("cublasSgeam", unsafe {
            blas::cublasSgeam(
                handle,
                blas::cublasOperation_t::CUBLAS_OP_T,
                blas::cublasOperation_t::CUBLAS_OP_N,
                cl,
                r,
                &one,
                a.device_ptr() as *const f32,
                lda,
                &zero,
                c.device_ptr() as *const f32,
                ldc,
                c.device_ptr() as *mut f32,
                ldc,
            )
        })
    }

    /// `C = diag(x)·A` (each row `i` of the column-major `rows × cols` `A` times `x[i]`).
    pub fn scale_rows_cm(
        &self,
        (rows, cols): (usize, usize),
        (a, lda): (&CudaBuffer, usize),
        x: &CudaBuffer,
        (c, ldc): (&mut CudaBuffer, usize),
    ) -> Result<()> {
        const OP: &str = "scale_rows_cm";
        check_mat(OP, "A", a, rows, cols, lda)?;
        check_mat(OP, "x", x, rows, 1, rows.max(1))?;
        check_mat(OP, "C", c, rows, cols, ldc)?;
        self.check_owned(OP, &[a, x, c])?;
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let (r, cl, lda, ldc) = (int(OP, rows)?, int(OP, cols)?, int(OP, lda)?, int(OP, ldc)?);
        let (_guard, handle) = self.blas_bound()?;
        // SAFETY: shapes checked above; `x` holds `rows` values read with stride 1.
        blas_ok("cublasSdgmm", unsafe {
            blas::cublasSdgmm(
                handle,
                blas::cublasSideMode_t::CUBLAS_SIDE_LEFT,
                r,
                cl,
                a.device_ptr() as *const f32,
                lda,
                x.device_ptr() as *const f32,
                1,
                c.device_ptr() as *mut f32,
                ldc,
            )
        })
    }

    /// Replaces the column-major `rows × cols` `A` (`rows >= cols`) by the orthonormal `Q` of
    /// its Householder QR (`geqrf`, then `orgqr`). A rank-deficient `A` still gives
    /// orthonormal columns (Householder reflections are orthogonal whatever the data).
    pub fn orthonormalize_cm(
        &self,
        (rows, cols): (usize, usize),
        (a, lda): (&mut CudaBuffer, usize),
        info: &mut SolverInfo,
    ) -> Result<()> {
        const OP: &str = "orthonormalize_cm";
        check_mat(OP, "A", a, rows, cols, lda)?;
        if rows < cols {
            return Err(GpuError::invalid(
                OP,
                format!("needs rows >= cols, got {rows}×{cols}"),
            ));
        }
        self.check_owned(OP, &[a, &info.buf])?;
        if cols == 0 {
            return Ok(());
        }
        let (r, c, ld) = (int(OP, rows)?, int(OP, cols)?, int(OP, lda)?);
        let (_guard, h) = self.solver_bound()?;
        let pa = a.device_ptr() as *mut f32;
        let tau = self.allocate(DType::F32, cols)?;
        let ptau = tau.device_ptr() as *mut f32;
        let (mut lq, mut lo) = (0 as c_int, 0 as c_int);
        // SAFETY: size queries only read the shapes (A is checked above, tau holds `cols`).
        unsafe {
            solver_ok(
                "cusolverDnSgeqrf_bufferSize",
                solver::cusolverDnSgeqrf_bufferSize(h, r, c, pa, ld, &mut lq),
            )?;
            solver_ok(
                "cusolverDnSorgqr_bufferSize",
                solver::cusolverDnSorgqr_bufferSize(h, r, c, c, pa, ld, ptau, &mut lo),
            )?;
        }
        let lwork = lq.max(lo).max(1);
        let work = self.allocate(DType::F32, lwork as usize)?;
        let (i1, i2) = (info.slot(OP)?, info.slot(OP)?);
        // SAFETY: A is `rows × cols` at `ld` (checked), tau holds `cols` values, the workspace
        // holds `lwork` f32 as queried, each info pointer is a distinct slot of the info buffer.
        unsafe {
            solver_ok(
                "cusolverDnSgeqrf",
                solver::cusolverDnSgeqrf(
                    h,
                    r,
                    c,
                    pa,
                    ld,
                    ptau,
                    work.device_ptr() as *mut f32,
                    lwork,
                    i1,
                ),
            )?;
            solver_ok(
                "cusolverDnSorgqr",
                solver::cusolverDnSorgqr(
                    h,
                    r,
                    c,
                    c,
                    pa,
                    ld,
                    ptau,
                    work.device_ptr() as *mut f32,
                    lwork,
                    i2,
                ),
            )
        }
    }

    /// cuSOLVER's randomized SVD (`cusolverDnXgesvdr`, fp32) of the column-major `m × n` `A`
    /// (destroyed) at rank `k` with oversampling `p` (`k + p <= min(m, n)`) and `iters` power
    /// iterations: fills `s` (`min(m, n)` values, the first `k` descending), `u` (`m × m`, the
    /// first `k` columns the left singular vectors, `ld = m`) and `v` (`n × n`, likewise,
    /// `ld = n`). Returns after queuing; `info` records the call's status.
    pub fn gesvdr_cm(
        &self,
        (m, n): (usize, usize),
        a: &mut CudaBuffer,
        (k, p, iters): (usize, usize, usize),
        (s, u, v): (&mut CudaBuffer, &mut CudaBuffer, &mut CudaBuffer),
        info: &mut SolverInfo,
    ) -> Result<()> {
        const OP: &str = "gesvdr_cm";
        check_gesvdr((m, n), (k, p), a, [s, u, v])?;
        self.check_owned(OP, &[a, s, u, v, &info.buf])?;
        let (_guard, h) = self.solver_bound()?;
        let params = solver_result::dn_create_params().map_err(|e| GpuError::cuda(OP, e))?;
        let r32 = solver::cudaDataType_t::CUDA_R_32F;
        let (jobu, jobv) = (b'S' as std::os::raw::c_schar, b'S' as std::os::raw::c_schar);
        let (m64, n64, k64, p64, it64) = (m as i64, n as i64, k as i64, p as i64, iters as i64);
        let (pa, ps, pu, pv) = (
            a.device_ptr() as *mut std::ffi::c_void,
            s.device_ptr() as *mut std::ffi::c_void,
            u.device_ptr() as *mut std::ffi::c_void,
            v.device_ptr() as *mut std::ffi::c_void,
        );
        // The size query and the call take the same problem description (handle, params,
        // jobs, sizes, then each matrix with its type and leading dimension) before their own
        // workspace arguments.
        macro_rules! gesvdr_call {
            ($f:path, $($tail:expr),+ $(,)?) => {
                $f(
                    h,
                    params,
                    jobu,
                    jobv,
                    m64,
                    n64,
                    k64,
                    p64,
                    it64,
                    r32,
                    pa,
                    m64,
                    r32,
                    ps,
                    r32,
                    pu,
                    m64,
                    r32,
                    pv,
                    n64,
                    r32,
                    $($tail),+
                )
            };
        }
        let (mut dev_bytes, mut host_bytes) = (0usize, 0usize);
        let mut run = || -> Result<()> {
            // SAFETY: a size query on checked shapes (A m×n ld m, S min(m, n), U m×m, V n×n).
            solver_ok("cusolverDnXgesvdr_bufferSize", unsafe {
                gesvdr_call!(
                    solver::cusolverDnXgesvdr_bufferSize,
                    &mut dev_bytes,
                    &mut host_bytes,
                )
            })?;
            let dev = self.allocate(DType::U32, dev_bytes.div_ceil(4).max(1))?;
            let mut host = vec![0u8; host_bytes.max(1)];
            let slot = info.slot(OP)?;
            // SAFETY: the same checked shapes; the workspaces hold the queried sizes and the
            // host one outlives the call (the stream is synchronised before it is dropped).
            solver_ok("cusolverDnXgesvdr", unsafe {
                gesvdr_call!(
                    solver::cusolverDnXgesvdr,
                    dev.device_ptr() as *mut std::ffi::c_void,
                    dev_bytes,
                    host.as_mut_ptr() as *mut std::ffi::c_void,
                    host_bytes,
                    slot,
                )
            })?;
            // The host workspace must outlive every use cuSOLVER makes of it.
            self.synchronize()
        };
        let out = run();
        // SAFETY: `params` was created above and is destroyed once.
        let destroyed = unsafe { solver_result::dn_destroy_params(params) };
        out?;
        destroyed.map_err(|e| GpuError::cuda("cusolverDnDestroyParams", e))
    }
}

/// Checks the arguments of [`CudaBackend::gesvdr_cm`]: `1 <= k`, `k + p <= min(m, n)`, and `A`,
/// `S`, `U`, `V` of their sizes.
fn check_gesvdr(
    (m, n): (usize, usize),
    (k, p): (usize, usize),
    a: &CudaBuffer,
    [s, u, v]: [&CudaBuffer; 3],
) -> Result<()> {
    const OP: &str = "gesvdr_cm";
    let min = m.min(n);
    if k == 0 || k.checked_add(p).is_none_or(|l| l > min) {
        return Err(GpuError::invalid(
            OP,
            format!("needs 1 <= k and k + p <= min(m, n) = {min}, got k {k}, p {p}"),
        ));
    }
    check_mat(OP, "A", a, m, n, m)?;
    check_mat(OP, "S", s, min, 1, min)?;
    check_mat(OP, "U", u, m, m, m)?;
    check_mat(OP, "V", v, n, n, n)
}
