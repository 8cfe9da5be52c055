//! [`WorldOps`] on CUDA: the world model's fused kernels as overrides of the family's defaults
//! — the one-pass magnitude scan (`amax`, `kernels/linalg_amax.cu`), the fused check-then-write
//! correction for ranks up to 64 (`lowrank`, `kernels/rssm_correct.cu`) and the cooperative
//! rollout (`rollout`, `kernels/rssm_rollout*.cu`). Where a kernel cannot take the call (a
//! larger rank; a model too large for the rollout's shared memory or grid, or a grid the driver
//! refuses although its occupancy queries admitted it) the default composition runs instead:
//! the same function, more launches.

use crate::backend::CudaBackend;
use crate::lowrank::{LOWRANK_MAX_RANK, LOWRANK_NONFINITE_W};
use crate::pool::CudaBuffer;
use gpu_core::nn::defaults::world as defaults;
use gpu_core::nn::{
    LowRankFactors, LowRankOutcome, RolloutCall, RolloutDims, SvdOut, SvdOutcome, SvdSpec, WorldOps,
};
use gpu_core::{Backend, BufferInfo, DType, GpuError, Result};

impl WorldOps for CudaBackend {
    fn max_abs(&self, x: &CudaBuffer) -> Result<f32> {
        if x.dtype() != DType::F32 {
            return Err(GpuError::invalid(
                "max_abs",
                format!("needs f32, got {}", x.dtype()),
            ));
        }
        Ok(f32::from_bits(self.max_abs_bits(x, x.len())?))
    }

    fn low_rank_add(
        &self,
        w: &mut CudaBuffer,
        f: LowRankFactors<'_, CudaBuffer>,
    ) -> Result<LowRankOutcome> {
        f.check(w)?;
        if f.k > LOWRANK_MAX_RANK {
            return defaults::low_rank_add(self, w, f);
        }
        let mut flag = self.allocate(DType::U32, 1)?;
        self.lowrank_add((f.m, f.n, f.k), w, f.u, f.s, f.v, &mut flag)?;
        let bits = self.download::<u32>(&flag)?[0];
        Ok(if bits & LOWRANK_NONFINITE_W != 0 {
            LowRankOutcome::NonFiniteWeights
        } else if bits != 0 {
            LowRankOutcome::NonFiniteSum
        } else {
            LowRankOutcome::Written
        })
    }

    fn rssm_rollout(&self, d: &RolloutDims, c: RolloutCall<'_, CudaBuffer>) -> Result<()> {
        d.check_call(&c)?;
        if !self.rssm_rollout_fits(d) {
            return defaults::rssm_rollout(self, d, c);
        }
        let RolloutCall {
            weights,
            embeds,
            out,
            mean,
            disagreement,
        } = c;
        match self.rssm_rollout_fused(d, weights, embeds, out, mean, disagreement) {
            // Nothing ran and the outputs are untouched (`rssm_rollout_fused`).
            Err(e) if crate::is_cooperative_launch_too_large(&e) => {
                let c = RolloutCall {
                    weights,
                    embeds,
                    out,
                    mean,
                    disagreement,
                };
                defaults::rssm_rollout(self, d, c)
            }
            r => r,
        }
    }

    fn randomized_svd(
        &self,
        a: &CudaBuffer,
        spec: &SvdSpec,
        out: SvdOut<'_, CudaBuffer>,
    ) -> Result<SvdOutcome> {
        self.randomized_svd_cuda(a, spec, out)
    }
}
