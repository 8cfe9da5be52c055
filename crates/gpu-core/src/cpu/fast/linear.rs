//! The fast mode's products by a compact weight: `y[m, n] = x[m, k] · W[n, k]ᵀ` where `W` is
//! stored as **bf16**, as **f16** pairs, or quantized (**int8** per output row, **int4** Q4_1
//! in groups of 128: the packed u32 layout of `nn::quant`). The inference engine's projections on the CPU.
//!
//! **The weight stays compact.** It is never widened whole: the kernels widen stretches of its
//! rows into f32 scratch that stays in cache, and the values they widen to are exactly the
//! reference's (bf16 → f32 is exact; a quantized value is `models::quant`'s f32 expression,
//! `q·s`, or `q·s` then `+ m`, each rounded once, the same function as `cpu/quant.rs`).
//!
//! - **Few rows** (`m` ≤ [`DIRECT_MAX_M`]: decode): rows of `W` in parallel on all cores; each
//!   row is widened by stretches of [`KC`] inputs into a stack buffer and multiplied with every
//!   row of `x`, four rows of `x` at a time against each loaded stretch. Every output is summed in
//!   [`LANES`] f32 lanes (input `t` in lane `t % 16`, a multiply then an add, never fused), the
//!   lanes then added in a fixed tree: the same bits at every instruction-set level, thread count
//!   and `m`.
//! - **Many rows** (prefill): blocks of rows of `W` widened into an f32 scratch of about
//!   [`BLOCK_FLOATS`] floats, each block multiplied by the `gemm` crate's SGEMM (threaded).
//!
//! **Error.** Both paths sum `k` exact-valued f32 products in f32, so each output is within
//! `γ_k·Σ_t |x_t·w_t|` (`γ_k = k·u/(1 − k·u)`, `u = 2⁻²⁴`) of the exact sum, for any order of
//! the additions (the tests check this bound against the f64 reference); a bf16 output adds
//! its rounding (2⁻⁸ relative). NaN and infinities propagate as in the naive sum.

use super::{multiversion, Isa};
use crate::backend::BufferInfo;
use crate::cpu::host::try_zeroed_vec;
use crate::cpu::{widen, CpuStorage};
use crate::error::Result;
use crate::nn::quant::{QuantFormat, QuantSpec, QUANT_GROUP};
use half::bf16;
use rayon::prelude::*;

/// f32 lanes each output is summed in.
pub(crate) const LANES: usize = 16;

/// Inputs of a weight row widened at a time by the direct kernel (a multiple of [`LANES`] and
/// of [`QUANT_GROUP`]; 8 KiB of f32, in L1).
pub(crate) const KC: usize = 2048;

/// The most rows of `x` the direct kernel takes; above, widened blocks and the `gemm` crate.
pub(crate) const DIRECT_MAX_M: usize = 16;

/// About the f32 elements of one widened block of `W` on the GEMM path (4 MiB).
pub(crate) const BLOCK_FLOATS: usize = 1 << 20;

/// A `[n, k]` weight in its compact storage (lengths checked by the caller).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Weight<'a> {
    /// Row-major bf16, `n·k` elements.
    Bf16 { w: &'a [bf16], n: usize, k: usize },
    /// Packed int8 or int4 (`nn::quant`'s layout; `spec.m` is not read).
    Quant {
        spec: QuantSpec,
        data: &'a [u32],
        scales: &'a [f32],
        mins: &'a [f32],
    },
}

impl Weight<'_> {
    /// `(n, k)`.
    pub(crate) fn dims(&self) -> (usize, usize) {
        match *self {
            Weight::Bf16 { n, k, .. } => (n, k),
            Weight::Quant { spec, .. } => (spec.n, spec.k),
        }
    }

    /// Inputs `c0 .. c0 + out.len()` of row `r` as f32, into `out`. `c0` is a multiple of
    /// [`QUANT_GROUP`], and `out` ends at the row's end or at a multiple of it.
    fn widen(&self, isa: Isa, r: usize, c0: usize, out: &mut [f32]) {
        let len = out.len();
        match *self {
            Weight::Bf16 { w, k, .. } => widen_bf16(isa, &w[r * k + c0..][..len], out),
            Weight::Quant {
                spec,
                data,
                scales,
                mins,
            } => {
                let words = &data[r * spec.words_per_row()..][..spec.words_per_row()];
                let per = spec.format.values_per_word();
                let words = &words[c0 / per..][..len / per];
                match spec.format {
                    QuantFormat::Int8 => widen_int8(isa, words, scales[r], out),
                    QuantFormat::Int4 => {
                        let g = r * spec.format.groups_per_row(spec.k) + c0 / QUANT_GROUP;
                        widen_int4(isa, words, &scales[g..], &mins[g..], out)
                    }
                    QuantFormat::F16 => widen_f16(isa, words, out),
                }
            }
        }
    }
}

#[inline(always)]
fn widen_bf16_body(w: &[bf16], out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(w) {
        *o = f32::from_bits((v.to_bits() as u32) << 16);
    }
}

