//! [`CudaBackend`]: one CUDA device, its context, stream, module cache, pool and cuBLAS handle.

use crate::error::{check, drv, free_bytes};
use crate::gate::{Gate, Locked, Pass};
use crate::launch::{self, KernelArg, LaunchConfig, LaunchPath};
use crate::module::{ImageKind, ModuleCache};
use crate::pool::{CudaBuffer, MemoryPool, PoolStats};
use cudarc::cublas::CudaBlas;
use cudarc::cusolver::safe::DnHandle;
use cudarc::driver::{result, sys, CudaContext, CudaStream};
use gpu_core::backend::check_transfer;
use gpu_core::{probe, Backend, BufferInfo, DType, Device, DeviceType, Element, GpuError, Result};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

mod launches;
pub use launches::Grouping;

/// Environment variable choosing the launcher: `cudarc` (default) or `raw`.
pub const LAUNCH_ENV: &str = "HYBRID_CUDA_LAUNCH";
/// Environment variable choosing the embedded image: `fatbin` (default) or `ptx`.
pub const IMAGE_ENV: &str = "HYBRID_CUDA_IMAGE";

/// What the driver reports about a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub total_memory: usize,
    pub multiprocessors: u32,
    pub l2_cache_bytes: usize,
    /// Driver API version, e.g. 13000 for CUDA 13.0.
    pub driver_version: i32,
}

/// A library handle made on first use, or why it could not be.
type HandleCell<H> = OnceLock<std::result::Result<Mutex<H>, String>>;

struct Inner {
    /// This instance's id, recorded in every buffer its pool hands out.
    id: u64,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
    modules: ModuleCache,
    pool: MemoryPool,
    blas: HandleCell<CudaBlas>,
    solver: HandleCell<DnHandle>,
    tf32: AtomicBool,
    path: AtomicU8,
    image: AtomicU8,
    gate: Arc<Gate>,
    /// Held while a kernel's dynamic shared memory limit is read and raised
    /// ([`CudaBackend::raise_dynamic_smem`]), so that two threads cannot lower it between them.
    smem_limit: Mutex<()>,
}

/// A CUDA device. Cloning is cheap and shares everything.
#[derive(Clone)]
pub struct CudaBackend {
    inner: Arc<Guarded>,
}

/// [`Inner`], dropped while passing the device's capture gate: destroying the cuBLAS/cuSOLVER
/// handles, the modules, the stream and the context may synchronise the device, which would
/// invalidate another thread's capture (`crate::gate`).
struct Guarded {
    inner: std::mem::ManuallyDrop<Inner>,
}

impl std::ops::Deref for Guarded {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.inner
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        let gate = self.inner.gate.clone();
        let _pass = gate.pass();
        // SAFETY: dropped exactly once, here; nothing reads `inner` afterwards.
        unsafe { std::mem::ManuallyDrop::drop(&mut self.inner) }
    }
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBackend({:?})", self.inner.info)
    }
}

