//! The bf16 kernels of mixed precision: the memory-bound ones on 8192 × 8192 bf16 tensors (128
//! MiB each, the f32 rows' bytes; casts, add, bias add, affine, GELU forward and backward,
//! dropout, sums over rows and columns, a permute, and a copy of the same bytes for reference;
//! bytes count every element read and written once, 2 per bf16 and 4 per f32; the goal
//! is >= 85% of the copy row's bandwidth), and the tensor-core causal attention at the GPT's
//! shape.

use crate::{row, Bench};
use anyhow::Result;
use benches::Row;
use gpu_core::nn::attention::{Packed, PackedSaved};
use gpu_core::nn::Primitives;
use gpu_core::nn::{Activation, BinaryKind, ElementwiseOps, ReduceKind};
use gpu_core::{Backend, BufferInfo, DType};
use gpu_cuda::CudaBuffer;

/// The memory-bound rows' shape: 8192 × 8192 bf16.
const ROWS: usize = 8192;
const COLS: usize = 8192;

pub fn measure(b: &Bench) -> Result<Vec<Row>> {
    let n = ROWS * COLS;
    let (h, f) = (2.0 * n as f64, 4.0 * n as f64);
    let size = format!("{ROWS}×{COLS}");
    let bf16 = |src: &CudaBuffer| to_bf16(b, src);
    let xf = [b.random(n)?, b.random(n)?];
    let xs = [bf16(&xf[0])?, bf16(&xf[1])?];
    let dys = [bf16(&b.random(n)?)?, bf16(&b.random(n)?)?];
    let mut o = b.gpu.allocate(DType::BF16, n)?;
    let mut of = b.out(n)?;
    let mut rows = Vec::new();
    let us = b.time(|i| b.gpu.copy_buffer(&xs[i % 2], &mut o))?;
    rows.push(row(
        "copy_bf16",
        format!("device-to-device copy of one bf16 {size} tensor (the same bytes)"),
        us,
        Some(2.0 * h),
        None,
    ));
    let us = b.time(|i| b.gpu.cast(&xf[i % 2], &mut o))?;
    rows.push(row(
        "cast_f32_bf16",
        format!("cast f32 → bf16 {size}"),
        us,
        Some(f + h),
        None,
    ));
    let us = b.time(|i| b.gpu.cast(&xs[i % 2], &mut of))?;
    rows.push(row(
        "cast_bf16_f32",
        format!("cast bf16 → f32 {size}"),
        us,
        Some(h + f),
        None,
    ));
    let shape = [ROWS, COLS];
    let us = b.time(|i| {
        b.gpu
            .broadcast_binary(BinaryKind::Add, &xs[i % 2], &shape, &dys[0], &shape, &mut o)
    })?;
    rows.push(row(
        "add_bf16",
        format!("add bf16 {size} (same shapes)"),
        us,
        Some(3.0 * h),
        None,
    ));
    let us = b.time(|i| b.gpu.activation_fwd(Activation::Gelu, &xs[i % 2], &mut o))?;
    rows.push(row(
        "gelu_bf16",
        format!("gelu forward bf16 {size}"),
        us,
        Some(2.0 * h),
        None,
    ));
    let us = b.time(|i| {
        b.gpu
            .activation_bwd(Activation::Gelu, &xs[0], &xs[0], &dys[i % 2], &mut o)
    })?;
    rows.push(row(
        "gelu_bwd_bf16",
        format!("gelu backward bf16 {size} (x, dy in; dx out)"),
        us,
        Some(3.0 * h),
        None,
    ));
    let us = b.time(|i| b.gpu.dropout(&xs[i % 2], 0.2, i as u64, &mut o))?;
    rows.push(row(
        "dropout_bf16",
        format!("dropout p 0.2 bf16 {size}"),
        us,
        Some(2.0 * h),
        None,
    ));
    let us = b.time(|i| b.gpu.affine(&xs[i % 2], 1.5, 0.25, &mut o))?;
    rows.push(row(
        "affine_bf16",
        format!("affine x·1.5 + 0.25 bf16 {size}"),
        us,
        Some(2.0 * h),
        None,
    ));
    reductions(b, &mut rows, &xs, &mut o)?;
    drop((xf, xs, dys, o, of));
    attention(b, &mut rows)?;
    Ok(rows)
}

/// `src` cast to a new bf16 buffer.
fn to_bf16(b: &Bench, src: &CudaBuffer) -> Result<CudaBuffer> {
    let mut out = b.gpu.allocate(DType::BF16, src.len())?;
    b.gpu.cast(src, &mut out)?;
    Ok(out)
}

