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
/// `(a, b)` are the packed panels of A and B.
pub(crate) fn tile(
    isa: Avx2Fma,
    kb: usize,
    (a, b): (&[f32], &[f32]),
    (c, ldc): (&mut [f32], usize),
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
pub(crate) fn pack_a(
    isa: Avx2Fma,
    dst: &mut [f32],
    a: &View,
    rows: Range<usize>,
    ks: Range<usize>,
) {
    let kb = ks.len();
    for (ip, panel) in dst.chunks_exact_mut(kb * MR).enumerate() {
        let r0 = rows.start + ip * MR;
        let mr = MR.min(rows.end - r0);
        if a.cs == 1 && mr == MR {
            // Each row of op(A) is contiguous along k: read the six rows side by side.
            let row = |r: usize| &a.data[(r0 + r) * a.rs + ks.start..][..kb];
            let src = [row(0), row(1), row(2), row(3), row(4), row(5)];
            let whole = kb / 8 * 8;
            let _ = isa;
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `isa` proves AVX2 (`Avx2Fma::detect`); the rows hold `kb ≥ whole` values
            // and the panel `kb·MR ≥ whole·MR`.
            unsafe {
                transpose6(src, whole, panel.as_mut_ptr());
            }
            #[cfg(not(target_arch = "x86_64"))]
            let whole = 0;
            for (p, d) in panel.chunks_exact_mut(MR).enumerate().skip(whole) {
                for (r, x) in d.iter_mut().enumerate() {
                    *x = src[r][p];
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

/// `dst[p·MR + r] = src[r][p]` for `p < len` (a multiple of 8), eight steps at a time: six rows
/// and two zero rows transposed as an 8 × 8 block, each step stored as 4 + 2 lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn transpose6(src: [&[f32]; MR], len: usize, dst: *mut f32) {
    // SAFETY (whole body): the caller guarantees src[r][..len] and dst[..len·MR] exist.
    let zero = _mm256_setzero_ps();
    for p in (0..len).step_by(8) {
        let x: [__m256; 8] = [
            _mm256_loadu_ps(src[0].as_ptr().add(p)),
            _mm256_loadu_ps(src[1].as_ptr().add(p)),
            _mm256_loadu_ps(src[2].as_ptr().add(p)),
            _mm256_loadu_ps(src[3].as_ptr().add(p)),
            _mm256_loadu_ps(src[4].as_ptr().add(p)),
            _mm256_loadu_ps(src[5].as_ptr().add(p)),
            zero,
            zero,
        ];
        // Pairs of rows interleaved, then quadruples, then the 128-bit halves swapped.
        let t0 = _mm256_unpacklo_ps(x[0], x[1]);
        let t1 = _mm256_unpackhi_ps(x[0], x[1]);
        let t2 = _mm256_unpacklo_ps(x[2], x[3]);
        let t3 = _mm256_unpackhi_ps(x[2], x[3]);
        let t4 = _mm256_unpacklo_ps(x[4], x[5]);
        let t5 = _mm256_unpackhi_ps(x[4], x[5]);
        let t6 = _mm256_unpacklo_ps(x[6], x[7]);
        let t7 = _mm256_unpackhi_ps(x[6], x[7]);
        let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        // Step q's column (rows 0..8) is the 128-bit half q / 4 of (u_q%4, u_q%4+4).
        let lo = [u0, u1, u2, u3];
        let hi = [u4, u5, u6, u7];
        let d = dst.add(p * MR);
        for q in 0..4 {
            let (a, b) = (lo[q], hi[q]);
            // Step q: rows 0..4 in a's low half, rows 4..6 in b's low half; step q + 4: the
            // high halves.
            _mm_storeu_ps(d.add(q * MR), _mm256_castps256_ps128(a));
            _mm_store_sd(
                d.add(q * MR + 4) as *mut f64,
                _mm_castps_pd(_mm256_castps256_ps128(b)),
            );
            _mm_storeu_ps(d.add((q + 4) * MR), _mm256_extractf128_ps::<1>(a));
            _mm_store_sd(
                d.add((q + 4) * MR + 4) as *mut f64,
                _mm_castps_pd(_mm256_extractf128_ps::<1>(b)),
            );
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
