//! The fast engine's GEMMs, in f32 (and f64 for the QR of the SVD), written as register-tiled
//! loops over fixed-size arrays that the compiler vectorizes for each [`Level`]:
//!
//! - [`Packed`]: a right-hand matrix `W` (`k × n`) packed once into column panels of `2V` (or
//!   `V` for a narrow last panel) lanes, `V` = 16 (f32) or 8 (f64), each with its own range of
//!   `k` (so `[z | h]·W` of a GRU cell skips the zero blocks of its `n` gate). Weights are
//!   packed when the host copy of a model is taken, so a rollout never repacks.
//! - `nn`: `out = epilogue(X·W + init)`, `X` given by rows (`ldx` apart), `MR` rows at a time;
//!   the epilogue is a bias (optionally ReLU) or an accumulation into `out`.
//! - `tn`: `out = Xᵀ·W` for row-major `X` (`k × l`) and `W` (`k × n`): the products of the
//!   randomized SVD with the tall dimension inside (`Qᵀ·A`, Gram matrices `YᵀY`).
//!
//! Accumulation is in the element type (f32 sums of up to a few thousand terms here).

use super::simd::{simd_fn, Real};
use std::ops::Range;

/// How `nn` combines the product with what is there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Epi {
    /// `out = X·W + bias`.
    Bias,
    /// `out = max(0, X·W + bias)`.
    BiasRelu,
    /// `out += X·W` (bias ignored).
    Acc,
}

/// One column panel of a [`Packed`] matrix.
#[derive(Debug, Clone, PartialEq)]
struct Panel {
    /// The first output column.
    col: usize,
    /// The panel's lanes (`2V` or `V`).
    width: usize,
    /// The real columns (`<= width`; the others are zero).
    valid: usize,
    /// The rows of `W` the panel reads (`X`'s columns `k.start..k.end`).
    k: Range<usize>,
    /// Where the panel's `(k.end − k.start) × width` values start in `data`.
    off: usize,
}

/// A block of output columns of a [`Packed`] matrix that reads rows `k` of `W`.
#[derive(Debug, Clone)]
pub(crate) struct Region {
    pub(crate) cols: usize,
    pub(crate) k: Range<usize>,
}

/// A right-hand matrix packed into column panels (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Packed<T> {
    k: usize,
    n: usize,
    panels: Vec<Panel>,
    data: Vec<T>,
    bias: Vec<T>,
}

/// Lanes of one vector register of the widest level: 16 for f32, 8 for f64.
pub(crate) trait Lanes: Real {
    const V: usize;
}
impl Lanes for f32 {
    const V: usize = 16;
}
impl Lanes for f64 {
    const V: usize = 8;
}

impl<T: Lanes> Packed<T> {
    /// Packs `W[p][j] = w(p, j)` (`k × n`, `n` = the regions' columns summed) with `bias(j)`;
    /// each region's columns read only its rows `k` (outside, `W` is taken as zero).
    pub(crate) fn new(
        k: usize,
        regions: &[Region],
        w: impl Fn(usize, usize) -> T,
        bias: impl Fn(usize) -> T,
    ) -> Packed<T> {
        let v = T::V;
        let mut panels = Vec::new();
        let mut data = Vec::new();
        let mut col = 0;
        for r in regions {
            debug_assert!(r.k.end <= k);
            let end = col + r.cols;
            while col < end {
                let valid = (end - col).min(2 * v);
                let width = if valid <= v { v } else { 2 * v };
                let off = data.len();
                for p in r.k.clone() {
                    data.extend(
                        (0..width).map(|j| if j < valid { w(p, col + j) } else { T::ZERO }),
                    );
                }
                panels.push(Panel {
                    col,
                    width,
                    valid,
                    k: r.k.clone(),
                    off,
                });
                col += valid;
            }
        }
        Packed {
            k,
            n: col,
            panels,
            data,
            bias: (0..col).map(bias).collect(),
        }
    }

    /// A dense `k × n` matrix (row-major, `ld` apart) without bias.
    pub(crate) fn dense(k: usize, n: usize, w: &[T], ld: usize) -> Packed<T> {
        let region = Region { cols: n, k: 0..k };
        Packed::new(k, &[region], |p, j| w[p * ld + j], |_| T::ZERO)
    }

    /// The rows of `W` (the width of `X`).
    pub(crate) fn k(&self) -> usize {
        self.k
    }

