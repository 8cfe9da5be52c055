//! [`KernelOps`]: the compute operations every backend implements, and the argument checks they
//! share so that the CPU reference and the CUDA kernels reject exactly the same inputs.

use crate::backend::{Backend, BufferInfo};
use crate::dtype::DType;
use crate::error::{GpuError, Result};

/// Elementwise functions of one operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnaryOp {
    Relu,
    Sigmoid,
    Tanh,
}

impl UnaryOp {
    /// Name used in kernel names (`relu_f32`).
    pub const fn name(self) -> &'static str {
        match self {
            UnaryOp::Relu => "relu",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Tanh => "tanh",
        }
    }

    /// The scalar function, evaluated in f64 (the CPU reference).
    pub fn eval(self, x: f64) -> f64 {
        match self {
            // max(x, 0) but NaN stays NaN, as in PyTorch.
            UnaryOp::Relu => {
                if x < 0.0 {
                    0.0
                } else {
                    x
                }
            }
            UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            UnaryOp::Tanh => x.tanh(),
        }
    }
}

/// Elementwise functions of two operands of the same length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Mul,
}

impl BinaryOp {
    /// Name used in kernel names (`add_f32`).
    pub const fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Mul => "mul",
        }
    }

    /// The scalar function in f32 (exactly what the kernels compute).
    pub fn eval(self, a: f32, b: f32) -> f32 {
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Mul => a * b,
        }
    }
}

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
        for buf in [a.dtype(), b.dtype(), c.dtype()] {
            require_f32("matmul", buf)?;
        }
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
            if want != got {
                return Err(GpuError::shape(
                    "matmul",
                    format!("{name} of {want} elements"),
                    got,
                ));
            }
        }
        Ok(())
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
    if !x.len_dyn().is_multiple_of(cols) {
        return Err(GpuError::shape(
            op,
            format!("a multiple of {cols} elements"),
            x.len_dyn(),
        ));
    }
    Ok(x.len_dyn() / cols)
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

/// The compute operations of the HAL. The CPU backend's implementation is the reference that
/// every other backend is tested against.
pub trait KernelOps: Backend {
    /// Sets every element of `buf` to `value` (used to poison outputs before a launch).
    fn fill(&self, buf: &mut Self::Buffer, value: f32) -> Result<()>;
    /// `out = a + b`, one thread per element (seed B's vector add).
    fn vector_add(&self, a: &Self::Buffer, b: &Self::Buffer, out: &mut Self::Buffer) -> Result<()>;
    /// `out = a ∘ b` elementwise.
    fn binary(
        &self,
        op: BinaryOp,
        a: &Self::Buffer,
        b: &Self::Buffer,
        out: &mut Self::Buffer,
    ) -> Result<()>;
    /// `out = f(x)` elementwise.
    fn unary(&self, op: UnaryOp, x: &Self::Buffer, out: &mut Self::Buffer) -> Result<()>;
    /// Softmax over each `cols`-wide row.
    fn softmax_rows(&self, x: &Self::Buffer, out: &mut Self::Buffer, cols: usize) -> Result<()>;
    /// LayerNorm over each `cols`-wide row: `(x − mean) / sqrt(var + eps) · gamma + beta`,
    /// with the biased variance (as PyTorch).
    fn layernorm_rows(
        &self,
        x: &Self::Buffer,
        gamma: &Self::Buffer,
        beta: &Self::Buffer,
        out: &mut Self::Buffer,
        cols: usize,
        eps: f32,
    ) -> Result<()>;
    /// Row-major (batched) matrix product; see [`MatmulSpec`].
    fn matmul(
        &self,
        spec: MatmulSpec,
        a: &Self::Buffer,
        b: &Self::Buffer,
        c: &mut Self::Buffer,
    ) -> Result<()>;
}

/// Checks LayerNorm's arguments; returns the number of rows.
pub fn check_layernorm(
    x: &dyn BufferInfoDyn,
    gamma: &dyn BufferInfoDyn,
    beta: &dyn BufferInfoDyn,
    out: &dyn BufferInfoDyn,
    cols: usize,
    eps: f32,
) -> Result<usize> {
    let rows = check_rows("layernorm", x, out, cols)?;
    for (name, p) in [("gamma", gamma), ("beta", beta)] {
        require_f32("layernorm", p.dtype_dyn())?;
        if p.len_dyn() != cols {
            return Err(GpuError::shape(
                "layernorm",
                format!("{name} of {cols}"),
                p.len_dyn(),
            ));
        }
    }
    if !(eps.is_finite() && eps > 0.0) {
        return Err(GpuError::invalid(
            "layernorm",
            format!("eps must be finite and > 0, got {eps}"),
        ));
    }
    Ok(rows)
}
