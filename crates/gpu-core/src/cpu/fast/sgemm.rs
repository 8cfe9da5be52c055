//! The fast mode's own SGEMM for AVX2 + FMA hosts (without AVX-512): BLIS's five loops around a
//! 6 × 16 register tile (`kernel.rs`).
//!
//! - `jc`: blocks of [`Blocking::nc`] columns of C;
//! - `pc`: blocks of [`Blocking::kc`] reduction steps; the `kc × nc` block of `op(B)` is packed
//!   once, by all threads, into 16-column micro-panels, which they share (it stays in L3; each
//!   thread packing its own copy measured no faster);
//! - the rows of C are split into one part per thread, each a multiple of 6 rows;
//! - `ic`: blocks of [`Blocking::mc`] rows of a thread's part; its `mc × kc` block of `op(A)` is
//!   packed into 6-row micro-panels (kept in that core's L2);
//! - `jr`, `ir`: one B micro-panel against every A micro-panel of the block (the C tile of
//!   the next call prefetched meanwhile).
//!
//! **Every output is one chain of fused multiply-adds in reduction order**, starting from 0:
//! a later `kc` block reloads the f32 partial sum stored by the earlier one and continues the
//! chain. So the bits depend neither on the blocking nor on the thread count, and equal a
//! scalar `f32::mul_add` loop's (tested). Nothing skips zeros: a NaN or infinity in A or B
//! reaches C as in the naive product. The error is that of a recursive sum of k terms:
//! `|c − ab| ≤ γ_k Σ|a||b|` with `γ_k ≈ k·2⁻²⁴`.
//!
//! Used only where it measured faster than the `gemm` crate (`docs/cpu-speed.md`, twelfth
//! session): see [`choose`].

mod kernel;

pub(crate) use kernel::Avx2Fma;
use kernel::{pack_a, pack_b, tile, MR, NR};

use crate::cpu::host::try_vec_with_capacity;
use crate::error::Result;
use crate::ops::MatmulSpec;
use rayon::prelude::*;
use std::cell::Cell;

/// The own kernel for `spec` where it measured faster than the `gemm` crate: on hosts with AVX2
/// and FMA but not AVX-512 (where the crate has its AVX-512 kernels), for products of at least
/// [`MIN_M`] rows and [`MIN_NK`] columns and reduction steps. `None` elsewhere.
pub(crate) fn choose(spec: &MatmulSpec) -> Option<Avx2Fma> {
    if super::Isa::best() != super::Isa::Avx2 || spec.m < MIN_M || spec.n.min(spec.k) < MIN_NK {
        return None;
    }
    Avx2Fma::detect()
}

/// The least `m` for which [`choose`] picks the own kernel. On the AVX2 box (2 threads, calls
/// alternating with the crate's, `gemm-shapes --compare`) the GPT's `65 × 128 × 768` ran 1.35×
/// the crate's speed.
pub(crate) const MIN_M: usize = 64;

/// The least `n` and `k` for which [`choose`] picks the own kernel: there `n` = 65 (a 16-column
/// panel with one real column) and `k` = 65 (a short chain per C tile) ran at 0.87–0.91× the
/// crate's speed, `n`, `k` ≥ 128 at 1.00–1.22×.
pub(crate) const MIN_NK: usize = 128;

/// A strided matrix: element `(i, j)` at `data[i·rs + j·cs]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct View<'a> {
    pub(crate) data: &'a [f32],
    pub(crate) rs: usize,
    pub(crate) cs: usize,
}

/// Cache blocking: `mc` rows of A (a multiple of [`MR`]) × `kc` steps in L2, `kc × nc` of B in
/// L3; the driver evens the blocks out (no thin last block), never above these sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Blocking {
    pub(crate) mc: usize,
    pub(crate) kc: usize,
    pub(crate) nc: usize,
}

