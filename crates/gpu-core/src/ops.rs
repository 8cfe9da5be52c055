//! [`MatmulOps`] and the argument checks every op family shares, so that the CPU reference and
//! the CUDA kernels reject exactly the same inputs.

use crate::backend::{Backend, BufferInfo};
use crate::dtype::DType;
use crate::error::{GpuError, Result};

/// A row-major (batched) matrix product `C[b] = op(A[b]) · op(B[b])`.
///
/// `C[b]` is `m × n`. `A[b]` is stored `m × k`, or `k × m` when `trans_a` (then `op(A) = Aᵀ`);
/// `B[b]` is stored `k × n`, or `n × k` when `trans_b`. Batches are contiguous.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatmulSpec {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub trans_a: bool,
    pub trans_b: bool,
}

impl MatmulSpec {
    /// A single, untransposed `m × k` by `k × n` product.
    pub fn new(m: usize, n: usize, k: usize) -> Self {
        Self {
            batch: 1,
            m,
            n,
            k,
            trans_a: false,
            trans_b: false,
        }
    }

    /// Floating-point operations of the product (2·batch·m·n·k).
    pub fn flops(&self) -> f64 {
        2.0 * self.batch as f64 * self.m as f64 * self.n as f64 * self.k as f64
    }

    /// Checks the buffer lengths against the spec.
    pub fn validate(
        &self,
        a: &impl BufferInfo,
        b: &impl BufferInfo,
        c: &impl BufferInfo,
    ) -> Result<()> {
        check_matmul_dtypes(a.dtype(), b.dtype(), c.dtype())?;
        let len = |x: usize, y: usize| {
            self.batch
                .checked_mul(x)
                .and_then(|v| v.checked_mul(y))
                .ok_or_else(|| GpuError::InvalidShape {
                    op: "matmul",
                    reason: format!("{self:?} overflows usize"),
                })
        };
        let (ea, eb, ec) = (
            len(self.m, self.k)?,
            len(self.k, self.n)?,
            len(self.m, self.n)?,
        );
        for (name, want, got) in [("A", ea, a.len()), ("B", eb, b.len()), ("C", ec, c.len())] {
            check_count("matmul", name, got, want)?;
        }
        Ok(())
    }
}

/// An invalid-argument error (`op`'s: "`what` must be finite and >= 0, got `v`") unless `v` is
/// finite and `>= 0`: learning rates, weight decays, standard deviations, epsilons.
pub fn require_nonneg(op: &'static str, what: impl std::fmt::Display, v: f32) -> Result<()> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(GpuError::invalid(
            op,
            format!("{what} must be finite and >= 0, got {v}"),
        ))
    }
}

/// [`require_f32`] and the length check of entry `i` of the buffer list `name` (the error
/// names it `name[i]`).
pub fn require_f32_entry<T: BufferInfo + ?Sized>(
    op: &'static str,
    (name, i): (&str, usize),
    b: &T,
    want: usize,
) -> Result<()> {
    require_f32(op, b.dtype())?;
    check_count(op, &format!("{name}[{i}]"), b.len(), want)
}

/// A shape error (`op`'s, "`what` of `want` elements") unless `got == want`: the length check
/// of every buffer argument.
pub fn check_count(op: &'static str, what: &str, got: usize, want: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(GpuError::shape(
            op,
            format!("{what} of {want} elements"),
            got,
        ))
    }
}

/// Errors unless `dtype` is f32 (the kernels of this release are f32).
pub fn require_f32(op: &'static str, dtype: DType) -> Result<()> {
    if dtype == DType::F32 {
        Ok(())
    } else {
        Err(GpuError::UnsupportedDType {
            op,
            dtype,
            backend: "this release (f32 kernels only)",
        })
    }
}

/// The float dtypes the elementwise, reduction, data-movement and matmul families take: f32, and
/// bf16 for mixed precision (computed in f32, rounded once to bf16 at the output).
pub fn require_float(op: &'static str, dtype: DType) -> Result<()> {
    match dtype {
        DType::F32 | DType::BF16 => Ok(()),
        _ => Err(GpuError::UnsupportedDType {
            op,
            dtype,
            backend: "this op (f32 and bf16 only)",
        }),
    }
}

