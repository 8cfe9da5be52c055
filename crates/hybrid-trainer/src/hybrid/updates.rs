//! [`UpdateHistory`]: the last K full-step updates of every parameter tensor, their rank-r
//! basis (through `GpuAccelerator::compress_residuals`), the coefficients the world model
//! learns to predict, and the two writes a predicted step and a correction make to the weights
//! (through `GpuAccelerator::apply_corrections`).

use super::HybridError;
use rssm::{GpuAccelerator, LowRank, SvdMethod, SvdOptions};
use std::collections::VecDeque;
use tensor_ops::{no_grad, Tensor};

/// One parameter group's rank-r basis: `v` `[N, r]` with orthonormal columns (N the group's
/// elements, its tensors flattened one after the other), each member tensor's rows of it, and
/// the scale of each coefficient (the RMS over the history), so the world model sees
/// unit-scale values.
pub(crate) struct Basis {
    pub(crate) v: Tensor,
    pub(crate) slices: Vec<Tensor>,
    pub(crate) scale: Vec<f32>,
}

/// The update history of a model's parameters by group, all on the model's device.
pub(crate) struct UpdateHistory {
    pub(crate) k: usize,
    pub(crate) rank: usize,
    pub(crate) params: Vec<Tensor>,
    /// The tensors of each group, in order.
    pub(crate) members: Vec<Vec<usize>>,
    /// The last `k` updates: per entry, one flattened `[N_g]` delta per group.
    pub(crate) deltas: VecDeque<Vec<Tensor>>,
    /// Per group, when computed.
    pub(crate) basis: Option<Vec<Basis>>,
}

/// The rank of tensor `numel`'s basis.
pub(crate) fn rank_of(rank: usize, k: usize, numel: usize) -> usize {
    rank.min(k).min(numel).max(1)
}

/// The 2-D view `[rows, cols]` a tensor's correction is compressed in: 2-D tensors as they are,
/// vectors as one row, higher ranks with the leading dimension as rows.
pub(crate) fn matrix_shape(shape: &[usize]) -> (usize, usize) {
    match shape {
        [] => (1, 1),
        [n] => (1, *n),
        [m, rest @ ..] => (*m, rest.iter().product()),
    }
}

impl UpdateHistory {
    /// `group[i]` is tensor i's group (groups numbered from 0, contiguous).
    pub(crate) fn new(
        params: Vec<Tensor>,
        group: &[usize],
        k: usize,
        rank: usize,
    ) -> UpdateHistory {
        let n = group.iter().max().map_or(0, |g| g + 1);
        let mut members = vec![Vec::new(); n];
        for (i, &g) in group.iter().enumerate() {
            members[g].push(i);
        }
        members.retain(|m| !m.is_empty());
        UpdateHistory {
            k,
            rank,
            params,
            members,
            deltas: VecDeque::new(),
            basis: None,
        }
    }

    /// Each group's element count.
    pub(crate) fn group_sizes(&self) -> Vec<usize> {
        self.members
            .iter()
            .map(|m| m.iter().map(|&i| self.params[i].numel()).sum())
            .collect()
    }

    /// The rank of each group's basis.
    pub(crate) fn ranks(&self) -> Vec<usize> {
        self.group_sizes()
            .iter()
            .map(|&n| rank_of(self.rank, self.k, n))
            .collect()
    }

    /// Per-tensor flattened updates joined into one `[N_g]` vector per group.
    pub(crate) fn by_group(&self, delta: &[Tensor]) -> Result<Vec<Tensor>, HybridError> {
        Ok(no_grad(|| {
            self.members
                .iter()
                .map(|m| {
                    let parts: Vec<&Tensor> = m.iter().map(|&i| &delta[i]).collect();
                    if parts.len() == 1 {
                        Ok(parts[0].clone())
                    } else {
                        Tensor::cat(&parts, 0)
                    }
                })
                .collect::<tensor_ops::Result<Vec<_>>>()
        })?)
    }

    /// Each member tensor's rows `[N_p, r]` of a group basis `v`.
    pub(crate) fn slices(&self, g: usize, v: &Tensor) -> Result<Vec<Tensor>, HybridError> {
        let mut at = 0;
        let mut out = Vec::new();
        for &i in &self.members[g] {
            let n = self.params[i].numel();
            out.push(no_grad(|| v.narrow(0, at, n))?);
            at += n;
        }
        Ok(out)
    }

    /// The number of coefficients C = Σ ranks: the width the world model predicts beside the
    /// features.
    pub(crate) fn coefficients(&self) -> usize {
        self.ranks().iter().sum()
    }

    pub(crate) fn is_full(&self) -> bool {
        self.deltas.len() >= self.k
    }

