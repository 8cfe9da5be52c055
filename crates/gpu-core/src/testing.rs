//! [`PrimitivesOnly`]: a backend that implements [`Primitives`] and [`MatmulOps`] (by calling
//! the CPU backend) and nothing else, so every other op runs its default body from
//! `nn/defaults`. It proves a backend can join op by op: the tests run the op families, and
//! `tensor-ops` runs models, on it and compare with the CPU backend.

use crate::backend::{Backend, DeviceType};
use crate::cpu::{CpuBackend, CpuStorage};
use crate::device::Device;
use crate::dtype::{DType, Element};
use crate::error::Result;
use crate::nn::elementwise::{Activation, BinaryKind, ReduceKind};
use crate::nn::{
    AttentionOps, BlockCopy, DecodeOps, ElementwiseOps, OptimOps, Primitives, QuantOps, RowOps,
    SampleOps, WorldOps,
};
use crate::ops::{MatmulOps, MatmulSpec};

/// The primitives of the CPU backend and the default bodies of everything else (its buffers
/// are the CPU's).
#[derive(Debug, Clone, Copy, Default)]
pub struct PrimitivesOnly;

const CPU: CpuBackend = CpuBackend;

impl Backend for PrimitivesOnly {
    type Buffer = CpuStorage;
    fn device(&self) -> Device {
        Device::Cpu
    }
    fn device_name(&self) -> String {
        "primitives-only (CPU primitives, default ops)".into()
    }
    fn device_type(&self) -> DeviceType {
        DeviceType::Cpu
    }
    fn memory_available(&self) -> Result<usize> {
        CPU.memory_available()
    }
    fn allocate(&self, dtype: DType, len: usize) -> Result<CpuStorage> {
        CPU.allocate(dtype, len)
    }
    fn copy_to_device<T: Element>(&self, src: &[T], dst: &mut CpuStorage) -> Result<()> {
        CPU.copy_to_device(src, dst)
    }
    fn copy_from_device<T: Element>(&self, src: &CpuStorage, dst: &mut [T]) -> Result<()> {
        CPU.copy_from_device(src, dst)
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}

impl MatmulOps for PrimitivesOnly {
    fn matmul(
        &self,
        s: MatmulSpec,
        a: &CpuStorage,
        b: &CpuStorage,
        c: &mut CpuStorage,
    ) -> Result<()> {
        CPU.matmul(s, a, b, c)
    }
}

type Buf = CpuStorage;

impl Primitives for PrimitivesOnly {
    fn fill(&self, buf: &mut Buf, value: f32) -> Result<()> {
        CPU.fill(buf, value)
    }
    fn cast(&self, x: &Buf, out: &mut Buf) -> Result<()> {
        CPU.cast(x, out)
    }
    fn copy_blocks(&self, src: &Buf, dst: &mut Buf, copy: BlockCopy) -> Result<()> {
        CPU.copy_blocks(src, dst, copy)
    }
    fn permute(&self, x: &Buf, shape: &[usize], perm: &[usize], out: &mut Buf) -> Result<()> {
        CPU.permute(x, shape, perm, out)
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
        CPU.broadcast_binary(op, a, a_shape, b, b_shape, out)
    }
    fn activation_fwd(&self, op: Activation, x: &Buf, out: &mut Buf) -> Result<()> {
        CPU.activation_fwd(op, x, out)
    }
    fn activation_bwd(
        &self,
        op: Activation,
        x: &Buf,
        y: &Buf,
        dy: &Buf,
        dx: &mut Buf,
    ) -> Result<()> {
        CPU.activation_bwd(op, x, y, dy, dx)
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
        CPU.reduce_axis(op, x, outer, n, inner, out)
    }
    fn dropout(&self, x: &Buf, p: f32, seed: u64, out: &mut Buf) -> Result<()> {
        CPU.dropout(x, p, seed, out)
    }
    fn argmax_rows(&self, x: &Buf, out: &mut Buf, cols: usize) -> Result<()> {
        CPU.argmax_rows(x, out, cols)
    }
    fn gather_rows(&self, ids: &Buf, table: &Buf, out: &mut Buf, dim: usize) -> Result<()> {
        CPU.gather_rows(ids, table, out, dim)
    }
    fn scatter_add_rows(&self, ids: &Buf, src: &Buf, dst: &mut Buf, dim: usize) -> Result<()> {
        CPU.scatter_add_rows(ids, src, dst, dim)
    }
}

// Every family from its defaults.
impl ElementwiseOps for PrimitivesOnly {}
impl RowOps for PrimitivesOnly {}
impl AttentionOps for PrimitivesOnly {}
impl DecodeOps for PrimitivesOnly {}
impl QuantOps for PrimitivesOnly {}
impl SampleOps for PrimitivesOnly {}
impl OptimOps for PrimitivesOnly {}
impl WorldOps for PrimitivesOnly {}
