//! [`RowOps`] on the CPU: the reference for the CUDA row kernels. Every row reduction (and RoPE's
//! angles) is computed in f64 and rounded once to f32; `dw`/`db` are summed over rows in f64.

use super::par::{column_sums, for_rows, min_rows};
use super::{fast, CpuBackend, CpuStorage};
use crate::error::{GpuError, Result};
use crate::nn::rows::{
    check_embedding, check_layernorm_fwd, check_rmsnorm_fwd, check_rope, LayerNormBwdIn, LogitsIn,
    RmsNormBwdIn, RowBwdIn, RowOps,
};
use crate::ops::check_rows;
use rayon::prelude::*;

/// `(max, Σ exp(x − max))` of a row in f64; the log-sum-exp is `max + ln(sum)`. A row of all
/// `-inf` gives a NaN sum, as in PyTorch. Callers subtract `max` from a logit before adding or
/// subtracting `ln(sum)`: `v − (max + ln sum)` loses `ln sum` to rounding once `|max|` is large
/// (four equal logits of 1e16 gave −2 instead of −ln 4).
fn max_sumexp(x: &[f32]) -> (f64, f64) {
    let max = x.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
    (max, x.iter().map(|&v| (v as f64 - max).exp()).sum())
}

/// Checks that every id is `< bound`; `what` names the buffer in the error.
fn check_ids(op: &'static str, what: &str, ids: &[u32], bound: usize) -> Result<()> {
    match ids.iter().position(|&i| i as usize >= bound) {
        Some(r) => Err(GpuError::invalid(
            op,
            format!(
                "{what}[{r}] = {} is out of range (must be < {bound})",
                ids[r]
            ),
        )),
        None => Ok(()),
    }
}

/// A softmax-family forward `op`: checked, then `f(x_row, out_row)` on every row in parallel.
fn map_rows(
    op: &'static str,
    x: &CpuStorage,
    out: &mut CpuStorage,
    cols: usize,
    f: impl Fn(&[f32], &mut [f32]) + Sync,
) -> Result<()> {
    let _p = super::profile::scope(op);
    check_rows(op, x, out, cols)?;
    let x = x.as_f32()?;
    for_rows(out.as_f32_mut()?, cols, |r, or| {
        f(&x[r * cols..][..cols], or)
    });
    Ok(())
}

/// A softmax-family backward `op` from the forward output `y` and `dy`: checked, then
/// `f(y_row, dy_row, dx_row)` on every row in parallel.
fn map_rows_bwd(
    op: &'static str,
    input: RowBwdIn<'_, CpuStorage>,
    dx: &mut CpuStorage,
    cols: usize,
    f: impl Fn(&[f32], &[f32], &mut [f32]) + Sync,
) -> Result<()> {
    let _p = super::profile::scope(op);
    input.check(op, dx, cols)?;
    let (y, dy) = (input.y.as_f32()?, input.dy.as_f32()?);
    for_rows(dx.as_f32_mut()?, cols, |r, dxr| {
        f(&y[r * cols..][..cols], &dy[r * cols..][..cols], dxr)
    });
    Ok(())
}

/// The checks of an embedding pass ([`check_embedding`] and every id `< vocab`): the ids as a
/// slice and the table's `vocab`.
pub(super) fn embedding_ids<'a>(
    op: &'static str,
    ids: &'a CpuStorage,
    table: &CpuStorage,
    acts: &CpuStorage,
    dim: usize,
) -> Result<(&'a [u32], usize)> {
    let (_, vocab) = check_embedding(op, ids, table, acts, dim)?;
    let ids = ids.as_u32()?;
    check_ids(op, "ids", ids, vocab)?;
    Ok((ids, vocab))
}

impl RowOps for CpuBackend {
    fn softmax_fwd(&self, x: &CpuStorage, out: &mut CpuStorage, cols: usize) -> Result<()> {
        map_rows("softmax_fwd", x, out, cols, |xr, or| {
            let (max, sum) = max_sumexp(xr);
            for (o, &v) in or.iter_mut().zip(xr) {
                *o = ((v as f64 - max).exp() / sum) as f32;
            }
        })
    }

