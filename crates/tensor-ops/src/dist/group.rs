//! [`ProcessGroup`]: this process's place among the data-parallel ranks, and the collectives a
//! training loop needs — averaging gradients, broadcasting parameters from rank 0, checking
//! that every rank holds the same parameters — on NCCL, with the failure handling of a serious
//! trainer: a peer that dies is noticed through the rendezvous connections, a peer that hangs
//! through a step that does not complete within the timeout, and either way this process
//! aborts its NCCL communicator and exits with [`EXIT_DIST_FAILURE`] and a message saying
//! which, instead of waiting forever.

use super::{DistEnv, DistError, Liveness, Rendezvous, SyncSettings};
use crate::backend::cuda_backend;
use crate::storage::Storage;
use crate::tensor::Tensor;
use cudarc::driver::CudaEvent;
use gpu_core::{DType, Device};
use gpu_cuda::nccl::{self, NcclComm, ReduceOp};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLockWriteGuard};
use std::time::{Duration, Instant};

use super::failure::{abort_within, fail};
pub use super::failure::{ABORT_WAIT, EXIT_DIST_FAILURE};

/// Gradients are all-reduced in groups of about this many bytes (PyTorch DDP's default
/// bucket is 25 MiB): one NCCL group each.
pub const BUCKET_BYTES: usize = 25 << 20;

/// One rank of a data-parallel job (or the only one: [`ProcessGroup::single`]).
pub struct ProcessGroup {
    rank: usize,
    world: usize,
    device: Device,
    multi: Option<Multi>,
    /// How [`super::GradSync`] buckets the gradients (read from the environment at `init`).
    sync: SyncSettings,
}

struct Multi {
    comm: NcclComm,
    liveness: Option<Liveness>,
    /// Work the watchdog waits for: an event recorded at the end of a step, and when.
    fences: Arc<Mutex<VecDeque<(CudaEvent, u64)>>>,
    /// The watchdog's clock (milliseconds since the group started, from 1).
    t0: Instant,
    stop: Arc<AtomicBool>,
}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ProcessGroup(rank {} of {} on {})",
            self.rank, self.world, self.device
        )
    }
}

impl ProcessGroup {
    /// A group of one: every collective is the identity.
    pub fn single(device: Device) -> ProcessGroup {
        ProcessGroup {
            rank: 0,
            world: 1,
            device,
            multi: None,
            sync: SyncSettings::default(),
        }
    }

    /// How [`super::GradSync`] buckets this group's gradients ([`SyncSettings::from_env`] for
    /// several ranks, the defaults for one).
    pub fn sync_settings(&self) -> SyncSettings {
        self.sync
    }

    /// Joins the job the environment describes ([`DistEnv`]), or a group of one when it
    /// describes none. Several ranks need a CUDA `device` (`cuda:LOCAL_RANK`, one GPU a
    /// process) and NCCL; the rendezvous must finish within `timeout`, and so must every later
    /// step ([`ProcessGroup::fence`]) once it is queued. NCCL's own set-up
    /// (`ncclCommInitRank`, between the two) is not bounded here: a peer that hangs inside it
    /// is not caught.
    pub fn from_env(device: Device, timeout: Duration) -> Result<ProcessGroup, DistError> {
        match DistEnv::from_env()? {
            Some(env) if env.world_size > 1 => ProcessGroup::init(&env, device, timeout),
            _ => Ok(ProcessGroup::single(device)),
        }
    }

