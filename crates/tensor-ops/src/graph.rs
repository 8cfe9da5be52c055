//! CUDA graphs of tensor code: [`capture`] records what a closure of tensor ops queues on a CUDA
//! device (forward, backward, optimiser) into a [`Graph`] without running it, and
//! [`Graph::replay`] runs the recording with one launch. What a replay computes is decided by
//! the contents of the buffers it recorded, so the values that change from one replay to the
//! next live on the device and are written before each replay:
//! - inputs: tensors made before the capture and overwritten with [`Tensor::write_from_host`];
//! - dropout masks: the k-th dropout op run under [`with_dropout_offsets`] adds the k-th u64 of
//!   that tensor to its seed on the device (`ElementwiseOps::dropout_offset`, CUDA's override);
//! - AdamW's learning rate and bias corrections: [`crate::optim::AdamW::step_scheduled`].
//!
//! Memory allocated inside the capture stays reserved for the graph (`gpu_cuda::pool`), so the
//! recorded addresses remain valid however the tensors that held them are dropped.
//! `models::gpt::GraphedStep` puts these together for a GPT training step.

use crate::backend::cuda_backend;
use crate::storage::Storage;
use crate::tensor::Tensor;
use gpu_core::{Backend, Device, Element, GpuError, Result};
use gpu_cuda::graph::CapturedGraph;
use gpu_cuda::PoolStats;
use std::cell::RefCell;

thread_local! {
    /// The device seed offsets of the dropout ops run on this thread and how many of them the
    /// scope's dropout ops have taken, innermost scope last.
    static OFFSETS: RefCell<Vec<(Tensor, usize)>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with the k-th training-mode dropout op it makes on this thread (counting from 0,
/// in the order they run, forward) drawing its mask from `seed + offsets[k]` instead of `seed`,
/// where `offsets` is a U32 CUDA tensor of `2·K` elements (K u64s, low word first) read on the
/// device when the op runs, forward and backward. A CUDA graph recorded this way draws new
/// masks on each replay from the offsets written before it. A (K+1)-th dropout op, or one on
/// another device, is a typed error.
pub fn with_dropout_offsets<R>(offsets: &Tensor, f: impl FnOnce() -> R) -> Result<R> {
    if offsets.dtype() != gpu_core::DType::U32 || !offsets.numel().is_multiple_of(2) {
        return Err(GpuError::shape(
            "with_dropout_offsets",
            "a U32 tensor of 2·K elements (K u64s, low word first)",
            format!("{} {:?}", offsets.dtype(), offsets.shape()),
        ));
    }
    if !matches!(offsets.device(), Device::Cuda(_)) {
        return Err(GpuError::invalid(
            "with_dropout_offsets",
            format!(
                "the offsets are on {}; device offsets are for CUDA",
                offsets.device()
            ),
        ));
    }
    OFFSETS.with(|o| o.borrow_mut().push((offsets.clone(), 0)));
    struct Pop;
    impl Drop for Pop {
        fn drop(&mut self) {
            OFFSETS.with(|o| o.borrow_mut().pop());
        }
    }
    let _pop = Pop;
    Ok(f())
}

/// For a training-mode dropout op on `dev`: the innermost [`with_dropout_offsets`] tensor and
/// the index of this op's offset (taken), or `None` outside any scope. An op on another device
/// than the offsets, or one past their end, is an error and takes nothing.
pub(crate) fn next_dropout_offset(dev: Device) -> Result<Option<(Tensor, usize)>> {
    OFFSETS.with(|o| {
        let mut o = o.borrow_mut();
        let Some((t, next)) = o.last_mut() else {
            return Ok(None);
        };
        if t.device() != dev {
            return Err(GpuError::invalid(
                "dropout",
                format!("the input is on {dev}, the seed offsets on {}", t.device()),
            ));
        }
        if 2 * (*next + 1) > t.numel() {
            return Err(GpuError::invalid(
                "dropout",
                format!(
                    "the {}-th dropout op of a with_dropout_offsets scope that holds {} offsets",
                    *next + 1,
                    t.numel() / 2
                ),
            ));
        }
        *next += 1;
        Ok(Some((t.clone(), *next - 1)))
    })
}

/// A recorded sequence of device work (see the module doc).
pub struct Graph {
    graph: CapturedGraph,
    ordinal: usize,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Graph(cuda:{})", self.ordinal)
    }
}

/// Records the device work of `f` on CUDA device `device` into a graph without running it.
/// `f` may allocate (the memory is the graph's) but must not read results back to the host
/// or synchronise: the capture then fails with a typed error and nothing ran. Tensors `f`
/// reads or writes that were made before the capture must outlive the graph.
pub fn capture<R>(device: Device, f: impl FnOnce() -> Result<R>) -> Result<(Graph, R)> {
    let Device::Cuda(ordinal) = device else {
        return Err(GpuError::invalid(
            "capture",
            format!("CUDA graphs need a CUDA device, not {device}"),
        ));
    };
    let gpu = cuda_backend(ordinal)?;
    let mut out = None;
    let graph = gpu.capture(|_| {
        out = Some(f()?);
        Ok(())
    })?;
    let out = out.ok_or_else(|| GpuError::invalid("capture", "the closure did not run"))?;
    Ok((Graph { graph, ordinal }, out))
}

impl Graph {
    /// Queues one replay on the device's stream (asynchronous, like any op).
    pub fn replay(&self) -> Result<()> {
        cuda_backend(self.ordinal)?.launch_graph(&self.graph)
    }

    /// The device memory the graph keeps reserved for its replays.
    pub fn memory_stats(&self) -> PoolStats {
        self.graph.memory_stats()
    }
}

impl Tensor {
    /// Overwrites this tensor's elements with `data` (as many elements, of this tensor's
    /// dtype), in place on its device: every tensor sharing the storage sees the new values.
    /// The way to feed a [`Graph`] new inputs. Not for an op's result in an autograd graph.
    pub fn write_from_host<T: Element>(&self, data: &[T]) -> Result<()> {
        const OP: &str = "Tensor::write_from_host";
        if T::DTYPE != self.dtype() || data.len() != self.numel() {
            return Err(GpuError::shape(
                OP,
                format!("{} elements of {}", self.numel(), self.dtype()),
                format!("{} elements of {}", data.len(), T::DTYPE),
            ));
        }
        if self.op_name().is_some() {
            return Err(GpuError::invalid(
                OP,
                "the tensor is an op's result in an autograd graph; detach it first",
            ));
        }
        let mut st = self.write();
        match (&mut *st, self.device()) {
            (Storage::Cpu(b), Device::Cpu) => gpu_core::CpuBackend.copy_to_device(data, b),
            (Storage::Cuda(b), Device::Cuda(i)) => cuda_backend(i)?.copy_to_device(data, b),
            (Storage::Wgpu(b), Device::Wgpu(i)) => {
                crate::backend::wgpu_backend_ref(i)?.copy_to_device(data, b)
            }
            _ => Err(GpuError::invalid(OP, "storage and device disagree")),
        }
    }
}
