//! Data-parallel training across processes, the `torch.distributed` way: one process per GPU,
//! rank and world size from the environment ([`env`]), the NCCL unique id exchanged over a TCP
//! rendezvous at `MASTER_ADDR:MASTER_PORT` ([`rendezvous`]), whose connections then double as
//! liveness channels, and a [`group::ProcessGroup`] that all-reduces gradients through NCCL
//! (`gpu_cuda::nccl`, loaded at run time: a machine without `libnccl` builds and runs everything
//! else, and asking for several processes there is [`DistError::NcclUnavailable`]).

pub mod env;
mod failure;
pub mod group;
pub mod rendezvous;
pub mod sync;

pub use env::DistEnv;
pub use gpu_cuda::nccl::ReduceOp;
pub use group::{ProcessGroup, BUCKET_BYTES, EXIT_DIST_FAILURE};
pub use rendezvous::{Liveness, Rendezvous, ID_BYTES};
pub use sync::{
    GradSync, NoSync, StepSync, SyncSettings, SyncStats, BUCKET_ENV, PACK_BELOW_BYTES, PACK_ENV,
};

use gpu_core::GpuError;

/// What can go wrong between processes.
#[derive(Debug, thiserror::Error)]
pub enum DistError {
    /// A `torch.distributed` environment variable is missing, malformed or inconsistent.
    #[error("{var}: {reason}")]
    Env { var: &'static str, reason: String },
    /// The TCP rendezvous failed (bind, connect, handshake).
    #[error("rendezvous at {addr}: {reason}")]
    Rendezvous { addr: String, reason: String },
    /// A peer process died or closed its connection without saying goodbye.
    #[error("rank {rank} was lost: {reason}")]
    PeerLost { rank: usize, reason: String },
    /// Something did not happen within its time limit.
    #[error("timed out after {secs:.1} s: {what}")]
    Timeout { what: String, secs: f64 },
    /// Several processes were asked for, but the NCCL library cannot be loaded.
    #[error("NCCL is not available: {0}")]
    NcclUnavailable(String),
    /// An NCCL call failed.
    #[error("NCCL {call}: {detail}")]
    Nccl { call: &'static str, detail: String },
    /// A device error underneath.
    #[error(transparent)]
    Gpu(#[from] GpuError),
}

impl From<DistError> for GpuError {
    /// A device error stays itself; the rest become [`GpuError::Cuda`] naming the collective.
    fn from(e: DistError) -> GpuError {
        match e {
            DistError::Gpu(g) => g,
            other => GpuError::Cuda {
                call: "distributed",
                detail: other.to_string(),
            },
        }
    }
}
