//! Deferred index checks. The kernels that read ids or targets (the embedding's gather and
//! scatter-add, cross-entropy) do not wait for the host to read them first: a bad one (`>=`
//! its bound) makes that row NaN (as on CUDA) and is recorded in the launch's own slot of a
//! status ring on the device. The next call that waits for the device anyway (a download,
//! `synchronize`) reads the slots used since the last check, clears them, and reports the
//! first bad one in program order as [`GpuError::IndexOutOfRange`] naming its op. Nothing else
//! waits: a full ring (`RING` checked launches without a wait) is read by a `synchronize`.

use crate::backend::WgpuBackend;
use gpu_core::backend::Backend;
use gpu_core::{GpuError, Result};

/// Slots in the ring, two u32 words each: (bad, the largest bad value).
pub(crate) const RING: usize = 256;

/// A checked launch waiting for its check.
struct Deferred {
    op: &'static str,
    what: &'static str,
    bound: usize,
}

/// The ring's device buffer (zero where no launch has recorded anything) and the launches
/// that own its first slots, in program order.
pub(crate) struct StatusRing {
    buf: wgpu::Buffer,
    pending: Vec<Deferred>,
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
        }
    }
}

impl WgpuBackend {
    /// A slot of the status ring for one launch of `op`, whose `what` must stay below
    /// `bound`: the slot's index (a kernel parameter) and the ring to bind. A full ring is
    /// checked first (the one wait).
    pub(crate) fn status_slot(
        &self,
        op: &'static str,
        what: &'static str,
        bound: usize,
    ) -> Result<(u32, wgpu::Buffer)> {
        let full = self.ring().pending.len() >= RING;
        if full {
            self.synchronize()?;
        }
        let mut ring = self.ring();
        ring.pending.push(Deferred { op, what, bound });
        Ok(((ring.pending.len() - 1) as u32, ring.buf.clone()))
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, StatusRing> {
        self.inner.status.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads and clears the slots of the launches since the last check (after a wait: they
    /// have run); the first bad one, in program order, is the error.
    pub(crate) fn take_deferred(&self) -> Result<()> {
        // Held throughout, so that no launch takes a slot between the read and the clear.
        let mut ring = self.ring();
        if ring.pending.is_empty() {
            return Ok(());
        }
        let bytes = (ring.pending.len() * 8) as u64;
        let words = self.read_raw(&ring.buf, bytes)?;
        let buf = ring.buf.clone();
        self.record(|enc| enc.clear_buffer(&buf, 0, Some(bytes)));
        let pending = std::mem::take(&mut ring.pending);
        let word = |i: usize| u32::from_le_bytes(words[4 * i..4 * i + 4].try_into().expect("4"));
        match pending.iter().enumerate().find(|(i, _)| word(2 * i) != 0) {
            Some((i, d)) => Err(GpuError::IndexOutOfRange {
                op: d.op,
                what: d.what,
                value: word(2 * i + 1),
                bound: d.bound,
            }),
            None => Ok(()),
        }
    }
}
