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

struct Inner {
    /// This instance's id, recorded in every buffer its pool hands out.
    id: u64,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
    modules: ModuleCache,
    pool: MemoryPool,
    blas: OnceLock<std::result::Result<Mutex<CudaBlas>, String>>,
    solver: OnceLock<std::result::Result<Mutex<DnHandle>, String>>,
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
        let pass = self.pass();
        let solver = self.inner.solver.get_or_init(|| {
            // SAFETY: only probes whether the library can be opened.
            if !unsafe { cudarc::cusolver::sys::is_culib_present() } {
                return Err("the cuSOLVER library (libcusolver.so) was not found".to_string());
            }
            DnHandle::new(self.inner.stream.clone())
                .map(Mutex::new)
                .map_err(|e| format!("cusolverDnCreate failed: {e:?}"))
        });
        match solver {
            Ok(m) => Ok(Locked::new(
                pass,
                m.lock().unwrap_or_else(|p| p.into_inner()),
            )),
            Err(e) => Err(GpuError::CudaUnavailable(e.clone())),
        }
    }

    /// The cuBLAS handle, created on first use.
    pub(crate) fn blas(&self) -> Result<Locked<'_, CudaBlas>> {
        let pass = self.pass();
        let blas = self.inner.blas.get_or_init(|| {
            // SAFETY: only probes whether the library can be opened.
            if !unsafe { cudarc::cublas::sys::is_culib_present() } {
                return Err("the cuBLAS library (libcublas.so) was not found".to_string());
            }
            CudaBlas::new(self.inner.stream.clone())
                .map(Mutex::new)
                .map_err(|e| format!("cublasCreate failed: {e:?}"))
        });
        match blas {
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

    /// An embedded kernel's raw-driver function, its context bound to this thread and its
    /// dynamic shared memory limit at least `smem` (for the occupancy queries).
    fn function_with_smem(&self, kernel: &str, smem: u32) -> Result<crate::module::RawFunction> {
        let f = self
            .inner
            .modules
            .raw_function(&self.inner.ctx, kernel, self.image_kind())?;
        self.bind()?;
        self.raise_dynamic_smem(f.func, smem)?;
        Ok(f)
    }

    /// Raises `func`'s dynamic shared memory limit
    /// (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`) to `smem` bytes where it is lower;
    /// never lowers it. The context must be bound.
    ///
    /// The limit belongs to the function, which every thread using this backend shares (the
    /// module cache holds one per kernel), and it outlives the call that set it: the rollout's
    /// plans are cached on the understanding that it stays set. Setting it to each caller's size
    /// let planning another size lower it below what a cached plan launches with (from another
    /// thread, or the same one between two rollouts of different sizes): the driver then counts
    /// no block of the launch's size as resident (the occupancy of more dynamic shared memory
    /// than the function's limit is 0) and refuses the cooperative grid with
    /// `CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE`. A higher limit admits every smaller launch; the
    /// occupancy queries are asked about the launch's own size (should the driver still refuse
    /// a grid they admitted, `rollout` takes its next path). Reading and raising under one lock
    /// keeps two raising threads from lowering it between them.
    fn raise_dynamic_smem(&self, func: sys::CUfunction, smem: u32) -> Result<()> {
        if smem == 0 {
            return Ok(());
        }
        let want = i32::try_from(smem)
            .map_err(|_| GpuError::invalid("cuFuncSetAttribute", "shared memory too large"))?;
        let _held = self
            .inner
            .smem_limit
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let attr = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        let mut now: i32 = 0;
        // SAFETY: the callers pass a live function of a loaded module, its context bound;
        // the query writes one int to a local.
        check("cuFuncGetAttribute", unsafe {
            sys::cuFuncGetAttribute(&mut now, attr, func)
        })?;
        if now >= want {
            return Ok(());
        }
        // SAFETY: as above; the attribute only sets the function's launch limit (the driver
        // refuses more than the device allows, with an error).
        check("cuFuncSetAttribute", unsafe {
            sys::cuFuncSetAttribute(func, attr, want)
        })
    }

    /// The most blocks of `block` threads and `smem` bytes of dynamic shared memory of an
    /// embedded kernel that can be resident at once on this device (the largest cooperative
    /// grid). Allows more than 48 KiB of dynamic shared memory when `smem` asks for it.
    pub fn cooperative_grid(&self, kernel: &str, block: u32, smem: u32) -> Result<u32> {
        let per_sm = self.blocks_per_multiprocessor(kernel, block, smem)?;
        Ok(per_sm.saturating_mul(self.info().multiprocessors))
    }

    /// The most blocks of `block` threads and `smem` bytes of dynamic shared memory of an
    /// embedded kernel that one multiprocessor holds at once
    /// (`cuOccupancyMaxActiveBlocksPerMultiprocessor`, after raising the kernel's dynamic shared
    /// memory limit to at least `smem`: below it the driver counts 0).
    pub fn blocks_per_multiprocessor(&self, kernel: &str, block: u32, smem: u32) -> Result<u32> {
        let block = i32::try_from(block)
            .map_err(|_| GpuError::invalid("occupancy", format!("{block} threads a block")))?;
        let f = self.function_with_smem(kernel, smem)?;
        let mut per_sm: i32 = 0;
        // SAFETY: `f.func` is a live function of a loaded module; the occupancy query only
        // reads its launch limits and writes one int to a local.
        check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut per_sm,
                f.func,
                block,
                smem as usize,
            )
        })?;
        Ok(per_sm.max(0) as u32)
    }

    /// Launches an embedded kernel whose dynamic shared memory may exceed the default 48 KiB
    /// (raises the kernel's limit to `cfg.shared_mem_bytes` first; the driver refuses more than
    /// the device allows, with an error).
    ///
    /// # Safety
    /// As [`CudaBackend::launch`].
    pub unsafe fn launch_large_smem(
        &self,
        kernel: &str,
        cfg: LaunchConfig,
        args: &[KernelArg],
    ) -> Result<()> {
        let f = self.checked_raw_function(kernel, &cfg, args)?;
        let _pass = self.pass();
        self.bind()?;
        self.raise_dynamic_smem(f.func, cfg.shared_mem_bytes)?;
        // SAFETY: this function's contract; `f` is from this instance's cache, still loaded.
        unsafe { launch::launch_raw(&self.inner.stream, f.func, cfg, args) }
    }

    /// Launches an embedded kernel cooperatively: every block resident at once, as grid-wide
    /// barriers need. `cfg.grid_dim.0` must not exceed [`CudaBackend::cooperative_grid`] for
    /// the same block and shared memory (the driver refuses a larger grid with an error).
    ///
    /// # Safety
    /// As [`CudaBackend::launch`].
    pub unsafe fn launch_cooperative(
        &self,
        kernel: &str,
        cfg: LaunchConfig,
        args: &[KernelArg],
    ) -> Result<()> {
        // SAFETY: this function's contract.
        unsafe { self.launch_grouped(kernel, cfg, args, true, 0) }
    }

    /// As [`CudaBackend::launch_cooperative`], with the blocks grouped into thread-block
    /// clusters of `cluster` consecutive blocks along x (see [`CudaBackend::max_clusters`]).
    ///
    /// # Safety
    /// As [`CudaBackend::launch`].
    pub unsafe fn launch_cooperative_clustered(
        &self,
        kernel: &str,
        cfg: LaunchConfig,
        args: &[KernelArg],
        cluster: u32,
    ) -> Result<()> {
        // SAFETY: this function's contract.
        unsafe { self.launch_grouped(kernel, cfg, args, true, cluster) }
    }

    /// Launches an embedded kernel with its blocks grouped into thread-block clusters of
    /// `cluster` consecutive blocks along x (at most 8, the portable size; sm_90 and later: the
    /// driver refuses it elsewhere, with an error). Not cooperative: the blocks need not all be
    /// resident at once.
    ///
    /// # Safety
    /// As [`CudaBackend::launch`].
    pub unsafe fn launch_clustered(
        &self,
        kernel: &str,
        cfg: LaunchConfig,
        args: &[KernelArg],
        cluster: u32,
    ) -> Result<()> {
        // SAFETY: this function's contract.
        unsafe { self.launch_grouped(kernel, cfg, args, false, cluster) }
    }

    /// The raw-driver launch of an embedded kernel, cooperative or not, in clusters of
    /// `cluster` blocks along x (0: no clusters).
    ///
    /// # Safety
    /// As [`CudaBackend::launch`].
    unsafe fn launch_grouped(
        &self,
        kernel: &str,
        cfg: LaunchConfig,
        args: &[KernelArg],
        cooperative: bool,
        cluster: u32,
    ) -> Result<()> {
        let f = self.checked_raw_function(kernel, &cfg, args)?;
        let _pass = self.pass();
        // The launch's own dynamic shared memory, whatever an earlier query left set.
        self.bind()?;
        self.raise_dynamic_smem(f.func, cfg.shared_mem_bytes)?;
        // SAFETY: this function's contract; `f` is from this instance's cache, still loaded.
        unsafe {
            launch::launch_raw_with(&self.inner.stream, f.func, cfg, args, cooperative, cluster)
        }
    }

    /// Whether the loaded kernels have thread-block cluster code: the fatbins' sm_90 machine
    /// code has it; the compute_80 PTX (loaded as the `Ptx` image, and JIT-compiled by GPUs of
    /// another major version, which cannot run sm_90 machine code) has none, and its cluster
    /// kernels trap.
    pub fn has_cluster_code(&self) -> bool {
        self.info().compute_capability.0 == 9 && self.image_kind() == ImageKind::Fatbin
    }

    /// How many clusters of `cluster` blocks (`block` threads, `smem` bytes of dynamic shared
    /// memory each) of `kernel` this device can hold at once; 0 where the loaded code has no
    /// clusters ([`CudaBackend::has_cluster_code`]) or the device cannot place one of that
    /// size. Sizes above 8 (the portable limit) are allowed for the kernel first.
    pub fn max_clusters(&self, kernel: &str, block: u32, smem: u32, cluster: u32) -> Result<u32> {
        if !self.has_cluster_code() || cluster == 0 {
            return Ok(0);
        }
        let f = self.function_with_smem(kernel, smem)?;
        // SAFETY: `f.func` is a live function of a loaded module; the attribute only widens the
        // cluster sizes its launches may ask for, and the query only reads its launch limits
        // (`config` and `attr` outlive the call).
        unsafe {
            if cluster > 8 {
                check(
                    "cuFuncSetAttribute",
                    sys::cuFuncSetAttribute(
                        f.func,
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                        1,
                    ),
                )?;
            }
            let mut value: sys::CUlaunchAttributeValue = std::mem::zeroed();
            value.clusterDim.x = cluster;
            value.clusterDim.y = 1;
            value.clusterDim.z = 1;
            let mut attr = sys::CUlaunchAttribute {
                id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
                pad: [0; 4],
                value,
            };
            let config = sys::CUlaunchConfig {
                gridDimX: cluster,
                gridDimY: 1,
                gridDimZ: 1,
                blockDimX: block,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: smem,
                hStream: std::ptr::null_mut(),
                attrs: &mut attr,
                numAttrs: 1,
            };
            let mut n: i32 = 0;
            let r = sys::cuOccupancyMaxActiveClusters(&mut n, f.func, &config);
            // A size the device cannot place at all is "none", not an error.
            if r != sys::CUresult::CUDA_SUCCESS {
                return Ok(0);
            }
            Ok(n.max(0) as u32)
        }
    }

    /// An embedded kernel's raw-driver function, after checking the launch configuration and
    /// that every buffer argument is this instance's.
    fn checked_raw_function(
        &self,
        kernel: &str,
        cfg: &LaunchConfig,
        args: &[KernelArg],
    ) -> Result<crate::module::RawFunction> {
        launch::check_config(kernel, cfg)?;
        launch::check_owners(kernel, self.id(), args)?;
        self.inner
            .modules
            .raw_function(&self.inner.ctx, kernel, self.image_kind())
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
        self.check_owned("fill", &[buf])?;
        if buf.is_empty() {
            return Ok(());
        }
        let _pass = self.pass();
        self.bind()?;
        // SAFETY: the buffer holds `len` 4-byte elements and is live.
        crate::error::check("cuMemsetD32Async", unsafe {
            sys::cuMemsetD32Async(
                buf.device_ptr(),
                bits,
                buf.len(),
                self.inner.stream.cu_stream(),
            )
        })
    }

    pub(crate) fn memset16(&self, buf: &mut CudaBuffer, bits: u16) -> Result<()> {
        self.check_owned("fill", &[buf])?;
        if buf.is_empty() {
            return Ok(());
        }
        let _pass = self.pass();
        self.bind()?;
        // SAFETY: the buffer holds `len` 2-byte elements and is live.
        crate::error::check("cuMemsetD16Async", unsafe {
            sys::cuMemsetD16Async(
                buf.device_ptr(),
                bits,
                buf.len(),
                self.inner.stream.cu_stream(),
            )
        })
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
