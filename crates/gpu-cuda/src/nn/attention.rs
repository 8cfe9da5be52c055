//! [`AttentionOps`] on CUDA: the flash-attention kernels of `kernels/nn_attention.cu`.
//! Forward: one launch. Backward: `attn_bwd_dq_*` (which also writes the per-row
//! `delta = Σ dout ∘ out` into a pooled scratch buffer) then `attn_bwd_dkdv_*`. With attention
//! dropout ([`DeviceAttnDropout`], `p > 0`) the `*_drop` twins of each kernel run.

use crate::backend::CudaBackend;
use crate::launch::{KernelArg, LaunchConfig};
use crate::pool::CudaBuffer;
use gpu_core::nn::attention::{
    check_bwd, check_fwd, check_packed, AttentionOps, AttnDims, AttnDropout, AttnQkv, Packed,
    PackedCall, PackedDrop, PackedSaved,
};
use gpu_core::{Backend, BufferInfo, DType, GpuError, Result};

/// The op names in the f32 kernels' launch errors.
const FWD: &str = "causal_attention_fwd";
const BWD: &str = "causal_attention_bwd";

/// Attention dropout on CUDA ([`AttnDropout`]), with an optional device seed offset read by
/// the kernels ([`PackedDrop`]: the u64 entry `index` of `offsets` is added to the seed when
/// they run, so a CUDA graph's replays draw new masks, as `ElementwiseOps::dropout_offset`).
pub type DeviceAttnDropout<'a> = PackedDrop<'a, CudaBuffer>;

impl CudaBackend {
    /// The `*_drop` kernels' trailing arguments `(float p, u64 seed, const u64* offset)` for an
    /// active dropout (`p > 0`, checked in `[0, 1)`; the offset's entry checked as
    /// `dropout_offset`'s), or `None` for the plain kernels (`None` or `p = 0`).
    pub(crate) fn attn_drop_args(
        &self,
        op: &'static str,
        drop: Option<DeviceAttnDropout<'_>>,
    ) -> Result<Option<[KernelArg; 3]>> {
        let Some(dd) = drop else { return Ok(None) };
        let Some(d) = AttnDropout::active(Some(dd.drop), op)? else {
            return Ok(None);
        };
        let ptr = match dd.offset {
            Some((offsets, index)) => self.seed_offset_ptr(op, offsets, index)?,
            None => 0,
        };
        Ok(Some([
            KernelArg::F32(d.p),
            KernelArg::U64(d.seed),
            KernelArg::Ptr(ptr),
        ]))
    }
}

/// The kernel to launch: `name`, or its `_drop` twin with the dropout's arguments appended.
pub(crate) fn with_drop(
    name: &str,
    args: &mut Vec<KernelArg>,
    drop: &Option<[KernelArg; 3]>,
) -> String {
    match drop {
        None => name.to_string(),
        Some(d) => {
            args.extend(d.iter().cloned());
            format!("{name}_drop")
        }
    }
}

/// A kernel and its tile: `rows` rows of the sequence per block, `threads` threads per block.
pub(super) struct Tile {
    pub(super) kernel: &'static str,
    pub(super) rows: usize,
    pub(super) threads: u32,
}

/// The kernel for head dimension `d` (d <= 64 runs the 64-wide kernels, else the 128-wide).
fn pick(d: usize, narrow: Tile, wide: Tile) -> Tile {
    if d <= 64 {
        narrow
    } else {
        wide
    }
}

