//! Weight-only quantized matmuls: `out = x·deq(W)ᵀ` for a `[n, k]` weight (PyTorch's Linear
//! layout: `n` output rows of `k` inputs) stored as int8 or int4, the formats of
//! `models::quant` (their single definition):
//! - [`QuantFormat::Int8`]: symmetric, one f32 scale per row, `w = q·s` with `q` a two's
//!   complement byte;
//! - [`QuantFormat::Int4`]: groups of [`QUANT_GROUP`] consecutive inputs of a row (the last group
//!   of a row may be shorter), asymmetric with a scale and a minimum (llama.cpp's Q4_1),
//!   `w = q·s + m` with `q` in `0..=15`, two values a byte, low nibble first;
//! - [`QuantFormat::F16`]: IEEE half precision, two values a u32 word (element `2i` in the low
//!   half), no scales and no minimums: `w` is the f16 value widened to f32 (exact).
//!
//! The dequantized value is the f32 expression of `models::quant::Quantized::value`, rounded
//! as written: `q·s` once for int8, `q·s` then `+ m` (two roundings, no fused multiply-add)
//! for int4, none for f16. Every backend's [`QuantOps::dequantize`] gives exactly these values.
//!
//! There is no byte dtype: the packed bytes of a row travel in a **u32** buffer, little-endian
//! (byte `b` of a row is byte `b % 4` of word `b / 4`, counting from the least significant).
//! Every row starts on a word: int8 needs `k % 4 == 0` (`data` is `[n, k/4]` u32), int4
//! `k % 8 == 0` (`data` is `[n, k/8]` u32), f16 `k % 2 == 0` (`data` is `[n, k/2]` u32).
//! `scales` is f32 `[n]` (int8), `[n, ⌈k/128⌉]` (int4) or empty (f16); `mins` f32
//! `[n, ⌈k/128⌉]` (int4) or empty (int8, f16).

use crate::backend::BufferInfo;
use crate::dtype::DType;
use crate::error::{GpuError, Result};
use crate::nn::defaults::{self, host as H};
use crate::nn::primitives::Primitives;
use crate::nn::rows::{check_len, require_dtype, require_u32};
use crate::ops::require_float;

/// The quantized formats (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    Int8,
    Int4,
    F16,
}

/// Inputs of a row that share an int4 scale and minimum.
pub const QUANT_GROUP: usize = 128;

impl QuantFormat {
    /// Inputs one u32 word of a row holds: 4 (int8), 8 (int4) or 2 (f16).
    pub fn values_per_word(self) -> usize {
        match self {
            QuantFormat::Int8 => 4,
            QuantFormat::Int4 => 8,
            QuantFormat::F16 => 2,
        }
    }

    /// Scales (and, for int4, minimums) per row of `k` inputs: 1, `⌈k/128⌉` or 0 (f16).
    pub fn groups_per_row(self, k: usize) -> usize {
        match self {
            QuantFormat::Int8 => 1,
            QuantFormat::Int4 => k.div_ceil(QUANT_GROUP),
            QuantFormat::F16 => 0,
        }
    }
}

/// The sizes of a quantized matmul: `x` `[m, k]`, the weight `[n, k]`, `out` `[m, n]`.
/// [`QuantOps::dequantize`] does not read `m` ([`QuantSpec::weight`] sets it to 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantSpec {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub format: QuantFormat,
}

impl QuantSpec {
    /// The spec of a weight alone (`m = 0`), what [`QuantOps::dequantize`] takes.
    pub fn weight(format: QuantFormat, n: usize, k: usize) -> Self {
        Self { m: 0, n, k, format }
    }

    /// u32 words of one packed row: `k/4`, `k/8` or `k/2`.
    pub fn words_per_row(&self) -> usize {
        self.k / self.format.values_per_word()
    }

    /// Elements of `data`: `n·words_per_row`.
    pub fn data_len(&self) -> usize {
        self.n * self.words_per_row()
    }

    /// Elements of `scales`: `n` (int8), `n·⌈k/128⌉` (int4) or 0 (f16).
    pub fn scales_len(&self) -> usize {
        self.n * self.format.groups_per_row(self.k)
    }

    /// Elements of `mins`: `n·⌈k/128⌉` (int4) or 0 (int8, f16).
    pub fn mins_len(&self) -> usize {
        match self.format {
            QuantFormat::Int8 | QuantFormat::F16 => 0,
            QuantFormat::Int4 => self.scales_len(),
        }
    }

    /// Checks what every backend accepts: `k` a multiple of 4 (int8), 8 (int4) or 2 (f16), and `m·k`,
    /// `m·n` and `n·k` below 2^31 (the kernels' 32-bit indices). `m`, `n` or `k` may be 0.
    pub fn check(&self, op: &'static str) -> Result<()> {
        let per = self.format.values_per_word();
        if !self.k.is_multiple_of(per) {
            return Err(GpuError::InvalidShape {
                op,
                reason: format!(
                    "{:?} needs k to be a multiple of {per} (rows start on a u32), got {}",
                    self.format, self.k
                ),
            });
        }
        let lens = [
            self.m.checked_mul(self.k),
            self.m.checked_mul(self.n),
            self.n.checked_mul(self.k),
        ];
        if lens.iter().any(|l| l.is_none_or(|l| l >= 1 << 31)) {
            return Err(GpuError::InvalidShape {
                op,
                reason: format!("{self:?} is too large (sizes must stay below 2^31)"),
            });
        }
        Ok(())
    }
}

