//! [`WorldOps`]: the world model's device work (the `rssm` crate's), as one op family: the
//! largest magnitude of a buffer (the finiteness check before anything is factored or
//! written), the checked in-place low-rank correction `W += U·diag(S)·Vᵀ`, the ensemble
//! rollout over packed weights, and the randomized truncated SVD that compresses residuals.
//!
//! Every method defaults to a composition of the primitives (`nn/defaults/world.rs`,
//! `world_svd.rs`: the SVD's products on the device, its `l`-column QRs and small SVD on the
//! host), so a new backend runs the world model before it has a kernel for it; CUDA overrides
//! all four with its kernels (`gpu-cuda`: `amax`, `lowrank`, `rollout`, and cuBLAS/cuSOLVER
//! with the Cholesky QR and Jacobi kernels for the SVD). The CPU backend takes the
//! defaults on its own (exact) primitives; its f64 reference is `rssm::reference` (`nalgebra`),
//! which the tests compare every backend with.

use crate::backend::BufferInfo;
use crate::error::{GpuError, Result};
use crate::nn::defaults::world as defaults;
use crate::nn::primitives::Primitives;
use crate::nn::rows::RowOps;

/// Sizes of a rollout: `members` ensemble members, `batch` rows, `context` observed steps,
/// `steps` imagined steps; widths hidden `H`, latent `S`, embedding `E`, head `P`, output `D`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RolloutDims {
    pub members: usize,
    pub batch: usize,
    pub context: usize,
    pub steps: usize,
    pub hidden: usize,
    pub latent: usize,
    pub embed: usize,
    pub head: usize,
    pub out: usize,
    /// LayerNorm epsilon of the heads.
    pub eps: f32,
}

impl RolloutDims {
    /// The lengths, in order, of one member's packed tensors: GRU `W_ih [3H, S]`, `W_hh [3H, H]`,
    /// `b_ih`, `b_hh`; then the prior, posterior and decoder heads, each `fc.W [P, in]`, `fc.b`,
    /// `norm.γ`, `norm.β`, `out.W [o, P]`, `out.b` with `in` = H, H + E, H + S and `o` = 2S,
    /// 2S, D.
    pub fn member_layout(&self) -> Vec<usize> {
        let (h, s, e, p, d) = (self.hidden, self.latent, self.embed, self.head, self.out);
        let head = |input: usize, o: usize| [p * input, p, p, p, o * p, o];
        let mut v = vec![3 * h * s, 3 * h * h, 3 * h, 3 * h];
        v.extend(head(h, 2 * s));
        v.extend(head(h + e, 2 * s));
        v.extend(head(h + s, d));
        v
    }

    /// Floats of one member's packed weights.
    pub fn member_len(&self) -> usize {
        self.member_layout().iter().sum()
    }

    /// Errors unless every size is in `1..2^30` and `eps` is finite and positive.
    pub fn check(&self) -> Result<()> {
        let all = [
            self.members,
            self.batch,
            self.context,
            self.steps,
            self.hidden,
            self.latent,
            self.embed,
            self.head,
            self.out,
        ];
        if all.iter().any(|&v| v == 0 || v > u32::MAX as usize / 4) {
            return Err(GpuError::invalid(
                "rssm_rollout",
                format!("every size must be in 1..2^30, got {self:?}"),
            ));
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return Err(GpuError::invalid(
                "rssm_rollout",
                "eps must be finite and > 0",
            ));
        }
        Ok(())
    }

    /// Checks the sizes and every buffer's length (f32) for a rollout call.
    pub fn check_call<B: BufferInfo>(&self, c: &RolloutCall<'_, B>) -> Result<()> {
        self.check()?;
        let overflow = || GpuError::invalid("rssm_rollout", "sizes overflow");
        let mul = |a: usize, b: usize| a.checked_mul(b).ok_or_else(overflow);
        let per_member = mul(mul(self.batch, self.steps)?, self.out)?;
        let need = [
            (
                "weights",
                c.weights.len(),
                c.weights.dtype(),
                mul(self.members, self.member_len())?,
            ),
            (
                "embeds",
                c.embeds.len(),
                c.embeds.dtype(),
                mul(mul(self.batch, self.context)?, self.embed)?,
            ),
            (
                "out",
                c.out.len(),
                c.out.dtype(),
                mul(self.members, per_member)?,
            ),
            ("mean", c.mean.len(), c.mean.dtype(), per_member),
            (
                "disagreement",
                c.disagreement.len(),
                c.disagreement.dtype(),
                mul(self.batch, self.steps)?,
            ),
        ];
        for (what, len, dtype, want) in need {
            if len != want || dtype != crate::DType::F32 {
                return Err(GpuError::invalid(
                    "rssm_rollout",
                    format!("{what} needs {want} f32, got {len} {dtype}"),
                ));
            }
        }
        Ok(())
    }
}

