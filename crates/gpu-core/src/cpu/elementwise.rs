//! [`ElementwiseOps`] on the CPU: the reference the CUDA kernels are tested against.
//! Activations are evaluated in f64 (erf from `libm`), reductions accumulate in f64, binary ops,
//! affine and dropout compute exactly what the kernels compute in f32.

use super::par::{for_chunks, Strided};
use super::{CpuBackend, CpuStorage};
use crate::error::Result;
use crate::nn::elementwise::{
    check_broadcast, check_copy_blocks, check_dropout, check_max_axis_bwd, check_permute,
    check_reduce, dropout_keep, Activation, BinaryKind, ElementwiseOps, ReduceKind,
};
use crate::ops::check_elementwise;

/// `1/sqrt(2)`.
const FRAC_1_SQRT_2: f64 = std::f64::consts::FRAC_1_SQRT_2;
/// `1/sqrt(2π)`.
const FRAC_1_SQRT_2PI: f64 = 0.398_942_280_401_432_7;

/// The standard normal CDF `Φ(x) = erfc(−x/√2)/2`, accurate in both tails.
fn normal_cdf(x: f64) -> f64 {
    0.5 * libm::erfc(-x * FRAC_1_SQRT_2)
}

/// The standard normal density `φ(x)`.
fn normal_pdf(x: f64) -> f64 {
    FRAC_1_SQRT_2PI * (-0.5 * x * x).exp()
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `f(x)` in f64. GELU and SiLU take their limits at −inf (−0, the sign of their negative tail;
/// `x·Φ(x)` and `x·σ(x)` would be `−inf·0` = NaN) and +inf (+inf).
pub(crate) fn activation_f64(op: Activation, x: f64) -> f64 {
    match op {
        Activation::Gelu | Activation::Silu if x == f64::NEG_INFINITY => -0.0,
        // NaN stays NaN (x < 0 is false), as in PyTorch.
        Activation::Relu => {
            if x < 0.0 {
                0.0
            } else {
                x
            }
        }
        Activation::Gelu => x * normal_cdf(x),
        Activation::Silu => x * sigmoid(x),
        Activation::Sigmoid => sigmoid(x),
        Activation::Tanh => x.tanh(),
        Activation::Exp => x.exp(),
        Activation::Log => x.ln(),
    }
}

/// `f'(x)` in f64, from the input `x` or the forward output `y` as the formulas need. GELU's and
/// SiLU's derivatives take their limits at ±inf: 1 at +inf, 0 at −inf (the formulas give
/// `inf·0` = NaN there).
pub(crate) fn activation_grad_f64(op: Activation, x: f64, y: f64) -> f64 {
    match op {
        Activation::Gelu | Activation::Silu if x.is_infinite() => {
            if x > 0.0 {
                1.0
            } else {
                0.0
            }
        }
        Activation::Relu => {
            if x > 0.0 {
                1.0
            } else {
                0.0
            }
        }
        Activation::Gelu => normal_cdf(x) + x * normal_pdf(x),
        Activation::Silu => {
            let s = sigmoid(x);
            s * (1.0 + x * (1.0 - s))
        }
        Activation::Sigmoid => y * (1.0 - y),
        Activation::Tanh => 1.0 - y * y,
        Activation::Exp => y,
        Activation::Log => 1.0 / x,
    }
}

/// `dx` of one element: `f'(x)·dy` in f64, except ReLU's select.
fn activation_grad(op: Activation, x: f32, y: f32, dy: f32) -> f32 {
    if op == Activation::Relu {
        // A select, not a product: dy = NaN or inf with x <= 0 gives 0, as in PyTorch.
        if x > 0.0 {
            dy
        } else {
            0.0
        }
    } else {
        (activation_grad_f64(op, x as f64, y as f64) * dy as f64) as f32
    }
}

/// Combines two values of a Max reduction: NaN propagates, ties keep `a`.
fn max_combine(a: f32, b: f32) -> f32 {
    if b > a || b.is_nan() {
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

impl ElementwiseOps for CpuBackend {
    fn broadcast_binary(
        &self,
        op: BinaryKind,
        a: &CpuStorage,
        a_shape: &[usize],
        b: &CpuStorage,
        b_shape: &[usize],
        out: &mut CpuStorage,
    ) -> Result<()> {
        let shape = check_broadcast(a, a_shape, b, b_shape, out)?;
        let (a, b, out) = (a.as_f32()?, b.as_f32()?, out.as_f32_mut()?);
        let sa = broadcast_strides(a_shape, &shape);
        let sb = broadcast_strides(b_shape, &shape);
        Strided::new(&shape, &sa, &sb).fill(out, |ia, ib| op.eval(a[ia], b[ib]));
        Ok(())
    }

    fn activation_fwd(&self, op: Activation, x: &CpuStorage, out: &mut CpuStorage) -> Result<()> {
        check_elementwise("activation_fwd", &[x], out)?;
        let x = x.as_f32()?;
        for_chunks(out.as_f32_mut()?, |off, o| {
            for (o, &v) in o.iter_mut().zip(&x[off..]) {
                *o = activation_f64(op, v as f64) as f32;
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
        check_elementwise("activation_bwd", &[x, y, dy], dx)?;
        let (x, y, dy) = (x.as_f32()?, y.as_f32()?, dy.as_f32()?);
        for_chunks(dx.as_f32_mut()?, |off, dx| {
            let (x, y, dy) = (&x[off..], &y[off..], &dy[off..]);
            for (i, d) in dx.iter_mut().enumerate() {
                *d = activation_grad(op, x[i], y[i], dy[i]);
            }
        });
        Ok(())
    }

    /// Computed as one fused multiply-add per element, as the kernel does.
    fn affine(&self, x: &CpuStorage, mul: f32, add: f32, out: &mut CpuStorage) -> Result<()> {
        check_elementwise("affine", &[x], out)?;
        let x = x.as_f32()?;
        for_chunks(out.as_f32_mut()?, |off, o| {
            for (o, &v) in o.iter_mut().zip(&x[off..]) {
                *o = mul.mul_add(v, add);
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
        check_reduce(op, x, outer, n, inner, out)?;
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

    fn max_axis_bwd(
        &self,
        x: &CpuStorage,
        y: &CpuStorage,
        dy: &CpuStorage,
        outer: usize,
        n: usize,
        inner: usize,
        dx: &mut CpuStorage,
    ) -> Result<()> {
        check_max_axis_bwd(x, y, dy, outer, n, inner, dx)?;
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

    fn copy_blocks(
        &self,
        src: &CpuStorage,
        src_offset: usize,
        src_stride: usize,
        dst: &mut CpuStorage,
        dst_offset: usize,
        dst_stride: usize,
        outer: usize,
        len: usize,
    ) -> Result<()> {
        check_copy_blocks(
            src, src_offset, src_stride, dst, dst_offset, dst_stride, outer, len,
        )?;
        if len == 0 {
            return Ok(());
        }
        let (src, dst) = (src.as_f32()?, dst.as_f32_mut()?);
        for o in 0..outer {
            let s = src_offset + o * src_stride;
            let d = dst_offset + o * dst_stride;
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
        let out_shape = check_permute(x, shape, perm, out)?;
        let (x, out) = (x.as_f32()?, out.as_f32_mut()?);
        let in_strides = crate::Shape::from(shape).contiguous_strides();
        let strides: Vec<usize> = perm.iter().map(|&p| in_strides[p]).collect();
        Strided::new(&out_shape, &strides, &strides).fill(out, |i, _| x[i]);
        Ok(())
    }

    fn dropout(&self, x: &CpuStorage, p: f32, seed: u64, out: &mut CpuStorage) -> Result<()> {
        check_dropout(x, p, out)?;
        let q = 1.0 - p;
        let x = x.as_f32()?;
        for_chunks(out.as_f32_mut()?, |off, o| {
            for (i, (o, &v)) in (off..).zip(o.iter_mut().zip(&x[off..])) {
                *o = if dropout_keep(seed, i as u64, p) {
                    v / q
                } else {
                    0.0
                };
            }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests;