    fn softmax_bwd(
        &self,
        input: RowBwdIn<'_, CpuStorage>,
        dx: &mut CpuStorage,
        cols: usize,
    ) -> Result<()> {
        map_rows_bwd("softmax_bwd", input, dx, cols, |yr, dyr, dxr| {
            let dot: f64 = yr.iter().zip(dyr).map(|(&a, &b)| a as f64 * b as f64).sum();
            for ((o, &a), &b) in dxr.iter_mut().zip(yr).zip(dyr) {
                *o = (a as f64 * (b as f64 - dot)) as f32;
            }
        })
    }

    fn log_softmax_fwd(&self, x: &CpuStorage, out: &mut CpuStorage, cols: usize) -> Result<()> {
        map_rows("log_softmax_fwd", x, out, cols, |xr, or| {
            let (max, sum) = max_sumexp(xr);
            let ln_sum = sum.ln();
            for (o, &v) in or.iter_mut().zip(xr) {
                *o = ((v as f64 - max) - ln_sum) as f32;
            }
        })
    }

    fn log_softmax_bwd(
        &self,
        input: RowBwdIn<'_, CpuStorage>,
        dx: &mut CpuStorage,
        cols: usize,
    ) -> Result<()> {
        map_rows_bwd("log_softmax_bwd", input, dx, cols, |yr, dyr, dxr| {
            let sum: f64 = dyr.iter().map(|&v| v as f64).sum();
            for ((o, &a), &b) in dxr.iter_mut().zip(yr).zip(dyr) {
                *o = (b as f64 - (a as f64).exp() * sum) as f32;
            }
        })
    }

    fn cross_entropy_fwd(&self, xt: LogitsIn<'_, CpuStorage>, loss: &mut CpuStorage) -> Result<()> {
        let _p = super::profile::scope("cross_entropy_fwd");
        const OP: &str = "cross_entropy_fwd";
        xt.check(OP, loss, None)?;
        let (x, t, cols) = (xt.logits.as_f32()?, xt.targets.as_u32()?, xt.cols);
        check_ids(OP, "targets", t, cols)?;
        if fast::fast() {
            let (isa, per) = (fast::Isa::best(), min_rows(cols));
            let chunks = loss.as_f32_mut()?.par_chunks_mut(per).enumerate();
            chunks.for_each(|(c, lc)| {
                let r0 = c * per;
                let (xc, tc) = (&x[r0 * cols..(r0 + lc.len()) * cols], &t[r0..r0 + lc.len()]);
                fast::softmax::cross_entropy_fwd(isa, xc, tc, lc, cols);
            });
            return Ok(());
        }
        let rows = x.par_chunks_exact(cols).zip(t).zip(loss.as_f32_mut()?);
        rows.with_min_len(min_rows(cols)).for_each(|((xr, &t), l)| {
            let (max, sum) = max_sumexp(xr);
            *l = ((max - xr[t as usize] as f64) + sum.ln()) as f32;
        });
        Ok(())
    }

    fn cross_entropy_bwd(
        &self,
        xt: LogitsIn<'_, CpuStorage>,
        dloss: &CpuStorage,
        dlogits: &mut CpuStorage,
    ) -> Result<()> {
        let _p = super::profile::scope("cross_entropy_bwd");
        const OP: &str = "cross_entropy_bwd";
        xt.check(OP, dloss, Some(&*dlogits))?;
        let (x, t, dl) = (xt.logits.as_f32()?, xt.targets.as_u32()?, dloss.as_f32()?);
        let cols = xt.cols;
        check_ids(OP, "targets", t, cols)?;
        if fast::fast() {
            let (isa, per) = (fast::Isa::best(), min_rows(cols));
            let chunks = dlogits.as_f32_mut()?.par_chunks_mut(per * cols).enumerate();
            chunks.for_each(|(c, dc)| {
                let (r0, rows) = (c * per, dc.len() / cols);
                let (xc, tc) = (&x[r0 * cols..(r0 + rows) * cols], &t[r0..r0 + rows]);
                fast::softmax::cross_entropy_bwd(isa, xc, tc, &dl[r0..r0 + rows], dc, cols);
            });
            return Ok(());
        }
        for_rows(dlogits.as_f32_mut()?, cols, |r, dr| {
            let (xr, t, g) = (&x[r * cols..][..cols], t[r] as usize, dl[r] as f64);
            let (max, sum) = max_sumexp(xr);
            for (c, (o, &v)) in dr.iter_mut().zip(xr).enumerate() {
                let p = (v as f64 - max).exp() / sum - if c == t { 1.0 } else { 0.0 };
                *o = (p * g) as f32;
            }
        });
        Ok(())
    }