impl Blocking {
    /// From the cache sizes (bytes; L3 shared): an A micro-panel (`6 × kc`) fills about half
    /// of L1 (rounded up to 128 steps: `kc` 768 for 32 KiB), the A block (`mc × kc`) half of
    /// L2, the shared B block (`kc × nc`) a quarter of L3. Measured on the AVX2 box (2 threads,
    /// against numpy in the same rounds): `kc` 512–1024 beat 256–384 by 5–10 % (fewer passes
    /// over C); `mc` 48–96 made no difference that the box's noise showed.
    pub(crate) fn for_caches(l1: usize, l2: usize, l3: usize) -> Blocking {
        let f = std::mem::size_of::<f32>();
        let kc = (l1 / 2 / (MR * f)).next_multiple_of(128).clamp(128, 2048);
        let mc = ((l2 / 2 / (kc * f)) / MR * MR).clamp(MR, 1020);
        let nc = ((l3 / 4 / (kc * f)) / NR * NR).clamp(NR, 8192);
        Blocking { mc, kc, nc }
    }

    /// This host's blocking, from the sizes in `/sys/devices/system/cpu/cpu0/cache` (32 KiB,
    /// 512 KiB and 32 MiB where they cannot be read).
    pub(crate) fn host() -> Blocking {
        static HOST: std::sync::OnceLock<Blocking> = std::sync::OnceLock::new();
        *HOST.get_or_init(|| {
            let (l1, l2, l3) = caches().unwrap_or((32 << 10, 512 << 10, 32 << 20));
            Blocking::for_caches(l1, l2, l3)
        })
    }
}

/// The L1 data, L2 and L3 sizes of cpu0 in bytes, from sysfs.
fn caches() -> Option<(usize, usize, usize)> {
    let (mut l1, mut l2, mut l3) = (None, None, None);
    for i in 0..8 {
        let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{i}");
        let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).ok();
        let (Some(level), Some(kind), Some(size)) = (read("level"), read("type"), read("size"))
        else {
            continue;
        };
        let size = size.trim();
        let bytes = match size.strip_suffix('K') {
            Some(v) => v.parse::<usize>().ok()? << 10,
            None => match size.strip_suffix('M') {
                Some(v) => v.parse::<usize>().ok()? << 20,
                None => size.parse().ok()?,
            },
        };
        match (level.trim(), kind.trim()) {
            ("1", "Data") => l1 = Some(bytes),
            ("2", _) => l2 = Some(bytes),
            ("3", _) => l3 = Some(bytes),
            _ => {}
        }
    }
    Some((l1?, l2.unwrap_or(512 << 10), l3.unwrap_or(32 << 20)))
}

/// Values of padding in front of a scratch buffer so that its packed panels start on a 64-byte
/// cache line.
const ALIGN: usize = 16;

