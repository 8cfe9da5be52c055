//! Weight-only quantized linear layers (`gpu_core::nn::quant`): a [`QuantWeight`] holds an
//! int8 or int4 `[n, k]` weight as three device tensors, and [`Tensor::matmul_quant`]
//! multiplies by it (`x·deq(W)ᵀ`, what a Linear layer computes). Inference only: the outputs
//! carry no gradient. `models::quant` packs its `Quantized` weights into one.

use crate::ops::{buf, compute, numel};
use crate::tensor::{same_device, Tensor};
use gpu_core::nn::quant::{QuantFormat, QuantOps, QuantSpec};
use gpu_core::{DType, Device, GpuError, Result};

/// A quantized `[n, k]` weight on one device: `data` u32 `[n, k/4]` (int8) or `[n, k/8]`
/// (int4), `scales` f32 `[n]` or `[n, ⌈k/128⌉]`, `mins` f32 `[n, ⌈k/128⌉]` (int4) or `[0]`
/// (int8); the layout of `gpu_core::nn::quant`.
#[derive(Debug, Clone)]
pub struct QuantWeight {
    data: Tensor,
    scales: Tensor,
    mins: Tensor,
    /// The weight's format and `n × k` ([`QuantSpec::weight`], `m = 0`).
    spec: QuantSpec,
}

impl QuantWeight {
    /// Takes the three tensors of an `n × k` weight in `format`; their dtypes, shapes and
    /// device are checked here (the values are not).
    pub fn new(
        data: Tensor,
        scales: Tensor,
        mins: Tensor,
        format: QuantFormat,
        n: usize,
        k: usize,
    ) -> Result<Self> {
        const OP: &str = "QuantWeight::new";
        same_device(OP, &[&data, &scales, &mins])?;
        let spec = QuantSpec::weight(format, n, k);
        spec.check(OP)?;
        let groups = format.groups_per_row(k);
        let want: [(&str, &Tensor, DType, Vec<usize>); 3] = [
            ("data", &data, DType::U32, vec![n, spec.words_per_row()]),
            (
                "scales",
                &scales,
                DType::F32,
                match format {
                    QuantFormat::Int8 => vec![n],
                    QuantFormat::Int4 => vec![n, groups],
                    QuantFormat::F16 => vec![0],
                },
            ),
            (
                "mins",
                &mins,
                DType::F32,
                match format {
                    QuantFormat::Int8 | QuantFormat::F16 => vec![0],
                    QuantFormat::Int4 => vec![n, groups],
                },
            ),
        ];
        for (name, t, dtype, shape) in want {
            if t.dtype() != dtype {
                return Err(GpuError::DTypeMismatch {
                    op: OP,
                    expected: dtype,
                    got: t.dtype(),
                });
            }
            if t.shape() != shape.as_slice() {
                return Err(GpuError::shape(
                    OP,
                    format!("{name} of shape {shape:?}"),
                    format!("{:?}", t.shape()),
                ));
            }
        }
        Ok(Self {
            data,
            scales,
            mins,
            spec,
        })
    }

    /// The format.
    pub fn format(&self) -> QuantFormat {
        self.spec.format
    }

    /// Output rows `n`.
    pub fn n(&self) -> usize {
        self.spec.n
    }

    /// Inputs a row `k`.
    pub fn k(&self) -> usize {
        self.spec.k
    }

    /// The device the tensors live on.
    pub fn device(&self) -> Device {
        self.data.device()
    }

    /// The packed words, the scales and the minimums.
    pub fn parts(&self) -> [&Tensor; 3] {
        [&self.data, &self.scales, &self.mins]
    }

    /// The spec of a product by `m` rows.
    fn spec(&self, m: usize) -> QuantSpec {
        QuantSpec { m, ..self.spec }
    }

    /// `deq(W)` `[n, k]` in `dtype` (f32, or bf16 rounded once), as `QuantOps::dequantize`.
    pub fn dequantize(&self, dtype: DType) -> Result<Tensor> {
        let dev = self.device();
        let (d, s, m) = (self.data.read(), self.scales.read(), self.mins.read());
        let spec = self.spec(0);
        let st = compute!(dev, dtype, spec.n * spec.k, |be, out| be.dequantize(
            [buf(be, &d)?, buf(be, &s)?, buf(be, &m)?],
            &mut out,
            spec
        ));
        Ok(Tensor::from_storage(st, vec![spec.n, spec.k], dev))
    }
}

impl Tensor {
    /// `self · deq(w)ᵀ` for `self` `[.., k]` (f32 or bf16; the leading dims are the rows `m`)
    /// and a quantized `[n, k]` weight: `[.., n]` in `self`'s dtype (`QuantOps::matmul_quant`;
    /// on CUDA a fused kernel for `m <= 4`, dequantize-then-GEMM above). No gradient.
    pub fn matmul_quant(&self, w: &QuantWeight) -> Result<Tensor> {
        const OP: &str = "matmul_quant";
        let dev = same_device(OP, &[self, &w.data, &w.scales, &w.mins])?;
        let Some((&k, lead)) = self.shape().split_last() else {
            return Err(GpuError::shape(OP, "x of rank >= 1", "a scalar"));
        };
        if k != w.k() {
            return Err(GpuError::shape(
                OP,
                format!("x rows of {} inputs", w.k()),
                k,
            ));
        }
        let spec = w.spec(numel(lead));
        let mut shape = lead.to_vec();
        shape.push(w.n());
        let dtype = self.dtype();
        let (x, d, s, m) = (self.read(), w.data.read(), w.scales.read(), w.mins.read());
        let st = compute!(dev, dtype, spec.m * spec.n, |be, out| be.matmul_quant(
            buf(be, &x)?,
            [buf(be, &d)?, buf(be, &s)?, buf(be, &m)?],
            &mut out,
            spec
        ));
        Ok(Tensor::from_storage(st, shape, dev))
    }
}
