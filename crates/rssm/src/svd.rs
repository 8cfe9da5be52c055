//! Truncated SVD on the host in f64 with `nalgebra`: [`randomized_svd`] (Halko, Martinsson and
//! Tropp 2011: Gaussian sketch, `q` power iterations with QR re-orthonormalisation, QR of the
//! sample, SVD of the small projected matrix) and [`exact_svd`], its reference.

use crate::error::AcceleratorError;
use nalgebra::{DMatrix, DVector, SVD};
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

/// The entry point named in errors.
const ENTRY: &str = "compress_residuals";

/// Options of [`randomized_svd`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SvdOptions {
    /// Oversampling `p`: the sketch has `k + p` columns (capped at `min(m, n)`). Halko et al.
    /// recommend 5 to 10.
    pub oversample: usize,
    /// Power iterations `q`: the sketch samples `(A·Aᵀ)^q·A`, whose spectrum decays as
    /// `σ^(2q+1)`, each product re-orthonormalised by a QR. At most [`SvdOptions::MAX_POWER`].
    pub power_iters: usize,
    /// Seed of the Gaussian test matrix.
    pub seed: u64,
    /// The algorithm on CUDA (the CPU always runs [`randomized_svd`]).
    pub method: crate::svd_cuda::SvdMethod,
}

impl Default for SvdOptions {
    fn default() -> Self {
        SvdOptions {
            oversample: 10,
            power_iters: 2,
            seed: 0,
            method: crate::svd_cuda::SvdMethod::Halko,
        }
    }
}

impl SvdOptions {
    /// The largest accepted `power_iters` (more never helps in f64: `σ^(2q+1)` underflows the
    /// tail long before).
    pub const MAX_POWER: usize = 64;

    /// Errors unless the options are usable (`power_iters` at most [`SvdOptions::MAX_POWER`]).
    pub(crate) fn check(&self, entry: &'static str) -> Result<(), AcceleratorError> {
        if self.power_iters > SvdOptions::MAX_POWER {
            return Err(AcceleratorError::InvalidArgument {
                entry,
                reason: format!(
                    "power_iters {} is above {}",
                    self.power_iters,
                    SvdOptions::MAX_POWER
                ),
            });
        }
        Ok(())
    }
}

/// Errors unless the truncation `rank` is in `1..=min(m, n)`.
pub(crate) fn check_rank(
    entry: &'static str,
    rank: usize,
    m: usize,
    n: usize,
) -> Result<(), AcceleratorError> {
    let max = m.min(n);
    if rank == 0 || rank > max {
        return Err(AcceleratorError::Rank { entry, rank, max });
    }
    Ok(())
}

/// A truncated SVD in f64: `A ≈ U·diag(s)·Vᵀ`, `u` `m × k`, `s` descending, `v` `n × k`, both
/// with orthonormal columns (as [`randomized_svd`] and [`exact_svd`] return it).
#[derive(Debug, Clone, PartialEq)]
pub struct Svd {
    u: DMatrix<f64>,
    s: DVector<f64>,
    v: DMatrix<f64>,
}

impl Svd {
    /// Factors of matching shapes (`u` `m × k`, `s` `[k]`, `v` `n × k`), else a typed error.
    pub fn new(u: DMatrix<f64>, s: DVector<f64>, v: DMatrix<f64>) -> Result<Svd, AcceleratorError> {
        let k = s.len();
        if u.ncols() != k || v.ncols() != k {
            return Err(AcceleratorError::Shape {
                entry: "Svd::new",
                what: "factors",
                expected: "u [m, k], s [k], v [n, k]".into(),
                got: vec![u.nrows(), u.ncols(), k, v.nrows(), v.ncols()],
            });
        }
        Ok(Svd { u, s, v })
    }

    /// `U`, `m × k`.
    pub fn u(&self) -> &DMatrix<f64> {
        &self.u
    }

    /// The singular values, `[k]`, descending.
    pub fn s(&self) -> &DVector<f64> {
        &self.s
    }

    /// `V`, `n × k`.
    pub fn v(&self) -> &DMatrix<f64> {
        &self.v
    }

    /// `U·diag(s)·Vᵀ`.
    pub fn reconstruct(&self) -> DMatrix<f64> {
        let mut us = self.u.clone();
        for (j, mut col) in us.column_iter_mut().enumerate() {
            col *= self.s[j];
        }
        us * self.v.transpose()
    }
}

