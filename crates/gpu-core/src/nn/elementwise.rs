//! Elementwise, broadcasting, reduction and data-movement operations.

pub use super::activation::Activation;
use crate::dtype::DType;
use crate::error::{GpuError, Result};
pub use crate::nn::primitives::Primitives;
use crate::ops::{check_float_elementwise, require_float, same_dtype, BufferInfoDyn};

/// Binary operations with NumPy broadcasting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryKind {
    Add,
    Sub,
    Mul,
    Div,
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
pub trait ElementwiseOps: Primitives {
    /// `out = mul·x + add` (the scalar ops).
    fn affine(&self, x: &Self::Buffer, mul: f32, add: f32, out: &mut Self::Buffer) -> Result<()> {
        crate::nn::defaults::elementwise::affine(self, x, mul, add, out)
    }

    /// Backward of Max over an axis: `dx[o, i, j] = dy[o, j]` where `x[o, i, j]` is the first
    /// maximum along `i` (as PyTorch's `max(dim)` picks one index), else 0. `y` is the forward
    /// output `[outer, inner]`; `dims` the axis layout `[outer, n, inner]`.
    fn max_axis_bwd(
        &self,
        (x, y, dy): (&Self::Buffer, &Self::Buffer, &Self::Buffer),
        dims: [usize; 3],
        dx: &mut Self::Buffer,
    ) -> Result<()> {
        crate::nn::defaults::elementwise::max_axis_bwd(self, (x, y, dy), dims, dx)
    }

    /// [`Primitives::dropout`] with the seed completed when the op runs: `seed` plus (wrapping)
    /// the u64 entry `index` of `offsets` (a U32 buffer of pairs, low word first), so a CUDA
    /// graph that records this call draws new masks on each replay from the values written
    /// into `offsets` before it (`tensor_ops::graph::with_dropout_offsets`). The same as
    /// `dropout(x, p, seed + offsets[index])`. The default reads the entry on the host
    /// ([`seed_offset`]: it synchronises, so it cannot be captured in a graph); CUDA overrides
    /// it with its kernel reading the entry on the device.
    fn dropout_offset(
        &self,
        x: &Self::Buffer,
        p: f32,
        seed: u64,
        (offsets, index): (&Self::Buffer, usize),
        out: &mut Self::Buffer,
    ) -> Result<()> {
        let off = seed_offset(self, "dropout_offset", offsets, index)?;
        self.dropout(x, p, seed.wrapping_add(off), out)
    }
}

/// The u64 entry `index` of `offsets` (U32 pairs, low word first), read on the host; a
/// shape error (`op`'s) when `offsets` is not U32 or has no entry `index`.
pub fn seed_offset<B: crate::backend::Backend + ?Sized>(
    b: &B,
    op: &'static str,
    offsets: &B::Buffer,
    index: usize,
) -> Result<u64> {
    check_seed_offset(op, offsets, index)?;
    let words = b.download::<u32>(offsets)?;
    Ok(words[2 * index] as u64 | (words[2 * index + 1] as u64) << 32)
}

