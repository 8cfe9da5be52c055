//! The quantized-weight family on the CPU: the reference of `kernels/nn_gemv_q.cu`. A weight
//! row is dequantized to f32 exactly as `models::quant::Quantized::value` does (`q·s`, or
//! `q·s` then `+ m`, each rounded in f32, no fused multiply-add; f16 widened exactly); `matmul_quant` sums the exact
//! products `x·w` (f32 × f32 is exact in f64) in f64 and rounds once where it stores (bf16 to
//! nearest even by [`bf16_rne`]).
//!
//! That f64 sum is the exact mode's (the default, and what the CUDA kernels are tested
//! against). In the fast mode ([`super::CpuMode::Fast`], the binaries' choice) `matmul_quant`
//! runs `fast::linear` instead: the same dequantized values, the weight kept packed (rows
//! widened by stretches in cache), the products summed in f32 SIMD lanes on all cores, within
//! `γ_k·Σ|x·w|` of this reference (tested there against it).

use super::fast::{self, linear::Weight};
use super::widen::bf16_rne;
use super::CpuStorage;
use crate::backend::BufferInfo;
use crate::error::{GpuError, Result};
use crate::nn::quant::{
    check_dequantize, check_matmul_quant, QuantFormat, QuantOps, QuantSpec, QUANT_GROUP,
};
use crate::CpuBackend;
use rayon::prelude::*;

fn unsupported(op: &'static str, s: &CpuStorage) -> GpuError {
    GpuError::UnsupportedDType {
        op,
        dtype: s.dtype(),
        backend: "cpu (f32 and bf16 only)",
    }
}

/// Element `i` of an f32 or bf16 buffer, widened to f64 (exact).
fn float_at(s: &CpuStorage, i: usize) -> f64 {
    match s {
        CpuStorage::F32(v) => v[i] as f64,
        CpuStorage::BF16(v) => v[i].to_f64(),
        _ => unreachable!("checked f32 or bf16"),
    }
}

/// Stores `v` at `i`, rounded once (f32: `as`, to nearest even; bf16: [`bf16_rne`]).
fn store(op: &'static str, s: &mut CpuStorage, i: usize, v: f64) -> Result<()> {
    match s {
        CpuStorage::F32(o) => o[i] = v as f32,
        CpuStorage::BF16(o) => o[i] = bf16_rne(v),
        other => return Err(unsupported(op, other)),
    }
    Ok(())
}

/// Byte `b` of a packed row held in u32 words, little-endian.
fn byte(words: &[u32], b: usize) -> u8 {
    (words[b / 4] >> (8 * (b % 4))) as u8
}

/// Row `r` of `deq(W)`, `k` f32 values (`spec` checked; the slices are the whole buffers).
fn dequantize_row(
    spec: &QuantSpec,
    data: &[u32],
    scales: &[f32],
    mins: &[f32],
    r: usize,
) -> Vec<f32> {
    let wpr = spec.words_per_row();
    let words = &data[r * wpr..(r + 1) * wpr];
    match spec.format {
        QuantFormat::Int8 => (0..spec.k)
            .map(|c| byte(words, c) as i8 as f32 * scales[r])
            .collect(),
        QuantFormat::Int4 => {
            let groups = spec.format.groups_per_row(spec.k);
            (0..spec.k)
                .map(|c| {
                    let b = byte(words, c / 2);
                    let q = if c.is_multiple_of(2) {
                        b & 0x0f
                    } else {
                        b >> 4
                    };
                    let g = r * groups + c / QUANT_GROUP;
                    q as f32 * scales[g] + mins[g]
                })
                .collect()
        }
        QuantFormat::F16 => (0..spec.k)
            .map(|c| half::f16::from_bits((words[c / 2] >> (16 * (c % 2))) as u16).to_f32())
            .collect(),
    }
}

/// The three weight buffers as slices (after the checks: u32, f32, f32).
fn weight([data, scales, mins]: [&CpuStorage; 3]) -> Result<(&[u32], &[f32], &[f32])> {
    Ok((data.as_u32()?, scales.as_f32()?, mins.as_f32()?))
}

impl QuantOps for CpuBackend {
    fn matmul_quant(
        &self,
        x: &CpuStorage,
        w: [&CpuStorage; 3],
        out: &mut CpuStorage,
        spec: QuantSpec,
    ) -> Result<()> {
        const OP: &str = "matmul_quant";
        check_matmul_quant(x, w, out, spec)?;
        let (data, scales, mins) = weight(w)?;
        if fast::fast() {
            let w = Weight::Quant {
                spec,
                data,
                scales,
                mins,
            };
            return fast::linear::matmul_t_into(x, spec.m, w, out);
        }
        let QuantSpec { m, n, k, .. } = spec;
        // One weight row per task: dequantized once, then its column of the output, each sum
        // computed as the sequential loop would.
        let cols: Vec<Vec<f64>> = (0..n)
            .into_par_iter()
            .map(|j| {
                let w = dequantize_row(&spec, data, scales, mins, j);
                (0..m)
                    .map(|i| {
                        (0..k)
                            .map(|t| float_at(x, i * k + t) * w[t] as f64)
                            .sum::<f64>()
                    })
                    .collect()
            })
            .collect();
        for (j, col) in cols.iter().enumerate() {
            for (i, &v) in col.iter().enumerate() {
                store(OP, out, i * n + j, v)?;
            }
        }
        Ok(())
    }

    fn dequantize(&self, w: [&CpuStorage; 3], out: &mut CpuStorage, spec: QuantSpec) -> Result<()> {
        const OP: &str = "dequantize";
        check_dequantize(w, out, spec)?;
        let (data, scales, mins) = weight(w)?;
        for r in 0..spec.n {
            let row = dequantize_row(&spec, data, scales, mins, r);
            for (c, &v) in row.iter().enumerate() {
                store(OP, out, r * spec.k + c, v as f64)?;
            }
        }
        Ok(())
    }
}
