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
    /// The algorithm off the host engines (they run [`randomized_svd`] or the fast f32 one).
    pub method: gpu_core::nn::SvdMethod,
}

impl Default for SvdOptions {
    fn default() -> Self {
        SvdOptions {
            oversample: 10,
            power_iters: 2,
            seed: 0,
            method: gpu_core::nn::SvdMethod::Halko,
        }
    }
}

impl SvdOptions {
    /// The largest accepted `power_iters` (more never helps in f64: `σ^(2q+1)` underflows the
    /// tail long before).
    pub const MAX_POWER: usize = gpu_core::nn::SvdSpec::MAX_POWER;

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

use gpu_core::linalg::Factorization;

/// [`gpu_core::linalg::full_svd`] (the verified SVD of `a`, descending), or
/// [`AcceleratorError::NoConvergence`] when no method converges and verifies.
pub(crate) fn full_svd(a: DMatrix<f64>) -> Result<Factorization, AcceleratorError> {
    let (rows, cols) = a.shape();
    gpu_core::linalg::full_svd(a).ok_or(AcceleratorError::NoConvergence {
        entry: ENTRY,
        rows,
        cols,
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
