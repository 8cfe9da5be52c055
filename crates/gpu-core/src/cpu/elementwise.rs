//! [`ElementwiseOps`] on the CPU: the reference the CUDA kernels are tested against.
//! Activations are evaluated in f64 by their definitions (`nn::activation`), reductions accumulate in f64, binary ops,
//! affine and dropout compute exactly what the kernels compute in f32.

use super::par::{for_chunks, Strided};
use super::rows::embedding_ids;
use super::widen::{self, is_bf16, via_f32};
use super::{fast, CpuBackend, CpuStorage};
use crate::error::Result;
use crate::nn::elementwise::{
    check_broadcast, check_cast, check_copy_blocks, check_dropout, check_max_axis_bwd,
    check_permute, check_reduce, dropout_keep8, Activation, BinaryKind, ElementwiseOps, Primitives,
    ReduceKind,
};
use crate::nn::{BlockCopy, IdRows};
use crate::ops::check_float_elementwise;

/// Combines two values of a Max reduction: NaN propagates, +0 counts above −0 (IEEE 754-2019
/// `maximum`), other ties keep `a`: so the result does not depend on the order the device
/// combines values in (`MaxOp` in `kernels/nn_reduce.cuh` is the same rule).
fn max_combine(a: f32, b: f32) -> f32 {
    let zero_up = b == 0.0 && a == 0.0 && a.is_sign_negative() && b.is_sign_positive();
    if b > a || b.is_nan() || zero_up {
        b
    } else {
        a
    }
}

/// True when `v` is the maximum `m` (a NaN maximum matches the first NaN).
fn is_max(v: f32, m: f32) -> bool {
    v == m || (v.is_nan() && m.is_nan())
}

/// Strides of `shape` (right-aligned in `out_shape`), 0 along broadcast dims.
fn broadcast_strides(shape: &[usize], out_shape: &[usize]) -> Vec<usize> {
    let pad = out_shape.len() - shape.len();
    let mut strides = vec![0; out_shape.len()];
    let mut acc = 1;
    for k in (0..shape.len()).rev() {
        if shape[k] != 1 {
            strides[k + pad] = acc;
        }
        acc *= shape[k];
    }
    strides
}

impl Primitives for CpuBackend {
    fn fill(&self, buf: &mut CpuStorage, value: f32) -> Result<()> {
        let _p = super::profile::scope("fill");
        match buf {
            CpuStorage::F32(v) => v.fill(value),
            CpuStorage::F16(v) => v.fill(half::f16::from_f32(value)),
            CpuStorage::BF16(v) => v.fill(half::bf16::from_f32(value)),
            CpuStorage::U32(v) => v.fill(value as u32),
        }
        Ok(())
    }

    fn broadcast_binary(
        &self,
        op: BinaryKind,
        a: &CpuStorage,
        a_shape: &[usize],
        b: &CpuStorage,
        b_shape: &[usize],
        out: &mut CpuStorage,
    ) -> Result<()> {
        let _p = super::profile::scope("broadcast_binary");
        let shape = check_broadcast(a, a_shape, b, b_shape, out)?;
        if is_bf16(out) {
            return via_f32(&[a, b], out, false, |i, o| {
                self.broadcast_binary(op, i[0], a_shape, i[1], b_shape, o)
            });
        }
        let (a, b, out) = (a.as_f32()?, b.as_f32()?, out.as_f32_mut()?);
        let sa = broadcast_strides(a_shape, &shape);
        let sb = broadcast_strides(b_shape, &shape);
        // Per row: the same `op.eval` per element as an element-by-element walk, with the op
        // chosen once per row and contiguous or broadcast rows as plain slices (vectorized).
        Strided::new(&shape, &sa, &sb).fill_rows(out, |o, ia, ib, step_a, step_b| {
            let n = o.len();
            macro_rules! rows {
                ($f:expr) => {
                    match (step_a, step_b) {
                        (1, 1) => {
                            for ((o, &x), &y) in
                                o.iter_mut().zip(&a[ia..ia + n]).zip(&b[ib..ib + n])
                            {
                                *o = $f(x, y);
                            }
                        }
                        (1, 0) => {
                            let y = b[ib];
                            for (o, &x) in o.iter_mut().zip(&a[ia..ia + n]) {
                                *o = $f(x, y);
                            }
                        }
                        (0, 1) => {
                            let x = a[ia];
                            for (o, &y) in o.iter_mut().zip(&b[ib..ib + n]) {
                                *o = $f(x, y);
                            }
                        }
                        _ => {
                            for (e, o) in o.iter_mut().enumerate() {
                                *o = $f(a[ia + e * step_a], b[ib + e * step_b]);
                            }
                        }
                    }
                };
            }
            match op {
                BinaryKind::Add => rows!(|x: f32, y: f32| x + y),
                BinaryKind::Sub => rows!(|x: f32, y: f32| x - y),
                BinaryKind::Mul => rows!(|x: f32, y: f32| x * y),
                BinaryKind::Div => rows!(|x: f32, y: f32| x / y),
            }
        });
        Ok(())
    }