/// Errors unless `rank` is in `1..=min(m, n)` and every element of `a` is finite.
fn check(a: &DMatrix<f64>, rank: usize) -> Result<(), AcceleratorError> {
    check_rank(ENTRY, rank, a.nrows(), a.ncols())?;
    if a.iter().any(|v| !v.is_finite()) {
        return Err(AcceleratorError::NonFinite {
            entry: ENTRY,
            what: "the residual",
        });
    }
    Ok(())
}

/// `a` scaled by a power of two (exactly) so that its largest magnitude is in `[1, 2)`, and
/// the factor: no product, norm or square of the iteration then overflows or underflows,
/// whatever the input's scale (a zero matrix is returned as it is, factor 1).
fn normalised(a: &DMatrix<f64>) -> (std::borrow::Cow<'_, DMatrix<f64>>, f64) {
    let max = a.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    if max == 0.0 || (1.0..2.0).contains(&max) {
        return (std::borrow::Cow::Borrowed(a), 1.0);
    }
    let scale = 2f64.powi(-(max.log2().floor() as i32));
    (std::borrow::Cow::Owned(a * scale), scale)
}

type Factorization = SVD<f64, nalgebra::Dyn, nalgebra::Dyn>;

/// The SVD of `a` with singular values in descending order, verified: nalgebra's SVD with
/// vectors can return orthonormal but wrong factors on rank-deficient input (a 30 × 20 matrix of
/// rank 3 came back with σ₃ off by 0.2–1.6% and ‖A − U·S·Vᵀ‖ ≈ 0.06–0.13·‖A‖ on 2–3% of random
/// draws), so every result must reconstruct `a` to a backward error of `64·max(m, n)·ε·‖A‖_F`
/// (a stable SVD's is a small multiple of `ε·‖A‖_F`; Weyl then bounds each singular value's
/// error by it). A result that does not is recomputed from the R of a Householder QR
/// (`A = Q·R`, `R = U'·S·V'ᵀ`, `U = Q·U'`), then from the transpose. A typed error when none
/// converges and verifies.
pub(crate) fn full_svd(a: DMatrix<f64>) -> Result<Factorization, AcceleratorError> {
    let (rows, cols) = a.shape();
    let max_iter = 1000usize.max(100 * rows.max(cols));
    let tol = 64.0 * rows.max(cols) as f64 * f64::EPSILON * a.norm();
    let svd_of = |m: DMatrix<f64>| SVD::try_new(m, true, true, 5.0 * f64::EPSILON, max_iter);
    let verified = |f: Factorization| -> Option<Factorization> {
        let (u, vt) = (f.u.as_ref()?, f.v_t.as_ref()?);
        let mut us = u.clone();
        for (j, mut col) in us.column_iter_mut().enumerate() {
            col *= f.singular_values[j];
        }
        ((&a - us * vt).norm() <= tol).then_some(f)
    };
    if let Some(f) = svd_of(a.clone()).and_then(verified) {
        return Ok(f);
    }
    let via_r = |m: &DMatrix<f64>| -> Option<Factorization> {
        // m is tall (rows >= cols): m = Q·R with R square.
        let qr = m.clone().qr();
        let (q, r) = (qr.q(), qr.r());
        let f = svd_of(r)?;
        Some(SVD {
            u: Some(q * f.u?),
            v_t: f.v_t,
            singular_values: f.singular_values,
        })
    };
    let tall = rows >= cols;
    let second = if tall { via_r(&a) } else { None };
    if let Some(f) = second.and_then(verified) {
        return Ok(f);
    }
    // The transpose (made tall): Aᵀ = V·S·Uᵀ.
    let t = a.transpose();
    let ft = if tall { svd_of(t) } else { via_r(&t) };
    let swapped = ft.and_then(|f| {
        Some(SVD {
            u: Some(f.v_t?.transpose()),
            v_t: Some(f.u?.transpose()),
            singular_values: f.singular_values,
        })
    });
    if let Some(f) = swapped.and_then(verified) {
        return Ok(f);
    }
    // Last: one-sided Jacobi, slower but backward stable on any input (rank-deficient and
    // graded matrices included), checked like the others.
    jacobi_svd(&a)
        .and_then(verified)
        .ok_or(AcceleratorError::NoConvergence {
            entry: ENTRY,
            rows,
            cols,
        })
}

