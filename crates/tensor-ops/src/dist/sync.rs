//! [`StepSync`]: what a training step does between its backward pass and its optimiser across
//! processes, and [`GradSync`], PyTorch DDP's scheme on a [`ProcessGroup`]: each gradient joins
//! a bucket the moment the backward pass has finished it; a full bucket (about
//! [`BUCKET_BYTES`]) is averaged across the ranks by NCCL on a communication stream while the
//! pass goes on, its small gradients (below [`PACK_BELOW_BYTES`]: biases, LayerNorm weights)
//! packed into one buffer so that they make one collective; the step's end waits for the last
//! bucket (and the loss, averaged with it). `docs/multi-gpu.md` gives the measured effect of
//! each setting.

use super::env::env_var;
use super::group::{ProcessGroup, BUCKET_BYTES};
use super::DistError;
use crate::storage::Storage;
use crate::tensor::Tensor;
use gpu_core::Result;
use gpu_cuda::nccl::ReduceOp;
use std::ops::RangeInclusive;
use std::sync::{Arc, RwLockWriteGuard};

/// Hooks of a training step (see `models::gpt::GraphedStep::capture_synced`).
pub trait StepSync {
    /// `param`'s gradient `grad` is final; it may be replaced (see [`Tensor::backward_with`]).
    fn grad_ready(&mut self, param: &Tensor, grad: &mut Tensor) -> Result<()>;
    /// The backward pass is done: whatever was started must be complete, as far as the
    /// device's stream is concerned, when this returns; `loss` (the step's loss, detached) is
    /// averaged with the gradients.
    fn finish(&mut self, loss: &Tensor) -> Result<()>;
}

/// A single process: nothing to do.
pub struct NoSync;

impl StepSync for NoSync {
    fn grad_ready(&mut self, _: &Tensor, _: &mut Tensor) -> Result<()> {
        Ok(())
    }
    fn finish(&mut self, _: &Tensor) -> Result<()> {
        Ok(())
    }
}

/// Bucketed, overlapped gradient averaging over a [`ProcessGroup`] (a no-op in a group of one).
/// Every rank must run the same graph, so that the buckets match.
pub struct GradSync<'a> {
    pg: &'a ProcessGroup,
    bucket: Vec<Tensor>,
    bytes: usize,
    /// The buckets queued on the communication stream: alive until the join.
    queued: Vec<Tensor>,
    /// Averaged with the gradients (off: a sum, for tests of the plumbing).
    op: ReduceOp,
    /// Bytes a bucket ([`SyncSettings::bucket_bytes`]).
    limit: usize,
    /// Gradients of fewer bytes are packed into one buffer for their all-reduce
    /// ([`gpu_cuda::nccl::NcclComm::all_reduce_packed_async`]); 0: none.
    pack_below: usize,
    stats: SyncStats,
}

/// What a [`GradSync`] has queued so far (over every pass it served).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncStats {
    /// Buckets handed to NCCL (one NCCL group a dtype in each).
    pub buckets: usize,
    /// Tensors averaged (gradients and losses).
    pub tensors: usize,
    /// Their bytes.
    pub bytes: usize,
    /// Gradients copied first because their storage was shared ([`StepSync::grad_ready`]).
    pub copied: usize,
    /// The copies' bytes.
    pub copied_bytes: usize,
}

/// The environment variable that sets [`GradSync`]'s bucket size in MiB (1–1024, default 25).
pub const BUCKET_ENV: &str = "HYBRID_BUCKET_MIB";

/// The environment variable that sets below how many KiB a gradient is packed with the
/// bucket's other small ones for the all-reduce (0–1048576, default 1024; 0: none).
pub const PACK_ENV: &str = "HYBRID_PACK_BELOW_KIB";

/// Gradients below this size are reduced packed together: the biases and LayerNorm weights.
pub const PACK_BELOW_BYTES: usize = 1 << 20;

/// How [`GradSync`] groups the gradients: read once from the environment when a
/// [`ProcessGroup`] of several ranks starts, so that a malformed value stops the job before it
/// trains (and every rank reads the same, as the launcher passes its environment on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncSettings {
    /// Bytes a bucket ([`BUCKET_ENV`]).
    pub bucket_bytes: usize,
    /// Gradients of fewer bytes are packed ([`PACK_ENV`]); 0: none.
    pub pack_below: usize,
}

impl Default for SyncSettings {
    fn default() -> Self {
        SyncSettings {
            bucket_bytes: BUCKET_BYTES,
            pack_below: PACK_BELOW_BYTES,
        }
    }
}

impl SyncSettings {
    /// [`BUCKET_ENV`] and [`PACK_ENV`], defaults where unset.
    pub fn from_env() -> Result<SyncSettings, DistError> {
        SyncSettings::parse(
            env_var(BUCKET_ENV)?.as_deref(),
            env_var(PACK_ENV)?.as_deref(),
        )
    }

    /// The settings from the two variables' values (`None`: unset).
    pub fn parse(
        bucket_mib: Option<&str>,
        pack_kib: Option<&str>,
    ) -> Result<SyncSettings, DistError> {
        let number = |var: &'static str, v: &str, range: RangeInclusive<usize>| {
            v.trim()
                .parse::<usize>()
                .ok()
                .filter(|n| range.contains(n))
                .ok_or_else(|| DistError::Env {
                    var,
                    reason: format!(
                        "{v:?} is not a whole number in {}..={}",
                        range.start(),
                        range.end()
                    ),
                })
        };
        let mut s = SyncSettings::default();
        if let Some(v) = bucket_mib {
            s.bucket_bytes = number(BUCKET_ENV, v, 1..=1024)? << 20;
        }
        if let Some(v) = pack_kib {
            s.pack_below = number(PACK_ENV, v, 0..=1 << 20)? << 10;
        }
        Ok(s)
    }
}