    /// Joins the job of `env` on `device` (see [`ProcessGroup::from_env`]).
    pub fn init(
        env: &DistEnv,
        device: Device,
        timeout: Duration,
    ) -> Result<ProcessGroup, DistError> {
        if env.world_size == 1 {
            return Ok(ProcessGroup::single(device));
        }
        let Device::Cuda(ordinal) = device else {
            return Err(DistError::Env {
                var: "WORLD_SIZE",
                reason: format!(
                    "{} ranks need one CUDA device each, this one was given {device}",
                    env.world_size
                ),
            });
        };
        if ordinal != env.local_rank {
            tracing::warn!(
                "rank {} runs on cuda:{ordinal}, not cuda:LOCAL_RANK = cuda:{}",
                env.rank,
                env.local_rank
            );
        }
        let sync = SyncSettings::from_env()?;
        nccl::available().map_err(|e| DistError::NcclUnavailable(e.to_string()))?;
        let backend = cuda_backend(ordinal)?;
        let mut rdv = Rendezvous::connect(env, timeout)?;
        let id = if env.rank == 0 {
            Some(nccl::unique_id().map_err(nccl_err("ncclGetUniqueId"))?)
        } else {
            None
        };
        let id = rdv.broadcast_id(id, timeout)?;
        let comm = NcclComm::new(&backend, env.rank, env.world_size, &id)
            .map_err(nccl_err("ncclCommInitRank"))?;
        let abort = comm.abort_handle();
        let rank = env.rank;
        let liveness = rdv.watch(move |e: DistError| fail(rank, &abort, &e.to_string()));
        let group = ProcessGroup {
            rank,
            world: env.world_size,
            device,
            multi: Some(Multi {
                comm,
                liveness: Some(liveness),
                fences: Arc::default(),
                t0: Instant::now(),
                stop: Arc::default(),
            }),
            sync,
        };
        group.start_watchdog(timeout);
        // One collective now, so that NCCL's connections are up before any CUDA graph capture
        // and a broken set-up shows here.
        let probe = Tensor::from_vec(vec![1.0f32], &[1], device)?;
        group.all_reduce(&[&probe], ReduceOp::Sum)?;
        let got = probe.to_vec()?[0];
        if got != env.world_size as f32 {
            return Err(DistError::Nccl {
                call: "ncclAllReduce",
                detail: format!(
                    "the set-up sum came back {got}, expected {}",
                    env.world_size
                ),
            });
        }
        Ok(group)
    }

