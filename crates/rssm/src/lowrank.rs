//! [`LowRank`]: the f32 factors `U·diag(S)·Vᵀ` that `compress_residuals` hands out and
//! `apply_corrections` adds, as tensors on one device (the accelerator's).

use crate::error::AcceleratorError;
use crate::svd::Svd;
use nalgebra::DMatrix;
use ndarray::{Array1, Array2, Ix1, Ix2};
use std::sync::OnceLock;
use tensor_ops::{no_grad, DType, Device, Tensor};

/// Low-rank factors in f32 on one device: `U` `[m, k]`, `S` `[k]`, `V` `[n, k]`, standing for
/// `U·diag(S)·Vᵀ`; every value finite, `k >= 1`.
#[derive(Debug, Clone)]
pub struct LowRank {
    u: Tensor,
    s: Tensor,
    v: Tensor,
    /// `max_i ‖(U·diag(S))ᵢ‖ · max_j ‖Vⱼ‖`, the Cauchy–Schwarz bound on every entry of the
    /// product (computed in f64 on first use).
    bound: OnceLock<f64>,
}

/// Host copies of a [`LowRank`]'s factors.
#[derive(Debug, Clone, PartialEq)]
pub struct HostLowRank {
    /// `m × k`.
    pub u: Array2<f32>,
    /// `[k]`.
    pub s: Array1<f32>,
    /// `n × k`.
    pub v: Array2<f32>,
}

fn shape_error(got: Vec<usize>) -> AcceleratorError {
    AcceleratorError::Shape {
        entry: "LowRank::new",
        what: "factors",
        expected: "u [m, k], s [k], v [n, k] with k >= 1".into(),
        got,
    }
}

impl LowRank {
    /// Host factors with matching shapes (`u` `m × k`, `s` `[k]`, `v` `n × k`, `k >= 1`) and
    /// finite values, as CPU tensors; else a typed error.
    pub fn new(
        u: Array2<f32>,
        s: Array1<f32>,
        v: Array2<f32>,
    ) -> Result<LowRank, AcceleratorError> {
        let k = s.len();
        if k == 0 || u.ncols() != k || v.ncols() != k {
            return Err(shape_error([u.shape(), s.shape(), v.shape()].concat()));
        }
        if !u.iter().chain(&s).chain(&v).all(|x| x.is_finite()) {
            return Err(AcceleratorError::NonFinite {
                entry: "LowRank::new",
                what: "the factors",
            });
        }
        Ok(LowRank::trusted(
            Tensor::from_ndarray(&u, Device::Cpu)?,
            Tensor::from_ndarray(&s, Device::Cpu)?,
            Tensor::from_ndarray(&v, Device::Cpu)?,
        ))
    }

    /// Factors given as f32 tensors on one device (`u` `[m, k]`, `s` `[k]`, `v` `[n, k]`,
    /// `k >= 1`, finite; checked on their device), else a typed error.
    pub fn from_tensors(u: Tensor, s: Tensor, v: Tensor) -> Result<LowRank, AcceleratorError> {
        let ok = match (u.shape(), s.shape(), v.shape()) {
            ([_, ku], [k], [_, kv]) => *k > 0 && ku == k && kv == k,
            _ => false,
        };
        if !ok {
            return Err(shape_error([u.shape(), s.shape(), v.shape()].concat()));
        }
        for t in [&s, &v] {
            crate::accelerator::check_device("LowRank::new", "a factor", u.device(), t.device())?;
        }
        for t in [&u, &s, &v] {
            if t.dtype() != DType::F32 {
                return Err(AcceleratorError::InvalidArgument {
                    entry: "LowRank::new",
                    reason: format!("the factors must hold f32, not {}", t.dtype()),
                });
            }
            crate::layers::check_finite("the factors", t).map_err(|_| {
                AcceleratorError::NonFinite {
                    entry: "LowRank::new",
                    what: "the factors",
                }
            })?;
        }
        Ok(LowRank::trusted(u, s, v))
    }

    /// Factors this crate computed (shapes right, values finite by construction).
    pub(crate) fn trusted(u: Tensor, s: Tensor, v: Tensor) -> LowRank {
        LowRank {
            u: u.detach(),
            s: s.detach(),
            v: v.detach(),
            bound: OnceLock::new(),
        }
    }

    /// Rounds an f64 [`Svd`] to f32 factors on the CPU.
    pub fn from_svd(svd: &Svd) -> Result<LowRank, AcceleratorError> {
        let round = |m: &DMatrix<f64>| Array2::from_shape_fn(m.shape(), |(i, j)| m[(i, j)] as f32);
        LowRank::new(
            round(svd.u()),
            svd.s().iter().map(|&x| x as f32).collect(),
            round(svd.v()),
        )
    }

    /// `U`, `[m, k]`.
    pub fn u(&self) -> &Tensor {
        &self.u
    }

    /// `S`, `[k]`.
    pub fn s(&self) -> &Tensor {
        &self.s
    }

    /// `V`, `[n, k]`.
    pub fn v(&self) -> &Tensor {
        &self.v
    }

