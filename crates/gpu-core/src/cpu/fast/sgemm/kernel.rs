//! The AVX2 + FMA micro-kernel of the own SGEMM and the packing of its operands.
//!
//! A packed A micro-panel holds [`MR`] rows of `op(A)` for `kb` reduction steps, step-major
//! (`a[p·MR + r]`); a packed B micro-panel holds [`NR`] columns of `op(B)` the same way
//! (`b[p·NR + j]`). Rows or columns past the matrix are zeros; their outputs are computed in a
//! scratch tile and dropped, so they never reach C.

use super::View;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::ops::Range;

/// Rows of the register tile.
pub(crate) const MR: usize = 6;
/// Columns of the register tile (two 8-lane vectors).
pub(crate) const NR: usize = 16;

/// Proof that this host runs AVX2 and FMA instructions: made only by [`Avx2Fma::detect`], which
/// is what makes the `unsafe` calls into [`tile`] sound.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx2Fma(());

impl Avx2Fma {
    /// The proof, where the host has AVX2 and FMA.
    pub(crate) fn detect() -> Option<Avx2Fma> {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                return Some(Avx2Fma(()));
            }
        }
        None
    }
}

/// One `MR × NR` tile of C, rows `ldc` apart starting at `c[0]`:
/// `C[r][j] = (load ? C[r][j] : 0) ⊕ a[r]·b[j] ⊕ … ` over the `kb` packed steps, each output
/// one chain of fused multiply-adds in step order (the value loaded is the chain so far: an f32
/// stored and reloaded unchanged, so splitting the reduction into blocks changes no bit).
/// `next` (rows `ldc` apart) is prefetched meanwhile: the tile that the caller does next.
#[allow(clippy::too_many_arguments)]
pub(crate) fn tile(
    isa: Avx2Fma,
    kb: usize,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    ldc: usize,
    load: bool,
    next: *const f32,
) {
    assert!(
        a.len() >= kb * MR && b.len() >= kb * NR && ldc >= NR && c.len() >= (MR - 1) * ldc + NR,
        "sgemm tile: operands shorter than the tile"
    );
    let _ = isa;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `isa` proves AVX2 and FMA (`Avx2Fma::detect`); the assertion above keeps every
    // access of `tile_avx2` (a[..kb·MR], b[..kb·NR], rows r·ldc..r·ldc + NR of c for r < MR)
    // inside the slices, and `c` is a unique borrow.
    unsafe {
        tile_avx2(kb, a.as_ptr(), b.as_ptr(), c.as_mut_ptr(), ldc, load, next)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2(
    kb: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    load: bool,
    next: *const f32,
) {
    // SAFETY (whole body): the caller (`tile`) guarantees a[..kb·MR], b[..kb·NR] and
    // c[r·ldc..r·ldc + NR] (r < MR) are in bounds, c uniquely borrowed.
    let mut acc = [_mm256_setzero_ps(); 2 * MR];
    if load {
        for r in 0..MR {
            acc[2 * r] = _mm256_loadu_ps(c.add(r * ldc));
            acc[2 * r + 1] = _mm256_loadu_ps(c.add(r * ldc + 8));
        }
    }
    // A prefetch never faults, whatever the address (`wrapping_add`: no pointer arithmetic UB).
    for r in 0..MR {
        _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(r * ldc) as *const i8);
        _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(r * ldc + NR - 1) as *const i8);
    }
    let (mut pa, mut pb) = (a, b);
    macro_rules! step {
        ($pa:expr, $pb:expr) => {{
            let b0 = _mm256_loadu_ps($pb);
            let b1 = _mm256_loadu_ps($pb.add(8));
            for r in 0..MR {
                let ar = _mm256_broadcast_ss(&*$pa.add(r));
                acc[2 * r] = _mm256_fmadd_ps(ar, b0, acc[2 * r]);
                acc[2 * r + 1] = _mm256_fmadd_ps(ar, b1, acc[2 * r + 1]);
            }
        }};
    }
    for _ in 0..kb / 4 {
        step!(pa, pb);
        step!(pa.add(MR), pb.add(NR));
        step!(pa.add(2 * MR), pb.add(2 * NR));
        step!(pa.add(3 * MR), pb.add(3 * NR));
        pa = pa.add(4 * MR);
        pb = pb.add(4 * NR);
    }
    for _ in 0..kb % 4 {
        step!(pa, pb);
        pa = pa.add(MR);
        pb = pb.add(NR);
    }
    for r in 0..MR {
        _mm256_storeu_ps(c.add(r * ldc), acc[2 * r]);
        _mm256_storeu_ps(c.add(r * ldc + 8), acc[2 * r + 1]);
    }
}

/// Packs rows `rows` × reduction steps `ks` of `op(A)` into consecutive micro-panels of
/// [`MR`] rows (the last one zero-padded); `dst` holds `rows.len().div_ceil(MR) · MR · ks.len()`
/// values.
pub(crate) fn pack_a(dst: &mut [f32], a: &View, rows: Range<usize>, ks: Range<usize>) {
    let kb = ks.len();
    for (ip, panel) in dst.chunks_exact_mut(kb * MR).enumerate() {
        let r0 = rows.start + ip * MR;
        let mr = MR.min(rows.end - r0);
        if a.cs == 1 && mr == MR {
            // Each row of op(A) is contiguous along k: read the six rows side by side.
            let row = |r: usize| &a.data[(r0 + r) * a.rs + ks.start..][..kb];
            let rows = [row(0), row(1), row(2), row(3), row(4), row(5)];
            for (p, d) in panel.chunks_exact_mut(MR).enumerate() {
                let d: &mut [f32; MR] = d.try_into().expect("MR values");
                for r in 0..MR {
                    d[r] = rows[r][p];
                }
            }
        } else {
            for (p, d) in panel.chunks_exact_mut(MR).enumerate() {
                let base = (ks.start + p) * a.cs + r0 * a.rs;
                for (r, x) in d.iter_mut().enumerate() {
                    *x = if r < mr { a.data[base + r * a.rs] } else { 0.0 };
                }
            }
        }
    }
}

/// Packs reduction steps `ks` × columns `cols.start..` of `op(B)` into one micro-panel of
/// [`NR`] columns, of which the first `cols.len()` (≤ NR) are real and the rest zeros.
pub(crate) fn pack_b(dst: &mut [f32], b: &View, ks: Range<usize>, cols: Range<usize>) {
    let nr = cols.len();
    if b.cs == 1 && nr == NR {
        for (p, d) in dst.chunks_exact_mut(NR).enumerate() {
            let src = &b.data[(ks.start + p) * b.rs + cols.start..][..NR];
            let d: &mut [f32; NR] = d.try_into().expect("NR values");
            *d = src.try_into().expect("NR values");
        }
    } else if b.rs == 1 {
        // Each column of op(B) is contiguous along k (B stored transposed).
        for j in 0..NR {
            let dj = dst[j..].iter_mut().step_by(NR).take(ks.len());
            if j < nr {
                let src = &b.data[(cols.start + j) * b.cs + ks.start..][..ks.len()];
                dj.zip(src).for_each(|(d, &x)| *d = x);
            } else {
                dj.for_each(|d| *d = 0.0);
            }
        }
    } else {
        for (p, d) in dst.chunks_exact_mut(NR).enumerate() {
            for (j, x) in d.iter_mut().enumerate() {
                *x = if j < nr {
                    b.data[(ks.start + p) * b.rs + (cols.start + j) * b.cs]
                } else {
                    0.0
                };
            }
        }
    }
}