    /// The output columns.
    pub(crate) fn n(&self) -> usize {
        self.n
    }
}

/// `init + Σ_p x_i[p] · w[p·NR .. p·NR + NR]` for the `MR` rows `x_i` (each `len` long). The
/// accumulators are a local array (kept in registers) and nothing in the loop can panic.
#[inline(always)]
fn nn_tile<T: Real, const MR: usize, const NR: usize, const FMA: bool>(
    x: [&[T]; MR],
    w: &[T],
    len: usize,
    init: [[T; NR]; MR],
) -> [[T; NR]; MR] {
    let mut acc = init;
    let x = x.map(|r| &r[..len]);
    for (p, wr) in (0..len).zip(w.chunks_exact(NR)) {
        let wr: &[T; NR] = wr.try_into().expect("chunks of NR");
        for i in 0..MR {
            let xi = x[i][p];
            for j in 0..NR {
                acc[i][j] = T::madd::<FMA>(xi, wr[j], acc[i][j]);
            }
        }
    }
    acc
}

/// One panel of `nn` over all rows, `MR` at a time (a last partial block repeats its last row
/// and drops the extra results).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn nn_panel<T: Real, const MR: usize, const NR: usize, const FMA: bool>(
    x: &[T],
    ldx: usize,
    rows: usize,
    w: &Packed<T>,
    p: &Panel,
    out: &mut [T],
    ldo: usize,
    epi: Epi,
) {
    let data = &w.data[p.off..p.off + p.k.len() * NR];
    let bias = &w.bias[p.col..p.col + p.valid];
    for r0 in (0..rows).step_by(MR) {
        let mr = MR.min(rows - r0);
        let xs: [&[T]; MR] = std::array::from_fn(|i| {
            let r = r0 + i.min(mr - 1);
            &x[r * ldx + p.k.start..r * ldx + p.k.end]
        });
        let mut acc = [[T::ZERO; NR]; MR];
        for (i, a) in acc.iter_mut().enumerate().take(mr) {
            let o = (r0 + i) * ldo + p.col;
            let init = if epi == Epi::Acc {
                &out[o..o + p.valid]
            } else {
                bias
            };
            a[..p.valid].copy_from_slice(init);
        }
        let acc = nn_tile::<T, MR, NR, FMA>(xs, data, p.k.len(), acc);
        for (i, a) in acc.iter().enumerate().take(mr) {
            let o = (r0 + i) * ldo + p.col;
            let dst = &mut out[o..o + p.valid];
            if epi == Epi::BiasRelu {
                for (d, &s) in dst.iter_mut().zip(a) {
                    *d = T::max(s, T::ZERO);
                }
            } else {
                dst.copy_from_slice(&a[..p.valid]);
            }
        }
    }
}

/// `nn` over every panel: panels of `W2 = 2V` lanes with `MR2` rows a tile, of `W1 = V` lanes
/// with `MR1`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn nn_impl<
    T: Lanes,
    const W2: usize,
    const MR2: usize,
    const W1: usize,
    const MR1: usize,
    const FMA: bool,
>(
    x: &[T],
    ldx: usize,
    rows: usize,
    w: &Packed<T>,
    out: &mut [T],
    ldo: usize,
    epi: Epi,
) {
    for p in &w.panels {
        if p.width == W2 {
            nn_panel::<T, MR2, W2, FMA>(x, ldx, rows, w, p, out, ldo, epi);
        } else {
            nn_panel::<T, MR1, W1, FMA>(x, ldx, rows, w, p, out, ldo, epi);
        }
    }
}

/// Errors (as a panic: the callers size their buffers) unless `X` and `out` hold `rows` rows.
fn check_nn<T>(x: &[T], ldx: usize, rows: usize, k: usize, out: &[T], ldo: usize, n: usize) {
    assert!(
        rows == 0 || (x.len() >= (rows - 1) * ldx + k && ldx >= k),
        "gemm: X too short"
    );
    assert!(
        rows == 0 || (out.len() >= (rows - 1) * ldo + n && ldo >= n),
        "gemm: out too short"
    );
}

