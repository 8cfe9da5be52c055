//! The world model's device ops on tensors (`gpu_core::nn::WorldOps`): the largest magnitude,
//! the checked in-place low-rank correction, the ensemble rollout over packed weights and the
//! randomized truncated SVD. Each
//! runs on its tensors' device through the family: CUDA's fused kernels, the defaults built
//! from primitives elsewhere. No gradient (the world model trains through its tensor-ops
//! layers; these are its inference and the trainer's corrections).

use crate::ops::{buf, buf_mut, compute};
use crate::tensor::{same_device, Tensor};
use gpu_core::nn::{
    LowRankFactors, LowRankOutcome, Primitives, RolloutCall, RolloutDims, SvdOut, SvdOutcome,
    SvdSpec, WorldOps,
};
use gpu_core::{DType, GpuError, Result};

/// What [`rssm_rollout`] returns: each member's predictions `[M, B, N, D]`, their mean
/// `[B, N, D]` and their disagreement `[B, N]`.
#[derive(Debug, Clone)]
pub struct Rollout {
    pub members: Tensor,
    pub mean: Tensor,
    pub disagreement: Tensor,
}

fn require_f32(op: &'static str, what: &str, t: &Tensor) -> Result<()> {
    if t.dtype() != DType::F32 {
        return Err(GpuError::invalid(
            op,
            format!("{what} must hold f32, not {}", t.dtype()),
        ));
    }
    Ok(())
}

impl Tensor {
    /// The largest `|x|` of an f32 tensor (0 when empty): NaN when it holds a NaN, else
    /// infinity when it holds an infinity. One scan on the tensor's device, one value read.
    pub fn max_abs(&self) -> Result<f32> {
        require_f32("max_abs", "the tensor", self)?;
        let x = self.read();
        Ok(crate::backend::on_device!(self.device(), |be| be.max_abs(buf(be, &x)?)?))
    }

    /// `self += u·diag(s)·vᵀ` in place, for `self` f32 `[m, n]` (a leaf, not an op's result in
    /// an autograd graph) and f32 factors `u` `[m, k]`, `s` `[k]`, `v` `[n, k]` on its device.
    /// The sum is checked before anything is written: unless the outcome is
    /// [`LowRankOutcome::Written`], `self` is unchanged (NaN or Inf in `self`, or in the sum).
    pub fn low_rank_add_(&self, u: &Tensor, s: &Tensor, v: &Tensor) -> Result<LowRankOutcome> {
        const OP: &str = "low_rank_add_";
        let dev = same_device(OP, &[self, u, s, v])?;
        self.check_writable(OP)?;
        let (m, n, k) = match (self.shape(), u.shape(), s.shape(), v.shape()) {
            ([m, n], [mu, k], [ks], [nv, kv]) if mu == m && ks == k && nv == n && kv == k => {
                (*m, *n, *k)
            }
            _ => {
                return Err(GpuError::shape(
                    OP,
                    "w [m, n], u [m, k], s [k], v [n, k]",
                    format!(
                        "{:?} {:?} {:?} {:?}",
                        self.shape(),
                        u.shape(),
                        s.shape(),
                        v.shape()
                    ),
                ))
            }
        };
        for (what, t) in [("u", u), ("s", s), ("v", v)] {
            require_f32(OP, what, t)?;
        }
        let (ug, sg, vg) = (u.read(), s.read(), v.read());
        let mut wg = self
            .0
            .storage
            .try_write()
            .map_err(|_| crate::interop::busy(OP))?;
        Ok(crate::backend::on_device!(dev, |be| {
            let f = LowRankFactors {
                m,
                n,
                k,
                u: buf(be, &ug)?,
                s: buf(be, &sg)?,
                v: buf(be, &vg)?,
            };
            be.low_rank_add(buf_mut(be, &mut wg)?, f)?
        }))
    }
}

