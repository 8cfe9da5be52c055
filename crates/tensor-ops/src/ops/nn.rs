//! Neural-network ops: softmax family, cross-entropy, normalisations, RoPE, embedding and
//! fused causal attention.

use super::{buf, checked_numel, compute, numel};
use crate::backend::on_device;
use crate::backend::DeviceBackend;
use crate::tensor::{require_f32, same_device, Tensor};
use gpu_core::nn::attention::{AttnDims, AttnQkv, PackedSaved};
use gpu_core::nn::rows::{LayerNormBwdIn, LogitsIn, RmsNormBwdIn, RowBwdIn};
use gpu_core::nn::{AttentionOps, IdRows, RowOps};
use gpu_core::{DType, GpuError, Result};

fn last_dim(op: &'static str, t: &Tensor) -> Result<usize> {
    t.shape()
        .last()
        .copied()
        .filter(|&c| c > 0)
        .ok_or_else(|| GpuError::InvalidShape {
            op,
            reason: format!("needs a non-empty last dim, got {:?}", t.shape()),
        })
}

impl Tensor {
    /// Softmax over the last dim.
    pub fn softmax(&self) -> Result<Tensor> {
        self.row_softmax(false)
    }

    /// Log-softmax over the last dim.
    pub fn log_softmax(&self) -> Result<Tensor> {
        self.row_softmax(true)
    }

    /// Softmax or log-softmax over the last dim; both backwards need only the output.
    fn row_softmax(&self, log: bool) -> Result<Tensor> {
        let name = if log { "log_softmax" } else { "softmax" };
        if self.dtype() == DType::BF16 {
            return self.to_dtype(DType::F32)?.row_softmax(log); // computed in f32
        }
        require_f32(name, self)?;
        let cols = last_dim(name, self)?;
        let dev = self.device();
        let g = self.read();
        let st = compute!(dev, self.numel(), |be, out| if log {
            be.log_softmax_fwd(buf(be, &g)?, &mut out, cols)
        } else {
            be.softmax_fwd(buf(be, &g)?, &mut out, cols)
        });
        drop(g);
        Ok(Tensor::from_op(
            st,
            self.shape().to_vec(),
            dev,
            name,
            &[self],
            move |y, g| {
                let (gy, gg) = (y.read(), g.read());
                let st = compute!(dev, y.numel(), |be, dx| {
                    let (y, dy) = (buf(be, &gy)?, buf(be, &gg)?);
                    if log {
                        be.log_softmax_bwd(RowBwdIn { y, dy }, &mut dx, cols)
                    } else {
                        be.softmax_bwd(RowBwdIn { y, dy }, &mut dx, cols)
                    }
                });
                Ok(vec![Some(Tensor::from_storage(
                    st,
                    y.shape().to_vec(),
                    dev,
                ))])
            },
        ))
    }

    /// Mean cross-entropy of `self` (logits `[.., classes]`) against u32 `targets` (`[..]`),
    /// fused with the softmax. Returns a one-element tensor of shape `[]`.
    pub fn cross_entropy(&self, targets: &Tensor) -> Result<Tensor> {
        let dev = same_device("cross_entropy", &[self, targets])?;
        if self.dtype() == DType::BF16 {
            return self.to_dtype(DType::F32)?.cross_entropy(targets); // computed in f32
        }
        require_f32("cross_entropy", self)?;
        if targets.dtype() != DType::U32 {
            return Err(GpuError::DTypeMismatch {
                op: "cross_entropy",
                expected: DType::U32,
                got: targets.dtype(),
            });
        }
        let cols = last_dim("cross_entropy", self)?;
        let rows = self.numel() / cols;
        if targets.numel() != rows {
            return Err(GpuError::shape(
                "cross_entropy",
                format!("{rows} targets"),
                targets.numel(),
            ));
        }
        // On the host, from the targets' recorded bound: the CUDA kernel would give NaN.
        targets.check_u32_below("cross_entropy", "targets", cols)?;
        let (gl, gt) = (self.read(), targets.read());
        let st = compute!(dev, rows, |be, out| be.cross_entropy_fwd(
            LogitsIn::new(buf(be, &gl)?, buf(be, &gt)?, cols),
            &mut out
        ));
        drop((gl, gt));
        let (logits, tg) = (self.clone(), targets.clone());
        let rows_t = Tensor::from_op(
            st,
            vec![rows],
            dev,
            "cross_entropy",
            &[self],
            move |_, g| {
                let (gl, gt, gg) = (logits.read(), tg.read(), g.read());
                let st = compute!(dev, logits.numel(), |be, dx| be.cross_entropy_bwd(
                    LogitsIn::new(buf(be, &gl)?, buf(be, &gt)?, cols),
                    buf(be, &gg)?,
                    &mut dx
                ));
                Ok(vec![Some(Tensor::from_storage(
                    st,
                    logits.shape().to_vec(),
                    dev,
                ))])
            },
        );
        rows_t.mean_all()
    }

