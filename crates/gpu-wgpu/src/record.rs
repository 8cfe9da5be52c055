//! Recording work for the device: launches go into one command encoder, their parameter blocks
//! into one uniform ring, and the encoder is submitted every [`BATCH`] records or when the
//! host reads, writes or waits; while profiling, each submission's timestamps are read back.

use crate::backend::{lock, Inner, WgpuBackend};
use crate::error::WgpuError;
use crate::profile::{KernelTime, Profiler};
use gpu_core::Result;
use std::time::Instant;

/// Launches recorded into one command encoder before it is submitted: a submission costs
/// host time (tens of µs on a hardware driver), so a chain of small ops is submitted in
/// batches; reads, writes from the host, `synchronize` and the pool's release submit first.
pub(crate) const BATCH: usize = 32;

/// Bytes between parameter blocks in the ring (WebGPU's largest uniform offset alignment).
pub(crate) const PARAMS_SLOT: usize = 256;

/// One launch's profile label (made only while profiling), parameter block and start time.
pub(crate) struct Launch<'a, L> {
    pub label: L,
    /// At most `PARAMS_SLOT` bytes (the kernels' `Params`: eight u32 for most).
    pub params: &'a [u32],
    pub started: Instant,
}

/// The command encoder that launches are recorded into, and how many it holds.
#[derive(Default)]
pub(crate) struct Pending {
    enc: Option<wgpu::CommandEncoder>,
    recorded: usize,
    /// The per-kernel profile, while profiling is on ([`WgpuBackend::set_profiling`]).
    prof: Option<Profiler>,
    /// The parameter blocks of the launches recorded so far, one per `PARAMS_SLOT` bytes:
    /// written to `Inner::params` just before the submission that reads them.
    staged: Vec<u8>,
}

impl Inner {
    fn new_encoder(&self) -> wgpu::CommandEncoder {
        self.device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor::default())
    }

    /// `p`'s encoder, started if there is none.
    fn encoder<'p>(&self, p: &'p mut Pending) -> &'p mut wgpu::CommandEncoder {
        p.enc.get_or_insert_with(|| self.new_encoder())
    }

    /// Counts one record; every [`BATCH`] records the encoder is submitted.
    fn count_record(&self, p: &mut Pending) {
        p.recorded += 1;
        if p.recorded >= BATCH {
            self.submit(p);
        }
    }

    /// Submits `p`'s encoder, if it holds any work (and, while profiling, waits for it and
    /// reads its timestamps).
    fn submit(&self, p: &mut Pending) -> Option<wgpu::SubmissionIndex> {
        p.recorded = 0;
        let mut enc = p.enc.take()?;
        if !p.staged.is_empty() {
            // Queue order: this write lands after every earlier submission has read the ring
            // and before this one does.
            self.queue.write_buffer(&self.params, 0, &p.staged);
            p.staged.clear();
        }
        let queries = p.prof.as_ref().and_then(|pr| pr.resolve(&mut enc));
        let started = Instant::now();
        let sub = self.queue.submit([enc.finish()]);
        if let Some(pr) = p.prof.as_mut() {
            pr.add_host("(queue.submit)", started);
        }
        if let (Some(pr), Some(n)) = (p.prof.as_mut(), queries) {
            pr.collect(&self.device, (sub.clone(), n), self.timeout);
        }
        Some(sub)
    }
}

impl WgpuBackend {
    /// Records `f`'s commands into the pending encoder; every [`BATCH`] records it is
    /// submitted. Commands run in the order recorded, and after everything submitted before.
    pub(crate) fn record(&self, f: impl FnOnce(&mut wgpu::CommandEncoder)) {
        let mut p = lock(&self.inner.pending);
        f(self.inner.encoder(&mut p));
        self.inner.count_record(&mut p);
    }

    /// Records one kernel launch, as [`Self::record`]: its parameter block goes to the next
    /// slot of the parameter ring (written to the device once, at submission), `bind` makes
    /// its bind group from the ring and the slot's offset, `f` records the pass (timed under
    /// `label` while profiling, the host time since `started` too).
    pub(crate) fn record_launch<L: FnOnce() -> String>(
        &self,
        launch: Launch<'_, L>,
        bind: impl FnOnce(&wgpu::Buffer, u64) -> wgpu::BindGroup,
        f: impl FnOnce(&mut wgpu::ComputePass<'_>, &wgpu::BindGroup),
    ) {
        let mut guard = lock(&self.inner.pending);
        let p = &mut *guard;
        // At most BATCH records between submissions, so the ring never overflows.
        let offset = (p.staged.len() / PARAMS_SLOT) as u64 * PARAMS_SLOT as u64;
        assert!(
            4 * launch.params.len() <= PARAMS_SLOT,
            "a parameter block past its slot"
        );
        p.staged
            .extend_from_slice(bytemuck::cast_slice(launch.params));
        p.staged.resize(offset as usize + PARAMS_SLOT, 0);
        let group = bind(&self.inner.params, offset);
        let Pending { enc, prof, .. } = p;
        let enc = enc.get_or_insert_with(|| self.inner.new_encoder());
        let timestamp_writes = prof
            .as_mut()
            .and_then(|pr| pr.next(launch.label, launch.started));
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: None,
            timestamp_writes,
        });
        f(&mut pass, &group);
        drop(pass);
        self.inner.count_record(p);
    }

    /// Submits the recorded work, if any: its submission's index.
    pub(crate) fn flush(&self) -> Option<wgpu::SubmissionIndex> {
        let mut p = lock(&self.inner.pending);
        self.inner.submit(&mut p)
    }

    /// Turns the per-kernel GPU profile on (from zero) or off. While on, each submission
    /// waits for the GPU, so wall-clock times are not representative; the kernels' are.
    /// An adapter without timestamp queries is [`WgpuError::Unsupported`].
    pub fn set_profiling(&self, on: bool) -> Result<()> {
        if on
            && !self
                .inner
                .device
                .features()
                .contains(wgpu::Features::TIMESTAMP_QUERY)
        {
            return Err(WgpuError::Unsupported {
                op: "set_profiling",
                reason: "the adapter has no timestamp queries".into(),
            }
            .into());
        }
        let mut p = lock(&self.inner.pending);
        self.inner.submit(&mut p);
        p.prof = on.then(|| Profiler::new(&self.inner.device, &self.inner.queue));
        Ok(())
    }

    /// The profile so far, most GPU time first (empty while profiling is off), and how many
    /// submissions' timestamps could not be read back.
    pub fn profile(&self) -> (Vec<KernelTime>, u64) {
        let mut p = lock(&self.inner.pending);
        self.inner.submit(&mut p);
        p.prof
            .as_ref()
            .map_or((Vec::new(), 0), |pr| (pr.report(), pr.lost_batches))
    }

    /// While profiling, adds the host time since `since` under `key` (see [`Profiler::add_host`]).
    pub(crate) fn note_host(&self, key: &str, since: Instant) {
        let mut p = lock(&self.inner.pending);
        if let Some(pr) = p.prof.as_mut() {
            pr.add_host(key, since);
        }
    }
}
