//! [`OptimOps`] on CUDA: the multi-tensor kernels of `kernels/nn_optim.cu`.
//!
//! Tensors are described to the kernels by a `MultiTensor` struct passed by value
//! ([`KernelArg::Bytes`], so these launches take the raw driver path): up to 64 tensors per
//! launch with their pointers, lengths and AdamW decay factors, and the prefix sums of their
//! block counts, from which each block finds its tensor and chunk. Empty tensors are left out;
//! tensors longer than 2^30 elements are split into pieces. Schedule-Free AdamW and the lerp
//! use the same struct; Prodigy's `MultiTensor6` and its passes are in `super::optim_adaptive`.

use super::optim_adaptive::{chunks6, prodigy_args, scalar_args, Entry6, ProdigyRun};
use crate::backend::CudaBackend;
use crate::launch::{KernelArg, LaunchConfig};
use crate::pool::CudaBuffer;
use gpu_core::nn::optim::{
    adamw_scalars, check_clip, AdamWBuffers, AdamWConfig, OptimOps, ProdigyBuffers, ProdigyConfig,
    ScheduleFreeBuffers, ScheduleFreeConfig, StepScalars,
};
use gpu_core::nn::optim_adaptive::{
    check_lerp_params, shared, PRODIGY_SCHEDULE_LEN, SF_SCHEDULE_LEN,
};
use gpu_core::{Backend, BufferInfo, DType, GpuError, Result};

/// Tensors per launch (`MT_MAX` in the kernel).
const MT_MAX: usize = 64;
/// Elements per block (`MT_CHUNK`).
pub(super) const MT_CHUNK: usize = 4096;
/// Threads per block (`MT_THREADS`).
pub(super) const MT_THREADS: u32 = 256;
/// Longest piece of a tensor in one entry: a multiple of `MT_CHUNK`, so pieces stay 16-byte
/// aligned, and small enough for the kernel's 32-bit lengths and block counts.
pub(super) const PIECE: usize = 1 << 30;

/// One tensor (or piece of one): the device addresses of its `K` buffers (p, g, m, v for
/// `MultiTensor`; 0 where unused), its length and its AdamW decay factor `1 − lr·wd`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Entry<const K: usize = 4> {
    pub(super) ptrs: [u64; K],
    pub(super) len: usize,
    pub(super) decay: f32,
}

impl<const K: usize> Entry<K> {
    /// The entry split into pieces of at most [`PIECE`] elements (none when empty).
    fn pieces(self) -> impl Iterator<Item = Entry<K>> {
        (0..self.len).step_by(PIECE).map(move |off| Entry {
            ptrs: self
                .ptrs
                .map(|p| if p == 0 { 0 } else { p + 4 * off as u64 }),
            len: PIECE.min(self.len - off),
            decay: self.decay,
        })
    }
}

/// One launch's multi-tensor struct bytes and its block count.
pub(super) struct Chunk {
    pub(super) bytes: Vec<u8>,
    pub(super) blocks: u32,
}

/// Where a multi-tensor struct keeps its fields: from byte 0 a row of `max` u64 pointers per
/// buffer of an entry (buffer k of tensor i at `8·(k·max + i)`), then the byte offsets of the
/// u32 lengths, the f32 decays, the `max + 1` u32 block starts and the u32 count; `size` bytes.
pub(super) struct Layout {
    pub(super) max: usize,
    pub(super) n: usize,
    pub(super) decay: usize,
    pub(super) block_start: usize,
    pub(super) count: usize,
    pub(super) size: usize,
}

impl Layout {
    /// The layout of a struct of `buffers` pointer rows of `max` u64 each from byte 0, then
    /// `u32 n[max]`, `float decay[max]`, `u32 block_start[max + 1]` and `u32 count`, its size
    /// rounded up to the pointers' 8-byte alignment (as the kernels declare and
    /// static_assert them).
    pub(super) const fn of(buffers: usize, max: usize) -> Layout {
        let n = 8 * buffers * max;
        let decay = n + 4 * max;
        let block_start = decay + 4 * max;
        let count = block_start + 4 * (max + 1);
        Layout {
            max,
            n,
            decay,
            block_start,
            count,
            size: (count + 4).next_multiple_of(8),
        }
    }
}

/// `struct MultiTensor`: [`MT_MAX`] tensors of four buffers (p, g, m, v).
const MULTI_TENSOR: Layout = Layout::of(4, MT_MAX);

fn put(bytes: &mut [u8], at: usize, v: &[u8]) {
    bytes[at..at + v.len()].copy_from_slice(v);
}