#[inline(always)]
fn widen_int8_body(words: &[u32], scale: f32, out: &mut [f32]) {
    for (o, &w) in out.chunks_exact_mut(4).zip(words) {
        for (o, b) in o.iter_mut().zip(w.to_le_bytes()) {
            *o = b as i8 as f32 * scale;
        }
    }
}

#[inline(always)]
fn widen_int4_body(words: &[u32], scales: &[f32], mins: &[f32], out: &mut [f32]) {
    let per_group = QUANT_GROUP / 8;
    let groups = out.chunks_mut(QUANT_GROUP).zip(words.chunks(per_group));
    for ((o, ws), (&s, &m)) in groups.zip(scales.iter().zip(mins)) {
        for (o, &w) in o.chunks_exact_mut(8).zip(ws) {
            for (l, o) in o.iter_mut().enumerate() {
                // Two roundings, as `models::quant::Quantized::value` writes it.
                *o = ((w >> (4 * l)) & 0xf) as f32 * s + m;
            }
        }
    }
}

#[inline(always)]
fn widen_f16_body(words: &[u32], out: &mut [f32]) {
    for (o, &w) in out.chunks_exact_mut(2).zip(words) {
        o[0] = half::f16::from_bits(w as u16).to_f32();
        o[1] = half::f16::from_bits((w >> 16) as u16).to_f32();
    }
}

multiversion! {
    /// f16 pairs (element `2i` in the low half of word `i`) → f32 (exact).
    fn widen_f16(words: &[u32], out: &mut [f32]) => widen_f16_body
}
multiversion! {
    /// bf16 → f32 (exact).
    fn widen_bf16(w: &[bf16], out: &mut [f32]) => widen_bf16_body
}
multiversion! {
    /// int8 bytes (4 a word, little-endian) → `q·s`.
    fn widen_int8(words: &[u32], scale: f32, out: &mut [f32]) => widen_int8_body
}
multiversion! {
    /// int4 nibbles (8 a word, low first), groups of 128 from `scales[0]`, `mins[0]` → `q·s + m`.
    fn widen_int4(words: &[u32], scales: &[f32], mins: &[f32], out: &mut [f32]) => widen_int4_body
}

/// One output's running lane sums.
type Acc = [f32; LANES];

/// `acc[l] += x[l]·w[l]` over one stretch: whole blocks of [`LANES`], then the tail, input `t`
/// always in lane `t % LANES` (the stretch starts at a multiple of [`LANES`]).
#[inline(always)]
fn add_products(acc: &mut Acc, x: &[f32], w: &[f32]) {
    let (xb, wb) = (x.chunks_exact(LANES), w.chunks_exact(LANES));
    let (xt, wt) = (xb.remainder(), wb.remainder());
    for (x, w) in xb.zip(wb) {
        for l in 0..LANES {
            acc[l] += x[l] * w[l];
        }
    }
    for l in 0..xt.len() {
        acc[l] += xt[l] * wt[l];
    }
}

/// [`add_products`] for four rows of `x` against one stretch of `w`, loaded once: each row's
/// lanes see the same operations as in [`add_products`].
#[inline(always)]
fn add_products4(acc: &mut [Acc; 4], x: [&[f32]; 4], w: &[f32]) {
    let blocks = w.len() / LANES;
    let [a0, a1, a2, a3] = acc;
    for q in 0..blocks {
        let c = q * LANES;
        let w = &w[c..c + LANES];
        let x0 = &x[0][c..c + LANES];
        let x1 = &x[1][c..c + LANES];
        let x2 = &x[2][c..c + LANES];
        let x3 = &x[3][c..c + LANES];
        for l in 0..LANES {
            a0[l] += x0[l] * w[l];
            a1[l] += x1[l] * w[l];
            a2[l] += x2[l] * w[l];
            a3[l] += x3[l] * w[l];
        }
    }
    let whole = blocks * LANES;
    for (a, x) in [a0, a1, a2, a3].into_iter().zip(x) {
        add_products(a, &x[whole..], &w[whole..]);
    }
}

/// The stretch `c0 .. c0 + w.len()` of every row of `x` (`m × k`) times `w`, into `acc` (one
/// per row).
#[inline(always)]
fn accumulate_body(x: &[f32], k: usize, c0: usize, w: &[f32], acc: &mut [Acc]) {
    let row = |i: usize| &x[i * k + c0..][..w.len()];
    for (q, a) in acc.chunks_mut(4).enumerate() {
        let i = 4 * q;
        if let Some(a4) = a.first_chunk_mut::<4>() {
            add_products4(a4, [row(i), row(i + 1), row(i + 2), row(i + 3)], w);
        } else {
            for (r, a) in a.iter_mut().enumerate() {
                add_products(a, row(i + r), w);
            }
        }
    }
}

multiversion! {
    /// `acc[i] += x[i, c0..]·w` lane by lane (see [`accumulate_body`]).
    fn accumulate(x: &[f32], k: usize, c0: usize, w: &[f32], acc: &mut [Acc]) => accumulate_body
}

