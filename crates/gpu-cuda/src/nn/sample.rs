//! [`SampleOps`] on CUDA: `kernels/nn_sample.cu`. A row is served by a thread-block cluster of
//! [`CLUSTER`] blocks of 1024 threads where the loaded code has clusters (sm_90 machine code
//! from the fatbin), by one block elsewhere. Arguments are checked by the same
//! `gpu_core::nn::sample::check_sample` as on the CPU; the settings are kernel arguments (a
//! captured graph replays them), the draw's position is read from the device (`counter`).

use crate::backend::{CudaBackend, Grouping};
use crate::launch::{KernelArg, LaunchConfig};
use crate::pool::CudaBuffer;
use gpu_core::nn::sample::{check_sample, SampleOps, SampleParams, SampleRows};
use gpu_core::{BufferInfo, DType, GpuError, Result};

/// Blocks of a row on sm_90 (the portable cluster size). Measured on an H200 (Llama-3.2-1B
/// decode, vocabulary 128 256, top-p 0.95): one block a row took 0.8 ms a step.
const CLUSTER: u32 = 8;

impl SampleOps for CudaBackend {
    fn sample_rows(&self, x: SampleRows<'_, CudaBuffer>, p: SampleParams) -> Result<()> {
        const OP: &str = "sample_rows";
        let rows = check_sample(&x, &p)?;
        let (logits, seen, counter, out, vocab) = (x.logits, x.seen, x.counter, x.out, x.vocab);
        self.check_owned(OP, &[logits, seen, counter, out])?;
        if rows == 0 {
            return Ok(());
        }
        let nb = if self.has_cluster_code() { CLUSTER } else { 1 };
        let blocks = u32::try_from(rows)
            .ok()
            .and_then(|r| r.checked_mul(nb))
            .filter(|&b| b <= i32::MAX as u32)
            .ok_or_else(|| GpuError::invalid(OP, format!("{rows} rows exceed the grid")))?;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        let (inv_t, inv_p) = p.reciprocals();
        let args = [
            logits.into(),
            (&*seen).into(),
            counter.into(),
            (&*out).into(),
            KernelArg::U32(vocab as u32),
            KernelArg::U32(nb),
            KernelArg::U32(p.top_k),
            KernelArg::F32(p.temperature),
            KernelArg::F32(inv_t),
            KernelArg::F32(p.penalty),
            KernelArg::F32(inv_p),
            KernelArg::F32(p.top_p),
            KernelArg::U32(p.seed as u32),
            KernelArg::U32((p.seed >> 32) as u32),
            KernelArg::U32(p.offset),
        ];
        let name = match logits.dtype() {
            DType::BF16 => "sample_rows_b",
            _ => "sample_rows_f",
        };
        // SAFETY: sample_rows_X(const T* logits, u32* seen, const u32* counter, u32* out, u32
        // vocab, u32 nb, u32 top_k, float temperature, float inv_t, float penalty, float inv_p,
        // float top_p, u32 seed_lo, u32 seed_hi, u32 offset), nb blocks of 1024 threads per row
        // (grid.x = rows·nb, in clusters of nb when nb > 1, which only sm_90 code loaded from
        // the fatbin runs): logits holds rows·vocab elements of T, seen rows·⌈vocab/32⌉ u32,
        // counter and out rows u32 (check_sample; vocab <= 2^23). Each block reads its row's
        // logits at indices < vocab and its seen words below ⌈vocab/32⌉; one thread of the row
        // writes out[row] and one seen word of its row.
        unsafe {
            if nb > 1 {
                self.launch_grouped(
                    name,
                    cfg,
                    &args,
                    Grouping {
                        cooperative: false,
                        cluster: nb,
                    },
                )
            } else {
                self.launch(name, cfg, &args)
            }
        }
    }
}
