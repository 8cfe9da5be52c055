//! Prodigy's pieces on CUDA (kernels of `kernels/nn_optim.cu`): its six buffers a tensor take
//! a `MultiTensor6` of 48 tensors a launch, packed here, and its hyper-parameters a
//! `ProdigyArgs`; the step (in the [`gpu_core::nn::OptimOps`] impl of `super::optim`, beside
//! Schedule-Free AdamW and the lerp, which use AdamW's `MultiTensor`) is three launches (per 48
//! tensors for the first and last) on the stream: moments and per-block f64 sums
//! ([`CudaBackend::prodigy_accumulate`]), one block that sums them and updates the f64 scalars
//! on the device, the parameter update. No host transfer, so a CUDA graph can record it.

use super::multi_tensor::{pack, total_blocks, Chunk, Entry, Layout};
use crate::backend::CudaBackend;
use crate::launch::KernelArg;
use crate::pool::CudaBuffer;
use gpu_core::nn::optim_adaptive::{ProdigyConfig, StepScalars};
use gpu_core::{Backend, DType, Result};

/// Tensors per Prodigy launch (`MT6_MAX` in the kernel).
const MT6_MAX: usize = 48;

/// `struct MultiTensor6`: [`MT6_MAX`] tensors of six buffers (p, g, p0, s, m, v).
const MULTI_TENSOR6: Layout = Layout::of(6, MT6_MAX);

/// One Prodigy tensor (or piece): addresses of p, g, p0, s, m, v, its length, its weight decay.
pub(super) type Entry6 = Entry<6>;

/// Packs the entries into `MultiTensor6` launches of up to [`MT6_MAX`] tensors each.
pub(super) fn chunks6(entries: impl IntoIterator<Item = Entry6>) -> Vec<Chunk> {
    pack(&MULTI_TENSOR6, entries)
}

/// `struct ProdigyArgs` (32 bytes): the hyper-parameters and the flags
/// (1 decouple, 2 use_bias_correction, 4 safeguard_warmup).
pub(super) fn prodigy_args(cfg: &ProdigyConfig) -> Vec<u8> {
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
pub(super) fn scalar_args(s: &StepScalars<'_, CudaBuffer>, len: usize) -> (Vec<f32>, u64) {
    match s {
        StepScalars::Host(v) => (v.to_vec(), 0),
        StepScalars::Device(b) => (vec![0.0; len], b.device_ptr()),
    }
}

impl CudaBackend {
    /// Prodigy's first two passes: moments and per-block sums, then the scalars' update.
    pub(super) fn prodigy_accumulate(
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
pub(super) struct ProdigyRun {
    /// The `ProdigyArgs` bytes ([`prodigy_args`]).
    pub(super) args: Vec<u8>,
    /// The clip coefficient's device pointer (0: none).
    pub(super) scale_ptr: u64,
    /// The learning rate (0 for a device schedule).
    pub(super) lr: f32,
    /// The learning rate's device pointer (0 for a host value).
    pub(super) lr_ptr: u64,
}

#[cfg(test)]
mod tests {
    use super::super::multi_tensor::tests::u32_at;
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
        assert_eq!(b.len(), MULTI_TENSOR6.size);
        assert_eq!(u32_at(b, MULTI_TENSOR6.count), 48);
        assert_eq!(u32_at(b, MULTI_TENSOR6.n), 4097);
        // The fourth pointer (s) of tensor 0 sits in row 3.
        let s0 = u64::from_le_bytes(b[8 * 3 * MT6_MAX..8 * 3 * MT6_MAX + 8].try_into().unwrap());
        assert_eq!(s0, 1024 * 2);
        assert_eq!(u32_at(b, MULTI_TENSOR6.block_start + 4), 2);
        assert_eq!(c[0].blocks, u32_at(b, MULTI_TENSOR6.block_start + 4 * 48));
        assert_eq!(u32_at(&c[1].bytes, MULTI_TENSOR6.count), 3);
        assert_eq!(
            u32_at(b, MULTI_TENSOR6.decay).to_le_bytes(),
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
