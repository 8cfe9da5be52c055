//! The randomized SVD of an f32 matrix on the fast engine: the CPU path of
//! `compress_residuals` ([`crate::Engine::Fast`]). The algorithm of
//! [`crate::svd::randomized_svd`] (Halko, Martinsson and Tropp 2011, Algorithms 4.4 and 5.1),
//! with the precision spent where it matters:
//!
//! - the passes over `A` (`A·Ω`, `A·W` and `Qᵀ·A`, all but a few percent of the work) are f32
//!   GEMMs (for `Qᵀ·A`, `A` packed once as their right-hand side), each split over two
//!   threads;
//! - every sketch is orthonormalised in f64 by CholeskyQR2 (Gram matrix `YᵀY` and `Y·R⁻¹` as
//!   f64 GEMMs, twice: Yamamoto et al. 2015, orthogonal to f64 rounding when `κ(Y) ≲ 10⁸`),
//!   falling back to a Householder QR when the Cholesky factor shows `κ(Y) > 10⁶` (rank
//!   deficiency, a zero matrix);
//! - the small SVD is exact f64: `Bᵀ = Q_b·R_b` (the same QR), the SVD of `R_bᵀ` (`l × l`),
//!   and `V = Q_b·Ṽ`, `U = Q·Ũ`.
//!
//! Error: the f32 products are backward stable, `fl(A·X) = (A + ΔA)·X` with
//! `|ΔA| <= γ_n·|A|` (γ_n ≈ n·u, u = 2⁻²⁴, in the worst case; ~√n·u typically), so the
//! computed factors are those of the exact algorithm on a matrix within `γ_n·‖A‖` of `A`
//! (Higham, ch. 3), plus the rounding of the input to f32 the accelerator's callers already
//! made. The reconstruction error is therefore the randomized SVD's own (Halko's bounds) plus
//! `O(γ_n)·‖A‖`: for the tests' matrices (n <= 300) a few 1e-6 of `‖A‖` at worst, ~1e-7 in
//! practice (printed by tests/svd.rs).

use crate::error::AcceleratorError;
use crate::lowrank::LowRank;
use crate::svd::{check_rank, full_svd, truncate, SvdOptions};
use gpu_core::cpu::fast::packed::{nn, Epi, Lanes, Packed, Region};
use nalgebra::DMatrix;
use ndarray::{Array1, Array2};
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

const ENTRY: &str = "compress_residuals";

/// A tall matrix whose columns are orthonormalised, with its `R` (`y = q·r`).
struct Qr {
    q: Vec<f64>,
    r: Vec<f64>,
}

/// Rows of work below which a product stays on one thread.
const SPLIT: usize = 256;

/// `out = x·W` (`x` row-major `rows × W.k()`, `ldx` apart, `out` `rows × W.n()`), rows split
/// over two threads.
fn par_nn<T: Lanes + Send + Sync>(x: &[T], ldx: usize, rows: usize, w: &Packed<T>, out: &mut [T]) {
    let n = w.n();
    if rows < SPLIT {
        return nn(x, ldx, rows, w, out, n, Epi::Bias);
    }
    let mid = rows / 2;
    let (xa, xb) = x.split_at(mid * ldx);
    let (oa, ob) = out.split_at_mut(mid * n);
    rayon::join(
        || nn(xa, ldx, mid, w, oa, n, Epi::Bias),
        || nn(xb, ldx, rows - mid, w, ob, n, Epi::Bias),
    );
}

/// `A` packed as the right-hand matrix of `Qᵀ·A`, in two halves of its columns (one per
/// thread). Packing writes sequentially (no zeroed buffer first), into buffers recycled from
/// the previous call ([`super::take_buffer`]), and is done once for the `q + 1` products with
/// `Aᵀ`.
struct PackedT {
    halves: Vec<(usize, Packed<f32>)>,
    m: usize,
    n: usize,
}

