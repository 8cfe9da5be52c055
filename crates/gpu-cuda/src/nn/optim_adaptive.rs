//! Schedule-Free AdamW, the parameter lerp and Prodigy on CUDA (kernels of
//! `kernels/nn_optim.cu`). Schedule-Free AdamW and the lerp use AdamW's `MultiTensor` (64
//! tensors a launch, `super::optim::chunks`); Prodigy's six buffers a tensor take a
//! `MultiTensor6` of 48 tensors a launch, packed here. Prodigy's step is three launches
//! (per 48 tensors for the first and last) on the stream: moments and per-block f64 sums, one
//! block that sums them and updates the f64 scalars on the device, the parameter update. No
//! host transfer, so a CUDA graph can record it.

use super::optim::{blocks_config, chunks, pack, total_blocks, Chunk, Entry, Layout};
use crate::backend::CudaBackend;
use crate::launch::KernelArg;
use crate::pool::CudaBuffer;
use gpu_core::nn::optim_adaptive::{
    check_lerp_params, shared, ProdigyBuffers, ProdigyConfig, ScheduleFreeBuffers,
    ScheduleFreeConfig, StepScalars, PRODIGY_SCHEDULE_LEN, SF_SCHEDULE_LEN,
};
use gpu_core::{Backend, BufferInfo, DType, Result};

/// Tensors per Prodigy launch (`MT6_MAX` in the kernel).
const MT6_MAX: usize = 48;

/// Byte offsets of `struct MultiTensor6` (static_assert'ed in the kernel): six pointer rows
/// (p, g, p0, s, m, v) of [`MT6_MAX`] u64 each from byte 0, then the rest.
mod layout6 {
    pub const N: usize = 2304;
    pub const DECAY: usize = 2496;
    pub const BLOCK_START: usize = 2688;
    pub const COUNT: usize = 2884;
    pub const SIZE: usize = 2888;
}

/// `struct MultiTensor6`: [`MT6_MAX`] tensors of six buffers.
const MULTI_TENSOR6: Layout = Layout {
    max: MT6_MAX,
    n: layout6::N,
    decay: layout6::DECAY,
    block_start: layout6::BLOCK_START,
    count: layout6::COUNT,
    size: layout6::SIZE,
};

/// One Prodigy tensor (or piece): addresses of p, g, p0, s, m, v, its length, its weight decay.
type Entry6 = Entry<6>;

/// Packs the entries into `MultiTensor6` launches of up to [`MT6_MAX`] tensors each.
fn chunks6(entries: impl IntoIterator<Item = Entry6>) -> Vec<Chunk> {
    pack(&MULTI_TENSOR6, entries)
}

/// `struct ProdigyArgs` (32 bytes): the hyper-parameters and the flags
/// (1 decouple, 2 use_bias_correction, 4 safeguard_warmup).
fn prodigy_args(cfg: &ProdigyConfig) -> Vec<u8> {
    let flags = cfg.decouple as u32
        | (cfg.use_bias_correction as u32) << 1
        | (cfg.safeguard_warmup as u32) << 2;
    let floats = [
        cfg.beta1,
        cfg.beta2,
        cfg.beta3,
        cfg.eps,
        cfg.d0,
        cfg.d_coef,
        cfg.growth_rate,
    ];
    let mut b: Vec<u8> = floats.iter().flat_map(|f| f.to_le_bytes()).collect();
    b.extend_from_slice(&flags.to_le_bytes());
    b
}

/// The value and device pointer arguments of a step's scalars: the values (zeros for a device
/// schedule, which the kernel reads instead) and the schedule's pointer (0 for host values).
fn scalar_args(s: &StepScalars<'_, CudaBuffer>, len: usize) -> (Vec<f32>, u64) {
    match s {
        StepScalars::Host(v) => (v.to_vec(), 0),
        StepScalars::Device(b) => (vec![0.0; len], b.device_ptr()),
    }
}

