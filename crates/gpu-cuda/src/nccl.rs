//! NCCL collectives on a [`CudaBackend`]'s stream, through cudarc's `nccl` bindings, which load
//! `libnccl` at run time: a machine without it builds and runs everything else, and every entry
//! here first checks that the library loads ([`available`]) instead of letting cudarc panic.
//!
//! One [`NcclComm`] a process and GPU (the `torch.distributed` model). Collectives are queued on
//! the backend's stream in place on [`CudaBuffer`]s, several at once as one NCCL group, and may
//! be captured into a CUDA graph (NCCL supports stream capture once its connections are up: run
//! one collective eagerly first). [`AbortHandle`] lets a watchdog thread abort the communicator
//! (NCCL's `ncclCommAbort`, which makes pending collectives return) when a peer dies or hangs.

use crate::error::drv;
use crate::{CudaBackend, CudaBuffer};
use cudarc::driver::{CudaEvent, CudaStream};
use cudarc::nccl::sys;
use gpu_core::{BufferInfo, GpuError, Result};
use std::sync::{Arc, Mutex};

mod library;

pub use library::{available, unique_id, version, ReduceOp, ID_BYTES};
use library::{check, describe, nccl_type};

/// The communicator, shared with the [`AbortHandle`]s: `None` once aborted or destroyed. The
/// lock is held for the length of each (enqueue-only) NCCL call, so an abort never frees a
/// communicator that a call is using.
struct Shared {
    comm: Mutex<Option<Raw>>,
}

struct Raw(sys::ncclComm_t);
// SAFETY: an NCCL communicator may be used from any thread as long as calls on it are not
// concurrent; every use goes through `Shared::comm`'s lock.
unsafe impl Send for Raw {}

/// One rank's NCCL communicator on one GPU.
pub struct NcclComm {
    backend: CudaBackend,
    shared: Arc<Shared>,
    rank: usize,
    world: usize,
    /// The communication stream of [`NcclComm::all_reduce_async`], and the events that order
    /// it after the device's stream (`fork`) and the device's stream after it (`join`).
    side: Arc<CudaStream>,
    fork: CudaEvent,
    join: CudaEvent,
    /// The contiguous buffers of [`NcclComm::all_reduce_packed_async`], alive until the join.
    flat: Mutex<Vec<CudaBuffer>>,
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NcclComm(rank {} of {} on cuda:{})",
            self.rank,
            self.world,
            self.backend.info().ordinal
        )
    }
}

/// Aborts a communicator from any thread (a watchdog's): pending and later collectives of
/// that communicator fail instead of waiting for a peer that is gone.
#[derive(Clone)]
pub struct AbortHandle {
    shared: Arc<Shared>,
}