    /// LayerNorm over the last dim with weight and bias of that size.
    pub fn layer_norm(&self, weight: &Tensor, bias: &Tensor, eps: f32) -> Result<Tensor> {
        let dev = same_device("layer_norm", &[self, weight, bias])?;
        if self.dtype() == DType::BF16 {
            return self.to_dtype(DType::F32)?.layer_norm(weight, bias, eps); // in f32
        }
        for t in [self, weight, bias] {
            require_f32("layer_norm", t)?;
        }
        let cols = last_dim("layer_norm", self)?;
        let rows = self.numel() / cols;
        let (gx, gw, gb) = (self.read(), weight.read(), bias.read());
        let (y, mean, rstd) = on_device!(dev, |be| {
            let mut y = be.alloc_output(self.numel())?;
            let mut mean = be.alloc_output(rows)?;
            let mut rstd = be.alloc_output(rows)?;
            be.layernorm_fwd(
                (buf(be, &gx)?, buf(be, &gw)?, buf(be, &gb)?),
                (&mut y, &mut mean, &mut rstd),
                cols,
                eps,
            )?;
            (
                crate::ops::wrap(be, y),
                crate::ops::wrap(be, mean),
                crate::ops::wrap(be, rstd),
            )
        });
        drop((gx, gw, gb));
        let mean = Tensor::from_storage(mean, vec![rows], dev);
        let rstd = Tensor::from_storage(rstd, vec![rows], dev);
        let (x, w) = (self.clone(), weight.clone());
        Ok(Tensor::from_op(
            y,
            self.shape().to_vec(),
            dev,
            "layer_norm",
            &[self, weight, bias],
            move |_, g| {
                let (gx, gw, gm, gr, gg) = (x.read(), w.read(), mean.read(), rstd.read(), g.read());
                let (dx, dw, db) = on_device!(dev, |be| {
                    let mut dx = be.alloc_output(x.numel())?;
                    let mut dw = be.alloc_output(cols)?;
                    let mut db = be.alloc_output(cols)?;
                    be.layernorm_bwd(
                        LayerNormBwdIn {
                            x: buf(be, &gx)?,
                            w: buf(be, &gw)?,
                            mean: buf(be, &gm)?,
                            rstd: buf(be, &gr)?,
                            dy: buf(be, &gg)?,
                        },
                        (&mut dx, &mut dw, &mut db),
                        cols,
                    )?;
                    (
                        crate::ops::wrap(be, dx),
                        crate::ops::wrap(be, dw),
                        crate::ops::wrap(be, db),
                    )
                });
                Ok(vec![
                    Some(Tensor::from_storage(dx, x.shape().to_vec(), dev)),
                    Some(Tensor::from_storage(dw, vec![cols], dev)),
                    Some(Tensor::from_storage(db, vec![cols], dev)),
                ])
            },
        ))
    }

