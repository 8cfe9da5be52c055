//! `gpu-bench --only-qgemm`: the quantized matmul of more than 4 rows of bf16 x in its two
//! forms, on the projections of a Llama-3.2-1B layer (qkv 3072 × 2048, o 2048 × 2048, gate/up
//! 16384 × 2048, down 2048 × 8192), int8 and int4, at m = 8 .. 2048 rows: the fused
//! dequantize-GEMM (`QgemmForm::Fused`) and dequantize-then-cuBLAS (`QgemmForm::Dequant`),
//! each timed as [`Bench::time`] does (CUDA events around bursts, medians). Prints, per format
//! and m, the layer's four products summed for each form, and their ratio: what
//! `FUSED_GEMM_MAX_ROWS` (the `Auto` form's crossover) is chosen from.

use crate::Bench;
use anyhow::Result;
use gpu_core::nn::quant::{QuantFormat, QuantSpec};
use gpu_core::{Backend, DType};
use gpu_cuda::{CudaBuffer, QgemmForm};
use rand::Rng;

/// (n, k) of the four projections of a Llama-3.2-1B layer.
const SHAPES: [(usize, usize); 4] = [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192)];
const ROWS: [usize; 9] = [8, 16, 32, 64, 96, 128, 256, 512, 2048];

struct Weight {
    data: CudaBuffer,
    scales: CudaBuffer,
    mins: CudaBuffer,
}

fn weight(b: &Bench, spec: &QuantSpec) -> Result<Weight> {
    let mut rng = rand::rng();
    let words: Vec<u32> = (0..spec.data_len()).map(|_| rng.random()).collect();
    let scales: Vec<f32> = (0..spec.scales_len())
        .map(|_| rng.random_range(1e-3..1e-2))
        .collect();
    let mins: Vec<f32> = (0..spec.mins_len())
        .map(|_| rng.random_range(-0.05..0.0))
        .collect();
    Ok(Weight {
        data: b.gpu.upload(&words)?,
        scales: b.gpu.upload(&scales)?,
        mins: b.gpu.upload(&mins)?,
    })
}

/// Microseconds of one call of `form` on `spec`.
fn time_form(b: &Bench, form: QgemmForm, spec: QuantSpec, w: &Weight) -> Result<f64> {
    let x = b.gpu.allocate(DType::BF16, spec.m * spec.k)?;
    let mut out = b.gpu.allocate(DType::BF16, spec.m * spec.n)?;
    b.time(|_| {
        b.gpu
            .matmul_quant_with(form, &x, [&w.data, &w.scales, &w.mins], &mut out, spec)
    })
}

pub(crate) fn measure(b: &Bench) -> Result<()> {
    println!("\n| format | m | fused µs (layer) | dequantize + cuBLAS µs | fused / dequant |");
    println!("|---|---:|---:|---:|---:|");
    for format in [QuantFormat::Int8, QuantFormat::Int4] {
        let weights = SHAPES
            .iter()
            .map(|&(n, k)| weight(b, &QuantSpec::weight(format, n, k)))
            .collect::<Result<Vec<_>>>()?;
        for m in ROWS {
            let (mut fused, mut deq) = (0.0, 0.0);
            for (&(n, k), w) in SHAPES.iter().zip(&weights) {
                let spec = QuantSpec {
                    m,
                    ..QuantSpec::weight(format, n, k)
                };
                fused += time_form(b, QgemmForm::Fused, spec, w)?;
                deq += time_form(b, QgemmForm::Dequant, spec, w)?;
            }
            println!(
                "| {format:?} | {m} | {fused:.1} | {deq:.1} | {:.2} |",
                fused / deq
            );
        }
    }
    Ok(())
}
