//! bf16 causal attention on tensor cores over a fused projection: the kernels of
//! `kernels/nn_attention_bf16.cu` (head dimension 64). Forward: one launch. Backward:
//! `attn_bwd_dq_d64_bf16` (which also writes the per-row `delta = Σ dout ∘ out` into a pooled
//! f32 scratch buffer) then `attn_bwd_dkdv_d64_bf16`. The CPU reference, with the same rounding
//! points, is `gpu_core::cpu::attention_bf16`. With attention dropout (`p > 0`) the `*_drop`
//! twins of the kernels run.

use super::attention::{packed_geom, packed_ptrs, DeviceAttnDropout, Tile};
use crate::backend::CudaBackend;
use crate::pool::CudaBuffer;
use gpu_core::cpu::attention_bf16::packed_bf16_lens;
use gpu_core::nn::attention::{Packed, PackedSaved};
use gpu_core::{BufferInfo, DType, GpuError, Result};

/// Rows of a tile (queries or keys) per block, and threads per block, of every kernel here.
const ROWS: usize = 64;
const THREADS: u32 = 128;

/// Checks the dtype and length of each `(name, buffer, dtype, elements)`.
fn check_bufs(op: &'static str, bufs: &[(&str, &CudaBuffer, DType, usize)]) -> Result<()> {
    for &(name, buf, dtype, want) in bufs {
        if buf.dtype() != dtype {
            return Err(GpuError::DTypeMismatch {
                op,
                expected: dtype,
                got: buf.dtype(),
            });
        }
        gpu_core::ops::check_count(op, name, buf.len(), want)?;
    }
    Ok(())
}

/// Checks the tensors a packed bf16 call and its backward share: `qkv` and `out` bf16, `lse`
/// f32, of the lengths `p` and `scale` give ([`packed_bf16_lens`]); returns the lengths of
/// `qkv` and `out`.
fn check_qkv_out_lse(
    op: &'static str,
    (p, scale): (Packed, f32),
    [qkv, out, lse]: [&CudaBuffer; 3],
) -> Result<(usize, usize)> {
    let (e_qkv, e_out, e_lse) = packed_bf16_lens(op, p, scale)?;
    check_bufs(
        op,
        &[
            ("qkv", qkv, DType::BF16, e_qkv),
            ("out", out, DType::BF16, e_out),
            ("lse", lse, DType::F32, e_lse),
        ],
    )?;
    Ok((e_qkv, e_out))
}

/// `kernel` on a tile of [`ROWS`] rows and [`THREADS`] threads.
fn tile(kernel: &'static str) -> Tile {
    Tile {
        kernel,
        rows: ROWS,
        threads: THREADS,
    }
}

impl CudaBackend {
    /// bf16 causal attention over a fused projection on tensor cores: `qkv` bf16
    /// `[b, t, 3·heads·d]` holds q, k and v as its three column blocks (head `h` at columns
    /// `h·d..(h+1)·d` of each); `out` bf16 `[b, t, heads·d]` and `lse` f32 `[b·heads, t]`
    /// (natural log) are written. f32 accumulation and softmax; the probabilities are rounded to
    /// bf16 for P·V and the output once (reference: `gpu_core::cpu::attention_bf16`). Head
    /// dimension `d = 64` only (other values are a typed error); any `b`, `t`, `heads >= 1`.
    /// `drop`: dropout of the attention probabilities, as the f32 kernels'.
    pub fn causal_attention_packed_bf16_fwd(
        &self,
        qkv: &CudaBuffer,
        out: &mut CudaBuffer,
        lse: &mut CudaBuffer,
        p: Packed,
        scale: f32,
        drop: Option<DeviceAttnDropout<'_>>,
    ) -> Result<()> {
        const OP: &str = "causal_attention_packed_bf16_fwd";
        check_qkv_out_lse(OP, (p, scale), [qkv, &*out, &*lse])?;
        self.check_owned(OP, &[qkv, &*out, &*lse])?;
        let drop = self.attn_drop_args(OP, drop)?;
        if p.n() == 0 || p.t == 0 {
            return Ok(());
        }
        let (qkv, g) = (packed_ptrs(qkv, 2 * p.c()), packed_geom(p, scale));
        let fwd = (OP, tile("attn_fwd_d64_bf16"));
        // SAFETY: attn_fwd_d64_bf16(const bf16* q, k, v, bf16* out, float* lse, u32 n, u32 t,
        // u32 d, u32 heads, u32 ld_in, u32 ld_out, float scale) over n·ceil(t/64) blocks of 128
        // threads. q, k, v point at column offsets 0, c, 2c of qkv, which holds b·t rows of
        // 3c = ld_in bf16; out holds b·t rows of c = ld_out bf16 and lse n·t f32 (checked
        // above); d = 64, so every row base the kernel forms is 16-byte aligned (256-byte
        // aligned pool bases, strides multiples of 64 elements); static shared memory only
        // (40 KiB). out and lse are distinct (&mut) and written only. The `_drop` twin takes
        // (float p, u64 seed, const u64* offset) after them: p in (0, 1), offset null or an
        // 8-byte aligned u64 of this backend (attn_drop_args).
        unsafe { self.attention_fwd_launch(fwd, qkv, (out, lse), g, drop) }
    }

