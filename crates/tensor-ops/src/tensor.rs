//! [`Tensor`]: shape, dtype, device, shared storage, and its place in the autograd graph.

use crate::autograd::{grad_enabled, Node};
use crate::backend::{count_d2h, count_h2d, cuda_backend};
pub(crate) use crate::bound::U32Bound;
use crate::storage::Storage;
use gpu_core::{Backend, CpuStorage, DType, Device, Element, GpuError, Result, Shape};
use rand::SeedableRng;
use rand_distr::Distribution;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) struct Inner {
    pub(crate) id: u64,
    pub(crate) shape: Vec<usize>,
    pub(crate) device: Device,
    pub(crate) dtype: DType,
    pub(crate) storage: Arc<RwLock<Storage>>,
    pub(crate) requires_grad: bool,
    pub(crate) node: Option<Node>,
    /// What the host knows about the values of a u32 tensor (see [`U32Bound`]).
    pub(crate) u32_bound: U32Bound,
}

impl Drop for Inner {
    /// The last view of a CPU f32 buffer hands it to the pool of recycled op outputs.
    fn drop(&mut self) {
        if let Some(lock) = Arc::get_mut(&mut self.storage) {
            if let Ok(Storage::Cpu(CpuStorage::F32(v))) = lock.get_mut() {
                crate::pool::give(std::mem::take(v));
            }
        }
    }
}

/// A contiguous, row-major tensor on one device. Cloning is cheap (shared storage and graph).
#[derive(Clone)]
pub struct Tensor(pub(crate) Arc<Inner>);

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor({:?}, {}, {}",
            self.shape(),
            self.dtype(),
            self.device()
        )?;
        if let Some(n) = &self.0.node {
            write!(f, ", op={}", n.name)?;
        }
        write!(f, ")")
    }
}

impl Tensor {
    pub(crate) fn from_storage(storage: Storage, shape: Vec<usize>, device: Device) -> Tensor {
        Tensor::with_node(storage, shape, device, None)
    }

    /// A fresh tensor over `storage`, requiring a gradient exactly when it has a `node`.
    fn with_node(
        storage: Storage,
        shape: Vec<usize>,
        device: Device,
        node: Option<Node>,
    ) -> Tensor {
        let dtype = storage.dtype();
        Tensor(Arc::new(Inner {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            shape,
            device,
            dtype,
            storage: Arc::new(RwLock::new(storage)),
            requires_grad: node.is_some(),
            node,
            u32_bound: U32Bound::Unknown,
        }))
    }

    /// Builds an op's result; records the backward when grad mode is on and an input needs it.
    pub(crate) fn from_op(
        storage: Storage,
        shape: Vec<usize>,
        device: Device,
        name: &'static str,
        inputs: &[&Tensor],
        backward: impl Fn(&Tensor, &Tensor) -> Result<Vec<Option<Tensor>>> + Send + Sync + 'static,
    ) -> Tensor {
        let needs = grad_enabled() && inputs.iter().any(|t| t.requires_grad());
        let node = needs.then(|| Node {
            name,
            inputs: inputs.iter().map(|t| (*t).clone()).collect(),
            backward: Box::new(backward),
        });
        Tensor::with_node(storage, shape, device, node)
    }

    /// A tensor viewing the same storage with another shape (same element count).
    pub(crate) fn view_as(&self, shape: Vec<usize>, node: Option<Node>) -> Tensor {
        Tensor(Arc::new(Inner {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            shape,
            device: self.0.device,
            dtype: self.0.dtype,
            storage: self.0.storage.clone(),
            requires_grad: node.is_some(),
            node,
            u32_bound: self.0.u32_bound,
        }))
    }

