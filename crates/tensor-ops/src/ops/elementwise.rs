//! Broadcasting arithmetic, scalar ops, activations and dropout.

use super::{checked_numel, compute};
use crate::ops::buf;
use crate::tensor::{same_device, same_float, Tensor};
use gpu_core::nn::elementwise::broadcast_shape;
use gpu_core::nn::Primitives;
use gpu_core::nn::{Activation, BinaryKind, ElementwiseOps, Saved};
use gpu_core::{DType, Device, GpuError, Result};

/// One `Tensor` method per activation, each `self.activation(Activation::$kind)` (a function
/// cannot declare methods by name).
macro_rules! activation_methods {
    ($($(#[$doc:meta])* $name:ident => $kind:ident,)*) => {
        $(
            $(#[$doc])*
            pub fn $name(&self) -> Result<Tensor> {
                self.activation(Activation::$kind)
            }
        )*
    };
}

fn binary(a: &Tensor, b: &Tensor, op: BinaryKind, name: &'static str) -> Result<Tensor> {
    let dev = same_device(name, &[a, b])?;
    let float = |d: DType| matches!(d, DType::F32 | DType::BF16);
    if a.dtype() != b.dtype() && float(a.dtype()) && float(b.dtype()) {
        // Type promotion: f32 with bf16 computes in f32 (the bf16 operand widens exactly).
        let wide = |t: &Tensor| t.to_dtype(DType::F32);
        return binary(&wide(a)?, &wide(b)?, op, name);
    }
    let dtype = same_float(name, &[a, b])?;
    let shape = broadcast_shape(a.shape(), b.shape()).ok_or_else(|| {
        GpuError::shape(
            name,
            format!("{:?}", a.shape()),
            format!("{:?} (not broadcastable)", b.shape()),
        )
    })?;
    let len = checked_numel(name, &shape)?;
    let (ga, gb) = (a.read(), b.read());
    let st = compute!(dev, dtype, len, |be, out| be.broadcast_binary(
        op,
        buf(be, &ga)?,
        a.shape(),
        buf(be, &gb)?,
        b.shape(),
        &mut out
    ));
    drop((ga, gb));
    let (ac, bc) = (a.clone(), b.clone());
    Ok(Tensor::from_op(
        st,
        shape,
        dev,
        name,
        &[a, b],
        move |_, g| {
            let (da, db) = match op {
                BinaryKind::Add => (g.clone(), g.clone()),
                BinaryKind::Sub => (g.clone(), g.neg()?),
                BinaryKind::Mul => (g.mul(&bc)?, g.mul(&ac)?),
                BinaryKind::Div => {
                    // d/da = g/b; d/db = −g·a/b²
                    let gb = g.div(&bc)?;
                    (gb.clone(), gb.mul(&ac)?.div(&bc)?.neg()?)
                }
            };
            Ok(vec![
                Some(da.sum_to(ac.shape())?),
                Some(db.sum_to(bc.shape())?),
            ])
        },
    ))
}

impl Tensor {
    /// `self + other`, broadcasting.
    pub fn add(&self, other: &Tensor) -> Result<Tensor> {
        binary(self, other, BinaryKind::Add, "add")
    }

    /// `self − other`, broadcasting.
    pub fn sub(&self, other: &Tensor) -> Result<Tensor> {
        binary(self, other, BinaryKind::Sub, "sub")
    }

    /// `self ∘ other`, broadcasting.
    pub fn mul(&self, other: &Tensor) -> Result<Tensor> {
        binary(self, other, BinaryKind::Mul, "mul")
    }

    /// `self / other`, broadcasting.
    pub fn div(&self, other: &Tensor) -> Result<Tensor> {
        binary(self, other, BinaryKind::Div, "div")
    }

    /// The elements converted to `dtype` (f32 or bf16): to bf16 they round to nearest even
    /// (NaN stays NaN, overflow goes to ±inf), to f32 they widen exactly. The gradient is cast
    /// back to this tensor's dtype (mixed precision's f32 master weights get f32 gradients).
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        let from = same_float("to_dtype", &[self])?;
        gpu_core::ops::require_float("to_dtype", dtype)?;
        if from == dtype {
            return Ok(self.clone());
        }
        let dev = self.device();
        let g = self.read();
        let st = compute!(dev, dtype, self.numel(), |be, out| be
            .cast(buf(be, &g)?, &mut out));
        drop(g);
        Ok(Tensor::from_op(
            st,
            self.shape().to_vec(),
            dev,
            "to_dtype",
            &[self],
            move |_, g| Ok(vec![Some(g.to_dtype(from)?)]),
        ))
    }

    /// `mul·self + add`.
    pub fn affine(&self, mul: f32, add: f32) -> Result<Tensor> {
        let dtype = same_float("affine", &[self])?;
        let dev = self.device();
        let g = self.read();
        let st = compute!(dev, dtype, self.numel(), |be, out| be.affine(
            buf(be, &g)?,
            mul,
            add,
            &mut out
        ));
        drop(g);
        Ok(Tensor::from_op(
            st,
            self.shape().to_vec(),
            dev,
            "affine",
            &[self],
            move |_, g| Ok(vec![Some(g.affine(mul, 0.0)?)]),
        ))
    }

    /// `self + s`.
    pub fn add_scalar(&self, s: f32) -> Result<Tensor> {
        self.affine(1.0, s)
    }

    /// `self · s`.
    pub fn mul_scalar(&self, s: f32) -> Result<Tensor> {
        self.affine(s, 0.0)
    }

    /// `−self`.
    pub fn neg(&self) -> Result<Tensor> {
        self.affine(-1.0, 0.0)
    }

    /// A pointwise activation.
    pub fn activation(&self, op: Activation) -> Result<Tensor> {
        let dtype = same_float("activation", &[self])?;
        let dev = self.device();
        let g = self.read();
        let st = compute!(dev, dtype, self.numel(), |be, out| be.activation_fwd(
            op,
            buf(be, &g)?,
            &mut out
        ));
        drop(g);
        // The backward keeps only what the op's definition says it reads (the output is kept
        // by the graph anyway); for output-saving ops the kernel ignores its `x` argument.
        let x = match op.saves() {
            Saved::Input => Some(self.clone()),
            Saved::Output => None,
        };
        let shape = self.shape().to_vec();
        Ok(Tensor::from_op(
            st,
            self.shape().to_vec(),
            dev,
            op.name(),
            &[self],
            move |y, g| {
                let x = x.as_ref().unwrap_or(y);
                let (gx, gy, gg) = (x.read(), y.read(), g.read());
                let st = compute!(dev, dtype, x.numel(), |be, dx| be.activation_bwd(
                    op,
                    buf(be, &gx)?,
                    buf(be, &gy)?,
                    buf(be, &gg)?,
                    &mut dx
                ));
                Ok(vec![Some(Tensor::from_storage(st, shape.clone(), dev))])
            },
        ))
    }

    activation_methods! {
        /// ReLU.
        relu => Relu,
        /// Exact (erf) GELU.
        gelu => Gelu,
        /// SiLU (swish).
        silu => Silu,
        /// Logistic sigmoid.
        sigmoid => Sigmoid,
        /// tanh.
        tanh => Tanh,
        /// eˣ.
        exp => Exp,
        /// Natural log.
        log => Log,
    }

    /// SwiGLU: `silu(self) ∘ up`.
    pub fn swiglu(&self, up: &Tensor) -> Result<Tensor> {
        self.silu()?.mul(up)
    }

    /// Inverted dropout with probability `p`, reproducible from `seed`; identity when
    /// `!training` or `p == 0`.
    pub fn dropout(&self, p: f32, seed: u64, training: bool) -> Result<Tensor> {
        if !(0.0..1.0).contains(&p) {
            return Err(GpuError::invalid(
                "dropout",
                format!("p must be in [0, 1), got {p}"),
            ));
        }
        if !training {
            return Ok(self.clone());
        }
        if p != 0.0 {
            same_float("dropout", &[self])?;
        }
        let dev = self.device();
        // Under `graph::with_dropout_offsets` the seed is completed on the device (every
        // training-mode op takes its entry, also at p = 0, so the k-th op is the k-th entry;
        // the last check, so that a refused op takes none).
        let offset = crate::graph::next_dropout_offset(dev)?;
        if p == 0.0 {
            return Ok(self.clone());
        }
        let g = self.read();
        let st = dropout_storage(dev, &g, self.numel(), p, seed, offset.as_ref())?;
        drop(g);
        Ok(Tensor::from_op(
            st,
            self.shape().to_vec(),
            dev,
            "dropout",
            &[self],
            move |_, g| {
                let gg = g.read();
                let st = dropout_storage(dev, &gg, g.numel(), p, seed, offset.as_ref())?;
                Ok(vec![Some(Tensor::from_storage(
                    st,
                    g.shape().to_vec(),
                    dev,
                ))])
            },
        ))
    }
}

/// `x`'s dropout (`n` elements) with `seed`, or on CUDA with `seed + offsets[k]` read on the
/// device.
fn dropout_storage(
    dev: Device,
    x: &crate::storage::Storage,
    n: usize,
    p: f32,
    seed: u64,
    offset: Option<&(Tensor, usize)>,
) -> Result<crate::storage::Storage> {
    match (offset, dev) {
        (None, _) => Ok(compute!(dev, x.dtype(), n, |be, out| be.dropout(
            buf(be, x)?,
            p,
            seed,
            &mut out
        ))),
        (Some((o, k)), Device::Cuda(_)) => {
            let og = o.read();
            Ok(compute!(dev, x.dtype(), n, |be, out| be.dropout_offset(
                buf(be, x)?,
                p,
                seed,
                (buf(be, &og)?, *k),
                &mut out
            )))
        }
        (Some(_), Device::Cpu) => Err(GpuError::invalid(
            "dropout",
            "a device seed offset needs a CUDA tensor",
        )),
        // Device seed offsets serve CUDA graphs (`graph::with_dropout_offsets`), which take CUDA
        // offsets only.
        (Some(_), d @ Device::Wgpu(_)) => Err(GpuError::not_implemented(
            d,
            "dropout with device seed offsets (CUDA graphs)",
        )),
    }
}
