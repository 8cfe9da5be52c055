//! Device dispatch: the backend behind each [`Device`], and the transfer counter.

use crate::storage::Storage;
use gpu_core::nn::NnOps;
use gpu_core::testing::PrimitivesOnly;
use gpu_core::{CpuBackend, GpuError, Result};
use gpu_cuda::CudaBackend;
use gpu_wgpu::WgpuBackend;
use std::cell::Cell;
use std::sync::{Mutex, OnceLock};

/// A backend that tensors can run on: every op family, and how its buffers
/// sit inside a [`Storage`].
pub(crate) trait DeviceBackend: NnOps {
    /// An f32 buffer of `len` elements for an op that overwrites all of it: on the CPU a
    /// recycled one when there is one (`pool`), else a new one.
    fn alloc_output(&self, len: usize) -> Result<Self::Buffer>;
    /// [`DeviceBackend::alloc_output`] of `dtype` (only f32 buffers are recycled on the CPU).
    fn alloc_output_as(&self, dtype: gpu_core::DType, len: usize) -> Result<Self::Buffer> {
        match dtype {
            gpu_core::DType::F32 => self.alloc_output(len),
            other => gpu_core::Backend::allocate(self, other, len),
        }
    }
    fn get(s: &Storage) -> Result<&Self::Buffer>;
    fn get_mut(s: &mut Storage) -> Result<&mut Self::Buffer>;
    fn wrap(buf: Self::Buffer) -> Storage;
}

/// `get`, `get_mut` and `wrap` of a backend whose buffers sit in `Storage::$variant` (`$what`
/// names them in a mismatch error).
macro_rules! storage_access {
    ($variant:ident, $what:literal) => {
        fn get(s: &Storage) -> Result<&Self::Buffer> {
            match s {
                Storage::$variant(b) => Ok(b),
                other => Err(mismatch($what, other)),
            }
        }
        fn get_mut(s: &mut Storage) -> Result<&mut Self::Buffer> {
            match s {
                Storage::$variant(b) => Ok(b),
                other => Err(mismatch($what, other)),
            }
        }
        fn wrap(buf: Self::Buffer) -> Storage {
            Storage::$variant(buf)
        }
    };
}

impl DeviceBackend for CpuBackend {
    fn alloc_output(&self, len: usize) -> Result<Self::Buffer> {
        match crate::pool::take(len) {
            Some(v) => Ok(gpu_core::CpuStorage::F32(v)),
            None => gpu_core::Backend::allocate(self, gpu_core::DType::F32, len),
        }
    }
    storage_access!(Cpu, "a cpu buffer");
}

impl DeviceBackend for CudaBackend {
    fn alloc_output(&self, len: usize) -> Result<Self::Buffer> {
        gpu_core::Backend::allocate(self, gpu_core::DType::F32, len)
    }
    storage_access!(Cuda, "a CUDA buffer");
}

impl DeviceBackend for WgpuBackend {
    fn alloc_output(&self, len: usize) -> Result<Self::Buffer> {
        gpu_core::Backend::allocate(self, gpu_core::DType::F32, len)
    }
    storage_access!(Wgpu, "a wgpu buffer");
}

impl DeviceBackend for PrimitivesOnly {
    fn alloc_output(&self, len: usize) -> Result<Self::Buffer> {
        gpu_core::CpuBackend.alloc_output(len)
    }
    storage_access!(Cpu, "a cpu buffer");
}

fn mismatch(want: &str, found: &Storage) -> GpuError {
    GpuError::invalid(
        "storage",
        format!("expected {want}, found {}", found.kind()),
    )
}

/// Device ordinals whose backends are cached without a lock ([`cuda_backend_ref`]).
const CACHED_ORDINALS: usize = 64;

/// The shared backend of CUDA device `ordinal`, opened on first use (a clone of
/// [`cuda_backend_ref`]'s: cheap, it shares everything).
pub fn cuda_backend(ordinal: usize) -> Result<CudaBackend> {
    cuda_backend_ref(ordinal).cloned()
}

/// The shared backend of CUDA device `ordinal`: after the first call per ordinal a lock-free
/// read of a `OnceLock` (the first call opens it under a lock, so it is opened once).
/// An ordinal from 64 on gets the error opening it gives (no driver, no such device), or, on a
/// machine with that many GPUs, an error saying only the first 64 are served.
pub(crate) fn cuda_backend_ref(ordinal: usize) -> Result<&'static CudaBackend> {
    static CACHE: Cached<CudaBackend> = Cached::new("cuda_backend", "device ordinal");
    CACHE.get(ordinal, CudaBackend::new)
}

/// Backends opened once per index and kept for the process; `op` names the lookup in its
/// errors and `noun` the index.
struct Cached<B> {
    slots: [OnceLock<B>; CACHED_ORDINALS],
    opening: Mutex<()>,
    op: &'static str,
    noun: &'static str,
}

impl<B> Cached<B> {
    const fn new(op: &'static str, noun: &'static str) -> Self {
        Cached {
            slots: [const { OnceLock::new() }; CACHED_ORDINALS],
            opening: Mutex::new(()),
            op,
            noun,
        }
    }

