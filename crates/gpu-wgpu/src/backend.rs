//! [`WgpuBackend`]: device, queue, buffer pool, pipeline cache and the `Backend` impl.

use crate::buffer::{Pool, WgpuBuffer, MIN_CLASS};
use crate::error::WgpuError;
use crate::probe;
use crate::record::{Pending, BATCH, PARAMS_SLOT};
use crate::status::StatusRing;
use gpu_core::backend::{check_transfer, Backend, DeviceType};
use gpu_core::{DType, Device, Element, GpuError, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Environment variable bounding every wait on the device, in milliseconds (default 60000).
pub const POLL_TIMEOUT_ENV: &str = "HYBRID_WGPU_TIMEOUT_MS";

/// What the backend knows about its adapter.
#[derive(Debug, Clone)]
pub struct WgpuInfo {
    /// Index among the enumerated adapters (`Device::Wgpu(index)`).
    pub index: usize,
    /// The adapter's name and driver as wgpu reports them.
    pub adapter: wgpu::AdapterInfo,
    /// The device's limits (the adapter's, all requested).
    pub limits: wgpu::Limits,
}

pub(crate) struct Inner {
    pub info: WgpuInfo,
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub(crate) pool: Mutex<Pool>,
    pipelines: Mutex<HashMap<String, Arc<wgpu::ComputePipeline>>>,
    /// The parameter ring: a uniform buffer of `BATCH` slots (see [`Pending::staged`]).
    pub(crate) params: wgpu::Buffer,
    /// Work recorded since the last submission ([`WgpuBackend::record`]).
    pub(crate) pending: Mutex<Pending>,
    lost: Arc<Mutex<Option<String>>>,
    uncaptured: Arc<Mutex<Option<String>>>,
    pub(crate) timeout: Duration,
    /// The deferred index checks ([`crate::status`]).
    pub(crate) status: Mutex<StatusRing>,
}

/// Whether a kernel keeps wgpu's runtime checks (an index clamped into its array, a counter
/// that ends any loop after 2^64 iterations), which cost instructions in a hot inner loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Checks {
    On,
    /// Only for a kernel that tests every index itself and whose loops are bounded by its
    /// parameters (the matmuls: every load and store is guarded by `< m`, `< n`, `< kend`).
    Off,
}

/// A wgpu device and queue with a buffer pool and a pipeline cache. Cheap to clone (shared).
#[derive(Clone)]
pub struct WgpuBackend {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for WgpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WgpuBackend({})", self.device_name())
    }
}

/// The byte views below need `T` to be exactly its dtype's size (an outside `Element` impl
/// could be a padded type).
pub(crate) fn check_element_size<T: Element>(op: &'static str) -> Result<()> {
    if std::mem::size_of::<T>() == T::DTYPE.size_in_bytes() {
        Ok(())
    } else {
        Err(GpuError::invalid(
            op,
            "element type is not its dtype's size",
        ))
    }
}

fn shared_backends() -> &'static Mutex<HashMap<usize, WgpuBackend>> {
    static MAP: OnceLock<Mutex<HashMap<usize, WgpuBackend>>> = OnceLock::new();
    MAP.get_or_init(Default::default)
}

/// Every lock here is taken through gpu-core's poison-tolerant [`gpu_core::lock`].
pub(crate) use gpu_core::lock;

impl WgpuBackend {
    /// Opens adapter `index` (in enumeration order) with all of its limits and, of the
    /// optional features, timestamps and `shader-f16` where it offers them. No adapter is a [`GpuError::WgpuUnavailable`], never a panic.
    pub fn new(index: usize) -> Result<Self> {
        Ok(Self::open(index)?)
    }

    /// The process-wide backend of adapter `index`, opened on first use.
    pub fn shared(index: usize) -> Result<Self> {
        let mut map = lock(shared_backends());
        if let Some(b) = map.get(&index) {
            if b.check_lost().is_ok() {
                return Ok(b.clone());
            }
        }
        let b = Self::new(index)?;
        map.insert(index, b.clone());
        Ok(b)
    }

