//! [`QuantOps`] on CUDA: the kernels of `kernels/nn_gemv_q.cu` and `kernels/nn_gemm_q.cu`,
//! checked by the same
//! `gpu_core::nn::quant::check_*` functions as on the CPU.
//!
//! - `m <= 4` (a decode step of up to 4 rows): the fused dequantize-GEMV
//!   `gemv_q{8,4}_m{1,2,4}_v{4,1}_{x}{o}` streams the packed weight once (16-byte loads when a
//!   packed row is a multiple of 16 bytes, else 4-byte ones), dequantizing in registers.
//!   (Variants for 8 and 16 rows of bf16 x were measured on an H200 and removed: a
//!   Llama-3.2-1B shape decoded at batch 16 at 3155 tokens/s in int8 and 2211 in int4 with
//!   them, against 5860 and 6625 with dequantize-then-GEMM each step, and 9471 in bf16.)
//! - 5 ..= [`FUSED_GEMM_MAX_ROWS`] (64) rows of bf16 x (decode at batch 5..64): the **fused
//!   dequantize-GEMM** `gemm_q{8,4}_v{4,1}_b{o}` of `kernels/nn_gemm_q.cu` (tensor cores,
//!   mma.sync m16n8k16 with f32 accumulation): blocks of 64 rows of x × 128 weight rows, the
//!   packed weight tile of each k step of 64 brought in by cp.async (double-buffered),
//!   dequantized in shared memory to the bf16 values the dequantize kernel writes, then
//!   multiplied; no `[n, k]` scratch. A grid of fewer tiles than two a multiprocessor splits k
//!   over `gridDim.y` ([`k_splits`]); `gemm_q_reduce_{f,b}` adds the f32 partials in order.
//! - more rows with bf16 x (prefill), and f32 x: **dequantize-then-GEMM**, as exllama does for
//!   large batches: the weight is dequantized into a scratch `[n, k]` from the pool in x's
//!   dtype, then multiplied by cuBLAS (bf16 x: [`CudaBackend::matmul_bf16`], tensor cores, f32
//!   accumulation; f32 x: SGEMM, into an f32 scratch cast to bf16 when `out` is bf16). The
//!   fused kernel re-dequantizes each weight tile once per 64 rows of x: on an H200, over a
//!   Llama-3.2-1B layer's projections (`gpu-bench --only-qgemm`), it took 0.54–0.61 of
//!   dequantize-then-cuBLAS's time at 8–64 rows in int8 and 0.88–0.95 in int4, 0.95 and 1.6 at
//!   96–128 rows, 2.8 and 5.0 times as long at 2048 rows: hence the split at 64.
//!   `HYBRID_QGEMM=auto|fused|dequant` ([`qgemm_form`], read once a process) forces a form for a
//!   comparison; [`CudaBackend::matmul_quant_with`] takes it as an argument.
//!
//! - f16 weights (`QuantFormat::F16`, the wgpu backend's half-width format) take the HAL's
//!   defaults: correct, but dequantized through the host on every call, so not capturable in a
//!   graph (the engine refuses f16 on CUDA; its half-width type here is bf16).
//!
//! Apart from f16, nothing here synchronizes the host or allocates outside the pool, so a CUDA graph captures
//! these launches (the scratch of prefill comes from the pool, as the decode ops' partials do).
//!
//! # Error against the CPU reference
//!
//! With `u = 2^-24`, for output `(i, j)` let `T = Σ_t |x_it|·(|q_jt|·|s| + |m|)` (the scale
//! and minimum of `t`'s row or group; `m = 0` for int8). The reference is the exact sum of
//! `x·w̃` with `w̃ = fl(fl(q·s) + m)`, `|w̃ − (q·s + m)| <= 2.01·u·(|q·s| + |m|)`, rounded once.
//! - Fused kernel: it sums `x·q` in f32 over a chunk (≤ 32 inputs), applies `s` (and `m·Σx`)
//!   with two fmas per chunk (int8: `s` once, after the warp's sum), and adds chunks and lanes
//!   in f32: each product passes through at most `k + 8` roundings, so `|y − Σ x·(q·s + m)| <=
//!   γ_{k+8}·T`, and `|y − ref_f32| <= (γ_{k+8} + 3.01·u)·T <= 1.02·(k + 11)·u·T` (for
//!   `k < 10^6`). Where `out` is bf16, both sides are rounded once more: add `2^-8·(|ref| + e)`.
//!   `T` is not `Σ|x·w|`: a group far from zero (`|m|` large against `|w|`) loses to
//!   cancellation what the reassociation `s·Σx·q + m·Σx` gains in speed.
//! - Prefill with bf16 x: the weight is rounded to bf16 (`2^-8` relative: bf16 keeps 8
//!   significant bits) and cuBLAS sums in f32 (`(2k + 2)·u`, the bound of
//!   `tests/matmul_bf16.rs`): `1.01·(2^-8 + (2k + 4)·u)·T`. (This said `2^-9` until the fused
//!   kernel's tests exceeded it on an H200 by up to 1.16 times, int8 at k = 8 and 520.) The
//!   fused kernel has the same bound: it multiplies the same bf16 weights (the dequantize
//!   kernel's roundings to the bit) by the same bf16 x on the same tensor cores, and sums the
//!   k products in f32 in another order, which the bound does not depend on (split-k adds
//!   the partial sums of its k ranges in f32: still one f32 sum of the k products).
//! - Prefill with f32 x: exact f32 weights, SGEMM (TF32 when [`CudaBackend::tf32`] is on: then
//!   both operands lose up to `2^-11`): `1.01·(2^-10 + (2k + 4)·u)·T`.
//!
//! Dequantization is exact: the kernel rounds `q·s` and `+ m` separately (`__fmul_rn`,
//! `__fadd_rn`: never contracted into an fma, which would round once and differ from the CPU
//! and from `models::quant`), and bf16 once from that f32.