/// The SVD by one-sided (Hestenes) Jacobi rotations on the columns of the tall form of `a`:
/// rotations orthogonalise the columns of `W = A·V` until every pair's cosine is below
/// `n·ε`; then `σ_j = ‖w_j‖`, `u_j = w_j/σ_j` (columns of zero norm completed to an orthonormal
/// set), sorted descending. Backward stable (each rotation is), converging quadratically;
/// `None` only if 100 sweeps do not converge.
pub(crate) fn jacobi_svd(a: &DMatrix<f64>) -> Option<Factorization> {
    if a.nrows() < a.ncols() {
        let f = jacobi_svd(&a.transpose())?;
        return Some(SVD {
            u: Some(f.v_t?.transpose()),
            v_t: Some(f.u?.transpose()),
            singular_values: f.singular_values,
        });
    }
    let (m, n) = a.shape();
    let mut w = a.clone();
    let mut v = DMatrix::<f64>::identity(n, n);
    let tol = n.max(1) as f64 * f64::EPSILON;
    let mut converged = false;
    for _ in 0..100 {
        let mut rotated = false;
        for p in 0..n {
            for q in p + 1..n {
                let alpha = w.column(p).norm_squared();
                let beta = w.column(q).norm_squared();
                let gamma = w.column(p).dot(&w.column(q));
                if gamma == 0.0 || gamma.abs() <= tol * (alpha * beta).sqrt() {
                    continue;
                }
                rotated = true;
                let zeta = (beta - alpha) / (2.0 * gamma);
                let t = zeta.signum() / (zeta.abs() + (1.0 + zeta * zeta).sqrt());
                let c = 1.0 / (1.0 + t * t).sqrt();
                let s = c * t;
                for mat in [&mut w, &mut v] {
                    for i in 0..mat.nrows() {
                        let (x, y) = (mat[(i, p)], mat[(i, q)]);
                        mat[(i, p)] = c * x - s * y;
                        mat[(i, q)] = s * x + c * y;
                    }
                }
            }
        }
        if !rotated {
            converged = true;
            break;
        }
    }
    if !converged {
        return None;
    }
    let mut order: Vec<usize> = (0..n).collect();
    let norms: Vec<f64> = (0..n).map(|j| w.column(j).norm()).collect();
    order.sort_by(|&i, &j| norms[j].total_cmp(&norms[i]));
    let mut u = DMatrix::<f64>::zeros(m, n);
    let mut vs = DMatrix::<f64>::zeros(n, n);
    let mut sv = nalgebra::DVector::<f64>::zeros(n);
    let big = norms.iter().cloned().fold(0.0, f64::max);
    for (k, &j) in order.iter().enumerate() {
        sv[k] = norms[j];
        vs.set_column(k, &v.column(j));
        if norms[j] > big * f64::EPSILON * m as f64 && norms[j] > 0.0 {
            u.set_column(k, &(w.column(j) / norms[j]));
        }
    }
    // Complete the columns left at zero (σ at rounding level) against the unit vectors, by
    // Gram–Schmidt applied twice.
    for k in 0..n {
        if u.column(k).norm() > 0.0 {
            continue;
        }
        for e in 0..m {
            let mut x = nalgebra::DVector::<f64>::zeros(m);
            x[e] = 1.0;
            for _ in 0..2 {
                for j in 0..n {
                    if j != k {
                        let d = u.column(j).dot(&x);
                        x -= u.column(j) * d;
                    }
                }
            }
            let nx = x.norm();
            if nx > 0.5 {
                u.set_column(k, &(x / nx));
                break;
            }
        }
    }
    Some(SVD {
        u: Some(u),
        v_t: Some(vs.transpose()),
        singular_values: sv,
    })
}

/// The first `k` singular triplets of an SVD.
pub(crate) fn truncate(
    svd: SVD<f64, nalgebra::Dyn, nalgebra::Dyn>,
    k: usize,
) -> Result<Svd, AcceleratorError> {
    let no = |what: &'static str| AcceleratorError::InvalidArgument {
        entry: ENTRY,
        reason: format!("the SVD did not produce {what}"),
    };
    let u = svd.u.ok_or_else(|| no("U"))?;
    let vt = svd.v_t.ok_or_else(|| no("Vᵀ"))?;
    Ok(Svd {
        u: u.columns(0, k).into_owned(),
        s: svd.singular_values.rows(0, k).into_owned(),
        v: vt.rows(0, k).transpose(),
    })
}

/// The rank-`rank` truncation of the exact SVD of `a` (the Eckart–Young optimum): the
/// reference of [`randomized_svd`]. Errors: a rank of 0 or above `min(m, n)`, NaN or Inf.
pub fn exact_svd(a: &DMatrix<f64>, rank: usize) -> Result<Svd, AcceleratorError> {
    check(a, rank)?;
    let (a, scale) = normalised(a);
    let mut svd = truncate(full_svd(a.into_owned())?, rank)?;
    svd.s /= scale;
    Ok(svd)
}

