//! A caching device-memory pool.
//!
//! Freed blocks go back to a free list keyed by their rounded size instead of to the driver, so a
//! training loop that allocates the same shapes every step stops calling `cuMemAlloc` after its
//! first step. Every block is at least 256-byte aligned (the driver's guarantee), so kernels may
//! use 16-byte vector loads. On out-of-memory the pool returns its cache to the driver and retries
//! once before reporting [`GpuError::OutOfMemory`].
//!
//! Graph-safe: while a CUDA graph is captured ([`crate::CudaBackend::capture`]) the pool serves
//! from a private pool that the graph owns. Every block handed out or freed during the capture
//! (a cached block taken over, a fresh one from the driver, a block of a buffer dropped
//! meanwhile) belongs to the graph from then on: it goes back to the private pool, which never
//! serves anyone after the capture, and to the driver only when the graph and every buffer of
//! it are gone. So no later allocation can alias an address that a replay writes or reads.

use crate::error::{drv, free_bytes};
use crate::gate::Gate;
use cudarc::driver::{result, sys::CUdeviceptr, CudaContext};
use gpu_core::{BufferInfo, DType, GpuError, Result};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// What the pool has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes held by live buffers (rounded sizes).
    pub bytes_in_use: usize,
    /// The largest `bytes_in_use` seen.
    pub peak_bytes_in_use: usize,
    /// Bytes of freed blocks kept for reuse.
    pub bytes_cached: usize,
    /// Allocations served from the cache.
    pub hits: u64,
    /// Allocations that went to the driver.
    pub misses: u64,
    /// Live buffers.
    pub live_buffers: usize,
}

#[derive(Default)]
struct State {
    free: BTreeMap<usize, Vec<CUdeviceptr>>,
    stats: PoolStats,
    /// The private pool of the graph being captured, while a capture runs.
    capture: Option<Arc<PoolInner>>,
}

pub(crate) struct PoolInner {
    ctx: Arc<CudaContext>,
    /// The id of the backend instance this pool belongs to (see [`CudaBuffer::owner`]).
    owner: u64,
    /// The device's capture gate: allocations and frees wait while a graph is captured.
    gate: Arc<Gate>,
    state: Mutex<State>,
}

/// Rounds a request up to its size class: 512 B steps up to 1 MiB, then 1/8 of the next power of
/// two, so that the waste is at most 12.5% and similar sizes share blocks. `None` when the class
/// would exceed `isize::MAX` bytes (no allocation can be that large): the rounding of a request
/// above 2^63 bytes used to overflow `next_power_of_two` and divide by zero.
pub(crate) fn size_class(bytes: usize) -> Option<usize> {
    const SMALL: usize = 512;
    let class = if bytes <= 1 << 20 {
        bytes.max(1).div_ceil(SMALL) * SMALL
    } else {
        let step = bytes.checked_next_power_of_two()? / 8;
        bytes.div_ceil(step).checked_mul(step)?
    };
    (class <= isize::MAX as usize).then_some(class)
}

/// The bytes a request of `len` elements of `elem_size` bytes needs and the size class of the
/// block that serves it (`(0, 0)` for an empty request), or `None` when no block can be that
/// large. Pure arithmetic, so it is tested without a GPU.
pub(crate) fn block_size(elem_size: usize, len: usize) -> Option<(usize, usize)> {
    let requested = len.checked_mul(elem_size)?;
    if requested == 0 {
        return Some((0, 0));
    }
    Some((requested, size_class(requested)?))
}

impl PoolInner {
    /// Current statistics of this pool (shared or a graph's private one).
    pub(crate) fn stats(&self) -> PoolStats {
        self.lock().stats
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps inconsistent (no partial updates).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn release_cache(&self, st: &mut State) -> Result<()> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        for (_, ptrs) in std::mem::take(&mut st.free) {
            for p in ptrs {
                // SAFETY: `p` came from `malloc_sync` on this context and no buffer refers to it
                // (it is on the free list).
                unsafe { result::free_sync(p) }.map_err(drv("cuMemFree"))?;
            }
        }
        st.stats.bytes_cached = 0;
        Ok(())
    }
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        // cuMemFree synchronises: not during another thread's capture (gate before the lock).
        let gate = self.gate.clone();
        let _pass = gate.pass();
        let mut st = std::mem::take(&mut *self.lock());
        if let Err(e) = self.release_cache(&mut st) {
            tracing::warn!("releasing the CUDA memory pool failed: {e}");
        }
    }
}

/// The caching allocator of one [`crate::CudaBackend`].
#[derive(Clone)]
pub struct MemoryPool {
    inner: Arc<PoolInner>,
}

