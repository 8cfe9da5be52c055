//! [`OptimOps`] on CUDA: the multi-tensor kernels of `kernels/nn_optim.cu`.
//!
//! Tensors are described to the kernels by a `MultiTensor` struct passed by value
//! ([`KernelArg::Bytes`], so these launches take the raw driver path; its layout and the
//! chunking of a tensor list into launches are in `super::multi_tensor`). Schedule-Free AdamW
//! and the lerp use the same struct; Prodigy's `MultiTensor6` and its passes are in
//! `super::optim_adaptive`.

use super::multi_tensor::{blocks_config, chunks, total_blocks, Chunk, Entry};
use super::optim_adaptive::{chunks6, prodigy_args, scalar_args, Entry6, ProdigyRun};
use crate::backend::CudaBackend;
use crate::launch::KernelArg;
use crate::pool::CudaBuffer;
use gpu_core::nn::optim::{
    adamw_scalars, check_clip, AdamWBuffers, AdamWConfig, OptimOps, ProdigyBuffers, ProdigyConfig,
    ScheduleFreeBuffers, ScheduleFreeConfig, StepScalars,
};
use gpu_core::nn::optim_adaptive::{
    check_lerp_params, shared, PRODIGY_SCHEDULE_LEN, SF_SCHEDULE_LEN,
};
use gpu_core::{Backend, BufferInfo, DType, GpuError, Result};

impl OptimOps for CudaBackend {
    /// The AdamW kernel reading `[lr, step_size, bc2_sqrt]` from `schedule` on the device.
    fn adamw_step_scheduled(
        &self,
        bufs: AdamWBuffers<'_, '_, CudaBuffer>,
        cfg: AdamWConfig,
        schedule: &CudaBuffer,
    ) -> Result<()> {
        if schedule.dtype() != DType::F32 || schedule.len() != 3 {
            return Err(GpuError::shape(
                "adamw_step_scheduled",
                "a schedule of 3 f32 ([lr, step_size, bc2_sqrt])",
                format!("{} {}", schedule.len(), schedule.dtype()),
            ));
        }
        self.check_owned("adamw_step_scheduled", &[schedule])?;
        self.adamw_impl(bufs, cfg, Some(schedule))
    }

    fn clip_coefficient(
        &self,
        grads: &[&CudaBuffer],
        max_norm: f32,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        check_clip(grads, max_norm, out)?;
        self.check_owned("clip_grad_norm", grads)?;
        let chunks = chunks(grads.iter().map(|g| Entry {
            ptrs: [0, g.device_ptr(), 0, 0],
            len: g.len(),
            decay: 0.0,
        }));
        // One f64 partial sum per block (two f32 slots each); back to the pool on drop.
        let mut partials = self.allocate(DType::F32, 2 * total_blocks(&chunks))?;
        // SAFETY: sumsq_f32(MultiTensor a, double* partials, u32 part0): `a` is the 2824-byte
        // struct built by `chunks` (layout asserted in the kernel) naming live f32 grads of
        // `n[i]` elements, 256-byte aligned; the grid has exactly block_start[count] blocks, and
        // block b writes partials[part0 + b] < total. Then clip_finalize_f32(const double*
        // partials, u32 nparts, float max_norm, float* out), one block: reads `total` f64
        // written above (same stream), writes out[0..2] (out holds 2 f32, check_clip).
        unsafe {
            self.chunk_sums(
                ("sumsq_f32", "clip_finalize_f32"),
                &chunks,
                &mut partials,
                |c, partials, part0| [KernelArg::Bytes(c.bytes.clone()), partials, part0],
                |partials, nparts| [partials, nparts, KernelArg::F32(max_norm), out.into()],
            )
        }
    }

    fn adamw_step(&self, bufs: AdamWBuffers<'_, '_, CudaBuffer>, cfg: AdamWConfig) -> Result<()> {
        self.adamw_impl(bufs, cfg, None)
    }