use super::decode::tag;
use crate::backend::CudaBackend;
use crate::launch::{KernelArg, LaunchConfig};
use crate::pool::CudaBuffer;
use gpu_core::nn::quant::{
    check_dequantize, check_matmul_quant, default_dequantize, default_matmul_quant, QuantFormat,
    QuantOps, QuantSpec,
};
use gpu_core::nn::Primitives;
use gpu_core::{Backend, BufferInfo, DType, MatmulOps, MatmulSpec, Result};

/// Warps per block and weight rows per warp of the fused kernel (`QWARPS`, `QNR`).
const WARPS: usize = 4;
const ROWS_PER_WARP: usize = 2;
/// Weight rows per block of the split-k form (`QSR`), the default.
const SPLIT_ROWS: usize = 4;
/// Rows of x and weight rows a block of the fused dequantize-GEMM (`QG_BM`, `QG_BN`), and its
/// threads (`QG_THREADS`).
const GEMM_ROWS: usize = 64;
const GEMM_COLS: usize = 128;
const GEMM_THREADS: usize = 128;
/// Threads per block and the most blocks of the dequantize kernel (a grid-stride loop).
const DEQ_THREADS: usize = 256;
const DEQ_MAX_BLOCKS: usize = 1 << 16;

/// The grid-stride launch of the dequantize and k-split reduce kernels over `n` items:
/// [`DEQ_THREADS`] threads a block, at most [`DEQ_MAX_BLOCKS`] blocks.
fn deq_grid(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(DEQ_THREADS).min(DEQ_MAX_BLOCKS) as u32, 1, 1),
        block_dim: (DEQ_THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The kernels' bit width (f16 has no kernel here: it never reaches a launch).
fn bits(format: QuantFormat) -> u32 {
    match format {
        QuantFormat::Int8 => 8,
        QuantFormat::Int4 => 4,
        QuantFormat::F16 => 16,
    }
}

/// The weight's kernel arguments: data, scales, mins.
fn weight_args([data, scales, mins]: [&CudaBuffer; 3]) -> [KernelArg; 3] {
    [data.into(), scales.into(), mins.into()]
}

/// Words per 16-byte load (4) when every packed row is a multiple of 16 bytes, else 1.
fn words_per_load(spec: &QuantSpec) -> usize {
    if spec.words_per_row().is_multiple_of(4) {
        4
    } else {
        1
    }
}

/// How [`QuantOps::matmul_quant`] multiplies bf16 x of more than 4 rows (module docs):
/// `Auto` (the default), the fused dequantize-GEMM of `nn_gemm_q.cu` up to
/// [`FUSED_GEMM_MAX_ROWS`] rows and dequantize-then-cuBLAS above; `Fused`, the fused kernel at
/// every size; `Dequant`, the weight dequantized into a pool scratch, then cuBLAS. f32 x always
/// takes `Dequant`'s path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QgemmForm {
    Auto,
    Fused,
    Dequant,
}

