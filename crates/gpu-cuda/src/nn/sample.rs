//! [`SampleOps`] on CUDA: `kernels/nn_sample.cu`, one block of 1024 threads per row. Arguments
//! are checked by the same `gpu_core::nn::sample::check_sample` as on the CPU; the settings are
//! kernel arguments (a captured graph replays them), the draw's position is read from the
//! device (`counter`).

use crate::backend::CudaBackend;
use crate::launch::{KernelArg, LaunchConfig};
use crate::pool::CudaBuffer;
use gpu_core::nn::sample::{check_sample, SampleOps, SampleParams};
use gpu_core::{BufferInfo, DType, GpuError, Result};

impl SampleOps for CudaBackend {
    fn sample_rows(
        &self,
        logits: &CudaBuffer,
        seen: &mut CudaBuffer,
        counter: &CudaBuffer,
        out: &mut CudaBuffer,
        vocab: usize,
        p: SampleParams,
    ) -> Result<()> {
        const OP: &str = "sample_rows";
        let rows = check_sample(logits, seen, counter, out, vocab, &p)?;
        self.check_owned(OP, &[logits, seen, counter, out])?;
        if rows == 0 {
            return Ok(());
        }
        let blocks = u32::try_from(rows)
            .ok()
            .filter(|&b| b <= i32::MAX as u32)
            .ok_or_else(|| GpuError::invalid(OP, format!("{rows} rows exceed 2^31-1")))?;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        let args = [
            logits.into(),
            (&*seen).into(),
            counter.into(),
            (&*out).into(),
            KernelArg::U32(vocab as u32),
            KernelArg::U32(p.top_k),
            KernelArg::F32(p.temperature),
            KernelArg::F32(p.top_p),
            KernelArg::F32(p.penalty),
            KernelArg::U32(p.seed as u32),
            KernelArg::U32((p.seed >> 32) as u32),
            KernelArg::U32(p.offset),
        ];
        let name = match logits.dtype() {
            DType::BF16 => "sample_rows_b",
            _ => "sample_rows_f",
        };
        // SAFETY: sample_rows_X(const T* logits, u32* seen, const u32* counter, u32* out, u32
        // vocab, u32 top_k, float temperature, float top_p, float penalty, u32 seed_lo, u32
        // seed_hi, u32 offset), one block of 1024 threads per row: logits holds rows·vocab
        // elements of T, seen rows·⌈vocab/32⌉ u32, counter and out rows u32 (check_sample;
        // vocab <= 2^23). Each block reads its row's logits at indices < vocab and its seen words
        // below ⌈vocab/32⌉, and writes out[row] and one seen word of its row.
        unsafe { self.launch(name, cfg, &args) }
    }
}
