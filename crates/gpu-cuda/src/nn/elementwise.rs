//! [`ElementwiseOps`] on CUDA: the kernels of `kernels/nn_elementwise.cu` and
//! `kernels/nn_reduce.cu` (f32), and their bf16 instances in `kernels/nn_bf16.cu`. Arguments are checked by the same `gpu_core::nn::elementwise`
//! helpers as the CPU reference, so both backends reject exactly the same inputs.

mod family;
mod plan;
mod reduce;

use crate::backend::CudaBackend;
use crate::launch::{KernelArg, LaunchConfig};
use crate::pool::CudaBuffer;
use gpu_core::nn::elementwise::{
    check_broadcast, check_cast, check_copy_blocks, check_dropout, check_permute, Activation,
    BinaryKind, ElementwiseOps, Primitives, ReduceKind,
};
use gpu_core::nn::{BlockCopy, Direction, IdRows};
use gpu_core::ops::check_float_elementwise;
use gpu_core::{BufferInfo, DType, Result};
use plan::BinaryPath;
#[cfg(test)]
use {
    plan::ReduceLoads,
    reduce::{reduce_cluster_kernel, reduce_kernel},
};

/// Threads per block of the streaming kernels.
const BLOCK: u32 = 256;
/// The most blocks per multiprocessor a grid-stride launch gets (see `stride_grid`).
const BLOCKS_PER_SM: usize = 128;
/// The same for GELU (erfc: several times the arithmetic per byte of the other activations),
/// which keeps the grid it had before the cap was raised: 128 blocks per SM measured 5% slower
/// in `gpu-bench` (94.3 against 90.5 µs at 8192 × 4096, H200).
const GELU_BLOCKS_PER_SM: usize = 16;

/// The grid cap of the per-unit permute, whose threads first build a magic-number divider for
/// each of up to 6 dims (a 64-bit division each): at 128 blocks a multiprocessor each thread
/// moved ~2 units after that setup. Same-process A/B on an H200, bf16 [1024, 256, 4, 64] →
/// [1024, 4, 256, 64] in 16-byte units, two units a step: 134.2 µs at 128 blocks per SM, 77.1
/// at 16, 80.9 at 8, 80.4 at 4; four units a step (`PERMUTE_UNITS`): 75.3 µs at 32, 77.3 at
/// 16 (PyTorch's copy_ of the same bytes 65.9–69.6 µs; docs/benchmarks.md).
const PERMUTE_BLOCKS_PER_SM: usize = 32;
/// Whether 16-byte bf16 permutes walk their input (`permute8s_b16`) rather than their output:
/// 73.0–73.1 against 73.9–74.1 µs on the 8192² case above (H200, same call, three rounds).
const PERMUTE_SCATTER: bool = true;

/// The grid cap (blocks per multiprocessor) of the unary bf16 streams (casts from bf16,
/// activations, affine, dropout), whose threads loop over two 4-element vectors a step with the
/// next step's loads in flight (`stream2` in `kernels/nn_elementwise.cuh`). Same-process A/B
/// on an H100 at 8192 × 4096 (`scripts/kernel_ab.py`, `docs/benchmarks.md`), caps of 16, 32,
/// 64 and 128: 32 was the fastest for GELU forward and dropout and within 3% of the fastest
/// for the others.
const BF16_STREAM_BLOCKS_PER_SM: usize = 32;

/// The grid cap (blocks per multiprocessor) of an activation kernel.
fn activation_cap(op: Activation) -> usize {
    if op == Activation::Gelu {
        GELU_BLOCKS_PER_SM
    } else {
        BLOCKS_PER_SM
    }
}

/// The binary kernel of `op` for a broadcast `path` (`same`, `2d` or `nd`) on `dtype` data.
fn binary_kernel(path: &str, op: BinaryKind, dtype: DType) -> String {
    format!("binary_{path}_{}_{dtype}", op.name())
}

/// The suffix of a data-movement kernel: `f32`, or `b16` for any 2-byte element (bit copies).
fn move_suffix(dtype: DType) -> &'static str {
    if dtype.size_in_bytes() == 2 {
        "b16"
    } else {
        "f32"
    }
}