/// The most rows of x for which [`QgemmForm::Auto`] takes the fused dequantize-GEMM.
pub const FUSED_GEMM_MAX_ROWS: usize = 64;

/// The form `matmul_quant` uses: `HYBRID_QGEMM=auto|fused|dequant` (read once a process;
/// anything else, or unset, gives `Auto`).
pub fn qgemm_form() -> QgemmForm {
    static FORM: std::sync::OnceLock<QgemmForm> = std::sync::OnceLock::new();
    *FORM.get_or_init(|| match std::env::var("HYBRID_QGEMM").as_deref() {
        Ok("dequant") => QgemmForm::Dequant,
        Ok("fused") => QgemmForm::Fused,
        _ => QgemmForm::Auto,
    })
}

impl QuantOps for CudaBackend {
    fn matmul_quant(
        &self,
        x: &CudaBuffer,
        w: [&CudaBuffer; 3],
        out: &mut CudaBuffer,
        spec: QuantSpec,
    ) -> Result<()> {
        self.matmul_quant_with(qgemm_form(), x, w, out, spec)
    }

    fn dequantize(&self, w: [&CudaBuffer; 3], out: &mut CudaBuffer, spec: QuantSpec) -> Result<()> {
        const OP: &str = "dequantize";
        check_dequantize(w, out, spec)?;
        let [data, scales, mins] = w;
        self.check_owned(OP, &[data, scales, mins, out])?;
        if spec.format == QuantFormat::F16 {
            // No f16 kernel on CUDA (bf16 is its half-width type): the HAL's default.
            return default_dequantize(self, w, out, spec);
        }
        let words = spec.data_len();
        if words == 0 {
            return Ok(());
        }
        let cfg = deq_grid(words);
        let name = format!("dequant_q{}_{}", bits(spec.format), tag(out.dtype()));
        let mut args = weight_args(w).to_vec();
        args.extend([
            (&*out).into(),
            KernelArg::U32(spec.n as u32),
            KernelArg::U32(spec.k as u32),
        ]);
        // SAFETY: dequant_qQ_O(const u32* data, const float* scales, const float* mins, TO*
        // out, u32 n, u32 k), a grid-stride loop over the n·k/(4 or 8) words of data (checked
        // length; n·k < 2^31 by QuantSpec::check, so n and k fit u32). Word (r, c) reads
        // scales/mins at r·groups + c·vpw/128 < n·groups (checked lengths; mins only for
        // int4) and writes out[r·k + c·vpw ..+ vpw] < n·k (out's checked length), with 16- or
        // 8-byte stores at offsets that k % 4 == 0 keeps aligned in 256-byte-aligned buffers.
        unsafe { self.launch(&name, cfg, &args) }
    }
}

