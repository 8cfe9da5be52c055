//! Weight-only quantization of a linear layer's `[out, in]` weight, the CPU reference of the
//! formats the decode kernels read:
//! - **int8**, one scale per output channel (row), symmetric: `s = max|w|/127`,
//!   `q = round(w/s)` in −127..=127, `w ≈ q·s`;
//! - **int4**, groups of 128 consecutive inputs of a row (the last group of a row may be
//!   shorter), asymmetric with an offset (llama.cpp's Q4_1): `s = (max − min)/15`, `m = min`,
//!   `q = clamp(round((w − m)/s), 0, 15)`, `w ≈ q·s + m`; two values a byte, low nibble first.
//!   (A zero point `z = round(−min/s)` clamped to 0..=15 cannot reach a group that does not
//!   straddle 0; the offset can.)
//! - **f16**, IEEE half precision rounded to nearest even, no scales: `w ≈ f16(w)`, two values
//!   a u32 word (the first in the low half). Weights beyond f16's range (|w| ≥ 65520, which
//!   round to infinity) are a typed error.
//!
//! Error bound of one element ([`Quantized::bound`]): half a step, `s/2`, plus the f32
//! roundings of the division and the product (and, for int4, of `w − m` and `+ m`). No value is
//! clamped beyond its grid: int8's `|w/s| ≤ 127`, int4's `(w − m)/s ∈ [0, 15]`. f16: half an
//! ulp, `|w|·2⁻¹¹` for normal values, `2⁻²⁵` below `2⁻¹⁴`.

use rayon::prelude::*;

use crate::error::ModelError;
use gpu_core::nn::quant::{QuantFormat, QUANT_GROUP};
use tensor_ops::{Device, QuantWeight, Tensor};

/// The formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantKind {
    Int8,
    Int4,
    F16,
}

/// Inputs a group of int4 shares its scale and zero point with (the kernels' `QUANT_GROUP`).
pub const INT4_GROUP: usize = QUANT_GROUP;

impl QuantKind {
    /// The `gpu_core` format of the same layout.
    pub fn format(self) -> QuantFormat {
        match self {
            QuantKind::Int8 => QuantFormat::Int8,
            QuantKind::Int4 => QuantFormat::Int4,
            QuantKind::F16 => QuantFormat::F16,
        }
    }
}

/// A quantized `[rows, cols]` weight.
#[derive(Debug, Clone)]
pub struct Quantized {
    pub kind: QuantKind,
    pub rows: usize,
    pub cols: usize,
    /// int8: `rows·cols` bytes (two's complement); int4: `rows·⌈cols/2⌉` bytes; f16:
    /// `2·rows·cols` bytes (each value's bits, little-endian).
    pub data: Vec<u8>,
    /// int8: one per row; int4: one per group (`rows·⌈cols/128⌉`); f16: empty.
    pub scales: Vec<f32>,
    /// int4: the offset (minimum) of each group; empty for int8 and f16.
    pub mins: Vec<f32>,
}

fn groups(cols: usize) -> usize {
    cols.div_ceil(INT4_GROUP)
}