/// An orthonormal basis of the range of `y`'s columns (`m × l`, `l <= m`): the `Q` of its
/// Householder QR. A zero or rank-deficient `y` still gets `l` orthonormal columns (a
/// Householder step skips a zero column).
fn orthonormalise(y: DMatrix<f64>) -> DMatrix<f64> {
    y.qr().q()
}

/// The rank-`rank` truncated SVD of `a` by randomized subspace iteration (Halko, Martinsson
/// and Tropp 2011, Algorithms 4.4 and 5.1):
///
/// 1. `Ω` `n × l` standard Gaussian from `opts.seed`, `l = min(rank + p, min(m, n))`;
/// 2. `Q = qr(A·Ω)`; then `q` times: `Q = qr(A·qr(Aᵀ·Q))` (re-orthonormalised at every
///    product, so the columns do not collapse onto the top singular vector);
/// 3. `B = Qᵀ·A` (`l × n`), its exact SVD `B = Ũ·Σ·Vᵀ`, and `U = Q·Ũ`, truncated to `rank`.
///
/// Errors: a rank of 0 or above `min(m, n)`, NaN or Inf in `a`, `power_iters` above
/// [`SvdOptions::MAX_POWER`].
pub fn randomized_svd(
    a: &DMatrix<f64>,
    rank: usize,
    opts: &SvdOptions,
) -> Result<Svd, AcceleratorError> {
    check(a, rank)?;
    opts.check(ENTRY)?;
    let (a, scale) = normalised(a);
    let a = a.as_ref();
    let (m, n) = a.shape();
    let l = rank.saturating_add(opts.oversample).min(m.min(n));
    let mut rng = rand::rngs::StdRng::seed_from_u64(opts.seed);
    let omega = DMatrix::from_fn(n, l, |_, _| StandardNormal.sample(&mut rng));
    let mut q = orthonormalise(a * omega);
    for _ in 0..opts.power_iters {
        let w = orthonormalise(a.tr_mul(&q));
        q = orthonormalise(a * w);
    }
    let b = q.tr_mul(a);
    let small = truncate(full_svd(b)?, rank)?;
    Ok(Svd {
        u: q * small.u,
        s: small.s / scale,
        v: small.v,
    })
}

#[cfg(test)]
mod jacobi_tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Reconstruction within the `full_svd` acceptance bound, orthonormal factors within
    /// `64·max(m, n)·ε` (each rotation is orthogonal to rounding), σ descending and >= 0, on
    /// random, rank-deficient, zero and graded matrices of both orientations.
    #[test]
    fn jacobi_svd_is_backward_stable_on_hard_inputs() {
        let seed = std::env::var("HYBRID_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x5EED_u64);
        println!("jacobi_svd_is_backward_stable_on_hard_inputs: seed {seed}");
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut cases = Vec::new();
        for &(m, n, r) in &[
            (6, 6, 2),
            (30, 20, 3),
            (20, 30, 3),
            (8, 5, 5),
            (1, 7, 1),
            (7, 1, 1),
        ] {
            let g1 = DMatrix::<f64>::from_fn(m, r, |_, _| rng.random_range(-1.0..1.0));
            let g2 = DMatrix::<f64>::from_fn(r, n, |_, _| rng.random_range(-1.0..1.0));
            cases.push(g1 * g2);
        }
        cases.push(DMatrix::zeros(5, 4));
        cases.push(DMatrix::from_fn(6, 6, |i, j| {
            10f64.powi(-(2 * i as i32)) * if i == j { 1.0 } else { 0.3 }
        }));
        for a in cases {
            let (m, n) = a.shape();
            let f = jacobi_svd(&a).expect("converges");
            let (u, vt, s) = (f.u.unwrap(), f.v_t.unwrap(), f.singular_values);
            let bound = 64.0 * m.max(n) as f64 * f64::EPSILON;
            let mut us = u.clone();
            for (j, mut c) in us.column_iter_mut().enumerate() {
                c *= s[j];
            }
            let err = (&a - us * &vt).norm();
            assert!(err <= bound * a.norm(), "{m}x{n}: {err:e}");
            let k = s.len();
            let iu = u.transpose() * &u - DMatrix::<f64>::identity(k, k);
            let iv = &vt * vt.transpose() - DMatrix::<f64>::identity(k, k);
            assert!(
                iu.norm() <= bound && iv.norm() <= bound,
                "{m}x{n}: {iu:e} {iv:e}"
            );
            assert!(s.iter().all(|&x| x >= 0.0));
            assert!(s.as_slice().windows(2).all(|w| w[0] >= w[1]));
            assert!(full_svd(a).is_ok());
        }
    }
}