    /// Backend `index`: a lock-free read after the first call per index, which opens it
    /// (`open`) under a lock, so it is opened once. An index past the slots gets the error
    /// `open` gives, or one saying only the first [`CACHED_ORDINALS`] are served.
    fn get(&'static self, index: usize, open: impl Fn(usize) -> Result<B>) -> Result<&'static B> {
        let Some(slot) = self.slots.get(index) else {
            open(index)?;
            return Err(GpuError::invalid(
                self.op,
                format!("{} {index} is not below {CACHED_ORDINALS}", self.noun),
            ));
        };
        if let Some(b) = slot.get() {
            return Ok(b);
        }
        let _open = self.opening.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = slot.get() {
            return Ok(b);
        }
        let b = open(index)?;
        Ok(slot.get_or_init(|| b))
    }
}

/// The shared backend of wgpu adapter `index`, opened on first use (a clone of
/// [`wgpu_backend_ref`]'s: cheap, it shares everything).
pub fn wgpu_backend(index: usize) -> Result<WgpuBackend> {
    wgpu_backend_ref(index).cloned()
}

/// The shared backend of wgpu adapter `index` (`Device::Wgpu(index)`), as
/// [`cuda_backend_ref`]: a lock-free read of a `OnceLock` after the first call per index, which
/// opens it under a lock. No adapter, or no adapter `index`, is
/// [`GpuError::WgpuUnavailable`]; an index from 64 on gets the error opening it gives, or one
/// saying only the first 64 are served. A device lost later stays cached (its tensors' buffers
/// belong to it): every op on it then reports `DeviceLost`.
pub(crate) fn wgpu_backend_ref(index: usize) -> Result<&'static WgpuBackend> {
    static CACHE: Cached<WgpuBackend> = Cached::new("wgpu_backend", "adapter index");
    // The process-wide backend of gpu-wgpu, so tensors and direct users share one device.
    CACHE.get(index, WgpuBackend::shared)
}

/// Registers gpu-wgpu's adapter probe with gpu-core, so [`Device::check_present`] (and
/// [`Device::auto`], which then prefers a hardware wgpu adapter to the CPU) see wgpu adapters.
/// A program calls it when the work it picks a device for runs on wgpu. Returns false when a
/// probe was registered before.
pub fn register_wgpu_probe() -> bool {
    gpu_wgpu::register_device_probe()
}

thread_local! {
    /// Whether this thread's CPU tensors run on [`PrimitivesOnly`] ([`with_primitives_only`]).
    static PRIMITIVES_ONLY: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with this thread's CPU tensor ops dispatched to
/// [`gpu_core::testing::PrimitivesOnly`] (the CPU's primitives, every other op from its
/// default body) instead of the CPU backend: the test of a backend that joins op by op.
pub fn with_primitives_only<R>(f: impl FnOnce() -> R) -> R {
    let before = PRIMITIVES_ONLY.with(|p| p.replace(true));
    let out = f();
    PRIMITIVES_ONLY.with(|p| p.set(before));
    out
}

/// Whether [`with_primitives_only`] is active on this thread.
pub(crate) fn primitives_only() -> bool {
    PRIMITIVES_ONLY.with(|p| p.get())
}

/// Runs `$body` with `$b` bound to the backend of `$device` (generic over [`DeviceBackend`]).
macro_rules! on_device {
    ($device:expr, |$b:ident| $body:expr) => {
        match $device {
            gpu_core::Device::Cpu if $crate::backend::primitives_only() => {
                let $b = &gpu_core::testing::PrimitivesOnly;
                $body
            }
            gpu_core::Device::Cpu => {
                let $b = &gpu_core::CpuBackend;
                $body
            }
            gpu_core::Device::Cuda(i) => {
                let $b = $crate::backend::cuda_backend_ref(i)?;
                $body
            }
            gpu_core::Device::Wgpu(i) => {
                let $b = $crate::backend::wgpu_backend_ref(i)?;
                $body
            }
        }
    };
}
pub(crate) use on_device;

/// Host↔device copies made by tensors on this thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransferStats {
    pub host_to_device: u64,
    pub host_to_device_bytes: u64,
    pub device_to_host: u64,
    pub device_to_host_bytes: u64,
}

thread_local! {
    static TRANSFERS: Cell<TransferStats> = Cell::new(TransferStats::default());
}

/// Waits until the work queued on `device` so far is done (the CPU runs every op at once:
/// nothing to wait for). What a host timer needs before it starts, so that it does not count
/// the work queued before it.
pub fn synchronize(device: gpu_core::Device) -> Result<()> {
    use gpu_core::{Backend, Device};
    match device {
        Device::Cpu => Ok(()),
        Device::Cuda(i) => cuda_backend_ref(i)?.synchronize(),
        Device::Wgpu(i) => wgpu_backend_ref(i)?.synchronize(),
    }
}

/// Transfers counted on this thread so far (tests take differences).
pub fn transfer_stats() -> TransferStats {
    TRANSFERS.with(|t| t.get())
}

/// Applies `add` to this thread's counts.
fn count(add: impl FnOnce(&mut TransferStats)) {
    TRANSFERS.with(|t| {
        let mut s = t.get();
        add(&mut s);
        t.set(s);
    });
}

pub(crate) fn count_h2d(bytes: usize) {
    count(|s| {
        s.host_to_device += 1;
        s.host_to_device_bytes += bytes as u64;
    });
}

pub(crate) fn count_d2h(bytes: usize) {
    count(|s| {
        s.device_to_host += 1;
        s.device_to_host_bytes += bytes as u64;
    });
}

#[cfg(test)]
mod tests {
    use gpu_core::Device;

    /// The CPU has nothing queued; a CUDA device that cannot open (no driver here, or an
    /// ordinal past the machine's) is a typed error, not a panic.
    #[test]
    fn synchronize_waits_or_says_why_not() {
        super::synchronize(Device::Cpu).unwrap();
        match super::synchronize(Device::Cuda(4096)) {
            Err(e) => assert!(!e.to_string().is_empty()),
            Ok(()) => panic!("CUDA device 4096 synchronised"),
        }
    }
}
