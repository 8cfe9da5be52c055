//! The workspace's packed-panel GEMM, in f32 and f64 (the world model's fast engine: its GRU
//! cells, corrections and the QR of its SVD), written as register-tiled loops over fixed-size
//! arrays that the compiler vectorizes for each [`Isa`](super::Isa) level through [`simd_fn!`]:
//!
//! - [`Packed`]: a right-hand matrix `W` (`k × n`) packed once into column panels of `2V` (or
//!   `V` for a narrow last panel) lanes, `V` = 16 (f32) or 8 (f64), each with its own range of
//!   `k` (so `[z | h]·W` of a GRU cell skips the zero blocks of its `n` gate). Weights are
//!   packed when the host copy of a model is taken, so a rollout never repacks.
//! - `nn`: `out = epilogue(X·W + init)`, `X` given by rows (`ldx` apart), `MR` rows at a time;
//!   the epilogue is a bias or an accumulation into `out`.
//!
//! Accumulation is in the element type (f32 sums of up to a few thousand terms here).

use crate::simd_fn;
use std::ops::Range;

/// The element types of the kernels: `f32` and `f64`.
pub trait Real:
    Copy
    + Default
    + Send
    + Sync
    + PartialEq
    + std::fmt::Debug
    + std::ops::Add<Output = Self>
    + std::ops::Mul<Output = Self>
    + 'static
{
    /// `a·b + c`: fused where the level has FMA (`FMA`), else a product and a sum.
    fn madd<const FMA: bool>(a: Self, b: Self, c: Self) -> Self;
    /// Zero.
    const ZERO: Self;
}

macro_rules! real {
    ($($t:ty),*) => {$(
        impl Real for $t {
            #[inline(always)]
            fn madd<const FMA: bool>(a: $t, b: $t, c: $t) -> $t {
                if FMA {
                    a.mul_add(b, c)
                } else {
                    a * b + c
                }
            }
            const ZERO: $t = 0.0;
        }
    )*};
}
real!(f32, f64);

/// How `nn` combines the product with what is there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Epi {
    /// `out = X·W + bias`.
    Bias,
    /// `out += X·W` (bias ignored; the product is summed, then added to `out`).
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
pub struct Region {
    /// The block's output columns.
    pub cols: usize,
    /// The rows of `W` the block reads.
    pub k: Range<usize>,
}

/// A right-hand matrix packed into column panels (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub struct Packed<T> {
    k: usize,
    n: usize,
    panels: Vec<Panel>,
    data: Vec<T>,
    bias: Vec<T>,
}

/// Lanes of one vector register of the widest level: 16 for f32, 8 for f64.
pub trait Lanes: Real {
    const V: usize;
    /// This type's product, unchecked ([`nn_f32_raw`], [`nn_f64_raw`]; see [`nn`]).
    const NN_RAW: Nn<Self>;
}
impl Lanes for f32 {
    const V: usize = 16;
    const NN_RAW: Nn<f32> = nn_f32_raw;
}
impl Lanes for f64 {
    const V: usize = 8;
    const NN_RAW: Nn<f64> = nn_f64_raw;
}

/// A product `out = epi(X·W)`: `(x, ldx, rows, w, out, ldo, epi)` as [`nn`] takes them.
pub type Nn<T> = fn(&[T], usize, usize, &Packed<T>, &mut [T], usize, Epi);

impl<T: Lanes> Packed<T> {
    /// Packs `W[p][j] = w(p, j)` (`k × n`, `n` = the regions' columns summed) with `bias(j)`;
    /// each region's columns read only its rows `k` (outside, `W` is taken as zero).
    pub fn new(
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

    /// A dense `k × n` matrix (row-major, `ld` apart) without bias (the panels copied row
    /// segment by row segment).
    pub fn dense(k: usize, n: usize, w: &[T], ld: usize) -> Packed<T> {
        Packed::dense_in(k, n, w, ld, Vec::new())
    }

    /// [`Packed::dense`] into `data`'s allocation (recycled: see [`Packed::into_data`]).
    pub fn dense_in(k: usize, n: usize, w: &[T], ld: usize, mut data: Vec<T>) -> Packed<T> {
        let v = T::V;
        let mut panels = Vec::new();
        data.clear();
        data.reserve(k * n.div_ceil(v) * v);
        let mut col = 0;
        while col < n {
            let valid = (n - col).min(2 * v);
            let width = if valid <= v { v } else { 2 * v };
            let off = data.len();
            for row in w.chunks(ld).take(k) {
                let seg = &row[col..col + valid];
                match <&[T; 32]>::try_from(seg) {
                    // A fixed-size copy (inlined) for the common full f32 panel.
                    Ok(full) => data.extend_from_slice(full),
                    Err(_) => {
                        data.extend_from_slice(seg);
                        data.resize(data.len() + width - valid, T::ZERO);
                    }
                }
            }
            panels.push(Panel {
                col,
                width,
                valid,
                k: 0..k,
                off,
            });
            col += valid;
        }
        Packed {
            k,
            n,
            panels,
            data,
            bias: vec![T::ZERO; n],
        }
    }

    /// The packed values' allocation, to recycle.
    pub fn into_data(self) -> Vec<T> {
        self.data
    }

    /// The rows of `W` (the width of `X`).
    pub fn k(&self) -> usize {
        self.k
    }

    /// The output columns.
    pub fn n(&self) -> usize {
        self.n
    }
}

/// `init + Σ_p x_i[p] · w[p·NR .. p·NR + NR]` for the `MR` rows `x_i` (each `len` long). The
/// accumulators are a local array (kept in registers), the loads of `x` are scalar broadcasts
/// (the vectors run along `w`'s lanes) and nothing in the loop can panic.
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
        let wr: [T; NR] = *<&[T; NR]>::try_from(wr).expect("chunks of NR");
        for i in 0..MR {
            let xi = x[i][p];
            for j in 0..NR {
                acc[i][j] = T::madd::<FMA>(xi, wr[j], acc[i][j]);
            }
        }
    }
    acc
}

