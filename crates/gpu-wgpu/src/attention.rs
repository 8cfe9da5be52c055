//! [`AttentionOps`] for [`WgpuBackend`]: causal attention with the scores materialised, as
//! gpu-core's default, but the masked softmax (with its dropout) one row kernel: the forward
//! is q·kᵀ, the row kernel, P'·v (the default: ~10 launches, a host-built mask uploaded every
//! call); the backward is q·kᵀ and dout·vᵀ, one row kernel for dS and P', then three products
//! (the default: ~20). The packed calls run on these through gpu-core's packed default
//! (`forward_with`), so the GPT's attention takes them. f32; bf16 through the default's
//! widening. The dropout mask is the CPU's bit for bit (the flat index of `[n, t, t]`).

use crate::backend::WgpuBackend;
use crate::buffer::WgpuBuffer;
use crate::kernels::{row_src, to_u32};
use crate::shaders::{ATTN_BWD, ATTN_FWD, ATTN_ROW, DROP_HASH, WG_SUM64};
use gpu_core::backend::Backend;
use gpu_core::nn::attention::{check_bwd, check_fwd, AttnDims, AttnQkv, PackedCall, PackedSaved};
use gpu_core::nn::defaults::attention::{Dims, Qkv, Saved};
use gpu_core::nn::defaults::packed;
use gpu_core::nn::AttentionOps;
use gpu_core::{DType, MatmulOps, MatmulSpec, Result};

type Buf = WgpuBuffer;

/// `op(a)·op(b)` over `batch` products of `m × n` (reduction `k`) into `c`.
fn mm(
    g: &WgpuBackend,
    (a, ta): (&Buf, bool),
    (b, tb): (&Buf, bool),
    c: &mut Buf,
    [batch, m, n, k]: [usize; 4],
) -> Result<()> {
    let spec = MatmulSpec {
        batch,
        m,
        n,
        k,
        trans_a: ta,
        trans_b: tb,
    };
    g.matmul(spec, a, b, c)
}

/// The row kernels' parameters: rows, `t`, the dropout's seed, threshold and factor (a zero
/// threshold: none), the scale's bits.
fn params(op: &'static str, s: Dims) -> Result<[u32; 8]> {
    to_u32(op, s.n * s.t * s.t)?;
    let (seed, thr, mul) = match s.drop {
        // As the CPU's dropout_keep: t = ⌈p·2^24⌉ (exact in f32).
        Some(d) => (d.seed, (d.p * (1u32 << 24) as f32).ceil() as u32, d.mul()),
        None => (0, 0, 1.0),
    };
    let rows = to_u32(op, s.n * s.t)?;
    Ok([
        rows,
        to_u32(op, s.t)?,
        seed as u32,
        (seed >> 32) as u32,
        thr,
        mul.to_bits(),
        s.scale.to_bits(),
        0,
    ])
}

impl WgpuBackend {
    /// One workgroup of 64 threads a row over the `n·t` rows of `[n, t, t]`.
    fn attn_rows(
        &self,
        op: &'static str,
        body: &str,
        s: Dims,
        bufs: &[&wgpu::Buffer],
    ) -> Result<()> {
        let p = params(op, s)?;
        let (gx, gy) = self.grid(op, p[0])?;
        let src = || row_src(64, &format!("{WG_SUM64}{DROP_HASH}{ATTN_ROW}{body}"));
        self.launch(op, (op, src), p, (gx, (gx, gy, 1)), bufs)
    }
}

/// `a·bᵀ` of `[n, t, d]` pairs into a new `[n, t, t]` buffer.
fn times_t(g: &WgpuBackend, (a, b): (&Buf, &Buf), s: Dims) -> Result<Buf> {
    let mut c = g.allocate(DType::F32, s.n * s.t * s.t)?;
    mm(g, (a, false), (b, true), &mut c, [s.n, s.t, s.t, s.d])?;
    Ok(c)
}