simd_fn! {
    /// `out[i·ldo + j] = epi(Σ_p x[i·ldx + p]·W[p][j])` for `rows` rows, f32.
    fn nn_f32_raw(x: &[f32], ldx: usize, rows: usize, w: &Packed<f32>, out: &mut [f32], ldo: usize, epi: Epi) {
        avx512: nn_impl::<f32, 32, 8, 16, 12, true>(x, ldx, rows, w, out, ldo, epi),
        avx2: nn_impl::<f32, 32, 3, 16, 6, true>(x, ldx, rows, w, out, ldo, epi),
        base: nn_impl::<f32, 32, 1, 16, 2, false>(x, ldx, rows, w, out, ldo, epi),
    }
}

simd_fn! {
    /// The f64 twin of [`nn_f32_raw`].
    fn nn_f64_raw(x: &[f64], ldx: usize, rows: usize, w: &Packed<f64>, out: &mut [f64], ldo: usize, epi: Epi) {
        avx512: nn_impl::<f64, 16, 8, 8, 12, true>(x, ldx, rows, w, out, ldo, epi),
        avx2: nn_impl::<f64, 16, 3, 8, 6, true>(x, ldx, rows, w, out, ldo, epi),
        base: nn_impl::<f64, 16, 1, 8, 2, false>(x, ldx, rows, w, out, ldo, epi),
    }
}

/// `out = epi(X·W)` in f32 (see [`Epi`]); `X` is `rows × w.k()` (`ldx` apart), `out` is
/// `rows × w.n()` (`ldo` apart). Panics when the slices are too short (a caller's bug).
pub(crate) fn nn_f32(
    x: &[f32],
    ldx: usize,
    rows: usize,
    w: &Packed<f32>,
    out: &mut [f32],
    ldo: usize,
    epi: Epi,
) {
    check_nn(x, ldx, rows, w.k, out, ldo, w.n);
    nn_f32_raw(x, ldx, rows, w, out, ldo, epi)
}

/// The f64 twin of [`nn_f32`].
pub(crate) fn nn_f64(
    x: &[f64],
    ldx: usize,
    rows: usize,
    w: &Packed<f64>,
    out: &mut [f64],
    ldo: usize,
    epi: Epi,
) {
    check_nn(x, ldx, rows, w.k, out, ldo, w.n);
    nn_f64_raw(x, ldx, rows, w, out, ldo, epi)
}

/// The shape of a `tn` product: `out (l × n, ldo) = Xᵀ·W`, `X` `k × l` (`ldx`), `W` `k × n`
/// (`ldw`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TnShape {
    pub(crate) k: usize,
    pub(crate) l: usize,
    pub(crate) n: usize,
    pub(crate) ldx: usize,
    pub(crate) ldw: usize,
    pub(crate) ldo: usize,
}

/// `tn`: `X` is copied into a `k × lp` buffer (`lp` = `l` rounded up to `MR`, zero-padded);
/// `W`'s columns are taken `NR` at a time straight from `w` (a last partial block from a
/// zero-padded copy).
#[inline(always)]
fn tn_impl<T: Real, const MR: usize, const NR: usize, const FMA: bool>(
    s: TnShape,
    x: &[T],
    w: &[T],
    out: &mut [T],
) {
    let lp = s.l.div_ceil(MR) * MR;
    let mut xp = vec![T::ZERO; s.k * lp];
    for p in 0..s.k {
        xp[p * lp..p * lp + s.l].copy_from_slice(&x[p * s.ldx..p * s.ldx + s.l]);
    }
    let mut tail = Vec::new();
    for j0 in (0..s.n).step_by(NR) {
        let nr = NR.min(s.n - j0);
        let (wb, ldw): (&[T], usize) = if nr == NR {
            (&w[j0..], s.ldw)
        } else {
            tail.clear();
            for p in 0..s.k {
                tail.extend_from_slice(&w[p * s.ldw + j0..p * s.ldw + j0 + nr]);
                tail.extend(std::iter::repeat_n(T::ZERO, NR - nr));
            }
            (&tail, NR)
        };
        for r0 in (0..s.l).step_by(MR) {
            let acc = tn_tile::<T, MR, NR, FMA>(&xp[r0..], lp, wb, ldw, s.k);
            for (i, a) in acc.iter().enumerate().take(s.l - r0) {
                let o = (r0 + i) * s.ldo + j0;
                out[o..o + nr].copy_from_slice(&a[..nr]);
            }
        }
    }
}