/// One `MR`-row tile of `nn` (rows `r0..r0 + mr` of `out`, rows `ldo` apart) against one
/// panel `p` of `w`, `xp` holding the tile's rows of `X`, `ks` apart.
#[inline(always)]
fn nn_panel<T: Real, const MR: usize, const NR: usize, const FMA: bool>(
    (xp, ks): (&[T], usize),
    (r0, mr): (usize, usize),
    (w, p): (&Packed<T>, &Panel),
    (out, ldo): (&mut [T], usize),
    epi: Epi,
) {
    let data = &w.data[p.off..p.off + p.k.len() * NR];
    let bias = &w.bias[p.col..p.col + p.valid];
    // The bias starts the sums; `out` (Epi::Acc) is added when storing, so that its loads
    // overlap the next tile's products instead of delaying this one's.
    let mut acc = [[T::ZERO; NR]; MR];
    if epi != Epi::Acc {
        for a in acc.iter_mut().take(mr) {
            load(a, bias);
        }
    }
    let xs: [&[T]; MR] = std::array::from_fn(|i| {
        let r = i.min(mr - 1) * ks;
        &xp[r + p.k.start..r + p.k.end]
    });
    let acc = nn_tile::<T, MR, NR, FMA>(xs, data, p.k.len(), acc);
    for (i, a) in acc.iter().enumerate().take(mr) {
        let o = (r0 + i) * ldo + p.col;
        store(&mut out[o..o + p.valid], a, epi);
    }
}

/// `dst[..src.len()] = src`, as whole registers when `src` fills `dst`.
#[inline(always)]
fn load<T: Real, const NR: usize>(dst: &mut [T; NR], src: &[T]) {
    match <&[T; NR]>::try_from(src) {
        Ok(full) => *dst = *full,
        Err(_) => dst.iter_mut().zip(src).for_each(|(d, &s)| *d = s),
    }
}

/// `dst = src[..dst.len()]` (added to `dst` for `Epi::Acc`), as whole registers when `dst` is
/// `NR` long.
#[inline(always)]
fn store<T: Real, const NR: usize>(dst: &mut [T], src: &[T; NR], epi: Epi) {
    let f = |d: T, s: T| match epi {
        Epi::Bias => s,
        Epi::Acc => d + s,
    };
    match <&mut [T; NR]>::try_from(&mut *dst) {
        Ok(full) => {
            for j in 0..NR {
                full[j] = f(full[j], src[j]);
            }
        }
        Err(_) => dst.iter_mut().zip(src).for_each(|(d, &s)| *d = f(*d, s)),
    }
}

/// `nn`: `MR`-row tiles of `X` against the panels (of `W2 = 2V` or `W1 = V` lanes): for many
/// rows, each tile against every panel in turn (each row of `X` and `out` walked once, front
/// to back); for few rows, each panel against every tile (each panel read once). A partial
/// last tile repeats its last row and drops the extra results.
#[inline(always)]
fn nn_impl<T: Lanes, const W2: usize, const W1: usize, const MR: usize, const FMA: bool>(
    x: &[T],
    ldx: usize,
    rows: usize,
    w: &Packed<T>,
    out: &mut [T],
    ldo: usize,
    epi: Epi,
) {
    if rows <= 8 * MR {
        // Few rows (a rollout's block, `Qᵀ·A`): each panel once, from cache for every tile.
        for p in &w.panels {
            for r0 in (0..rows).step_by(MR) {
                nn_run::<T, W2, W1, MR, FMA>((x, ldx), (rows, r0), (w, p), (out, ldo), epi);
            }
        }
    } else {
        // Many rows: each row of `X` and `out` walked once.
        for r0 in (0..rows).step_by(MR) {
            for p in &w.panels {
                nn_run::<T, W2, W1, MR, FMA>((x, ldx), (rows, r0), (w, p), (out, ldo), epi);
            }
        }
    }
}