    /// Two threads that end the job when a step recorded by [`ProcessGroup::fence`] has not
    /// completed `timeout` after it could start (a peer that hangs inside a collective). The
    /// prober asks the device which steps are done (`cuEventQuery`) and publishes, in atomics,
    /// when it last answered and since when the oldest pending step waits; the watchdog reads
    /// only those, so it fires even when the driver blocks the prober's query behind the main
    /// thread's wait for the stuck step.
    fn start_watchdog(&self, timeout: Duration) {
        let Some(m) = &self.multi else { return };
        let (fences, stop, abort) = (m.fences.clone(), m.stop.clone(), m.comm.abort_handle());
        let ctx = m.comm.backend().context().clone();
        let rank = self.rank;
        let t0 = m.t0;
        let ms = move || t0.elapsed().as_millis() as u64 + 1;
        // When the prober last finished a pass, and since when the front step waits (0: none).
        let answered = Arc::new(AtomicU64::new(ms()));
        let waiting = Arc::new(AtomicU64::new(0));
        let (ans, wait, stop_p) = (answered.clone(), waiting.clone(), stop.clone());
        let prober_abort = abort.clone();
        std::thread::spawn(move || {
            if let Err(e) = ctx.bind_to_thread() {
                tracing::warn!("rank {rank}: the step watchdog is off: {e:?}");
                ans.store(u64::MAX, Ordering::Relaxed);
                return;
            }
            // A step's wait starts when it was queued or when the one before it completed,
            // whichever is later: a host far ahead of its GPU does not count as a hang.
            let mut last_done = ms();
            while !stop_p.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
                let mut q = fences.lock().unwrap_or_else(|p| p.into_inner());
                let mut front = 0;
                while let Some((ev, queued)) = q.front() {
                    match ev.try_is_complete() {
                        Ok(true) => {
                            q.pop_front();
                            last_done = ms();
                        }
                        Ok(false) => {
                            front = (*queued).max(last_done);
                            break;
                        }
                        Err(e) => {
                            let why = format!("the device reported {e:?} in a step");
                            drop(q);
                            fail(rank, &prober_abort, &why);
                        }
                    }
                }
                wait.store(front, Ordering::Relaxed);
                ans.store(ms(), Ordering::Relaxed);
            }
        });
        let limit = timeout.as_millis() as u64;
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                let now = ms();
                let front = waiting.load(Ordering::Relaxed);
                let silent = now.saturating_sub(answered.load(Ordering::Relaxed));
                let why = if front > 0 && now.saturating_sub(front) > limit {
                    format!("a step has waited {:.1} s", (now - front) as f64 / 1e3)
                } else if silent > limit {
                    format!(
                        "the device has not answered for {:.1} s",
                        silent as f64 / 1e3
                    )
                } else {
                    continue;
                };
                fail(
                    rank,
                    &abort,
                    &format!(
                        "{why} and has not completed (timeout {:.1} s): another rank hangs or is gone",
                        timeout.as_secs_f64()
                    ),
                );
            }
        });
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world_size(&self) -> usize {
        self.world
    }

    /// Rank 0: the one that logs, evaluates and writes checkpoints.
    pub fn is_main(&self) -> bool {
        self.rank == 0
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// The NCCL communicator (none in a group of one).
    pub fn comm(&self) -> Option<&NcclComm> {
        self.multi.as_ref().map(|m| &m.comm)
    }

    /// Marks the end of a queued step for the hang watchdog (cheap: one event).
    pub fn fence(&self) -> Result<(), DistError> {
        let Some(m) = &self.multi else { return Ok(()) };
        let ev = m.comm.backend().stream().record_event(None).map_err(|e| {
            DistError::Gpu(gpu_core::GpuError::Cuda {
                call: "cuEventRecord",
                detail: gpu_cuda::describe_driver_error(&e),
            })
        })?;
        m.fences
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back((ev, m.t0.elapsed().as_millis() as u64 + 1));
        Ok(())
    }

    /// Reduces every tensor in place across the ranks (every rank passes tensors of the same
    /// shapes in the same order), in buckets of about [`BUCKET_BYTES`], each one NCCL group,
    /// queued on the device's stream (capturable in a CUDA graph). Tensors sharing storage are
    /// reduced once.
    pub fn all_reduce(&self, tensors: &[&Tensor], op: ReduceOp) -> Result<(), DistError> {
        self.each_bucket("all_reduce", tensors, |comm, bufs| {
            comm.all_reduce(bufs, op).map_err(nccl_err("ncclAllReduce"))
        })
    }

    /// Runs `f` on the CUDA buffers of each bucket of `tensors` (distinct storages, in order,
    /// about [`BUCKET_BYTES`] each), write-locked; a no-op in a group of one.
    fn each_bucket(
        &self,
        op: &'static str,
        tensors: &[&Tensor],
        mut f: impl FnMut(&NcclComm, &mut [&mut gpu_cuda::CudaBuffer]) -> Result<(), DistError>,
    ) -> Result<(), DistError> {
        let Some(m) = &self.multi else { return Ok(()) };
        self.check_tensors(op, tensors)?;
        for bucket in buckets(&unique(tensors)) {
            let mut guards: Vec<RwLockWriteGuard<'_, Storage>> =
                bucket.iter().map(|t| t.write()).collect();
            let mut bufs = cuda_bufs(&mut guards)?;
            f(&m.comm, &mut bufs)?;
        }
        Ok(())
    }

    /// Averages the tensors (gradients) across the ranks in place: [`ReduceOp::Avg`].
    pub fn all_reduce_mean(&self, tensors: &[&Tensor]) -> Result<(), DistError> {
        self.all_reduce(tensors, ReduceOp::Avg)
    }

    /// Overwrites every tensor with rank `root`'s values.
    pub fn broadcast(&self, tensors: &[&Tensor], root: usize) -> Result<(), DistError> {
        self.each_bucket("broadcast", tensors, |comm, bufs| {
            comm.broadcast(bufs, root)
                .map_err(nccl_err("ncclBroadcast"))
        })
    }

    /// A checksum of the tensors' bits (FNV-1a over their values in order), checked equal on
    /// every rank: an error naming the ranks that differ from rank 0 otherwise. Returns it.
    pub fn check_identical(&self, tensors: &[&Tensor]) -> Result<u64, DistError> {
        let sum = checksum(tensors)?;
        let Some(m) = &self.multi else { return Ok(sum) };
        let mine = Tensor::from_vec(vec![sum as u32, (sum >> 32) as u32], &[2], self.device)?;
        let all = Tensor::from_vec(vec![0u32; 2 * self.world], &[2 * self.world], self.device)?;
        {
            let (s, mut r) = (mine.read(), all.write());
            let (Storage::Cuda(s), Storage::Cuda(r)) = (&*s, &mut *r) else {
                return Err(not_cuda("check_identical"));
            };
            m.comm.all_gather(s, r).map_err(nccl_err("ncclAllGather"))?;
        }
        let words = all.to_vec_u32()?;
        let sums: Vec<u64> = words
            .chunks(2)
            .map(|w| w[0] as u64 | (w[1] as u64) << 32)
            .collect();
        let differ: Vec<usize> = (0..self.world).filter(|&r| sums[r] != sums[0]).collect();
        if differ.is_empty() {
            Ok(sum)
        } else {
            Err(DistError::Nccl {
                call: "check_identical",
                detail: format!(
                    "the parameters of ranks {differ:?} differ from rank 0's (checksums {sums:x?})"
                ),
            })
        }
    }

    fn check_tensors(&self, op: &'static str, tensors: &[&Tensor]) -> Result<(), DistError> {
        for t in tensors {
            if t.device() != self.device {
                return Err(DistError::Gpu(gpu_core::GpuError::DeviceMismatch {
                    op,
                    a: self.device,
                    b: t.device(),
                }));
            }
        }
        Ok(())
    }

    /// Leaves the job on purpose: waits for this rank's queued work, tells the others, and
    /// destroys the communicator. Dropping the group without it (an error's way out) closes
    /// the connections as a crash would: the others report this rank lost at once instead of
    /// waiting for their step's timeout. Drop the CUDA graphs that captured its collectives
    /// before the group: NCCL's tear-down waits for them.
    pub fn finish(mut self) -> Result<(), DistError> {
        if let Some(m) = &self.multi {
            m.comm.backend().stream().synchronize().map_err(|e| {
                DistError::Gpu(gpu_core::GpuError::Cuda {
                    call: "cuStreamSynchronize",
                    detail: gpu_cuda::describe_driver_error(&e),
                })
            })?;
        }
        self.leave(true);
        Ok(())
    }

    /// Stops the watchdog and closes the liveness connections, with a goodbye or (`false`) as
    /// a crash. The communicator goes with the group: destroyed after a goodbye (its work is
    /// done), aborted after a crash, as collectives still queued would wait forever for peers
    /// that are leaving too.
    fn leave(&mut self, goodbye: bool) {
        if let Some(mut m) = self.multi.take() {
            m.stop.store(true, Ordering::Relaxed);
            if let Some(l) = m.liveness.take() {
                if goodbye {
                    l.goodbye();
                }
                // Dropped without a goodbye: the peers see this rank lost.
            }
            if !goodbye && !abort_within(self.rank, &m.comm.abort_handle()) {
                // The abort still holds the communicator: destroying it would wait for the
                // abort. Left to the process's end.
                std::mem::forget(m);
            }
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.leave(false);
    }
}

fn nccl_err(call: &'static str) -> impl Fn(gpu_core::GpuError) -> DistError {
    move |e| match e {
        gpu_core::GpuError::Cuda { detail, .. } => DistError::Nccl { call, detail },
        other => DistError::Gpu(other),
    }
}

fn not_cuda(op: &'static str) -> DistError {
    DistError::Gpu(gpu_core::GpuError::invalid(
        op,
        "a CUDA tensor's storage is on the host",
    ))
}

/// The tensors with distinct storage, in order.
fn unique<'a>(tensors: &[&'a Tensor]) -> Vec<&'a Tensor> {
    let mut out: Vec<&Tensor> = Vec::with_capacity(tensors.len());
    for t in tensors {
        if !out.iter().any(|u| Arc::ptr_eq(&u.0.storage, &t.0.storage)) {
            out.push(t);
        }
    }
    out
}