/// Packs the entries into launches of up to `at.max` tensors each, laid out as `at` says.
pub(super) fn pack<const K: usize>(
    at: &Layout,
    entries: impl IntoIterator<Item = Entry<K>>,
) -> Vec<Chunk> {
    let pieces: Vec<Entry<K>> = entries.into_iter().flat_map(Entry::pieces).collect();
    pieces
        .chunks(at.max)
        .map(|group| {
            let mut bytes = vec![0u8; at.size];
            let mut blocks = 0u32;
            for (i, e) in group.iter().enumerate() {
                for (k, ptr) in e.ptrs.iter().enumerate() {
                    put(&mut bytes, 8 * (k * at.max + i), &ptr.to_le_bytes());
                }
                put(&mut bytes, at.n + 4 * i, &(e.len as u32).to_le_bytes());
                put(&mut bytes, at.decay + 4 * i, &e.decay.to_le_bytes());
                put(&mut bytes, at.block_start + 4 * i, &blocks.to_le_bytes());
                // At most 64 (MT_MAX) pieces of 2^18 blocks: far below 2^31.
                blocks += e.len.div_ceil(MT_CHUNK) as u32;
            }
            let end = at.block_start + 4 * group.len();
            put(&mut bytes, end, &blocks.to_le_bytes());
            put(&mut bytes, at.count, &(group.len() as u32).to_le_bytes());
            Chunk { bytes, blocks }
        })
        .collect()
}

/// Packs the entries into `MultiTensor` launches of up to [`MT_MAX`] tensors each.
pub(super) fn chunks(entries: impl IntoIterator<Item = Entry>) -> Vec<Chunk> {
    pack(&MULTI_TENSOR, entries)
}

/// The blocks of all the chunks' launches.
pub(super) fn total_blocks(chunks: &[Chunk]) -> usize {
    chunks.iter().map(|c| c.blocks as usize).sum()
}

pub(super) fn blocks_config(blocks: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (MT_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

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

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// The little-endian u32 at byte `at` of a packed struct.
    pub(in crate::nn) fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }

    /// The offsets `Layout::of` computes are the ones `kernels/nn_optim.cu` static_asserts
    /// for `MultiTensor` and `MultiTensor6` (n, decay, block_start, count, size).
    #[test]
    fn layouts_match_the_kernels_structs() {
        let fields = |l: &Layout| [l.n, l.decay, l.block_start, l.count, l.size];
        assert_eq!(fields(&MULTI_TENSOR), [2048, 2304, 2560, 2820, 2824]);
        let six = Layout::of(6, 48);
        assert_eq!(fields(&six), [2304, 2496, 2688, 2884, 2888]);
    }

    #[test]
    fn chunks_pack_64_tensors_per_launch_and_skip_empty_ones() {
        let e = |len: usize| Entry {
            ptrs: [256, 512, 768, 1024],
            len,
            decay: 0.5,
        };
        let mut list = vec![e(0), e(1), e(4096), e(4097)];
        list.extend((0..70).map(|i| e(i + 1)));
        let c = chunks(list);
        assert_eq!(c.len(), 2, "73 non-empty tensors take two launches");
        let b = &c[0].bytes;
        assert_eq!(b.len(), MULTI_TENSOR.size);
        assert_eq!(u32_at(b, MULTI_TENSOR.count), 64);
        assert_eq!(u32_at(b, MULTI_TENSOR.n), 1);
        assert_eq!(u32_at(b, MULTI_TENSOR.n + 4), 4096);
        assert_eq!(u32_at(b, MULTI_TENSOR.n + 8), 4097);
        // Block starts: 0, 1, 2, then 4 (the 4097-element tensor takes two blocks).
        let starts: Vec<u32> = (0..5)
            .map(|i| u32_at(b, MULTI_TENSOR.block_start + 4 * i))
            .collect();
        assert_eq!(starts, vec![0, 1, 2, 4, 5]);
        assert_eq!(c[0].blocks, u32_at(b, MULTI_TENSOR.block_start + 4 * 64));
        assert_eq!(u32_at(&c[1].bytes, MULTI_TENSOR.count), 9);
        assert_eq!(c[1].blocks, 9);
    }

    #[test]
    fn long_tensors_split_into_aligned_pieces() {
        let e = Entry {
            ptrs: [1 << 20, 0, 0, 0],
            len: 2 * PIECE + 5,
            decay: 1.0,
        };
        let p: Vec<Entry> = e.pieces().collect();
        assert_eq!(p.len(), 3);
        assert_eq!(p[1].ptrs, [(1 << 20) + 4 * PIECE as u64, 0, 0, 0]);
        assert_eq!(p[2].len, 5);
        assert!(p.iter().all(|x| x.ptrs[0] % 16 == 0));
    }
}