    fn activation_fwd(&self, op: Activation, x: &CpuStorage, out: &mut CpuStorage) -> Result<()> {
        let _p = super::profile::scope("activation_fwd");
        check_float_elementwise("activation_fwd", &[x], out)?;
        if is_bf16(out) {
            return via_f32(&[x], out, false, |i, o| self.activation_fwd(op, i[0], o));
        }
        let x = x.as_f32()?;
        if op == Activation::Gelu && fast::fast() {
            let isa = fast::Isa::best();
            for_chunks(out.as_f32_mut()?, |off, o| {
                fast::math::gelu_fwd(isa, &x[off..], o)
            });
            return Ok(());
        }
        for_chunks(out.as_f32_mut()?, |off, o| {
            for (o, &v) in o.iter_mut().zip(&x[off..]) {
                *o = op.eval(v as f64) as f32;
            }
        });
        Ok(())
    }

    fn activation_bwd(
        &self,
        op: Activation,
        x: &CpuStorage,
        y: &CpuStorage,
        dy: &CpuStorage,
        dx: &mut CpuStorage,
    ) -> Result<()> {
        let _p = super::profile::scope("activation_bwd");
        check_float_elementwise("activation_bwd", &[x, y, dy], dx)?;
        if is_bf16(dx) {
            return via_f32(&[x, y, dy], dx, false, |i, o| {
                self.activation_bwd(op, i[0], i[1], i[2], o)
            });
        }
        let (x, y, dy) = (x.as_f32()?, y.as_f32()?, dy.as_f32()?);
        if op == Activation::Gelu && fast::fast() {
            let isa = fast::Isa::best();
            for_chunks(dx.as_f32_mut()?, |off, dx| {
                fast::math::gelu_bwd(isa, &x[off..], &dy[off..], dx)
            });
            return Ok(());
        }
        for_chunks(dx.as_f32_mut()?, |off, dx| {
            let (x, y, dy) = (&x[off..], &y[off..], &dy[off..]);
            for (i, d) in dx.iter_mut().enumerate() {
                *d = op.backward(x[i] as f64, y[i] as f64, dy[i] as f64) as f32;
            }
        });
        Ok(())
    }