impl CudaBackend {
    /// Opens CUDA device `ordinal`. Fails with a typed error, never a panic, when the machine has
    /// no driver, no GPU, or not that many GPUs.
    pub fn new(ordinal: usize) -> Result<Self> {
        let count = probe::cuda_device_count()?;
        // cudarc loads the driver through its own loader and panics on its first call if that
        // fails: check it too before any cudarc call.
        // SAFETY: `is_culib_present` only tries to dlopen the driver library by name.
        if !unsafe { sys::is_culib_present() } {
            return Err(GpuError::CudaUnavailable(
                "cudarc could not load the CUDA driver library".into(),
            ));
        }
        if count == 0 {
            return Err(GpuError::CudaUnavailable(
                "the driver reports no CUDA device".into(),
            ));
        }
        if ordinal >= count {
            return Err(GpuError::InvalidOrdinal { ordinal, count });
        }
        // Opening a context and its first stream may synchronise the device: not during
        // another thread's capture.
        let gate = Gate::for_device(ordinal);
        let held = gate.clone();
        let _pass = held.pass();
        let ctx = CudaContext::new(ordinal).map_err(drv("cuDevicePrimaryCtxRetain"))?;
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let stream = ctx.new_stream().map_err(drv("cuStreamCreate"))?;
        let attr = |a| ctx.attribute(a).map_err(drv("cuDeviceGetAttribute"));
        let mut driver_version = 0;
        // SAFETY: out-pointer to a local; the driver is initialised (probe above).
        crate::error::check("cuDriverGetVersion", unsafe {
            sys::cuDriverGetVersion(&mut driver_version)
        })?;
        let info = DeviceInfo {
            ordinal,
            name: ctx.name().map_err(drv("cuDeviceGetName"))?,
            compute_capability: ctx
                .compute_capability()
                .map_err(drv("cuDeviceGetAttribute"))?,
            total_memory: ctx.total_mem().map_err(drv("cuDeviceTotalMem"))?,
            multiprocessors: attr(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )? as u32,
            l2_cache_bytes: attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?
                as usize,
            driver_version,
        };
        let path = match std::env::var(LAUNCH_ENV) {
            Ok(v) => v.parse()?,
            Err(_) => LaunchPath::default(),
        };
        let image = match std::env::var(IMAGE_ENV).ok().as_deref().map(str::trim) {
            None | Some("") | Some("fatbin") => ImageKind::Fatbin,
            Some("ptx") => ImageKind::Ptx,
            Some(other) => {
                return Err(GpuError::invalid(
                    IMAGE_ENV,
                    format!("'{other}': expected fatbin or ptx"),
                ))
            }
        };
        let backend = Self {
            inner: Arc::new(Guarded {
                inner: std::mem::ManuallyDrop::new(Inner {
                    id,
                    pool: MemoryPool::new(ctx.clone(), id, gate.clone()),
                    ctx,
                    stream,
                    info,
                    modules: ModuleCache::default(),
                    blas: OnceLock::new(),
                    solver: OnceLock::new(),
                    tf32: AtomicBool::new(false),
                    path: AtomicU8::new(0),
                    image: AtomicU8::new(0),
                    gate,
                    smem_limit: Mutex::new(()),
                }),
            }),
        };
        backend.set_launch_path(path);
        backend.set_image_kind(image);
        tracing::debug!(?backend, "opened CUDA device");
        Ok(backend)
    }

    /// Opens the CUDA device named by `device`; errors for the CPU and wgpu devices.
    pub fn for_device(device: Device) -> Result<Self> {
        match device {
            Device::Cuda(i) => Self::new(i),
            Device::Cpu | Device::Wgpu(_) => Err(GpuError::invalid(
                "CudaBackend",
                format!("{device} is not a CUDA device"),
            )),
        }
    }

    /// The device's properties.
    pub fn info(&self) -> &DeviceInfo {
        &self.inner.info
    }

