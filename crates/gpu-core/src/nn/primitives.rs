//! [`Primitives`]: the small set of ops a backend must write before any model runs on it.
//!
//! Every other op of the families in [`crate::nn`] ([`ElementwiseOps`](super::ElementwiseOps),
//! [`RowOps`](super::RowOps), [`AttentionOps`](super::AttentionOps),
//! [`DecodeOps`](super::DecodeOps), [`QuantOps`](super::QuantOps),
//! [`SampleOps`](super::SampleOps), [`OptimOps`](super::OptimOps)) is a trait method with a
//! default body built from these (`nn/defaults/`), which a backend overrides where it has
//! something faster: a new backend joins op by op. The CPU and CUDA backends override every
//! family method but the seed-offset dropout and the scheduled AdamW on the CPU (which run
//! their defaults there).
//!
//! The set: buffers and host copies ([`Backend`]), matmul ([`MatmulOps`]), and
//! - fill, cast, block copy, permute (data movement);
//! - the activation vocabulary as a unary map and its derivative ([`Activation`]);
//! - broadcast binary ops ([`BinaryKind`], the zip);
//! - reductions over an axis ([`ReduceKind`]) and the argmax of rows;
//! - gather and scatter-add of rows (embedding);
//! - the counter-based dropout mask (its hash cannot be built from the others).

use crate::backend::Backend;
use crate::error::Result;
use crate::nn::elementwise::{Activation, BinaryKind, ReduceKind};
use crate::ops::MatmulOps;

/// The blocks of a [`Primitives::copy_blocks`]: `outer` blocks of `len` elements, block `o`
/// read at `src_offset + o·src_stride` and written at `dst_offset + o·dst_stride`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockCopy {
    /// Where the first block starts in the source.
    pub src_offset: usize,
    /// The distance between the starts of consecutive source blocks.
    pub src_stride: usize,
    /// Where the first block starts in the destination.
    pub dst_offset: usize,
    /// The distance between the starts of consecutive destination blocks.
    pub dst_stride: usize,
    /// The number of blocks.
    pub outer: usize,
    /// The elements of each block.
    pub len: usize,
}

impl BlockCopy {
    /// One contiguous run of `len` elements from `src_offset` to `dst_offset`.
    pub fn run(src_offset: usize, dst_offset: usize, len: usize) -> BlockCopy {
        BlockCopy {
            src_offset,
            src_stride: len,
            dst_offset,
            dst_stride: len,
            outer: 1,
            len,
        }
    }
}

/// The primitive ops (see the module docs). Shapes are row-major dims; "axis layout"
/// `(outer, n, inner)` means the tensor is viewed as `[outer, n, inner]` and the operation
/// runs along the middle axis.
pub trait Primitives: Backend + MatmulOps {
    /// Sets every element of `buf` (any dtype; u32 gets `value as u32`) to `value`; used to
    /// initialise tensors and to poison outputs before a launch in the tests.
    fn fill(&self, buf: &mut Self::Buffer, value: f32) -> Result<()>;

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

    /// Block copy: for `o in 0..outer`, copies `len` elements from
    /// `src[src_offset + o·src_stride ..]` to `dst[dst_offset + o·dst_stride ..]`; the rest of
    /// `dst` is left as it was. Slicing and concatenation along any axis reduce to this.
    fn copy_blocks(
        &self,
        src: &Self::Buffer,
        dst: &mut Self::Buffer,
        copy: BlockCopy,
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

    /// Inverted dropout: `out[i] = keep(seed, i) ? x[i]·s : 0` with `s = 1/(1 − p)` rounded to
    /// f32 once (PyTorch's scale), where `keep` is a
    /// counter-based hash of `(seed, i)` that is identical on every backend, so the same call on
    /// `dy` is the backward. `p` in `[0, 1)`.
    fn dropout(&self, x: &Self::Buffer, p: f32, seed: u64, out: &mut Self::Buffer) -> Result<()>;

    /// `out = x` converted to `out`'s dtype: f32 to bf16 rounds to nearest even (NaN stays NaN,
    /// overflow goes to ±inf), bf16 to f32 is exact, the same dtype copies.
    fn cast(&self, x: &Self::Buffer, out: &mut Self::Buffer) -> Result<()>;

    /// `out[r]` = the index of the largest element of row `r` of `x` `[rows, cols]` (u32; the
    /// first one on ties; NaN counts as larger than any number, as `torch.argmax`). `cols >= 1`.
    fn argmax_rows(&self, x: &Self::Buffer, out: &mut Self::Buffer, cols: usize) -> Result<()>;

    /// Gather of rows: `out[r] = table[ids[r]]` for a `[vocab, dim]` table and u32 `ids`; an
    /// id `>= vocab` is an error on the CPU and a NaN row on CUDA (the embedding forward).
    /// `x.rows` is the table.
    fn gather_rows(&self, x: IdRows<'_, Self::Buffer>, out: &mut Self::Buffer) -> Result<()>;

    /// Scatter-add of rows: `dst` (`[vocab, dim]`) is overwritten with zeros, then
    /// `dst[ids[r]] += src[r]` for every row (the embedding backward).
    /// `x.rows` is `src`.
    fn scatter_add_rows(&self, x: IdRows<'_, Self::Buffer>, dst: &mut Self::Buffer) -> Result<()>;
}

arg_struct! {
    /// The inputs of a gather or scatter-add of `dim`-wide rows ([`Primitives::gather_rows`],
    /// [`Primitives::scatter_add_rows`], and the embeddings built on them): u32 `ids` and the
    /// rows they pick from (a `[vocab, dim]` table) or carry (`[ids.len(), dim]`).
    pub struct IdRows<'a, Buf> {
        /// The row ids, u32.
        pub ids: &'a Buf,
        /// The table gathered from, or the rows scattered.
        pub rows: &'a Buf,
        /// The width of a row.
        pub dim: usize,
    }
}