    fn open(index: usize) -> std::result::Result<Self, WgpuError> {
        let found = probe::discovered()?;
        let adapter = found.adapters.get(index).ok_or_else(|| {
            WgpuError::NoAdapter(format!(
                "adapter {index} does not exist ({} adapter(s) present)",
                found.adapters.len()
            ))
        })?;
        let limits = adapter.limits();
        let desc = wgpu::DeviceDescriptor {
            label: Some("hybrid-trainer"),
            // Timestamps only serve the opt-in profile ([`WgpuBackend::set_profiling`]);
            // `shader-f16` the f16 weights' native loads (quant.rs).
            required_features: adapter.features()
                & (wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::SHADER_F16),
            required_limits: limits.clone(),
            memory_hints: wgpu::MemoryHints::Performance,
            ..Default::default()
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&desc))
            .map_err(|e| WgpuError::RequestDevice(e.to_string()))?;
        let lost = Arc::new(Mutex::new(None));
        let l = lost.clone();
        device.set_device_lost_callback(move |reason, msg| {
            *lock(&l) = Some(format!("wgpu device lost ({reason:?}): {msg}"));
        });
        // wgpu's default handler panics; errors outside an error scope are kept and reported
        // by the next call instead.
        let uncaptured = Arc::new(Mutex::new(None));
        let u = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            let mut slot = lock(&u);
            if slot.is_none() {
                *slot = Some(e.to_string());
            }
        }));
        let timeout = std::env::var(POLL_TIMEOUT_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map_or(Duration::from_secs(60), Duration::from_millis);
        let params = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("params"),
            size: (BATCH * PARAMS_SLOT) as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let status = StatusRing::new(&device);
        Ok(Self {
            inner: Arc::new(Inner {
                info: WgpuInfo {
                    index,
                    adapter: adapter.get_info(),
                    limits: device.limits(),
                },
                device,
                queue,
                pool: Mutex::new(Pool::new(adapter.get_info().device_type)),
                pipelines: Mutex::new(HashMap::new()),
                params,
                pending: Mutex::new(Pending::default()),
                lost,
                uncaptured,
                timeout,
                status: Mutex::new(status),
            }),
        })
    }

    /// The adapter and its limits.
    pub fn info(&self) -> &WgpuInfo {
        &self.inner.info
    }

    /// The wgpu device (for kernels outside this crate).
    pub fn wgpu_device(&self) -> &wgpu::Device {
        &self.inner.device
    }

    /// The bound on every wait (see [`POLL_TIMEOUT_ENV`]).
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// Errors once the device is lost, or with the first error wgpu raised outside a scope.
    pub fn check_lost(&self) -> Result<()> {
        if let Some(m) = lock(&self.inner.lost).clone() {
            return Err(WgpuError::DeviceLost(m).into());
        }
        if let Some(m) = lock(&self.inner.uncaptured).take() {
            return Err(WgpuError::Call {
                call: "wgpu",
                detail: m,
            }
            .into());
        }
        Ok(())
    }

    /// Releases every cached buffer of the pool.
    pub fn trim_pool(&self) {
        // Recorded work may use the cached buffers: it is submitted before they are destroyed
        // (a submitted use keeps a destroyed buffer alive; an unsubmitted one would fail).
        self.flush();
        let mut pool = lock(&self.inner.pool);
        for (_, bufs) in pool.free.drain() {
            for b in bufs {
                b.destroy();
            }
        }
        pool.cached_bytes = 0;
    }

    /// Bytes of freed buffers the pool holds for reuse.
    pub fn pooled_bytes(&self) -> u64 {
        lock(&self.inner.pool).cached_bytes
    }

    /// Number of distinct pipelines compiled so far.
    pub fn pipeline_count(&self) -> usize {
        lock(&self.inner.pipelines).len()
    }

    /// The largest buffer one binding may hold, in bytes.
    pub fn max_binding_bytes(&self) -> u64 {
        let l = &self.inner.info.limits;
        l.max_storage_buffer_binding_size.min(l.max_buffer_size)
    }

    fn size_class(&self, bytes: u64) -> u64 {
        let pow2 = bytes.max(MIN_CLASS).next_power_of_two();
        if pow2 <= self.max_binding_bytes() {
            pow2
        } else {
            bytes.max(MIN_CLASS)
        }
    }

    /// Runs `f` inside an error scope of `filter`; a captured error comes back typed.
    pub(crate) fn scoped<R>(
        &self,
        filter: wgpu::ErrorFilter,
        call: &'static str,
        f: impl FnOnce() -> R,
    ) -> Result<R> {
        let scope = self.inner.device.push_error_scope(filter);
        let r = f();
        match pollster::block_on(scope.pop()) {
            None => Ok(r),
            Some(wgpu::Error::OutOfMemory { .. }) => {
                Err(WgpuError::OutOfMemory { requested: 0 }.into())
            }
            Some(e) => Err(WgpuError::Call {
                call,
                detail: e.to_string(),
            }
            .into()),
        }
    }

    fn create_storage(&self, class: u64) -> Result<wgpu::Buffer> {
        let started = Instant::now();
        let made = self.create_storage_inner(class);
        self.note_host("(new device buffer)", started);
        made
    }

    fn create_storage_inner(&self, class: u64) -> Result<wgpu::Buffer> {
        let make = || {
            self.scoped(wgpu::ErrorFilter::OutOfMemory, "create_buffer", || {
                self.inner.device.create_buffer(&wgpu::BufferDescriptor {
                    label: None,
                    size: class,
                    usage: wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::COPY_SRC
                        | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                })
            })
        };
        match make() {
            Ok(b) => Ok(b),
            Err(GpuError::OutOfMemory { .. }) => {
                // Release the pool's cache and try once more.
                self.trim_pool();
                make().map_err(|e| match e {
                    GpuError::OutOfMemory { .. } => WgpuError::OutOfMemory {
                        requested: class as usize,
                    }
                    .into(),
                    e => e,
                })
            }
            Err(e) => Err(e),
        }
    }

    /// The pipeline of `entry` in the WGSL `source` cached under `key`, compiled on first use
    /// with wgpu's runtime checks (`Checks::On`) or without them (see [`Checks::Off`]).
    pub(crate) fn pipeline(
        &self,
        key: &str,
        source: impl FnOnce() -> String,
        (entry, checks): (&str, Checks),
    ) -> Result<Arc<wgpu::ComputePipeline>> {
        let full_key = format!("{key}::{entry}");
        let mut cache = lock(&self.inner.pipelines);
        if let Some(p) = cache.get(&full_key) {
            return Ok(p.clone());
        }
        let src = source();
        let pipeline = self.scoped(
            wgpu::ErrorFilter::Validation,
            "create_compute_pipeline",
            || {
                let desc = wgpu::ShaderModuleDescriptor {
                    label: Some(key),
                    source: wgpu::ShaderSource::Wgsl(src.into()),
                };
                let module = match checks {
                    Checks::On => self.inner.device.create_shader_module(desc),
                    // SAFETY: `Checks::Off` is only passed for kernels that test every index
                    // against its buffer's bounds themselves and whose loops have bounds from
                    // the parameter block (see Checks::Off), launched with buffers whose
                    // element counts fit their u32 index arithmetic (checked by the caller).
                    Checks::Off => unsafe {
                        self.inner.device.create_shader_module_trusted(
                            desc,
                            wgpu::ShaderRuntimeChecks::unchecked(),
                        )
                    },
                };
                self.inner
                    .device
                    .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                        label: Some(key),
                        layout: None,
                        module: &module,
                        entry_point: Some(entry),
                        compilation_options: Default::default(),
                        cache: None,
                    })
            },
        )?;
        let p = Arc::new(pipeline);
        cache.insert(full_key, p.clone());
        Ok(p)
    }

    /// Waits for the queue's work up to `submission`, bounded by [`Self::timeout`].
    pub(crate) fn wait(
        &self,
        op: &'static str,
        submission: Option<wgpu::SubmissionIndex>,
    ) -> Result<()> {
        let started = Instant::now();
        let r = self.inner.device.poll(wgpu::PollType::Wait {
            submission_index: submission,
            timeout: Some(self.inner.timeout),
        });
        self.note_host(
            match op {
                "synchronize" => "(wait: synchronize)",
                _ => "(wait: read back)",
            },
            started,
        );
        match r {
            Ok(_) => self.check_lost(),
            Err(wgpu::PollError::Timeout) => Err(WgpuError::Timeout {
                op,
                waited_ms: self.inner.timeout.as_millis() as u64,
            }
            .into()),
            Err(e) => {
                self.check_lost()?;
                Err(WgpuError::Call {
                    call: "poll",
                    detail: e.to_string(),
                }
                .into())
            }
        }
    }

    /// The checks of a copy of `len` host elements of `T` to or from `buf`: the lengths and
    /// dtype, `T`'s size, `buf`'s owner, and the device not lost.
    fn check_copy<T: Element>(&self, op: &'static str, len: usize, buf: &WgpuBuffer) -> Result<()> {
        check_transfer::<T>(op, len, buf)?;
        check_element_size::<T>(op)?;
        self.check_owner(op, buf)?;
        self.check_lost()
    }

    pub(crate) fn check_owner(&self, op: &'static str, b: &WgpuBuffer) -> Result<()> {
        if b.same_owner(self) {
            Ok(())
        } else {
            Err(GpuError::ForeignBuffer {
                op,
                detail: "the buffer belongs to another wgpu device".into(),
            })
        }
    }
}

