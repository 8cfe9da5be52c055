//! [`Primitives`] and [`MatmulOps`] for [`WgpuBackend`], and every other op family of
//! `gpu_core::nn` from its default body (built from these).
//!
//! Every method runs gpu-core's own argument check first (the CPU backend's, so both reject
//! the same inputs with the same typed errors), then its WGSL kernel. f32 runs natively; a bf16
//! call widens its inputs to f32 (exact), runs the f32 kernel and rounds the output to bf16
//! once (the existing two-elements-per-thread cast, so no word is shared between threads), as
//! the CPU's `via_f32`. `copy_blocks` moves bf16's raw bits instead.

use crate::backend::WgpuBackend;
use crate::buffer::WgpuBuffer;
use gpu_core::backend::{Backend, BufferInfo};
use gpu_core::nn::decode::check_argmax;
use gpu_core::nn::elementwise::{
    check_broadcast, check_cast, check_copy_blocks, check_dropout, check_permute, check_reduce,
};
use gpu_core::nn::rows::check_embedding;
use gpu_core::nn::{
    Activation, BinaryKind, BlockCopy, ElementwiseOps, IdRows, Primitives, ReduceKind,
};
use gpu_core::ops::{check_float_elementwise, MatmulOps, MatmulSpec};
use gpu_core::{DType, Result};

type Buf = WgpuBuffer;

impl WgpuBackend {
    /// An f32 copy of `x` (bf16 widened exactly; f32 copied).
    pub(crate) fn widened(&self, x: &Buf) -> Result<Buf> {
        let mut w = self.allocate(DType::F32, x.len())?;
        self.cast_raw(x, &mut w)?;
        Ok(w)
    }

    /// Runs `f` on f32 copies of `inputs` into an f32 output, then rounds that into `out`
    /// (bf16) once.
    fn via_f32(
        &self,
        inputs: &[&Buf],
        out: &mut Buf,
        f: impl FnOnce(&[&Buf], &mut Buf) -> Result<()>,
    ) -> Result<()> {
        let wide = inputs
            .iter()
            .map(|x| self.widened(x))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Buf> = wide.iter().collect();
        let mut o = self.allocate(DType::F32, out.len())?;
        f(&refs, &mut o)?;
        self.cast_raw(&o, out)
    }
}

impl MatmulOps for WgpuBackend {
    /// f32 × f32 → f32, or bf16 × bf16 → bf16 or f32: bf16 operands are widened (exact), the
    /// products accumulate in f32 and a bf16 C is rounded once.
    fn matmul(&self, spec: MatmulSpec, a: &Buf, b: &Buf, c: &mut Buf) -> Result<()> {
        self.check_out("matmul", &[a, b, c])?;
        spec.validate(a, b, c)?;
        if a.dtype() == DType::F32 {
            return self.matmul_f32(spec, a, b, c);
        }
        let (wa, wb) = (self.widened(a)?, self.widened(b)?);
        if c.dtype() == DType::F32 {
            return self.matmul_f32(spec, &wa, &wb, c);
        }
        let mut wc = self.allocate(DType::F32, c.len())?;
        self.matmul_f32(spec, &wa, &wb, &mut wc)?;
        self.cast_raw(&wc, c)
    }
}

impl Primitives for WgpuBackend {
    fn fill(&self, buf: &mut Buf, value: f32) -> Result<()> {
        self.fill_raw(buf, value)
    }

    fn cast(&self, x: &Buf, out: &mut Buf) -> Result<()> {
        self.check_out("cast", &[x, out])?;
        check_cast(x, out)?;
        self.cast_raw(x, out)
    }

    fn copy_blocks(&self, src: &Buf, dst: &mut Buf, copy: BlockCopy) -> Result<()> {
        self.check_out("copy_blocks", &[src, dst])?;
        check_copy_blocks(src, dst, copy)?;
        self.copy_blocks_raw(src, dst, copy)
    }

    fn permute(&self, x: &Buf, shape: &[usize], perm: &[usize], out: &mut Buf) -> Result<()> {
        self.check_out("permute", &[x, out])?;
        check_permute(x, shape, perm, out)?;
        if out.dtype() == DType::BF16 {
            return self.via_f32(&[x], out, |i, o| self.permute_f32(i[0], shape, perm, o));
        }
        self.permute_f32(x, shape, perm, out)
    }