impl PackedT {
    fn new(a: &[f32], m: usize, n: usize) -> PackedT {
        let cuts = if n < SPLIT {
            vec![0, n]
        } else {
            vec![0, n / 2, n]
        };
        let (b0, b1) = (super::take_buffer(), super::take_buffer());
        let halves = rayon::join(
            || Packed::dense_in(m, cuts[1], a, n, b0),
            || (cuts.len() > 2).then(|| Packed::dense_in(m, n - cuts[1], &a[cuts[1]..], n, b1)),
        );
        let mut v = vec![(0, halves.0)];
        v.extend(halves.1.map(|p| (cuts[1], p)));
        PackedT { halves: v, m, n }
    }

    /// Returns the packed buffers to the pool.
    fn recycle(self) {
        for (_, p) in self.halves {
            super::give_buffer(p.into_data());
        }
    }

    /// `Aᵀ·Q` (`n × l`, f64, row-major) for `Q` `m × l` (row-major): `Qᵀ·A` on two threads,
    /// each half transposed into its rows of the result.
    fn at_q(&self, q: &[f64], l: usize) -> Vec<f64> {
        let (m, n) = (self.m, self.n);
        let ld = m;
        let mut qt = vec![0.0f32; l * ld];
        for (i, row) in q.chunks(l).enumerate() {
            for (c, &v) in row.iter().enumerate() {
                qt[c * ld + i] = v as f32;
            }
        }
        let mut z = vec![0.0f64; n * l];
        // Columns `j0..j0 + w.n()` of Qᵀ·A, transposed into `z` (their rows of Aᵀ·Q).
        let block = |w: &Packed<f32>, z: &mut [f64]| {
            let cols = w.n();
            let mut bt = vec![0.0f32; l * cols];
            nn(&qt, ld, l, w, &mut bt, cols, Epi::Bias);
            for (j, row) in z.chunks_mut(l).enumerate() {
                for (r, v) in row.iter_mut().enumerate() {
                    *v = f64::from(bt[r * cols + j]);
                }
            }
        };
        match self.halves.as_slice() {
            [(_, w)] => block(w, &mut z),
            [(_, w0), (j1, w1)] => {
                let (za, zb) = z.split_at_mut(j1 * l);
                rayon::join(|| block(w0, za), || block(w1, zb));
            }
            _ => {}
        }
        z
    }
}

/// `YᵀY` (`l × l`) in f64 for row-major `Y` (`rows × l`): `Yᵀ` times `Y` packed, the rows of
/// `Y` summed on two threads.
fn gram(y: &[f64], rows: usize, l: usize) -> Vec<f64> {
    let part = |y: &[f64], rows: usize| {
        let ld = rows + 8;
        let mut yt = vec![0.0f64; l * ld];
        for (i, row) in y.chunks(l).enumerate() {
            for (c, &v) in row.iter().enumerate() {
                yt[c * ld + i] = v;
            }
        }
        let w = Packed::dense(rows, l, y, l);
        let mut g = vec![0.0f64; l * l];
        nn(&yt, ld, l, &w, &mut g, l, Epi::Bias);
        g
    };
    if rows < SPLIT {
        return part(y, rows);
    }
    let mid = rows / 2;
    let (ya, yb) = y.split_at(mid * l);
    let (mut g, h) = rayon::join(|| part(ya, mid), || part(yb, rows - mid));
    g.iter_mut().zip(h).for_each(|(a, b)| *a += b);
    g
}

