//! Defaults of [`ElementwiseOps`](crate::nn::ElementwiseOps): affine and the Max backward.

use super::{flat_row_ids, ids_buf, read_u32, scalar, zip};
use crate::backend::BufferInfo;
use crate::error::Result;
use crate::nn::elementwise::{check_max_axis_bwd, BinaryKind};
use crate::nn::primitives::{IdRows, Primitives};
use crate::ops::check_float_elementwise;

/// `out = mul·x + add` as two broadcast ops (two roundings where the CPU fuses one: within
/// `ulp(mul·x)/2` of the fused result). A bf16 `x` is widened first and the f32 result rounded
/// once into `out`, as the CPU's `via_f32` (the scalars are f32 buffers, and a broadcast op
/// takes one dtype: multiplying the bf16 `x` by them directly was a dtype error).
pub fn affine<B: Primitives + ?Sized>(
    b: &B,
    x: &B::Buffer,
    mul: f32,
    add: f32,
    out: &mut B::Buffer,
) -> Result<()> {
    check_float_elementwise("affine", &[x], out)?;
    let n = [x.len()];
    let (m, a) = (scalar(b, mul)?, scalar(b, add)?);
    if out.dtype() == crate::DType::F32 {
        let prod = zip(b, BinaryKind::Mul, (x, &n), (&m, &[1]))?;
        return b.broadcast_binary(BinaryKind::Add, &prod, &n, &a, &[1], out);
    }
    let prod = zip(b, BinaryKind::Mul, (&super::widen(b, x)?, &n), (&m, &[1]))?;
    let wide = zip(b, BinaryKind::Add, (&prod, &n), (&a, &[1]))?;
    b.cast(&wide, out)
}

/// Max backward: the axis moved last (`permute`), the first maximum of each row
/// (`argmax_rows`, whose NaN rule is the Max reduction's), then `dy` scattered to it
/// (`scatter_add_rows` with one-element rows). Exact.
pub fn max_axis_bwd<B: Primitives + ?Sized>(
    b: &B,
    (x, y, dy): (&B::Buffer, &B::Buffer, &B::Buffer),
    [outer, n, inner]: [usize; 3],
    dx: &mut B::Buffer,
) -> Result<()> {
    check_max_axis_bwd(x, y, dy, outer, n, inner, dx)?;
    if dx.is_empty() {
        return Ok(());
    }
    let mut xt = b.allocate(x.dtype(), x.len())?;
    b.permute(x, &[outer, n, inner], &[0, 2, 1], &mut xt)?;
    let mut idx = b.allocate(crate::DType::U32, outer * inner)?;
    b.argmax_rows(&xt, &mut idx, n)?;
    let idx = read_u32(b, &idx)?;
    // Row (o, j) of the permuted view picks element (o, idx, j) of x.
    let flat: Vec<u32> = flat_row_ids("max_axis_bwd", &idx, n)?
        .into_iter()
        .map(|p| {
            let (row, i) = (p as usize / n, p as usize % n);
            let (o, j) = (row / inner, row % inner);
            ((o * n + i) * inner + j) as u32
        })
        .collect();
    let ids = ids_buf(b, &flat)?;
    if dx.dtype() == crate::DType::F32 {
        return b.scatter_add_rows(IdRows::new(&ids, dy, 1), dx);
    }
    let mut wide = super::f32_buf(b, dx.len())?;
    let dy = super::widen(b, dy)?;
    b.scatter_add_rows(IdRows::new(&ids, &dy, 1), &mut wide)?;
    b.cast(&wide, dx)
}