    /// The cudarc context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.inner.ctx
    }

    /// The stream all work of this backend is queued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.inner.stream
    }

    /// This backend instance's id: every buffer it allocates records it
    /// ([`CudaBuffer::owner`]), and every entry point rejects buffers of other instances.
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// Passage through the device's capture gate (`crate::gate`): held by every entry point
    /// while it queues work, so that no work of another thread lands in a graph being captured.
    pub(crate) fn pass(&self) -> Pass<'_> {
        self.inner.gate.pass()
    }

    /// The exclusive passage a capture holds.
    pub(crate) fn gate(&self) -> &Gate {
        &self.inner.gate
    }

    /// Fails with [`GpuError::ForeignBuffer`] unless every buffer came from this instance.
    pub(crate) fn check_owned(&self, op: &'static str, bufs: &[&CudaBuffer]) -> Result<()> {
        match bufs.iter().find(|b| b.owner() != self.id()) {
            None => Ok(()),
            Some(b) => Err(GpuError::ForeignBuffer {
                op,
                detail: format!(
                    "a buffer of CUDA backend #{} was passed to backend #{} (device {})",
                    b.owner(),
                    self.id(),
                    self.inner.info.ordinal
                ),
            }),
        }
    }

    /// The launcher in use.
    pub fn launch_path(&self) -> LaunchPath {
        match self.inner.path.load(Ordering::Relaxed) {
            0 => LaunchPath::Cudarc,
            _ => LaunchPath::RawDriver,
        }
    }

    /// Switches the launcher for all later launches.
    pub fn set_launch_path(&self, path: LaunchPath) {
        self.inner.path.store(path as u8, Ordering::Relaxed);
    }

    /// The embedded image kernels are loaded from.
    pub fn image_kind(&self) -> ImageKind {
        match self.inner.image.load(Ordering::Relaxed) {
            0 => ImageKind::Fatbin,
            _ => ImageKind::Ptx,
        }
    }

    /// Switches the image for kernels not yet loaded in that form.
    pub fn set_image_kind(&self, kind: ImageKind) {
        self.inner.image.store(kind as u8, Ordering::Relaxed);
    }

    /// Allows (true) or forbids (false, the default) TF32 tensor cores in f32 matmul.
    pub fn set_tf32(&self, on: bool) {
        self.inner.tf32.store(on, Ordering::Relaxed);
    }

    /// Whether f32 matmul may use TF32.
    pub fn tf32(&self) -> bool {
        self.inner.tf32.load(Ordering::Relaxed)
    }

    /// Memory-pool statistics.
    pub fn pool_stats(&self) -> PoolStats {
        self.inner.pool.stats()
    }

    pub(crate) fn memory_pool(&self) -> &MemoryPool {
        &self.inner.pool
    }

    /// Returns the pool's cached blocks to the driver.
    pub fn empty_cache(&self) -> Result<()> {
        self.inner.pool.empty_cache()
    }

    /// Modules loaded so far (both launchers).
    pub fn modules_loaded(&self) -> usize {
        self.inner.modules.loaded()
    }

    /// The cuSOLVER dense handle on this backend's stream, created on first use.
    pub(crate) fn solver(&self) -> Result<Locked<'_, DnHandle>> {
        // SAFETY: only probes whether the library can be opened.
        let present = || unsafe { cudarc::cusolver::sys::is_culib_present() };
        self.handle(
            &self.inner.solver,
            ("cuSOLVER", "libcusolver.so", present),
            |s| DnHandle::new(s).map_err(|e| format!("cusolverDnCreate failed: {e:?}")),
        )
    }

    /// The cuBLAS handle, created on first use.
    pub(crate) fn blas(&self) -> Result<Locked<'_, CudaBlas>> {
        // SAFETY: only probes whether the library can be opened.
        let present = || unsafe { cudarc::cublas::sys::is_culib_present() };
        self.handle(&self.inner.blas, ("cuBLAS", "libcublas.so", present), |s| {
            CudaBlas::new(s).map_err(|e| format!("cublasCreate failed: {e:?}"))
        })
    }

    /// [`CudaBackend::blas`] and its raw handle, with this backend's context bound to the
    /// thread for the cuBLAS calls that follow; the guard keeps the handle locked while it
    /// lives.
    pub(crate) fn blas_bound(
        &self,
    ) -> Result<(Locked<'_, CudaBlas>, cudarc::cublas::sys::cublasHandle_t)> {
        let guard = self.blas()?;
        let handle = *guard.handle();
        self.bind()?;
        Ok((guard, handle))
    }

    /// [`CudaBackend::solver`] and its raw handle, with the context bound, as
    /// [`CudaBackend::blas_bound`].
    pub(crate) fn solver_bound(
        &self,
    ) -> Result<(
        Locked<'_, DnHandle>,
        cudarc::cusolver::sys::cusolverDnHandle_t,
    )> {
        let guard = self.solver()?;
        let handle = guard.cu();
        self.bind()?;
        Ok((guard, handle))
    }

    /// The library handle kept in `cell`, locked: made on first use by `create` on this
    /// backend's stream once `present()` says the library `name` (file `file`) can be opened;
    /// `CudaUnavailable` with the reason, then and on every later call, when it cannot be.
    fn handle<'a, H>(
        &'a self,
        cell: &'a HandleCell<H>,
        (name, file, present): (&str, &str, impl FnOnce() -> bool),
        create: impl FnOnce(Arc<CudaStream>) -> std::result::Result<H, String>,
    ) -> Result<Locked<'a, H>> {
        let pass = self.pass();
        let handle = cell.get_or_init(|| {
            if !present() {
                return Err(format!("the {name} library ({file}) was not found"));
            }
            create(self.inner.stream.clone()).map(Mutex::new)
        });
        match handle {
            Ok(m) => Ok(Locked::new(
                pass,
                m.lock().unwrap_or_else(|p| p.into_inner()),
            )),
            Err(e) => Err(GpuError::CudaUnavailable(e.clone())),
        }
    }

    /// Launches an embedded kernel (see `gpu_kernels::all_kernels`) on this backend's stream
    /// with the current launcher and image.
    ///
    /// # Safety
    /// `args` must match the kernel's parameter list in number, order and type, and every pointer
    /// must address live device memory large enough for what the kernel reads and writes under
    /// `cfg`. A mismatch is undefined behaviour on the device, as with any CUDA launch.
    pub unsafe fn launch(&self, kernel: &str, cfg: LaunchConfig, args: &[KernelArg]) -> Result<()> {
        launch::check_config(kernel, &cfg)?;
        launch::check_owners(kernel, self.id(), args)?;
        let _pass = self.pass();
        let (ctx, stream, kind) = (&self.inner.ctx, &self.inner.stream, self.image_kind());
        // By-value struct parameters exist only on the raw driver path.
        let path = match args.iter().any(KernelArg::is_bytes) {
            true => LaunchPath::RawDriver,
            false => self.launch_path(),
        };
        match path {
            LaunchPath::Cudarc => {
                let f = self.inner.modules.cudarc_function(ctx, kernel, kind)?;
                // SAFETY: this function's contract (arguments match the kernel, live buffers);
                // every buffer argument is this instance's (checked above).
                unsafe { launch::launch_cudarc(stream, &f, cfg, args) }
            }
            LaunchPath::RawDriver => {
                let f = self.inner.modules.raw_function(ctx, kernel, kind)?;
                // SAFETY: as above; `f` comes from this instance's module cache, still loaded.
                unsafe { launch::launch_raw(stream, f.func, cfg, args) }
            }
        }
    }

    /// Copies `src` into `dst` on the device (same dtype and length), queued on the stream.
    pub fn copy_buffer(&self, src: &CudaBuffer, dst: &mut CudaBuffer) -> Result<()> {
        if src.dtype() != dst.dtype() {
            return Err(GpuError::DTypeMismatch {
                op: "copy_buffer",
                expected: dst.dtype(),
                got: src.dtype(),
            });
        }
        if src.len() != dst.len() {
            return Err(GpuError::shape("copy_buffer", dst.len(), src.len()));
        }
        self.check_owned("copy_buffer", &[src, dst])?;
        if src.is_empty() {
            return Ok(());
        }
        let _pass = self.pass();
        self.bind()?;
        // SAFETY: both buffers are live and hold `size_in_bytes` bytes (checked above).
        unsafe {
            result::memcpy_dtod_async(
                dst.device_ptr(),
                src.device_ptr(),
                src.size_in_bytes(),
                self.inner.stream.cu_stream(),
            )
        }
        .map_err(drv("cuMemcpyDtoDAsync"))
    }

    /// Fills a buffer of 4-byte elements with a bit pattern (`cuMemsetD32Async`).
    pub(crate) fn memset32(&self, buf: &mut CudaBuffer, bits: u32) -> Result<()> {
        self.memset(buf, "cuMemsetD32Async", |ptr, len, stream| {
            // SAFETY: `memset` passes the live buffer's pointer and its `len` 4-byte elements.
            unsafe { sys::cuMemsetD32Async(ptr, bits, len, stream) }
        })
    }

    pub(crate) fn memset16(&self, buf: &mut CudaBuffer, bits: u16) -> Result<()> {
        self.memset(buf, "cuMemsetD16Async", |ptr, len, stream| {
            // SAFETY: `memset` passes the live buffer's pointer and its `len` 2-byte elements.
            unsafe { sys::cuMemsetD16Async(ptr, bits, len, stream) }
        })
    }

    /// The fill of `memset32` and `memset16`: for a non-empty buffer of this
    /// backend, `set(ptr, len, stream)` queues the driver call `call` on this backend's stream.
    fn memset(
        &self,
        buf: &mut CudaBuffer,
        call: &'static str,
        set: impl FnOnce(sys::CUdeviceptr, usize, sys::CUstream) -> sys::CUresult,
    ) -> Result<()> {
        self.check_owned("fill", &[buf])?;
        if buf.is_empty() {
            return Ok(());
        }
        let _pass = self.pass();
        self.bind()?;
        check(
            call,
            set(buf.device_ptr(), buf.len(), self.inner.stream.cu_stream()),
        )
    }

    pub(crate) fn bind(&self) -> Result<()> {
        self.inner
            .ctx
            .bind_to_thread()
            .map_err(drv("cuCtxSetCurrent"))
    }
}