/// Every kernel name this family derives from the op vocabulary (activations × direction,
/// binary ops × broadcast path, reductions × layout): each must exist in the embedded modules,
/// which a test checks without a GPU.
#[cfg(test)]
fn vocabulary_kernels() -> Vec<String> {
    let mut v = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        for &op in Activation::ALL {
            v.push(op.kernel_for(Direction::Forward, dtype));
            v.push(op.kernel_for(Direction::Backward, dtype));
        }
        for op in BinaryKind::ALL {
            for path in ["same", "2d", "nd"] {
                v.push(binary_kernel(path, op, dtype));
            }
        }
        for kind in ["sum", "max"] {
            for loads in [ReduceLoads::Scalar, ReduceLoads::Rows, ReduceLoads::Cols] {
                v.push(reduce_kernel(kind, loads, dtype, dtype));
                v.push(reduce_kernel(kind, loads, dtype, DType::F32));
                v.push(reduce_kernel(kind, loads, DType::F32, dtype));
            }
            for (from, to) in [(dtype, dtype), (dtype, DType::F32), (DType::F32, dtype)] {
                v.push(reduce_cluster_kernel(kind, from, to));
            }
        }
        for k in ["affine", "dropout", "max_axis_bwd"] {
            v.push(format!("{k}_{dtype}"));
        }
        let m = move_suffix(dtype);
        for k in [
            "copy_blocks",
            "copy_blocks4",
            "permute",
            "permute4",
            "permute_tile",
        ] {
            v.push(format!("{k}_{m}"));
        }
    }
    v.extend([
        "cast_f32_bf16".to_string(),
        "cast_bf16_f32".to_string(),
        "permute8_b16".to_string(),
        "permute8s_b16".to_string(),
    ]);
    v
}

fn u64_arg(v: usize) -> KernelArg {
    KernelArg::U64(v as u64)
}

/// Six dims as kernel arguments, padded with 1.
fn dim_args(dims: &[usize]) -> impl Iterator<Item = KernelArg> + '_ {
    (0..6).map(|k| u64_arg(dims.get(k).copied().unwrap_or(1)))
}

impl CudaBackend {
    fn sms(&self) -> usize {
        self.info().multiprocessors.max(1) as usize
    }

    /// A 1-D grid of [`BLOCK`]-thread blocks for a grid-stride loop over `threads` work units:
    /// one unit per thread up to [`BLOCKS_PER_SM`] blocks per multiprocessor, the block
    /// scheduler balancing them. Timed in one process on an H200 at 8192 × 4096 (PyTorch's
    /// kernels beside): at most 16 blocks per multiprocessor (each thread looping over ~15
    /// float4s) was 4–8% slower than 128, and 2–7% slower than PyTorch; an uncapped grid was as
    /// fast as 128 except for GELU (erfc, more arithmetic per byte), 10% slower.
    pub(crate) fn stride_grid(&self, threads: usize) -> LaunchConfig {
        self.stride_grid_capped(threads, BLOCKS_PER_SM)
    }

    /// The grid of a unary stream over `n` elements whose input is `dtype`: f32 kernels take a
    /// float4 a thread up to `f32_cap` blocks per multiprocessor, bf16 ones two 4-element
    /// vectors a step up to [`BF16_STREAM_BLOCKS_PER_SM`].
    fn unary_grid(&self, n: usize, dtype: DType, f32_cap: usize) -> LaunchConfig {
        if dtype == DType::BF16 {
            self.stride_grid_capped(n.div_ceil(8), BF16_STREAM_BLOCKS_PER_SM)
        } else {
            self.stride_grid_capped(n.div_ceil(4), f32_cap)
        }
    }

    /// A streaming kernel over `n` elements, nothing when `n = 0`: `kernel(ptrs..., u64 n,
    /// scalars...)` on [`CudaBackend::unary_grid`] for `dtype` (at most `f32_cap` blocks per
    /// multiprocessor for f32).
    ///
    /// # Safety
    /// `kernel` has that signature and `ptrs` hold what it reads and writes for `n` elements
    /// (the caller's SAFETY comment).
    unsafe fn launch_streaming(
        &self,
        kernel: &str,
        (ptrs, n, scalars): (&[KernelArg], usize, &[KernelArg]),
        (dtype, f32_cap): (DType, usize),
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let args = [ptrs, &[u64_arg(n)], scalars].concat();
        let grid = self.unary_grid(n, dtype, f32_cap);
        // SAFETY: this function's contract.
        unsafe { self.launch(kernel, grid, &args) }
    }

