//! [`RowOps`] for [`WgpuBackend`]: LayerNorm's forward as one fused kernel (the default
//! composes ~8 launches and 4 temporaries), its backward as one row kernel and two column
//! reductions (the default: ~14 launches), softmax's forward and backward one row kernel each
//! (the default: 5 and 4 launches), and cross-entropy's forward and backward as one
//! kernel each (a bad target checked on the device, reported by the next wait: no read-back);
//! the other row ops from gpu-core's defaults. f32 sums in a tree against the
//! CPU's f64: within the defaults' bounds.

use crate::backend::WgpuBackend;
use crate::buffer::WgpuBuffer;
use crate::kernels::{params, row_src, to_u32};
use crate::shaders::{
    CE_BWD, CE_FWD, LAYERNORM_BWD, LAYERNORM_FWD, ROW_LSE64, ROW_REG, SOFTMAX_BWD, SOFTMAX_BWD_REG,
    SOFTMAX_FWD, SOFTMAX_FWD_REG, WG_SUM64,
};
use gpu_core::backend::{Backend, BufferInfo};
use gpu_core::nn::defaults;
use gpu_core::nn::rows::{check_layernorm_fwd, LayerNormBwdIn, LogitsIn, RowBwdIn};
use gpu_core::nn::{Primitives, ReduceKind, RowOps};
use gpu_core::ops::check_rows;
use gpu_core::{DType, Result};

/// The workgroup size of a row kernel that holds its row in registers (16 values a thread),
/// or `None` where the row is longer than 16·256.
fn reg_workgroup(cols: usize) -> Option<u32> {
    match cols {
        0..=512 => Some(64),
        513..=4096 => Some(256),
        _ => None,
    }
}

impl WgpuBackend {
    /// Launches one of the row-per-workgroup kernels (64 threads) over `rows` rows of `cols`:
    /// `body` after the shared workgroup sums and `lib` (`ROW_LSE64` for the kernels that read
    /// a row's max and Σ exp from a `logits` binding, else ""); `p2` is the third parameter
    /// (cross-entropy's status slot).
    fn launch_rows(
        &self,
        op: &'static str,
        (lib, body): (&'static str, &'static str),
        [rows, cols, p2]: [usize; 3],
        bufs: &[&wgpu::Buffer],
    ) -> Result<()> {
        let p = params(op, &[rows, cols, p2])?;
        let (gx, gy) = self.grid(op, to_u32(op, rows)?)?;
        let src = || row_src(64, &format!("{WG_SUM64}{lib}{body}"));
        self.launch(op, (op, src), p, (gx, (gx, gy, 1)), bufs)
    }

    /// Launches `body`, a row kernel holding its row in registers (`row_reg.wgsl`), with `wg`
    /// threads a workgroup (from [`reg_workgroup`]).
    fn launch_rows_reg(
        &self,
        op: &'static str,
        (body, wg): (&'static str, u32),
        [rows, cols]: [usize; 2],
        bufs: &[&wgpu::Buffer],
    ) -> Result<()> {
        let p = params(op, &[rows, cols])?;
        let (gx, gy) = self.grid(op, to_u32(op, rows)?)?;
        let key = format!("{op}_reg{wg}");
        let src = || {
            row_src(
                wg,
                &format!("{ROW_REG}{body}").replace("WG_SIZE", &wg.to_string()),
            )
        };
        self.launch(op, (&key, src), p, (gx, (gx, gy, 1)), bufs)
    }
}

type Buf = WgpuBuffer;

impl RowOps for WgpuBackend {
    /// One workgroup a row for f32, the row held in registers up to 4096 columns (other
    /// dtypes: the default).
    fn softmax_fwd(&self, x: &Buf, out: &mut Buf, cols: usize) -> Result<()> {
        const OP: &str = "softmax_fwd";
        let rows = check_rows(OP, x, out, cols)?;
        self.check_out(OP, &[x, out])?;
        if x.dtype() != DType::F32 {
            return defaults::rows::softmax(self, x, out, [rows, cols]);
        }
        let bufs = [x.raw(), out.raw()];
        if let Some(wg) = reg_workgroup(cols) {
            return self.launch_rows_reg(OP, (SOFTMAX_FWD_REG, wg), [rows, cols], &bufs);
        }
        self.launch_rows(OP, (ROW_LSE64, SOFTMAX_FWD), [rows, cols, 0], &bufs)
    }