/// `Σ_p x[p·ldx .. + MR] ⊗ w[p·ldw .. + NR]` over `k` steps, accumulators in registers.
#[inline(always)]
fn tn_tile<T: Real, const MR: usize, const NR: usize, const FMA: bool>(
    x: &[T],
    ldx: usize,
    w: &[T],
    ldw: usize,
    k: usize,
) -> [[T; NR]; MR] {
    let mut acc = [[T::ZERO; NR]; MR];
    for (xr, wr) in x.chunks(ldx).zip(w.chunks(ldw)).take(k) {
        let xr: &[T; MR] = xr[..MR].try_into().expect("MR lanes");
        let wr: &[T; NR] = wr[..NR].try_into().expect("NR lanes");
        for i in 0..MR {
            for j in 0..NR {
                acc[i][j] = T::madd::<FMA>(xr[i], wr[j], acc[i][j]);
            }
        }
    }
    acc
}

fn check_tn<T>(s: TnShape, x: &[T], w: &[T], out: &[T]) {
    let fits = |len: usize, rows: usize, ld: usize, cols: usize| {
        rows == 0 || cols == 0 || (ld >= cols && len >= (rows - 1) * ld + cols)
    };
    assert!(fits(x.len(), s.k, s.ldx, s.l), "gemm tn: X too short");
    assert!(fits(w.len(), s.k, s.ldw, s.n), "gemm tn: W too short");
    assert!(fits(out.len(), s.l, s.ldo, s.n), "gemm tn: out too short");
}

simd_fn! {
    fn tn_f32_raw(s: TnShape, x: &[f32], w: &[f32], out: &mut [f32]) {
        avx512: tn_impl::<f32, 7, 32, true>(s, x, w, out),
        avx2: tn_impl::<f32, 6, 16, true>(s, x, w, out),
        base: tn_impl::<f32, 2, 16, false>(s, x, w, out),
    }
}

simd_fn! {
    fn tn_f64_raw(s: TnShape, x: &[f64], w: &[f64], out: &mut [f64]) {
        avx512: tn_impl::<f64, 7, 16, true>(s, x, w, out),
        avx2: tn_impl::<f64, 6, 8, true>(s, x, w, out),
        base: tn_impl::<f64, 2, 8, false>(s, x, w, out),
    }
}

/// `out = Xᵀ·W` in f32 (see [`TnShape`]). Panics when a slice is too short (a caller's bug).
pub(crate) fn tn_f32(s: TnShape, x: &[f32], w: &[f32], out: &mut [f32]) {
    check_tn(s, x, w, out);
    tn_f32_raw(s, x, w, out)
}