impl MemoryPool {
    pub(crate) fn new(ctx: Arc<CudaContext>, owner: u64, gate: Arc<Gate>) -> Self {
        Self {
            inner: Arc::new(PoolInner {
                ctx,
                owner,
                gate,
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// Starts serving from a fresh private pool (see the module doc) and returns it; the
    /// capture keeps it for its graph. Called by the capturing thread holding the gate
    /// exclusively.
    pub(crate) fn begin_capture(&self) -> Arc<PoolInner> {
        let private = Arc::new(PoolInner {
            ctx: self.inner.ctx.clone(),
            owner: self.inner.owner,
            gate: self.inner.gate.clone(),
            state: Mutex::new(State::default()),
        });
        self.inner.lock().capture = Some(private.clone());
        private
    }

    /// Whether a capture is running on this pool's backend.
    pub(crate) fn is_capturing(&self) -> bool {
        self.inner.lock().capture.is_some()
    }

    /// Stops serving from the private pool of [`MemoryPool::begin_capture`].
    pub(crate) fn end_capture(&self) {
        self.inner.lock().capture = None;
    }

    /// Allocates `len` elements of `dtype`; the contents are unspecified.
    pub(crate) fn alloc(&self, dtype: DType, len: usize) -> Result<CudaBuffer> {
        let (requested, class) =
            block_size(dtype.size_in_bytes(), len).ok_or_else(|| GpuError::OutOfMemory {
                requested: len.saturating_mul(dtype.size_in_bytes()),
                free: free_bytes(),
            })?;
        if requested == 0 {
            return Ok(CudaBuffer {
                ptr: 0,
                len: 0,
                dtype,
                class: 0,
                owner: self.inner.owner,
                pool: None,
            });
        }
        // The gate before the pool's lock (a miss allocates, a failed allocation frees the
        // cache; neither may happen during another thread's capture).
        let _pass = self.inner.gate.pass();
        let mut st = self.inner.lock();
        if let Some(private) = st.capture.clone() {
            return alloc_for_capture(&self.inner, &mut st, &private, dtype, len, requested, class);
        }
        let ptr = match take_cached(&mut st, class) {
            Some(p) => p,
            None => {
                st.stats.misses += 1;
                self.inner
                    .ctx
                    .bind_to_thread()
                    .map_err(drv("cuCtxSetCurrent"))?;
                // SAFETY: plain device allocation on the bound context; the pointer is owned by
                // the returned buffer and freed by this pool.
                match unsafe { result::malloc_sync(class) } {
                    Ok(p) => p,
                    Err(_) => {
                        self.inner.release_cache(&mut st)?;
                        // SAFETY: as above.
                        unsafe { result::malloc_sync(class) }.map_err(|_| {
                            GpuError::OutOfMemory {
                                requested,
                                free: free_bytes(),
                            }
                        })?
                    }
                }
            }
        };
        Ok(hand_out(&self.inner, &mut st, ptr, dtype, len, class))
    }

    /// Current statistics.
    pub fn stats(&self) -> PoolStats {
        self.inner.stats()
    }

    /// Returns every cached block to the driver.
    pub fn empty_cache(&self) -> Result<()> {
        let _pass = self.inner.gate.pass();
        let mut st = self.inner.lock();
        if st.capture.is_some() {
            return Err(GpuError::invalid(
                "empty_cache",
                "not during a graph capture (freeing memory would synchronise the device)",
            ));
        }
        self.inner.release_cache(&mut st)
    }
}

/// A cached block of `class` bytes, if any (counted as a hit).
fn take_cached(st: &mut State, class: usize) -> Option<CUdeviceptr> {
    let p = st.free.get_mut(&class).and_then(Vec::pop)?;
    st.stats.hits += 1;
    st.stats.bytes_cached -= class;
    Some(p)
}

/// Books a block as live in `pool` and wraps it.
fn hand_out(
    pool: &Arc<PoolInner>,
    st: &mut State,
    ptr: CUdeviceptr,
    dtype: DType,
    len: usize,
    class: usize,
) -> CudaBuffer {
    st.stats.bytes_in_use += class;
    st.stats.live_buffers += 1;
    st.stats.peak_bytes_in_use = st.stats.peak_bytes_in_use.max(st.stats.bytes_in_use);
    CudaBuffer {
        ptr,
        len,
        dtype,
        class,
        owner: pool.owner,
        pool: Some(pool.clone()),
    }
}

/// An allocation during a capture: from the private pool's cache, else a block taken over from
/// the shared cache (`st`, locked), else a fresh block from the driver. The driver call runs in
/// relaxed capture mode (as PyTorch's allocator does): `cuMemAlloc` does not touch the stream,
/// but the capture's default mode refuses it as potentially unsafe. No cache is returned to the
/// driver on failure (`cuMemFree` would synchronise inside the capture): out of memory is
/// reported as it is.
fn alloc_for_capture(
    shared: &Arc<PoolInner>,
    st: &mut State,
    private: &Arc<PoolInner>,
    dtype: DType,
    len: usize,
    requested: usize,
    class: usize,
) -> Result<CudaBuffer> {
    let mut pst = private.lock();
    let ptr = match take_cached(&mut pst, class) {
        Some(p) => p,
        None => match take_cached(st, class) {
            Some(p) => p,
            None => {
                pst.stats.misses += 1;
                shared
                    .ctx
                    .bind_to_thread()
                    .map_err(drv("cuCtxSetCurrent"))?;
                relaxed_malloc(class).map_err(|_| GpuError::OutOfMemory {
                    requested,
                    free: free_bytes(),
                })?
            }
        },
    };
    Ok(hand_out(private, &mut pst, ptr, dtype, len, class))
}

/// `cuMemAlloc` with this thread's stream-capture mode set to relaxed for the call.
fn relaxed_malloc(bytes: usize) -> std::result::Result<CUdeviceptr, ()> {
    use cudarc::driver::sys::{cuThreadExchangeStreamCaptureMode, CUresult, CUstreamCaptureMode};
    let mut mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: exchanges this thread's capture mode through a valid pointer; restored below.
    if unsafe { cuThreadExchangeStreamCaptureMode(&mut mode) } != CUresult::CUDA_SUCCESS {
        return Err(());
    }
    // SAFETY: plain device allocation on the bound context; the block is owned by the caller's
    // buffer and freed by its pool.
    let p = unsafe { result::malloc_sync(bytes) }.map_err(|_| ());
    // SAFETY: puts the previous mode back (`mode` now holds it).
    unsafe { cuThreadExchangeStreamCaptureMode(&mut mode) };
    p
}

/// Device memory from the pool; goes back to the pool on drop.
/// It records the backend instance (context, stream and pool) that allocated it; every backend
/// entry point checks that and rejects a foreign buffer with [`GpuError::ForeignBuffer`].
pub struct CudaBuffer {
    ptr: CUdeviceptr,
    len: usize,
    dtype: DType,
    class: usize,
    owner: u64,
    pool: Option<Arc<PoolInner>>,
}

impl CudaBuffer {
    /// The raw device address (0 for an empty buffer).
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The id of the backend instance that allocated this buffer ([`crate::CudaBackend::id`]).
    pub fn owner(&self) -> u64 {
        self.owner
    }
}

impl std::fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CudaBuffer({} x {} at {:#x})",
            self.len, self.dtype, self.ptr
        )
    }
}

impl BufferInfo for CudaBuffer {
    fn len(&self) -> usize {
        self.len
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            // Work already queued on the backend's one stream that reads this block runs before
            // any later work that reuses it, so no synchronisation is needed here.
            let mut st = pool.lock();
            st.stats.bytes_in_use -= self.class;
            st.stats.live_buffers -= 1;
            // During a capture the block may be in the graph (freed after its last use there):
            // it goes to the graph's private pool, never to a later allocation outside it.
            match st.capture.clone() {
                Some(private) => {
                    let mut pst = private.lock();
                    pst.free.entry(self.class).or_default().push(self.ptr);
                    pst.stats.bytes_cached += self.class;
                }
                None => {
                    st.free.entry(self.class).or_default().push(self.ptr);
                    st.stats.bytes_cached += self.class;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{block_size, size_class};

    #[test]
    fn size_classes() {
        assert_eq!(size_class(1), Some(512));
        assert_eq!(size_class(512), Some(512));
        assert_eq!(size_class(513), Some(1024));
        assert_eq!(size_class(1 << 20), Some(1 << 20));
        let big = (1 << 20) + 1;
        assert_eq!(size_class(big), Some((1 << 20) + (1 << 18)));
        for b in [3_000_000usize, 123_456_789, 1 << 33, 1 << 62] {
            let c = size_class(b).unwrap();
            assert!(c >= b && (c - b) as f64 <= b as f64 * 0.125, "{b} -> {c}");
        }
    }

    /// `Tensor::zeros(&[(1 << 61) + 1])` on CUDA panicked with "attempt to divide by zero": the
    /// 2^63 + 4 bytes rounded through an overflowing `next_power_of_two`. Every request whose
    /// bytes or size class overflow (or pass `isize::MAX`) is now `None`, which `alloc` reports
    /// as a typed out-of-memory error.
    #[test]
    fn byte_sizes_of_huge_requests_are_none_not_a_panic() {
        assert_eq!(block_size(4, (1 << 61) + 1), None);
        assert_eq!(block_size(4, usize::MAX), None);
        assert_eq!(block_size(2, usize::MAX / 2 + 1), None);
        assert_eq!(size_class((1 << 63) + 4), None);
        assert_eq!(size_class(usize::MAX), None);
        // The largest class below isize::MAX still rounds without overflow.
        assert_eq!(size_class(1 << 62), Some(1 << 62));
        assert_eq!(size_class((1 << 62) + 1), Some((1 << 62) + (1 << 60)));
        assert_eq!(size_class(isize::MAX as usize), None);
        assert_eq!(block_size(4, 0), Some((0, 0)));
        assert_eq!(block_size(4, 1000), Some((4000, 4096)));
        assert_eq!(block_size(4, 1 << 20), Some((1 << 22, 1 << 22)));
    }
}
