//! The small dense SVD that ends a randomized SVD, on the device: `R = Ũ·Σ·Ṽᵀ` for an `l × l`
//! f32 matrix (`l <= 64`) by one-sided Jacobi in f64 in one block
//! (`kernels/linalg_jacobi.cu`), so that the factors never go through the host. Its reference
//! is an exact f64 SVD (nalgebra's, in the tests and in `rssm`'s host path).
//!
//! Nothing is read back: a failure (no convergence, a zero or non-finite singular value among
//! the first `k`, an f32 overflow) only ORs a bit into a device flag, which the caller reads at
//! its own synchronisation and answers with its host path.

use crate::backend::CudaBackend;
use crate::launch::{KernelArg, LaunchConfig};
use crate::linalg::check_mat;
use crate::pool::CudaBuffer;
use gpu_core::{BufferInfo, DType, GpuError, Result};

/// The largest `l` the kernel takes (its shared-memory tiles).
pub const SMALL_SVD_MAX: usize = 64;

/// Flag bits of [`CudaBackend::jacobi_svd_cm`].
pub const JACOBI_NO_CONVERGENCE: u32 = 4;
/// A singular value among the first `k` is zero (or a column is not finite).
pub const JACOBI_DEGENERATE: u32 = 8;
/// A singular value overflows f32 once multiplied by `inv_scale`.
pub const JACOBI_OVERFLOW: u32 = 16;

impl CudaBackend {
    /// The SVD of `R`, the sum of the `nparts` column-major `l × l` f32 matrices at the start of
    /// `r` (added in f64; `1 <= k <= l <= 64`): fills `u` and `v`
    /// (column-major `l × k`, the leading left and right singular vectors) and `s` (`k` values,
    /// descending, times `inv_scale`), and ORs failure bits into the u32 `flag[0]` (see the
    /// module docs). Queued only.
    pub fn jacobi_svd_cm(
        &self,
        (l, k): (usize, usize),
        (r, nparts): (&CudaBuffer, usize),
        inv_scale: f32,
        (u, s, v): (&mut CudaBuffer, &mut CudaBuffer, &mut CudaBuffer),
        flag: &mut CudaBuffer,
    ) -> Result<()> {
        const OP: &str = "jacobi_svd_cm";
        if l > SMALL_SVD_MAX || k == 0 || k > l {
            return Err(GpuError::invalid(
                OP,
                format!("needs 1 <= k <= l <= {SMALL_SVD_MAX}, got l {l}, k {k}"),
            ));
        }
        if nparts == 0 {
            return Err(GpuError::invalid(OP, "at least one part"));
        }
        check_mat(OP, "R", r, l, l * nparts, l)?;
        check_mat(OP, "U", u, l, k, l)?;
        check_mat(OP, "V", v, l, k, l)?;
        check_mat(OP, "S", s, k, 1, k)?;
        if flag.dtype() != DType::U32 || flag.len() == 0 {
            return Err(GpuError::invalid(OP, "the flag must be at least one u32"));
        }
        self.check_owned(OP, &[r, u, s, v, flag])?;
        let pairs = (l + (l & 1)) / 2;
        let args = [
            KernelArg::from(r),
            KernelArg::U32(u32::try_from(nparts).map_err(|_| GpuError::invalid(OP, "parts"))?),
            KernelArg::from(&mut *u),
            KernelArg::from(&mut *s),
            KernelArg::from(&mut *v),
            KernelArg::from(&mut *flag),
            KernelArg::U32(l as u32),
            KernelArg::U32(k as u32),
            KernelArg::F32(inv_scale),
        ];
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (32 * pairs.div_ceil(2) as u32, 1, 1),
            shared_mem_bytes: (2 * l * l * 8) as u32,
        };
        // SAFETY: jacobi_svd_f32(const float* r, unsigned nparts, float* u, float* s, float* v,
        // unsigned* flag, unsigned l, unsigned k, float inv_scale); r holds nparts·l·l f32, u
        // and v l·k, s k, flag one u32 (checked above); the block has a half-warp per column
        // pair (<= 16 warps, within the kernel's launch bounds; at least l threads) and the
        // dynamic shared memory holds A and V, 2·l·l f64.
        unsafe { self.launch_large_smem("jacobi_svd_f32", cfg, &args) }
    }
}