/// The f64 twin of [`tn_f32`].
pub(crate) fn tn_f64(s: TnShape, x: &[f64], w: &[f64], out: &mut [f64]) {
    check_tn(s, x, w, out);
    tn_f64_raw(s, x, w, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    type Nn<T> = fn(&[T], usize, usize, &Packed<T>, &mut [T], usize, Epi);
    type Tn<T> = fn(TnShape, &[T], &[T], &mut [T]);

    fn rand(r: &mut StdRng, n: usize) -> Vec<f64> {
        (0..n).map(|_| r.random_range(-1.0..1.0)).collect()
    }

    /// Every level's tiles (run here as plain code: the target features change the machine
    /// code, not the arithmetic) against a naive f64 product, with odd shapes, regions with
    /// their own `k` ranges, all three epilogues and strided rows.
    #[test]
    fn nn_matches_a_naive_product_for_every_tile_size() {
        let mut r = StdRng::seed_from_u64(11);
        for (rows, k, cols) in [(1, 1, 1), (5, 7, 50), (17, 33, 16), (32, 40, 97)] {
            let split = k / 2;
            let regions = [
                Region {
                    cols: cols / 2,
                    k: 0..k,
                },
                Region {
                    cols: cols - cols / 2,
                    k: split..k,
                },
            ];
            let wv = rand(&mut r, k * cols);
            let bv = rand(&mut r, cols);
            let w_of = |p: usize, j: usize| {
                if j >= cols / 2 && p < split {
                    0.0
                } else {
                    wv[p * cols + j]
                }
            };
            let ldx = k + 3;
            let x = rand(&mut r, rows * ldx);
            let ldo = cols + 2;
            let base = rand(&mut r, rows * ldo);
            let want = |epi: Epi, i: usize, j: usize| {
                let s: f64 = (0..k).map(|p| x[i * ldx + p] * w_of(p, j)).sum();
                match epi {
                    Epi::Bias => s + bv[j],
                    Epi::BiasRelu => (s + bv[j]).max(0.0),
                    Epi::Acc => s + base[i * ldo + j],
                }
            };
            let w64 = Packed::<f64>::new(k, &regions, w_of, |j| bv[j]);
            let w32 = Packed::<f32>::new(k, &regions, |p, j| w_of(p, j) as f32, |j| bv[j] as f32);
            let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
            for epi in [Epi::Bias, Epi::BiasRelu, Epi::Acc] {
                let runs64: [Nn<f64>; 4] = [
                    nn_impl::<f64, 16, 8, 8, 12, true>,
                    nn_impl::<f64, 16, 3, 8, 6, true>,
                    nn_impl::<f64, 16, 1, 8, 2, false>,
                    nn_f64,
                ];
                for run in runs64 {
                    let mut out = base.clone();
                    run(&x, ldx, rows, &w64, &mut out, ldo, epi);
                    for i in 0..rows {
                        for j in 0..cols {
                            let (g, e) = (out[i * ldo + j], want(epi, i, j));
                            assert!((g - e).abs() < 1e-12, "{epi:?} {rows}x{k}x{cols} ({i},{j})");
                        }
                        assert_eq!(
                            out[i * ldo + cols..i * ldo + ldo],
                            base[i * ldo + cols..i * ldo + ldo]
                        );
                    }
                }
                let runs32: [Nn<f32>; 4] = [
                    nn_impl::<f32, 32, 8, 16, 12, true>,
                    nn_impl::<f32, 32, 3, 16, 6, true>,
                    nn_impl::<f32, 32, 1, 16, 2, false>,
                    nn_f32,
                ];
                for run in runs32 {
                    let mut out: Vec<f32> = base.iter().map(|&v| v as f32).collect();
                    run(&x32, ldx, rows, &w32, &mut out, ldo, epi);
                    for i in 0..rows {
                        for j in 0..cols {
                            let (g, e) = (f64::from(out[i * ldo + j]), want(epi, i, j));
                            assert!((g - e).abs() < 1e-5 * (1.0 + k as f64), "{epi:?} ({i},{j})");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn tn_matches_a_naive_product_for_every_tile_size() {
        let mut r = StdRng::seed_from_u64(12);
        for (k, l, n) in [(1, 1, 1), (9, 5, 40), (50, 42, 33), (64, 7, 100)] {
            let s = TnShape {
                k,
                l,
                n,
                ldx: l + 1,
                ldw: n + 2,
                ldo: n + 3,
            };
            let x = rand(&mut r, k * s.ldx);
            let w = rand(&mut r, k * s.ldw);
            let want = |i: usize, j: usize| -> f64 {
                (0..k).map(|p| x[p * s.ldx + i] * w[p * s.ldw + j]).sum()
            };
            let runs: [Tn<f64>; 4] = [
                tn_impl::<f64, 7, 16, true>,
                tn_impl::<f64, 6, 8, true>,
                tn_impl::<f64, 2, 8, false>,
                tn_f64,
            ];
            for run in runs {
                let mut out = vec![7.0; l * s.ldo];
                run(s, &x, &w, &mut out);
                for i in 0..l {
                    for j in 0..n {
                        assert!((out[i * s.ldo + j] - want(i, j)).abs() < 1e-12);
                    }
                    assert!(out[i * s.ldo + n..(i + 1) * s.ldo]
                        .iter()
                        .all(|&v| v == 7.0));
                }
            }
            let (x32, w32): (Vec<f32>, Vec<f32>) = (
                x.iter().map(|&v| v as f32).collect(),
                w.iter().map(|&v| v as f32).collect(),
            );
            let runs: [Tn<f32>; 4] = [
                tn_impl::<f32, 7, 32, true>,
                tn_impl::<f32, 6, 16, true>,
                tn_impl::<f32, 2, 16, false>,
                tn_f32,
            ];
            for run in runs {
                let mut out = vec![0.0f32; l * s.ldo];
                run(s, &x32, &w32, &mut out);
                for i in 0..l {
                    for j in 0..n {
                        let e = (f64::from(out[i * s.ldo + j]) - want(i, j)).abs();
                        assert!(e < 1e-5 * (1.0 + k as f64));
                    }
                }
            }
        }
    }
}