impl CudaBackend {
    /// [`QuantOps::matmul_quant`] with the prefill form given rather than read from
    /// `HYBRID_QGEMM` (`form` matters for bf16 x of more than 4 rows only), so that both forms
    /// run in one process.
    /// `w` is the quantized matrix, `[data, scales, mins]`.
    pub fn matmul_quant_with(
        &self,
        form: QgemmForm,
        x: &CudaBuffer,
        w: [&CudaBuffer; 3],
        out: &mut CudaBuffer,
        spec: QuantSpec,
    ) -> Result<()> {
        const OP: &str = "matmul_quant";
        check_matmul_quant(x, w, out, spec)?;
        let [data, scales, mins] = w;
        self.check_owned(OP, &[x, data, scales, mins, out])?;
        if spec.m == 0 || spec.n == 0 {
            return Ok(());
        }
        if spec.format == QuantFormat::F16 {
            // The HAL's default: dequantize (above: through the host) and one cuBLAS SGEMM.
            return default_matmul_quant(self, x, w, out, spec);
        }
        if spec.k == 0 {
            return match out.dtype() {
                DType::F32 => self.memset32(out, 0),
                _ => self.memset16(out, 0),
            };
        }
        let call = QuantIn { x, w, spec };
        match fused_rows(&spec) {
            Some(rows) => self.gemv_quant(call, out, rows),
            None if x.dtype() == DType::BF16 && fused_gemm(form, spec.m) => {
                self.gemm_quant(call, out)
            }
            None => self.prefill_quant(call, out),
        }
    }

    /// The fused dequantize-GEMM for bf16 x; arguments checked, `m, n, k > 0`. A grid of
    /// fewer tiles than two a multiprocessor splits k over `gridDim.y` (f32 partials from the
    /// pool, added in order by `gemm_q_reduce`), so that decoding at batch 5..64 streams the
    /// weight on every multiprocessor.
    fn gemm_quant(&self, QuantIn { x, w, spec }: QuantIn<'_>, out: &mut CudaBuffer) -> Result<()> {
        const OP: &str = "matmul_quant";
        let tiles = spec.m.div_ceil(GEMM_ROWS) * spec.n.div_ceil(GEMM_COLS);
        let (splits, sps) = k_splits(tiles, spec.k, self.info().multiprocessors as usize);
        let part = if splits > 1 {
            Some(self.allocate(DType::F32, splits * spec.m * spec.n)?)
        } else {
            None
        };
        let cfg = LaunchConfig {
            grid_dim: (super::decode::grid(OP, tiles)?, splits as u32, 1),
            block_dim: (GEMM_THREADS as u32, 1, 1),
            shared_mem_bytes: 0, // static: 48 KiB (int8) or 40 KiB (int4)
        };
        let v = words_per_load(&spec);
        let name = format!("gemm_q{}_v{v}_b{}", bits(spec.format), tag(out.dtype()));
        let mut args = vec![x.into()];
        args.extend(weight_args(w));
        args.extend([
            (&*out).into(),
            part.as_ref().map_or(KernelArg::Ptr(0), Into::into),
            KernelArg::U32(spec.m as u32),
            KernelArg::U32(spec.n as u32),
            KernelArg::U32(spec.k as u32),
            KernelArg::U32(sps as u32),
        ]);
        // SAFETY: gemm_qQ_vV_bO(const bf16* x, const u32* data, const float* scales, const
        // float* mins, TO* out, float* part, u32 m, u32 n, u32 k, u32 sps), 128 threads, block
        // (b, y) the x rows m0 = (b % ⌈m/64⌉)·64 .. +63, the weight rows n0 = (b / ⌈m/64⌉)·128
        // .. +127 (the grid's x is exactly ⌈m/64⌉·⌈n/128⌉ blocks, below 2^31 by `grid`) and the
        // k steps y·sps .. min((y+1)·sps, ⌈k/64⌉) (k_splits: no split is empty). m·k, m·n,
        // n·k < 2^31 (QuantSpec::check), so every size fits u32 and k % 4 == 0 (int8) or 8
        // (int4). x holds m·k bf16, data n·k/vpw words, scales n (int8) or n·⌈k/128⌉ f32, mins
        // n·⌈k/128⌉ (int4; never read for int8), out m·n elements of TO (checked lengths), part
        // (gridDim.y > 1 only; else null and unused) splits·m·n f32 from the pool. Reads:
        // x[i·k + c ..+ E] only for i < m and c < k, c a multiple of E (E = 8 elements when
        // V = 4, as then k % 16 == 0 (int8) or k % 32 == 0 (int4); else E = 4, with k % 4 ==
        // 0: every copy lies inside its row and is 16- or 8-byte aligned in a 256-byte-aligned
        // pool buffer); words j·wpr + c ..+ V only for j < n and c < wpr (V = 4 only when
        // wpr % 4 == 0, so the 16-byte copies are aligned and inside the row); scales/mins at
        // j·groups + c/128 (int4) or j (int8) for j < n. Copies out of range pass the buffer's
        // base address with source size 0 (zero-fill, nothing read). Writes out[i·n + j] (one
        // split) or part[y·m·n + i·n + j] for i < m, j < n only (pairs as one 8- or 4-byte
        // store when n is even, then i·n + j is even: aligned). Inputs are shared; out and
        // part are distinct buffers.
        unsafe { self.launch(&name, cfg, &args) }?;
        let Some(part) = part else {
            return Ok(());
        };
        let mn = spec.m * spec.n;
        let reduce = deq_grid(mn);
        let args = [
            (&part).into(),
            (&*out).into(),
            KernelArg::U32(mn as u32),
            KernelArg::U32(splits as u32),
        ];
        let name = format!("gemm_q_reduce_{}", tag(out.dtype()));
        // SAFETY: gemm_q_reduce_O(const float* part, TO* out, u32 mn, u32 splits), a
        // grid-stride loop over e < mn = m·n (< 2^31): reads part[y·mn + e] for y < splits
        // (part holds splits·mn f32, written above on the same stream) and writes out[e] (out
        // holds m·n elements, checked). part is dropped after the launch is queued: whatever
        // reuses its block runs later on the same stream, as for every op's temporaries.
        unsafe { self.launch(&name, reduce, &args) }
    }