/// The buffers of a rollout: `weights` holds `members` packed members
/// ([`RolloutDims::member_len`] each, [`RolloutDims::member_layout`] order), `embeds` the
/// encoder's output `[batch, context, embed]`; the outputs are each member's predictions `out`
/// `[members, batch, steps, out]`, their `mean` `[batch, steps, out]` and `disagreement`
/// `[batch, steps]` (population variance over members, averaged over outputs).
#[derive(Debug)]
pub struct RolloutCall<'a, B> {
    pub weights: &'a B,
    pub embeds: &'a B,
    pub out: &'a mut B,
    pub mean: &'a mut B,
    pub disagreement: &'a mut B,
}

/// Row-major factors of a low-rank correction `U·diag(S)·Vᵀ`: `U` `[m, k]`, `S` `[k]`, `V`
/// `[n, k]`, all f32.
#[derive(Debug, Clone, Copy)]
pub struct LowRankFactors<'a, B> {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub u: &'a B,
    pub s: &'a B,
    pub v: &'a B,
}

/// Errors (naming the buffer) unless each `(what, len, dtype, want)` is f32 of `want` elements.
fn check_f32_lens(op: &'static str, need: [(&str, usize, crate::DType, usize); 4]) -> Result<()> {
    for (what, got, dtype, want) in need {
        if got != want || dtype != crate::DType::F32 {
            return Err(GpuError::invalid(
                op,
                format!("{what} needs {want} f32, got {got} {dtype}"),
            ));
        }
    }
    Ok(())
}

impl<B: BufferInfo> LowRankFactors<'_, B> {
    /// Errors unless `k >= 1`, every buffer is f32 of its shape's length and `w` holds `m·n`.
    pub fn check(&self, w: &B) -> Result<()> {
        const OP: &str = "low_rank_add";
        if self.k == 0 {
            return Err(GpuError::invalid(OP, "the rank must be at least 1"));
        }
        let len = |a: usize, b: usize| {
            a.checked_mul(b)
                .ok_or_else(|| GpuError::invalid(OP, "sizes overflow"))
        };
        let need = [
            ("W", w.len(), w.dtype(), len(self.m, self.n)?),
            ("U", self.u.len(), self.u.dtype(), len(self.m, self.k)?),
            ("S", self.s.len(), self.s.dtype(), self.k),
            ("V", self.v.len(), self.v.dtype(), len(self.n, self.k)?),
        ];
        check_f32_lens(OP, need)
    }
}

/// What [`WorldOps::low_rank_add`] did. Unless it is `Written`, `W` was left as it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LowRankOutcome {
    /// `W` now holds the sum.
    Written,
    /// `W` holds a NaN or an infinity.
    NonFiniteWeights,
    /// Some entry of the sum is not finite (it overflows f32, or a factor holds NaN/Inf).
    NonFiniteSum,
}

/// Which truncated SVD [`WorldOps::randomized_svd`] runs (the world model's
/// `compress_residuals`). CUDA overrides each; the family's default runs every Halko variant
/// as one composition (device products, host QR and small SVD) and refuses `CusolverGesvdr`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SvdMethod {
    /// Halko, Martinsson and Tropp's algorithm as written in `rssm::svd::randomized_svd`,
    /// on cuBLAS, the final bases (of the sketch and of `Bᵀ`) orthonormalised by Cholesky QR2
    /// and the intermediate ones of the power iterations by one pass of it
    /// (`gpu_cuda::cholqr`), and the small SVD by one-sided Jacobi (`gpu_cuda::small_svd`),
    /// for sketch widths `k + p <= 64`. A
    /// breakdown of Cholesky QR (a sketch too ill-conditioned for f32, an exactly
    /// rank-deficient one) is flagged on the device and read at the call's one
    /// synchronisation; the call is then redone as [`SvdMethod::HalkoHouseholder`]. A zero
    /// singular value among the first `k` sends the small SVD to the host.
    /// Replayed as one CUDA graph from the second call of a shape on (`gpu-cuda`'s `nn/world_svd_graph.rs`).
    #[default]
    Halko,
    /// The same as [`SvdMethod::Halko`], with every operation issued one by one instead of
    /// replayed from a captured graph (the results are bit for bit the same): for comparison.
    HalkoEager,
    /// The same algorithm with cuSOLVER's Householder QR (`geqrf` + `orgqr`) at every
    /// orthonormalisation and the small SVD in f64 on the host (nalgebra): unconditionally
    /// stable, and slower (docs/benchmarks.md). On the CPU the same as `Halko`.
    HalkoHouseholder,
    /// cuSOLVER's `cusolverDnXgesvdr` (fp32), with the same oversampling and power iterations
    /// (oversampling capped so that `k + p <= min(m, n)`). CUDA only. Slower than `Halko` on an
    /// H200 at equal error (docs/benchmarks.md), and not exact on exactly low-rank input (a
    /// rank-16 matrix came back with relative error 4.8e-4): kept for comparison.
    CusolverGesvdr,
    /// The short-wide (or tall-skinny) matrix's Gram matrix, one GEMM, its eigen-decomposition
    /// on the host and a second GEMM (`rssm::svd_gram`, composed of tensor ops by the caller: never passed to [`WorldOps::randomized_svd`]), on either device: one pass over the
    /// matrix, for `min(m, n) <= 512`. Directions with `σ <= √(min(m, n)·u)·σ₁` come back as
    /// noise-free zeros (σ = 0): for histories of updates, not for ill-conditioned matrices.
    Gram,
}