    /// Forgets everything (after a rollback: the history no longer matches the weights).
    pub(crate) fn clear(&mut self) {
        self.deltas.clear();
        self.basis = None;
    }

    /// Adds one full step's update (per group, from [`UpdateHistory::by_group`]), dropping the
    /// oldest beyond `k`.
    pub(crate) fn push(&mut self, delta: Vec<Tensor>) {
        self.deltas.push_back(delta);
        while self.deltas.len() > self.k {
            self.deltas.pop_front();
        }
    }

    /// Recomputes every group's basis from the stored updates: the top right singular vectors
    /// of the `[k, N_g]` history (`compress_residuals` by its Gram matrix: one pass over the
    /// history), each column's sign chosen to agree with the previous basis so coefficients
    /// keep their meaning across refreshes. Returns the coefficients of the stored updates in
    /// the new basis, `[k][C]` (unscaled).
    pub(crate) fn refresh_basis(
        &mut self,
        acc: &GpuAccelerator,
    ) -> Result<Vec<Vec<f32>>, HybridError> {
        let ranks = self.ranks();
        let k = self.deltas.len();
        let mut out = vec![Vec::new(); k];
        let mut bases = Vec::with_capacity(self.members.len());
        let opts = SvdOptions {
            method: SvdMethod::Gram,
            ..SvdOptions::default()
        };
        for (g, &r) in ranks.iter().enumerate() {
            let rows: Vec<&Tensor> = self.deltas.iter().map(|d| &d[g]).collect();
            let n = rows[0].numel();
            let h = no_grad(|| Tensor::cat(&rows, 0)?.reshape(&[k, n]))?;
            let svd = acc.compress_residuals(&h, r, &opts)?;
            let (u, s) = (svd.u().to_vec()?, svd.s().to_vec()?);
            let mut signs = vec![1.0f32; r];
            if let Some(old) = self.basis.as_ref().map(|b| &b[g].v) {
                let dots = no_grad(|| svd.v().matmul_t(old, true, false))?.to_vec()?;
                for (j, sg) in signs.iter_mut().enumerate() {
                    if dots[j * r + j] < 0.0 {
                        *sg = -1.0;
                    }
                }
            }
            let v = if signs.iter().all(|&s| s > 0.0) {
                svd.v().detach()
            } else {
                let d = Tensor::from_vec(signs.clone(), &[1, r], h.device())?;
                no_grad(|| svd.v().mul(&d))?
            };
            let mut scale = vec![0.0f64; r];
            for (t, row) in out.iter_mut().enumerate() {
                for j in 0..r {
                    let c = u[t * r + j] * s[j] * signs[j];
                    scale[j] += f64::from(c) * f64::from(c);
                    row.push(c);
                }
            }
            let top = scale.iter().cloned().fold(0.0, f64::max);
            // A direction with no energy (σ = 0) keeps a unit scale: its coefficients are 0.
            let scale = scale
                .iter()
                .map(|&q| {
                    if q > 1e-12 * top && q > 0.0 {
                        (q / k as f64).sqrt() as f32
                    } else {
                        1.0
                    }
                })
                .collect();
            let slices = self.slices(g, &v)?;
            bases.push(Basis { v, slices, scale });
        }
        self.basis = Some(bases);
        Ok(out)
    }

    /// The coefficients `[C]` of an update (per group) in the current basis, with each group's
    /// squared norm `‖Δ‖²` (one host read for all).
    pub(crate) fn project(&self, delta: &[Tensor]) -> Result<(Vec<f32>, Vec<f32>), HybridError> {
        let basis = self.basis.as_ref().ok_or(HybridError::NoBasis)?;
        let mut parts = Vec::with_capacity(2 * delta.len());
        no_grad(|| -> tensor_ops::Result<()> {
            for (d, b) in delta.iter().zip(basis) {
                let n = d.numel();
                let row = d.reshape(&[1, n])?;
                parts.push(row.matmul(&b.v)?.reshape(&[b.scale.len()])?);
                parts.push(d.mul(d)?.sum_all()?.reshape(&[1])?);
            }
            Ok(())
        })?;
        let refs: Vec<&Tensor> = parts.iter().collect();
        let all = no_grad(|| Tensor::cat(&refs, 0))?.to_vec()?;
        let (mut coefs, mut sq) = (Vec::new(), Vec::new());
        let mut at = 0;
        for b in basis {
            let r = b.scale.len();
            coefs.extend_from_slice(&all[at..at + r]);
            sq.push(all[at + r]);
            at += r + 1;
        }
        Ok((coefs, sq))
    }

    /// The scale of each coefficient `[C]`.
    pub(crate) fn scales(&self) -> Vec<f32> {
        self.basis
            .iter()
            .flatten()
            .flat_map(|b| b.scale.iter().copied())
            .collect()
    }

