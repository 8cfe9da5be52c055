//! Timing device work with CUDA events.

use crate::backend::CudaBackend;
use crate::error::drv;
use cudarc::driver::{sys::CUevent_flags, CudaEvent};
use gpu_core::Result;

/// A pair of timing events on the backend's stream.
pub struct GpuTimer {
    start: CudaEvent,
    stop: CudaEvent,
}

impl GpuTimer {
    /// Creates the two events.
    pub fn new(backend: &CudaBackend) -> Result<Self> {
        let ctx = backend.context();
        let make = || {
            ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(drv("cuEventCreate"))
        };
        Ok(Self {
            start: make()?,
            stop: make()?,
        })
    }

    /// Records the start on the stream.
    pub fn start(&self, backend: &CudaBackend) -> Result<()> {
        let _pass = backend.pass();
        self.start
            .record(backend.stream())
            .map_err(drv("cuEventRecord"))
    }

    /// Records the stop, waits for it, and returns the elapsed milliseconds.
    pub fn stop(&self, backend: &CudaBackend) -> Result<f32> {
        let _pass = backend.pass();
        self.stop
            .record(backend.stream())
            .map_err(drv("cuEventRecord"))?;
        self.stop.synchronize().map_err(drv("cuEventSynchronize"))?;
        self.start
            .elapsed_ms(&self.stop)
            .map_err(drv("cuEventElapsedTime"))
    }

    /// Times `f` (which queues work on the backend's stream) and returns milliseconds.
    pub fn time(&self, backend: &CudaBackend, f: impl FnOnce() -> Result<()>) -> Result<f32> {
        self.start(backend)?;
        f()?;
        self.stop(backend)
    }
}