/// The upper Cholesky factor `R` of `g` (`g = RᵀR`), or `None` when a pivot is not above
/// `1e-12·max gᵢᵢ` (`κ(Y) > 10⁶`: CholeskyQR would lose orthogonality or break down).
fn cholesky_upper(g: &[f64], l: usize) -> Option<Vec<f64>> {
    let max = (0..l).map(|i| g[i * l + i]).fold(0.0f64, f64::max);
    let mut r = vec![0.0f64; l * l];
    for j in 0..l {
        let d = g[j * l + j] - (0..j).map(|p| r[p * l + j] * r[p * l + j]).sum::<f64>();
        if d.is_nan() || d <= 1e-12 * max {
            return None;
        }
        let rjj = d.sqrt();
        r[j * l + j] = rjj;
        for c in j + 1..l {
            let s = g[j * l + c] - (0..j).map(|p| r[p * l + j] * r[p * l + c]).sum::<f64>();
            r[j * l + c] = s / rjj;
        }
    }
    Some(r)
}

/// `R⁻¹` of an upper triangular `R` with a nonzero diagonal (back substitution).
fn invert_upper(r: &[f64], l: usize) -> Vec<f64> {
    let mut inv = vec![0.0f64; l * l];
    for c in 0..l {
        inv[c * l + c] = 1.0 / r[c * l + c];
        for i in (0..c).rev() {
            let s: f64 = (i + 1..=c).map(|p| r[i * l + p] * inv[p * l + c]).sum();
            inv[i * l + c] = -s / r[i * l + i];
        }
    }
    inv
}

/// `a·b` for `l × l` row-major matrices.
fn mul_small(a: &[f64], b: &[f64], l: usize) -> Vec<f64> {
    let mut c = vec![0.0f64; l * l];
    for i in 0..l {
        for p in 0..l {
            let aip = a[i * l + p];
            for j in 0..l {
                c[i * l + j] += aip * b[p * l + j];
            }
        }
    }
    c
}

/// One CholeskyQR pass: `Q = Y·R⁻¹` with `R` the Cholesky factor of `YᵀY`.
fn chol_qr(y: &[f64], rows: usize, l: usize) -> Option<Qr> {
    let r = cholesky_upper(&gram(y, rows, l), l)?;
    let inv = invert_upper(&r, l);
    // R⁻¹ is upper triangular: a panel of its columns reads only the rows above its end.
    let regions: Vec<Region> = (0..l)
        .step_by(16)
        .map(|c| Region {
            cols: 16.min(l - c),
            k: 0..(c + 16).min(l),
        })
        .collect();
    let w = Packed::new(l, &regions, |p, j| inv[p * l + j], |_| 0.0);
    let mut q = vec![0.0f64; rows * l];
    par_nn(y, w.k(), rows, &w, &mut q);
    Some(Qr { q, r })
}

/// An orthonormal basis of the columns of `y` (`rows × l`, `l <= rows`, row-major) and its
/// `R`: CholeskyQR2 (one pass only when `!twice`: a basis of the same span, orthonormal to
/// `u·κ(Y)² <= 1e-4`, enough for a basis that only feeds the next product), else
/// (ill-conditioned or rank-deficient `y`) `nalgebra`'s Householder QR, which gives `l`
/// orthonormal columns even for a zero `y`.
fn orthonormalise(y: Vec<f64>, rows: usize, l: usize, twice: bool) -> Qr {
    if let Some(first) = chol_qr(&y, rows, l) {
        if !twice {
            return first;
        }
        if let Some(second) = chol_qr(&first.q, rows, l) {
            return Qr {
                r: mul_small(&second.r, &first.r, l),
                q: second.q,
            };
        }
    }
    let qr = DMatrix::from_row_slice(rows, l, &y).qr();
    let (q, r) = (qr.q(), qr.r());
    Qr {
        q: q.transpose().as_slice().to_vec(),
        r: r.transpose().as_slice().to_vec(),
    }
}

