//! Deferred index checks. The kernels that read ids or targets (the embedding's gather and
//! scatter-add, cross-entropy) do not wait for the host to read them first: a bad one (`>=`
//! its bound) makes that row NaN (as on CUDA) and is recorded in the launch's own slot of a
//! status ring on the device. The next call that waits for the device anyway (a download,
//! `synchronize`) reads the slots used since the last check, clears them, and reports the
//! first bad one in program order as [`GpuError::IndexOutOfRange`] naming its op. Nothing else
//! waits: a full ring (`RING` checked launches without a wait) is read by a `synchronize`.
//! A backend shared by threads reports each bad launch to the thread that queued it (at that
//! thread's next wait), never to another.

use crate::backend::{lock, WgpuBackend};
use gpu_core::backend::Backend;
use gpu_core::{GpuError, Result};
use std::thread::ThreadId;

/// Slots in the ring, two u32 words each: (bad, the largest bad value).
pub(crate) const RING: usize = 256;

/// A checked launch waiting for its check.
struct Deferred {
    op: &'static str,
    what: &'static str,
    bound: usize,
    thread: ThreadId,
}

/// The ring's device buffer (zero where no launch has recorded anything) and the launches
/// that own its first slots, in program order.
pub(crate) struct StatusRing {
    buf: wgpu::Buffer,
    pending: Vec<Deferred>,
    /// Errors read for other threads than the reader's, kept for their next wait.
    found: Vec<(ThreadId, GpuError)>,
}

impl StatusRing {
    pub(crate) fn new(device: &wgpu::Device) -> StatusRing {
        StatusRing {
            // Created zeroed (wgpu zero-initialises new buffers).
            buf: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("status ring"),
                size: (RING * 8) as u64,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            pending: Vec::with_capacity(RING),
            found: Vec::new(),
        }
    }
}

impl WgpuBackend {
    /// Runs `launch` with a slot of the status ring for one launch of `op`, whose `what` must
    /// stay below `bound`: the slot's index (a kernel parameter) and the ring to bind. The
    /// ring stays locked until the launch is recorded, so that no check reads the slot before
    /// its launch is queued. A full ring is checked first (the one wait).
    pub(crate) fn with_status_slot(
        &self,
        (op, what, bound): (&'static str, &'static str, usize),
        launch: impl FnOnce(u32, &wgpu::Buffer) -> Result<()>,
    ) -> Result<()> {
        let mut ring = self.ring();
        while ring.pending.len() >= RING {
            drop(ring);
            self.synchronize()?;
            ring = self.ring();
        }
        let thread = std::thread::current().id();
        let slot = ring.pending.len() as u32;
        let buf = ring.buf.clone();
        launch(slot, &buf)?;
        ring.pending.push(Deferred {
            op,
            what,
            bound,
            thread,
        });
        Ok(())
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, StatusRing> {
        lock(&self.inner.status)
    }

    /// Reads and clears the slots of the launches since the last check (after a wait: they
    /// have run); the error is this thread's first bad launch in program order (its later
    /// ones are dropped with it: one error a wait).
    pub(crate) fn take_deferred(&self) -> Result<()> {
        let ring = self.ring().buf.clone();
        self.read_checked(&ring, 0).map(drop)
    }

    /// The first `size` bytes of `src`, read with the slots of the launches since the last
    /// check in the same copy (cleared after a successful read; a failed one keeps them all
    /// pending); reports this thread's first bad launch as
    /// [`Self::take_deferred`] does.
    pub(crate) fn read_checked(&self, src: &wgpu::Buffer, size: u64) -> Result<Vec<u8>> {
        let me = std::thread::current().id();
        // Held throughout, so that no launch takes a slot between the read and the clear.
        let mut ring = self.ring();
        let extra = (ring.pending.len() * 8) as u64;
        let tail = ring.buf.clone();
        let mut bytes = self.read_with(src, size, Some((&tail, extra)))?;
        // Cleared only now: a read that failed (a timeout, a failed map) leaves the slots and
        // their launches pending, for the next wait to report. Recorded before any later
        // launch can take a slot (the ring is still locked).
        if extra > 0 {
            self.record(|enc| enc.clear_buffer(&tail, 0, Some(extra)));
        }
        let words = bytes.split_off(size as usize);
        let word = |i: usize| u32::from_le_bytes(words[4 * i..][..4].try_into().expect("4"));
        for (i, d) in std::mem::take(&mut ring.pending).into_iter().enumerate() {
            if word(2 * i) != 0 {
                let e = GpuError::IndexOutOfRange {
                    op: d.op,
                    what: d.what,
                    value: word(2 * i + 1),
                    bound: d.bound,
                };
                ring.found.push((d.thread, e));
            }
        }
        // The first is reported; this thread's later ones go with it (one error a wait).
        match ring.found.iter().position(|(t, _)| *t == me) {
            Some(i) => {
                let e = ring.found.remove(i).1;
                ring.found.retain(|(t, _)| *t != me);
                Err(e)
            }
            None => Ok(bytes),
        }
    }
}
