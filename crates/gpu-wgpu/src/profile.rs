//! A per-kernel GPU profile from timestamp queries: with profiling on, every compute pass
//! writes a timestamp at its start and end, and each submission resolves and reads them back
//! (which waits for the GPU: a profiled run is slower, its per-kernel GPU times are not).

use std::collections::HashMap;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Passes one submission holds at most ([`crate::backend`]'s batch), so two queries each.
pub(crate) const PASSES: u32 = 64;

/// GPU and host time of one kernel (pipeline cache key) over the profiled launches; a key in
/// parentheses is host work outside the kernels (no GPU time).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KernelTime {
    /// The pipeline's cache key (one per kernel and variant); a matmul's also names its shape.
    pub key: String,
    /// Launches timed.
    pub launches: u64,
    /// Their GPU time in total, in nanoseconds (end minus start of each pass).
    pub gpu_ns: f64,
    /// The host time of their launches in total, in nanoseconds (checks, pipeline lookup,
    /// bind group and recording; not the submission).
    pub host_ns: f64,
}

/// The query set, the buffers its results travel through, and the totals so far.
pub(crate) struct Profiler {
    pub(crate) set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    read: wgpu::Buffer,
    /// Keys of the passes recorded into the pending encoder (pass `i` writes `2i`, `2i + 1`).
    pub(crate) keys: Vec<String>,
    totals: HashMap<String, KernelTime>,
    /// Submissions whose timestamps could not be read back (counted, not guessed).
    pub(crate) lost_batches: u64,
    period_ns: f64,
}

impl Profiler {
    pub(crate) fn new(device: &wgpu::Device, queue: &wgpu::Queue) -> Self {
        let bytes = u64::from(2 * PASSES) * wgpu::QUERY_SIZE as u64;
        let buffer = |label, usage| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes,
                usage,
                mapped_at_creation: false,
            })
        };
        use wgpu::BufferUsages as U;
        Self {
            set: device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("profile"),
                ty: wgpu::QueryType::Timestamp,
                count: 2 * PASSES,
            }),
            resolve: buffer("profile-resolve", U::QUERY_RESOLVE | U::COPY_SRC),
            read: buffer("profile-read", U::MAP_READ | U::COPY_DST),
            keys: Vec::new(),
            totals: HashMap::new(),
            lost_batches: 0,
            period_ns: f64::from(queue.get_timestamp_period()),
        }
    }

    /// The timestamp writes of the next pass, whose kernel `label` names; `None` once the set
    /// is full (that pass goes untimed and uncounted: the batch submits before the set fills).
    /// `started` is when the launch began on the host: its host time so far is added too.
    pub(crate) fn next(
        &mut self,
        label: impl FnOnce() -> String,
        started: Instant,
    ) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        let i = u32::try_from(self.keys.len())
            .ok()
            .filter(|&i| i < PASSES)?;
        let key = label();
        self.entry(&key).host_ns += started.elapsed().as_nanos() as f64;
        self.keys.push(key);
        Some(wgpu::ComputePassTimestampWrites {
            query_set: &self.set,
            beginning_of_pass_write_index: Some(2 * i),
            end_of_pass_write_index: Some(2 * i + 1),
        })
    }

    /// Records the resolve of this batch's queries at the end of `enc` (before it is
    /// submitted); the number of queries, or `None` when the batch timed nothing.
    pub(crate) fn resolve(&self, enc: &mut wgpu::CommandEncoder) -> Option<u32> {
        if self.keys.is_empty() {
            return None;
        }
        let n = 2 * self.keys.len() as u32;
        enc.resolve_query_set(&self.set, 0..n, &self.resolve, 0);
        let bytes = u64::from(n) * wgpu::QUERY_SIZE as u64;
        enc.copy_buffer_to_buffer(&self.resolve, 0, &self.read, 0, bytes);
        Some(n)
    }

    /// Waits for `sub` and adds its `n` resolved timestamps to the totals.
    pub(crate) fn collect(
        &mut self,
        device: &wgpu::Device,
        (sub, n): (wgpu::SubmissionIndex, u32),
        timeout: Duration,
    ) {
        let keys = std::mem::take(&mut self.keys);
        let bytes = u64::from(n) * wgpu::QUERY_SIZE as u64;
        let slice = self.read.slice(..bytes);
        let (tx, rx) = mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        let waited = device.poll(wgpu::PollType::Wait {
            submission_index: Some(sub),
            timeout: Some(timeout),
        });
        if waited.is_err() || !matches!(rx.try_recv(), Ok(Ok(()))) {
            self.lost_batches += 1;
            return;
        }
        let ticks: Vec<u64> = match slice.get_mapped_range() {
            Ok(view) => bytemuck::cast_slice::<u8, u64>(&view).to_vec(),
            Err(_) => {
                self.lost_batches += 1;
                self.read.unmap();
                return;
            }
        };
        self.read.unmap();
        let period = self.period_ns;
        for (key, t) in keys.into_iter().zip(ticks.chunks_exact(2)) {
            let e = self.entry(&key);
            e.launches += 1;
            e.gpu_ns += t[1].saturating_sub(t[0]) as f64 * period;
        }
    }

    /// Adds host time outside the kernels under a key in parentheses (a submission, a new
    /// device buffer, a wait); `launches` counts its calls.
    pub(crate) fn add_host(&mut self, key: &str, since: Instant) {
        let ns = since.elapsed().as_nanos() as f64;
        let e = self.entry(key);
        e.launches += 1;
        e.host_ns += ns;
    }

    fn entry(&mut self, key: &str) -> &mut KernelTime {
        self.totals
            .entry(key.to_string())
            .or_insert_with(|| KernelTime {
                key: key.to_string(),
                ..Default::default()
            })
    }

    /// The totals, most GPU time first.
    pub(crate) fn report(&self) -> Vec<KernelTime> {
        let mut v: Vec<KernelTime> = self.totals.values().cloned().collect();
        v.sort_by(|a, b| b.gpu_ns.total_cmp(&a.gpu_ns).then(a.key.cmp(&b.key)));
        v
    }
}