    /// RMSNorm over the last dim with a weight of that size.
    pub fn rms_norm(&self, weight: &Tensor, eps: f32) -> Result<Tensor> {
        let dev = same_device("rms_norm", &[self, weight])?;
        if self.dtype() == DType::BF16 {
            return self.to_dtype(DType::F32)?.rms_norm(weight, eps); // computed in f32
        }
        require_f32("rms_norm", self)?;
        require_f32("rms_norm", weight)?;
        let cols = last_dim("rms_norm", self)?;
        let rows = self.numel() / cols;
        let (gx, gw) = (self.read(), weight.read());
        let (y, rstd) = on_device!(dev, |be| {
            let mut y = be.alloc_output(self.numel())?;
            let mut rstd = be.alloc_output(rows)?;
            be.rmsnorm_fwd(buf(be, &gx)?, buf(be, &gw)?, &mut y, &mut rstd, cols, eps)?;
            (crate::ops::wrap(be, y), crate::ops::wrap(be, rstd))
        });
        drop((gx, gw));
        let rstd = Tensor::from_storage(rstd, vec![rows], dev);
        let (x, w) = (self.clone(), weight.clone());
        Ok(Tensor::from_op(
            y,
            self.shape().to_vec(),
            dev,
            "rms_norm",
            &[self, weight],
            move |_, g| {
                let (gx, gw, gr, gg) = (x.read(), w.read(), rstd.read(), g.read());
                let (dx, dw) = on_device!(dev, |be| {
                    let mut dx = be.alloc_output(x.numel())?;
                    let mut dw = be.alloc_output(cols)?;
                    be.rmsnorm_bwd(
                        RmsNormBwdIn {
                            x: buf(be, &gx)?,
                            w: buf(be, &gw)?,
                            rstd: buf(be, &gr)?,
                            dy: buf(be, &gg)?,
                        },
                        (&mut dx, &mut dw),
                        cols,
                    )?;
                    (crate::ops::wrap(be, dx), crate::ops::wrap(be, dw))
                });
                Ok(vec![
                    Some(Tensor::from_storage(dx, x.shape().to_vec(), dev)),
                    Some(Tensor::from_storage(dw, vec![cols], dev)),
                ])
            },
        ))
    }

    /// Rotary position embedding on `[batch, heads, t, d]` (rotate-half, positions 0..t).
    pub fn rope(&self, base: f32) -> Result<Tensor> {
        if self.dtype() == DType::BF16 {
            return self.to_dtype(DType::F32)?.rope(base); // computed in f32
        }
        require_f32("rope", self)?;
        if self.rank() != 4 || !self.shape()[3].is_multiple_of(2) {
            return Err(GpuError::shape(
                "rope",
                "[batch, heads, t, even d]",
                format!("{:?}", self.shape()),
            ));
        }
        let s = self.shape().to_vec();
        let (n, t, d) = (s[0] * s[1], s[2], s[3]);
        let dev = self.device();
        let g = self.read();
        let st = compute!(dev, self.numel(), |be, out| be.rope(
            buf(be, &g)?,
            &mut out,
            [n, t, d],
            (base, false)
        ));
        drop(g);
        Ok(Tensor::from_op(
            st,
            s.clone(),
            dev,
            "rope",
            &[self],
            move |_, g| {
                let gg = g.read();
                let st = compute!(dev, g.numel(), |be, out| be.rope(
                    buf(be, &gg)?,
                    &mut out,
                    [n, t, d],
                    (base, true)
                ));
                Ok(vec![Some(Tensor::from_storage(st, s.clone(), dev))])
            },
        ))
    }

    /// Rows of `self` (a `[vocab, dim]` table) picked by u32 `ids`: shape `[..ids, dim]`.
    pub fn embedding(&self, ids: &Tensor) -> Result<Tensor> {
        let dev = same_device("embedding", &[self, ids])?;
        require_f32("embedding", self)?;
        if ids.dtype() != DType::U32 || self.rank() != 2 {
            return Err(GpuError::invalid(
                "embedding",
                "needs a [vocab, dim] f32 table and u32 ids",
            ));
        }
        // On the host, from the ids' recorded bound: the CUDA kernel would give NaN.
        ids.check_u32_below("embedding", "ids", self.shape()[0])?;
        let dim = self.shape()[1];
        let mut shape = ids.shape().to_vec();
        shape.push(dim);
        let len = checked_numel("embedding", &shape)?;
        let (gt, gi) = (self.read(), ids.read());
        let st = compute!(dev, len, |be, out| be
            .embedding_fwd(IdRows::new(buf(be, &gi)?, buf(be, &gt)?, dim), &mut out));
        drop((gt, gi));
        let (ids_c, table_shape) = (ids.clone(), self.shape().to_vec());
        Ok(Tensor::from_op(
            st,
            shape,
            dev,
            "embedding",
            &[self],
            move |_, g| {
                let (gi, gg) = (ids_c.read(), g.read());
                let st = compute!(dev, numel(&table_shape), |be, dt| be
                    .embedding_bwd(IdRows::new(buf(be, &gi)?, buf(be, &gg)?, dim), &mut dt));
                Ok(vec![Some(Tensor::from_storage(
                    st,
                    table_shape.clone(),
                    dev,
                ))])
            },
        ))
    }