impl Quantized {
    /// Quantizes `w` (`rows × cols`, row-major). Non-finite weights and a length that is not
    /// `rows·cols` are typed errors.
    pub fn new(kind: QuantKind, w: &[f32], rows: usize, cols: usize) -> Result<Self, ModelError> {
        if rows.checked_mul(cols) != Some(w.len()) {
            return Err(ModelError::Quant(format!(
                "{} values for a {rows} x {cols} weight",
                w.len()
            )));
        }
        if let Some(i) = w.iter().position(|v| !v.is_finite()) {
            return Err(ModelError::Quant(format!("weight {i} is {}", w[i])));
        }
        if kind == QuantKind::Int4 && w.iter().any(|v| v.abs() > f32::MAX / 2.0) {
            // max − min would overflow.
            return Err(ModelError::Quant("int4 needs |w| <= f32::MAX / 2".into()));
        }
        if kind == QuantKind::F16 {
            if let Some(i) = w.iter().position(|&v| half::f16::from_f32(v).is_infinite()) {
                return Err(ModelError::Quant(format!(
                    "weight {i} is {}, beyond f16's range (|w| < 65520)",
                    w[i]
                )));
            }
        }
        let f = match kind {
            QuantKind::Int8 => int8,
            QuantKind::Int4 => int4,
            QuantKind::F16 => f16_weight,
        };
        // Rows are independent: blocks of them quantize on all cores, then concatenate.
        let per_task = (1usize << 16).div_ceil(cols.max(1));
        if cols == 0 || rows <= per_task {
            return Ok(f(w, rows, cols));
        }
        let parts: Vec<Quantized> = w
            .par_chunks(per_task * cols)
            .map(|block| f(block, block.len() / cols, cols))
            .collect();
        let mut q = Quantized {
            kind,
            rows,
            cols,
            data: Vec::new(),
            scales: Vec::new(),
            mins: Vec::new(),
        };
        for p in parts {
            q.data.extend(p.data);
            q.scales.extend(p.scales);
            q.mins.extend(p.mins);
        }
        Ok(q)
    }

