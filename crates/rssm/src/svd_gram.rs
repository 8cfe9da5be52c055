//! [`SvdMethod::Gram`](crate::SvdMethod::Gram): the truncated SVD of a short-wide (or
//! tall-skinny) matrix through its small Gram matrix, in one pass over the matrix, on any
//! device: for histories of updates, where only the leading directions matter.
//!
//! With `A` `m × n`, `m <= n` (else the transpose): `G = Â·Âᵀ` by one f32 GEMM on the matrix's
//! device (`Â = A·2^e`, scaled by a power of two so no square overflows or underflows), the
//! eigen-decomposition `G = W·Λ·Wᵀ` on the host in f64, `σᵢ = √λᵢ`, `U = W_k`, and
//! `V = Âᵀ·W_k·diag(1/σ̂)` by a second GEMM. Error: forming `G` in f32 perturbs it by about
//! `m·u·‖Â‖²` (u = 2⁻²⁴), so `σᵢ` is accurate to `≈ m·u·σ₁²/(2σᵢ)` and the directions to
//! `m·u·σ₁²/gap`: a direction with `σᵢ <= √(m·u)·σ₁` (about `2.4e-4·√m·σ₁`) is noise, and is
//! returned with `σ = 0` and a zero `V` column (it carries no more than that share of the
//! matrix). `min(m, n)` is at most [`GRAM_MAX`] (the host eigen-decomposition's size).

use crate::error::AcceleratorError;
use crate::lowrank::LowRank;
use nalgebra::DMatrix;
use tensor_ops::{no_grad, Tensor};

const ENTRY: &str = "compress_residuals";

/// The largest `min(m, n)` the Gram method takes.
pub const GRAM_MAX: usize = 512;

/// The rank-`k` truncated SVD of the f32 matrix `a` (`[m, n]`, finite; checked) by its Gram
/// matrix (see the module docs).
pub(crate) fn gram_svd(a: &Tensor, k: usize) -> Result<LowRank, AcceleratorError> {
    let (m, n) = (a.shape()[0], a.shape()[1]);
    let wide = m <= n;
    let small = m.min(n);
    if small > GRAM_MAX {
        return Err(AcceleratorError::InvalidArgument {
            entry: ENTRY,
            reason: format!(
                "SvdMethod::Gram takes matrices with min(m, n) <= {GRAM_MAX}, got {m} x {n}"
            ),
        });
    }
    let max = crate::layers::max_abs_if_finite(a)?.ok_or(AcceleratorError::NonFinite {
        entry: ENTRY,
        what: "residual",
    })?;
    let dev = a.device();
    // Â = A·2^e with max|Â| in [1, 2): squares and sums of at most 2^31 of them stay finite.
    let scale = if max > 0.0 {
        2f32.powi(-(max.log2().floor() as i32))
    } else {
        1.0
    };
    let ah = no_grad(|| a.mul_scalar(scale))?;
    let g = no_grad(|| ah.matmul_t(&ah, !wide, wide))?.to_vec()?;
    let g = DMatrix::from_fn(small, small, |i, j| {
        0.5 * (f64::from(g[i * small + j]) + f64::from(g[j * small + i]))
    });
    let eig = nalgebra::SymmetricEigen::new(g);
    let mut order: Vec<usize> = (0..small).collect();
    order.sort_by(|&i, &j| eig.eigenvalues[j].total_cmp(&eig.eigenvalues[i]));
    let top = eig.eigenvalues[order[0]].max(0.0);
    let noise = small as f64 * f64::from(f32::EPSILON) * 0.5 * top;
    let mut w = vec![0.0f32; small * k];
    let (mut sigma_hat, mut inv) = (vec![0.0f64; k], vec![0.0f32; k]);
    for (c, &j) in order.iter().take(k).enumerate() {
        let lambda = eig.eigenvalues[j];
        for r in 0..small {
            w[r * k + c] = eig.eigenvectors[(r, j)] as f32;
        }
        if lambda > noise && lambda > 0.0 {
            sigma_hat[c] = lambda.sqrt();
            inv[c] = (1.0 / lambda.sqrt()) as f32;
        }
    }
    let w = Tensor::from_vec(w, &[small, k], dev)?;
    let inv = Tensor::from_vec(inv, &[1, k], dev)?;
    // The other factor: Âᵀ·W·diag(1/σ̂) (wide) or Â·W·diag(1/σ̂) (tall).
    let other = no_grad(|| ah.matmul_t(&w, wide, false)?.mul(&inv))?;
    let s: Vec<f32> = sigma_hat
        .iter()
        .map(|&x| (x / f64::from(scale)) as f32)
        .collect();
    let s = Tensor::from_vec(s, &[k], dev)?;
    let (u, v) = if wide { (w, other) } else { (other, w) };
    LowRank::from_tensors(u, s, v)
}