impl AbortHandle {
    /// `ncclCommAbort`, once; waits at most `wait` for a call in progress to leave the
    /// communicator. Returns whether it aborted (false: already gone, or still in use).
    pub fn abort(&self, wait: std::time::Duration) -> bool {
        let until = std::time::Instant::now() + wait;
        loop {
            if let Ok(mut g) = self.shared.comm.try_lock() {
                return match g.take() {
                    // SAFETY: the communicator is live (taken out of the shared slot under its
                    // lock, so no call is using it and nothing will again).
                    Some(raw) => {
                        let r = unsafe { sys::ncclCommAbort(raw.0) };
                        r == sys::ncclResult_t::ncclSuccess
                    }
                    None => false,
                };
            }
            if std::time::Instant::now() >= until {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}

impl NcclComm {
    /// Joins the communicator of `world` ranks named by `id` as `rank`, on `backend`'s GPU.
    /// Blocks until every rank has joined (NCCL's `ncclCommInitRank`).
    pub fn new(
        backend: &CudaBackend,
        rank: usize,
        world: usize,
        id: &[u8; ID_BYTES],
    ) -> Result<Self> {
        available()?;
        if world == 0 || rank >= world || world > i32::MAX as usize {
            return Err(GpuError::invalid(
                "NcclComm::new",
                format!("rank {rank} of a world of {world}"),
            ));
        }
        let raw_id = sys::ncclUniqueId {
            internal: id.map(|b| b as std::ffi::c_char),
        };
        backend.bind()?;
        let mut comm = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the id is a full ncclUniqueId; the device's context is
        // current on this thread (NCCL uses the current device).
        check("ncclCommInitRank", unsafe {
            sys::ncclCommInitRank(&mut comm, world as i32, raw_id, rank as i32)
        })?;
        let shared = Arc::new(Shared {
            comm: Mutex::new(Some(Raw(comm))),
        });
        let ctx = backend.context();
        // A plain stream: one at the device's highest priority measured the same (2 x H200,
        // docs/benchmarks.md).
        let made = (|| {
            Ok((
                ctx.new_stream()?,
                ctx.new_event(None)?,
                ctx.new_event(None)?,
            ))
        })();
        let (side, fork, join) = match made {
            Ok(v) => v,
            Err(e) => {
                // SAFETY: the communicator was just made and is used nowhere else.
                unsafe { sys::ncclCommDestroy(comm) };
                return Err(drv("cuStreamCreate")(e));
            }
        };
        Ok(NcclComm {
            backend: backend.clone(),
            shared,
            rank,
            world,
            side,
            fork,
            join,
            flat: Mutex::new(Vec::new()),
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world_size(&self) -> usize {
        self.world
    }

    pub fn backend(&self) -> &CudaBackend {
        &self.backend
    }

    /// A handle a watchdog thread can abort this communicator with.
    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle {
            shared: self.shared.clone(),
        }
    }

    /// An error NCCL found asynchronously (a peer that failed, a network error), if any.
    pub fn async_error(&self) -> Result<()> {
        self.with_comm("ncclCommGetAsyncError", |c| {
            let mut r = sys::ncclResult_t::ncclSuccess;
            // SAFETY: live communicator (under the lock), out-pointer to a local.
            check("ncclCommGetAsyncError", unsafe {
                sys::ncclCommGetAsyncError(c, &mut r)
            })?;
            check("a collective", r)
        })
    }

    fn with_comm<R>(
        &self,
        call: &'static str,
        f: impl FnOnce(sys::ncclComm_t) -> Result<R>,
    ) -> Result<R> {
        let g = self.shared.comm.lock().unwrap_or_else(|p| p.into_inner());
        match g.as_ref() {
            Some(raw) => f(raw.0),
            None => Err(GpuError::Cuda {
                call,
                detail: "the communicator was aborted (a peer was lost or timed out)".into(),
            }),
        }
    }

    fn stream(&self) -> sys::cudaStream_t {
        self.backend.stream().cu_stream() as sys::cudaStream_t
    }

    /// [`NcclComm::all_reduce`] queued on the communication stream after the work queued so
    /// far on the device's stream, so that the compute queued next overlaps it. The buffers
    /// must stay alive and untouched until [`NcclComm::join`] has been called (which makes the
    /// device's stream wait for every collective queued this way). Capturable.
    pub fn all_reduce_async(&self, bufs: &mut [&mut CudaBuffer], op: ReduceOp) -> Result<()> {
        self.all_reduce_on(bufs, op, true)
    }

    /// [`NcclComm::all_reduce_async`] in which the buffers of fewer than `pack_below` bytes are
    /// reduced together through one contiguous buffer (PyTorch DDP packs whole buckets so):
    /// on the communication stream they are copied into it, it is reduced with the larger
    /// buffers in one NCCL group, and it is copied back. A group of many small collectives
    /// pays each one's latency; packing the small ones costs a copy of only their bytes. The
    /// buffers must share one dtype; the contiguous buffer lives until [`NcclComm::join`].
    /// Capturable.
    pub fn all_reduce_packed_async(
        &self,
        bufs: &mut [&mut CudaBuffer],
        op: ReduceOp,
        pack_below: usize,
    ) -> Result<()> {
        const OP: &str = "NcclComm::all_reduce_packed_async";
        let views: Vec<&CudaBuffer> = bufs.iter().map(|b| &**b).collect();
        self.check_bufs(OP, &views)?;
        let Some(first) = views.first() else {
            return Ok(());
        };
        let dtype = first.dtype();
        if let Some(b) = views.iter().find(|b| b.dtype() != dtype) {
            return Err(GpuError::DTypeMismatch {
                op: OP,
                expected: dtype,
                got: b.dtype(),
            });
        }
        let (small, large): (Vec<&CudaBuffer>, Vec<&CudaBuffer>) = views
            .iter()
            .filter(|b| !b.is_empty())
            .partition(|b| b.size_in_bytes() < pack_below);
        if small.len() < 2 {
            return self.all_reduce_on(bufs, op, true);
        }
        let total: usize = small.iter().map(|b| b.len()).sum();
        let flat = gpu_core::Backend::allocate(&self.backend, dtype, total)?;
        let flat_ptr = flat.device_ptr();
        // Kept until the join from now on, also when a call below fails: the side stream may
        // already use it.
        self.flat
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(flat);
        let _pass = self.backend.pass();
        self.backend.bind()?;
        self.fork_side()?;
        let side = self.side.cu_stream();
        let copy = |into_flat: bool| -> Result<()> {
            let mut at = flat_ptr;
            for b in &small {
                let bytes = b.size_in_bytes();
                let (dst, src) = if into_flat {
                    (at, b.device_ptr())
                } else {
                    (b.device_ptr(), at)
                };
                // SAFETY: `b` is live and holds `bytes` bytes; the contiguous buffer holds the
                // small buffers' lengths summed, and this copy covers `b`'s share from `at`.
                // Both stay alive until the join (the contiguous one in `self.flat`, the
                // buffers by the caller), and the side stream runs after the work that made
                // them (the fork event).
                unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, side) }
                    .map_err(drv("cuMemcpyDtoDAsync"))?;
                at += bytes as u64;
            }
            Ok(())
        };
        copy(true)?;
        let packed = (flat_ptr, total);
        let reduce = large
            .iter()
            .map(|b| (b.device_ptr(), b.len()))
            .chain(std::iter::once(packed));
        self.with_comm("ncclAllReduce", |c| {
            self.grouped_raw(reduce, |ptr, len| {
                let p = ptr as *mut std::ffi::c_void;
                // SAFETY: a live buffer on this device of `len` elements of `dtype` (a caller's
                // or the contiguous one), kept alive until the join; in place.
                check("ncclAllReduce", unsafe {
                    sys::ncclAllReduce(
                        p,
                        p,
                        len,
                        nccl_type(dtype)?,
                        op.raw(),
                        c,
                        side as sys::cudaStream_t,
                    )
                })
            })
        })?;
        copy(false)
    }

    /// Makes the device's stream wait for every collective [`NcclComm::all_reduce_async`]
    /// queued so far.
    pub fn join(&self) -> Result<()> {
        let _pass = self.backend.pass();
        self.backend.bind()?;
        self.join.record(&self.side).map_err(drv("cuEventRecord"))?;
        self.backend
            .stream()
            .wait(&self.join)
            .map_err(drv("cuStreamWaitEvent"))?;
        // The device's stream now runs after everything that used them, and the pool hands
        // memory out in that stream's order.
        self.flat.lock().unwrap_or_else(|p| p.into_inner()).clear();
        Ok(())
    }

    /// Checks that every buffer is this device's and of an NCCL type.
    fn check_bufs(&self, op: &'static str, bufs: &[&CudaBuffer]) -> Result<()> {
        self.backend.check_owned(op, bufs)?;
        for b in bufs {
            nccl_type(b.dtype())?;
        }
        Ok(())
    }

    /// All-reduces each buffer in place with `op`, as one NCCL group, queued on the stream.
    /// Every rank must pass buffers of the same dtypes and lengths in the same order.
    pub fn all_reduce(&self, bufs: &mut [&mut CudaBuffer], op: ReduceOp) -> Result<()> {
        self.all_reduce_on(bufs, op, false)
    }

    /// Orders the communication stream after the device stream's work so far (the fork event).
    fn fork_side(&self) -> Result<()> {
        self.fork
            .record(self.backend.stream())
            .map_err(drv("cuEventRecord"))?;
        self.side.wait(&self.fork).map_err(drv("cuStreamWaitEvent"))
    }

    /// The all-reduce on the device's stream, or (`side`) on the communication stream after
    /// the device stream's work so far.
    fn all_reduce_on(&self, bufs: &mut [&mut CudaBuffer], op: ReduceOp, side: bool) -> Result<()> {
        let views: Vec<&CudaBuffer> = bufs.iter().map(|b| &**b).collect();
        self.check_bufs("NcclComm::all_reduce", &views)?;
        let _pass = self.backend.pass();
        self.backend.bind()?;
        let stream = if side {
            self.fork_side()?;
            self.side.cu_stream() as sys::cudaStream_t
        } else {
            self.stream()
        };
        self.with_comm("ncclAllReduce", |c| {
            self.grouped(&views, |b| {
                let p = b.device_ptr() as *mut std::ffi::c_void;
                // SAFETY: the buffer is live, on this communicator's device, and holds `len`
                // elements of its dtype; in place (send == receive) is allowed by NCCL. On the
                // side stream it runs after the work that made the buffers (the fork event),
                // and the caller keeps them alive until `join`.
                check("ncclAllReduce", unsafe {
                    sys::ncclAllReduce(p, p, b.len(), nccl_type(b.dtype())?, op.raw(), c, stream)
                })
            })
        })
    }

    /// Broadcasts each buffer in place from rank `root`, as one NCCL group.
    pub fn broadcast(&self, bufs: &mut [&mut CudaBuffer], root: usize) -> Result<()> {
        if root >= self.world {
            return Err(GpuError::invalid(
                "NcclComm::broadcast",
                format!("root {root} in a world of {}", self.world),
            ));
        }
        let views: Vec<&CudaBuffer> = bufs.iter().map(|b| &**b).collect();
        self.check_bufs("NcclComm::broadcast", &views)?;
        let _pass = self.backend.pass();
        self.backend.bind()?;
        let stream = self.stream();
        self.with_comm("ncclBroadcast", |c| {
            self.grouped(&views, |b| {
                let p = b.device_ptr() as *mut std::ffi::c_void;
                // SAFETY: as in `all_reduce`; in place is allowed.
                check("ncclBroadcast", unsafe {
                    sys::ncclBroadcast(p, p, b.len(), nccl_type(b.dtype())?, root as i32, c, stream)
                })
            })
        })
    }

    /// Gathers every rank's `send` into `recv` (`world × send.len()` elements, rank order).
    pub fn all_gather(&self, send: &CudaBuffer, recv: &mut CudaBuffer) -> Result<()> {
        self.check_bufs("NcclComm::all_gather", &[send, recv])?;
        if send.dtype() != recv.dtype() {
            return Err(GpuError::DTypeMismatch {
                op: "NcclComm::all_gather",
                expected: send.dtype(),
                got: recv.dtype(),
            });
        }
        let want = send.len().checked_mul(self.world);
        if want != Some(recv.len()) {
            return Err(GpuError::shape(
                "NcclComm::all_gather",
                format!("{} x {}", self.world, send.len()),
                recv.len(),
            ));
        }
        let _pass = self.backend.pass();
        self.backend.bind()?;
        let stream = self.stream();
        self.with_comm("ncclAllGather", |c| {
            // SAFETY: both buffers live on this device, sizes checked above.
            check("ncclAllGather", unsafe {
                sys::ncclAllGather(
                    send.device_ptr() as *const std::ffi::c_void,
                    recv.device_ptr() as *mut std::ffi::c_void,
                    send.len(),
                    nccl_type(send.dtype())?,
                    c,
                    stream,
                )
            })
        })
    }

    /// Runs `each` on every non-empty buffer between `ncclGroupStart` and `ncclGroupEnd`.
    fn grouped(
        &self,
        bufs: &[&CudaBuffer],
        mut each: impl FnMut(&CudaBuffer) -> Result<()>,
    ) -> Result<()> {
        self.grouped_raw(
            bufs.iter().enumerate().map(|(i, b)| (i as u64, b.len())),
            |i, _| each(bufs[i as usize]),
        )
    }

    /// Runs `each` on every (address or index, length) with a non-zero length between
    /// `ncclGroupStart` and `ncclGroupEnd`.
    fn grouped_raw(
        &self,
        items: impl IntoIterator<Item = (u64, usize)>,
        mut each: impl FnMut(u64, usize) -> Result<()>,
    ) -> Result<()> {
        // SAFETY: group calls only bracket the collectives queued below.
        check("ncclGroupStart", unsafe { sys::ncclGroupStart() })?;
        let mut first_err = None;
        for (at, len) in items.into_iter().filter(|&(_, len)| len > 0) {
            if let Err(e) = each(at, len) {
                first_err = Some(e);
                break;
            }
        }
        // SAFETY: closes the group opened above (also after a failed call, as NCCL requires).
        let end = check("ncclGroupEnd", unsafe { sys::ncclGroupEnd() });
        match first_err {
            Some(e) => Err(e),
            None => end,
        }
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        let taken = self
            .shared
            .comm
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(raw) = taken {
            let _ = self.backend.bind();
            let _pass = self.backend.pass();
            // SAFETY: the communicator is live and no longer reachable from anywhere else.
            let r = unsafe { sys::ncclCommDestroy(raw.0) };
            if r != sys::ncclResult_t::ncclSuccess {
                tracing::warn!("ncclCommDestroy: {}", describe(r));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without libnccl every entry is a typed error, never cudarc's panic; with it, the
    /// version is a 2.x code.
    #[test]
    fn entries_report_a_missing_library() {
        match available() {
            Ok(()) => {
                let v = version().unwrap();
                assert!(v >= 20000, "NCCL version code {v}");
            }
            Err(e) => {
                assert!(e.to_string().contains("libnccl"), "{e}");
                assert!(version().is_err());
                assert!(unique_id().is_err());
                println!("no libnccl here: {e}");
            }
        }
    }
}
