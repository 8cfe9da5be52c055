//! The world model's fused ensemble rollout: one cooperative launch that filters a context,
//! rolls every member forward and forms the ensemble statistics. Two kernels: on sm_90 and later
//! `kernels/rssm_rollout_cluster.cu` (one thread-block cluster per member, activations exchanged
//! in distributed shared memory), elsewhere or for larger models `kernels/rssm_rollout.cu`
//! (activations through L2, per-member barriers by cluster or through memory); see
//! [`RolloutPath`]. The cluster kernel takes its products on tensor cores in 3×TF32 (each
//! operand split exactly into a TF32 head and tail, three products summed in f32: about f32's
//! accuracy, within 1e-7 of its FMA form), never in plain TF32; the other kernel is f32 FMA.
//! The packed weight layout is [`RolloutDims::member_layout`]; the CPU reference is
//! `rssm::reference::HostRssm::predict`.

use crate::backend::{CudaBackend, Grouping};
use crate::launch::{KernelArg, LaunchConfig};
use crate::module::ImageKind;
use crate::pool::CudaBuffer;
use gpu_core::{Backend, BufferInfo, DType, GpuError, Result};
use std::sync::Mutex;

mod plan;
use plan::{plan_rollout, DriverResidency, Plan};

const KERNEL: &str = "rssm_rollout_f32";
const CLUSTER_KERNEL: &str = "rssm_rollout_cluster_f32";
const THREADS: u32 = 512;
/// Hidden (and head) units per block and rows staged at a time (`GU`/`FU`, `RB` in the
/// kernel).
const UNITS: usize = 16;
const ROWS: usize = 32;
/// The opt-in shared memory limit of every GPU the kernels are built for (sm_80 and later
/// allow at least 163 KiB; sm_90 227 KiB); the driver refuses more, and [`CudaBackend::rssm_rollout_fits`]
/// checks the device's own figure.
const SMEM_ATTR_MAX: usize = 227 * 1024;

/// The most blocks a member may have for its blocks to form one cluster (the non-portable
/// limit of sm_90).
const MAX_CLUSTER: usize = 16;

/// Which kernel and which member barrier the fused rollout uses. All compute the same
/// function; `ClusterBarrier` and `MemoryBarrier` give the same numbers bit for bit,
/// `Distributed` sums the decoder's input in another order (a few f32 roundings apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RolloutPath {
    /// The fastest this device can run: `Distributed`, else `ClusterBarrier`, else
    /// `MemoryBarrier`.
    Auto,
    /// `rssm_rollout_cluster.cu`: one cluster per member, every block holding the member's
    /// activations in shared memory (batch <= 32, at most 16 blocks a member, sm_90 and
    /// later, every member's cluster resident at once).
    Distributed,
    /// `rssm_rollout.cu` with one cluster per member and the hardware cluster barrier
    /// (at most 16 blocks a member, sm_90 and later).
    ClusterBarrier,
    /// `rssm_rollout.cu` with barriers through atomics in device memory (every GPU).
    MemoryBarrier,
}

/// Plans already resolved, by backend instance, image kind, sizes and asked path: resolving one
/// takes up to five driver occupancy queries, which would otherwise run on every rollout (and
/// twice where a caller asks `rssm_rollout_fits` first). The queries also raise the kernel
/// attributes the launch needs (dynamic shared memory, cluster size), which are never lowered
/// (`CudaBackend::raise_dynamic_smem`), so a cached plan stays launchable whatever other sizes
/// planned since; the launch raises its own size again anyway. Only successes are kept; at
/// most [`PLANS_KEPT`], the oldest dropped.
type SizeKey = (u64, ImageKind, [usize; 9]);
type PlanKey = (SizeKey, RolloutPath);
static PLANS: Mutex<Vec<(PlanKey, Plan)>> = Mutex::new(Vec::new());
const PLANS_KEPT: usize = 64;

/// Concrete paths whose launch the driver refused as too large at these sizes although the
/// occupancy queries admitted it: planning skips them from then on (at most [`PLANS_KEPT`],
/// the oldest dropped).
static REFUSED: Mutex<Vec<(SizeKey, RolloutPath)>> = Mutex::new(Vec::new());

pub use gpu_core::nn::RolloutDims;

/// The kernels' own sizes of a rollout (blocks per member, shared memory).
pub(crate) trait KernelSizes {
    fn blocks_per_member(&self) -> usize;
    fn smem_bytes(&self) -> usize;
    fn cluster_smem_bytes(&self) -> usize;
}

