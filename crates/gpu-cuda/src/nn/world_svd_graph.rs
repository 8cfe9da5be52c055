//! The fast path of `SvdMethod::Halko` on CUDA (Cholesky QR2 and the small Jacobi SVD
//! on the device, sketch width `l <= 64`) as one replayed CUDA graph.
//!
//! The path queues ~50 small operations (GEMMs of a few µs, one-block kernels); issued one by
//! one they cost the host about as much time as the GPU spends on them. A [`Plan`] owns every
//! buffer the sequence touches, at fixed addresses, for one `(backend, m, n, k, l, q, scale)`:
//! its first call runs the sequence eagerly (loading modules, setting kernel attributes), its
//! second captures it into a graph, and every later call copies the residual into the plan,
//! draws the Gaussian test matrix (the seed may change between calls, so it stays outside the
//! graph), replays the graph and reads the one flag word back. At most [`PLANS`] plans are kept
//! (oldest dropped first); a plan holds `m·n + 8·max(m, n)·l` floats.

use crate::backend::CudaBackend;
use crate::cholqr::{gram_chunk, CholQrWork, CHOLQR_BREAKDOWN};
use crate::graph::CapturedGraph;
use crate::pool::CudaBuffer;
use gpu_core::nn::{SvdOut, SvdSpec};
use gpu_core::{BufferInfo, DType, GpuError};
use std::sync::Mutex;

/// The most plans kept.
pub(crate) const PLANS: usize = 4;

