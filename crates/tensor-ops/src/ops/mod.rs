//! Tensor operations, forward and backward. Each op checks devices and shapes, runs on its
//! inputs' device through [`crate::backend::DeviceBackend`], and records its backward.

pub mod elementwise;
pub mod matmul;
pub mod nn;
pub mod reduce;
pub mod shape;

use crate::backend::DeviceBackend;
use crate::storage::Storage;
use gpu_core::Result;

pub use gpu_core::nn::Activation;

/// The backend's buffer inside `s` (typed by `b`).
pub(crate) fn buf<'a, B: DeviceBackend>(_b: &B, s: &'a Storage) -> Result<&'a B::Buffer> {
    B::get(s)
}

/// The backend's buffer inside `s`, mutably.
pub(crate) fn buf_mut<'a, B: DeviceBackend>(
    _b: &B,
    s: &'a mut Storage,
) -> Result<&'a mut B::Buffer> {
    B::get_mut(s)
}

/// Wraps a buffer of backend `b` as storage.
pub(crate) fn wrap<B: DeviceBackend>(_b: &B, buf: B::Buffer) -> Storage {
    B::wrap(buf)
}

/// Allocates an f32 output of `$len` on `$dev`'s backend as `$out`, runs `$body` (a `Result`),
/// and evaluates to the output's [`Storage`].
macro_rules! compute {
    ($dev:expr, $len:expr, |$b:ident, $out:ident| $body:expr) => {
        $crate::backend::on_device!($dev, |$b| {
            #[allow(unused_mut)]
            let mut $out = gpu_core::Backend::allocate($b, gpu_core::DType::F32, $len)?;
            $body?;
            $crate::ops::wrap($b, $out)
        })
    };
}
pub(crate) use compute;

/// Product of dims.
pub(crate) fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Normalises a possibly negative axis.
pub(crate) fn axis(op: &'static str, rank: usize, axis: isize) -> Result<usize> {
    let a = if axis < 0 { axis + rank as isize } else { axis };
    if a < 0 || a as usize >= rank {
        return Err(gpu_core::GpuError::invalid(
            op,
            format!("axis {axis} out of range for rank {rank}"),
        ));
    }
    Ok(a as usize)
}