/// The rank-`rank` truncated SVD of `a` (f32, row-major `m × n`) by randomized subspace
/// iteration, as f32 factors (see the module doc).
///
/// `bits` is `a`'s largest magnitude as bits ([`super::max_abs_bits`]: the caller's
/// finiteness check computed it).
///
/// Errors: a slice that is not `m·n` long, an empty matrix, a rank of 0 or above
/// `min(m, n)`, NaN or Inf, `power_iters` above [`SvdOptions::MAX_POWER`].
pub(crate) fn randomized_svd_f32(
    a: &[f32],
    bits: u32,
    m: usize,
    n: usize,
    rank: usize,
    opts: &SvdOptions,
) -> Result<LowRank, AcceleratorError> {
    if a.len() != m * n || m == 0 || n == 0 {
        return Err(AcceleratorError::Shape {
            entry: ENTRY,
            what: "residual",
            expected: format!("[m > 0, n > 0] holding m·n = {} values", m * n),
            got: vec![m, n, a.len()],
        });
    }
    check_rank(ENTRY, rank, m, n)?;
    opts.check(ENTRY)?;
    if bits >= 0x7f80_0000 {
        return Err(AcceleratorError::NonFinite {
            entry: ENTRY,
            what: "the residual",
        });
    }
    // Scaled by a power of two (exactly) into [2^-40, 2^40] when outside: no product, sum or
    // Gram matrix of the iteration then overflows or underflows.
    let amax = f32::from_bits(bits);
    let e = if amax == 0.0 {
        0
    } else {
        amax.log2().floor() as i32
    };
    let (f, scale) = if e.abs() > 40 {
        (2f32.powi(-e), f64::from(2f32.powi(-e)))
    } else {
        (1.0, 1.0)
    };
    let copy;
    let a = if f != 1.0 {
        copy = a.iter().map(|&x| x * f).collect::<Vec<f32>>();
        copy.as_slice()
    } else {
        a
    };
    let l = rank.saturating_add(opts.oversample).min(m.min(n));
    let mut rng = rand::rngs::StdRng::seed_from_u64(opts.seed);
    let omega: Vec<f32> = (0..n * l)
        .map(|_| StandardNormal.sample(&mut rng))
        .collect();
    let at = PackedT::new(a, m, n);
    // `A·W` (`m × l`, f64) for `W` (`n × l`).
    let a_w = |w: &[f32]| {
        let mut y = vec![0.0f32; m * l];
        par_nn(a, n, m, &Packed::dense(n, l, w, l), &mut y);
        y.iter().map(|&v| f64::from(v)).collect::<Vec<f64>>()
    };
    let to32 = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
    // The bases of the power iterations only feed the next product: one CholeskyQR pass; the
    // last Q (the left factor) and Q_b (the right one) are orthonormalised fully.
    let last = opts.power_iters == 0;
    let mut q = orthonormalise(a_w(&omega), m, l, last);
    for it in 0..opts.power_iters {
        let w = orthonormalise(at.at_q(&q.q, l), n, l, false);
        let last = it + 1 == opts.power_iters;
        q = orthonormalise(a_w(&to32(&w.q)), m, l, last);
    }
    // Bᵀ = Aᵀ·Q (n × l) = Q_b·R_b; B = R_bᵀ·Q_bᵀ = Ũ·Σ·(Q_b·Ṽ)ᵀ.
    let qb = orthonormalise(at.at_q(&q.q, l), n, l, true);
    at.recycle();
    let rt = DMatrix::from_row_slice(l, l, &qb.r).transpose();
    let small = truncate(full_svd(rt)?, rank)?;
    let lift = |basis: &[f64], rows: usize, f: &DMatrix<f64>| -> Array2<f32> {
        let w = Packed::new(
            l,
            &[Region {
                cols: rank,
                k: 0..l,
            }],
            |p, j| f[(p, j)],
            |_| 0.0,
        );
        let mut out = vec![0.0f64; rows * rank];
        par_nn(basis, w.k(), rows, &w, &mut out);
        Array2::from_shape_fn((rows, rank), |(i, j)| out[i * rank + j] as f32)
    };
    let u = lift(&q.q, m, small.u());
    let v = lift(&qb.q, n, small.v());
    let s: Array1<f32> = small.s().iter().map(|&x| (x / scale) as f32).collect();
    LowRank::new(u, s, v)
}