impl KernelSizes for RolloutDims {
    /// Blocks per member: `max(⌈H/16⌉, ⌈P/16⌉)` (the kernel's `BPM`).
    fn blocks_per_member(&self) -> usize {
        self.hidden.div_ceil(UNITS).max(self.head.div_ceil(UNITS))
    }

    /// Dynamic shared memory of the kernel, the sums of its carve-up in floats (each region a
    /// multiple of 4): the GRU slice `3·16·pad(S + H) + 6·16`, the fc slices, the prior and
    /// posterior mean outputs, the block's slice of the decoder outputs, the LayerNorms, and 32
    /// staged rows of the widest input; `pad(w)` is `w + 4` for a multiple of 4, else `w + 1`,
    /// as in the kernel.
    fn smem_bytes(&self) -> usize {
        let (h, s, e, p, d) = (self.hidden, self.latent, self.embed, self.head, self.out);
        let pad = |w: usize| if w.is_multiple_of(4) { w + 4 } else { w + 1 };
        let r4 = |v: usize| v.div_ceil(4) * 4;
        let dout = d.div_ceil(self.blocks_per_member());
        let gru = 3 * UNITS * pad(s + h) + 6 * UNITS;
        let fc = UNITS * (pad(h) + pad(h + e) + pad(h + s)) + 3 * UNITS + 4;
        let outs = 2 * r4(s * pad(p)) + 2 * r4(s) + r4(dout * pad(p)) + r4(dout) + r4(6 * p);
        let widest = [s + h, h + e, h + s, h, p]
            .map(pad)
            .into_iter()
            .max()
            .unwrap_or(0);
        4 * (gru + fc + outs + ROWS * widest)
    }

    /// Dynamic shared memory of the cluster kernel, the sums of its carve-up: the GRU slice, the
    /// fc slices of `⌈P/BPM⌉` units per head, the output layers and LayerNorms (as
    /// [`RolloutDims::smem_bytes`]), then h twice, z, and the head and decoder fc outputs, all
    /// `batch` rows.
    fn cluster_smem_bytes(&self) -> usize {
        let (h, s, e, p, d, b) = (
            self.hidden,
            self.latent,
            self.embed,
            self.head,
            self.out,
            self.batch,
        );
        let pad = |w: usize| if w.is_multiple_of(4) { w + 4 } else { w + 1 };
        let r4 = |v: usize| v.div_ceil(4) * 4;
        let bpm = self.blocks_per_member();
        let (fcu, dout) = (p.div_ceil(bpm), d.div_ceil(bpm));
        let gru = 3 * UNITS * pad(s + h) + 6 * UNITS;
        let fc = [h, h + e, h + s]
            .map(|i| r4(fcu * pad(i)))
            .iter()
            .sum::<usize>()
            + r4(3 * fcu);
        let outs = 2 * r4(s * pad(p)) + 2 * r4(s) + r4(dout * pad(p)) + r4(dout) + r4(6 * p);
        let acts = 2 * r4(b * pad(h)) + r4(b * pad(s)) + 2 * r4(b * pad(p));
        4 * (gru + fc + outs + acts)
    }
}

fn check_len(what: &str, b: &CudaBuffer, want: usize) -> Result<()> {
    if b.dtype() != DType::F32 || b.len() != want {
        return Err(GpuError::shape(
            "rssm_rollout",
            format!("{what}: {want} f32"),
            format!("{} {}", b.len(), b.dtype()),
        ));
    }
    Ok(())
}

impl CudaBackend {
    /// This backend's cache key of the sizes of `d`.
    fn size_key(&self, d: &RolloutDims) -> SizeKey {
        let sizes = [
            d.members, d.batch, d.context, d.steps, d.hidden, d.latent, d.embed, d.head, d.out,
        ];
        (self.id(), self.image_kind(), sizes)
    }

    /// The launch of a rollout along `path` (`Auto`: the fastest this device can run), or a
    /// typed error when this device cannot run it that way (more shared memory than a block may
    /// have, more blocks than can be resident at once, no clusters, refused by the driver
    /// before): [`plan_rollout`] on the driver's answers, cached.
    fn rollout_plan(&self, d: &RolloutDims, path: RolloutPath) -> Result<Plan> {
        d.check()?;
        let key = (self.size_key(d), path);
        let cached =
            |plans: &Vec<(PlanKey, Plan)>| plans.iter().find(|(k, _)| *k == key).map(|(_, p)| *p);
        if let Some(p) = PLANS.lock().ok().and_then(|plans| cached(&plans)) {
            return Ok(p);
        }
        let refused: Vec<RolloutPath> = REFUSED.lock().map_or_else(
            |_| Vec::new(),
            |r| {
                r.iter()
                    .filter(|(k, _)| *k == key.0)
                    .map(|(_, p)| *p)
                    .collect()
            },
        );
        let plan = plan_rollout(d, path, &refused, &DriverResidency(self))?;
        if let Ok(mut plans) = PLANS.lock() {
            if plans.len() >= PLANS_KEPT {
                plans.remove(0);
            }
            plans.push((key, plan));
        }
        Ok(plan)
    }