/// One block of `threads` threads per (sequence, tile of `rows` rows); the f32 kernels' and
/// the bf16 ones' (`attention_bf16`).
pub(super) fn config(
    op: &'static str,
    n: usize,
    t: usize,
    (rows, threads): (usize, u32),
) -> Result<LaunchConfig> {
    let blocks = n
        .checked_mul(t.div_ceil(rows))
        .filter(|&b| b <= i32::MAX as usize)
        .ok_or_else(|| GpuError::InvalidShape {
            op,
            reason: format!("n·ceil(t/{rows}) blocks exceed 2^31-1"),
        })?;
    Ok(LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// Where sequence `s = b·heads + h` of each tensor lives (the kernels' layout, see
/// `kernels/nn_attention.cu`): q, k, v, dq, dk, dv rows `ld_in` floats apart from
/// `b·t·ld_in + h·d`, out and dout rows `ld_out` apart from `b·t·ld_out + h·d`.
#[derive(Clone, Copy)]
struct Layout {
    heads: usize,
    ld_in: usize,
    ld_out: usize,
}

impl Layout {
    /// `[n, t, d]` tensors, one after another.
    fn plain(d: usize) -> Layout {
        Layout {
            heads: 1,
            ld_in: d,
            ld_out: d,
        }
    }
}

/// The sizes, layout and scale of an attention launch: `n` sequences of `t` rows of `d`
/// floats.
#[derive(Clone, Copy)]
pub(super) struct Geom {
    /// Sequences (batch·heads).
    n: usize,
    /// Rows per sequence.
    t: usize,
    /// Head width.
    d: usize,
    /// Where each sequence lives.
    layout: Layout,
    /// The scores' scale.
    scale: f32,
}

/// `n`, `t`, `d`, the layout and `scale` as kernel arguments (n < 2^31 once `config` accepted
/// the grid; t <= 2^30 and d <= 128 by the shared checks; the layout's strides < 2^31 by the
/// packed checks).
fn dims(g: Geom) -> [KernelArg; 7] {
    let Geom {
        n,
        t,
        d,
        layout: l,
        scale,
    } = g;
    [
        KernelArg::U32(n as u32),
        KernelArg::U32(t as u32),
        KernelArg::U32(d as u32),
        KernelArg::U32(l.heads as u32),
        KernelArg::U32(l.ld_in as u32),
        KernelArg::U32(l.ld_out as u32),
        KernelArg::F32(scale),
    ]
}

fn fwd_tile(d: usize) -> Tile {
    pick(
        d,
        Tile {
            kernel: "attn_fwd_d64_f32",
            rows: 64,
            threads: 256,
        },
        Tile {
            kernel: "attn_fwd_d128_f32",
            rows: 32,
            threads: 128,
        },
    )
}

fn bwd_tiles(d: usize) -> (Tile, Tile) {
    let dq = pick(
        d,
        Tile {
            kernel: "attn_bwd_dq_d64_f32",
            rows: 32,
            threads: 128,
        },
        Tile {
            kernel: "attn_bwd_dq_d128_f32",
            rows: 16,
            threads: 64,
        },
    );
    let dkdv = pick(
        d,
        Tile {
            kernel: "attn_bwd_dkdv_d64_f32",
            rows: 32,
            threads: 128,
        },
        Tile {
            kernel: "attn_bwd_dkdv_d128_f32",
            rows: 16,
            threads: 64,
        },
    );
    (dq, dkdv)
}

impl AttentionOps for CudaBackend {
    fn causal_attention_fwd(
        &self,
        x: AttnQkv<'_, CudaBuffer>,
        (out, lse): (&mut CudaBuffer, &mut CudaBuffer),
        dims: AttnDims,
    ) -> Result<()> {
        const OP: &str = "causal_attention_fwd";
        check_fwd(x, out, lse, dims)?;
        let (AttnQkv { q, k, v }, AttnDims { n, t, d, scale }) = (x, dims);
        if n == 0 || t == 0 {
            return Ok(());
        }
        self.check_owned(OP, &[q, k, v])?;
        let ptrs = [q, k, v].map(|b| KernelArg::Ptr(b.device_ptr()));
        let g = Geom {
            n,
            t,
            d,
            layout: Layout::plain(d),
            scale,
        };
        // SAFETY: the plain layout over buffers of n·t·d f32 (q, k, v, out) and n·t (lse),
        // checked by check_fwd.
        unsafe { self.attention_fwd_launch((FWD, fwd_tile(g.d)), ptrs, (out, lse), g, None) }
    }

    fn causal_attention_bwd(
        &self,
        x: AttnQkv<'_, CudaBuffer>,
        saved: PackedSaved<'_, CudaBuffer>,
        (dq, dk, dv): (&mut CudaBuffer, &mut CudaBuffer, &mut CudaBuffer),
        dims: AttnDims,
    ) -> Result<()> {
        const OP: &str = "causal_attention_bwd";
        check_bwd(x, saved, [&*dq, &*dk, &*dv], dims)?;
        let (AttnQkv { q, k, v }, AttnDims { n, t, d, scale }) = (x, dims);
        if n == 0 || t == 0 {
            return Ok(());
        }
        self.check_owned(OP, &[q, k, v, &*dq, &*dk, &*dv])?;
        let ptrs = [q, k, v].map(|b| KernelArg::Ptr(b.device_ptr()));
        let grads = [dq, dk, dv].map(|b| KernelArg::Ptr(b.device_ptr()));
        let g = Geom {
            n,
            t,
            d,
            layout: Layout::plain(d),
            scale,
        };
        // SAFETY: the plain layout over buffers of n·t·d f32 (q, k, v, out, dout, dq, dk, dv)
        // and n·t (lse), checked by check_bwd; dq, dk, dv are distinct (&mut) and written only.
        unsafe { self.attention_bwd_launch((BWD, bwd_tiles(g.d)), ptrs, saved, grads, g, None) }
    }

    /// The packed kernels: f32, or for a bf16 `qkv` the tensor-core bf16 ones.
    fn attention_packed_fwd(
        &self,
        qkv: &CudaBuffer,
        (out, lse): (&mut CudaBuffer, &mut CudaBuffer),
        call: PackedCall<'_, CudaBuffer>,
    ) -> Result<()> {
        let (p, scale, drop) = (call.dims, call.scale, call.drop);
        if qkv.dtype() == DType::BF16 {
            return self.causal_attention_packed_bf16_fwd(qkv, out, lse, p, scale, drop);
        }
        self.causal_attention_packed_fwd(qkv, out, lse, p, scale, drop)
    }

    fn attention_packed_bwd(
        &self,
        qkv: &CudaBuffer,
        s: PackedSaved<'_, CudaBuffer>,
        dqkv: &mut CudaBuffer,
        call: PackedCall<'_, CudaBuffer>,
    ) -> Result<()> {
        let (p, scale, drop) = (call.dims, call.scale, call.drop);
        if qkv.dtype() == DType::BF16 {
            return self.causal_attention_packed_bf16_bwd(qkv, s, dqkv, p, scale, drop);
        }
        self.causal_attention_packed_bwd(qkv, s, dqkv, p, scale, drop)
    }
}

impl CudaBackend {
    /// Causal attention over a fused projection: `qkv` `[b, t, 3·heads·d]` holds q, k and v as
    /// its three column blocks (head `h` at columns `h·d..(h+1)·d` of each), as a GPT's
    /// `c_attn` makes it; `out` `[b, t, heads·d]` and `lse` `[b·heads, t]` are written. The
    /// same arithmetic as [`AttentionOps::causal_attention_fwd`] on the permuted
    /// `[b·heads, t, d]` tensors (the same bits), without the permutes. `drop`: dropout of the
    /// attention probabilities (sequence `b·heads + h` of the mask); `None` or `p = 0` runs the
    /// plain kernels.
    pub fn causal_attention_packed_fwd(
        &self,
        qkv: &CudaBuffer,
        out: &mut CudaBuffer,
        lse: &mut CudaBuffer,
        p: Packed,
        scale: f32,
        drop: Option<DeviceAttnDropout<'_>>,
    ) -> Result<()> {
        const OP: &str = "causal_attention_packed_fwd";
        check_packed(OP, qkv, &[&*out], lse, None, p, scale)?;
        self.check_owned(OP, &[qkv, &*out, &*lse])?;
        let drop = self.attn_drop_args(OP, drop)?;
        if p.n() == 0 || p.t == 0 {
            return Ok(());
        }
        let g = packed_geom(p, scale);
        // SAFETY: q, k, v at column offsets 0, c, 2c of qkv (b·t rows of 3c = ld_in floats);
        // out holds b·t rows of c = ld_out floats and lse n·t (check_packed); all pointers are
        // 16-byte aligned (256-byte aligned base, c and d multiples of 4).
        unsafe {
            self.attention_fwd_launch(
                (FWD, fwd_tile(g.d)),
                packed_ptrs(qkv, 4 * p.c()),
                (out, lse),
                g,
                drop,
            )
        }
    }

    /// The backward of [`CudaBackend::causal_attention_packed_fwd`]: `dqkv` (the layout of
    /// `qkv`) gets dq, dk and dv in its three column blocks, from `out`, `lse` and `dout`
    /// `[b, t, heads·d]`. The same bits as [`AttentionOps::causal_attention_bwd`] on the
    /// permuted tensors; `drop` as the forward's (the kernels regenerate the mask).
    pub fn causal_attention_packed_bwd(
        &self,
        qkv: &CudaBuffer,
        saved: PackedSaved<'_, CudaBuffer>,
        dqkv: &mut CudaBuffer,
        p: Packed,
        scale: f32,
        drop: Option<DeviceAttnDropout<'_>>,
    ) -> Result<()> {
        const OP: &str = "causal_attention_packed_bwd";
        let PackedSaved { out, lse, dout } = saved;
        check_packed(OP, qkv, &[out, dout], lse, Some(&*dqkv), p, scale)?;
        self.check_owned(OP, &[qkv, out, lse, dout, &*dqkv])?;
        let drop = self.attn_drop_args(OP, drop)?;
        if p.n() == 0 || p.t == 0 {
            return Ok(());
        }
        let (grads, g) = (packed_ptrs(dqkv, 4 * p.c()), packed_geom(p, scale));
        // SAFETY: as the forward; dqkv has qkv's layout and is distinct (&mut), written only.
        unsafe {
            let qkv = packed_ptrs(qkv, 4 * p.c());
            self.attention_bwd_launch((BWD, bwd_tiles(g.d)), qkv, saved, grads, g, drop)
        }
    }

    /// The forward kernel `tile.kernel` (f32 or bf16 tensors `T`; `op` names the call in a
    /// grid error).
    ///
    /// # Safety
    /// `qkv` point at q, k, v in `g.layout` for `g.n` sequences of `g.t` rows of `g.d` T,
    /// `out` and `lse` hold them in `g.layout` and `[n, t]` f32; all are this backend's,
    /// 16-byte aligned; `drop` comes from [`CudaBackend::attn_drop_args`].
    pub(super) unsafe fn attention_fwd_launch(
        &self,
        (op, tile): (&'static str, Tile),
        qkv: [KernelArg; 3],
        (out, lse): (&mut CudaBuffer, &mut CudaBuffer),
        g: Geom,
        drop: Option<[KernelArg; 3]>,
    ) -> Result<()> {
        let cfg = config(op, g.n, g.t, (tile.rows, tile.threads))?;
        let mut args = qkv.to_vec();
        args.extend([out.into(), lse.into()]);
        args.extend(dims(g));
        let kernel = with_drop(tile.kernel, &mut args, &drop);
        // SAFETY: attn_fwd_d{64,128}_f32 or attn_fwd_d64_bf16 (const T* q, k, v, T* out,
        // float* lse, u32 n, u32 t, u32 d, u32 heads, u32 ld_in, u32 ld_out, float scale) over
        // n·ceil(t/rows) blocks of `threads` threads (the kernel's tile); the pointers cover
        // the layout (this function's contract); static shared memory only (<= 48 KiB). The
        // `_drop` twin takes (float p, u64 seed, const u64* offset) after them: p in (0, 1)
        // and offset null or an 8-byte aligned u64 of this backend (attn_drop_args).
        unsafe { self.launch(&kernel, cfg, &args) }
    }

    /// The backward kernels `tiles` (dq, then dk and dv; f32 or bf16 tensors `T`; `op` names
    /// the call in a grid error), through an f32 `delta` of `g.n·g.t` from the pool.
    ///
    /// # Safety
    /// As [`CudaBackend::attention_fwd_launch`], with `dout` in `out`'s layout and `grads`
    /// (dq, dk, dv) in q's, not overlapping any input.
    pub(super) unsafe fn attention_bwd_launch(
        &self,
        (op, (dq_tile, dkdv_tile)): (&'static str, (Tile, Tile)),
        qkv: [KernelArg; 3],
        saved: PackedSaved<'_, CudaBuffer>,
        grads: [KernelArg; 3],
        g: Geom,
        drop: Option<[KernelArg; 3]>,
    ) -> Result<()> {
        let (Geom { n, t, .. }, PackedSaved { out, lse, dout }) = (g, saved);
        let dq_cfg = config(op, n, t, (dq_tile.rows, dq_tile.threads))?;
        let dkdv_cfg = config(op, n, t, (dkdv_tile.rows, dkdv_tile.threads))?;
        // Returned to the pool on drop; later work reusing it is queued behind both kernels.
        let mut delta = self.allocate(DType::F32, n * t)?;
        let [q, k, v] = qkv;
        let [dq, dk, dv] = grads;
        let mut args = vec![q.clone(), k.clone(), v.clone()];
        args.extend([out.into(), lse.into(), dout.into(), dq, (&mut delta).into()]);
        args.extend(dims(g));
        let kernel = with_drop(dq_tile.kernel, &mut args, &drop);
        // SAFETY: attn_bwd_dq_d{64,128}_f32 or attn_bwd_dq_d64_bf16 (const T* q, k, v, out,
        // const float* lse, const T* dout, T* dq, float* delta, u32 n, u32 t, u32 d, u32 heads,
        // u32 ld_in, u32 ld_out, float scale) over n·ceil(t/rows) blocks of `threads` threads;
        // the pointers cover the layout (this function's contract) and delta holds n·t
        // (allocated above). The `_drop` twin's trailing (float p, u64 seed, const u64* offset)
        // as in attention_fwd_launch.
        unsafe { self.launch(&kernel, dq_cfg, &args) }?;
        let mut args = vec![q, k, v, lse.into(), dout.into(), (&delta).into(), dk, dv];
        args.extend(dims(g));
        let kernel = with_drop(dkdv_tile.kernel, &mut args, &drop);
        // SAFETY: attn_bwd_dkdv_d{64,128}_f32 or attn_bwd_dkdv_d64_bf16 (const T* q, k, v,
        // const float* lse, const T* dout, const float* delta, T* dk, T* dv, u32 n, u32 t,
        // u32 d, u32 heads, u32 ld_in, u32 ld_out, float scale); as above; delta was written by
        // the dq kernel queued before this one on the same stream; the `_drop` twin as the dq
        // kernel's.
        unsafe { self.launch(&kernel, dkdv_cfg, &args) }
    }
}

/// The kernels' layout of a packed call (strides < 2^31 by `check_packed`).
fn packed_layout(p: Packed) -> Layout {
    Layout {
        heads: p.heads,
        ld_in: 3 * p.c(),
        ld_out: p.c(),
    }
}

/// The geometry of a packed call: `n = b·heads` sequences in [`packed_layout`].
pub(super) fn packed_geom(p: Packed, scale: f32) -> Geom {
    Geom {
        n: p.n(),
        t: p.t,
        d: p.d,
        layout: packed_layout(p),
        scale,
    }
}

/// Pointers to the three column blocks (q, k, v or dq, dk, dv) of a `[b, t, 3c]` buffer whose
/// column blocks are `block_bytes` long (`c` elements).
pub(super) fn packed_ptrs(buf: &CudaBuffer, block_bytes: usize) -> [KernelArg; 3] {
    let p = buf.device_ptr();
    [0, 1, 2].map(|i| {
        KernelArg::Ptr(if p == 0 {
            0
        } else {
            p + (i * block_bytes) as u64
        })
    })
}

#[cfg(test)]
mod tests {
    /// Every attention kernel has its `_drop` twin in the embedded modules.
    #[test]
    fn every_attention_kernel_has_a_dropout_twin() {
        let f32_kernels = [fwd_tile(64), fwd_tile(128)]
            .into_iter()
            .chain([64, 128].into_iter().flat_map(|d| {
                let (a, b) = bwd_tiles(d);
                [a, b]
            }))
            .map(|t| t.kernel);
        let bf16 = [
            "attn_fwd_d64_bf16",
            "attn_bwd_dq_d64_bf16",
            "attn_bwd_dkdv_d64_bf16",
        ];
        for k in f32_kernels.chain(bf16) {
            for name in [k.to_string(), format!("{k}_drop")] {
                assert!(
                    gpu_kernels::module_of(&name).is_some(),
                    "no embedded module defines {name}"
                );
            }
        }
    }

    use super::{bwd_tiles, fwd_tile};
}
