//! [`OptimOps`] for [`WgpuBackend`]: AdamW as one fused kernel a parameter (the default
//! composes ~17 primitive launches and ~14 temporaries a parameter), the other optimizers
//! from gpu-core's defaults. f32 arithmetic; the CPU reference evaluates each element in f64
//! and rounds once, so the two agree within a few ulps of each updated value.

use crate::backend::WgpuBackend;
use crate::buffer::WgpuBuffer;
use crate::kernels::{src, to_u32};
use gpu_core::backend::BufferInfo;
use gpu_core::nn::optim::{adamw_schedule, check_adamw, read_schedule, AdamWBuffers};
use gpu_core::nn::{AdamWConfig, OptimOps};
use gpu_core::Result;

const ADAMW: &str = include_str!("shaders/adamw.wgsl");

impl WgpuBackend {
    /// AdamW with the scalars `[lr, step_size, bc2_sqrt]` of a schedule, one launch a
    /// parameter; every argument is checked before the first launch.
    fn adamw_fused(
        &self,
        bufs: AdamWBuffers<'_, '_, WgpuBuffer>,
        cfg: AdamWConfig,
        [lr, step_size, bc2_sqrt]: [f32; 3],
    ) -> Result<()> {
        const OP: &str = "adamw_step";
        let AdamWBuffers {
            params,
            grads,
            m,
            v,
            weight_decay,
            grad_scale,
        } = bufs;
        check_adamw(params, grads, m, v, weight_decay, grad_scale, cfg)?;
        for i in 0..params.len() {
            self.check_out(OP, &[&*params[i], grads[i], &*m[i], &*v[i]])?;
            to_u32(OP, params[i].len())?;
        }
        if let Some(s) = grad_scale {
            self.check_out(OP, &[s])?;
        }
        let (key, scale, coef) = match grad_scale {
            Some(_) => (
                "adamw_clip",
                "@group(0) @binding(5) var<storage, read> s: array<f32>;",
                "s[1]",
            ),
            None => ("adamw", "", "1.0"),
        };
        let body = || src(&ADAMW.replace("SCALE_BINDING", scale).replace("COEF", coef));
        for i in 0..params.len() {
            let n = params[i].len();
            let decay = (1.0 - lr as f64 * weight_decay[i] as f64) as f32;
            let p = [
                to_u32(OP, n)?,
                cfg.beta1.to_bits(),
                cfg.beta2.to_bits(),
                cfg.eps.to_bits(),
                step_size.to_bits(),
                bc2_sqrt.to_bits(),
                decay.to_bits(),
                0,
            ];
            let mut raw = vec![params[i].raw(), grads[i].raw(), m[i].raw(), v[i].raw()];
            if let Some(s) = grad_scale {
                raw.push(s.raw());
            }
            self.launch_1d(OP, key, body, p, n, &raw)?;
        }
        Ok(())
    }
}

impl OptimOps for WgpuBackend {
    fn adamw_step(&self, bufs: AdamWBuffers<'_, '_, WgpuBuffer>, cfg: AdamWConfig) -> Result<()> {
        self.adamw_fused(bufs, cfg, adamw_schedule(cfg))
    }

    /// Reads the schedule on the host (wgpu has no graph to replay), then the fused step.
    fn adamw_step_scheduled(
        &self,
        bufs: AdamWBuffers<'_, '_, WgpuBuffer>,
        cfg: AdamWConfig,
        schedule: &WgpuBuffer,
    ) -> Result<()> {
        self.check_out("adamw_step", &[schedule])?;
        let s = read_schedule(self, schedule)?;
        self.adamw_fused(bufs, cfg, s)
    }
}