/// The forward: `lse` of the masked scores, `out = dropout(P)·v`. Arguments checked by the
/// caller (f32, `[n, t, d]`).
pub(crate) fn forward(
    g: &WgpuBackend,
    x: Qkv<'_, WgpuBackend>,
    (out, lse): (&mut Buf, &mut Buf),
    s: Dims,
) -> Result<()> {
    if s.n * s.t == 0 {
        return Ok(());
    }
    let sc = times_t(g, (x.q, x.k), s)?;
    g.attn_rows("causal_attention_fwd", ATTN_FWD, s, &[sc.raw(), lse.raw()])?;
    mm(g, (&sc, false), (x.v, false), out, [s.n, s.t, s.d, s.t])
}

/// The backward: P recomputed from q·kᵀ and `lse`; `dv = P'ᵀ·dout`, `dS = scale·P∘(dP' −
/// Σ_j P∘dP')` with `dP' = dropout(dout·vᵀ)`, `dq = dS·k`, `dk = dSᵀ·q`. The row term is
/// `Σ_c dout∘out` of the forward's output (equal when `out` is that forward's), computed from
/// the row itself, so `saved.out` is not read.
pub(crate) fn backward(
    g: &WgpuBackend,
    x: Qkv<'_, WgpuBackend>,
    saved: Saved<'_, WgpuBackend>,
    (dq, dk, dv): (&mut Buf, &mut Buf, &mut Buf),
    s: Dims,
) -> Result<()> {
    let (n, t, d) = (s.n, s.t, s.d);
    if n * t == 0 {
        return Ok(());
    }
    let sc = times_t(g, (x.q, x.k), s)?;
    let dp = times_t(g, (saved.dout, x.v), s)?;
    let bufs = [sc.raw(), dp.raw(), saved.lse.raw()];
    g.attn_rows("causal_attention_bwd", ATTN_BWD, s, &bufs)?;
    mm(g, (&sc, true), (saved.dout, false), dv, [n, t, d, t])?;
    mm(g, (&dp, false), (x.k, false), dq, [n, t, d, t])?;
    mm(g, (&dp, true), (x.q, false), dk, [n, t, d, t])
}

impl AttentionOps for WgpuBackend {
    fn causal_attention_fwd(
        &self,
        x: AttnQkv<'_, Buf>,
        (out, lse): (&mut Buf, &mut Buf),
        dims: AttnDims,
    ) -> Result<()> {
        check_fwd(x, out, lse, dims)?;
        self.check_out("causal_attention_fwd", &[x.q, x.k, x.v, out, lse])?;
        let AttnDims { n, t, d, scale } = dims;
        let AttnQkv { q, k, v } = x;
        forward(
            self,
            Qkv { q, k, v },
            (out, lse),
            Dims::plain(n, t, d, scale),
        )
    }

    fn causal_attention_bwd(
        &self,
        x: AttnQkv<'_, Buf>,
        saved: PackedSaved<'_, Buf>,
        (dq, dk, dv): (&mut Buf, &mut Buf, &mut Buf),
        dims: AttnDims,
    ) -> Result<()> {
        check_bwd(x, saved, [&*dq, &*dk, &*dv], dims)?;
        let PackedSaved { out, lse, dout } = saved;
        let all = [x.q, x.k, x.v, out, lse, dout, &*dq, &*dk, &*dv];
        self.check_out("causal_attention_bwd", &all)?;
        let AttnDims { n, t, d, scale } = dims;
        let AttnQkv { q, k, v } = x;
        let saved = Saved { out, lse, dout };
        let s = Dims::plain(n, t, d, scale);
        backward(self, Qkv { q, k, v }, saved, (dq, dk, dv), s)
    }

    fn attention_packed_fwd(
        &self,
        qkv: &Buf,
        outs: (&mut Buf, &mut Buf),
        call: PackedCall<'_, Buf>,
    ) -> Result<()> {
        self.check_out("causal_attention_packed_fwd", &[qkv, &*outs.0, &*outs.1])?;
        packed::forward_with(self, qkv, outs, call, forward)
    }

    fn attention_packed_bwd(
        &self,
        qkv: &Buf,
        saved: PackedSaved<'_, Buf>,
        dqkv: &mut Buf,
        call: PackedCall<'_, Buf>,
    ) -> Result<()> {
        let all = [qkv, saved.out, saved.lse, saved.dout, &*dqkv];
        self.check_out("causal_attention_packed_bwd", &all)?;
        packed::backward_with(self, qkv, saved, dqkv, call, backward)
    }
}
