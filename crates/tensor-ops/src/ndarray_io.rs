//! Conversions between [`Tensor`] and `ndarray` arrays, so CPU-side code can hand in its own
//! arrays and get results back as arrays: f32 only, any rank (0 included), any memory layout
//! on the way in (elements are taken in logical row-major order), standard layout on the way out.

use crate::{DType, Device, GpuError, Result, Tensor};
use ndarray::{ArrayBase, ArrayD, Data, Dimension, IxDyn};

impl Tensor {
    /// A tensor with `array`'s shape and elements on `device` (one host-to-device copy for
    /// CUDA). Arrays of any layout are accepted (a transposed view is read in its logical
    /// row-major order). Errors: an absent device, a failed allocation (an array's shape always
    /// fits a tensor: ndarray bounds its element count by `isize::MAX`).
    pub fn from_ndarray<S, D>(array: &ArrayBase<S, D>, device: Device) -> Result<Tensor>
    where
        S: Data<Elem = f32>,
        D: Dimension,
    {
        let data: Vec<f32> = match array.as_slice() {
            Some(s) => s.to_vec(),
            None => array.iter().copied().collect(),
        };
        Tensor::from_vec(data, array.shape(), device)
    }

    /// The elements as an array of this tensor's shape, in standard (row-major) layout (one
    /// device-to-host copy for CUDA). Errors on a tensor that does not hold f32
    /// ([`GpuError::DTypeMismatch`]).
    pub fn to_ndarray(&self) -> Result<ArrayD<f32>> {
        if self.dtype() != DType::F32 {
            return Err(GpuError::DTypeMismatch {
                op: "to_ndarray",
                expected: DType::F32,
                got: self.dtype(),
            });
        }
        let data = self.to_vec()?;
        ArrayD::from_shape_vec(IxDyn(self.shape()), data).map_err(|e| {
            GpuError::shape(
                "to_ndarray",
                format!("{} elements for {:?}", self.numel(), self.shape()),
                e,
            )
        })
    }
}
