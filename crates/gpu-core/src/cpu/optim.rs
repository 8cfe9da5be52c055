//! [`OptimOps`] on the CPU: the reference. The global norm is accumulated in f64; AdamW follows
//! `torch.optim.AdamW` step by step (decoupled decay first, then the bias-corrected Adam update),
//! evaluated per element in f64 from the stored f32 values and rounded once.

use super::optim_adaptive as adaptive;
use super::par::GRAIN;
use super::{fast, CpuBackend, CpuStorage};
use crate::error::Result;
use crate::nn::optim::{
    adamw_scalars, check_clip, AdamWBuffers, AdamWConfig, OptimOps, ProdigyBuffers, ProdigyConfig,
    ScheduleFreeBuffers, ScheduleFreeConfig, StepScalars,
};
use rayon::prelude::*;

/// `min(1, max_norm / (norm + 1e-6))` in f64, keeping a NaN (as `torch.clamp(max=1)` does).
pub(crate) fn clip_coef(norm: f64, max_norm: f32) -> f64 {
    let c = max_norm as f64 / (norm + 1e-6);
    if c > 1.0 {
        1.0
    } else {
        c
    }
}

impl OptimOps for CpuBackend {
    fn clip_coefficient(
        &self,
        grads: &[&CpuStorage],
        max_norm: f32,
        out: &mut CpuStorage,
    ) -> Result<()> {
        let _p = super::profile::scope("clip_coefficient");
        check_clip(grads, max_norm, out)?;
        let mut sum = 0.0f64;
        let fast = fast::fast().then(fast::Isa::best);
        for g in grads {
            let g = g.as_f32()?;
            sum += match fast {
                Some(isa) => {
                    let mut s = 0.0;
                    fast::optim::sum_squares(isa, g, &mut s);
                    s
                }
                None => g.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>(),
            };
        }
        let norm = sum.sqrt();
        let out = out.as_f32_mut()?;
        out[0] = norm as f32;
        out[1] = clip_coef(norm, max_norm) as f32;
        Ok(())
    }

    fn adamw_step(&self, bufs: AdamWBuffers<'_, '_, CpuStorage>, cfg: AdamWConfig) -> Result<()> {
        let _p = super::profile::scope("adamw_step");
        bufs.check(cfg)?;
        let (params, grads, m, v) = (bufs.params, bufs.grads, bufs.m, bufs.v);
        let weight_decay = bufs.weight_decay;
        let coef = match bufs.grad_scale {
            Some(s) => s.as_f32()?[1] as f64,
            None => 1.0,
        };
        let (step_size, bc2_sqrt) = adamw_scalars(cfg);
        let (b1, b2, eps) = (cfg.beta1 as f64, cfg.beta2 as f64, cfg.eps as f64);
        let fast = fast::fast().then(fast::Isa::best);
        for i in 0..params.len() {
            let decay = 1.0 - cfg.lr as f64 * weight_decay[i] as f64;
            let g = grads[i].as_f32()?;
            let (p, mi, vi) = (
                params[i].as_f32_mut()?,
                m[i].as_f32_mut()?,
                v[i].as_f32_mut()?,
            );
            let chunks = p.par_chunks_mut(GRAIN).zip(mi.par_chunks_mut(GRAIN));
            let chunks = chunks
                .zip(vi.par_chunks_mut(GRAIN))
                .zip(g.par_chunks(GRAIN));
            if let Some(isa) = fast {
                let s = fast::optim::AdamWScalars {
                    coef: coef as f32,
                    beta1: cfg.beta1,
                    beta2: cfg.beta2,
                    eps: cfg.eps,
                    decay: decay as f32,
                    step_size: step_size as f32,
                    bc2_sqrt: bc2_sqrt as f32,
                };
                chunks.for_each(|(((p, m), v), g)| fast::optim::adamw(isa, p, m, v, g, s));
                continue;
            }
            chunks.for_each(|(((p, mi), vi), g)| {
                for e in 0..p.len() {
                    let g = g[e] as f64 * coef;
                    let me = b1 * mi[e] as f64 + (1.0 - b1) * g;
                    let ve = b2 * vi[e] as f64 + (1.0 - b2) * g * g;
                    let pe = p[e] as f64 * decay;
                    p[e] = (pe - step_size * me / (ve.sqrt() / bc2_sqrt + eps)) as f32;
                    mi[e] = me as f32;
                    vi[e] = ve as f32;
                }
            });
        }
        Ok(())
    }

    fn schedule_free_step(
        &self,
        bufs: ScheduleFreeBuffers<'_, '_, CpuStorage>,
        cfg: ScheduleFreeConfig,
        scalars: StepScalars<'_, CpuStorage>,
    ) -> Result<()> {
        let _p = super::profile::scope("schedule_free_step");
        adaptive::schedule_free_step(bufs, cfg, scalars)
    }

    fn lerp_params(
        &self,
        params: &mut [&mut CpuStorage],
        ends: &[&CpuStorage],
        weight: f32,
    ) -> Result<()> {
        adaptive::lerp_params(params, ends, weight)
    }

    fn prodigy_step(
        &self,
        bufs: ProdigyBuffers<'_, '_, CpuStorage>,
        cfg: ProdigyConfig,
        lr: StepScalars<'_, CpuStorage>,
        scalars: &mut CpuStorage,
    ) -> Result<()> {
        let _p = super::profile::scope("prodigy_step");
        adaptive::prodigy_step(bufs, cfg, lr, scalars)
    }
}