/// The tile of rows `r0..` (of `rows`) against panel `p` of `w`, at the panel's width. (A
/// function, not a closure: everything under [`simd_fn!`] must be `#[inline(always)]` to get
/// its features.)
#[inline(always)]
fn nn_run<T: Lanes, const W2: usize, const W1: usize, const MR: usize, const FMA: bool>(
    (x, ldx): (&[T], usize),
    (rows, r0): (usize, usize),
    (w, p): (&Packed<T>, &Panel),
    (out, ldo): (&mut [T], usize),
    epi: Epi,
) {
    let mr = MR.min(rows - r0);
    let tile = &x[r0 * ldx..];
    if p.width == W2 {
        nn_panel::<T, MR, W2, FMA>((tile, ldx), (r0, mr), (w, p), (out, ldo), epi);
    } else {
        nn_panel::<T, MR, W1, FMA>((tile, ldx), (r0, mr), (w, p), (out, ldo), epi);
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

/// Defines the product of one element type at every level: `$w2`/`$w1` the panel widths (`2V`,
/// `V`), 8 rows a tile with AVX-512, 3 with AVX2, 1 on the baseline.
macro_rules! nn_raw {
    ($(#[$doc:meta])* $name:ident, $t:ty, $w2:literal, $w1:literal) => {
        simd_fn! {
            $(#[$doc])*
            fn $name(x: &[$t], ldx: usize, rows: usize, w: &Packed<$t>, out: &mut [$t], ldo: usize, epi: Epi) {
                avx512: nn_impl::<$t, $w2, $w1, 8, true>(x, ldx, rows, w, out, ldo, epi),
                avx2: nn_impl::<$t, $w2, $w1, 3, true>(x, ldx, rows, w, out, ldo, epi),
                base: nn_impl::<$t, $w2, $w1, 1, false>(x, ldx, rows, w, out, ldo, epi),
            }
        }
    };
}

nn_raw!(
    /// `out[i·ldo + j] = epi(Σ_p x[i·ldx + p]·W[p][j])` for `rows` rows, f32.
    nn_f32_raw, f32, 32, 16
);
nn_raw!(
    /// The f64 twin of [`nn_f32_raw`].
    nn_f64_raw, f64, 16, 8
);

/// `out = epi(X·W)` in f32 or f64 (see [`Epi`]); `X` is `rows × w.k()` (`ldx` apart), `out`
/// is `rows × w.n()` (`ldo` apart). Panics when the slices are too short (a caller's bug).
pub fn nn<T: Lanes>(
    x: &[T],
    ldx: usize,
    rows: usize,
    w: &Packed<T>,
    out: &mut [T],
    ldo: usize,
    epi: Epi,
) {
    check_nn(x, ldx, rows, w.k, out, ldo, w.n);
    (T::NN_RAW)(x, ldx, rows, w, out, ldo, epi)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    /// Each level's tiles (8, 3 and 1 rows, as `nn_raw!` instantiates them) and the checked
    /// entry point, for panels `W2` and `W1` lanes wide.
    fn every_level<T: Lanes, const W2: usize, const W1: usize>() -> [Nn<T>; 4] {
        [
            nn_impl::<T, W2, W1, 8, true>,
            nn_impl::<T, W2, W1, 3, true>,
            nn_impl::<T, W2, W1, 1, false>,
            nn::<T>,
        ]
    }

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
                    Epi::Acc => s + base[i * ldo + j],
                }
            };
            let dense = Packed::<f32>::new(
                k,
                &[Region { cols, k: 0..k }],
                |p, j| wv[p * cols + j] as f32,
                |_| 0.0,
            );
            let wv32: Vec<f32> = wv.iter().map(|&v| v as f32).collect();
            assert_eq!(Packed::dense(k, cols, &wv32, cols), dense);
            let w64 = Packed::<f64>::new(k, &regions, w_of, |j| bv[j]);
            let w32 = Packed::<f32>::new(k, &regions, |p, j| w_of(p, j) as f32, |j| bv[j] as f32);
            let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
            for epi in [Epi::Bias, Epi::Acc] {
                for run in every_level::<f64, 16, 8>() {
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
                for run in every_level::<f32, 32, 16>() {
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
}
