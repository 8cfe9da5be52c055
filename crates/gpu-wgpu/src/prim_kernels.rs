//! Launchers of the WGSL kernels behind [`gpu_core::nn::Primitives`] that kernels.rs lacks:
//! block copies, permutes, broadcast binary ops, activations, reductions over an axis, row
//! argmax and dropout. Each takes buffers already checked by gpu-core's `check_*` (dtype,
//! lengths, shapes) and runs on f32 data (copy_blocks also on bf16's raw bits); bf16 reaches
//! the rest through `prims.rs`'s widen-compute-round path.

use crate::backend::WgpuBackend;
use crate::buffer::WgpuBuffer;
use crate::kernels::{params, row_src, src, thread_src, to_u32};
use crate::shaders::{
    ACTIVATION, ACT_BWD, ACT_FWD, ARGMAX, ARGMAX_WG, BROADCAST, COPY_BLOCKS_BF16, COPY_BLOCKS_F32,
    DROPOUT, DROP_HASH, GATHER_ROWS, PERMUTE, REDUCE_AXIS, REDUCE_AXIS_THREAD, REDUCE_COMB,
    SCATTER_ADD_ROWS, SCATTER_ADD_SCAN,
};
use gpu_core::backend::BufferInfo;
use gpu_core::nn::{Activation, BinaryKind, BlockCopy, ReduceKind};
use gpu_core::{DType, Result};
use wgpu::util::DeviceExt;

/// Longest reduction that one thread does alone (longer ones share a workgroup).
const THREAD_REDUCE_MAX: usize = 256;

/// The f32 forward formula of each activation (a WGSL expression of `x`, from `ACTIVATION`).
/// Exhaustive: a new [`Activation`] does not compile until it has one.
fn fwd_expr(op: Activation) -> &'static str {
    match op {
        // NaN stays NaN (NVIDIA's compiler turns the plain select into a max, which drops it).
        Activation::Relu => "select(select(x, 0.0, x < 0.0), x, is_nan(x))",
        Activation::Gelu => "select(x * ncdf(x), 0.0, is_ninf(x))",
        Activation::Silu => "select(x * sigm(x), 0.0, is_ninf(x))",
        Activation::Sigmoid => "sigm(x)",
        Activation::Tanh => "tanh_(x)",
        Activation::Exp => "exp_(x)",
        Activation::Log => "log_(x)",
    }
}

/// The f32 backward formula (of `x`, `y = f(x)` and `dy`), as `Activation::backward`.
fn bwd_expr(op: Activation) -> &'static str {
    match op {
        Activation::Relu => "select(0.0, dy, x > 0.0)",
        Activation::Gelu => "(ncdf(x) + times_tail(x, npdf(x))) * dy",
        Activation::Silu => "silu_d(x) * dy",
        Activation::Sigmoid => "y * (1.0 - y) * dy",
        Activation::Tanh => "(1.0 - y * y) * dy",
        Activation::Exp => "y * dy",
        Activation::Log => "dy / x",
    }
}

fn binary_expr(op: BinaryKind) -> &'static str {
    match op {
        BinaryKind::Add => "x + y",
        BinaryKind::Sub => "x - y",
        BinaryKind::Mul => "x * y",
        BinaryKind::Div => "x / y",
    }
}

/// Row-major strides of `shape`.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        s[k] = s[k + 1] * shape[k + 1];
    }
    s
}

