//! CUDA graphs of work queued on a backend's stream: [`CudaBackend::capture`] records what a
//! closure queues (kernels, cuBLAS calls, copies, memsets) into an instantiated graph, and
//! [`CudaBackend::launch_graph`] replays it with one launch, so that a sequence of many small
//! operations costs the host one call instead of one per operation.
//!
//! A graph replays the exact operations it recorded: the same buffers (their addresses), the
//! same kernel arguments. Whoever captures keeps every buffer the graph touches alive and
//! unmoved for as long as the graph lives (in practice: both in one struct), and must not
//! allocate, synchronise or read back inside the closure (the capture fails with a typed
//! error if it does). While a capture runs, other threads' work for the same backend waits at
//! its stream gate (`crate::gate`) instead of landing in the graph.
//!
//! Allocations inside the closure are allowed: the pool serves them from a private pool that
//! the graph owns (`crate::pool`), so buffers made and dropped inside the capture (a training
//! step's activations and gradients) keep their addresses reserved for the replays, and
//! nothing allocated later can alias them.

use crate::backend::CudaBackend;
use crate::error::{check, drv};
use crate::pool::{PoolInner, PoolStats};
use cudarc::driver::sys::{self, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaGraph;
use gpu_core::{GpuError, Result};
use std::sync::Arc;

/// An instantiated CUDA graph recorded on one backend instance's stream.
pub struct CapturedGraph {
    graph: CudaGraph,
    owner: u64,
    /// The memory the capture allocated or freed: reserved for the replays. Declared after
    /// `graph`, so it is released after the graph is destroyed.
    memory: Arc<PoolInner>,
}

impl CapturedGraph {
    /// The graph's private memory: `bytes_in_use` held by buffers still alive outside it,
    /// `bytes_cached` reserved for the replays (both stay allocated while the graph lives).
    pub fn memory_stats(&self) -> PoolStats {
        self.memory.stats()
    }
}

impl std::fmt::Debug for CapturedGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CapturedGraph(backend {})", self.owner)
    }
}

// SAFETY: CUDA graph objects are not internally synchronised: the driver requires that calls on
// one graph are serialised by the user. `CapturedGraph` exposes only `&self` launches through
// `CudaBackend::launch_graph`, and the graph's stream (an `Arc<CudaStream>`, itself Send + Sync)
// orders the launches; moving the handle to another thread does not touch the graph. Users that
// share one across threads hold it behind a mutex (as `rssm`'s plan cache does).
unsafe impl Send for CapturedGraph {}

impl CudaBackend {
    /// Records everything `queue` puts on this backend's stream into a graph, without running
    /// it. The stream leaves capture mode whether or not `queue` succeeds; an error from `queue`
    /// or from the capture itself (an allocation or a synchronisation inside it) is returned
    /// and nothing was run.
    pub fn capture(&self, queue: impl FnOnce(&CudaBackend) -> Result<()>) -> Result<CapturedGraph> {
        if self.gate().held_here() {
            return Err(GpuError::invalid(
                "capture",
                "a capture cannot start inside another entry point of the same backend",
            ));
        }
        // The cuBLAS handle is created (and its memory allocated) outside any capture.
        drop(self.blas()?);
        // Other threads' work for this stream waits until the capture ends (`crate::gate`).
        let _exclusive = self.gate().exclusive();
        let stream = self.stream();
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(drv("cuStreamBeginCapture"))?;
        let memory = self.memory_pool().begin_capture();
        let queued = queue(self);
        self.memory_pool().end_capture();
        let ended = stream.end_capture(CUgraphInstantiate_flags(0));
        queued?;
        let graph = ended
            .map_err(drv("cuStreamEndCapture"))?
            .ok_or_else(|| GpuError::invalid("capture", "the capture recorded no work"))?;
        let mut nodes = 0usize;
        // SAFETY: the graph is live (owned by `graph`); with a null node array the call only
        // writes the node count.
        check("cuGraphGetNodes", unsafe {
            sys::cuGraphGetNodes(graph.cu_graph(), std::ptr::null_mut(), &mut nodes)
        })?;
        if nodes == 0 {
            return Err(GpuError::invalid("capture", "the capture recorded no work"));
        }
        Ok(CapturedGraph {
            graph,
            owner: self.id(),
            memory,
        })
    }

    /// Queues one replay of `graph` on this backend's stream.
    pub fn launch_graph(&self, graph: &CapturedGraph) -> Result<()> {
        if graph.owner != self.id() {
            return Err(GpuError::invalid(
                "launch_graph",
                "the graph was captured on another backend instance",
            ));
        }
        let _pass = self.pass();
        graph.graph.launch().map_err(drv("cuGraphLaunch"))
    }
}