impl Backend for WgpuBackend {
    type Buffer = WgpuBuffer;

    fn device(&self) -> Device {
        Device::Wgpu(self.inner.info.index)
    }

    fn device_name(&self) -> String {
        let a = &self.inner.info.adapter;
        format!(
            "{} ({:?}, {} {})",
            a.name, a.backend, a.driver, a.driver_info
        )
    }

    fn device_type(&self) -> DeviceType {
        DeviceType::Gpu
    }

    /// wgpu has no query for free device memory: this is the largest single buffer the device
    /// accepts (`min(max_buffer_size, max_storage_buffer_binding_size)`), an upper bound.
    fn memory_available(&self) -> Result<usize> {
        self.check_lost()?;
        Ok(self.max_binding_bytes() as usize)
    }

    fn allocate(&self, dtype: DType, len: usize) -> Result<WgpuBuffer> {
        self.check_lost()?;
        let bytes = (len as u64)
            .checked_mul(dtype.size_in_bytes() as u64)
            .ok_or_else(|| GpuError::InvalidShape {
                op: "allocate",
                reason: format!("{len} elements of {dtype} overflow"),
            })?
            .div_ceil(4)
            * 4;
        if bytes > self.max_binding_bytes() {
            return Err(WgpuError::Unsupported {
                op: "allocate",
                reason: format!(
                    "{bytes} bytes exceed the adapter's largest storage binding ({} bytes, \
                     max_storage_buffer_binding_size / max_buffer_size)",
                    self.max_binding_bytes()
                ),
            }
            .into());
        }
        let class = self.size_class(bytes);
        let reused = {
            let mut pool = lock(&self.inner.pool);
            let b = pool.free.get_mut(&class).and_then(Vec::pop);
            if b.is_some() {
                pool.cached_bytes -= class;
            }
            b
        };
        let buf = match reused {
            Some(b) => b,
            None => self.create_storage(class)?,
        };
        Ok(WgpuBuffer {
            buf: Some(buf),
            class,
            dtype,
            len,
            owner: self.inner.clone(),
        })
    }

