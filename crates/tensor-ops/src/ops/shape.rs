//! Reshape, permute/transpose, slice and concatenation.

use super::{axis, buf, checked_numel, compute, numel};
use crate::autograd::{grad_enabled, Node};
use crate::bound::U32Bound;
use crate::tensor::{same_device, Tensor};
use gpu_core::nn::BlockCopy;
use gpu_core::nn::Primitives;
use gpu_core::{GpuError, Result};

impl Tensor {
    /// Same elements, new shape (no copy: the storage is shared).
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        if checked_numel("reshape", shape)? != self.numel() {
            return Err(GpuError::shape(
                "reshape",
                format!("{} elements", self.numel()),
                format!("{shape:?}"),
            ));
        }
        let node = (grad_enabled() && self.requires_grad()).then(|| {
            let src = self.shape().to_vec();
            Node {
                name: "reshape",
                inputs: vec![self.clone()],
                backward: Box::new(move |_, g| Ok(vec![Some(g.reshape(&src)?)])),
            }
        });
        Ok(self.view_as(shape.to_vec(), node))
    }

    /// Reorders dims: `out.shape[i] = self.shape[perm[i]]` (materialised, at most 6 dims).
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor> {
        let r = self.rank();
        let mut seen = vec![false; r];
        if perm.len() != r
            || perm
                .iter()
                .any(|&p| p >= r || std::mem::replace(&mut seen[p], true))
        {
            return Err(GpuError::invalid(
                "permute",
                format!("{perm:?} is not a permutation of 0..{r}"),
            ));
        }
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Ok(self.clone());
        }
        let dev = self.device();
        let shape: Vec<usize> = perm.iter().map(|&p| self.shape()[p]).collect();
        let g = self.read();
        let st = compute!(dev, self.dtype(), self.numel(), |be, out| be.permute(
            buf(be, &g)?,
            self.shape(),
            perm,
            &mut out
        ));
        drop(g);
        let mut inverse = vec![0; r];
        for (i, &p) in perm.iter().enumerate() {
            inverse[p] = i;
        }
        Ok(Tensor::from_op(
            st,
            shape,
            dev,
            "permute",
            &[self],
            move |_, g| Ok(vec![Some(g.permute(&inverse)?)]),
        ))
    }

    /// Swaps two dims.
    pub fn transpose(&self, a: isize, b: isize) -> Result<Tensor> {
        let (a, b) = (
            axis("transpose", self.rank(), a)?,
            axis("transpose", self.rank(), b)?,
        );
        let mut perm: Vec<usize> = (0..self.rank()).collect();
        perm.swap(a, b);
        self.permute(&perm)
    }

    /// `len` entries of `axis` starting at `start`.
    pub fn narrow(&self, ax: isize, start: usize, len: usize) -> Result<Tensor> {
        let a = axis("narrow", self.rank(), ax)?;
        let dims = self.shape().to_vec();
        if start.checked_add(len).is_none_or(|e| e > dims[a]) {
            // `start + len` may overflow: the message names the two separately.
            return Err(GpuError::invalid(
                "narrow",
                format!(
                    "{len} entries from {start} do not fit in dim {a} of size {}",
                    dims[a]
                ),
            ));
        }
        let (outer, inner) = (numel(&dims[..a]), numel(&dims[a + 1..]));
        let mut shape = dims.clone();
        shape[a] = len;
        let dev = self.device();
        let dtype = self.dtype();
        let g = self.read();
        let st = crate::backend::on_device!(dev, |be| {
            // The blocks cover the whole output, so an f32 one may be a recycled buffer.
            let mut out = if dtype == gpu_core::DType::F32 {
                crate::backend::DeviceBackend::alloc_output(be, outer * len * inner)?
            } else {
                gpu_core::Backend::allocate(be, dtype, outer * len * inner)?
            };
            be.copy_blocks(
                buf(be, &g)?,
                &mut out,
                BlockCopy {
                    src_offset: start * inner,
                    src_stride: dims[a] * inner,
                    dst_offset: 0,
                    dst_stride: len * inner,
                    outer,
                    len: len * inner,
                },
            )?;
            crate::ops::wrap(be, out)
        });
        drop(g);
        let bound = if len == dims[a] {
            self.0.u32_bound
        } else {
            self.0.u32_bound.part(outer * len * inner)
        };
        Ok(
            Tensor::from_op(st, shape, dev, "narrow", &[self], move |_, g| {
                let dx = Tensor::full_as(0.0, &dims, g.dtype(), dev)?;
                {
                    let (gg, mut gd) = (g.read(), dx.write());
                    crate::backend::on_device!(dev, |be| be.copy_blocks(
                        buf(be, &gg)?,
                        crate::ops::buf_mut(be, &mut gd)?,
                        BlockCopy {
                            src_offset: 0,
                            src_stride: len * inner,
                            dst_offset: start * inner,
                            dst_stride: dims[a] * inner,
                            outer,
                            len: len * inner
                        }
                    )?);
                }
                Ok(vec![Some(dx)])
            })
            .with_u32_bound(bound),
        )
    }

    /// Joins tensors along `axis`; all other dims must agree.
    pub fn cat(tensors: &[&Tensor], ax: isize) -> Result<Tensor> {
        let first = tensors
            .first()
            .ok_or_else(|| GpuError::invalid("cat", "no tensors"))?;
        let dev = same_device("cat", tensors)?;
        let a = axis("cat", first.rank(), ax)?;
        let dtype = first.dtype();
        let mut total = 0;
        for t in tensors {
            let same = t.rank() == first.rank()
                && t.dtype() == dtype
                && t.shape()
                    .iter()
                    .zip(first.shape())
                    .enumerate()
                    .all(|(i, (x, y))| i == a || x == y);
            if !same {
                return Err(GpuError::shape(
                    "cat",
                    format!("{:?}", first.shape()),
                    format!("{:?}", t.shape()),
                ));
            }
            total =
                usize::checked_add(total, t.shape()[a]).ok_or_else(|| GpuError::InvalidShape {
                    op: "cat",
                    reason: format!("the sizes along dim {a} overflow usize"),
                })?;
        }
        let mut shape = first.shape().to_vec();
        shape[a] = total;
        let len = checked_numel("cat", &shape)?;
        let (outer, inner) = (numel(&shape[..a]), numel(&shape[a + 1..]));
        let st = crate::backend::on_device!(dev, |be| {
            let mut out = gpu_core::Backend::allocate(be, dtype, len)?;
            let mut off = 0;
            for t in tensors {
                let k = t.shape()[a];
                let g = t.read();
                be.copy_blocks(
                    buf(be, &g)?,
                    &mut out,
                    BlockCopy {
                        src_offset: 0,
                        src_stride: k * inner,
                        dst_offset: off * inner,
                        dst_stride: total * inner,
                        outer,
                        len: k * inner,
                    },
                )?;
                off += k;
            }
            crate::ops::wrap(be, out)
        });
        let sizes: Vec<usize> = tensors.iter().map(|t| t.shape()[a]).collect();
        // Every input's values are in the result: the union of their bounds.
        let bound = tensors.iter().fold(U32Bound::Empty, |acc, t| {
            acc.union(if t.numel() == 0 {
                U32Bound::Empty
            } else {
                t.0.u32_bound
            })
        });
        Ok(
            Tensor::from_op(st, shape, dev, "cat", tensors, move |_, g| {
                let mut off = 0;
                let mut grads = Vec::with_capacity(sizes.len());
                for &k in &sizes {
                    grads.push(Some(g.narrow(a as isize, off, k)?));
                    off += k;
                }
                Ok(grads)
            })
            .with_u32_bound(bound),
        )
    }
}