    fn reduce_axis(
        &self,
        op: ReduceKind,
        x: &CpuStorage,
        outer: usize,
        n: usize,
        inner: usize,
        out: &mut CpuStorage,
    ) -> Result<()> {
        let _p = super::profile::scope("reduce_axis");
        check_reduce(op, x, outer, n, inner, out)?;
        if is_bf16(out) {
            return via_f32(&[x], out, false, |i, o| {
                self.reduce_axis(op, i[0], outer, n, inner, o)
            });
        }
        let (x, out) = (x.as_f32()?, out.as_f32_mut()?);
        if out.is_empty() {
            return Ok(());
        }
        if op == ReduceKind::Max {
            let mut acc = vec![f32::NEG_INFINITY; inner];
            for o in 0..outer {
                acc.fill(f32::NEG_INFINITY);
                for row in x[o * n * inner..(o + 1) * n * inner].chunks_exact(inner) {
                    for (a, &v) in acc.iter_mut().zip(row) {
                        *a = max_combine(*a, v);
                    }
                }
                out[o * inner..(o + 1) * inner].copy_from_slice(&acc);
            }
            return Ok(());
        }
        let mut acc = vec![0.0f64; inner];
        let div = if op == ReduceKind::Mean {
            n as f64
        } else {
            1.0
        };
        for o in 0..outer {
            acc.fill(0.0);
            for row in x[o * n * inner..(o + 1) * n * inner].chunks_exact(inner) {
                for (a, &v) in acc.iter_mut().zip(row) {
                    *a += v as f64;
                }
            }
            for (d, &a) in out[o * inner..(o + 1) * inner].iter_mut().zip(&acc) {
                *d = (a / div) as f32;
            }
        }
        Ok(())
    }

    fn copy_blocks(&self, src: &CpuStorage, dst: &mut CpuStorage, copy: BlockCopy) -> Result<()> {
        let _p = super::profile::scope("copy_blocks");
        check_copy_blocks(src, dst, copy)?;
        let len = copy.len;
        if len == 0 {
            return Ok(());
        }
        if is_bf16(dst) {
            // Exact both ways: the copy moves the same bits.
            return via_f32(&[src], dst, true, |i, o| self.copy_blocks(i[0], o, copy));
        }
        let (src, dst) = (src.as_f32()?, dst.as_f32_mut()?);
        for o in 0..copy.outer {
            let s = copy.src_offset + o * copy.src_stride;
            let d = copy.dst_offset + o * copy.dst_stride;
            dst[d..d + len].copy_from_slice(&src[s..s + len]);
        }
        Ok(())
    }

    fn permute(
        &self,
        x: &CpuStorage,
        shape: &[usize],
        perm: &[usize],
        out: &mut CpuStorage,
    ) -> Result<()> {
        let _p = super::profile::scope("permute");
        let out_shape = check_permute(x, shape, perm, out)?;
        if is_bf16(out) {
            return via_f32(&[x], out, false, |i, o| self.permute(i[0], shape, perm, o));
        }
        let (x, out) = (x.as_f32()?, out.as_f32_mut()?);
        let in_strides = crate::Shape::from(shape).contiguous_strides();
        let strides: Vec<usize> = perm.iter().map(|&p| in_strides[p]).collect();
        Strided::new(&out_shape, &strides, &strides).fill_rows(out, |o, i, _, step, _| {
            if step == 1 {
                o.copy_from_slice(&x[i..i + o.len()]);
            } else {
                for (e, o) in o.iter_mut().enumerate() {
                    *o = x[i + e * step];
                }
            }
        });
        Ok(())
    }

    fn dropout(&self, x: &CpuStorage, p: f32, seed: u64, out: &mut CpuStorage) -> Result<()> {
        let _p = super::profile::scope("dropout");
        check_dropout(x, p, out)?;
        if is_bf16(out) {
            return via_f32(&[x], out, false, |i, o| self.dropout(i[0], p, seed, o));
        }
        // The kernels' scale: 1/(1 − p) rounded to f32 once, a product per element.
        let s = 1.0f32 / (1.0f32 - p);
        let x = x.as_f32()?;
        for_chunks(out.as_f32_mut()?, |off, o| {
            // One hash for each eight elements (dropout_keep8), whatever the chunk's offset.
            let mut mask = (u64::MAX, 0u8);
            for (i, (o, &v)) in (off as u64..).zip(o.iter_mut().zip(&x[off..])) {
                if mask.0 != i / 8 {
                    mask = (i / 8, dropout_keep8(seed, i / 8, p));
                }
                *o = if (mask.1 >> (i % 8)) & 1 == 1 {
                    v * s
                } else {
                    0.0
                };
            }
        });
        Ok(())
    }

