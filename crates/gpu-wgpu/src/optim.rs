//! [`OptimOps`] for [`WgpuBackend`]: AdamW as one fused kernel a parameter (the default
//! composes ~17 primitive launches and ~14 temporaries a parameter), the other optimizers
//! from gpu-core's defaults. f32 arithmetic; the CPU reference evaluates each element in f64
//! and rounds once, so the two agree within a few ulps of each updated value.

use crate::backend::WgpuBackend;
use crate::buffer::WgpuBuffer;
use crate::kernels::{params, src, thread_src, to_u32};
use crate::shaders::{ADAMW, CLIP_FINAL, SUMSQ};
use gpu_core::backend::{Backend, BufferInfo};
use gpu_core::nn::optim::{adamw_schedule, check_clip, read_schedule, AdamWBuffers};
use gpu_core::nn::{AdamWConfig, OptimOps};
use gpu_core::{DType, Result};

/// Elements one `sumsq` workgroup sums (256 threads × 64).
const SUMSQ_BLOCK: usize = 16384;

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
        bufs.check(cfg)?;
        for i in 0..bufs.params.len() {
            self.check_out(OP, &bufs.row(i))?;
            to_u32(OP, bufs.params[i].len())?;
        }
        let (weight_decay, grad_scale) = (bufs.weight_decay, bufs.grad_scale);
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
        let body = || thread_src(&ADAMW.replace("SCALE_BINDING", scale).replace("COEF", coef));
        for (i, &wd) in weight_decay.iter().enumerate() {
            let n = bufs.params[i].len();
            let decay = (1.0 - lr as f64 * wd as f64) as f32;
            let mut p = params(OP, &[n])?;
            let coefs = [cfg.beta1, cfg.beta2, cfg.eps, step_size, bc2_sqrt, decay];
            p[1..7].copy_from_slice(&coefs.map(f32::to_bits));
            let mut raw = bufs.row(i).map(|b| b.raw()).to_vec();
            if let Some(s) = grad_scale {
                raw.push(s.raw());
            }
            self.launch_1d(OP, key, body, p, n, &raw)?;
        }
        Ok(())
    }
}

impl OptimOps for WgpuBackend {
    /// On the device, no read-back: per gradient, partial sums of squares of 16384 elements
    /// (f32, 64 in order a thread, then a tree), then one workgroup adds the partials and
    /// writes `[norm, coef]`. Against the CPU's f64 sum the relative error of the norm is at
    /// most about (64 + 8 + parts/256 + 8)·2^-24 (non-negative terms), a few 1e-6. The sum is
    /// f32: past ~3.4e38 (an element beyond ~1.8e19) the norm is inf and the coefficient 0,
    /// where the CPU's f64 sum gives a finite norm and a coefficient near 0.
    fn clip_coefficient(
        &self,
        grads: &[&WgpuBuffer],
        max_norm: f32,
        out: &mut WgpuBuffer,
    ) -> Result<()> {
        const OP: &str = "clip_grad_norm";
        check_clip(grads, max_norm, out)?;
        self.check_out(OP, grads)?;
        self.check_out(OP, &[out])?;
        let blocks: Vec<usize> = grads
            .iter()
            .map(|g| g.len().div_ceil(SUMSQ_BLOCK))
            .collect();
        let parts: usize = blocks.iter().sum();
        let partials = self.allocate(DType::F32, parts.max(1))?;
        let mut part0 = 0;
        for (g, &n) in grads.iter().zip(&blocks) {
            let p = params(OP, &[g.len(), part0])?;
            let (gx, gy) = self.grid(OP, to_u32(OP, n)?)?;
            self.launch(
                OP,
                ("sumsq", || src(SUMSQ)),
                p,
                (gx, (gx, gy, 1)),
                &[g.raw(), partials.raw()],
            )?;
            part0 += n;
        }
        let mut p = params(OP, &[parts])?;
        p[1] = max_norm.to_bits();
        self.launch(
            OP,
            ("clip_final", || src(CLIP_FINAL)),
            p,
            (1, (1, 1, 1)),
            &[partials.raw(), out.raw()],
        )
    }

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