/// The ensemble rollout (`WorldOps::rssm_rollout`) of `weights` (f32, `d.members` packed
/// members in [`RolloutDims::member_layout`] order) over `embeds` f32 `[B, T, E]` (the
/// encoder's output), both on one device; `d`'s batch, context and embedding width must match
/// `embeds`.
pub fn rssm_rollout(d: &RolloutDims, weights: &Tensor, embeds: &Tensor) -> Result<Rollout> {
    const OP: &str = "rssm_rollout";
    let dev = same_device(OP, &[weights, embeds])?;
    require_f32(OP, "weights", weights)?;
    require_f32(OP, "embeds", embeds)?;
    if embeds.shape() != [d.batch, d.context, d.embed] {
        return Err(GpuError::shape(
            OP,
            format!("embeds [{}, {}, {}]", d.batch, d.context, d.embed),
            format!("{:?}", embeds.shape()),
        ));
    }
    d.check()?;
    let per_member = d.batch * d.steps * d.out;
    let (w, e) = (weights.read(), embeds.read());
    // The three outputs come from one call: the mean and disagreement are made first, and the
    // members' predictions are the call's own output.
    let mut mean = compute!(dev, per_member, |be, out| be.fill(&mut out, 0.0));
    let mut dis = compute!(dev, d.batch * d.steps, |be, out| be.fill(&mut out, 0.0));
    let members = compute!(dev, d.members * per_member, |be, out| be.rssm_rollout(
        d,
        RolloutCall {
            weights: buf(be, &w)?,
            embeds: buf(be, &e)?,
            out: &mut out,
            mean: buf_mut(be, &mut mean)?,
            disagreement: buf_mut(be, &mut dis)?,
        }
    ));
    let shape = |s: &[usize]| s.to_vec();
    Ok(Rollout {
        members: Tensor::from_storage(members, shape(&[d.members, d.batch, d.steps, d.out]), dev),
        mean: Tensor::from_storage(mean, shape(&[d.batch, d.steps, d.out]), dev),
        disagreement: Tensor::from_storage(dis, shape(&[d.batch, d.steps]), dev),
    })
}

/// What [`randomized_svd`] returns.
#[derive(Debug, Clone)]
pub enum SvdResult {
    /// `u` `[m, k]` and `v` `[n, k]` with orthonormal columns, `s` `[k]` descending.
    Factors { u: Tensor, s: Tensor, v: Tensor },
    /// The matrix holds a NaN or an infinity.
    NonFiniteInput,
    /// A singular value does not fit f32.
    NonFiniteScale,
}

/// The rank-`spec.rank` truncated SVD of the f32 matrix `a` `[spec.m, spec.n]`
/// (`WorldOps::randomized_svd` on its device). No gradient.
pub fn randomized_svd(a: &Tensor, spec: &SvdSpec) -> Result<SvdResult> {
    const OP: &str = "randomized_svd";
    require_f32(OP, "the matrix", a)?;
    if a.shape() != [spec.m, spec.n] {
        return Err(GpuError::shape(
            OP,
            format!("[{}, {}]", spec.m, spec.n),
            format!("{:?}", a.shape()),
        ));
    }
    let dev = a.device();
    let (m, n, k) = (spec.m, spec.n, spec.rank);
    let x = a.read();
    let mut outcome = SvdOutcome::Done;
    let mut s = compute!(dev, k, |be, out| be.fill(&mut out, 0.0));
    let mut v = compute!(dev, n * k, |be, out| be.fill(&mut out, 0.0));
    let u = compute!(dev, m * k, |be, out| {
        let o = SvdOut {
            u: &mut out,
            s: buf_mut(be, &mut s)?,
            v: buf_mut(be, &mut v)?,
        };
        be.randomized_svd(buf(be, &x)?, spec, o)
            .map(|r| outcome = r)
    });
    Ok(match outcome {
        SvdOutcome::Done => SvdResult::Factors {
            u: Tensor::from_storage(u, vec![m, k], dev),
            s: Tensor::from_storage(s, vec![k], dev),
            v: Tensor::from_storage(v, vec![n, k], dev),
        },
        SvdOutcome::NonFiniteInput => SvdResult::NonFiniteInput,
        SvdOutcome::NonFiniteScale => SvdResult::NonFiniteScale,
    })
}