impl Backend for CudaBackend {
    type Buffer = CudaBuffer;

    fn device(&self) -> Device {
        Device::Cuda(self.inner.info.ordinal)
    }

    fn device_name(&self) -> String {
        self.inner.info.name.clone()
    }

    fn device_type(&self) -> DeviceType {
        DeviceType::Gpu
    }

    fn memory_available(&self) -> Result<usize> {
        self.bind()?;
        Ok(free_bytes())
    }

    fn allocate(&self, dtype: DType, len: usize) -> Result<CudaBuffer> {
        self.inner.pool.alloc(dtype, len)
    }

    fn copy_to_device<T: Element>(&self, src: &[T], dst: &mut CudaBuffer) -> Result<()> {
        check_transfer::<T>("copy_to_device", src.len(), dst)?;
        self.check_owned("copy_to_device", &[dst])?;
        if src.is_empty() {
            return Ok(());
        }
        let _pass = self.pass();
        if self.inner.pool.is_capturing() {
            // A recorded copy would read `src` again at every replay, long after it is gone.
            return Err(GpuError::invalid(
                "copy_to_device",
                "a host-to-device copy cannot be recorded in a CUDA graph; write the inputs \
                 before the replay",
            ));
        }
        self.bind()?;
        // No stream synchronisation: work queued before still runs first (stream order), and
        // the host does not wait for it, so a training loop's uploads do not stall the device.
        // SAFETY: `dst` holds exactly `src.len()` elements of T (checked above). `src` is
        // pageable memory (this crate never pins host memory), and for a host-to-device copy
        // from pageable memory the driver stages the data before `cuMemcpyHtoDAsync` returns
        // ("API synchronization behavior" in the CUDA driver documentation), so `src` may be
        // dropped or changed as soon as the call returns.
        unsafe { result::memcpy_htod_async(dst.device_ptr(), src, self.inner.stream.cu_stream()) }
            .map_err(drv("cuMemcpyHtoDAsync"))
    }

    fn copy_from_device<T: Element>(&self, src: &CudaBuffer, dst: &mut [T]) -> Result<()> {
        check_transfer::<T>("copy_from_device", dst.len(), src)?;
        self.check_owned("copy_from_device", &[src])?;
        if dst.is_empty() {
            return Ok(());
        }
        let _pass = self.pass();
        self.bind()?;
        // SAFETY: `src` holds exactly `dst.len()` elements of T (checked above); the stream is
        // synchronised before `dst` is read.
        unsafe { result::memcpy_dtoh_async(dst, src.device_ptr(), self.inner.stream.cu_stream()) }
            .map_err(drv("cuMemcpyDtoHAsync"))?;
        self.synchronize()
    }

    fn synchronize(&self) -> Result<()> {
        let _pass = self.pass();
        self.inner
            .stream
            .synchronize()
            .map_err(drv("cuStreamSynchronize"))
    }
}