    fn cast(&self, x: &CpuStorage, out: &mut CpuStorage) -> Result<()> {
        let _p = super::profile::scope("cast");
        check_cast(x, out)?;
        widen::cast(x, out)
    }
    fn argmax_rows(&self, x: &CpuStorage, out: &mut CpuStorage, cols: usize) -> Result<()> {
        self.argmax_rows_impl(x, out, cols)
    }

    fn gather_rows(&self, x: IdRows<'_, CpuStorage>, out: &mut CpuStorage) -> Result<()> {
        let (ids, table, dim) = (x.ids, x.rows, x.dim);
        let _p = super::profile::scope("embedding_fwd");
        let (ids, _) = embedding_ids("embedding_fwd", ids, table, out, dim)?;
        let table = table.as_f32()?;
        for (&id, or) in ids.iter().zip(out.as_f32_mut()?.chunks_exact_mut(dim)) {
            or.copy_from_slice(&table[id as usize * dim..][..dim]);
        }
        Ok(())
    }

    fn scatter_add_rows(&self, x: IdRows<'_, CpuStorage>, dst: &mut CpuStorage) -> Result<()> {
        let (ids, src, dim) = (x.ids, x.rows, x.dim);
        let _p = super::profile::scope("embedding_bwd");
        let (ids, vocab) = embedding_ids("embedding_bwd", ids, dst, src, dim)?;
        let src = src.as_f32()?;
        let mut acc = super::try_zeroed_vec::<f64>(vocab * dim)?;
        for (&id, dr) in ids.iter().zip(src.chunks_exact(dim)) {
            for (a, &g) in acc[id as usize * dim..][..dim].iter_mut().zip(dr) {
                *a += g as f64;
            }
        }
        for (o, a) in dst.as_f32_mut()?.iter_mut().zip(acc) {
            *o = a as f32;
        }
        Ok(())
    }
}

impl ElementwiseOps for CpuBackend {
    /// Computed as one fused multiply-add per element, as the kernel does.
    fn affine(&self, x: &CpuStorage, mul: f32, add: f32, out: &mut CpuStorage) -> Result<()> {
        let _p = super::profile::scope("affine");
        check_float_elementwise("affine", &[x], out)?;
        if is_bf16(out) {
            return via_f32(&[x], out, false, |i, o| self.affine(i[0], mul, add, o));
        }
        let x = x.as_f32()?;
        for_chunks(out.as_f32_mut()?, |off, o| {
            for (o, &v) in o.iter_mut().zip(&x[off..]) {
                *o = mul.mul_add(v, add);
            }
        });
        Ok(())
    }

    fn max_axis_bwd(
        &self,
        (x, y, dy): (&CpuStorage, &CpuStorage, &CpuStorage),
        [outer, n, inner]: [usize; 3],
        dx: &mut CpuStorage,
    ) -> Result<()> {
        let _p = super::profile::scope("max_axis_bwd");
        check_max_axis_bwd(x, y, dy, outer, n, inner, dx)?;
        if is_bf16(dx) {
            return via_f32(&[x, y, dy], dx, false, |i, o| {
                self.max_axis_bwd((i[0], i[1], i[2]), [outer, n, inner], o)
            });
        }
        let (x, y, dy, dx) = (x.as_f32()?, y.as_f32()?, dy.as_f32()?, dx.as_f32_mut()?);
        let mut found = vec![false; inner];
        for o in 0..outer {
            found.fill(false);
            let (ym, gm) = (&y[o * inner..][..inner], &dy[o * inner..][..inner]);
            for i in 0..n {
                let base = (o * n + i) * inner;
                for j in 0..inner {
                    let first = !found[j] && is_max(x[base + j], ym[j]);
                    found[j] |= first;
                    dx[base + j] = if first { gm[j] } else { 0.0 };
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