thread_local! {
    /// The caller's packing scratch, kept between calls (taken out while in use, so a nested
    /// call on the same thread just makes its own).
    static SCRATCH: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// `c = op(A)·op(B)`, `op(A)` `m × k`, `op(B)` `k × n`, C row-major `m × n`, on the threads of
/// the current rayon pool. Errors only when the packing scratch cannot be allocated (C is then
/// untouched).
pub(crate) fn sgemm(
    isa: Avx2Fma,
    bl: Blocking,
    (m, n, k): (usize, usize, usize),
    a: View,
    b: View,
    c: &mut [f32],
) -> Result<()> {
    debug_assert_eq!(c.len(), m * n);
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        c.fill(0.0);
        return Ok(());
    }
    // Rows per thread: a multiple of MR.
    let threads = rayon::current_num_threads().clamp(1, m.div_ceil(MR));
    let part = m.div_ceil(threads).next_multiple_of(MR);
    let parts = m.div_ceil(part);
    // Blocks of equal size (no thin last block), at most the blocking's.
    let even = |len: usize, max: usize, unit: usize| {
        let max = max.max(unit);
        len.div_ceil(len.div_ceil(max)).next_multiple_of(unit)
    };
    let kc = even(k, bl.kc, 1);
    let nc = even(n, bl.nc, NR);
    let mc = even(part, bl.mc, MR);
    // Scratch: the B block, then one A block per part, each a multiple of ALIGN values.
    let b_len = (kc * nc.next_multiple_of(NR)).next_multiple_of(ALIGN);
    let a_len = (kc * mc.next_multiple_of(MR)).next_multiple_of(ALIGN);
    let need = b_len + parts * a_len + ALIGN;
    let mut buf = SCRATCH.take();
    if buf.len() < need {
        buf.clear();
        buf.shrink_to_fit();
        buf = try_vec_with_capacity(need)?;
        buf.resize(need, 0.0);
    }
    let off = buf.as_ptr().align_offset(64).min(ALIGN);
    let (bbuf, abufs) = buf[off..off + b_len + parts * a_len].split_at_mut(b_len);
    for jc in (0..n).step_by(nc) {
        let nb = nc.min(n - jc);
        let np = nb.div_ceil(NR);
        for pc in (0..k).step_by(kc) {
            let kb = kc.min(k - pc);
            let ks = pc..pc + kb;
            let bp = &mut bbuf[..np * kb * NR];
            bp.par_chunks_mut(kb * NR)
                .enumerate()
                .for_each(|(jp, panel)| {
                    let j0 = jc + jp * NR;
                    pack_b(panel, &b, ks.clone(), j0..(jc + nb).min(j0 + NR));
                });
            let bp = &*bp;
            c.par_chunks_mut(part * n)
                .zip(abufs.par_chunks_mut(a_len))
                .enumerate()
                .for_each(|(t, (cr, ap))| {
                    let rows = cr.len() / n;
                    for ic in (0..rows).step_by(mc) {
                        let mb = mc.min(rows - ic);
                        let r0 = t * part + ic;
                        let ap = &mut ap[..mb.div_ceil(MR) * MR * kb];
                        pack_a(isa, ap, &a, r0..r0 + mb, ks.clone());
                        let cb = &mut cr[ic * n..(ic + mb) * n];
                        block(isa, kb, (ap, bp), (cb, n), jc..jc + nb, pc > 0);
                    }
                });
        }
    }
    SCRATCH.set(buf);
    Ok(())
}

/// One `mb × nb` block of C (`c`: `mb` whole rows of `ldc`) from packed A (`mb` rows) and packed
/// B (columns `cols` of C): `(ap, bp)` the packed panels, `(c, ldc)` the block and its stride.
fn block(
    isa: Avx2Fma,
    kb: usize,
    (ap, bp): (&[f32], &[f32]),
    (c, ldc): (&mut [f32], usize),
    cols: std::ops::Range<usize>,
    load: bool,
) {
    let mb = c.len() / ldc;
    let mut scratch = [0.0f32; MR * NR];
    let base = c.as_ptr();
    for (jp, bpanel) in bp.chunks_exact(kb * NR).enumerate() {
        let j0 = cols.start + jp * NR;
        let nr = NR.min(cols.end - j0);
        for (ip, apanel) in ap.chunks_exact(kb * MR).enumerate() {
            let i0 = ip * MR;
            let mr = MR.min(mb - i0);
            let at = i0 * ldc + j0;
            // The next tile down, or the top of the next column of tiles.
            let next = if i0 + MR < mb { at + MR * ldc } else { j0 + NR };
            let next = base.wrapping_add(next);
            if mr == MR && nr == NR {
                tile(isa, kb, (apanel, bpanel), (&mut c[at..], ldc), load, next);
                continue;
            }
            // An edge tile: through the scratch tile, only its real part read and written.
            if load {
                for r in 0..mr {
                    scratch[r * NR..r * NR + nr].copy_from_slice(&c[at + r * ldc..][..nr]);
                }
            }
            tile(isa, kb, (apanel, bpanel), (&mut scratch, NR), load, next);
            for r in 0..mr {
                c[at + r * ldc..][..nr].copy_from_slice(&scratch[r * NR..r * NR + nr]);
            }
        }
    }
}
