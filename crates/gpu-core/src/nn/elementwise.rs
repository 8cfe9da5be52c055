//! Elementwise, broadcasting, reduction and data-movement operations.

use crate::backend::Backend;
use crate::error::Result;

/// Binary operations with NumPy broadcasting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryKind {
    Add,
    Sub,
    Mul,
    Div,
}

/// Pointwise activations and functions, with their derivatives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    Relu,
    /// Exact GELU, `0.5·x·(1 + erf(x/√2))` (PyTorch's default).
    Gelu,
    /// `x·sigmoid(x)`.
    Silu,
    Sigmoid,
    Tanh,
    Exp,
    /// Natural log; `log(0) = -inf`, negative inputs give NaN.
    Log,
}

/// Reductions over one axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceKind {
    Sum,
    Mean,
    Max,
}

/// Elementwise and data-movement operations.
///
/// Shapes are row-major dims. "Axis layout" `(outer, n, inner)` means the tensor is viewed as
/// `[outer, n, inner]` and the operation runs along the middle axis.
pub trait ElementwiseOps: Backend {
    /// `out = a ∘ b` with NumPy broadcasting: `a_shape` and `b_shape` are right-aligned, each
    /// dim equal or 1 (missing dims count as 1). `out` has the broadcast shape's element count.
    fn broadcast_binary(
        &self,
        op: BinaryKind,
        a: &Self::Buffer,
        a_shape: &[usize],
        b: &Self::Buffer,
        b_shape: &[usize],
        out: &mut Self::Buffer,
    ) -> Result<()>;

    /// `out = f(x)`.
    fn activation_fwd(
        &self,
        op: Activation,
        x: &Self::Buffer,
        out: &mut Self::Buffer,
    ) -> Result<()>;

    /// `dx = f'(x) · dy`, given the input `x` and the forward output `y = f(x)`.
    fn activation_bwd(
        &self,
        op: Activation,
        x: &Self::Buffer,
        y: &Self::Buffer,
        dy: &Self::Buffer,
        dx: &mut Self::Buffer,
    ) -> Result<()>;

    /// `out = mul·x + add` (the scalar ops).
    fn affine(&self, x: &Self::Buffer, mul: f32, add: f32, out: &mut Self::Buffer) -> Result<()>;

    /// Reduces `[outer, n, inner]` over `n` into `out` of `[outer, inner]`. `n` may be 0 only for
    /// Sum (gives 0); Mean and Max over an empty axis are an error.
    fn reduce_axis(
        &self,
        op: ReduceKind,
        x: &Self::Buffer,
        outer: usize,
        n: usize,
        inner: usize,
        out: &mut Self::Buffer,
    ) -> Result<()>;

    /// Backward of Max over an axis: `dx[o, i, j] = dy[o, j]` where `x[o, i, j]` is the first
    /// maximum along `i` (as PyTorch's `max(dim)` picks one index), else 0. `y` is the forward
    /// output `[outer, inner]`.
    fn max_axis_bwd(
        &self,
        x: &Self::Buffer,
        y: &Self::Buffer,
        dy: &Self::Buffer,
        outer: usize,
        n: usize,
        inner: usize,
        dx: &mut Self::Buffer,
    ) -> Result<()>;

    /// Block copy: for `o in 0..outer`, copies `len` elements from
    /// `src[src_offset + o·src_stride ..]` to `dst[dst_offset + o·dst_stride ..]`; the rest of
    /// `dst` is left as it was. Slicing and concatenation along any axis reduce to this.
    fn copy_blocks(
        &self,
        src: &Self::Buffer,
        src_offset: usize,
        src_stride: usize,
        dst: &mut Self::Buffer,
        dst_offset: usize,
        dst_stride: usize,
        outer: usize,
        len: usize,
    ) -> Result<()>;

    /// `out = x.permute(perm)` materialised: `shape` is x's shape (at most 6 dims), `perm` a
    /// permutation of `0..shape.len()`; out has shape `[shape[perm[0]], ...]`.
    fn permute(
        &self,
        x: &Self::Buffer,
        shape: &[usize],
        perm: &[usize],
        out: &mut Self::Buffer,
    ) -> Result<()>;

    /// Inverted dropout: `out[i] = keep(seed, i) ? x[i] / (1 − p) : 0`, where `keep` is a
    /// counter-based hash of `(seed, i)` that is identical on every backend, so the same call on
    /// `dy` is the backward. `p` in `[0, 1)`.
    fn dropout(&self, x: &Self::Buffer, p: f32, seed: u64, out: &mut Self::Buffer) -> Result<()>;
}

/// The shape two shapes broadcast to, or `None` when they are incompatible.
pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

/// The dropout keep decision: a SplitMix64 hash of `seed ^ (i · golden)`; kept when the top 24
/// bits, as a fraction of 2^24, are `>= p`. CUDA kernels compute exactly this.
pub fn dropout_keep(seed: u64, i: u64, p: f32) -> bool {
    let mut z = seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    let u = (z >> 40) as u32; // top 24 bits
    (u as f32) >= p * (1u32 << 24) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_shapes() {
        assert_eq!(broadcast_shape(&[2, 3], &[3]), Some(vec![2, 3]));
        assert_eq!(broadcast_shape(&[2, 1, 4], &[3, 1]), Some(vec![2, 3, 4]));
        assert_eq!(broadcast_shape(&[], &[5]), Some(vec![5]));
        assert_eq!(broadcast_shape(&[2, 3], &[2]), None);
    }

    #[test]
    fn dropout_keeps_about_one_minus_p() {
        let kept = (0..100_000u64)
            .filter(|&i| dropout_keep(42, i, 0.2))
            .count();
        assert!((kept as f64 / 100_000.0 - 0.8).abs() < 0.01, "{kept}");
        assert!((0..1000u64).all(|i| dropout_keep(7, i, 0.0)));
    }
}