    /// The fused kernel for `m <= rows` (1, 2 or 4); arguments checked, `m, n, k > 0`.
    fn gemv_quant(
        &self,
        QuantIn { x, w, spec }: QuantIn<'_>,
        out: &mut CudaBuffer,
        rows: usize,
    ) -> Result<()> {
        let split = crate::blas_bf16::gemv_form() != crate::blas_bf16::GemvForm::Warp;
        let (rows_per_block, form) = if split {
            (SPLIT_ROWS, "qs")
        } else {
            (WARPS * ROWS_PER_WARP, "q")
        };
        let blocks = spec.n.div_ceil(rows_per_block);
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1), // n < 2^31
            block_dim: ((WARPS * 32) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let name = format!(
            "gemv_{form}{}_m{rows}_v{}_{}{}",
            bits(spec.format),
            words_per_load(&spec),
            tag(x.dtype()),
            tag(out.dtype())
        );
        let mut args = vec![x.into()];
        args.extend(weight_args(w));
        args.extend([
            (&*out).into(),
            KernelArg::U32(spec.m as u32),
            KernelArg::U32(spec.n as u32),
            KernelArg::U32(spec.k as u32),
        ]);
        // SAFETY: gemv_q[s]Q_mR_vV_XO(const TX* x, const u32* data, const float* scales, const
        // float* mins, TO* out, u32 m, u32 n, u32 k), 4 warps a block, 2 weight rows a warp
        // (the split form: 4 rows a block, the same accesses per row):
        // m <= R (the template's rows), and m·k, m·n, n·k < 2^31 (QuantSpec::check). x holds
        // m·k elements, data n·k/vpw words, scales and mins n or n·⌈k/128⌉ f32, out m·n
        // (checked lengths). A warp touches rows j < n only: words j·wpr + c·V ..+ V with
        // c < wpr/V (V = 4 only when wpr % 4 == 0, so the 16-byte loads are aligned in
        // 256-byte-aligned pool buffers), x[i·k + c·V·vpw ..+ V·vpw] for i < m (4- or
        // 8-element loads, aligned as k % vpw == 0), scales/mins at j·groups + c·V·vpw/128,
        // and writes out[i·n + j] for i < m. Inputs are shared, out a distinct &mut buffer.
        unsafe { self.launch(&name, cfg, &args) }
    }

