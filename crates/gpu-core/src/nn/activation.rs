//! The activation vocabulary: every pointwise activation is defined once, in the
//! `activations!` list below, with its name, what its backward reads, and its f64 forward and
//! backward formulas. Everything else derives from that entry:
//! - the CPU reference (`cpu/elementwise.rs`) evaluates [`Activation::eval`] and
//!   [`Activation::backward`];
//! - the CUDA kernels are `act_fwd_{name}_f32` and `act_bwd_{name}_f32`
//!   ([`Activation::kernel`]), instantiated in `kernels/nn_elementwise.cu` for every entry of the
//!   generated `kernels/nn_activations.cuh` (`cargo xtask build-ptx` writes it from
//!   [`Activation::ALL`]; the .cu holds the f32 device formulas and fails to compile when an
//!   entry has none);
//! - the tensor op is `Tensor::activation(op)` (`tensor-ops`), whose backward keeps what
//!   [`Activation::saves`] says.
//!
//! Adding an activation: one entry here, its device formulas in `kernels/nn_elementwise.cu`, and
//! (optionally) a named method in `tensor-ops/src/ops/elementwise.rs`; then `cargo xtask
//! build-ptx` regenerates the header, PTX, fatbins and manifest.

/// Which forward tensor an activation's backward reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Saved {
    /// The input `x`.
    Input,
    /// The output `y = f(x)`.
    Output,
}

/// Kernel direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Forward,
    Backward,
}

macro_rules! activations {
    ($(
        $(#[$doc:meta])*
        $variant:ident = $name:literal, saves $saves:ident,
            fwd |$x:ident| $fwd:expr,
            bwd |$bx:ident, $by:ident, $dy:ident| $bwd:expr;
    )*) => {
        /// Pointwise activations and functions, with their derivatives.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Activation {
            $( $(#[$doc])* $variant, )*
        }

        impl Activation {
            /// Every activation, in declaration order.
            pub const ALL: &'static [Activation] = &[$(Activation::$variant),*];

            /// The op's name: the tensor op's and the `{name}` of its kernels.
            pub const fn name(self) -> &'static str {
                match self { $(Activation::$variant => $name,)* }
            }

            /// What the backward reads besides `dy`.
            pub const fn saves(self) -> Saved {
                match self { $(Activation::$variant => Saved::$saves,)* }
            }

            /// `f(x)` in f64: the CPU reference.
            pub fn eval(self, x: f64) -> f64 {
                match self { $(Activation::$variant => { let $x = x; $fwd })* }
            }

            /// `dx` from `x`, `y = f(x)` and `dy`, in f64: the CPU reference of the backward.
            #[allow(unused_variables)]
            pub fn backward(self, x: f64, y: f64, dy: f64) -> f64 {
                match self {
                    $(Activation::$variant => { let ($bx, $by, $dy) = (x, y, dy); $bwd })*
                }
            }
        }
    };
}

activations! {
    /// `max(x, 0)`; NaN stays NaN. Its backward is a select (`x > 0 ? dy : 0`), so a NaN or
    /// inf `dy` where `x <= 0` gives 0, as in PyTorch.
    Relu = "relu", saves Input,
        fwd |x| if x < 0.0 { 0.0 } else { x },
        bwd |x, y, dy| if x > 0.0 { dy } else { 0.0 };
    /// Exact GELU, `x·Φ(x)` with `Φ(x) = erfc(−x/√2)/2` (PyTorch's default); 0 at −inf.
    Gelu = "gelu", saves Input,
        fwd |x| if x == f64::NEG_INFINITY { 0.0 } else { x * normal_cdf(x) },
        bwd |x, y, dy| (normal_cdf(x) + times_tail(x, normal_pdf(x))) * dy;
    /// `x·sigmoid(x)`; 0 at −inf.
    Silu = "silu", saves Input,
        fwd |x| if x == f64::NEG_INFINITY { 0.0 } else { x * sigmoid(x) },
        bwd |x, y, dy| {
            let s = sigmoid(x);
            (if x == f64::NEG_INFINITY { 0.0 } else { s * (1.0 + times_tail(x, 1.0 - s)) }) * dy
        };
    Sigmoid = "sigmoid", saves Output,
        fwd |x| sigmoid(x),
        bwd |x, y, dy| y * (1.0 - y) * dy;
    Tanh = "tanh", saves Output,
        fwd |x| x.tanh(),
        bwd |x, y, dy| (1.0 - y * y) * dy;
    Exp = "exp", saves Output,
        fwd |x| x.exp(),
        bwd |x, y, dy| y * dy;
    /// Natural log; `log(0) = -inf`, negative inputs give NaN.
    Log = "log", saves Input,
        fwd |x| x.ln(),
        bwd |x, y, dy| dy / x;
}

impl Activation {
    /// The kernel that runs this activation in `direction` on f32 data.
    pub fn kernel(self, direction: Direction) -> String {
        self.kernel_for(direction, crate::DType::F32)
    }

    /// The kernel that runs this activation in `direction` on `dtype` data (f32 or bf16).
    pub fn kernel_for(self, direction: Direction, dtype: crate::DType) -> String {
        let dir = match direction {
            Direction::Forward => "fwd",
            Direction::Backward => "bwd",
        };
        format!("act_{dir}_{}_{dtype}", self.name())
    }

    /// The `NAME` of the activation's constant in the generated CUDA header (`ACT_RELU`, ...).
    pub fn cuda_constant(self) -> String {
        format!("ACT_{}", self.name().to_ascii_uppercase())
    }
}

/// The standard normal CDF `Φ(x) = erfc(−x/√2)/2`, accurate in both tails.
fn normal_cdf(x: f64) -> f64 {
    0.5 * libm::erfc(-x * std::f64::consts::FRAC_1_SQRT_2)
}

/// The standard normal density `φ(x)`.
fn normal_pdf(x: f64) -> f64 {
    0.398_942_280_401_432_7 * (-0.5 * x * x).exp()
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `x·t` for a tail factor `t` that vanishes as |x| → ∞ (φ(x), 1 − sigmoid(x)): the product's
/// limit 0 where `t` is 0 (±inf·0 would be NaN).
fn times_tail(x: f64, t: f64) -> f64 {
    if t == 0.0 {
        0.0
    } else {
        x * t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_lowercase_identifiers() {
        let mut names: Vec<&str> = Activation::ALL.iter().map(|a| a.name()).collect();
        assert!(names
            .iter()
            .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')));
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Activation::ALL.len());
        assert_eq!(
            Activation::Gelu.kernel(Direction::Backward),
            "act_bwd_gelu_f32"
        );
        assert_eq!(Activation::Silu.cuda_constant(), "ACT_SILU");
    }

    #[test]
    fn limits_at_infinity() {
        for op in [Activation::Gelu, Activation::Silu] {
            assert_eq!(op.eval(f64::NEG_INFINITY), 0.0, "{op:?}(-inf)");
            assert_eq!(op.eval(f64::INFINITY), f64::INFINITY, "{op:?}(inf)");
            assert_eq!(
                op.backward(f64::INFINITY, f64::INFINITY, 1.0),
                1.0,
                "{op:?}'(inf)"
            );
            assert_eq!(
                op.backward(f64::NEG_INFINITY, 0.0, 1.0),
                0.0,
                "{op:?}'(-inf)"
            );
        }
        assert_eq!(Activation::Relu.backward(-1.0, 0.0, f64::NAN), 0.0);
        assert!(Activation::Relu.eval(f64::NAN).is_nan());
    }
}