impl WgpuBackend {
    /// A read-only storage buffer holding `words` (the kernels' shape and stride tables).
    fn meta(&self, op: &'static str, words: &[usize]) -> Result<wgpu::Buffer> {
        let mut w = words
            .iter()
            .map(|&v| to_u32(op, v))
            .collect::<Result<Vec<u32>>>()?;
        w.push(0); // never empty
        Ok(self
            .inner
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("meta"),
                contents: bytemuck::cast_slice(&w),
                usage: wgpu::BufferUsages::STORAGE,
            }))
    }

    /// Copies the blocks of `g` (checked) moving raw bits: f32 one word per element, bf16 one
    /// half-word (atomic and/or, so neighbours in a shared word are kept).
    pub(crate) fn copy_blocks_raw(
        &self,
        src_buf: &WgpuBuffer,
        dst: &mut WgpuBuffer,
        g: BlockCopy,
    ) -> Result<()> {
        const OP: &str = "copy_blocks";
        let n = g.outer * g.len; // <= dst.len(), checked
                                 // A single block never uses its strides (they may exceed u32).
        let (ss, ds) = if g.outer > 1 {
            (g.src_stride, g.dst_stride)
        } else {
            (0, 0)
        };
        let p = params(OP, &[n, g.len, g.src_offset, ss, g.dst_offset, ds])?;
        let (key, body) = match dst.dtype() {
            DType::BF16 => ("copy_blocks_bf16", COPY_BLOCKS_BF16),
            _ => ("copy_blocks_f32", COPY_BLOCKS_F32),
        };
        self.launch_1d(
            OP,
            key,
            || thread_src(body),
            p,
            n,
            &[src_buf.raw(), dst.raw()],
        )
    }

    /// `out = x.permute(perm)` on 32-bit elements (`shape`, `perm` checked).
    pub(crate) fn permute_f32(
        &self,
        x: &WgpuBuffer,
        shape: &[usize],
        perm: &[usize],
        out: &mut WgpuBuffer,
    ) -> Result<()> {
        // Where the last axis stays last and holds whole vec4s, move vec4s (a quarter of the
        // index arithmetic, and 16-byte accesses): the same permutation of a shape whose last
        // axis counts vec4s.
        let rank = shape.len();
        let vec4 = rank > 0 && perm[rank - 1] == rank - 1 && shape[rank - 1].is_multiple_of(4);
        let mut shape = shape.to_vec();
        if vec4 {
            shape[rank - 1] /= 4;
        }
        let st = strides(&shape);
        let mut m = vec![rank];
        m.extend(perm.iter().map(|&p| shape[p]));
        m.extend(perm.iter().map(|&p| st[p]));
        let meta = self.meta("permute", &m)?;
        let n = if vec4 { out.len() / 4 } else { out.len() };
        let p = params("permute", &[n])?;
        let bufs = [&meta, x.raw(), out.raw()];
        if vec4 {
            let body = || {
                let v = PERMUTE.replace("x: array<u32>;", "x: array<vec4<u32>>;");
                thread_src(&v.replace("out: array<u32>;", "out: array<vec4<u32>>;"))
            };
            return self.launch_1d("permute", "permute4", body, p, n, &bufs);
        }
        self.launch_1d("permute", "permute", || thread_src(PERMUTE), p, n, &bufs)
    }

    /// `out = a ∘ b` broadcast to `shape` (checked; f32), each input with its shape.
    pub(crate) fn broadcast_f32(
        &self,
        op: BinaryKind,
        (a, a_shape): (&WgpuBuffer, &[usize]),
        (b, b_shape): (&WgpuBuffer, &[usize]),
        shape: &[usize],
        out: &mut WgpuBuffer,
    ) -> Result<()> {
        // Each input's strides right-aligned in `shape`, 0 along its broadcast (size-1) axes.
        let aligned = |s: &[usize]| -> Vec<usize> {
            let pad = shape.len() - s.len();
            let st = strides(s);
            (0..shape.len())
                .map(|k| {
                    if k < pad || s[k - pad] == 1 {
                        0
                    } else {
                        st[k - pad]
                    }
                })
                .collect()
        };
        let mut m = vec![shape.len()];
        m.extend_from_slice(shape);
        m.extend(aligned(a_shape));
        m.extend(aligned(b_shape));
        let meta = self.meta("broadcast_binary", &m)?;
        let p = params("broadcast_binary", &[out.len()])?;
        self.launch_1d(
            "broadcast_binary",
            &format!("broadcast_{}", op.name()),
            || thread_src(&BROADCAST.replace("EXPR", binary_expr(op))),
            p,
            out.len(),
            &[&meta, a.raw(), b.raw(), out.raw()],
        )
    }

    /// `out = f(x)` on f32 (lengths checked).
    pub(crate) fn act_fwd_f32(
        &self,
        op: Activation,
        x: &WgpuBuffer,
        out: &mut WgpuBuffer,
    ) -> Result<()> {
        self.launch_act(op, false, x.len(), &[x.raw(), out.raw()])
    }

    /// `dx = f'(x)·dy` on f32 (lengths checked).
    pub(crate) fn act_bwd_f32(
        &self,
        op: Activation,
        [x, y, dy]: [&WgpuBuffer; 3],
        dx: &mut WgpuBuffer,
    ) -> Result<()> {
        self.launch_act(op, true, x.len(), &[x.raw(), y.raw(), dy.raw(), dx.raw()])
    }

    /// Launches `op`'s forward (`act_fwd.wgsl`) or `backward` (`act_bwd.wgsl`) kernel over `n`
    /// elements, a thread each, with the activation library.
    fn launch_act(
        &self,
        op: Activation,
        backward: bool,
        n: usize,
        bufs: &[&wgpu::Buffer],
    ) -> Result<()> {
        let (name, key, kernel, expr) = match backward {
            false => ("activation_fwd", "act_fwd", ACT_FWD, fwd_expr(op)),
            true => ("activation_bwd", "act_bwd", ACT_BWD, bwd_expr(op)),
        };
        let p = params(name, &[n])?;
        let body = kernel.replace("EXPR", expr);
        let source = || thread_src(&format!("{ACTIVATION}{body}"));
        self.launch_1d(name, &format!("{key}_{}", op.name()), source, p, n, bufs)
    }

    /// Reduces `[outer, n, inner]` over `n` on f32 (checked): one thread per output for
    /// reductions of up to [`THREAD_REDUCE_MAX`] elements, else one workgroup per output.
    pub(crate) fn reduce_axis_f32(
        &self,
        op: ReduceKind,
        x: &WgpuBuffer,
        [outer, n, inner]: [usize; 3],
        out: &mut WgpuBuffer,
    ) -> Result<()> {
        const OP: &str = "reduce_axis";
        let mut p = params(OP, &[outer * inner, n, inner.max(1)])?;
        p[3] = match op {
            ReduceKind::Sum => 0,
            ReduceKind::Mean => 1,
            ReduceKind::Max => 2,
        };
        let outputs = p[0];
        let bufs = [x.raw(), out.raw()];
        if n <= THREAD_REDUCE_MAX {
            let body = || thread_src(&format!("{REDUCE_COMB}{REDUCE_AXIS_THREAD}"));
            return self.launch_1d(OP, "reduce_axis_thread", body, p, outer * inner, &bufs);
        }
        let (gx, gy) = self.grid(OP, outputs)?;
        let body = || src(&format!("{REDUCE_COMB}{REDUCE_AXIS}"));
        self.launch(OP, (OP, body), p, (gx, (gx, gy, 1)), &bufs)
    }

    /// Row argmax of f32 `x` `[rows, cols]` into u32 `out` (checked).
    pub(crate) fn argmax_f32(
        &self,
        x: &WgpuBuffer,
        out: &mut WgpuBuffer,
        cols: usize,
    ) -> Result<()> {
        let p = params("argmax_rows", &[out.len(), cols])?;
        let bufs = [x.raw(), out.raw()];
        if cols > 256 {
            // A workgroup a row (a thread a row scanned a vocabulary of 128256 logits alone:
            // 11.9 ms of a 1B model's prefill on an H100).
            if out.is_empty() {
                return Ok(());
            }
            let (gx, gy) = self.grid("argmax_rows", to_u32("argmax_rows", out.len())?)?;
            let body = || row_src(256, ARGMAX_WG);
            return self.launch(
                "argmax_rows",
                ("argmax_rows_wg", body),
                p,
                (gx, (gx, gy, 1)),
                &bufs,
            );
        }
        self.launch_1d(
            "argmax_rows",
            "argmax_rows",
            || thread_src(ARGMAX),
            p,
            out.len(),
            &bufs,
        )
    }

    /// Inverted dropout on f32 (checked), the keep mask of `gpu_core`'s `dropout_keep`.
    pub(crate) fn dropout_f32(
        &self,
        x: &WgpuBuffer,
        p: f32,
        seed: u64,
        out: &mut WgpuBuffer,
    ) -> Result<()> {
        // As the CPU: t = ⌈p·2^24⌉ (exact in f32), the scale 1/(1 − p) rounded once.
        let t = (p * (1u32 << 24) as f32).ceil() as u32;
        let s = 1.0f32 / (1.0f32 - p);
        let params = [
            to_u32("dropout", x.len())?,
            seed as u32,
            (seed >> 32) as u32,
            t,
            s.to_bits(),
            0,
            0,
            0,
        ];
        let bufs = [x.raw(), out.raw()];
        self.launch_1d(
            "dropout",
            "dropout",
            || thread_src(&format!("{DROP_HASH}{DROPOUT}")),
            params,
            x.len(),
            &bufs,
        )
    }

    /// Launches a kernel that indexes rows by `ids` (`bufs[0]`) into a table of `vocab` rows:
    /// `bufs` at 1..=3 and the status ring at 4, the status slot in `p[3]` (an id `>= vocab`
    /// is reported there: `crate::status`).
    fn launch_by_ids(
        &self,
        (op, key): (&'static str, &str),
        body: impl FnOnce() -> String,
        (mut p, threads): ([u32; 8], usize),
        vocab: usize,
        bufs: [&wgpu::Buffer; 3],
    ) -> Result<()> {
        self.with_status_slot((op, "ids", vocab), |slot, status| {
            p[3] = slot;
            let [ids, a, b] = bufs;
            self.launch_1d(op, key, body, p, threads, &[ids, a, b, status])
        })
    }

    /// `out[r] = table[ids[r]]` (embedding lookup) for a `[vocab, dim]` table, the arguments
    /// checked by `check_embedding` (which gives `vocab`); an id `>= vocab` gives a NaN row
    /// and [`gpu_core::GpuError::IndexOutOfRange`] from the next call that waits for the device
    /// (`crate::status`: nothing waits here).
    pub(crate) fn gather_f32(
        &self,
        (ids, table): (&WgpuBuffer, &WgpuBuffer),
        (dim, vocab): (usize, usize),
        out: &mut WgpuBuffer,
    ) -> Result<()> {
        const OP: &str = "gather_rows";
        let p = params(OP, &[out.len(), dim, vocab])?;
        let bufs = [ids.raw(), table.raw(), out.raw()];
        let body = || thread_src(GATHER_ROWS);
        self.launch_by_ids((OP, OP), body, (p, out.len()), vocab, bufs)
    }

    /// `dst[ids[r]] += src[r]` for a `[vocab, dim]` `dst` (embedding backward when `dst` starts
    /// at zero), the arguments checked as in [`Self::gather_f32`]. With many rows to each id
    /// (a small vocabulary: `rows >= 8·vocab` and `rows·vocab <= 2^24`) each output adds its
    /// rows in row order (deterministic); otherwise the adds to one row run in an unspecified
    /// order (compare-and-swap, little contention there). An id `>= vocab` skips its row and
    /// is [`gpu_core::GpuError::IndexOutOfRange`] from the next call that waits for the device
    /// (`crate::status`).
    pub(crate) fn scatter_add_f32(
        &self,
        (ids, src_rows): (&WgpuBuffer, &WgpuBuffer),
        (dim, vocab): (usize, usize),
        dst: &mut WgpuBuffer,
    ) -> Result<()> {
        const OP: &str = "scatter_add_rows";
        let rows = ids.len();
        let scan = vocab > 0 && rows >= 8 * vocab && rows.saturating_mul(vocab) <= 1 << 24;
        let (key, threads) = match scan {
            true => ("scatter_add_scan", dst.len()),
            false => ("scatter_add_rows", src_rows.len()),
        };
        let body = move || match scan {
            true => src(SCATTER_ADD_SCAN),
            false => thread_src(SCATTER_ADD_ROWS),
        };
        // The scan counts rows, the other kernel elements.
        let count = if scan { rows } else { src_rows.len() };
        let p = params(OP, &[count, dim, vocab])?;
        let bufs = [ids.raw(), src_rows.raw(), dst.raw()];
        self.launch_by_ids((OP, key), body, (p, threads), vocab, bufs)
    }
}