/// A truncated SVD's sizes and options: the rank-`rank` factors of a row-major `m × n` matrix
/// by randomized subspace iteration with `oversample` extra columns (the sketch is
/// `min(rank + oversample, min(m, n))` wide), `power_iters` power iterations and the Gaussian
/// test matrix drawn from `seed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SvdSpec {
    pub m: usize,
    pub n: usize,
    pub rank: usize,
    pub oversample: usize,
    pub power_iters: usize,
    pub seed: u64,
    pub method: SvdMethod,
}

impl SvdSpec {
    /// The largest accepted `power_iters` (more never helps: `σ^(2q+1)` underflows the tail
    /// long before).
    pub const MAX_POWER: usize = 64;

    /// The sketch's width `l`.
    pub fn sketch(&self) -> usize {
        self.rank
            .saturating_add(self.oversample)
            .min(self.m.min(self.n))
    }

    /// Errors unless `1 <= rank <= min(m, n)`, `power_iters <= MAX_POWER`, the method is not
    /// `Gram` and `a` and the outputs are f32 of their shapes' lengths.
    pub fn check<B: BufferInfo>(&self, a: &B, out: &SvdOut<'_, B>) -> Result<()> {
        const OP: &str = "randomized_svd";
        let (m, n, k) = (self.m, self.n, self.rank);
        if k == 0 || k > m.min(n) {
            return Err(GpuError::invalid(
                OP,
                format!("rank {k} is not in 1..={} for {m} × {n}", m.min(n)),
            ));
        }
        if self.power_iters > Self::MAX_POWER {
            return Err(GpuError::invalid(
                OP,
                format!(
                    "power_iters {} is above {}",
                    self.power_iters,
                    Self::MAX_POWER
                ),
            ));
        }
        if self.method == SvdMethod::Gram {
            return Err(GpuError::invalid(
                OP,
                "the Gram method is composed by the caller, not a randomized SVD",
            ));
        }
        let mn = m
            .checked_mul(n)
            .ok_or_else(|| GpuError::invalid(OP, "sizes overflow"))?;
        let need = [
            ("A", a.len(), a.dtype(), mn),
            ("U", out.u.len(), out.u.dtype(), m * k),
            ("S", out.s.len(), out.s.dtype(), k),
            ("V", out.v.len(), out.v.dtype(), n * k),
        ];
        check_f32_lens(OP, need)
    }
}

/// The outputs of a truncated SVD: `U` `[m, k]` and `V` `[n, k]` row-major with orthonormal
/// columns, `S` `[k]` descending.
#[derive(Debug)]
pub struct SvdOut<'a, B> {
    pub u: &'a mut B,
    pub s: &'a mut B,
    pub v: &'a mut B,
}

/// What [`WorldOps::randomized_svd`] did. Unless `Done`, the outputs hold nothing meaningful.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SvdOutcome {
    Done,
    /// The matrix holds a NaN or an infinity.
    NonFiniteInput,
    /// A singular value does not fit f32 (the matrix's scale overflows it).
    NonFiniteScale,
}

/// The world model's op family (see the module docs).
pub trait WorldOps: Primitives + RowOps {
    /// The largest `|x|` of the f32 buffer `x` (0 when empty); NaN when `x` holds a NaN, else
    /// infinity when it holds an infinity. One value comes back to the host (a synchronisation).
    fn max_abs(&self, x: &Self::Buffer) -> Result<f32> {
        defaults::max_abs(self, x)
    }

    /// `w += U·diag(S)·Vᵀ` in place for `w` f32 `[m, n]`, checked before anything is written:
    /// when `w` or the sum holds NaN or an infinity, `w` is left as it was and the outcome says
    /// which. The default forms the sum in a temporary of `w`'s size.
    fn low_rank_add(
        &self,
        w: &mut Self::Buffer,
        f: LowRankFactors<'_, Self::Buffer>,
    ) -> Result<LowRankOutcome> {
        defaults::low_rank_add(self, w, f)
    }

    /// The ensemble rollout (see [`RolloutCall`]): every member filters the context's
    /// embeddings along its posterior mean, then rolls `steps` ahead along its prior mean and
    /// decodes each step. All sizes and lengths are checked first.
    fn rssm_rollout(&self, d: &RolloutDims, c: RolloutCall<'_, Self::Buffer>) -> Result<()> {
        defaults::rssm_rollout(self, d, c)
    }

    /// The rank-`spec.rank` truncated SVD of the f32 row-major `m × n` matrix `a` by randomized
    /// subspace iteration (Halko, Martinsson and Tropp 2011; [`SvdMethod`] picks the variant),
    /// into `out`. NaN or an infinity in `a` is an outcome, not an error; bad sizes, ranks and
    /// options are errors, before anything runs.
    fn randomized_svd(
        &self,
        a: &Self::Buffer,
        spec: &SvdSpec,
        out: SvdOut<'_, Self::Buffer>,
    ) -> Result<SvdOutcome> {
        crate::nn::defaults::world_svd::randomized_svd(self, a, spec, out)
    }
}