    /// The weight the quantized values stand for, `rows × cols` row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.rows * self.cols);
        for r in 0..self.rows {
            for c in 0..self.cols {
                out.push(self.value(r, c));
            }
        }
        out
    }

    /// Element `(r, c)` dequantized.
    pub fn value(&self, r: usize, c: usize) -> f32 {
        match self.kind {
            QuantKind::Int8 => self.data[r * self.cols + c] as i8 as f32 * self.scales[r],
            QuantKind::Int4 => {
                let byte = self.data[r * self.cols.div_ceil(2) + c / 2];
                let q = if c.is_multiple_of(2) {
                    byte & 0x0f
                } else {
                    byte >> 4
                };
                let g = r * groups(self.cols) + c / INT4_GROUP;
                q as f32 * self.scales[g] + self.mins[g]
            }
            QuantKind::F16 => {
                let b = 2 * (r * self.cols + c);
                half::f16::from_le_bytes([self.data[b], self.data[b + 1]]).to_f32()
            }
        }
    }

    /// The largest `|w − deq(q(w))|` the format allows for element `(r, c)` (module docs), with
    /// the f32 roundings of the products.
    pub fn bound(&self, r: usize, c: usize) -> f32 {
        let e = f32::EPSILON;
        match self.kind {
            // w/s (|w/s| ≤ 127) shifts the rounding by ≤ 64ε steps, q·s rounds by ≤ 64ε·s.
            QuantKind::Int8 => 0.5 * self.scales[r] * (1.0 + 256.0 * e),
            QuantKind::Int4 => {
                let g = r * groups(self.cols) + c / INT4_GROUP;
                let (s, m) = (self.scales[g], self.mins[g]);
                // w − m, its division (≤ 15 steps) and q·s each ≤ 8ε·s; `+ m` and the
                // subtraction round by ≤ ε of the group's magnitude.
                let mag = m.abs().max((m + 15.0 * s).abs());
                0.5 * s * (1.0 + 64.0 * e) + 2.0 * e * mag
            }
            // Half an ulp of f16 at |w| (normal), or of its subnormal spacing 2⁻²⁴.
            QuantKind::F16 => {
                let w = self.value(r, c).abs();
                (w * 2f32.powi(-11)).max(2f32.powi(-25))
            }
        }
    }

    /// Bytes of the quantized weight with its scales and zero points.
    pub fn bytes(&self) -> usize {
        self.data.len() + 4 * (self.scales.len() + self.mins.len())
    }

    /// The bytes as the kernels' u32 words, little-endian (byte `b` of a row at byte `b % 4`
    /// of word `b / 4`), `rows × cols/4` (int8), `rows × cols/8` (int4) or `rows × cols/2`
    /// (f16). Every row must start on a word: `cols` a multiple of 4 (int8), 8 (int4) or 2
    /// (f16), else a typed error.
    pub fn packed_words(&self) -> Result<Vec<u32>, ModelError> {
        let per_word = self.kind.format().values_per_word();
        if !self.cols.is_multiple_of(per_word) {
            return Err(ModelError::Quant(format!(
                "{:?} rows of {} inputs do not start on a u32 (need a multiple of {per_word})",
                self.kind, self.cols
            )));
        }
        // A row is cols (int8), cols/2 (int4) or 2·cols (f16) bytes, a multiple of 4: the rows' bytes in
        // order are the words in order.
        Ok(self
            .data
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// The weight on `device` as a [`QuantWeight`] for `Tensor::matmul_quant` (data, scales
    /// and, for int4, minimums: three host-to-device copies).
    pub fn to_device(&self, device: Device) -> Result<QuantWeight, ModelError> {
        let words = self.packed_words()?;
        let (n, k, format) = (self.rows, self.cols, self.kind.format());
        let per_row = k / format.values_per_word();
        let data = Tensor::from_vec(words, &[n, per_row], device)?;
        let (scales, mins) = match self.kind {
            QuantKind::Int8 => (
                Tensor::from_vec(self.scales.clone(), &[n], device)?,
                Tensor::from_vec(Vec::<f32>::new(), &[0], device)?,
            ),
            QuantKind::F16 => (
                Tensor::from_vec(Vec::<f32>::new(), &[0], device)?,
                Tensor::from_vec(Vec::<f32>::new(), &[0], device)?,
            ),
            QuantKind::Int4 => {
                let g = groups(k);
                (
                    Tensor::from_vec(self.scales.clone(), &[n, g], device)?,
                    Tensor::from_vec(self.mins.clone(), &[n, g], device)?,
                )
            }
        };
        Ok(QuantWeight::new(data, scales, mins, format, n, k)?)
    }
}

/// f16 rounded to nearest even (`half`'s conversion), each value's bits little-endian.
fn f16_weight(w: &[f32], rows: usize, cols: usize) -> Quantized {
    let data = w[..rows * cols]
        .iter()
        .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
        .collect();
    Quantized {
        kind: QuantKind::F16,
        rows,
        cols,
        data,
        scales: Vec::new(),
        mins: Vec::new(),
    }
}

fn int8(w: &[f32], rows: usize, cols: usize) -> Quantized {
    let mut data = Vec::with_capacity(w.len());
    let mut scales = Vec::with_capacity(rows);
    for row in w.chunks_exact(cols.max(1)).take(rows) {
        let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
        let s = amax / 127.0;
        scales.push(s);
        data.extend(row.iter().map(|&v| {
            let q = if s > 0.0 {
                (v / s).round().clamp(-127.0, 127.0)
            } else {
                0.0
            };
            q as i8 as u8
        }));
    }
    Quantized {
        kind: QuantKind::Int8,
        rows,
        cols,
        data,
        scales,
        mins: Vec::new(),
    }
}

fn int4(w: &[f32], rows: usize, cols: usize) -> Quantized {
    let per_row = cols.div_ceil(2);
    let mut data = vec![0u8; rows * per_row];
    let mut scales = Vec::with_capacity(rows * groups(cols));
    let mut mins = Vec::with_capacity(rows * groups(cols));
    for r in 0..rows {
        let row = &w[r * cols..(r + 1) * cols];
        for (g, group) in row.chunks(INT4_GROUP).enumerate() {
            let (lo, hi) = group
                .iter()
                .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &v| {
                    (a.min(v), b.max(v))
                });
            let s = (hi - lo) / 15.0;
            scales.push(s);
            mins.push(lo);
            for (i, &v) in group.iter().enumerate() {
                // A constant group (s = 0) stores q = 0: exactly its value.
                let q = if s > 0.0 {
                    ((v - lo) / s).round().clamp(0.0, 15.0) as u8
                } else {
                    0
                };
                let c = g * INT4_GROUP + i;
                data[r * per_row + c / 2] |= if c.is_multiple_of(2) { q } else { q << 4 };
            }
        }
    }
    Quantized {
        kind: QuantKind::Int4,
        rows,
        cols,
        data,
        scales,
        mins,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check(kind: QuantKind, w: &[f32], rows: usize, cols: usize) {
        let q = Quantized::new(kind, w, rows, cols).unwrap();
        let d = q.dequantize();
        for r in 0..rows {
            for c in 0..cols {
                let (a, b) = (w[r * cols + c], d[r * cols + c]);
                assert!(
                    (a - b).abs() <= q.bound(r, c),
                    "{kind:?} ({r}, {c}): {a} → {b}, bound {}",
                    q.bound(r, c)
                );
            }
        }
    }

    proptest! {
        #[test]
        fn dequantized_weights_are_within_the_bound(
            rows in 1usize..5,
            cols in 1usize..300,
            scale in prop_oneof![Just(1e-30f32), Just(1e-3f32), Just(1.0f32), Just(1e30f32)],
            shift in prop_oneof![Just(0.0f32), Just(1.0f32), Just(-5.0f32)],
            seed in any::<u64>(),
        ) {
            use rand::{Rng, SeedableRng};
            let mut r = rand::rngs::StdRng::seed_from_u64(seed);
            // Groups around 0 and groups on one side of it.
            let w: Vec<f32> = (0..rows * cols)
                .map(|_| (r.random_range(-1.0f32..1.0) + shift) * scale)
                .collect();
            check(QuantKind::Int8, &w, rows, cols);
            check(QuantKind::Int4, &w, rows, cols);
            // f16 where every weight is in its range, else a typed error.
            if w.iter().all(|v| v.abs() < 65504.0) {
                check(QuantKind::F16, &w, rows, cols);
            } else {
                prop_assert!(matches!(
                    Quantized::new(QuantKind::F16, &w, rows, cols),
                    Err(ModelError::Quant(_))
                ));
            }
        }
    }

    #[test]
    fn constant_zero_and_one_sided_groups_are_exact_or_bounded() {
        for w in [vec![0.0; 256], vec![0.25; 256], vec![-3.0; 130]] {
            let n = w.len();
            for kind in [QuantKind::Int8, QuantKind::Int4, QuantKind::F16] {
                let q = Quantized::new(kind, &w, 1, n).unwrap();
                if kind != QuantKind::Int8 {
                    assert_eq!(q.dequantize(), w, "a constant group is exact");
                }
                check(kind, &w, 1, n);
            }
        }
        // All positive, far from 0: the offset carries the group.
        let w: Vec<f32> = (0..128).map(|i| 100.0 + i as f32 / 128.0).collect();
        check(QuantKind::Int4, &w, 1, 128);
        check(QuantKind::Int8, &w, 1, 128);
    }

    #[test]
    fn int4_packs_two_a_byte_and_int8_one() {
        let w: Vec<f32> = (0..3 * 257).map(|i| (i as f32 * 0.37).sin()).collect();
        let q4 = Quantized::new(QuantKind::Int4, &w, 3, 257).unwrap();
        assert_eq!(q4.data.len(), 3 * 129);
        assert_eq!(q4.scales.len(), 3 * 3);
        let q8 = Quantized::new(QuantKind::Int8, &w, 3, 257).unwrap();
        assert_eq!(q8.data.len(), 3 * 257);
        assert!(q4.bytes() < q8.bytes());
        let h = Quantized::new(QuantKind::F16, &w, 3, 257).unwrap();
        assert_eq!(h.data.len(), 2 * 3 * 257);
        assert!(h.scales.is_empty() && h.mins.is_empty());
        assert_eq!(h.bytes(), 2 * q8.bytes() - 4 * 3 * 2);
    }

    #[test]
    fn f16_rounds_to_nearest_even_and_refuses_its_overflow() {
        // 1 + 2⁻¹¹ is halfway between 1 and 1 + 2⁻¹⁰: even (1); 65504 is the largest half;
        // 65519.99 rounds down to it, 65520 to infinity (refused); 2⁻²⁵ ties to 0 (even),
        // 3·2⁻²⁶ to 2⁻²⁴.
        let w = [
            1.0 + 2f32.powi(-11),
            65504.0,
            65519.99,
            2f32.powi(-25),
            3.0 * 2f32.powi(-26),
            -0.0,
        ];
        let q = Quantized::new(QuantKind::F16, &w, 1, 6).unwrap();
        let want = [1.0, 65504.0, 65504.0, 0.0, 2f32.powi(-24), -0.0];
        assert_eq!(q.dequantize(), want);
        for bad in [65520.0, -1e30] {
            let e = Quantized::new(QuantKind::F16, &[0.0, bad], 1, 2).unwrap_err();
            assert!(
                matches!(e, ModelError::Quant(ref m) if m.contains("weight 1")),
                "{e}"
            );
        }
    }

    /// The kernels' CPU reference reads the packed words as this module reads its bytes: the
    /// two dequantizations agree bit for bit, on the host (and, where a GPU is present, the
    /// CUDA kernel is checked against the same reference by gpu-cuda's nn_quant tests).
    #[test]
    fn gpu_core_dequantize_reads_the_packed_words_bit_for_bit() {
        use rand::{Rng, SeedableRng};
        let seed: u64 = std::env::var("HYBRID_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(rand::random);
        println!("seed {seed} (HYBRID_TEST_SEED replays it)");
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        for (rows, cols) in [(3, 8), (2, 72), (4, 200), (1, 264), (0, 16)] {
            let w: Vec<f32> = (0..rows * cols)
                .map(|_| r.random_range(-1.0f32..1.0) + [0.0, 3.0][r.random_range(0..2)])
                .collect();
            for kind in [QuantKind::Int8, QuantKind::Int4, QuantKind::F16] {
                let q = Quantized::new(kind, &w, rows, cols).unwrap();
                let gw = q.to_device(Device::Cpu).unwrap();
                let got = gw
                    .dequantize(tensor_ops::DType::F32)
                    .unwrap()
                    .to_vec()
                    .unwrap();
                let want = q.dequantize();
                assert_eq!(got.len(), want.len());
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(a.to_bits(), b.to_bits(), "{kind:?} {rows}x{cols} [{i}]");
                }
            }
        }
    }

    #[test]
    fn rows_that_do_not_start_on_a_word_are_refused() {
        let w = vec![0.5f32; 2 * 12];
        let q8 = Quantized::new(QuantKind::Int8, &w, 2, 12).unwrap();
        assert!(q8.to_device(Device::Cpu).is_ok());
        let q4 = Quantized::new(QuantKind::Int4, &w, 2, 12).unwrap();
        assert!(matches!(
            q4.to_device(Device::Cpu),
            Err(ModelError::Quant(_))
        ));
        let q8 = Quantized::new(QuantKind::Int8, &w[..2 * 6], 2, 6).unwrap();
        assert!(matches!(q8.packed_words(), Err(ModelError::Quant(_))));
    }

    #[test]
    fn bad_weights_are_typed_errors() {
        for kind in [QuantKind::Int8, QuantKind::Int4] {
            assert!(Quantized::new(kind, &[0.0, f32::NAN], 1, 2).is_err());
            assert!(Quantized::new(kind, &[f32::INFINITY], 1, 1).is_err());
            assert!(Quantized::new(kind, &[0.0; 5], 2, 3).is_err());
            assert!(Quantized::new(kind, &[], usize::MAX, 2).is_err());
            if kind == QuantKind::Int4 {
                assert!(Quantized::new(kind, &[f32::MAX, -f32::MAX], 1, 2).is_err());
            }
            let empty = Quantized::new(kind, &[], 0, 7).unwrap();
            assert!(empty.dequantize().is_empty());
        }
    }
}
