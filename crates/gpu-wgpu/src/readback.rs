//! Asynchronous read-back: [`WgpuBackend::read_async`] queues a buffer's copy to the host and
//! returns at once with a [`ReadBack`]; the host goes on queueing work while the device
//! catches up, and takes the values when [`ReadBack::is_ready`] says so or [`ReadBack::wait`]
//! blocks for them. (`Backend::download` is the same read, waited for at once, with the index checks read in
//! the same copy: `read_bytes`.)

use crate::backend::{check_element_size, WgpuBackend};
use crate::buffer::WgpuBuffer;
use crate::error::WgpuError;
use gpu_core::backend::{check_transfer, BufferInfo};
use gpu_core::{Element, Result};
use std::marker::PhantomData;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A buffer's values on their way to the host (see the module's doc).
pub struct ReadBack<T: Element> {
    backend: WgpuBackend,
    staging: Option<wgpu::Buffer>,
    done: mpsc::Receiver<std::result::Result<(), wgpu::BufferAsyncError>>,
    mapped: Option<std::result::Result<(), wgpu::BufferAsyncError>>,
    len: usize,
    _t: PhantomData<T>,
}

impl WgpuBackend {
    /// Reads a buffer's padded bytes back to the host (map a staging buffer, bounded wait),
    /// with the index checks of the work queued before it read in the same copy and
    /// reported (`take_deferred`'s, without its second wait).
    pub(crate) fn read_bytes(&self, src: &WgpuBuffer) -> Result<Vec<u8>> {
        self.read_checked(src.raw(), src.padded_bytes())
    }

    /// Reads `size` bytes of `src` and, behind them in one staging buffer, the first `extra`
    /// bytes of `tail`'s buffer (one submission and one wait for both). Nothing is changed on
    /// the device: a caller that consumes the tail clears it once the read has succeeded.
    pub(crate) fn read_with(
        &self,
        src: &wgpu::Buffer,
        size: u64,
        tail: Option<(&wgpu::Buffer, u64)>,
    ) -> Result<Vec<u8>> {
        let extra = tail.map_or(0, |(_, n)| n);
        if size + extra == 0 {
            return Ok(Vec::new());
        }
        let staging = self.inner.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("staging"),
            size: size + extra,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.record(|enc| {
            if size > 0 {
                enc.copy_buffer_to_buffer(src, 0, &staging, 0, size);
            }
            if let Some((t, n)) = tail.filter(|&(_, n)| n > 0) {
                enc.copy_buffer_to_buffer(t, 0, &staging, size, n);
            }
        });
        let sub = self.flush();
        let slice = staging.slice(..);
        let (tx, rx) = mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        let start = Instant::now();
        self.wait("copy_from_device", sub)?;
        // The callback runs inside poll; a short grace period covers a late one.
        let left = self.inner.timeout.saturating_sub(start.elapsed());
        loop {
            match rx.try_recv() {
                Ok(Ok(())) => break,
                Ok(Err(e)) => {
                    self.check_lost()?;
                    return Err(WgpuError::Call {
                        call: "map_async",
                        detail: e.to_string(),
                    }
                    .into());
                }
                Err(_) if start.elapsed() > left + Duration::from_millis(1) => {
                    return Err(WgpuError::Timeout {
                        op: "copy_from_device",
                        waited_ms: start.elapsed().as_millis() as u64,
                    }
                    .into())
                }
                Err(_) => {
                    let _ = self.inner.device.poll(wgpu::PollType::Poll);
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        let bytes = slice
            .get_mapped_range()
            .map_err(|e| WgpuError::Call {
                call: "get_mapped_range",
                detail: e.to_string(),
            })?
            .to_vec();
        staging.unmap();
        staging.destroy();
        Ok(bytes)
    }

    /// Queues the copy of `src` to the host and returns without waiting (the copy is
    /// submitted, so the device starts on it). Checked as a download: `T` must be `src`'s
    /// dtype.
    pub fn read_async<T: Element>(&self, src: &WgpuBuffer) -> Result<ReadBack<T>> {
        check_transfer::<T>("read_async", src.len(), src)?;
        check_element_size::<T>("read_async")?;
        self.check_owner("read_async", src)?;
        self.check_lost()?;
        let (tx, done) = mpsc::channel();
        let size = src.padded_bytes();
        let staging = (size > 0).then(|| {
            let staging = self.inner.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("read_async"),
                size,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            self.record(|enc| enc.copy_buffer_to_buffer(src.raw(), 0, &staging, 0, size));
            self.flush();
            staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
                let _ = tx.send(r);
            });
            staging
        });
        Ok(ReadBack {
            backend: self.clone(),
            mapped: staging.is_none().then_some(Ok(())),
            staging,
            done,
            len: src.len(),
            _t: PhantomData,
        })
    }
}

impl<T: Element> ReadBack<T> {
    /// Whether the values have arrived (polls the device; never blocks).
    pub fn is_ready(&mut self) -> bool {
        if self.mapped.is_none() {
            let _ = self.backend.inner.device.poll(wgpu::PollType::Poll);
            self.mapped = self.done.try_recv().ok();
        }
        self.mapped.is_some()
    }

    /// The values, waiting for them (at most the backend's poll timeout). The index checks of
    /// the work queued before the read are reported here, as by a download.
    pub fn wait(mut self) -> Result<Vec<T>> {
        let start = Instant::now();
        while !self.is_ready() {
            self.backend.check_lost()?;
            if start.elapsed() > self.backend.inner.timeout {
                return Err(WgpuError::Timeout {
                    op: "read_async",
                    waited_ms: start.elapsed().as_millis() as u64,
                }
                .into());
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        if let Some(Err(e)) = self.mapped.take() {
            self.backend.check_lost()?;
            return Err(WgpuError::Call {
                call: "map_async",
                detail: e.to_string(),
            }
            .into());
        }
        self.backend.take_deferred()?;
        let mut out = vec![T::default(); self.len];
        if let Some(staging) = self.staging.take() {
            let view = staging
                .slice(..)
                .get_mapped_range()
                .map_err(|e| WgpuError::Call {
                    call: "get_mapped_range",
                    detail: e.to_string(),
                })?;
            let n = std::mem::size_of_val(&out[..]);
            // SAFETY: `T` is exactly its dtype's size (check_element_size in read_async), every bit pattern is a valid value of the element types, and the mapped
            // range holds the buffer's padded bytes, at least `n`.
            unsafe {
                std::ptr::copy_nonoverlapping(view.as_ptr(), out.as_mut_ptr().cast::<u8>(), n);
            }
            drop(view);
            staging.unmap();
            staging.destroy();
        }
        Ok(out)
    }
}

impl<T: Element> Drop for ReadBack<T> {
    fn drop(&mut self) {
        // Not waited for: the mapping is dropped with the buffer.
        if let Some(s) = self.staging.take() {
            s.destroy();
        }
    }
}
