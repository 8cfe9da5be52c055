//! Cholesky QR2 for tall-skinny f32 matrices (`cols <= 64`): the fast orthonormalisation of the
//! randomized SVD. One pass is `G = YᵀY` in row-block parts (cuBLAS,
//! [`CudaBackend::gemm_tn_parts_cm`]), `R⁻¹` from `G = RᵀR` (`kernels/linalg_cholqr.cu`, one
//! block, f64) and `Q = Y·R⁻¹` (cuBLAS); the second pass repeats it on
//! `Q` and restores the orthogonality the first lost to the condition number (Yamamoto,
//! Nakatsukasa, Yanagisawa and Fukaya 2015). Three small launches a pass instead of cuSOLVER's
//! `geqrf` + `orgqr`.
//!
//! Nothing is read back: a breakdown (a pivot that is not positive, or a first pass that left
//! `Q` further than 1/2 in Frobenius norm from orthonormal) only sets a flag on the device,
//! which the caller reads once at its own synchronisation ([`CholQrWork::failed`]) and then
//! redoes the work with Householder QR ([`CudaBackend::orthonormalize_cm`]).

use crate::backend::CudaBackend;
use crate::launch::{KernelArg, LaunchConfig};
use crate::linalg::check_mat;
use crate::pool::CudaBuffer;
use gpu_core::{Backend, BufferInfo, DType, GpuError, Result};

/// The widest matrix Cholesky QR takes here (the kernel's shared-memory tile).
pub const CHOLQR_MAX_COLS: usize = 64;

/// Rows per part of the Gram matrices: enough parts (at most 32) to spread the products over
/// the GPU, few enough for one block to add them up.
pub fn gram_chunk(rows: usize) -> usize {
    rows.div_ceil(GRAM_PARTS).max(128)
}

/// The most parts [`gram_chunk`] makes.
pub const GRAM_PARTS: usize = 32;

/// Cholesky QR's flag bits: 1 = a pivot that is not positive, 2 = a second pass given a matrix
/// further than 1/2 (Frobenius) from orthonormal.
pub const CHOLQR_BREAKDOWN: u32 = 3;

/// Scratch of [`CudaBackend::cholqr2_cm`] for matrices up to `rows × cols`, and the failure
/// flag that its calls OR into.
#[derive(Debug)]
pub struct CholQrWork {
    rows: usize,
    cols: usize,
    q: CudaBuffer,
    gram: CudaBuffer,
    rinv: CudaBuffer,
    flag: CudaBuffer,
}

impl CholQrWork {
    /// Scratch for up to `rows × cols` (`cols <= 64`), the flag cleared.
    pub fn new(gpu: &CudaBackend, rows: usize, cols: usize) -> Result<CholQrWork> {
        const OP: &str = "CholQrWork::new";
        if cols > CHOLQR_MAX_COLS {
            return Err(GpuError::invalid(
                OP,
                format!("at most {CHOLQR_MAX_COLS} columns, got {cols}"),
            ));
        }
        let len = rows
            .checked_mul(cols)
            .ok_or_else(|| GpuError::invalid(OP, "rows × cols overflows"))?;
        let mut flag = gpu.allocate(DType::U32, 1)?;
        gpu.memset32(&mut flag, 0)?;
        Ok(CholQrWork {
            rows,
            cols,
            q: gpu.allocate(DType::F32, len.max(1))?,
            gram: gpu.allocate(DType::F32, (GRAM_PARTS * cols * cols).max(1))?,
            rinv: gpu.allocate(DType::F32, (cols * cols).max(1))?,
            flag,
        })
    }

    /// Whether any Cholesky QR call since [`CholQrWork::new`] broke down (reads the flag back:
    /// one synchronisation).
    pub fn failed(&self, gpu: &CudaBackend) -> Result<bool> {
        Ok(self.flag_bits(gpu)? & CHOLQR_BREAKDOWN != 0)
    }

    /// Queues the flag's reset to 0 (so that one scratch serves many calls, also inside a
    /// captured graph).
    pub fn clear_flag(&mut self, gpu: &CudaBackend) -> Result<()> {
        gpu.memset32(&mut self.flag, 0)
    }

    /// The flag, for kernels that report into the same word (`crate::small_svd`).
    pub fn flag_mut(&mut self) -> &mut CudaBuffer {
        &mut self.flag
    }

    /// The raw flag bits ([`CHOLQR_BREAKDOWN`] for Cholesky QR's; others from kernels given
    /// [`CholQrWork::flag_mut`]). One synchronisation.
    pub fn flag_bits(&self, gpu: &CudaBackend) -> Result<u32> {
        Ok(gpu.download::<u32>(&self.flag)?[0])
    }
}