    fn copy_to_device<T: Element>(&self, src: &[T], dst: &mut WgpuBuffer) -> Result<()> {
        self.check_copy::<T>("copy_to_device", src.len(), dst)?;
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: `T` is exactly its dtype's size (checked above): f32, f16, bf16 or u32 data, so
        // its bytes may be viewed as u8 for the slice's lifetime.
        let bytes = unsafe {
            std::slice::from_raw_parts(src.as_ptr().cast::<u8>(), std::mem::size_of_val(src))
        };
        // A write from the host runs before the next submission: the work recorded so far
        // (which may read or write `dst`) goes first.
        self.flush();
        if bytes.len() % 4 == 0 {
            self.inner.queue.write_buffer(dst.raw(), 0, bytes);
        } else {
            let mut padded = bytes.to_vec();
            padded.resize(bytes.len().div_ceil(4) * 4, 0);
            self.inner.queue.write_buffer(dst.raw(), 0, &padded);
        }
        Ok(())
    }

    fn copy_from_device<T: Element>(&self, src: &WgpuBuffer, dst: &mut [T]) -> Result<()> {
        self.check_copy::<T>("copy_from_device", dst.len(), src)?;
        if dst.is_empty() {
            return Ok(());
        }
        let bytes = self.read_bytes(src)?;
        let n = std::mem::size_of_val(dst);
        // SAFETY: as in copy_to_device; every bit pattern is a valid value of these types, and
        // `bytes` holds at least `n` bytes (the padded size).
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst.as_mut_ptr().cast::<u8>(), n);
        }
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        self.check_lost()?;
        // The recorded work, or an empty submission, orders the wait after everything so far.
        let sub = self.flush().unwrap_or_else(|| self.inner.queue.submit([]));
        self.wait("synchronize", Some(sub))?;
        self.take_deferred()
    }
}