    fn layernorm_fwd(
        &self,
        (x, w, b): (&CpuStorage, &CpuStorage, &CpuStorage),
        (y, mean, rstd): (&mut CpuStorage, &mut CpuStorage, &mut CpuStorage),
        cols: usize,
        eps: f32,
    ) -> Result<()> {
        let _p = super::profile::scope("layernorm_fwd");
        check_layernorm_fwd((x, w, b), (y, mean, rstd), cols, eps)?;
        let (x, w, b) = (x.as_f32()?, w.as_f32()?, b.as_f32()?);
        let (mean, rstd) = (mean.as_f32_mut()?, rstd.as_f32_mut()?);
        if fast::fast() {
            let (isa, per) = (fast::Isa::best(), min_rows(cols));
            let stats = mean.par_chunks_mut(per).zip(rstd.par_chunks_mut(per));
            let chunks = y.as_f32_mut()?.par_chunks_mut(per * cols).zip(stats);
            chunks.enumerate().for_each(|(c, (yc, (m, r)))| {
                let xc = &x[c * per * cols..][..yc.len()];
                fast::rows::layernorm_fwd(isa, (xc, w, b), yc, (m, r), cols, eps);
            });
            return Ok(());
        }
        let n = cols as f64;
        let stats = mean.par_iter_mut().zip(rstd.par_iter_mut());
        let rows = y.as_f32_mut()?.par_chunks_exact_mut(cols).zip(stats);
        rows.with_min_len(min_rows(cols))
            .enumerate()
            .for_each(|(r, (yr, (mean, rstd)))| {
                let xr = &x[r * cols..][..cols];
                let mu = xr.iter().map(|&v| v as f64).sum::<f64>() / n;
                let var = xr.iter().map(|&v| (v as f64 - mu).powi(2)).sum::<f64>() / n;
                let rs = 1.0 / (var + eps as f64).sqrt();
                for (i, o) in yr.iter_mut().enumerate() {
                    *o = ((xr[i] as f64 - mu) * rs * w[i] as f64 + b[i] as f64) as f32;
                }
                (*mean, *rstd) = (mu as f32, rs as f32);
            });
        Ok(())
    }

    fn layernorm_bwd(
        &self,
        input: LayerNormBwdIn<'_, CpuStorage>,
        (dx, dw, db): (&mut CpuStorage, &mut CpuStorage, &mut CpuStorage),
        cols: usize,
    ) -> Result<()> {
        let _p = super::profile::scope("layernorm_bwd");
        input.check((dx, dw, db), cols)?;
        let (x, w, dy) = (input.x.as_f32()?, input.w.as_f32()?, input.dy.as_f32()?);
        let (mean, rstd) = (input.mean.as_f32()?, input.rstd.as_f32()?);
        if fast::fast() {
            let (isa, per) = (fast::Isa::best(), min_rows(cols));
            let chunks = dx.as_f32_mut()?.par_chunks_mut(per * cols).enumerate();
            chunks.for_each(|(c, dxc)| {
                let (r0, rows) = (c * per, dxc.len() / cols);
                let e = r0 * cols..(r0 + rows) * cols;
                let stats = (&mean[r0..r0 + rows], &rstd[r0..r0 + rows]);
                let (xc, dyc) = (&x[e.clone()], &dy[e]);
                fast::rows::layernorm_dx(isa, xc, w, stats, dyc, dxc, cols);
            });
            const BLOCK: usize = 64;
            let blocks = dw.as_f32_mut()?.par_chunks_mut(BLOCK);
            let blocks = blocks
                .zip(db.as_f32_mut()?.par_chunks_mut(BLOCK))
                .enumerate();
            blocks.for_each(|(bi, (dwb, dbb))| {
                let grads = (dwb, dbb);
                fast::rows::layernorm_dwdb(isa, x, (mean, rstd), dy, grads, cols, bi * BLOCK);
            });
            return Ok(());
        }
        let n = cols as f64;
        let xhat = |r: usize, i: usize| (x[r * cols + i] as f64 - mean[r] as f64) * rstd[r] as f64;
        for_rows(dx.as_f32_mut()?, cols, |r, dxr| {
            let (dyr, rs) = (&dy[r * cols..][..cols], rstd[r] as f64);
            let (mut sg, mut sgx) = (0.0f64, 0.0f64);
            for i in 0..cols {
                let g = dyr[i] as f64 * w[i] as f64;
                sg += g;
                sgx += g * xhat(r, i);
            }
            for (i, o) in dxr.iter_mut().enumerate() {
                let g = dyr[i] as f64 * w[i] as f64;
                *o = (rs * (g - (sg + xhat(r, i) * sgx) / n)) as f32;
            }
        });
        let rows = x.len() / cols;
        column_sums(dw.as_f32_mut()?, rows, |r, i| {
            dy[r * cols + i] as f64 * xhat(r, i)
        });
        column_sums(db.as_f32_mut()?, rows, |r, i| dy[r * cols + i] as f64);
        Ok(())
    }