/// Consecutive runs of tensors of at most [`BUCKET_BYTES`] (a larger tensor alone).
fn buckets<'a>(tensors: &[&'a Tensor]) -> Vec<Vec<&'a Tensor>> {
    let mut out: Vec<Vec<&Tensor>> = Vec::new();
    let mut bytes = 0usize;
    for t in tensors {
        let b = t.numel().saturating_mul(t.dtype().size_in_bytes());
        if out.is_empty() || bytes.saturating_add(b) > BUCKET_BYTES {
            out.push(Vec::new());
            bytes = 0;
        }
        bytes = bytes.saturating_add(b);
        if let Some(last) = out.last_mut() {
            last.push(t);
        }
    }
    out
}

pub(super) fn cuda_bufs<'g>(
    guards: &'g mut [RwLockWriteGuard<'_, Storage>],
) -> Result<Vec<&'g mut gpu_cuda::CudaBuffer>, DistError> {
    guards
        .iter_mut()
        .map(|g| match &mut **g {
            Storage::Cuda(b) => Ok(b),
            _ => Err(not_cuda("all_reduce")),
        })
        .collect()
}

/// FNV-1a over the tensors' values (f32 bits; u32 as they are; bf16 widened to f32 bits).
fn checksum(tensors: &[&Tensor]) -> Result<u64, DistError> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |w: u32| {
        for b in w.to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for t in tensors {
        match t.dtype() {
            DType::U32 => t.to_vec_u32()?.into_iter().for_each(&mut eat),
            _ => t.to_vec()?.into_iter().for_each(|x| eat(x.to_bits())),
        }
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A group of one is the identity and needs neither NCCL nor a GPU.
    #[test]
    fn a_group_of_one_changes_nothing() {
        let pg = ProcessGroup::single(Device::Cpu);
        let t = Tensor::from_vec(vec![1.0f32, -2.0, 3.5], &[3], Device::Cpu).unwrap();
        pg.all_reduce_mean(&[&t]).unwrap();
        pg.broadcast(&[&t], 0).unwrap();
        pg.fence().unwrap();
        assert_eq!(t.to_vec().unwrap(), vec![1.0, -2.0, 3.5]);
        let a = pg.check_identical(&[&t]).unwrap();
        let u = Tensor::from_vec(vec![1.0f32, -2.0, 3.25], &[3], Device::Cpu).unwrap();
        assert_ne!(
            a,
            pg.check_identical(&[&u]).unwrap(),
            "the checksum sees one value"
        );
        assert_eq!((pg.rank(), pg.world_size(), pg.is_main()), (0, 1, true));
        pg.finish().unwrap();
    }

    /// Several ranks need CUDA devices and NCCL: typed errors, before any connection is tried.
    #[test]
    fn several_ranks_need_cuda_and_nccl() {
        let env = DistEnv::on_localhost(0, 2, 1);
        let t = Duration::from_millis(200);
        let e = ProcessGroup::init(&env, Device::Cpu, t).unwrap_err();
        assert!(
            matches!(
                e,
                DistError::Env {
                    var: "WORLD_SIZE",
                    ..
                }
            ),
            "{e}"
        );
        if nccl::available().is_err() {
            let e = ProcessGroup::init(&env, Device::Cuda(0), t).unwrap_err();
            assert!(matches!(e, DistError::NcclUnavailable(_)), "{e}");
            assert!(e.to_string().contains("libnccl"), "{e}");
        }
        let one = DistEnv {
            world_size: 1,
            local_world_size: 1,
            ..env
        };
        assert_eq!(
            ProcessGroup::init(&one, Device::Cpu, t)
                .unwrap()
                .world_size(),
            1
        );
    }

    /// Buckets keep order, never exceed the limit unless one tensor alone does, and shared
    /// storage is reduced once.
    #[test]
    fn buckets_and_unique() {
        let big = BUCKET_BYTES / 4;
        let a = Tensor::zeros(&[big / 2], Device::Cpu).unwrap();
        let b = Tensor::zeros(&[big / 2 + 1], Device::Cpu).unwrap();
        let c = Tensor::zeros(&[2 * big], Device::Cpu).unwrap();
        let d = Tensor::zeros(&[3], Device::Cpu).unwrap();
        let bs = buckets(&[&a, &b, &c, &d]);
        let ids: Vec<Vec<u64>> = bs
            .iter()
            .map(|v| v.iter().map(|t| t.id()).collect())
            .collect();
        assert_eq!(
            ids,
            vec![vec![a.id()], vec![b.id()], vec![c.id()], vec![d.id()]]
        );
        let bs = buckets(&[&d, &a, &d]);
        assert_eq!(bs.len(), 1);
        assert!(buckets(&[]).is_empty(), "nothing to reduce: no bucket");
        let empty = Tensor::zeros(&[0], Device::Cpu).unwrap();
        assert_eq!(
            buckets(&[&empty]).len(),
            1,
            "an empty tensor costs nothing but is kept"
        );
        let view = a.reshape(&[1, big / 2]).unwrap();
        assert_eq!(unique(&[&a, &view, &d]).len(), 2);
    }
}
