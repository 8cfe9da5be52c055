//! Reductions over an axis, and the broadcasting pair `expand` / `sum_to`.

use super::{axis, buf, checked_numel, compute, numel};
use crate::tensor::{same_float, Tensor};
use gpu_core::nn::Primitives;
use gpu_core::nn::{BinaryKind, ElementwiseOps, ReduceKind};
use gpu_core::{GpuError, Result};

impl Tensor {
    fn reduce(
        &self,
        op: ReduceKind,
        ax: isize,
        keepdim: bool,
        name: &'static str,
    ) -> Result<Tensor> {
        let dtype = same_float(name, &[self])?;
        let a = axis(name, self.rank(), ax)?;
        let dims = self.shape();
        let (outer, n, inner) = (numel(&dims[..a]), dims[a], numel(&dims[a + 1..]));
        let dev = self.device();
        let g = self.read();
        let st = compute!(dev, dtype, outer * inner, |be, out| be.reduce_axis(
            op,
            buf(be, &g)?,
            outer,
            n,
            inner,
            &mut out
        ));
        drop(g);
        let mut kept = dims.to_vec();
        kept[a] = 1;
        let shape = if keepdim {
            kept.clone()
        } else {
            [&dims[..a], &dims[a + 1..]].concat()
        };
        let x = self.clone();
        Ok(Tensor::from_op(
            st,
            shape,
            dev,
            name,
            &[self],
            move |y, g| {
                let g = g.reshape(&kept)?;
                let dx = match op {
                    ReduceKind::Sum => g.expand(x.shape())?,
                    ReduceKind::Mean => g.expand(x.shape())?.mul_scalar(1.0 / n as f32)?,
                    ReduceKind::Max => {
                        let (gx, gy, gg) = (x.read(), y.read(), g.read());
                        let st = compute!(dev, dtype, x.numel(), |be, dx| be.max_axis_bwd(
                            (buf(be, &gx)?, buf(be, &gy)?, buf(be, &gg)?),
                            [outer, n, inner],
                            &mut dx
                        ));
                        Tensor::from_storage(st, x.shape().to_vec(), dev)
                    }
                };
                Ok(vec![Some(dx)])
            },
        ))
    }

    /// Sum over `axis` (negative counts from the end).
    pub fn sum(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceKind::Sum, axis, keepdim, "sum")
    }

    /// Mean over `axis`.
    pub fn mean(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceKind::Mean, axis, keepdim, "mean")
    }

    /// Maximum over `axis` (the gradient goes to the first maximum).
    pub fn max(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceKind::Max, axis, keepdim, "max")
    }

    /// Sum of every element, as a one-element tensor of shape `[]`.
    pub fn sum_all(&self) -> Result<Tensor> {
        self.reshape(&[self.numel()])?.sum(0, false)
    }

    /// Mean of every element, shape `[]`.
    pub fn mean_all(&self) -> Result<Tensor> {
        self.reshape(&[self.numel()])?.mean(0, false)
    }

    /// Broadcasts to `shape` (materialised). The backward sums back.
    pub fn expand(&self, shape: &[usize]) -> Result<Tensor> {
        if self.shape() == shape {
            return Ok(self.clone());
        }
        let ok = gpu_core::nn::elementwise::broadcast_shape(self.shape(), shape)
            .is_some_and(|s| s == shape);
        if !ok {
            return Err(GpuError::shape(
                "expand",
                format!("{shape:?}"),
                format!("{:?}", self.shape()),
            ));
        }
        let len = checked_numel("expand", shape)?;
        let dev = self.device();
        let dtype = same_float("expand", &[self])?;
        let zeros = Tensor::full_as(0.0, shape, dtype, dev)?;
        let (gz, gx) = (zeros.read(), self.read());
        let st = compute!(dev, dtype, len, |be, out| be.broadcast_binary(
            BinaryKind::Add,
            buf(be, &gz)?,
            shape,
            buf(be, &gx)?,
            self.shape(),
            &mut out
        ));
        drop((gz, gx));
        let src = self.shape().to_vec();
        Ok(Tensor::from_op(
            st,
            shape.to_vec(),
            dev,
            "expand",
            &[self],
            move |_, g| Ok(vec![Some(g.sum_to(&src)?)]),
        ))
    }

    /// Sums a broadcast result back to `shape` (the adjoint of [`Tensor::expand`]).
    pub fn sum_to(&self, shape: &[usize]) -> Result<Tensor> {
        if self.shape() == shape {
            return Ok(self.clone());
        }
        let rank = self.rank();
        if shape.len() > rank {
            return Err(GpuError::shape(
                "sum_to",
                format!("rank <= {rank}"),
                format!("{shape:?}"),
            ));
        }
        let aligned: Vec<usize> = std::iter::repeat_n(1, rank - shape.len())
            .chain(shape.iter().copied())
            .collect();
        let mut t = self.clone();
        for (i, &want) in aligned.iter().enumerate() {
            if want == 1 && t.shape()[i] != 1 {
                t = t.sum(i as isize, true)?;
            } else if want != t.shape()[i] {
                return Err(GpuError::shape(
                    "sum_to",
                    format!("{shape:?}"),
                    format!("{:?}", self.shape()),
                ));
            }
        }
        t.reshape(shape)
    }
}