    fn rmsnorm_fwd(
        &self,
        x: &CpuStorage,
        w: &CpuStorage,
        y: &mut CpuStorage,
        rstd: &mut CpuStorage,
        cols: usize,
        eps: f32,
    ) -> Result<()> {
        let _p = super::profile::scope("rmsnorm_fwd");
        check_rmsnorm_fwd((x, w), (y, rstd), cols, eps)?;
        let (x, w, rstd) = (x.as_f32()?, w.as_f32()?, rstd.as_f32_mut()?);
        let rows = y.as_f32_mut()?.par_chunks_exact_mut(cols).zip(rstd);
        rows.with_min_len(min_rows(cols))
            .enumerate()
            .for_each(|(r, (yr, rstd))| {
                let xr = &x[r * cols..][..cols];
                let ms = xr.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / cols as f64;
                let rs = 1.0 / (ms + eps as f64).sqrt();
                for (i, o) in yr.iter_mut().enumerate() {
                    *o = (xr[i] as f64 * rs * w[i] as f64) as f32;
                }
                *rstd = rs as f32;
            });
        Ok(())
    }

    fn rmsnorm_bwd(
        &self,
        input: RmsNormBwdIn<'_, CpuStorage>,
        (dx, dw): (&mut CpuStorage, &mut CpuStorage),
        cols: usize,
    ) -> Result<()> {
        let _p = super::profile::scope("rmsnorm_bwd");
        input.check((dx, dw), cols)?;
        let RmsNormBwdIn { x, w, rstd, dy } = input;
        let (x, w, dy, rstd) = (x.as_f32()?, w.as_f32()?, dy.as_f32()?, rstd.as_f32()?);
        for_rows(dx.as_f32_mut()?, cols, |r, dxr| {
            let (xr, dyr) = (&x[r * cols..][..cols], &dy[r * cols..][..cols]);
            let rs = rstd[r] as f64;
            let mut sgx = 0.0f64;
            for i in 0..cols {
                sgx += dyr[i] as f64 * w[i] as f64 * xr[i] as f64;
            }
            let coef = sgx * rs * rs / cols as f64;
            for (i, o) in dxr.iter_mut().enumerate() {
                let g = dyr[i] as f64 * w[i] as f64;
                *o = (rs * (g - xr[i] as f64 * coef)) as f32;
            }
        });
        column_sums(dw.as_f32_mut()?, x.len() / cols, |r, i| {
            let e = r * cols + i;
            dy[e] as f64 * x[e] as f64 * rstd[r] as f64
        });
        Ok(())
    }

    fn rope(
        &self,
        x: &CpuStorage,
        out: &mut CpuStorage,
        [n, t, d]: [usize; 3],
        (base, inverse): (f32, bool),
    ) -> Result<()> {
        let _p = super::profile::scope("rope");
        check_rope(x, out, n, t, d, base)?;
        let (x, out) = (x.as_f32()?, out.as_f32_mut()?);
        let h = d / 2;
        // cos and sin of θ(pos, i) = pos · base^(−2i/d), for every position and pair.
        let mut cs = Vec::with_capacity(t * h);
        for pos in 0..t {
            for i in 0..h {
                let theta = pos as f64 * (base as f64).powf(-2.0 * i as f64 / d as f64);
                let s = if inverse { -theta.sin() } else { theta.sin() };
                cs.push((theta.cos(), s));
            }
        }
        for_rows(out, d, |r, or| {
            let (xr, pos) = (&x[r * d..][..d], r % t);
            for i in 0..h {
                let (c, s) = cs[pos * h + i];
                let (a, b) = (xr[i] as f64, xr[i + h] as f64);
                or[i] = (a * c - b * s) as f32;
                or[i + h] = (b * c + a * s) as f32;
            }
        });
        Ok(())
    }
}