/// The dtypes of a matmul: A and B both f32 (C f32), or both bf16 (C bf16 or f32: the f32
/// accumulator rounded once, or not at all).
pub fn check_matmul_dtypes(a: DType, b: DType, c: DType) -> Result<()> {
    const OP: &str = "matmul";
    require_float(OP, a)?;
    if b != a {
        return Err(GpuError::DTypeMismatch {
            op: OP,
            expected: a,
            got: b,
        });
    }
    if c != a && c != DType::F32 {
        return Err(GpuError::DTypeMismatch {
            op: OP,
            expected: a,
            got: c,
        });
    }
    Ok(())
}

/// Checks the operands of an elementwise op that runs in f32 or bf16: one float dtype for
/// every buffer and the same length; returns the dtype.
pub fn check_float_elementwise(
    op: &'static str,
    inputs: &[&dyn BufferInfoDyn],
    out: &dyn BufferInfoDyn,
) -> Result<DType> {
    let dtype = out.dtype_dyn();
    require_float(op, dtype)?;
    for x in inputs {
        require_float(op, x.dtype_dyn())?;
        same_dtype(op, dtype, x.dtype_dyn())?;
        if x.len_dyn() != out.len_dyn() {
            return Err(GpuError::shape(op, out.len_dyn(), x.len_dyn()));
        }
    }
    Ok(dtype)
}

/// Errors unless `got` is `want`.
pub fn same_dtype(op: &'static str, want: DType, got: DType) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(GpuError::DTypeMismatch {
            op,
            expected: want,
            got,
        })
    }
}

/// Checks operands of an elementwise op: same dtype (f32) and the same length.
pub fn check_elementwise(
    op: &'static str,
    inputs: &[&dyn BufferInfoDyn],
    out: &dyn BufferInfoDyn,
) -> Result<()> {
    require_f32(op, out.dtype_dyn())?;
    for x in inputs {
        require_f32(op, x.dtype_dyn())?;
        if x.len_dyn() != out.len_dyn() {
            return Err(GpuError::shape(op, out.len_dyn(), x.len_dyn()));
        }
    }
    Ok(())
}

/// Checks a row-wise op over `cols`-wide rows; returns the number of rows.
pub fn check_rows(
    op: &'static str,
    x: &dyn BufferInfoDyn,
    out: &dyn BufferInfoDyn,
    cols: usize,
) -> Result<usize> {
    check_elementwise(op, &[x], out)?;
    if cols == 0 {
        return Err(GpuError::InvalidShape {
            op,
            reason: "rows must have at least one column".into(),
        });
    }
    whole_rows(op, x.len_dyn(), cols, || {
        format!("a multiple of {cols} elements")
    })
}

/// `len / width` (`width > 0`), or a shape error (`op`'s, expecting `want()`) when `len` is not
/// a multiple of `width`: the row count of every row-wise op.
pub fn whole_rows(
    op: &'static str,
    len: usize,
    width: usize,
    want: impl FnOnce() -> String,
) -> Result<usize> {
    if len.is_multiple_of(width) {
        Ok(len / width)
    } else {
        Err(GpuError::shape(op, want(), len))
    }
}

/// Object-safe view of [`BufferInfo`], so checks can take buffers of any backend.
pub trait BufferInfoDyn {
    fn len_dyn(&self) -> usize;
    fn dtype_dyn(&self) -> DType;
}

impl<B: BufferInfo> BufferInfoDyn for B {
    fn len_dyn(&self) -> usize {
        self.len()
    }
    fn dtype_dyn(&self) -> DType {
        self.dtype()
    }
}

/// Matrix products: what the demo, the benchmarks and every linear layer need. The CPU backend
/// runs the `gemm` crate's SGEMM, CUDA runs cuBLAS.
pub trait MatmulOps: Backend {
    /// `c = op(a)·op(b)` for each batch, row-major, per [`MatmulSpec`]; `c` is overwritten.
    fn matmul(
        &self,
        spec: MatmulSpec,
        a: &Self::Buffer,
        b: &Self::Buffer,
        c: &mut Self::Buffer,
    ) -> Result<()>;
}