    fn schedule_free_step(
        &self,
        bufs: ScheduleFreeBuffers<'_, '_, CudaBuffer>,
        cfg: ScheduleFreeConfig,
        scalars: StepScalars<'_, CudaBuffer>,
    ) -> Result<()> {
        const OP: &str = "schedule_free_step";
        bufs.check(cfg, &scalars)?;
        self.check_owned(OP, &bufs.buffers())?;
        if let StepScalars::Device(b) = scalars {
            self.check_owned(OP, &[b])?;
        }
        let entries = (0..bufs.params.len()).map(|i| Entry {
            ptrs: bufs.row(i).map(|b| b.device_ptr()),
            len: bufs.params[i].len(),
            decay: bufs.weight_decay[i],
        });
        let (vals, sched_ptr) = scalar_args(&scalars, SF_SCHEDULE_LEN);
        let scale_ptr = bufs.grad_scale.map_or(0, |s| s.device_ptr());
        for c in chunks(entries) {
            let mut args = vec![
                KernelArg::Bytes(c.bytes),
                KernelArg::Ptr(scale_ptr),
                KernelArg::F32(cfg.beta2),
                KernelArg::F32(cfg.eps),
            ];
            args.extend(vals.iter().map(|&x| KernelArg::F32(x)));
            args.push(KernelArg::Ptr(sched_ptr));
            // SAFETY: sf_adamw_f32(MultiTensor a, const float* grad_scale, float beta2, eps, lr,
            // ckp1, y_lr, bc2, const float* schedule): `a` names live, distinct (&mut) f32 y, z,
            // v and f32 g buffers of `n[i]` elements each (check_lists), of this backend;
            // grad_scale is null or 2 f32, schedule null or 4 f32 of this backend (checked
            // above); the grid has block_start[count] blocks.
            unsafe { self.launch("sf_adamw_f32", blocks_config(c.blocks), &args) }?;
        }
        Ok(())
    }

    fn lerp_params(
        &self,
        params: &mut [&mut CudaBuffer],
        ends: &[&CudaBuffer],
        weight: f32,
    ) -> Result<()> {
        const OP: &str = "lerp_params";
        let ps = shared(params);
        check_lerp_params(&ps, ends, weight)?;
        self.check_owned(OP, &ps)?;
        self.check_owned(OP, ends)?;
        let entries = ps.iter().zip(ends).map(|(p, e)| Entry {
            ptrs: [p.device_ptr(), e.device_ptr(), 0, 0],
            len: p.len(),
            decay: 0.0,
        });
        for c in chunks(entries) {
            let args = [KernelArg::Bytes(c.bytes), KernelArg::F32(weight)];
            // SAFETY: lerp_f32(MultiTensor a, float w): `a` names live f32 parameter buffers
            // (distinct, &mut) and f32 ends of `n[i]` elements each (check_lists), of this
            // backend; the grid has block_start[count] blocks.
            unsafe { self.launch("lerp_f32", blocks_config(c.blocks), &args) }?;
        }
        Ok(())
    }

    fn prodigy_step(
        &self,
        bufs: ProdigyBuffers<'_, '_, CudaBuffer>,
        cfg: ProdigyConfig,
        lr: StepScalars<'_, CudaBuffer>,
        scalars: &mut CudaBuffer,
    ) -> Result<()> {
        const OP: &str = "prodigy_step";
        bufs.check(cfg, &lr, scalars)?;
        self.check_owned(OP, &bufs.buffers())?;
        if let StepScalars::Device(b) = lr {
            self.check_owned(OP, &[b])?;
        }
        self.check_owned(OP, &[&*scalars])?;
        let entries = (0..bufs.params.len()).map(|i| Entry6 {
            ptrs: bufs.row(i).map(|b| b.device_ptr()),
            len: bufs.params[i].len(),
            decay: bufs.weight_decay[i],
        });
        let chunks = chunks6(entries);
        let (vals, lr_ptr) = scalar_args(&lr, PRODIGY_SCHEDULE_LEN);
        let run = ProdigyRun {
            args: prodigy_args(&cfg),
            scale_ptr: bufs.grad_scale.map_or(0, |s| s.device_ptr()),
            lr: vals[0],
            lr_ptr,
        };
        self.prodigy_accumulate(&chunks, &run, scalars)?;
        for c in &chunks {
            let args = [
                KernelArg::Bytes(c.bytes.clone()),
                KernelArg::Ptr(run.scale_ptr),
                KernelArg::Bytes(run.args.clone()),
                (&*scalars).into(),
            ];
            // SAFETY: prodigy_update_f32(MultiTensor6 a, const float* grad_scale, ProdigyArgs c,
            // const double* sc): `a` names live f32 p (&mut), g, m, v buffers of `n[i]`
            // elements (check_lists) of this backend; grad_scale null or 2 f32; sc the 8 f64 of
            // `scalars` (16 f32 words, check_prodigy_scalars); block_start[count] blocks.
            unsafe { self.launch("prodigy_update_f32", blocks_config(c.blocks), &args) }?;
        }
        Ok(())
    }
}