    fn broadcast_binary(
        &self,
        op: BinaryKind,
        a: &Buf,
        a_shape: &[usize],
        b: &Buf,
        b_shape: &[usize],
        out: &mut Buf,
    ) -> Result<()> {
        self.check_out("broadcast_binary", &[a, b, out])?;
        let shape = check_broadcast(a, a_shape, b, b_shape, out)?;
        if out.dtype() == DType::BF16 {
            return self.via_f32(&[a, b], out, |i, o| {
                self.broadcast_f32(op, (i[0], a_shape), (i[1], b_shape), &shape, o)
            });
        }
        self.broadcast_f32(op, (a, a_shape), (b, b_shape), &shape, out)
    }

    fn activation_fwd(&self, op: Activation, x: &Buf, out: &mut Buf) -> Result<()> {
        self.check_out("activation_fwd", &[x, out])?;
        check_float_elementwise("activation_fwd", &[x], out)?;
        if out.dtype() == DType::BF16 {
            return self.via_f32(&[x], out, |i, o| self.act_fwd_f32(op, i[0], o));
        }
        self.act_fwd_f32(op, x, out)
    }

    fn activation_bwd(
        &self,
        op: Activation,
        x: &Buf,
        y: &Buf,
        dy: &Buf,
        dx: &mut Buf,
    ) -> Result<()> {
        self.check_out("activation_bwd", &[x, y, dy, dx])?;
        check_float_elementwise("activation_bwd", &[x, y, dy], dx)?;
        if dx.dtype() == DType::BF16 {
            return self.via_f32(&[x, y, dy], dx, |i, o| {
                self.act_bwd_f32(op, [i[0], i[1], i[2]], o)
            });
        }
        self.act_bwd_f32(op, [x, y, dy], dx)
    }

    fn reduce_axis(
        &self,
        op: ReduceKind,
        x: &Buf,
        outer: usize,
        n: usize,
        inner: usize,
        out: &mut Buf,
    ) -> Result<()> {
        self.check_out("reduce_axis", &[x, out])?;
        check_reduce(op, x, outer, n, inner, out)?;
        let dims = [outer, n, inner];
        if out.dtype() == DType::BF16 {
            return self.via_f32(&[x], out, |i, o| self.reduce_axis_f32(op, i[0], dims, o));
        }
        self.reduce_axis_f32(op, x, dims, out)
    }

    fn dropout(&self, x: &Buf, p: f32, seed: u64, out: &mut Buf) -> Result<()> {
        self.check_out("dropout", &[x, out])?;
        check_dropout(x, p, out)?;
        if out.dtype() == DType::BF16 {
            return self.via_f32(&[x], out, |i, o| self.dropout_f32(i[0], p, seed, o));
        }
        self.dropout_f32(x, p, seed, out)
    }

    fn argmax_rows(&self, x: &Buf, out: &mut Buf, cols: usize) -> Result<()> {
        self.check_out("argmax_rows", &[x, out])?;
        check_argmax(x, out, cols)?;
        if x.dtype() == DType::BF16 {
            return self.argmax_f32(&self.widened(x)?, out, cols);
        }
        self.argmax_f32(x, out, cols)
    }

    /// An id `>= vocab` is [`gpu_core::GpuError::IndexOutOfRange`] (read back: this waits).
    fn gather_rows(&self, x: IdRows<'_, Buf>, out: &mut Buf) -> Result<()> {
        let (ids, table, dim) = (x.ids, x.rows, x.dim);
        self.check_out("gather_rows", &[ids, table, out])?;
        let (_, vocab) = check_embedding("gather_rows", ids, table, out, dim)?;
        self.gather_f32((ids, table), (dim, vocab), out)
    }

    /// `dst` is zeroed, then the rows are added with f32 compare-and-swap adds (the order of
    /// the adds to one element is unspecified). Ids are checked as in `gather_rows`.
    fn scatter_add_rows(&self, x: IdRows<'_, Buf>, dst: &mut Buf) -> Result<()> {
        let (ids, src, dim) = (x.ids, x.rows, x.dim);
        self.check_out("scatter_add_rows", &[ids, src, dst])?;
        let (_, vocab) = check_embedding("scatter_add_rows", ids, dst, src, dim)?;
        self.fill_raw(dst, 0.0)?;
        self.scatter_add_f32((ids, src), (dim, vocab), dst)
    }
}

// Every other family from gpu-core's defaults (`nn/defaults`), built on the primitives above
// (OptimOps: optim.rs, AdamW fused; RowOps: rows.rs, LayerNorm's forward fused; QuantOps:
// quant.rs, f16 weights).
impl ElementwiseOps for WgpuBackend {}
impl gpu_core::nn::WorldOps for WgpuBackend {}