impl CudaBackend {
    /// [`gpu_core::nn::OptimOps::schedule_free_step`] on CUDA.
    pub(super) fn schedule_free_impl(
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

    /// [`gpu_core::nn::OptimOps::lerp_params`] on CUDA.
    pub(super) fn lerp_params_impl(
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

    /// [`gpu_core::nn::OptimOps::prodigy_step`] on CUDA: three launches, no host transfer.
    pub(super) fn prodigy_impl(
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

    /// Prodigy's first two passes: moments and per-block sums, then the scalars' update.
    fn prodigy_accumulate(
        &self,
        chunks: &[Chunk],
        run: &ProdigyRun,
        scalars: &mut CudaBuffer,
    ) -> Result<()> {
        let total = total_blocks(chunks);
        // Two f64 sums per block (four f32 slots); back to the pool on drop. At least one
        // block's worth so that an empty parameter list still gets a valid pointer.
        let mut partials = self.allocate(DType::F32, 4 * total.max(1))?;
        // The first pass only reads the scalars (the finalize, below, writes them).
        let sc = KernelArg::from(&*scalars);
        // SAFETY: prodigy_accum_f32(MultiTensor6 a, const float* grad_scale, ProdigyArgs c,
        // float lr, const float* lr_ptr, const double* sc, double* partials, u32 part0):
        // `a` names live f32 p, g, p0 and distinct (&mut) s, m, v buffers of `n[i]`
        // elements (check_lists) of this backend; lr_ptr null or 1 f32; sc 8 f64; block b
        // writes partials[2(part0 + b)], [+1] < 2·total f64. Then prodigy_finalize(const
        // double* partials, u32 nparts, ProdigyArgs c, float lr, const float* lr_ptr, double*
        // sc), one block: reads the `total` f64 pairs written above (same stream), reads and
        // writes the 8 f64 of `scalars` (16 f32 words).
        unsafe {
            self.chunk_sums(
                ("prodigy_accum_f32", "prodigy_finalize"),
                chunks,
                &mut partials,
                |c, partials, part0| {
                    [
                        KernelArg::Bytes(c.bytes.clone()),
                        KernelArg::Ptr(run.scale_ptr),
                        KernelArg::Bytes(run.args.clone()),
                        KernelArg::F32(run.lr),
                        KernelArg::Ptr(run.lr_ptr),
                        sc.clone(),
                        partials,
                        part0,
                    ]
                },
                |partials, nparts| {
                    [
                        partials,
                        nparts,
                        KernelArg::Bytes(run.args.clone()),
                        KernelArg::F32(run.lr),
                        KernelArg::Ptr(run.lr_ptr),
                        (&mut *scalars).into(),
                    ]
                },
            )
        }
    }
}

/// The launch arguments shared by Prodigy's passes.
struct ProdigyRun {
    args: Vec<u8>,
    scale_ptr: u64,
    lr: f32,
    lr_ptr: u64,
}

#[cfg(test)]
mod tests {
    use super::super::optim::tests::u32_at;
    use super::*;

    #[test]
    fn chunks6_pack_48_tensors_per_launch_with_pointer_rows() {
        let e = |len: usize, k: u64| Entry6 {
            ptrs: [256, 512, 768, 1024, 1280, 1536].map(|p| p * k),
            len,
            decay: 0.25,
        };
        let mut list = vec![e(0, 1), e(4097, 2)];
        list.extend((0..50).map(|i| e(i + 1, 3)));
        let c = chunks6(list);
        assert_eq!(c.len(), 2, "51 non-empty tensors take two launches");
        let b = &c[0].bytes;
        assert_eq!(b.len(), layout6::SIZE);
        assert_eq!(u32_at(b, layout6::COUNT), 48);
        assert_eq!(u32_at(b, layout6::N), 4097);
        // The fourth pointer (s) of tensor 0 sits in row 3.
        let s0 = u64::from_le_bytes(b[8 * 3 * MT6_MAX..8 * 3 * MT6_MAX + 8].try_into().unwrap());
        assert_eq!(s0, 1024 * 2);
        assert_eq!(u32_at(b, layout6::BLOCK_START + 4), 2);
        assert_eq!(c[0].blocks, u32_at(b, layout6::BLOCK_START + 4 * 48));
        assert_eq!(u32_at(&c[1].bytes, layout6::COUNT), 3);
        assert_eq!(
            u32_at(b, layout6::DECAY).to_le_bytes(),
            0.25f32.to_le_bytes()
        );
    }

    #[test]
    fn prodigy_args_are_32_bytes_with_flags_last() {
        let cfg = ProdigyConfig {
            beta3: 0.5,
            safeguard_warmup: true,
            ..ProdigyConfig::DEFAULT
        };
        let b = prodigy_args(&cfg);
        assert_eq!(b.len(), 32);
        assert_eq!(u32_at(&b, 28), 0b101);
        assert_eq!(u32_at(&b, 8), 0.5f32.to_bits());
    }
}
