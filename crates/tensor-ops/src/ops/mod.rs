//! Tensor operations, forward and backward. Each op checks devices and shapes, runs on its
//! inputs' device through [`crate::backend::DeviceBackend`], and records its backward.

mod attention;
pub mod decode;
pub mod elementwise;
pub mod matmul;
pub mod nn;
pub mod quant;
pub mod reduce;
pub mod sample;
pub mod shape;
pub mod world;

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
/// and evaluates to the output's [`Storage`]. `$body` must overwrite every element of `$out`:
/// on the CPU the buffer may be a recycled one (`crate::pool`).
/// With a dtype before the length, the output has that dtype (f32 or bf16).
macro_rules! compute {
    ($dev:expr, $len:expr, |$b:ident, $out:ident| $body:expr) => {
        $crate::ops::compute!($dev, gpu_core::DType::F32, $len, |$b, $out| $body)
    };
    ($dev:expr, $dtype:expr, $len:expr, |$b:ident, $out:ident| $body:expr) => {
        $crate::backend::on_device!($dev, |$b| {
            #[allow(unused_mut)]
            let mut $out = $crate::backend::DeviceBackend::alloc_output_as($b, $dtype, $len)?;
            $body?;
            $crate::ops::wrap($b, $out)
        })
    };
}
pub(crate) use compute;

/// Product of the dims of an existing tensor's shape, or of part of one. Never overflows: every
/// shape a tensor gets passes [`checked_numel`], which bounds the product of its non-zero dims.
pub(crate) fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// The element count of a shape about to be given to a tensor, or [`GpuError::InvalidShape`]
/// naming `op` when it is too large (see [`gpu_core::shape::checked_numel`]). Every op that
/// makes a new shape (rather than keeping or shrinking its input's) checks it here.
pub(crate) fn checked_numel(op: &'static str, shape: &[usize]) -> Result<usize> {
    gpu_core::nn::elementwise::checked_numel(op, shape)
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