    /// Records that the driver refused `refused`'s launch at the sizes of `d`: the plans that
    /// chose it are dropped and planning skips its path from then on.
    fn refuse_plan(&self, d: &RolloutDims, refused: Plan) {
        let sizes = self.size_key(d);
        if let Ok(mut plans) = PLANS.lock() {
            plans.retain(|((k, _), p)| !(*k == sizes && p.path == refused.path));
        }
        if let Ok(mut r) = REFUSED.lock() {
            if r.len() >= PLANS_KEPT {
                r.remove(0);
            }
            r.push((sizes, refused.path));
        }
    }

    /// The path the fused rollout of `d` takes when asked for `path` (`Auto` resolved), or the
    /// typed error that refuses it on this device.
    pub fn rssm_rollout_path(&self, d: &RolloutDims, path: RolloutPath) -> Result<RolloutPath> {
        Ok(self.rollout_plan(d, path)?.path)
    }

    /// Whether this device can run the fused rollout of `d` (see [`CudaBackend::rssm_rollout_fused`]).
    pub fn rssm_rollout_fits(&self, d: &RolloutDims) -> bool {
        self.rollout_plan(d, RolloutPath::Auto).is_ok()
    }

    /// The fused rollout: `weights` holds `members` packed members ([`RolloutDims::member_len`]
    /// each), `embeds` the encoder's output `[batch, context, embed]`; fills `out`
    /// `[members, batch, steps, out]`, `mean` `[batch, steps, out]` and `disagreement`
    /// `[batch, steps]` (population variance over members, averaged over outputs). Every length
    /// is checked first; the launch is refused with a typed error when the device cannot hold
    /// one block. Should the driver refuse a grid that its occupancy queries admitted
    /// (`CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE`, nothing run), the next path is taken and the
    /// refused one is not planned again at these sizes; when none is left the driver's error is
    /// returned ([`crate::is_cooperative_launch_too_large`] tells it), the outputs untouched.
    pub fn rssm_rollout_fused(
        &self,
        d: &RolloutDims,
        weights: &CudaBuffer,
        embeds: &CudaBuffer,
        out: &mut CudaBuffer,
        mean: &mut CudaBuffer,
        disagreement: &mut CudaBuffer,
    ) -> Result<()> {
        let bufs = (out, mean, disagreement);
        self.rssm_rollout_with(d, weights, embeds, bufs, RolloutPath::Auto)
    }

    /// [`CudaBackend::rssm_rollout_fused`] along `path`; `outputs` are `out`, `mean` and
    /// `disagreement`. A path other than `Auto` is not replaced by another: its refusal by the
    /// driver is the error.
    pub fn rssm_rollout_with(
        &self,
        d: &RolloutDims,
        weights: &CudaBuffer,
        embeds: &CudaBuffer,
        outputs: (&mut CudaBuffer, &mut CudaBuffer, &mut CudaBuffer),
        path: RolloutPath,
    ) -> Result<()> {
        let (out, mean, disagreement) = outputs;
        d.check()?;
        let overflow = || GpuError::invalid("rssm_rollout", "sizes overflow");
        let mul = |a: usize, b: usize| a.checked_mul(b).ok_or_else(overflow);
        check_len("weights", weights, mul(d.members, d.member_len())?)?;
        check_len("embeds", embeds, mul(mul(d.batch, d.context)?, d.embed)?)?;
        let per_member = mul(mul(d.batch, d.steps)?, d.out)?;
        check_len("out", out, mul(d.members, per_member)?)?;
        check_len("mean", mean, per_member)?;
        check_len("disagreement", disagreement, mul(d.batch, d.steps)?)?;
        self.check_owned("rssm_rollout", &[weights, embeds, out, mean, disagreement])?;
        // The paths the driver refused in this call (also recorded for later calls).
        let mut refused: Vec<RolloutPath> = Vec::new();
        loop {
            let plan = self.rollout_plan(d, path)?;
            let outs = (&mut *out, &mut *mean, &mut *disagreement);
            match self.launch_plan(d, plan, weights, embeds, outs) {
                // The driver refused the grid before running anything: no output was written
                // (the barrier words and scratch were this call's own). Its occupancy queries
                // admitted the grid (rollout_plan), so this is the driver's word against them:
                // drop the plan, never plan that path at these sizes again, and let `Auto` take
                // the next path; the last refusal is the error.
                Err(e) if crate::error::is_cooperative_launch_too_large(&e) => {
                    tracing::warn!(
                        ?plan,
                        "rssm_rollout: the driver refused a grid its occupancy queries admitted: {e}"
                    );
                    self.refuse_plan(d, plan);
                    refused.push(plan.path);
                    if path != RolloutPath::Auto {
                        return Err(e);
                    }
                    // Auto's next plan, if a path is left; one refused in this call again (its
                    // record lost) ends it too.
                    match self.rollout_plan(d, path) {
                        Ok(p) if !refused.contains(&p.path) => {}
                        _ => return Err(e),
                    }
                }
                r => return r,
            }
        }
    }