    /// Fused causal attention: `q`, `k`, `v` are `[batch, heads, t, d]`; scale `1/sqrt(d)`.
    pub fn causal_attention(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        let dev = same_device("causal_attention", &[q, k, v])?;
        if [q, k, v].iter().any(|t| t.dtype() == DType::BF16) {
            // Computed in f32 (the bf16 inputs widen exactly); the output is f32.
            let w = |t: &Tensor| t.to_dtype(DType::F32);
            return Tensor::causal_attention(&w(q)?, &w(k)?, &w(v)?);
        }
        for t in [q, k, v] {
            require_f32("causal_attention", t)?;
        }
        if q.rank() != 4 || k.shape() != q.shape() || v.shape() != q.shape() {
            return Err(GpuError::shape(
                "causal_attention",
                "q, k, v of one [batch, heads, t, d] shape",
                format!("{:?} {:?} {:?}", q.shape(), k.shape(), v.shape()),
            ));
        }
        let s = q.shape().to_vec();
        let (n, t, d) = (s[0] * s[1], s[2], s[3]);
        let scale = 1.0 / (d as f32).sqrt();
        let (gq, gk, gv) = (q.read(), k.read(), v.read());
        let (out, lse) = on_device!(dev, |be| {
            let mut out = be.alloc_output(n * t * d)?;
            let mut lse = be.alloc_output(n * t)?;
            be.causal_attention_fwd(
                AttnQkv {
                    q: buf(be, &gq)?,
                    k: buf(be, &gk)?,
                    v: buf(be, &gv)?,
                },
                (&mut out, &mut lse),
                AttnDims { n, t, d, scale },
            )?;
            (crate::ops::wrap(be, out), crate::ops::wrap(be, lse))
        });
        drop((gq, gk, gv));
        let lse = Tensor::from_storage(lse, vec![n, t], dev);
        let (qc, kc, vc) = (q.clone(), k.clone(), v.clone());
        Ok(Tensor::from_op(
            out,
            s.clone(),
            dev,
            "causal_attention",
            &[q, k, v],
            move |o, g| {
                let (gq, gk, gv, go, gl, gg) = (
                    qc.read(),
                    kc.read(),
                    vc.read(),
                    o.read(),
                    lse.read(),
                    g.read(),
                );
                let (dq, dk, dv) = on_device!(dev, |be| {
                    let mut dq = be.alloc_output(n * t * d)?;
                    let mut dk = be.alloc_output(n * t * d)?;
                    let mut dv = be.alloc_output(n * t * d)?;
                    be.causal_attention_bwd(
                        AttnQkv {
                            q: buf(be, &gq)?,
                            k: buf(be, &gk)?,
                            v: buf(be, &gv)?,
                        },
                        PackedSaved {
                            out: buf(be, &go)?,
                            lse: buf(be, &gl)?,
                            dout: buf(be, &gg)?,
                        },
                        (&mut dq, &mut dk, &mut dv),
                        AttnDims { n, t, d, scale },
                    )?;
                    (
                        crate::ops::wrap(be, dq),
                        crate::ops::wrap(be, dk),
                        crate::ops::wrap(be, dv),
                    )
                });
                Ok(vec![
                    Some(Tensor::from_storage(dq, s.clone(), dev)),
                    Some(Tensor::from_storage(dk, s.clone(), dev)),
                    Some(Tensor::from_storage(dv, s.clone(), dev)),
                ])
            },
        ))
    }
}