    /// One workgroup a row for f32, the rows of y and dy held in registers up to 4096 columns
    /// (other dtypes: the default).
    fn softmax_bwd(&self, input: RowBwdIn<'_, Buf>, dx: &mut Buf, cols: usize) -> Result<()> {
        const OP: &str = "softmax_bwd";
        let rows = input.check(OP, dx, cols)?;
        let RowBwdIn { y, dy } = input;
        self.check_out(OP, &[y, dy, dx])?;
        if y.dtype() != DType::F32 {
            return defaults::rows::softmax_bwd(self, input, dx, [rows, cols]);
        }
        let bufs = [y.raw(), dy.raw(), dx.raw()];
        if let Some(wg) = reg_workgroup(cols) {
            return self.launch_rows_reg(OP, (SOFTMAX_BWD_REG, wg), [rows, cols], &bufs);
        }
        self.launch_rows(OP, ("", SOFTMAX_BWD), [rows, cols, 0], &bufs)
    }

    /// One workgroup of 64 threads a row for f32 (other dtypes: the default).
    fn layernorm_fwd(
        &self,
        (x, w, b): (&Buf, &Buf, &Buf),
        (y, mean, rstd): (&mut Buf, &mut Buf, &mut Buf),
        cols: usize,
        eps: f32,
    ) -> Result<()> {
        const OP: &str = "layernorm_fwd";
        let rows = check_layernorm_fwd((x, w, b), (y, mean, rstd), cols, eps)?;
        self.check_out(OP, &[x, w, b, y, mean, rstd])?;
        if x.dtype() != DType::F32 {
            let n = defaults::rows::NormIn { x, w, rows, cols };
            return defaults::rows::layernorm(self, n, b, (y, mean, rstd), eps);
        }
        let mut p = params(OP, &[rows, cols])?;
        p[2] = eps.to_bits();
        let (gx, gy) = self.grid(OP, to_u32(OP, rows)?)?;
        let bufs = [x.raw(), w.raw(), b.raw(), y.raw(), mean.raw(), rstd.raw()];
        let body = || row_src(64, &format!("{WG_SUM64}{LAYERNORM_FWD}"));
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
        let rows = input.check((dx, dw, db), cols)?;
        let LayerNormBwdIn {
            x,
            w,
            mean,
            rstd,
            dy,
        } = input;
        self.check_out(OP, &[x, w, mean, rstd, dy, dx, dw, db])?;
        if x.dtype() != DType::F32 {
            return defaults::rows::layernorm_bwd(self, input, (dx, dw, db), [rows, cols]);
        }
        let dyx = self.allocate(DType::F32, rows * cols)?;
        let p = params(OP, &[rows, cols])?;
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
        let body = || row_src(64, &format!("{WG_SUM64}{LAYERNORM_BWD}"));
        self.launch(OP, (OP, body), p, (gx, (gx, gy, 1)), &bufs)?;
        self.reduce_axis(ReduceKind::Sum, &dyx, 1, rows, cols, dw)?;
        self.reduce_axis(ReduceKind::Sum, dy, 1, rows, cols, db)?;
        Ok(())
    }

    /// For f32: one workgroup of 64 threads a row; a target `>= cols` makes its row NaN and
    /// is reported by the next call that waits for the device (`crate::status`).
    fn cross_entropy_fwd(&self, x: LogitsIn<'_, Buf>, loss: &mut Buf) -> Result<()> {
        const OP: &str = "cross_entropy_fwd";
        let rows = x.check(OP, loss, None)?;
        let (logits, targets, cols) = (x.logits, x.targets, x.cols);
        self.check_out(OP, &[logits, targets, loss])?;
        if logits.dtype() != DType::F32 {
            return defaults::rows::cross_entropy(self, (logits, targets), loss, [rows, cols]);
        }
        self.with_status_slot((OP, "targets", cols), |slot, status| {
            let bufs = [logits.raw(), targets.raw(), loss.raw(), status];
            let shape = [rows, cols, slot as usize];
            self.launch_rows(OP, (ROW_LSE64, CE_FWD), shape, &bufs)
        })
    }

    /// For f32: one workgroup of 64 threads a row; a target `>= cols` makes its row NaN and
    /// is reported by the next call that waits for the device (`crate::status`).
    fn cross_entropy_bwd(
        &self,
        x: LogitsIn<'_, Buf>,
        dloss: &Buf,
        dlogits: &mut Buf,
    ) -> Result<()> {
        const OP: &str = "cross_entropy_bwd";
        let rows = x.check(OP, dloss, Some(dlogits))?;
        let (logits, targets, cols) = (x.logits, x.targets, x.cols);
        self.check_out(OP, &[logits, targets, dloss, dlogits])?;
        if logits.dtype() != DType::F32 {
            let ins = (logits, targets, dloss);
            return defaults::rows::cross_entropy_bwd(self, ins, dlogits, [rows, cols]);
        }
        self.with_status_slot((OP, "targets", cols), |slot, status| {
            let bufs = [
                logits.raw(),
                targets.raw(),
                dloss.raw(),
                dlogits.raw(),
                status,
            ];
            let shape = [rows, cols, slot as usize];
            self.launch_rows(OP, (ROW_LSE64, CE_BWD), shape, &bufs)
        })
    }
}