    /// A tensor from host data, placed on `device` (one host-to-device copy for CUDA).
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize], device: Device) -> Result<Tensor> {
        let numel = Shape::from(shape).checked_numel()?;
        if numel != data.len() {
            return Err(GpuError::shape(
                "from_vec",
                format!("{numel} elements for {shape:?}"),
                data.len(),
            ));
        }
        let cpu = CpuStorage::from_vec(data)?;
        // The values are on the host now: record the bound of u32 data (ids, targets) for free.
        let bound = match &cpu {
            CpuStorage::U32(v) => U32Bound::of(v),
            _ => U32Bound::Unknown,
        };
        Tensor::from_storage(Storage::Cpu(cpu), shape.to_vec(), Device::Cpu)
            .with_u32_bound(bound)
            .to(device)
    }

    /// A tensor filled with `value`.
    pub fn full(value: f32, shape: &[usize], device: Device) -> Result<Tensor> {
        Tensor::full_as(value, shape, DType::F32, device)
    }

    /// A tensor of `dtype` filled with `value` (rounded to the dtype, as [`Tensor::to_dtype`]).
    pub fn full_as(value: f32, shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        let numel = Shape::from(shape).checked_numel()?;
        let storage = crate::backend::on_device!(device, |b| {
            let mut buf = b.allocate(dtype, numel)?;
            gpu_core::nn::Primitives::fill(b, &mut buf, value)?;
            crate::ops::wrap(b, buf)
        });
        Ok(Tensor::from_storage(storage, shape.to_vec(), device))
    }

    /// Zeros.
    pub fn zeros(shape: &[usize], device: Device) -> Result<Tensor> {
        Tensor::full(0.0, shape, device)
    }

    /// Ones.
    pub fn ones(shape: &[usize], device: Device) -> Result<Tensor> {
        Tensor::full(1.0, shape, device)
    }

    /// Normal(0, std²) samples from a seeded generator, drawn on the host (identical on every
    /// device), then placed on `device`. `std` must be finite and `>= 0` (a negative one was
    /// accepted and silently flipped the samples' signs).
    pub fn randn(shape: &[usize], std: f32, seed: u64, device: Device) -> Result<Tensor> {
        gpu_core::ops::require_nonneg("randn", "the standard deviation", std)?;
        let numel = Shape::from(shape).checked_numel()?;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let normal = rand_distr::Normal::new(0.0f32, std)
            .map_err(|e| GpuError::invalid("randn", format!("std {std}: {e}")))?;
        let mut data = gpu_core::cpu::try_vec_with_capacity(numel)?;
        data.extend((0..numel).map(|_| normal.sample(&mut rng)));
        Tensor::from_vec(data, shape, device)
    }

    /// Marks a leaf tensor as a parameter: gradients flow to it.
    ///
    /// Errors on the result of an op (a non-leaf, part of a graph): marking it would make it a
    /// new leaf and silently cut the graph behind it (use `detach()` first to mean that), and on
    /// a u32 tensor (no gradient flows to indices).
    pub fn requires_grad_(self) -> Result<Tensor> {
        if let Some(node) = &self.0.node {
            return Err(GpuError::invalid(
                "requires_grad_",
                format!(
                    "the tensor is the result of '{}', not a leaf: marking it would cut it from \
                     the graph (detach() it first to make a new leaf)",
                    node.name
                ),
            ));
        }
        if self.dtype() == DType::U32 {
            return Err(GpuError::invalid(
                "requires_grad_",
                "a u32 tensor (indices) cannot require gradients",
            ));
        }
        Ok(Tensor(Arc::new(Inner {
            id: self.0.id,
            shape: self.0.shape.clone(),
            device: self.0.device,
            dtype: self.0.dtype,
            storage: self.0.storage.clone(),
            requires_grad: true,
            node: None,
            u32_bound: self.0.u32_bound,
        })))
    }

    /// The same data, cut from the graph.
    pub fn detach(&self) -> Tensor {
        Tensor::from_storage_shared(
            self.0.storage.clone(),
            self.0.shape.clone(),
            self.0.device,
            self.0.dtype,
        )
        .with_u32_bound(self.0.u32_bound)
    }

    fn from_storage_shared(
        storage: Arc<RwLock<Storage>>,
        shape: Vec<usize>,
        device: Device,
        dtype: DType,
    ) -> Tensor {
        Tensor(Arc::new(Inner {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            shape,
            device,
            dtype,
            storage,
            requires_grad: false,
            node: None,
            u32_bound: U32Bound::Unknown,
        }))
    }

    /// Unique id (gradients are keyed by it).
    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// Whether `self` and `other` are views of the same storage (one buffer, so a write
    /// through either shows in both; a [`Tensor::reshape`] of a tensor shares its storage, a
    /// copy does not). Compares identity, not values.
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0.storage, &other.0.storage)
    }

    /// Dimensions.
    pub fn shape(&self) -> &[usize] {
        &self.0.shape
    }

    /// Row-major strides in elements (tensors are always contiguous).
    pub fn strides(&self) -> Vec<usize> {
        Shape::from(self.shape()).contiguous_strides()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.0.shape.iter().product()
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.shape.len()
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.0.dtype
    }

    /// Where the elements live.
    pub fn device(&self) -> Device {
        self.0.device
    }

    /// Whether gradients flow to or through this tensor.
    pub fn requires_grad(&self) -> bool {
        self.0.requires_grad
    }

    /// Name of the op that produced this tensor, if it is part of a graph.
    pub fn op_name(&self) -> Option<&'static str> {
        self.0.node.as_ref().map(|n| n.name)
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Storage> {
        self.0.storage.read().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, Storage> {
        self.0.storage.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Copies to `device` (explicit, and counted by [`crate::transfer_stats`]); the copy is part
    /// of the graph, so gradients flow back to the source device. Between two devices the copy
    /// goes through the host (device to host, then host to device; a CPU source is uploaded
    /// without a host copy).
    pub fn to(&self, device: Device) -> Result<Tensor> {
        if device == self.device() {
            return Ok(self.clone());
        }
        // A wgpu device is checked by opening it (`WgpuUnavailable` when it is absent): the
        // HAL's presence check needs a registered probe.
        if !device.is_wgpu() {
            device.check_present()?;
        }
        let storage = {
            let src = self.read();
            match (&*src, device) {
                (Storage::Cpu(c), d) => upload_storage(d, c)?,
                (other, Device::Cpu) => Storage::Cpu(download_storage(self.device(), other)?),
                (other, d) => upload_storage(d, &download_storage(self.device(), other)?)?,
            }
        };
        let src = self.device();
        Ok(Tensor::from_op(
            storage,
            self.shape().to_vec(),
            device,
            "to",
            &[self],
            move |_, g| Ok(vec![Some(g.to(src)?)]),
        )
        .with_u32_bound(self.0.u32_bound))
    }

    /// The elements as f32 on the host (one device-to-host copy for CUDA); bf16 and f16
    /// elements are widened (exactly).
    pub fn to_vec(&self) -> Result<Vec<f32>> {
        match self.to(Device::Cpu)?.read().clone_cpu()? {
            CpuStorage::F32(v) => Ok(v),
            CpuStorage::BF16(v) => Ok(v.iter().map(|e| e.to_f32()).collect()),
            CpuStorage::F16(v) => Ok(v.iter().map(|e| e.to_f32()).collect()),
            other => Err(GpuError::DTypeMismatch {
                op: "to_vec",
                expected: DType::F32,
                got: gpu_core::BufferInfo::dtype(&other),
            }),
        }
    }

    /// The elements as u32 on the host.
    pub fn to_vec_u32(&self) -> Result<Vec<u32>> {
        match self.to(Device::Cpu)?.read().clone_cpu()? {
            CpuStorage::U32(v) => Ok(v),
            other => Err(GpuError::DTypeMismatch {
                op: "to_vec_u32",
                expected: DType::U32,
                got: gpu_core::BufferInfo::dtype(&other),
            }),
        }
    }

    /// The value of a one-element tensor.
    pub fn item(&self) -> Result<f32> {
        if self.numel() != 1 {
            return Err(GpuError::shape("item", "1 element", self.numel()));
        }
        Ok(self.to_vec()?[0])
    }
}

impl Storage {
    fn clone_cpu(&self) -> Result<CpuStorage> {
        match self {
            Storage::Cpu(c) => c.try_clone(),
            other => Err(GpuError::invalid(
                "storage",
                format!("expected host memory, found {}", other.kind()),
            )),
        }
    }
}

/// The elements of device storage `s` (on `device`) in host memory: one device-to-host copy,
/// counted.
fn download_storage(device: Device, s: &Storage) -> Result<CpuStorage> {
    count_d2h(s.len() * s.dtype().size_in_bytes());
    match (s, device) {
        (Storage::Cuda(b), Device::Cuda(i)) => download(&cuda_backend(i)?, b),
        (Storage::Wgpu(b), Device::Wgpu(i)) => download(crate::backend::wgpu_backend_ref(i)?, b),
        (Storage::Cpu(c), Device::Cpu) => c.try_clone(),
        (other, d) => Err(GpuError::invalid(
            "to",
            format!("{} on a {d} tensor", other.kind()),
        )),
    }
}

/// Host elements `c` placed on `device`: one host-to-device copy, counted (a copy in host
/// memory for the CPU, not counted).
fn upload_storage(device: Device, c: &CpuStorage) -> Result<Storage> {
    let bytes = gpu_core::BufferInfo::size_in_bytes(c);
    Ok(match device {
        Device::Cpu => Storage::Cpu(c.try_clone()?),
        Device::Cuda(i) => {
            count_h2d(bytes);
            Storage::Cuda(upload(&cuda_backend(i)?, c)?)
        }
        Device::Wgpu(i) => {
            count_h2d(bytes);
            Storage::Wgpu(upload(crate::backend::wgpu_backend_ref(i)?, c)?)
        }
    })
}

fn download<B: Backend>(gpu: &B, b: &B::Buffer) -> Result<CpuStorage> {
    Ok(match gpu_core::BufferInfo::dtype(b) {
        DType::F32 => CpuStorage::F32(gpu.download(b)?),
        DType::F16 => CpuStorage::F16(gpu.download(b)?),
        DType::BF16 => CpuStorage::BF16(gpu.download(b)?),
        DType::U32 => CpuStorage::U32(gpu.download(b)?),
    })
}

fn upload<B: Backend>(gpu: &B, c: &CpuStorage) -> Result<B::Buffer> {
    match c {
        CpuStorage::F32(v) => gpu.upload(v),
        CpuStorage::F16(v) => gpu.upload(v),
        CpuStorage::BF16(v) => gpu.upload(v),
        CpuStorage::U32(v) => gpu.upload(v),
    }
}

/// The common device of `tensors`, or a typed error naming the two that differ.
pub(crate) fn same_device(op: &'static str, tensors: &[&Tensor]) -> Result<Device> {
    let d = tensors[0].device();
    for t in &tensors[1..] {
        if t.device() != d {
            return Err(GpuError::DeviceMismatch {
                op,
                a: d,
                b: t.device(),
            });
        }
    }
    Ok(d)
}

/// Errors unless `t` holds f32.
pub(crate) fn require_f32(op: &'static str, t: &Tensor) -> Result<()> {
    if t.dtype() != DType::F32 {
        return Err(GpuError::DTypeMismatch {
            op,
            expected: DType::F32,
            got: t.dtype(),
        });
    }
    Ok(())
}

/// Errors unless every tensor holds one float dtype (f32, or bf16 for mixed precision); returns
/// it. The ops that take bf16 compute in f32 and round their output once.
pub(crate) fn same_float(op: &'static str, tensors: &[&Tensor]) -> Result<DType> {
    let dtype = tensors.first().map_or(DType::F32, |t| t.dtype());
    gpu_core::ops::require_float(op, dtype)?;
    for t in tensors {
        gpu_core::ops::same_dtype(op, dtype, t.dtype())?;
    }
    Ok(dtype)
}