/// The quantized-weight family. A weight `w` is its buffers `[data, scales, mins]` (every
/// method, check and default takes the three together), laid out as the module docs say; float
/// buffers are f32 or bf16, computed in f32 or wider and rounded once where stored.
pub trait QuantOps: Primitives {
    /// `out[i, j] = Σ_t x[i, t]·deq(W)[j, t]` for `x` `[m, k]` (f32 or bf16) and `out` `[m, n]`
    /// (f32 or bf16, overwritten). The CPU sums the exact products in f64 (its fast mode in f32
    /// SIMD lanes, the weight kept packed: `cpu/fast/linear.rs`); CUDA sums in f32
    /// (with `m <= 4` a fused kernel that applies each scale after summing `x·q` over a
    /// stretch of a row; with `m > 4` the weight rounded to x's dtype first: for bf16 x a fused
    /// dequantize-GEMM on tensor cores, for f32 x dequantize-then-GEMM). Backends document
    /// their error against the CPU.
    fn matmul_quant(
        &self,
        x: &Self::Buffer,
        w: [&Self::Buffer; 3],
        out: &mut Self::Buffer,
        spec: QuantSpec,
    ) -> Result<()> {
        default_matmul_quant(self, x, w, out, spec)
    }

    /// Writes `deq(W)` `[n, k]` into `out` (f32, or bf16 rounded once to nearest even) with
    /// the values of the module docs; `spec.m` is not read.
    fn dequantize(
        &self,
        w: [&Self::Buffer; 3],
        out: &mut Self::Buffer,
        spec: QuantSpec,
    ) -> Result<()> {
        default_dequantize(self, w, out, spec)
    }
}

/// [`QuantOps::matmul_quant`]'s default, for an override to fall back on (a format without a
/// kernel of its own): the weight dequantized to f32 by `dequantize`, x widened, one f32
/// matmul, the result cast to `out`'s dtype.
pub fn default_matmul_quant<B: QuantOps + ?Sized>(
    b: &B,
    x: &B::Buffer,
    w: [&B::Buffer; 3],
    out: &mut B::Buffer,
    spec: QuantSpec,
) -> Result<()> {
    spec.check("matmul_quant")?;
    let mut wf = b.allocate(crate::DType::F32, spec.n * spec.k)?;
    b.dequantize(w, &mut wf, QuantSpec { m: 0, ..spec })?;
    let mm = crate::MatmulSpec {
        trans_b: true,
        ..crate::MatmulSpec::new(spec.m, spec.n, spec.k)
    };
    let xf = defaults::widen(b, x)?;
    let mut o = b.allocate(crate::DType::F32, spec.m * spec.n)?;
    b.matmul(mm, &xf, &wf, &mut o)?;
    b.cast(&o, out)
}

/// [`QuantOps::dequantize`]'s default: the CPU's reference on host copies (one round trip).
pub fn default_dequantize<B: Primitives + ?Sized>(
    b: &B,
    [data, scales, mins]: [&B::Buffer; 3],
    out: &mut B::Buffer,
    spec: QuantSpec,
) -> Result<()> {
    let [data, scales, mins] = &H::downs_n(b, [data, scales, mins])?;
    let mut o = H::down(b, out)?;
    crate::CpuBackend.dequantize([data, scales, mins], &mut o, spec)?;
    H::up(b, &o, out)
}

/// Checks the packed weight of `spec` (every backend calls this through the two checks below).
fn check_weight<B: BufferInfo>(
    op: &'static str,
    [data, scales, mins]: [&B; 3],
    spec: &QuantSpec,
) -> Result<()> {
    spec.check(op)?;
    require_u32(op, data.dtype())?;
    require_dtype(op, DType::F32, scales.dtype())?;
    require_dtype(op, DType::F32, mins.dtype())?;
    check_len(op, "data (u32 words)", data, spec.data_len())?;
    check_len(op, "scales", scales, spec.scales_len())?;
    check_len(op, "mins", mins, spec.mins_len())
}

/// Checks the arguments of [`QuantOps::matmul_quant`] (every backend calls this).
pub fn check_matmul_quant<B: BufferInfo>(
    x: &B,
    w: [&B; 3],
    out: &B,
    spec: QuantSpec,
) -> Result<()> {
    const OP: &str = "matmul_quant";
    check_weight(OP, w, &spec)?;
    require_float(OP, x.dtype())?;
    require_float(OP, out.dtype())?;
    check_len(OP, "x", x, spec.m * spec.k)?;
    check_len(OP, "out", out, spec.m * spec.n)
}

/// Checks the arguments of [`QuantOps::dequantize`] (every backend calls this).
pub fn check_dequantize<B: BufferInfo>(w: [&B; 3], out: &B, spec: QuantSpec) -> Result<()> {
    const OP: &str = "dequantize";
    let spec = QuantSpec { m: 0, ..spec };
    check_weight(OP, w, &spec)?;
    require_float(OP, out.dtype())?;
    check_len(OP, "out", out, spec.n * spec.k)
}
