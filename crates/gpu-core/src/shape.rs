//! Row-major shapes.

use crate::error::{GpuError, Result};
use std::fmt;

/// A row-major shape: a list of dimensions, possibly empty (a scalar).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape(Vec<usize>);

impl Shape {
    /// A shape from its dimensions.
    pub fn new(dims: impl Into<Vec<usize>>) -> Self {
        Self(dims.into())
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// Number of elements, or an error when the shape is too large (see [`checked_numel`]).
    pub fn checked_numel(&self) -> Result<usize> {
        checked_numel(&self.0).ok_or_else(|| GpuError::InvalidShape {
            op: "shape",
            reason: format!("{self} has more elements than fit in usize"),
        })
    }

    /// Number of elements (saturating; use [`Shape::checked_numel`] for untrusted shapes).
    pub fn numel(&self) -> usize {
        self.0.iter().fold(1usize, |acc, &d| acc.saturating_mul(d))
    }

    /// Row-major (C-contiguous) strides in elements.
    pub fn contiguous_strides(&self) -> Vec<usize> {
        let mut strides = vec![1; self.0.len()];
        for i in (0..self.0.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * self.0[i + 1];
        }
        strides
    }

    /// Views the shape as `(rows, cols)`: the last dimension is `cols`, the rest fold into rows.
    pub fn as_rows(&self) -> (usize, usize) {
        match self.0.split_last() {
            None => (1, 1),
            Some((&cols, rest)) => (rest.iter().product(), cols),
        }
    }
}

/// The element count of `dims` (0 when a dim is 0), or `None` when the product of the non-zero
/// dims overflows `usize`. A shape that passes has every partial product (of any subset of its
/// dims, in any order) within `usize` too, so code handling it may multiply its dims freely.
pub fn checked_numel(dims: &[usize]) -> Option<usize> {
    let nonzero = dims
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))?;
    Some(if dims.contains(&0) { 0 } else { nonzero })
}

impl From<&[usize]> for Shape {
    fn from(d: &[usize]) -> Self {
        Self(d.to_vec())
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(d: [usize; N]) -> Self {
        Self(d.to_vec())
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides_numel_rows() {
        let s = Shape::from([2, 3, 4]);
        assert_eq!(s.numel(), 24);
        assert_eq!(s.contiguous_strides(), vec![12, 4, 1]);
        assert_eq!(s.as_rows(), (6, 4));
        assert_eq!(Shape::new(vec![]).numel(), 1);
        assert!(Shape::from([usize::MAX, 2]).checked_numel().is_err());
    }

    /// A zero dim makes the count 0, but the other dims must still multiply within usize (so
    /// sub-products such as the outer·inner of a reduction over the zero dim cannot overflow).
    #[test]
    fn checked_numel_rejects_overflow_wherever_the_zero_dims_sit() {
        assert_eq!(checked_numel(&[3, 0, 4]), Some(0));
        assert_eq!(checked_numel(&[]), Some(1));
        assert_eq!(checked_numel(&[(1 << 63) + 1, 2]), None);
        assert_eq!(checked_numel(&[1 << 40, 0, 1 << 40]), None);
        assert_eq!(checked_numel(&[1 << 40, 1 << 40, 0]), None);
        assert_eq!(checked_numel(&[1 << 31, 1 << 31]), Some(1 << 62));
    }
}