/// The lanes' sum in a fixed tree (halves added pairwise).
fn reduce(mut a: Acc) -> f32 {
    let mut half = LANES / 2;
    while half > 0 {
        for l in 0..half {
            a[l] += a[l + half];
        }
        half /= 2;
    }
    a[0]
}

/// [`matmul_t`] on the backend's buffers at the host's best level: `x` (`m × k`) f32 or bf16
/// (widened once), `out` (`m × n`) f32 (written in place) or bf16 (rounded once, to nearest
/// even). Lengths are the caller's checks; a dtype other than f32 or bf16 is an error.
pub(crate) fn matmul_t_into(
    x: &CpuStorage,
    m: usize,
    w: Weight<'_>,
    out: &mut CpuStorage,
) -> Result<()> {
    let wide;
    let x = match x {
        CpuStorage::BF16(_) => {
            wide = widen::widen(x)?;
            wide.as_f32()?
        }
        other => other.as_f32()?,
    };
    let isa = Isa::best();
    if let CpuStorage::F32(y) = out {
        return matmul_t(isa, x, m, w, y);
    }
    let mut y = try_zeroed_vec::<f32>(out.len())?;
    matmul_t(isa, x, m, w, &mut y)?;
    widen::narrow_into(&y, out)
}

/// `y = x·Wᵀ` into the f32 `y` (`m × n`); `x` is `m × k` f32 (lengths checked by the caller). The direct kernel for
/// `m` ≤ [`DIRECT_MAX_M`], else widened blocks and the `gemm` crate. Errors only when a
/// scratch buffer cannot be allocated ([`crate::GpuError::OutOfMemory`]).
pub(crate) fn matmul_t(isa: Isa, x: &[f32], m: usize, w: Weight<'_>, y: &mut [f32]) -> Result<()> {
    let (n, k) = w.dims();
    debug_assert_eq!((x.len(), y.len()), (m * k, m * n));
    if m == 0 || n == 0 {
        return Ok(());
    }
    if m <= DIRECT_MAX_M {
        direct(isa, x, w, m, y)
    } else {
        blocked(isa, x, w, m, y)
    }
}

/// The least rows of `W` one task takes: some 64 Ki weight elements (fewer tasks cost rayon
/// less than they save on small matrices).
fn min_rows(k: usize) -> usize {
    ((1 << 16) / k.max(1)).max(1)
}

/// The direct kernel (see the module docs): each task takes rows of `W` and writes their
/// columns of `y` through a transposed `n × m` result.
fn direct(isa: Isa, x: &[f32], w: Weight<'_>, m: usize, y: &mut [f32]) -> Result<()> {
    let (n, k) = w.dims();
    let mut yt = try_zeroed_vec::<f32>(n * m)?;
    yt.par_chunks_mut(m)
        .with_min_len(min_rows(k))
        .enumerate()
        .for_each(|(j, out)| {
            let mut acc = [[0f32; LANES]; DIRECT_MAX_M];
            let acc = &mut acc[..m];
            let mut buf = [0f32; KC];
            for c0 in (0..k).step_by(KC) {
                let wb = &mut buf[..(k - c0).min(KC)];
                w.widen(isa, j, c0, wb);
                accumulate(isa, x, k, c0, wb, acc);
            }
            for (o, a) in out.iter_mut().zip(acc.iter()) {
                *o = reduce(*a);
            }
        });
    for (i, yr) in y.chunks_exact_mut(n).enumerate() {
        for (j, o) in yr.iter_mut().enumerate() {
            *o = yt[j * m + i];
        }
    }
    Ok(())
}

/// The GEMM path: blocks of rows of `W` widened (in parallel) into one reused scratch, each
/// block's columns of `y` computed by the `gemm` crate.
fn blocked(isa: Isa, x: &[f32], w: Weight<'_>, m: usize, y: &mut [f32]) -> Result<()> {
    let (n, k) = w.dims();
    if k == 0 {
        y.fill(0.0);
        return Ok(());
    }
    let nb = (BLOCK_FLOATS / k).max(16).min(n);
    let mut scratch = try_zeroed_vec::<f32>(nb * k)?;
    for j0 in (0..n).step_by(nb) {
        let rows = nb.min(n - j0);
        let block = &mut scratch[..rows * k];
        block
            .par_chunks_mut(k)
            .with_min_len(min_rows(k))
            .enumerate()
            .for_each(|(r, out)| w.widen(isa, j0 + r, 0, out));
        let dst = &mut y[j0..];
        // SAFETY: `x` holds `m·k` elements read at `i·k + t` (i < m, t < k); `block` holds
        // `rows·k` read at `r·k + t` (the rhs's element (t, r): row stride 1, column stride k);
        // the destination (i, r) is written at `dst[i·n + r]`, i < m, r < rows ≤ n − j0, so
        // below `(m−1)·n + n − j0 ≤ dst.len() = m·n − j0`. `dst` is a `&mut` slice, disjoint
        // from both inputs.
        unsafe {
            crate::cpu::gemm_crate(
                (m, rows, k),
                (dst.as_mut_ptr(), n as isize),
                (x.as_ptr(), 1, k as isize),
                (block.as_ptr(), k as isize, 1),
            )
        }
    }
    Ok(())
}
