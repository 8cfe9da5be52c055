//! [`RowOps`] for [`WgpuBackend`]: LayerNorm's forward as one fused kernel (the default
//! composes ~8 launches and 4 temporaries) and its backward as one row kernel and two column
//! reductions (the default: ~14 launches), the other row ops from gpu-core's defaults. f32
//! sums in a tree against the CPU's f64: within the defaults' bounds.

use crate::backend::WgpuBackend;
use crate::buffer::WgpuBuffer;
use crate::kernels::{src, to_u32};
use gpu_core::backend::{Backend, BufferInfo};
use gpu_core::nn::defaults::rows as defaults;
use gpu_core::nn::rows::{check_eps, check_norm, LayerNormBwdIn};
use gpu_core::nn::{Primitives, ReduceKind, RowOps};
use gpu_core::ops::check_elementwise;
use gpu_core::{DType, Result};

const LAYERNORM_FWD: &str = include_str!("shaders/layernorm_fwd.wgsl");
const LAYERNORM_BWD: &str = include_str!("shaders/layernorm_bwd.wgsl");
const WG_SUM64: &str = include_str!("shaders/wg_sum64.wgsl");

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
        let body = || src(&format!("{WG_SUM64}{LAYERNORM_FWD}"));
        self.launch(OP, (OP, body), p, (gx, (gx, gy, 1)), &bufs)
    }

    /// For f32: one workgroup of 64 threads a row writes `dx` and `dy·x̂`, then `dw` and `db`
    /// are column sums (`reduce_axis`); other dtypes: the default.
    fn layernorm_bwd(
        &self,
        input: LayerNormBwdIn<'_, Buf>,
        (dx, dw, db): (&mut Buf, &mut Buf, &mut Buf),
        cols: usize,
    ) -> Result<()> {
        const OP: &str = "layernorm_bwd";
        let LayerNormBwdIn {
            x,
            w,
            mean,
            rstd,
            dy,
        } = input;
        let rows = check_norm(
            OP,
            x,
            dx,
            &[("w", w), ("dw", dw), ("db", db)],
            &[("mean", mean), ("rstd", rstd)],
            cols,
        )?;
        check_elementwise(OP, &[dy], dx)?;
        self.check_out(OP, &[x, w, mean, rstd, dy, dx, dw, db])?;
        if x.dtype() != DType::F32 {
            let n = defaults::NormIn { x, w, rows, cols };
            let stats = defaults::NormStats {
                mean: Some(mean),
                rstd,
                dy,
            };
            return defaults::norm_bwd(self, n, stats, (dx, dw, Some(db)));
        }
        let dyx = self.allocate(DType::F32, rows * cols)?;
        let p = [to_u32(OP, rows)?, to_u32(OP, cols)?, 0, 0, 0, 0, 0, 0];
        let (gx, gy) = self.grid(OP, to_u32(OP, rows)?)?;
        let bufs = [
            x.raw(),
            w.raw(),
            mean.raw(),
            rstd.raw(),
            dy.raw(),
            dx.raw(),
            dyx.raw(),
        ];
        let body = || src(&format!("{WG_SUM64}{LAYERNORM_BWD}"));
        self.launch(OP, (OP, body), p, (gx, (gx, gy, 1)), &bufs)?;
        self.reduce_axis(ReduceKind::Sum, &dyx, 1, rows, cols, dw)?;
        self.reduce_axis(ReduceKind::Sum, dy, 1, rows, cols, db)?;
        Ok(())
    }
}