    /// The launch of `plan` (a resolved plan of `d`), the lengths and owners of the buffers
    /// checked by the caller.
    fn launch_plan(
        &self,
        d: &RolloutDims,
        plan: Plan,
        weights: &CudaBuffer,
        embeds: &CudaBuffer,
        outputs: (&mut CudaBuffer, &mut CudaBuffer, &mut CudaBuffer),
    ) -> Result<()> {
        let (out, mean, disagreement) = outputs;
        let overflow = || GpuError::invalid("rssm_rollout", "sizes overflow");
        let mul = |a: usize, b: usize| a.checked_mul(b).ok_or_else(overflow);
        let cfg = LaunchConfig {
            grid_dim: (plan.grid, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: plan.smem,
        };
        // Every block resident at once (the grid barriers), in clusters of plan.cluster blocks
        // when that is not 0.
        let group = Grouping {
            cooperative: true,
            cluster: plan.cluster,
        };
        let mut bar = self.allocate(DType::U32, 2 + 2 * d.members)?;
        self.memset32(&mut bar, 0)?;
        let u = |v: usize| KernelArg::U32(v as u32);
        let dims = [
            u(d.members),
            u(d.batch),
            u(d.context),
            u(d.steps),
            u(d.hidden),
            u(d.latent),
            u(d.embed),
            u(d.head),
            u(d.out),
            KernelArg::F32(d.eps),
        ];
        if plan.path == RolloutPath::Distributed {
            let args = [
                &[
                    weights.into(),
                    embeds.into(),
                    KernelArg::from(&mut *out),
                    KernelArg::from(&mut *mean),
                    KernelArg::from(&mut *disagreement),
                    (&bar).into(),
                ],
                &dims[..],
            ]
            .concat();
            // SAFETY: rssm_rollout_cluster_f32's parameters in order; every buffer's length was
            // checked against the dims above, bar holds 2 + 2M zeroed u32; the grid is M·BPM in
            // clusters of BPM blocks (batch <= 32 and BPM <= 16, as the kernel needs), every
            // cluster resident at once (rollout_plan) for the final grid barrier.
            return unsafe { self.launch_grouped(CLUSTER_KERNEL, cfg, &args, group) };
        }
        let mb = mul(d.members, d.batch)?;
        // h twice, one z per block, two fc outputs; each part rounded up to 4 floats as the
        // kernel lays it.
        let r4 = |v: usize| v.div_ceil(4) * 4;
        let z_all = mul(plan.grid as usize, r4(mul(d.batch, d.latent)?))?;
        let scratch_len = 2 * r4(mul(mb, d.hidden)?) + z_all + 2 * r4(mul(mb, d.head)?);
        let scratch = self.allocate(DType::F32, scratch_len)?;
        let args = [
            &[
                weights.into(),
                embeds.into(),
                (&scratch).into(),
                KernelArg::from(&mut *out),
                KernelArg::from(&mut *mean),
                KernelArg::from(&mut *disagreement),
                (&bar).into(),
            ],
            &dims[..],
            &[KernelArg::U32((plan.cluster > 0) as u32)],
        ]
        .concat();
        // SAFETY: rssm_rollout_f32's parameters in order; every buffer's length was checked
        // against the dims above (scratch holds 2·M·B·H + grid·B·S + 2·M·B·P floats, each part
        // rounded up to 4, bar 2 + 2M zeroed u32), the grid is M·BPM as the kernel indexes it,
        // and at most the number of co-resident blocks (a cooperative launch); when clustered,
        // clusters of BPM blocks (a divisor of the grid) that the device can hold, and the
        // kernel's last argument says so (0 without clusters).
        unsafe { self.launch_grouped(KERNEL, cfg, &args, group) }
    }
}
