//! Host-side bounds on the values of u32 tensors (token ids, class targets), so `embedding` and
//! `cross_entropy` can reject an out-of-range index on every device without reading the device.
//!
//! A u32 tensor built from host data ([`Tensor::from_vec`]) records its maximum, computed on the
//! host as it is created. Views (reshape), `detach`, `requires_grad_` and `to(device)` keep the
//! bound; `narrow` keeps it as an upper bound that may no longer be attained, and `cat` takes the
//! largest. An op checks the bound against the size it indexes: below it, nothing is read; a
//! bound that is attained and too large is the error. Only a tensor whose bound is unknown (no op
//! makes u32 tensors on a device today) or loose and too large is checked by reading its values:
//! on CUDA that is one device-to-host copy, counted by [`crate::transfer_stats`].

use crate::storage::Storage;
use crate::tensor::Tensor;
use gpu_core::{DType, GpuError, Result};
use std::sync::Arc;

/// What the host knows about the values of a u32 tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum U32Bound {
    /// Nothing (a tensor of another dtype, or made by an op on a device).
    Unknown,
    /// The tensor has no elements.
    Empty,
    /// Every value is `<= max`; `attained` when some value equals it.
    AtMost { max: u32, attained: bool },
}

impl U32Bound {
    /// The exact bound of host values.
    pub(crate) fn of(values: &[u32]) -> U32Bound {
        match values.iter().max() {
            Some(&max) => U32Bound::AtMost {
                max,
                attained: true,
            },
            None => U32Bound::Empty,
        }
    }

    /// A bound on the values of both (the bound of a concatenation).
    pub(crate) fn union(self, other: U32Bound) -> U32Bound {
        use U32Bound::*;
        match (self, other) {
            (Unknown, _) | (_, Unknown) => Unknown,
            (Empty, b) | (b, Empty) => b,
            (
                AtMost {
                    max: a,
                    attained: ta,
                },
                AtMost {
                    max: b,
                    attained: tb,
                },
            ) => AtMost {
                max: a.max(b),
                attained: (a >= b && ta) || (b >= a && tb),
            },
        }
    }

    /// The bound of a part of the values (a slice): `len` elements remain; the maximum may
    /// have been cut off.
    pub(crate) fn part(self, len: usize) -> U32Bound {
        match self {
            _ if len == 0 => U32Bound::Empty,
            U32Bound::AtMost { max, .. } => U32Bound::AtMost {
                max,
                attained: false,
            },
            other => other,
        }
    }
}

impl Tensor {
    /// The same tensor with `bound` recorded. Called on tensors just made (not yet shared);
    /// should one be shared, its bound is left as it is, which stays correct for its values (at
    /// worst `Unknown`, which costs a read when checked).
    pub(crate) fn with_u32_bound(mut self, bound: U32Bound) -> Tensor {
        if let Some(inner) = Arc::get_mut(&mut self.0) {
            inner.u32_bound = bound;
        }
        self
    }

    /// Errors with [`GpuError::IndexOutOfRange`] unless every value of this u32 tensor is
    /// `< bound`. Reads no values when the recorded bound decides (always for tensors made
    /// from host data); otherwise reads them once (a device-to-host copy on CUDA).
    pub(crate) fn check_u32_below(
        &self,
        op: &'static str,
        what: &'static str,
        bound: usize,
    ) -> Result<()> {
        if self.dtype() != DType::U32 {
            return Err(GpuError::DTypeMismatch {
                op,
                expected: DType::U32,
                got: self.dtype(),
            });
        }
        let max = match self.0.u32_bound {
            U32Bound::Empty => return Ok(()),
            U32Bound::AtMost { max, .. } if (max as usize) < bound => return Ok(()),
            U32Bound::AtMost {
                max,
                attained: true,
            } => Some(max),
            U32Bound::AtMost { .. } | U32Bound::Unknown => self.read_u32_max()?,
        };
        match max {
            Some(value) if value as usize >= bound => Err(GpuError::IndexOutOfRange {
                op,
                what,
                value,
                bound,
            }),
            _ => Ok(()),
        }
    }

    /// The largest value, read from the storage (one device-to-host copy on a GPU).
    fn read_u32_max(&self) -> Result<Option<u32>> {
        let on_host = match &*self.read() {
            Storage::Cpu(c) => Some(c.as_u32()?.iter().max().copied()),
            Storage::Cuda(_) | Storage::Wgpu(_) => None,
        };
        match on_host {
            Some(m) => Ok(m),
            None => Ok(self.to_vec_u32()?.into_iter().max()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer_stats;
    use gpu_core::{CpuStorage, Device};

    #[test]
    fn bounds_combine_and_loosen() {
        use U32Bound::*;
        let at = |max, attained| AtMost { max, attained };
        assert_eq!(U32Bound::of(&[3, 9, 1]), at(9, true));
        assert_eq!(U32Bound::of(&[]), Empty);
        assert_eq!(at(9, true).union(at(4, true)), at(9, true));
        assert_eq!(at(9, false).union(at(4, true)), at(9, false));
        assert_eq!(at(4, false).union(at(4, true)), at(4, true));
        assert_eq!(Empty.union(at(4, false)), at(4, false));
        assert_eq!(Unknown.union(Empty), Unknown);
        assert_eq!(at(9, true).part(3), at(9, false));
        assert_eq!(at(9, true).part(0), Empty);
        assert_eq!(Unknown.part(2), Unknown);
    }

    /// A u32 tensor without a recorded bound (as an op on a device could make) is checked by
    /// reading its values: the exact maximum decides, named in the error.
    #[test]
    fn an_unknown_bound_is_checked_by_reading_the_values() {
        let t = Tensor::from_storage(
            Storage::Cpu(CpuStorage::U32(vec![0, 5, 2])),
            vec![3],
            Device::Cpu,
        );
        assert_eq!(t.0.u32_bound, U32Bound::Unknown);
        assert!(t.check_u32_below("op", "ids", 6).is_ok());
        match t.check_u32_below("op", "ids", 5) {
            Err(GpuError::IndexOutOfRange {
                value: 5, bound: 5, ..
            }) => {}
            other => panic!("{other:?}"),
        }
        // A loose bound too large for the check falls back to the values as well.
        let loose = t.with_u32_bound(U32Bound::AtMost {
            max: 9,
            attained: false,
        });
        assert!(loose.check_u32_below("op", "ids", 6).is_ok());
        assert_eq!(
            transfer_stats(),
            Default::default(),
            "no transfer on the CPU"
        );
    }
}