    /// For each tensor, with its group's coefficients (unscaled) as `[1, r]` and its rows of
    /// the group's basis.
    fn per_tensor(&self, coefs: &[f32]) -> Result<Vec<(usize, Tensor, Tensor)>, HybridError> {
        let basis = self.basis.as_ref().ok_or(HybridError::NoBasis)?;
        let mut at = 0;
        let mut out = Vec::with_capacity(self.params.len());
        for (g, b) in basis.iter().enumerate() {
            let r = b.scale.len();
            let dev = b.v.device();
            let c = Tensor::from_vec(coefs[at..at + r].to_vec(), &[1, r], dev)?;
            at += r;
            for (&i, slice) in self.members[g].iter().zip(&b.slices) {
                out.push((i, c.clone(), slice.clone()));
            }
        }
        out.sort_by_key(|e| e.0);
        Ok(out)
    }

    /// The update `Σ_j c_j·v_j` of each tensor for coefficients `[C]` (unscaled), flattened.
    pub(crate) fn expand(&self, coefs: &[f32]) -> Result<Vec<Tensor>, HybridError> {
        self.per_tensor(coefs)?
            .into_iter()
            .map(|(i, c, v)| {
                Ok(no_grad(|| {
                    c.matmul_t(&v, false, true)?
                        .reshape(&[self.params[i].numel()])
                })?)
            })
            .collect()
    }

    /// A predicted step: `W += Σ_j c_j·v_j` on every tensor, in place, through
    /// `apply_corrections` on the tensor's `[1, N]` view (`U` = its group's coefficients,
    /// `S` = 1, `V` = its rows of the group basis). Every factor is checked before any tensor
    /// is written (all finite).
    pub(crate) fn apply_predicted(
        &self,
        acc: &GpuAccelerator,
        coefs: &[f32],
    ) -> Result<(), HybridError> {
        if coefs.iter().any(|c| !c.is_finite()) {
            return Err(HybridError::NonFinite("predicted coefficients"));
        }
        let mut plans = Vec::with_capacity(self.params.len());
        for (i, u, v) in self.per_tensor(coefs)? {
            let p = &self.params[i];
            let s = Tensor::ones(&[u.numel()], p.device())?;
            let view = no_grad(|| p.detach().reshape(&[1, p.numel()]))?;
            plans.push((view, LowRank::from_tensors(u, s, v)?));
        }
        for (view, lr) in &plans {
            acc.apply_corrections(view, lr)?;
        }
        Ok(())
    }

    /// The drift correction after a predicted span: `residual` (per tensor, flattened: the
    /// full step's update minus what the model predicted for it) is compressed to rank
    /// `rank` in each tensor's matrix view (`compress_residuals`) and added `gain` times, in
    /// place (`apply_corrections`).
    pub(crate) fn apply_residual(
        &self,
        acc: &GpuAccelerator,
        residual: &[Tensor],
        rank: usize,
        gain: f32,
        seed: u64,
    ) -> Result<(), HybridError> {
        let mut plans = Vec::with_capacity(residual.len());
        for (i, (e, p)) in residual.iter().zip(&self.params).enumerate() {
            let (m, n) = matrix_shape(p.shape());
            let mat = no_grad(|| e.reshape(&[m, n]))?;
            if all_zero(&mat)? {
                continue;
            }
            let opts = SvdOptions {
                seed: seed ^ (i as u64).wrapping_mul(0xD1B5_4A32_D192_ED03),
                ..SvdOptions::default()
            };
            let c = acc.compress_residuals(&mat, rank.min(m).min(n), &opts)?;
            let s = no_grad(|| c.s().mul_scalar(gain))?;
            let c = LowRank::from_tensors(c.u().clone(), s, c.v().clone())?;
            let view = no_grad(|| p.detach().reshape(&[m, n]))?;
            plans.push((view, c));
        }
        for (view, c) in &plans {
            acc.apply_corrections(view, c)?;
        }
        Ok(())
    }
}

/// True when every element of `t` is zero (one host read).
fn all_zero(t: &Tensor) -> Result<bool, HybridError> {
    let m = no_grad(|| t.mul(t)?.sum_all())?.item()?;
    Ok(m == 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matrix_views() {
        assert_eq!(matrix_shape(&[]), (1, 1));
        assert_eq!(matrix_shape(&[7]), (1, 7));
        assert_eq!(matrix_shape(&[3, 4]), (3, 4));
        assert_eq!(matrix_shape(&[2, 3, 4]), (2, 12));
        assert_eq!(rank_of(4, 8, 3), 3);
        assert_eq!(rank_of(4, 2, 100), 2);
    }
}