impl<'a> GradSync<'a> {
    pub fn new(pg: &'a ProcessGroup) -> GradSync<'a> {
        GradSync {
            pg,
            bucket: Vec::new(),
            bytes: 0,
            queued: Vec::new(),
            op: ReduceOp::Avg,
            limit: pg.sync_settings().bucket_bytes,
            pack_below: pg.sync_settings().pack_below,
            stats: SyncStats::default(),
        }
    }

    /// What was queued so far.
    pub fn stats(&self) -> SyncStats {
        self.stats
    }

    fn flush(&mut self) -> Result<()> {
        if self.bucket.is_empty() {
            return Ok(());
        }
        let Some(comm) = self.pg.comm() else {
            self.bucket.clear();
            return Ok(());
        };
        if self.pack_below > 0 {
            // Per dtype (a bucket normally holds one).
            // In order of first appearance, the same on every rank.
            let mut dtypes = Vec::new();
            for t in &self.bucket {
                if !dtypes.contains(&t.dtype()) {
                    dtypes.push(t.dtype());
                }
            }
            for dtype in dtypes {
                let mut guards: Vec<RwLockWriteGuard<'_, Storage>> = self
                    .bucket
                    .iter()
                    .filter(|t| t.dtype() == dtype)
                    .map(|t| t.write())
                    .collect();
                let mut bufs = super::group::cuda_bufs(&mut guards)?;
                comm.all_reduce_packed_async(&mut bufs, self.op, self.pack_below)?;
            }
        } else {
            let mut guards: Vec<RwLockWriteGuard<'_, Storage>> =
                self.bucket.iter().map(|t| t.write()).collect();
            let mut bufs = super::group::cuda_bufs(&mut guards)?;
            comm.all_reduce_async(&mut bufs, self.op)?;
        }
        self.stats.buckets += 1;
        self.stats.tensors += self.bucket.len();
        self.stats.bytes = self.stats.bytes.saturating_add(self.bytes);
        self.queued.append(&mut self.bucket);
        self.bytes = 0;
        Ok(())
    }

    /// Whether `t`'s storage is already in a bucket.
    fn held(&self, t: &Tensor) -> bool {
        self.bucket
            .iter()
            .chain(&self.queued)
            .any(|u| Arc::ptr_eq(&u.0.storage, &t.0.storage))
    }
}

impl StepSync for GradSync<'_> {
    fn grad_ready(&mut self, _param: &Tensor, grad: &mut Tensor) -> Result<()> {
        if self.pg.comm().is_none() {
            return Ok(());
        }
        // Changed in place on another stream while the pass goes on: it must be this
        // gradient's alone (an op may hand the same tensor to two inputs).
        if Arc::strong_count(&grad.0) > 1
            || Arc::strong_count(&grad.0.storage) > 1
            || self.held(grad)
        {
            *grad = grad.mul_scalar(1.0)?;
            self.stats.copied += 1;
            self.stats.copied_bytes = self.stats.copied_bytes.saturating_add(bytes(grad));
        }
        self.bytes = self.bytes.saturating_add(bytes(grad));
        self.bucket.push(grad.clone());
        if self.bytes >= self.limit {
            self.flush()?;
        }
        Ok(())
    }

    fn finish(&mut self, loss: &Tensor) -> Result<()> {
        let Some(comm) = self.pg.comm() else {
            return Ok(());
        };
        if !self.held(loss) {
            self.bytes = self.bytes.saturating_add(bytes(loss));
            self.bucket.push(loss.clone());
        }
        self.flush()?;
        comm.join()?;
        self.queued.clear();
        Ok(())
    }
}

fn bytes(t: &Tensor) -> usize {
    t.numel().saturating_mul(t.dtype().size_in_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_default_where_unset_and_read_whole_numbers() {
        assert_eq!(
            SyncSettings::parse(None, None).unwrap(),
            SyncSettings::default()
        );
        let s = SyncSettings::parse(Some(" 1024 "), Some("0")).unwrap();
        assert_eq!(s.bucket_bytes, 1 << 30);
        assert_eq!(s.pack_below, 0);
        let s = SyncSettings::parse(Some("1"), Some("1048576")).unwrap();
        assert_eq!((s.bucket_bytes, s.pack_below), (1 << 20, 1 << 30));
    }

    /// A malformed or out-of-range value is a typed error naming the variable, never a silent
    /// default.
    #[test]
    fn malformed_settings_are_errors_naming_the_variable() {
        for (bucket, pack, var) in [
            (Some("abc"), None, BUCKET_ENV),
            (Some("0"), None, BUCKET_ENV),
            (Some("1025"), None, BUCKET_ENV),
            (Some("-1"), None, BUCKET_ENV),
            (Some(""), None, BUCKET_ENV),
            (Some("2.5"), None, BUCKET_ENV),
            (Some("99999999999999999999999"), None, BUCKET_ENV),
            (None, Some("1048577"), PACK_ENV),
            (None, Some("one"), PACK_ENV),
            (None, Some("18446744073709551615"), PACK_ENV),
        ] {
            match SyncSettings::parse(bucket, pack) {
                Err(DistError::Env { var: v, reason }) => {
                    assert_eq!(v, var, "{bucket:?} {pack:?}: {reason}");
                }
                other => panic!("{bucket:?} {pack:?}: {other:?}"),
            }
        }
    }
}
