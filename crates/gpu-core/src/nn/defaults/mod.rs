//! The default bodies of the family methods, built from [`Primitives`] (see its module docs).
//! They are slow (one primitive call per step, temporaries) but follow each op's documented
//! semantics; `tests/primitives_only.rs` states and checks their bounds against the CPU
//! reference.
//!
//! Two kinds:
//! - **device compositions** (elementwise, rows, attention, the decode norms, AdamW,
//!   clipping, lerp): primitive calls on the device; small u32 index buffers (targets,
//!   positions) may be read on the host to build gather indices, so these defaults synchronise
//!   and cannot be captured in a CUDA graph;
//! - **host fallbacks** ([`host`]: KV-cache attention and RoPE appends, quantized matmuls,
//!   sampling, Schedule-Free AdamW, Prodigy): the operands are copied to the host, the CPU
//!   reference runs, the results are copied back. Bit-exact against the CPU backend; a
//!   backend that needs these fast overrides them.

pub mod attention;
pub mod decode;
pub mod elementwise;
pub mod host;
pub mod optim;
pub mod packed;
pub mod rows;
pub mod world;
pub mod world_svd;

use crate::backend::{Backend, BufferInfo};
use crate::dtype::DType;
use crate::error::{GpuError, Result};
use crate::nn::elementwise::{broadcast_shape, Activation, BinaryKind, ReduceKind};
use crate::nn::primitives::Primitives;

/// A new f32 buffer of `len` elements (contents unspecified).
pub fn f32_buf<B: Primitives + ?Sized>(b: &B, len: usize) -> Result<B::Buffer> {
    b.allocate(DType::F32, len)
}

/// A one-element f32 buffer holding `v` (a broadcast scalar).
pub fn scalar<B: Primitives + ?Sized>(b: &B, v: f32) -> Result<B::Buffer> {
    let mut s = f32_buf(b, 1)?;
    b.fill(&mut s, v)?;
    Ok(s)
}

/// `x ∘ y` with broadcasting, into a new f32 buffer of the broadcast shape.
pub fn zip<B: Primitives + ?Sized>(
    b: &B,
    op: BinaryKind,
    (x, xs): (&B::Buffer, &[usize]),
    (y, ys): (&B::Buffer, &[usize]),
) -> Result<B::Buffer> {
    let shape = broadcast_shape(xs, ys).ok_or_else(|| {
        GpuError::invalid(op.name(), format!("{xs:?} and {ys:?} do not broadcast"))
    })?;
    let mut out = f32_buf(b, shape.iter().product())?;
    b.broadcast_binary(op, x, xs, y, ys, &mut out)?;
    Ok(out)
}

/// `x ∘ y` elementwise for two f32 buffers of the same length.
pub fn zip_same<B: Primitives + ?Sized>(
    b: &B,
    op: BinaryKind,
    x: &B::Buffer,
    y: &B::Buffer,
) -> Result<B::Buffer> {
    let n = [x.len()];
    zip(b, op, (x, &n), (y, &[y.len()]))
}

/// `x ∘ s` for an f32 buffer and a scalar.
pub fn zip_scalar<B: Primitives + ?Sized>(
    b: &B,
    op: BinaryKind,
    x: &B::Buffer,
    s: f32,
) -> Result<B::Buffer> {
    let s = scalar(b, s)?;
    zip(b, op, (x, &[x.len()]), (&s, &[1]))
}

/// `f(x)` into a new f32 buffer.
pub fn map<B: Primitives + ?Sized>(b: &B, f: Activation, x: &B::Buffer) -> Result<B::Buffer> {
    let mut out = f32_buf(b, x.len())?;
    b.activation_fwd(f, x, &mut out)?;
    Ok(out)
}

/// Reduces `[outer, n, inner]` over `n` into a new f32 `[outer, inner]` buffer.
pub fn reduce<B: Primitives + ?Sized>(
    b: &B,
    op: ReduceKind,
    x: &B::Buffer,
    [outer, n, inner]: [usize; 3],
) -> Result<B::Buffer> {
    let mut out = f32_buf(b, outer * inner)?;
    b.reduce_axis(op, x, outer, n, inner, &mut out)?;
    Ok(out)
}

/// `1/sqrt(v)` as `exp(−ln(v)/2)` (the activation vocabulary has no square root): within
/// `(1 + |ln v|/2)·2^-22` relative of the rounded `1/sqrt(v)` (two f32 activations, each
/// correctly rounded from f64, and one product).
pub fn rsqrt<B: Primitives + ?Sized>(b: &B, v: &B::Buffer) -> Result<B::Buffer> {
    let l = map(b, Activation::Log, v)?;
    let h = zip_scalar(b, BinaryKind::Mul, &l, -0.5)?;
    map(b, Activation::Exp, &h)
}

/// The u32 contents of a (small) index buffer, read on the host.
pub fn read_u32<B: Backend + ?Sized>(b: &B, ids: &B::Buffer) -> Result<Vec<u32>> {
    crate::ops::same_dtype("index buffer", DType::U32, ids.dtype())?;
    b.download::<u32>(ids)
}

/// Uploads `ids` as a new u32 buffer.
pub fn ids_buf<B: Backend + ?Sized>(b: &B, ids: &[u32]) -> Result<B::Buffer> {
    b.upload(ids)
}

/// Row-wise flat indices `r·cols + idx[r]` as u32, checking each `idx[r] < cols` (`op`'s error).
pub fn flat_row_ids(op: &'static str, idx: &[u32], cols: usize) -> Result<Vec<u32>> {
    idx.iter()
        .enumerate()
        .map(|(r, &i)| {
            if (i as usize) < cols {
                u32::try_from(r * cols + i as usize)
                    .map_err(|_| GpuError::invalid(op, "too many elements for u32 indices"))
            } else {
                Err(GpuError::invalid(
                    op,
                    format!("index {i} of row {r} is not below {cols}"),
                ))
            }
        })
        .collect()
}

/// Overwrites `dst` (same length, f32 or bf16) with `src` (f32), rounding once.
pub fn store<B: Primitives + ?Sized>(b: &B, src: &B::Buffer, dst: &mut B::Buffer) -> Result<()> {
    b.cast(src, dst)
}

/// A copy of `x` (f32 or bf16) as a new f32 buffer (exact).
pub fn widen<B: Primitives + ?Sized>(b: &B, x: &B::Buffer) -> Result<B::Buffer> {
    let mut out = f32_buf(b, x.len())?;
    b.cast(x, &mut out)?;
    Ok(out)
}