    /// Prefill (more rows than the fused kernels take): dequantize into a pool scratch in x's dtype, then cuBLAS.
    fn prefill_quant(
        &self,
        QuantIn { x, w, spec }: QuantIn<'_>,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        let mm = MatmulSpec {
            trans_b: true,
            ..MatmulSpec::new(spec.m, spec.n, spec.k)
        };
        let mut wx = self.allocate(x.dtype(), spec.n * spec.k)?;
        self.dequantize(w, &mut wx, spec)?;
        if x.dtype() == DType::BF16 {
            return self.matmul_bf16(mm, x, &wx, out);
        }
        if out.dtype() == DType::F32 {
            return self.matmul(mm, x, &wx, out);
        }
        let mut wide = self.allocate(DType::F32, out.len())?;
        self.matmul(mm, x, &wx, &mut wide)?;
        self.cast(&wide, out)
        // The scratch buffers are dropped after their last use is queued: whatever reuses
        // their blocks runs later on the same stream, as for every op's temporaries.
    }
}

/// The inputs of a checked [`QuantOps::matmul_quant`] call with `m, n, k > 0`: what
/// [`CudaBackend::matmul_quant_with`] hands to the path it picks (the fused kernel, the fused
/// GEMM or the prefill).
#[derive(Clone, Copy)]
struct QuantIn<'a> {
    x: &'a CudaBuffer,
    /// The quantized matrix, `[data, scales, mins]`.
    w: [&'a CudaBuffer; 3],
    spec: QuantSpec,
}

/// Whether `form` multiplies `m` rows of bf16 x (more than 4) with the fused GEMM.
fn fused_gemm(form: QgemmForm, m: usize) -> bool {
    match form {
        QgemmForm::Auto => m <= FUSED_GEMM_MAX_ROWS,
        QgemmForm::Fused => true,
        QgemmForm::Dequant => false,
    }
}

/// The k split of the fused GEMM over `tiles` output tiles and `k` inputs on `sms`
/// multiprocessors: `(splits, steps per split)`. Splits until about two blocks a multiprocessor
/// (the kernel's registers allow two), keeping at least 4 k steps of 64 a split, and never an
/// empty split (`splits = ⌈steps / sps⌉`).
pub fn k_splits(tiles: usize, k: usize, sms: usize) -> (usize, usize) {
    const MIN_STEPS: usize = 4;
    let steps = k.div_ceil(64).max(1);
    let want = (2 * sms.max(1)).div_ceil(tiles.max(1));
    let most = (steps / MIN_STEPS).max(1);
    let sps = steps.div_ceil(want.clamp(1, most));
    (steps.div_ceil(sps), sps)
}

/// The fused kernel's row count for `spec` (`None`: dequantize-then-GEMM): 1, 2 or 4.
pub fn fused_rows(spec: &QuantSpec) -> Option<usize> {
    [1, 2, 4].into_iter().find(|&r| spec.m <= r)
}

/// The error bound of [`QuantOps::matmul_quant`] on CUDA against the CPU reference stored in
/// f32, for `spec` with x in `x_dtype`, given `T = Σ_t |x_t|·(|q_t·s| + |m|)` (module docs);
/// where the output is bf16, add `2^-8·(|ref| + bound)`.
/// f16 weights take the default at every `m` (f32 SGEMM on widened x): the f32 bound.
pub fn matmul_quant_bound(spec: &QuantSpec, x_dtype: DType, t: f64) -> f64 {
    let (u, k) = (1.0 / (1u64 << 24) as f64, spec.k as f64);
    if spec.format == QuantFormat::F16 {
        1.01 * (1.0 / 1024.0 + (2.0 * k + 4.0) * u) * t
    } else if fused_rows(spec).is_some() {
        1.02 * (k + 11.0) * u * t
    } else if x_dtype == DType::BF16 {
        1.01 * (1.0 / 256.0 + (2.0 * k + 4.0) * u) * t
    } else {
        1.01 * (1.0 / 1024.0 + (2.0 * k + 4.0) * u) * t
    }
}