/// The bias add, row and column sums and permute rows, on the bf16 inputs `xs` (alternated
/// between runs) with the scratch output `o`.
fn reductions(
    b: &Bench,
    rows: &mut Vec<Row>,
    xs: &[CudaBuffer; 2],
    o: &mut CudaBuffer,
) -> Result<()> {
    let n = ROWS * COLS;
    let h = 2.0 * n as f64;
    let size = format!("{ROWS}×{COLS}");
    let shape = [ROWS, COLS];
    let bias = to_bf16(b, &b.random(COLS)?)?;
    let us = b.time(|i| {
        b.gpu
            .broadcast_binary(BinaryKind::Add, &xs[i % 2], &shape, &bias, &[COLS], o)
    })?;
    rows.push(row(
        "bias_add_bf16",
        format!("add bf16 {size} + a bias row [{COLS}]"),
        us,
        Some(2.0 * h),
        None,
    ));
    let mut sr = b.gpu.allocate(DType::BF16, ROWS)?;
    let us = b.time(|i| {
        b.gpu
            .reduce_axis(ReduceKind::Sum, &xs[i % 2], ROWS, COLS, 1, &mut sr)
    })?;
    rows.push(row(
        "sum_rows_bf16",
        format!("sum over each row bf16 {size} (f32 accumulation)"),
        us,
        Some(h),
        None,
    ));
    let mut sc = b.gpu.allocate(DType::BF16, COLS)?;
    let us = b.time(|i| {
        b.gpu
            .reduce_axis(ReduceKind::Sum, &xs[i % 2], 1, ROWS, COLS, &mut sc)
    })?;
    rows.push(row(
        "sum_cols_bf16",
        format!("sum over the rows bf16 {size} (a bias gradient; f32 accumulation)"),
        us,
        Some(h),
        None,
    ));
    let pshape = [n / (256 * 4 * 64), 256, 4, 64];
    let us = b.time(|i| b.gpu.permute(&xs[i % 2], &pshape, &[0, 2, 1, 3], o))?;
    rows.push(row(
        "permute_bf16",
        format!(
            "permute [{0}, 256, 4, 64] → [{0}, 4, 256, 64] bf16 (heads to the front)",
            pshape[0]
        ),
        us,
        Some(2.0 * h),
        None,
    ));
    Ok(())
}

/// The tensor-core causal attention rows.
fn attention(b: &Bench, rows: &mut Vec<Row>) -> Result<()> {
    // bf16 causal attention straight from a GPT's fused projection, B64 H6 T256 D64 (the
    // shakespeare-char GPT's): FLOPs counted as PyTorch's causal half, 4·n·t²·d/2.
    let p = Packed {
        b: 64,
        t: 256,
        heads: 6,
        d: 64,
    };
    let qkv = to_bf16(b, &b.random(p.b * p.t * 3 * p.c())?)?;
    let mut out = b.gpu.allocate(DType::BF16, p.b * p.t * p.c())?;
    let mut lse = b.out(p.n() * p.t)?;
    let scale = 1.0 / (p.d as f32).sqrt();
    let fwd_flops = 4.0 * p.n() as f64 * (p.t * p.t) as f64 * p.d as f64 / 2.0;
    // Bursts captured as CUDA graphs here and in the PyTorch peer (SDPA's host work per call
    // outlasts its kernels).
    let us = b.time_graph(|_| {
        b.gpu
            .causal_attention_packed_bf16_fwd(&qkv, &mut out, &mut lse, p, scale, None)
    })?;
    rows.push(row(
        "attn_fwd_bf16",
        "causal attention forward B64 H6 T256 D64 bf16, tensor cores, from the fused qkv (graph-timed bursts, both sides)".into(),
        us,
        None,
        Some(fwd_flops),
    ));
    let dout = to_bf16(b, &b.random(p.b * p.t * p.c())?)?;
    let mut dqkv = b.gpu.allocate(DType::BF16, p.b * p.t * 3 * p.c())?;
    let us = b.time_graph(|_| {
        b.gpu.causal_attention_packed_bf16_bwd(
            &qkv,
            PackedSaved {
                out: &out,
                lse: &lse,
                dout: &dout,
            },
            &mut dqkv,
            p,
            scale,
            None,
        )
    })?;
    rows.push(row(
        "attn_bwd_bf16",
        "causal attention backward B64 H6 T256 D64 bf16, tensor cores, into the fused dqkv (graph-timed bursts, both sides)".into(),
        us,
        None,
        Some(2.5 * fwd_flops),
    ));
    Ok(())
}