    /// [`CudaBackend::stride_grid`] with at most `per_sm` blocks per multiprocessor.
    pub(crate) fn stride_grid_capped(&self, threads: usize, per_sm: usize) -> LaunchConfig {
        let blocks = threads
            .div_ceil(BLOCK as usize)
            .clamp(1, self.sms() * per_sm) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

impl Primitives for CudaBackend {
    fn fill(&self, buf: &mut CudaBuffer, value: f32) -> Result<()> {
        // The same bit patterns as the CPU's fill: a driver memset of the element's bits.
        match buf.dtype() {
            DType::F32 => self.memset32(buf, value.to_bits()),
            DType::U32 => self.memset32(buf, value as u32),
            DType::F16 => self.memset16(buf, half::f16::from_f32(value).to_bits()),
            DType::BF16 => self.memset16(buf, half::bf16::from_f32(value).to_bits()),
        }
    }

    fn broadcast_binary(
        &self,
        op: BinaryKind,
        a: &CudaBuffer,
        a_shape: &[usize],
        b: &CudaBuffer,
        b_shape: &[usize],
        out: &mut CudaBuffer,
    ) -> Result<()> {
        let shape = check_broadcast(a, a_shape, b, b_shape, out)?;
        let dt = out.dtype();
        let n = out.len();
        if n == 0 {
            return Ok(());
        }
        match plan::binary_path(a_shape, b_shape, &shape) {
            BinaryPath::Same => {
                let args = [a.into(), b.into(), out.into(), u64_arg(n)];
                // SAFETY: binary_same_{op}_{T}(const T* a, const T* b, T* out, u64 n), T the
                // buffers' one dtype (f32 or bf16); without broadcasting a, b and out all hold
                // n elements, 256-byte aligned.
                unsafe {
                    self.launch(
                        &binary_kernel("same", op, dt),
                        self.stride_grid(n.div_ceil(4)),
                        &args,
                    )
                }
            }
            BinaryPath::TwoD {
                cols,
                mode,
                small_is_a,
            } => {
                let (big, small) = if small_is_a { (b, a) } else { (a, b) };
                let units = if cols.is_multiple_of(4) { n / 4 } else { n };
                let args = [
                    big.into(),
                    small.into(),
                    out.into(),
                    u64_arg(n),
                    u64_arg(cols),
                    KernelArg::U32(mode),
                    KernelArg::U32(small_is_a as u32),
                ];
                // SAFETY: binary_2d_{op}_{T}(const T* big, const T* small, T* out, u64 n,
                // u64 cols, u32 mode, u32 small_is_a), T f32 or bf16; big and out hold
                // n = rows·cols elements, small holds cols (mode 0) or rows (mode 1), as the
                // collapsed shapes say.
                let kernel = binary_kernel("2d", op, dt);
                unsafe { self.launch(&kernel, self.stride_grid(units), &args) }
            }
            BinaryPath::Nd {
                dims_rev,
                amask,
                bmask,
            } => {
                let mut args = vec![
                    a.into(),
                    b.into(),
                    out.into(),
                    u64_arg(n),
                    KernelArg::U32(dims_rev.len() as u32),
                ];
                args.extend(dim_args(&dims_rev));
                args.extend([KernelArg::U32(amask), KernelArg::U32(bmask)]);
                // SAFETY: binary_nd_{op}_{T}(const T* a, const T* b, T* out, u64 n, u32 rank,
                // u64 d0..d5, u32 amask, u32 bmask), T f32 or bf16; rank <= 6 collapsed dims
                // whose product is n; a and b hold the product of the dims their masks select,
                // so every offset the kernel forms is in bounds.
                unsafe { self.launch(&binary_kernel("nd", op, dt), self.stride_grid(n), &args) }
            }
        }
    }

    fn activation_fwd(&self, op: Activation, x: &CudaBuffer, out: &mut CudaBuffer) -> Result<()> {
        let dt = check_float_elementwise("activation_fwd", &[x], out)?;
        let n = out.len();
        let ptrs: [KernelArg; 2] = [x.into(), out.into()];
        let kernel = op.kernel_for(Direction::Forward, dt);
        // SAFETY: act_fwd_{op}_{T}(const T* x, T* out, u64 n), T f32 or bf16; both hold n
        // elements, 256-byte aligned for the 4-wide accesses.
        unsafe { self.launch_streaming(&kernel, (&ptrs, n, &[]), (dt, activation_cap(op))) }
    }

    fn activation_bwd(
        &self,
        op: Activation,
        x: &CudaBuffer,
        y: &CudaBuffer,
        dy: &CudaBuffer,
        dx: &mut CudaBuffer,
    ) -> Result<()> {
        let dt = check_float_elementwise("activation_bwd", &[x, y, dy], dx)?;
        let n = dx.len();
        let ptrs: [KernelArg; 4] = [x.into(), y.into(), dy.into(), dx.into()];
        let kernel = op.kernel_for(Direction::Backward, dt);
        // SAFETY: act_bwd_{op}_{T}(const T* x, const T* y, const T* dy, T* dx, u64 n), T f32
        // or bf16; all four hold n elements, 256-byte aligned.
        unsafe { self.launch_streaming(&kernel, (&ptrs, n, &[]), (dt, activation_cap(op))) }
    }

    fn reduce_axis(
        &self,
        op: ReduceKind,
        x: &CudaBuffer,
        outer: usize,
        n: usize,
        inner: usize,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        self.reduce_axis_impl(op, (x, out), [outer, n, inner])
    }

    fn copy_blocks(&self, src: &CudaBuffer, dst: &mut CudaBuffer, copy: BlockCopy) -> Result<()> {
        check_copy_blocks(src, dst, copy)?;
        let (src_offset, dst_offset, outer, len) =
            (copy.src_offset, copy.dst_offset, copy.outer, copy.len);
        if outer == 0 || len == 0 {
            return Ok(());
        }
        // One block has no stride; float4 when every offset, stride and length allows it.
        let (ss, ds) = if outer == 1 {
            (0, 0)
        } else {
            (copy.src_stride, copy.dst_stride)
        };
        let vec = [src_offset, ss, dst_offset, ds, len]
            .iter()
            .all(|v| v.is_multiple_of(4));
        let w = if vec { 4 } else { 1 };
        let args = [
            src.into(),
            dst.into(),
            u64_arg(src_offset / w),
            u64_arg(ss / w),
            u64_arg(dst_offset / w),
            u64_arg(ds / w),
            u64_arg(outer),
            u64_arg(len / w),
        ];
        let m = move_suffix(dst.dtype());
        let kernel = if vec {
            format!("copy_blocks4_{m}")
        } else {
            format!("copy_blocks_{m}")
        };
        // SAFETY: copy_blocks{,4}_{f32,b16}(const T* src, T* dst, u64 src_off, u64 src_stride,
        // u64 dst_off, u64 dst_stride, u64 outer, u64 len), T = one element (4 or 2 bytes, the
        // buffers' one dtype) or 4 of them, with every argument in units of T (all multiples
        // of 4 elements, buffers 256-byte aligned); every block lies inside its buffer
        // (check_copy_blocks).
        unsafe { self.launch(&kernel, self.stride_grid(outer * len / w), &args) }
    }

    fn permute(
        &self,
        x: &CudaBuffer,
        shape: &[usize],
        perm: &[usize],
        out: &mut CudaBuffer,
    ) -> Result<()> {
        check_permute(x, shape, perm, out)?;
        let n = x.len();
        if n == 0 {
            return Ok(());
        }
        let (mut dims, perm) = plan::collapse_permute(shape, perm);
        let rank = dims.len();
        if rank <= 1 {
            return self.copy_buffer(x, out);
        }
        let moves_last = perm[rank - 1] != rank - 1;
        // Tiles pay off when both tiled axes fill a good part of a 32-wide tile; otherwise the
        // per-element kernel's strided reads mostly hit lines its neighbours fetched.
        if moves_last && dims[rank - 1].min(dims[perm[rank - 1]]) >= 16 {
            let t = plan::tile_plan(&dims, &perm);
            let items = (n / (t.p * t.q)) * t.p.div_ceil(32) * t.q.div_ceil(32);
            let mut args = vec![
                x.into(),
                out.into(),
                u64_arg(t.p),
                u64_arg(t.q),
                u64_arg(t.sq),
                u64_arg(t.sp),
                u64_arg(n / (t.p * t.q)),
            ];
            let batch = |k: usize| t.batch.get(k).copied().unwrap_or((1, 0, 0));
            args.extend((0..4).map(|k| u64_arg(batch(k).0)));
            args.extend((0..4).map(|k| u64_arg(batch(k).1)));
            args.extend((0..4).map(|k| u64_arg(batch(k).2)));
            let cfg = LaunchConfig {
                grid_dim: (items.clamp(1, self.sms() * 32) as u32, 1, 1),
                block_dim: (32, 8, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: permute_tile_{f32,b16}(const T* x, T* out, u64 P, u64 Q, u64 sq,
            // u64 sp, u64 batch, u64 b0..b3, u64 bi0..bi3, u64 bo0..bo3), T the buffers' one
            // element type, with the strides of the collapsed contiguous shapes of x and out,
            // which both hold n elements; block 32×8.
            let kernel = format!("permute_tile_{}", move_suffix(out.dtype()));
            return unsafe { self.launch(&kernel, cfg, &args) };
        }
        // Writes are coalesced; when the last axis stays last so are reads, in units of 16
        // bytes (4 f32 or 8 bf16) when its length allows, else of 4 elements.
        let m = move_suffix(out.dtype());
        let wide = if m == "b16" { 8 } else { 4 };
        let unit = if moves_last {
            1
        } else if dims[rank - 1].is_multiple_of(wide) {
            wide
        } else if dims[rank - 1].is_multiple_of(4) {
            4
        } else {
            1
        };
        dims[rank - 1] /= unit;
        let units = n / unit;
        // 16-byte bf16 units walk the input (permute8s_b16): the output's dims and the inverse
        // permutation.
        let scatter = PERMUTE_SCATTER && unit == 8;
        let (dims, perm) = if scatter {
            let mut inv = vec![0; rank];
            for (k, &p) in perm.iter().enumerate() {
                inv[p] = k;
            }
            (perm.iter().map(|&p| dims[p]).collect::<Vec<_>>(), inv)
        } else {
            (dims, perm)
        };
        let packed = perm
            .iter()
            .enumerate()
            .fold(0u32, |acc, (j, &p)| acc | (p as u32) << (3 * j));
        let mut args = vec![
            x.into(),
            out.into(),
            u64_arg(units),
            KernelArg::U32(rank as u32),
        ];
        args.extend(dim_args(&dims));
        args.push(KernelArg::U32(packed));
        let kernel = match unit {
            1 => format!("permute_{m}"),
            8 if scatter => "permute8s_b16".to_string(),
            _ => format!("permute{unit}_{m}"),
        };
        let cfg = self.stride_grid_capped(units, PERMUTE_BLOCKS_PER_SM);
        // SAFETY: permute{,4}_{f32,b16} and permute8_b16(const T* x, T* out, u64 n, u32 rank,
        // u64 d0..d5, u32 perm), T = one element of the buffers' dtype or `unit` of them (then
        // the last dim, which stays last and is a multiple of `unit`, and n are in such units:
        // 16 or 8 bytes, aligned in the 256-byte aligned pool buffers); the collapsed dims
        // multiply to n units, which both buffers hold; perm is a permutation of 0..rank.
        unsafe { self.launch(&kernel, cfg, &args) }
    }

    fn dropout(&self, x: &CudaBuffer, p: f32, seed: u64, out: &mut CudaBuffer) -> Result<()> {
        self.dropout_impl(x, p, seed, 0, out)
    }

    fn cast(&self, x: &CudaBuffer, out: &mut CudaBuffer) -> Result<()> {
        let kernel = match check_cast(x, out)? {
            (DType::F32, DType::BF16) => "cast_f32_bf16",
            (DType::BF16, DType::F32) => "cast_bf16_f32",
            _ => return self.copy_buffer(x, out),
        };
        let (n, dt) = (out.len(), x.dtype());
        let ptrs: [KernelArg; 2] = [x.into(), out.into()];
        // SAFETY: cast_f32_bf16(const float* x, bf16* out, u64 n) and cast_bf16_f32(const bf16*
        // x, float* out, u64 n); x and out hold n elements of the dtypes the match names,
        // 256-byte aligned.
        unsafe { self.launch_streaming(kernel, (&ptrs, n, &[]), (dt, BLOCKS_PER_SM)) }
    }
    fn argmax_rows(&self, x: &CudaBuffer, out: &mut CudaBuffer, cols: usize) -> Result<()> {
        self.argmax_rows_impl(x, out, cols)
    }

    fn gather_rows(&self, x: IdRows<'_, CudaBuffer>, out: &mut CudaBuffer) -> Result<()> {
        self.embedding_fwd_impl(x, out)
    }

    fn scatter_add_rows(&self, x: IdRows<'_, CudaBuffer>, dst: &mut CudaBuffer) -> Result<()> {
        self.embedding_bwd_impl(x, dst)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_vocabulary_kernel_exists() {
        for k in super::vocabulary_kernels() {
            assert!(
                gpu_kernels::module_of(&k).is_some(),
                "kernel {k} is named by the op vocabulary but no embedded module defines it"
            );
        }
    }
}