impl CudaBackend {
    /// A two-pass reduction over multi-tensor chunks: `pass` once per chunk, with the
    /// arguments `pass_args(chunk, partials, part0)` (`part0`: the U32 count of the blocks of
    /// the chunks before, where the chunk's block 0 writes its partial sums), then `finalize`
    /// in one block with `finalize_args(partials, nparts)` (`nparts`: the U32 count of all
    /// blocks, [`total_blocks`]).
    ///
    /// # Safety
    /// The argument lists match the kernels' signatures, and `partials` holds what every
    /// block of `pass` writes, as for [`CudaBackend::launch`].
    pub(super) unsafe fn chunk_sums<A: AsRef<[KernelArg]>, F: AsRef<[KernelArg]>>(
        &self,
        (pass, finalize): (&str, &str),
        chunks: &[Chunk],
        partials: &mut CudaBuffer,
        mut pass_args: impl FnMut(&Chunk, KernelArg, KernelArg) -> A,
        finalize_args: impl FnOnce(KernelArg, KernelArg) -> F,
    ) -> Result<()> {
        let mut part0 = 0u32;
        for c in chunks {
            let args = pass_args(c, (&mut *partials).into(), KernelArg::U32(part0));
            // SAFETY: this function's contract.
            unsafe { self.launch(pass, blocks_config(c.blocks), args.as_ref()) }?;
            part0 += c.blocks;
        }
        let total = total_blocks(chunks);
        let args = finalize_args((&*partials).into(), KernelArg::U32(total as u32));
        // SAFETY: this function's contract; the partial sums were written above, on the same
        // stream.
        unsafe { self.launch(finalize, blocks_config(1), args.as_ref()) }
    }

    fn adamw_impl(
        &self,
        bufs: AdamWBuffers<'_, '_, CudaBuffer>,
        cfg: AdamWConfig,
        schedule: Option<&CudaBuffer>,
    ) -> Result<()> {
        bufs.check(cfg)?;
        let (params, weight_decay, grad_scale) = (&bufs.params, bufs.weight_decay, bufs.grad_scale);
        for i in 0..params.len() {
            self.check_owned("adamw_step", &bufs.row(i))?;
        }
        if let Some(s) = grad_scale {
            self.check_owned("adamw_step", &[s])?;
        }
        let entries = (0..params.len()).map(|i| Entry {
            ptrs: bufs.row(i).map(|b| b.device_ptr()),
            len: params[i].len(),
            decay: match schedule {
                // The kernel forms 1 − lr·wd from the schedule's lr.
                Some(_) => weight_decay[i],
                // In f64 then rounded, as PyTorch's `param.mul_(1 - lr * weight_decay)`.
                None => (1.0 - cfg.lr as f64 * weight_decay[i] as f64) as f32,
            },
        });
        let chunks = chunks(entries);
        let (step_size, bc2_sqrt) = adamw_scalars(cfg);
        let scale_ptr = KernelArg::Ptr(grad_scale.map_or(0, |s| s.device_ptr()));
        let schedule_ptr = KernelArg::Ptr(schedule.map_or(0, |s| s.device_ptr()));
        for c in chunks {
            let blocks = c.blocks;
            let args = [
                KernelArg::Bytes(c.bytes),
                scale_ptr.clone(),
                KernelArg::F32(cfg.beta1),
                KernelArg::F32(cfg.beta2),
                KernelArg::F32(cfg.eps),
                KernelArg::F32(step_size as f32),
                KernelArg::F32(bc2_sqrt as f32),
                schedule_ptr.clone(),
            ];
            // SAFETY: adamw_f32(MultiTensor a, const float* grad_scale, float beta1, beta2,
            // eps, step_size, bc2_sqrt, const float* schedule): `a` names live, distinct (&mut)
            // f32 p, m, v and f32 g buffers of `n[i]` elements each (check_adamw), 256-byte
            // aligned; grad_scale is null or 2 f32 (check_adamw); schedule is null or 3 f32 of
            // this backend; the grid has block_start[count] blocks.
            unsafe { self.launch("adamw_f32", blocks_config(blocks), &args) }?;
        }
        Ok(())
    }
}