/// What one call of the fast path ended with.
pub(crate) enum Fast {
    /// Cholesky QR broke down: redo the call with Householder QR.
    Redo,
    /// `U` (row-major `m × k`), `S` (unscaled, `k`) and `V` (row-major `n × k`) are queued
    /// into the caller's outputs, copied from the plan's buffers.
    Done,
    /// The small SVD is the host's to take: `Y`, `Q₂` (fresh copies) and `R` summed in f64.
    Host(CudaBuffer, CudaBuffer, Vec<f64>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Key {
    backend: u64,
    m: usize,
    n: usize,
    k: usize,
    l: usize,
    q: usize,
    scale_bits: u32,
    /// The residual's buffer length (at least `m·n`).
    x_len: usize,
}

/// Every buffer of one fast-path call, and its graph once captured.
struct Plan {
    key: Key,
    x: CudaBuffer,
    omega: CudaBuffer,
    y: CudaBuffer,
    y1: CudaBuffer,
    z: CudaBuffer,
    z1: CudaBuffer,
    bt: CudaBuffer,
    rr: CudaBuffer,
    parts: usize,
    ur: CudaBuffer,
    vr: CudaBuffer,
    s: CudaBuffer,
    u: CudaBuffer,
    v: CudaBuffer,
    work: CholQrWork,
    runs: u64,
    graph: Option<CapturedGraph>,
}

fn alloc(gpu: &CudaBackend, len: usize) -> Result<CudaBuffer, GpuError> {
    use gpu_core::Backend;
    gpu.allocate(DType::F32, len.max(1))
}

impl Plan {
    fn new(gpu: &CudaBackend, key: Key) -> Result<Plan, GpuError> {
        let Key { m, n, k, l, .. } = key;
        let (r, c) = (n, m);
        let len = |a: usize, b: usize| {
            a.checked_mul(b)
                .ok_or_else(|| GpuError::invalid("compress_residuals", "sizes overflow"))
        };
        let chunk = gram_chunk(c);
        let parts = c.div_ceil(chunk);
        Ok(Plan {
            key,
            x: alloc(gpu, key.x_len.max(len(r, c)?))?,
            omega: alloc(gpu, len(c, l)?)?,
            y: alloc(gpu, len(r, l)?)?,
            y1: alloc(gpu, len(r, l)?)?,
            z: alloc(gpu, len(c, l)?)?,
            z1: alloc(gpu, len(c, l)?)?,
            bt: alloc(gpu, len(c, l)?)?,
            rr: alloc(gpu, len(parts, l * l)?)?,
            parts,
            ur: alloc(gpu, l * k)?,
            vr: alloc(gpu, l * k)?,
            s: alloc(gpu, k)?,
            u: alloc(gpu, len(m, k)?)?,
            v: alloc(gpu, len(n, k)?)?,
            work: CholQrWork::new(gpu, r.max(c), l)?,
            runs: 0,
            graph: None,
        })
    }

    /// The device part of the call on the plan's buffers (`x` and `omega` already filled):
    /// see `world_svd::halko` for the algorithm and the layout. Queue only.
    fn queue(&mut self, gpu: &CudaBackend, q: usize, inv_scale: f32) -> Result<(), GpuError> {
        let Key { m, n, k, l, .. } = self.key;
        let (r, c) = (n, m);
        let Plan {
            x,
            omega,
            y,
            y1,
            z,
            z1,
            bt,
            rr,
            ur,
            vr,
            s,
            u,
            v,
            work,
            ..
        } = self;
        work.clear_flag(gpu)?;
        let times_x = super::world_svd::times_x;
        let x_times = |z: &CudaBuffer, y: &mut CudaBuffer| times_x(gpu, (x, r, c, l), false, z, y);
        let xt_times = |y: &CudaBuffer, z: &mut CudaBuffer| times_x(gpu, (x, r, c, l), true, y, z);
        // The intermediate bases need the right span and a good condition number, not
        // orthonormality: one pass of Cholesky QR each (into `y1`, `z1`). A sketch too
        // ill-conditioned for that is caught by the final basis' Cholesky QR2, whose check
        // sees the same conditioning, or by a non-positive pivot on the way.
        x_times(omega, y)?;
        for _ in 0..q {
            gpu.cholqr1_cm((r, l), (y, r), (y1, r), work)?;
            xt_times(y1, z)?;
            gpu.cholqr1_cm((c, l), (z, c), (z1, c), work)?;
            x_times(z1, y)?;
        }
        gpu.cholqr2_cm((r, l), (y, r), work)?;
        // Bᵀ = Xᵀ·Y (c × l), kept in `bt`; Q₂ in `z`; R = Q₂ᵀ·Bᵀ in parts.
        xt_times(y, bt)?;
        gpu.copy_buffer(bt, z)?;
        gpu.cholqr2_cm((c, l), (z, c), work)?;
        let parts = gpu.gemm_tn_parts_cm(c, (l, l), (z, c), (bt, c), gram_chunk(c), rr)?;
        gpu.jacobi_svd_cm((l, k), (rr, parts), inv_scale, (ur, s, vr), work.flag_mut())?;
        super::world_svd::factors_into(gpu, (m, n, k, l), (ur, vr), (z, y), (u, v))
    }
}

static CACHE: Mutex<Vec<Plan>> = Mutex::new(Vec::new());

/// One fast-path call on the column-major `r × c` `x` (`r = n`, `c = m`: the row-major residual,
/// already scaled by `scale`), replayed as a graph from its plan's third call on unless `eager`.
/// On [`Fast::Done`] the factors are in `out`; otherwise `out` is untouched.
pub(crate) fn halko_fast(
    gpu: &CudaBackend,
    x: &CudaBuffer,
    (m, n, k, l): (usize, usize, usize, usize),
    (scale, eager): (f32, bool),
    opts: &SvdSpec,
    out: &mut SvdOut<'_, CudaBuffer>,
) -> Result<Fast, GpuError> {
    let key = Key {
        backend: gpu.id(),
        m,
        n,
        k,
        l,
        q: opts.power_iters,
        scale_bits: scale.to_bits(),
        x_len: x.len(),
    };
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    let at = match cache.iter().position(|p| p.key == key) {
        Some(i) => i,
        None => {
            if cache.len() >= PLANS {
                cache.remove(0);
            }
            cache.push(Plan::new(gpu, key)?);
            cache.len() - 1
        }
    };
    let plan = &mut cache[at];
    gpu.copy_buffer(x, &mut plan.x)?;
    gpu.fill_randn(&mut plan.omega, opts.seed)?;
    let inv_scale = 1.0 / scale;
    if eager || plan.runs == 0 {
        plan.queue(gpu, opts.power_iters, inv_scale)?;
    } else {
        if plan.graph.is_none() {
            let graph = gpu.capture(|g| plan.queue(g, opts.power_iters, inv_scale))?;
            plan.graph = Some(graph);
        }
        if let Some(graph) = &plan.graph {
            gpu.launch_graph(graph)?;
        }
    }
    plan.runs += 1;
    let bits = plan.work.flag_bits(gpu)?;
    if bits & CHOLQR_BREAKDOWN != 0 {
        return Ok(Fast::Redo);
    }
    let copy = |src: &CudaBuffer| -> Result<CudaBuffer, GpuError> {
        let mut out = alloc(gpu, src.len())?;
        gpu.copy_buffer(src, &mut out)?;
        Ok(out)
    };
    if bits == 0 {
        gpu.copy_buffer(&plan.u, out.u)?;
        gpu.copy_buffer(&plan.s, out.s)?;
        gpu.copy_buffer(&plan.v, out.v)?;
        return Ok(Fast::Done);
    }
    // The small SVD found a zero singular value (or no convergence, or an overflow): the
    // host's exact SVD completes the factors from R, summed in f64 here.
    let all: Vec<f32> = gpu_core::Backend::download(gpu, &plan.rr)?;
    let ll = l * l;
    let small: Vec<f64> = (0..ll)
        .map(|e| (0..plan.parts).map(|p| f64::from(all[p * ll + e])).sum())
        .collect();
    Ok(Fast::Host(copy(&plan.y)?, copy(&plan.z)?, small))
}