impl CudaBackend {
    /// Replaces the column-major `rows × cols` `A` (`rows >= cols`, `cols <= 64`) by an
    /// orthonormal `Q` with the same column space, by two passes of Cholesky QR. Queued only;
    /// a breakdown sets `work`'s flag (see the module docs) and leaves finite garbage in `A`.
    pub fn cholqr2_cm(
        &self,
        (rows, cols): (usize, usize),
        (a, lda): (&mut CudaBuffer, usize),
        work: &mut CholQrWork,
    ) -> Result<()> {
        const OP: &str = "cholqr2_cm";
        self.cholqr_checks(OP, (rows, cols), (a, lda), work)?;
        if cols == 0 {
            return Ok(());
        }
        let CholQrWork {
            q,
            gram,
            rinv,
            flag,
            ..
        } = work;
        // Pass 1: A → Q₁ (in the scratch); pass 2: Q₁ → Q₂ (back into A).
        let dims = (rows, cols);
        self.cholqr_pass(dims, (a, lda), (gram, rinv, flag), false, (q, rows))?;
        self.cholqr_pass(dims, (q, rows), (gram, rinv, flag), true, (a, lda))
    }

    /// One pass of Cholesky QR on the column-major `rows × cols` `A` (`rows >= cols`,
    /// `cols <= 64`): `out` (`rows × cols`, its own buffer) becomes `A·R⁻¹`, whose columns span
    /// the same space as `A`'s and are
    /// orthonormal to `u·κ(A)²` (Yamamoto et al. 2015), not to working precision. For the
    /// intermediate bases of a subspace iteration, whose next product needs a well-conditioned
    /// basis of the right span, not an orthonormal one. Queued only; a non-positive pivot sets
    /// `work`'s flag (bit 0).
    pub fn cholqr1_cm(
        &self,
        (rows, cols): (usize, usize),
        (a, lda): (&CudaBuffer, usize),
        (out, ldo): (&mut CudaBuffer, usize),
        work: &mut CholQrWork,
    ) -> Result<()> {
        const OP: &str = "cholqr1_cm";
        self.cholqr_checks(OP, (rows, cols), (a, lda), work)?;
        check_mat(OP, "out", out, rows, cols, ldo)?;
        self.check_owned(OP, &[out])?;
        if cols == 0 {
            return Ok(());
        }
        let CholQrWork {
            gram, rinv, flag, ..
        } = work;
        self.cholqr_pass(
            (rows, cols),
            (a, lda),
            (gram, rinv, flag),
            false,
            (out, ldo),
        )
    }

    /// The checks both Cholesky QR entry points make.
    fn cholqr_checks(
        &self,
        op: &'static str,
        (rows, cols): (usize, usize),
        (a, lda): (&CudaBuffer, usize),
        work: &CholQrWork,
    ) -> Result<()> {
        check_mat(op, "A", a, rows, cols, lda)?;
        if rows < cols || rows > work.rows || cols > work.cols {
            return Err(GpuError::invalid(
                op,
                format!(
                    "needs cols <= rows, within the scratch's {}×{}; got {rows}×{cols}",
                    work.rows, work.cols
                ),
            ));
        }
        self.check_owned(op, &[a, &work.q, &work.gram, &work.rinv, &work.flag])
    }

    /// `gram = YᵀY` (in parts), `rinv = R⁻¹` of its Cholesky factor, then `out = Y·R⁻¹`.
    fn cholqr_pass(
        &self,
        (rows, cols): (usize, usize),
        (y, ldy): (&CudaBuffer, usize),
        (gram, rinv, flag): (&mut CudaBuffer, &mut CudaBuffer, &mut CudaBuffer),
        check: bool,
        (out, ldo): (&mut CudaBuffer, usize),
    ) -> Result<()> {
        let parts = self.gemm_tn_parts_cm(
            rows,
            (cols, cols),
            (y, ldy),
            (y, ldy),
            gram_chunk(rows),
            gram,
        )?;
        self.chol_rinv_cm(cols, (gram, parts), rinv, flag, check)?;
        self.gemm_cm(
            (false, false),
            (rows, cols, cols),
            (1.0, 0.0),
            (y, ldy),
            (rinv, cols),
            (out, ldo),
        )
    }

