//! The world model's correction on the device, `W += U·diag(S)·Vᵀ` for ranks up to
//! [`LOWRANK_MAX_RANK`], fused into one kernel (`kernels/rssm_correct.cu`) that forms each
//! 64 × 64 tile of the sum in registers, checks the whole sum before anything is written, and
//! writes it in a second launch only when every entry is finite: a failed call leaves `W` as it
//! was. Its reference is [`lowrank_add_reference`].

use crate::backend::CudaBackend;
use crate::launch::{KernelArg, LaunchConfig};
use crate::pool::CudaBuffer;
use gpu_core::{BufferInfo, DType, GpuError, Result};

/// The largest rank the fused kernel takes (its shared-memory tiles).
pub const LOWRANK_MAX_RANK: usize = 64;
/// Flag bit: an entry of `W` is NaN or ±inf.
pub const LOWRANK_NONFINITE_W: u32 = 1;
/// Flag bit: an entry of the sum is not finite (f32 overflow, or NaN/inf in a factor).
pub const LOWRANK_NONFINITE_SUM: u32 = 2;

fn dims_u32(op: &'static str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| GpuError::invalid(op, format!("size {v} above u32")))
}

impl CudaBackend {
    /// `W += U·diag(S)·Vᵀ` on row-major `W` (`m × n`), `U` (`m × k`), `S` (`k`), `V` (`n × k`),
    /// `1 <= k <= 64`. Clears the u32 `flag[0]`, then checks and (when the check passed)
    /// writes; queued only. The caller reads `flag` afterwards: 0, or the
    /// [`LOWRANK_NONFINITE_W`] / [`LOWRANK_NONFINITE_SUM`] bits, in which case `W` is unchanged.
    pub fn lowrank_add(
        &self,
        (m, n, k): (usize, usize, usize),
        w: &mut CudaBuffer,
        u: &CudaBuffer,
        s: &CudaBuffer,
        v: &CudaBuffer,
        flag: &mut CudaBuffer,
    ) -> Result<()> {
        const OP: &str = "lowrank_add";
        if k == 0 || k > LOWRANK_MAX_RANK {
            return Err(GpuError::invalid(
                OP,
                format!("needs 1 <= k <= {LOWRANK_MAX_RANK}, got {k}"),
            ));
        }
        let need = |what: &str, b: &CudaBuffer, len: Option<usize>| -> Result<()> {
            let len =
                len.ok_or_else(|| GpuError::invalid(OP, format!("{what}: size overflows")))?;
            if b.dtype() != DType::F32 || b.len() < len {
                return Err(GpuError::invalid(
                    OP,
                    format!("{what} needs {len} f32, got {} {}", b.len(), b.dtype()),
                ));
            }
            Ok(())
        };
        need("W", w, m.checked_mul(n))?;
        need("U", u, m.checked_mul(k))?;
        need("S", s, Some(k))?;
        need("V", v, n.checked_mul(k))?;
        if flag.dtype() != DType::U32 || flag.len() == 0 {
            return Err(GpuError::invalid(OP, "the flag must be at least one u32"));
        }
        self.check_owned(OP, &[w, u, s, v, flag])?;
        let (mu, nu, ku) = (dims_u32(OP, m)?, dims_u32(OP, n)?, dims_u32(OP, k)?);
        self.memset32(flag, 0)?;
        if m == 0 || n == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (nu.div_ceil(64), mu.div_ceil(64), 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        if cfg.grid_dim.1 > 65_535 {
            return Err(GpuError::invalid(OP, format!("{m} rows: too many tiles")));
        }
        for write in [0u32, 1] {
            let args = [
                KernelArg::from(&mut *w),
                KernelArg::from(u),
                KernelArg::from(s),
                KernelArg::from(v),
                KernelArg::from(&mut *flag),
                KernelArg::U32(mu),
                KernelArg::U32(nu),
                KernelArg::U32(ku),
                KernelArg::U32(write),
            ];
            // SAFETY: lowrank_add_f32(float* w, const float* u, const float* s, const float* v,
            // unsigned* flag, unsigned m, unsigned n, unsigned k, unsigned write): W holds m·n,
            // U m·k, S k and V n·k f32 and the flag one u32 (checked above); k <= 64 fits the
            // kernel's tiles; 256 threads as its 16 × 16 layout needs; the grid covers W in
            // 64 × 64 tiles.
            unsafe { self.launch("lowrank_add_f32", cfg, &args)? };
        }
        Ok(())
    }
}

/// The CPU reference of `lowrank_add_f32`: the same sums in f64 (`w + Σ_r (u_ir·s_r)·v_jr`),
/// rounded to f32, and the flag bits the kernel would set. `w` is returned unchanged when a bit
/// is set.
pub fn lowrank_add_reference(
    (m, n, k): (usize, usize, usize),
    w: &[f32],
    u: &[f32],
    s: &[f32],
    v: &[f32],
) -> (Vec<f32>, u32) {
    let mut out = w.to_vec();
    let mut bits = 0;
    for i in 0..m {
        for j in 0..n {
            let x = w[i * n + j];
            let sum: f64 = (0..k)
                .map(|r| f64::from(u[i * k + r] * s[r]) * f64::from(v[j * k + r]))
                .sum();
            let y = (f64::from(x) + sum) as f32;
            if !x.is_finite() {
                bits |= LOWRANK_NONFINITE_W;
            }
            if !y.is_finite() {
                bits |= LOWRANK_NONFINITE_SUM;
            }
            out[i * n + j] = y;
        }
    }
    if bits != 0 {
        out = w.to_vec();
    }
    (out, bits)
}