    /// The backward of [`CudaBackend::causal_attention_packed_bf16_fwd`]: `dqkv` (bf16, the
    /// layout of `qkv`) gets dq, dk and dv in its three column blocks, from `out`, `lse` and
    /// `dout` bf16 `[b, t, heads·d]`. f32 accumulation; P and dS are rounded to bf16 as operands
    /// of the tensor-core products, each gradient once at its store.
    pub fn causal_attention_packed_bf16_bwd(
        &self,
        qkv: &CudaBuffer,
        saved: PackedSaved<'_, CudaBuffer>,
        dqkv: &mut CudaBuffer,
        p: Packed,
        scale: f32,
        drop: Option<DeviceAttnDropout<'_>>,
    ) -> Result<()> {
        const OP: &str = "causal_attention_packed_bf16_bwd";
        let PackedSaved { out, lse, dout } = saved;
        let (e_qkv, e_out) = check_qkv_out_lse(OP, (p, scale), [qkv, out, lse])?;
        check_bufs(
            OP,
            &[
                ("dout", dout, DType::BF16, e_out),
                ("dqkv", &*dqkv, DType::BF16, e_qkv),
            ],
        )?;
        self.check_owned(OP, &[qkv, out, lse, dout, &*dqkv])?;
        let drop = self.attn_drop_args(OP, drop)?;
        if p.n() == 0 || p.t == 0 {
            return Ok(());
        }
        let (qkv, grads) = (packed_ptrs(qkv, 2 * p.c()), packed_ptrs(dqkv, 2 * p.c()));
        let tiles = (tile("attn_bwd_dq_d64_bf16"), tile("attn_bwd_dkdv_d64_bf16"));
        let g = packed_geom(p, scale);
        // SAFETY: attn_bwd_dq_d64_bf16(const bf16* q, k, v, out, const float* lse,
        // const bf16* dout, bf16* dq, float* delta, u32 n, u32 t, u32 d, u32 heads, u32 ld_in,
        // u32 ld_out, float scale) over n·ceil(t/64) blocks of 128 threads. q, k, v and dq point
        // at the column blocks of qkv and dqkv (b·t rows of 3c = ld_in bf16 each), out and dout
        // hold b·t rows of c = ld_out bf16, lse n·t f32 (checked above), delta n·t f32
        // (allocated by attention_bwd_launch); 16-byte aligned rows as in the forward; 48 KiB of static shared
        // memory. dqkv is distinct from every input (&mut) and written only. The `_drop` twin's
        // trailing arguments as the forward's. Then attn_bwd_dkdv_d64_bf16(const bf16* q, k,
        // v, const float* lse, const bf16* dout, const float* delta, bf16* dk, bf16* dv, u32 n,
        // u32 t, u32 d, u32 heads, u32 ld_in, u32 ld_out, float scale); the same buffers and
        // grid; delta was written by the dq kernel queued before it on the same stream; dk and
        // dv are the other two column blocks of dqkv (disjoint from dq); the `_drop` twin as
        // above.
        unsafe { self.attention_bwd_launch((OP, tiles), qkv, saved, grads, g, drop) }
    }
}