    /// The device the factors live on.
    pub fn device(&self) -> Device {
        self.u.device()
    }

    /// `k`.
    pub fn rank(&self) -> usize {
        self.s.numel()
    }

    /// `(m, n)`: the shape of the matrix the factors stand for.
    pub fn shape(&self) -> (usize, usize) {
        (self.u.shape()[0], self.v.shape()[0])
    }

    /// The factors on `device` (a copy when it is another one).
    pub fn to(&self, device: Device) -> Result<LowRank, AcceleratorError> {
        let t = |x: &Tensor| no_grad(|| x.to(device));
        Ok(LowRank::trusted(t(&self.u)?, t(&self.s)?, t(&self.v)?))
    }

    /// Host copies of the factors.
    pub fn host(&self) -> Result<HostLowRank, AcceleratorError> {
        let dim2 = |t: &Tensor| -> Result<Array2<f32>, AcceleratorError> {
            t.to_ndarray()?.into_dimensionality::<Ix2>().map_err(|e| {
                AcceleratorError::InvalidArgument {
                    entry: "LowRank::host",
                    reason: e.to_string(),
                }
            })
        };
        let s = self
            .s
            .to_ndarray()?
            .into_dimensionality::<Ix1>()
            .map_err(|e| AcceleratorError::InvalidArgument {
                entry: "LowRank::host",
                reason: e.to_string(),
            })?;
        Ok(HostLowRank {
            u: dim2(&self.u)?,
            s,
            v: dim2(&self.v)?,
        })
    }

    /// The Cauchy–Schwarz bound `max_i ‖(U·diag(S))ᵢ‖ · max_j ‖Vⱼ‖` on every entry of the
    /// product; computed once. On the CPU in f64 (f32 values squared fit f64); on CUDA by
    /// reductions on the device (two small reads per factor, no copy of the factors): each
    /// factor divided by its largest magnitude first, so no square overflows, the row norms
    /// then exact to f32 rounding (a relative `k·u`, far below what the bound is for: telling
    /// a sum that may overflow f32 from one that cannot).
    pub fn entry_bound(&self) -> Result<f64, AcceleratorError> {
        if let Some(b) = self.bound.get() {
            return Ok(*b);
        }
        let b = if self.u.device() == Device::Cpu {
            self.host()?.entry_bound()
        } else {
            let k = self.s.numel();
            let us = no_grad(|| self.u.mul(&self.s.reshape(&[1, k])?))?;
            row_norm_max(&us)? * row_norm_max(&self.v)?
        };
        Ok(*self.bound.get_or_init(|| b))
    }

    /// `U·diag(S)·Vᵀ` materialised on the host (accumulated in f64): for tests and small
    /// matrices; `apply_corrections` adds it to a matrix one tile at a time instead.
    pub fn to_dense(&self) -> Result<Array2<f32>, AcceleratorError> {
        Ok(self.host()?.to_dense())
    }
}

impl HostLowRank {
    /// `k`.
    pub fn rank(&self) -> usize {
        self.s.len()
    }

    /// `(m, n)`.
    pub fn shape(&self) -> (usize, usize) {
        (self.u.nrows(), self.v.nrows())
    }

    /// See [`LowRank::entry_bound`].
    pub fn entry_bound(&self) -> f64 {
        let row_norm = |a: &Array2<f32>, scale: &dyn Fn(usize) -> f64| {
            a.rows()
                .into_iter()
                .map(|r| {
                    r.iter()
                        .enumerate()
                        .map(|(j, &x)| (f64::from(x) * scale(j)).powi(2))
                        .sum::<f64>()
                        .sqrt()
                })
                .fold(0.0f64, f64::max)
        };
        row_norm(&self.u, &|r| f64::from(self.s[r])) * row_norm(&self.v, &|_| 1.0)
    }

    /// See [`LowRank::to_dense`].
    pub fn to_dense(&self) -> Array2<f32> {
        let (m, n) = self.shape();
        Array2::from_shape_fn((m, n), |(i, j)| {
            (0..self.rank())
                .map(|r| {
                    f64::from(self.u[(i, r)]) * f64::from(self.s[r]) * f64::from(self.v[(j, r)])
                })
                .sum::<f64>() as f32
        })
    }
}

/// The largest row norm of a finite 2-D f32 tensor, on its device: `m·max_i ‖rowᵢ/m‖` with
/// `m` its largest magnitude (two reads).
fn row_norm_max(t: &Tensor) -> Result<f64, AcceleratorError> {
    let m = crate::layers::max_abs_if_finite(t)?.ok_or(AcceleratorError::NonFinite {
        entry: "LowRank::entry_bound",
        what: "the factors",
    })?;
    if m < 1e-30 {
        // 1/m would overflow: each row norm is at most m·√cols anyway.
        let cols = t.shape().get(1).copied().unwrap_or(1) as f64;
        return Ok(f64::from(m) * cols.sqrt());
    }
    let q = no_grad(|| {
        let x = t.mul_scalar(1.0 / m)?;
        x.mul(&x)?.sum(1, false)?.max(0, false)?.item()
    })?;
    Ok(f64::from(m) * f64::from(q).sqrt())
}