/// A shape error (`op`'s) unless `offsets` is U32 and holds the u64 entry `index` (U32 pairs,
/// low word first): the check of [`seed_offset`], which backends that read the entry on the
/// device share.
pub fn check_seed_offset<T: crate::backend::BufferInfo + ?Sized>(
    op: &'static str,
    offsets: &T,
    index: usize,
) -> Result<()> {
    let fits = index
        .checked_add(1)
        .and_then(|k| k.checked_mul(2))
        .is_some_and(|need| need <= offsets.len());
    if offsets.dtype() != DType::U32 || !fits {
        return Err(GpuError::shape(
            op,
            format!("offsets of U32 pairs (u64s, low word first) with an entry {index}"),
            format!("{} {}", offsets.len(), offsets.dtype()),
        ));
    }
    Ok(())
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

/// The dropout keep decision: element `i` is kept when a 24-bit uniform `u_i >= t`, with
/// `t = ⌈p·2^24⌉` (so the keep probability is `1 − t/2^24`, within `2^-24` of `1 − p`). The top
/// 8 bits of `u_i` are byte `i mod 8` of the SplitMix64 hash of `(seed, i / 8)`, so one hash
/// decides eight elements; its low 16 bits, the top 16 of the hash of
/// `(seed ^ DROPOUT_LOW_KEY, i)`, are drawn only where that byte ties with `t`'s top byte (one
/// element in 256). CUDA kernels compute exactly this.
pub fn dropout_keep(seed: u64, i: u64, p: f32) -> bool {
    (dropout_keep8(seed, i / 8, p) >> (i % 8)) & 1 == 1
}

/// The keep decisions of elements `8j .. 8j + 7` ([`dropout_keep`]) as the bits of a byte,
/// bit `e` for element `8j + e`: one hash for the eight.
pub fn dropout_keep8(seed: u64, j: u64, p: f32) -> u8 {
    // p·2^24 is exact in f32; an integer u is >= it exactly when u >= its ceiling.
    let t = (p * (1u32 << 24) as f32).ceil() as u32;
    let (z, tb) = (splitmix(seed, j), t >> 16);
    (0..8).fold(0u8, |mask, e| {
        let b = ((z >> (8 * e)) & 0xFF) as u32;
        let keep = if b != tb {
            b > tb
        } else {
            ((splitmix(seed ^ DROPOUT_LOW_KEY, 8 * j + e) >> 48) as u32) >= (t & 0xFFFF)
        };
        mask | (keep as u8) << e
    })
}

/// The key of the second hash [`dropout_keep`] draws on a tie.
const DROPOUT_LOW_KEY: u64 = 0xD1B5_4A32_D192_ED03;

/// The SplitMix64 hash the device's random streams share: `seed ^ (i · golden)`, mixed.
fn splitmix(seed: u64, i: u64) -> u64 {
    let mut z = seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Element `i` of the standard normal stream `seed` (the CUDA kernel `randn_f32`): Box–Muller
/// on the hash's halves, `u1 = (top 24 bits + 1)/2^24` in `(0, 1]`, `u2 = (low 24 bits)/2^24`,
/// `sqrt(−2·ln u1)·cos(2π·u2)`, here in f64 then rounded (the kernel's f32 `logf`, `sqrtf`
/// and `cospif` stay within a few ulps of it: |Δ| <= 8·2^-24·|sqrt(−2·ln u1)| <= 3e-6).
pub fn randn_at(seed: u64, i: u64) -> f32 {
    let z = splitmix(seed, i);
    let u1 = ((z >> 40) as f64 + 1.0) / 16_777_216.0;
    let u2 = (z & 0xFF_FFFF) as f64 / 16_777_216.0;
    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
}

impl BinaryKind {
    /// The op's name: the tensor op's name and the `{name}` of its kernels
    /// `binary_{same,2d,nd}_{name}_f32`.
    pub const fn name(self) -> &'static str {
        match self {
            BinaryKind::Add => "add",
            BinaryKind::Sub => "sub",
            BinaryKind::Mul => "mul",
            BinaryKind::Div => "div",
        }
    }

    /// Every binary operation, in declaration order.
    pub const ALL: [BinaryKind; 4] = [
        BinaryKind::Add,
        BinaryKind::Sub,
        BinaryKind::Mul,
        BinaryKind::Div,
    ];

    /// The scalar operation in f32, exactly as the kernels compute it (IEEE: `x / 0` is ±inf,
    /// `0 / 0` is NaN).
    pub fn eval(self, a: f32, b: f32) -> f32 {
        match self {
            BinaryKind::Add => a + b,
            BinaryKind::Sub => a - b,
            BinaryKind::Mul => a * b,
            BinaryKind::Div => a / b,
        }
    }
}

/// The most dims [`Primitives::broadcast_binary`] and [`Primitives::permute`] accept.
pub const MAX_DIMS: usize = 6;

/// The element count of `shape`, or [`GpuError::InvalidShape`] when it is too large (see
/// [`crate::shape::checked_numel`]).
pub fn checked_numel(op: &'static str, shape: &[usize]) -> Result<usize> {
    crate::shape::checked_numel(shape).ok_or_else(|| GpuError::InvalidShape {
        op,
        reason: format!("{shape:?} has more elements than fit in usize"),
    })
}

fn check_len(op: &'static str, name: &str, buf: &dyn BufferInfoDyn, want: usize) -> Result<()> {
    crate::ops::check_count(op, name, buf.len_dyn(), want)
}

fn check_rank(op: &'static str, shape: &[usize]) -> Result<()> {
    if shape.len() > MAX_DIMS {
        return Err(GpuError::InvalidShape {
            op,
            reason: format!("{shape:?} has more than {MAX_DIMS} dims"),
        });
    }
    Ok(())
}

/// Checks the arguments of [`Primitives::broadcast_binary`] (buffers of one float dtype, f32 or bf16, at most
/// [`MAX_DIMS`] dims, compatible shapes, lengths equal to the shapes' element counts); returns
/// the broadcast shape.
pub fn check_broadcast(
    a: &dyn BufferInfoDyn,
    a_shape: &[usize],
    b: &dyn BufferInfoDyn,
    b_shape: &[usize],
    out: &dyn BufferInfoDyn,
) -> Result<Vec<usize>> {
    const OP: &str = "broadcast_binary";
    require_float(OP, out.dtype_dyn())?;
    for buf in [a, b] {
        require_float(OP, buf.dtype_dyn())?;
        same_dtype(OP, out.dtype_dyn(), buf.dtype_dyn())?;
    }
    check_rank(OP, a_shape)?;
    check_rank(OP, b_shape)?;
    let shape = broadcast_shape(a_shape, b_shape).ok_or_else(|| GpuError::InvalidShape {
        op: OP,
        reason: format!("{a_shape:?} and {b_shape:?} do not broadcast"),
    })?;
    check_len(OP, "a", a, checked_numel(OP, a_shape)?)?;
    check_len(OP, "b", b, checked_numel(OP, b_shape)?)?;
    check_len(OP, "out", out, checked_numel(OP, &shape)?)?;
    Ok(shape)
}

/// `outer · n · inner` and `outer · inner`, or an overflow error.
fn axis_sizes(op: &'static str, outer: usize, n: usize, inner: usize) -> Result<(usize, usize)> {
    // With n = 0 the input is empty but outer·inner need not be: checked on its own.
    let full = checked_numel(op, &[outer, n, inner])?;
    Ok((full, checked_numel(op, &[outer, inner])?))
}

/// Checks the arguments of [`Primitives::reduce_axis`]: f32 or bf16 buffers of one dtype, `x` of
/// `outer·n·inner` and `out` of `outer·inner` elements, and `n > 0` for Mean and Max.
pub fn check_reduce(
    op: ReduceKind,
    x: &dyn BufferInfoDyn,
    outer: usize,
    n: usize,
    inner: usize,
    out: &dyn BufferInfoDyn,
) -> Result<()> {
    const OP: &str = "reduce_axis";
    require_float(OP, x.dtype_dyn())?;
    require_float(OP, out.dtype_dyn())?;
    same_dtype(OP, x.dtype_dyn(), out.dtype_dyn())?;
    let (full, reduced) = axis_sizes(OP, outer, n, inner)?;
    if n == 0 && op != ReduceKind::Sum {
        return Err(GpuError::InvalidShape {
            op: OP,
            reason: format!("{op:?} over an empty axis"),
        });
    }
    check_len(OP, "x", x, full)?;
    check_len(OP, "out", out, reduced)
}

/// Checks the arguments of [`ElementwiseOps::max_axis_bwd`]: buffers of one float dtype, `x` and `dx` of
/// `outer·n·inner`, `y` and `dy` of `outer·inner` elements, `n > 0`.
pub fn check_max_axis_bwd(
    x: &dyn BufferInfoDyn,
    y: &dyn BufferInfoDyn,
    dy: &dyn BufferInfoDyn,
    outer: usize,
    n: usize,
    inner: usize,
    dx: &dyn BufferInfoDyn,
) -> Result<()> {
    const OP: &str = "max_axis_bwd";
    require_float(OP, dx.dtype_dyn())?;
    for buf in [x, y, dy] {
        require_float(OP, buf.dtype_dyn())?;
        same_dtype(OP, dx.dtype_dyn(), buf.dtype_dyn())?;
    }
    let (full, reduced) = axis_sizes(OP, outer, n, inner)?;
    if n == 0 {
        return Err(GpuError::InvalidShape {
            op: OP,
            reason: "Max over an empty axis".into(),
        });
    }
    check_len(OP, "x", x, full)?;
    check_len(OP, "dx", dx, full)?;
    check_len(OP, "y", y, reduced)?;
    check_len(OP, "dy", dy, reduced)
}

/// Checks the arguments of [`Primitives::copy_blocks`]: buffers of one float dtype, every block inside its
/// buffer (no overflow), and destination blocks that do not overlap (`dst_stride >= len` when
/// `outer > 1`), so the result does not depend on the order of the copies.
pub fn check_copy_blocks(
    src: &dyn BufferInfoDyn,
    dst: &dyn BufferInfoDyn,
    copy: crate::nn::primitives::BlockCopy,
) -> Result<()> {
    const OP: &str = "copy_blocks";
    let (outer, len) = (copy.outer, copy.len);
    require_float(OP, dst.dtype_dyn())?;
    require_float(OP, src.dtype_dyn())?;
    same_dtype(OP, dst.dtype_dyn(), src.dtype_dyn())?;
    if outer == 0 || len == 0 {
        return Ok(());
    }
    if outer > 1 && copy.dst_stride < len {
        return Err(GpuError::invalid(
            OP,
            format!(
                "destination blocks of {len} overlap (stride {})",
                copy.dst_stride
            ),
        ));
    }
    for (name, buf, offset, stride) in [
        ("src", src, copy.src_offset, copy.src_stride),
        ("dst", dst, copy.dst_offset, copy.dst_stride),
    ] {
        let end = (outer - 1)
            .checked_mul(stride)
            .and_then(|v| v.checked_add(offset))
            .and_then(|v| v.checked_add(len));
        match end {
            Some(end) if end <= buf.len_dyn() => {}
            _ => {
                return Err(GpuError::shape(
                    OP,
                    format!(
                        "{name} of at least {offset} + {}·{stride} + {len} elements",
                        outer - 1
                    ),
                    buf.len_dyn(),
                ))
            }
        }
    }
    Ok(())
}

/// Checks the arguments of [`Primitives::permute`]: buffers of one float dtype, at most [`MAX_DIMS`] dims,
/// `perm` a permutation of `0..shape.len()`, both lengths equal to the element count; returns
/// the output shape.
pub fn check_permute(
    x: &dyn BufferInfoDyn,
    shape: &[usize],
    perm: &[usize],
    out: &dyn BufferInfoDyn,
) -> Result<Vec<usize>> {
    const OP: &str = "permute";
    require_float(OP, out.dtype_dyn())?;
    require_float(OP, x.dtype_dyn())?;
    same_dtype(OP, out.dtype_dyn(), x.dtype_dyn())?;
    check_rank(OP, shape)?;
    let mut seen = [false; MAX_DIMS];
    let valid = perm.len() == shape.len()
        && perm
            .iter()
            .all(|&p| p < shape.len() && !std::mem::replace(&mut seen[p], true));
    if !valid {
        return Err(GpuError::invalid(
            OP,
            format!("{perm:?} is not a permutation of 0..{}", shape.len()),
        ));
    }
    let n = checked_numel(OP, shape)?;
    check_len(OP, "x", x, n)?;
    check_len(OP, "out", out, n)?;
    Ok(perm.iter().map(|&p| shape[p]).collect())
}

/// Checks the arguments of [`Primitives::dropout`]: f32 or bf16 buffers of one dtype and
/// length, `p` in `[0, 1)`.
pub fn check_dropout(x: &dyn BufferInfoDyn, p: f32, out: &dyn BufferInfoDyn) -> Result<()> {
    check_float_elementwise("dropout", &[x], out)?;
    if !(0.0..1.0).contains(&p) {
        return Err(GpuError::invalid(
            "dropout",
            format!("p must be in [0, 1), got {p}"),
        ));
    }
    Ok(())
}

/// Checks the arguments of [`Primitives::cast`]: f32 or bf16 buffers of one length; returns
/// the (input, output) dtypes.
pub fn check_cast(x: &dyn BufferInfoDyn, out: &dyn BufferInfoDyn) -> Result<(DType, DType)> {
    const OP: &str = "cast";
    require_float(OP, x.dtype_dyn())?;
    require_float(OP, out.dtype_dyn())?;
    check_len(OP, "out", out, x.len_dyn())?;
    Ok((x.dtype_dyn(), out.dtype_dyn()))
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
        // The eight elements of a hash decide independently (both of two kept with probability
        // 0.8², within 8 standard deviations over 100,000 pairs), and so do neighbouring hashes.
        for (a, b) in [(0, 1), (3, 4), (0, 7), (6, 7), (7, 8)] {
            let both = (0..100_000u64)
                .filter(|&j| dropout_keep(42, 8 * j + a, 0.2) && dropout_keep(42, 8 * j + b, 0.2))
                .count();
            assert!(
                (both as f64 / 100_000.0 - 0.64).abs() < 0.012,
                "{a} {b}: {both}"
            );
        }
    }

    /// The lazy draw is the full one: `u_i >= ⌈p·2^24⌉` with `u_i`'s low 16 bits always drawn,
    /// for rates whose threshold's low bits matter (ties happen one element in 256).
    #[test]
    fn dropout_keep_is_a_24_bit_uniform_against_the_threshold() {
        for p in [0.2f32, 0.5, 1e-6, 0.999, 0.5 + 3.0 / 16_777_216.0, 0.0] {
            let t = (p * 16_777_216.0).ceil() as u64;
            for i in 0..200_000u64 {
                let top = (splitmix(7, i / 8) >> (8 * (i % 8))) & 0xFF;
                let low = splitmix(7 ^ DROPOUT_LOW_KEY, i) >> 48;
                assert_eq!(
                    dropout_keep(7, i, p),
                    (top << 16 | low) >= t,
                    "p {p}, i {i}"
                );
            }
        }
    }
}