    /// The kernel alone: `rinv` (column-major `l × l`) = `R⁻¹` where `G = RᵀR`, `G` the sum of
    /// the `nparts` column-major `l × l` f32 matrices at the start of `g` (its lower triangle is
    /// read); ORs the breakdown bits into `flag[0]` (bit 1 only when `check`). See
    /// [`chol_rinv_reference`].
    pub fn chol_rinv_cm(
        &self,
        l: usize,
        (g, nparts): (&CudaBuffer, usize),
        rinv: &mut CudaBuffer,
        flag: &mut CudaBuffer,
        check: bool,
    ) -> Result<()> {
        const OP: &str = "chol_rinv_cm";
        if l > CHOLQR_MAX_COLS {
            return Err(GpuError::invalid(
                OP,
                format!("at most {CHOLQR_MAX_COLS} columns, got {l}"),
            ));
        }
        if nparts == 0 {
            return Err(GpuError::invalid(OP, "at least one part"));
        }
        check_mat(OP, "G", g, l, l * nparts, l.max(1))?;
        check_mat(OP, "R⁻¹", rinv, l, l, l.max(1))?;
        if flag.dtype() != DType::U32 || flag.len() == 0 {
            return Err(GpuError::invalid(OP, "the flag must be at least one u32"));
        }
        self.check_owned(OP, &[g, rinv, flag])?;
        if l == 0 {
            return Ok(());
        }
        let args = [
            KernelArg::from(g),
            KernelArg::U32(u32::try_from(nparts).map_err(|_| GpuError::invalid(OP, "parts"))?),
            KernelArg::from(&mut *rinv),
            KernelArg::from(&mut *flag),
            KernelArg::U32(l as u32),
            KernelArg::U32(check as u32),
        ];
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: chol_rinv_f32(const float* g, unsigned nparts, float* rinv, unsigned* flag,
        // unsigned l, unsigned check); g holds nparts·l·l f32 and rinv l·l (checked), flag one
        // u32, l <= 64 (the kernel's static row buffers), and the 1024 threads its row groups
        // assume (at most 4 rows a thread).
        unsafe { self.launch("chol_rinv_f32", cfg, &args) }
    }
}

/// The CPU reference of `chol_rinv_f32`: the same steps in f64 on the f32 input, `g` the
/// `nparts` parts back to back, added in f64 in order (the kernel fuses some multiply-adds, so
/// the two differ by f64 rounding). Returns
/// `R⁻¹` (column-major `l × l`, zeros below the diagonal, rounded to f32) and the flag bits.
pub fn chol_rinv_reference(
    g: &[f32],
    nparts: usize,
    l: usize,
    check: bool,
) -> Result<(Vec<f32>, u32)> {
    let need = l.checked_mul(l).and_then(|x| x.checked_mul(nparts));
    if nparts == 0 || need != Some(g.len()) {
        return Err(GpuError::shape(
            "chol_rinv_reference",
            format!("{nparts} (at least one) {l} × {l} matrices"),
            g.len(),
        ));
    }
    // a(i, c) = G(c, i), upper triangle only.
    let mut a = vec![0.0f64; l * l];
    let mut off = 0.0f64;
    for i in 0..l {
        for c in 0..l {
            let v: f64 = (0..nparts)
                .map(|p| f64::from(g[(p * l + i) * l + c]))
                .fold(0.0, |acc, x| acc + x);
            let e = v - if i == c { 1.0 } else { 0.0 };
            off += e * e;
            if i <= c {
                a[i * l + c] = v;
            }
        }
    }
    // NaN fails both tests (`<=` and `>` are false for it), as in the kernel.
    let near = off.sqrt() <= 0.5;
    let mut bad = if check && !near { 2 } else { 0 };
    // Symmetric elimination on [G | I] in one array (see the kernel): row i holds the trailing
    // G for c >= i and L⁻¹(i, c) for c < i; the pivots are kept apart.
    let mut piv = vec![0.0f64; l];
    for j in 0..l {
        let d = a[j * l + j];
        let positive = d > 0.0;
        if !positive {
            bad |= 1;
        }
        piv[j] = if positive { d } else { 1.0 };
        let inv = 1.0 / piv[j];
        for i in j + 1..l {
            let f = a[j * l + i] * inv;
            for c in (0..=j).chain(i..l) {
                a[i * l + c] = if c == j {
                    -f
                } else {
                    a[i * l + c] - f * a[j * l + c]
                };
            }
        }
    }
    // R = D^½·Lᵀ: R⁻¹(i, c) = L⁻¹(c, i)/√d_c for i < c, 1/√d_i on the diagonal.
    let mut t = vec![0.0f64; l * l];
    for c in 0..l {
        for i in 0..=c {
            t[i * l + c] = if i == c {
                1.0 / piv[i].sqrt()
            } else {
                a[c * l + i] / piv[c].sqrt()
            };
        }
    }
    let a = t;
    let mut out = vec![0.0f32; l * l];
    for c in 0..l {
        for i in 0..=c {
            out[i + c * l] = a[i * l + c] as f32;
        }
    }
    Ok((out, bad))
}
