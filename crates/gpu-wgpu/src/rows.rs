//! [`RowOps`] for [`WgpuBackend`]: LayerNorm's forward as one fused kernel (the default
//! composes ~8 launches and 4 temporaries), the other row ops from gpu-core's defaults. f32
//! sums in a tree against the CPU's f64: within the defaults' bounds.

use crate::backend::WgpuBackend;
use crate::buffer::WgpuBuffer;
use crate::kernels::{src, to_u32};
use gpu_core::backend::BufferInfo;
use gpu_core::nn::defaults::rows as defaults;
use gpu_core::nn::rows::{check_eps, check_norm};
use gpu_core::nn::RowOps;
use gpu_core::{DType, Result};

const LAYERNORM_FWD: &str = include_str!("shaders/layernorm_fwd.wgsl");

type Buf = WgpuBuffer;

impl RowOps for WgpuBackend {
    /// One workgroup of 64 threads a row for f32 (other dtypes: the default).
    fn layernorm_fwd(
        &self,
        (x, w, b): (&Buf, &Buf, &Buf),
        (y, mean, rstd): (&mut Buf, &mut Buf, &mut Buf),
        cols: usize,
        eps: f32,
    ) -> Result<()> {
        const OP: &str = "layernorm_fwd";
        check_eps(OP, eps)?;
        let rows = check_norm(
            OP,
            x,
            y,
            &[("w", w), ("b", b)],
            &[("mean", mean), ("rstd", rstd)],
            cols,
        )?;
        self.check_out(OP, &[x, w, b, y, mean, rstd])?;
        if x.dtype() != DType::F32 {
            let n = defaults::NormIn { x, w, rows, cols };
            return defaults::layernorm(self, n, b, (y, mean, rstd), eps);
        }
        let p = [
            to_u32(OP, rows)?,
            to_u32(OP, cols)?,
            eps.to_bits(),
            0,
            0,
            0,
            0,
            0,
        ];
        let (gx, gy) = self.grid(OP, to_u32(OP, rows)?)?;
        let bufs = [x.raw(), w.raw(), b.raw(), y.raw(), mean.raw(), rstd.raw()];
        let body = || src(LAYERNORM_FWD);
        self.launch(OP, (OP, body), p, (gx, (gx, gy, 1)), &bufs)
    }
}
