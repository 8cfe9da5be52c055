//! The crate's typed errors: [`RssmError`] for the world model, [`AcceleratorError`] for the
//! [`crate::GpuAccelerator`] entry points. Bad input is always one of these, never a panic or a
//! silent NaN.

use tensor_ops::{Device, GpuError};

/// What can go wrong building, training or running the world model.
#[derive(Debug, thiserror::Error)]
pub enum RssmError {
    /// A configuration value is out of range (the field and why).
    #[error("invalid RSSM config: {field}: {reason}")]
    InvalidConfig { field: &'static str, reason: String },
    /// The ensemble has no member.
    #[error("the ensemble is empty: it needs at least two members to expose a disagreement")]
    EmptyEnsemble,
    /// Predictions were asked of a model that has never been trained (its ensemble
    /// disagreement would be the spread of random initialisations, not an uncertainty).
    #[error("the ensemble is untrained: train it (or load trained weights) before predicting")]
    Untrained,
    /// A feature or target vector of the wrong width.
    #[error("{what}: expected width {expected}, got {got}")]
    FeatureWidth {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    /// An input of the wrong rank or shape (other than its last dim).
    #[error("{what}: expected {expected}, got shape {got:?}")]
    Shape {
        what: &'static str,
        expected: String,
        got: Vec<usize>,
    },
    /// A batch, sequence or rollout with no element.
    #[error("{what} is empty")]
    Empty { what: &'static str },
    /// NaN or Inf in an input, or a loss that became non-finite (the update is not applied).
    #[error("{what} holds NaN or Inf")]
    NonFinite { what: &'static str },
    /// An input on another device than the model's.
    #[error("{what} is on {got}, the model on {expected}")]
    DeviceMismatch {
        what: &'static str,
        expected: Device,
        got: Device,
    },
    /// Any other invalid argument (a learning rate, a step count, ...).
    #[error("{what}: {reason}")]
    InvalidArgument { what: &'static str, reason: String },
    /// An error of the tensor layer (allocation, a device failure, a checkpoint's layout).
    #[error(transparent)]
    Tensor(#[from] GpuError),
}

/// What can go wrong in a [`crate::GpuAccelerator`] entry point.
#[derive(Debug, thiserror::Error)]
pub enum AcceleratorError {
    /// An input on another device than the accelerator's.
    #[error("{entry}: {what} is on {got}, the accelerator on {expected}")]
    DeviceMismatch {
        entry: &'static str,
        what: &'static str,
        expected: Device,
        got: Device,
    },
    /// A model entry point of an accelerator that has no model (no ensemble at all).
    #[error("{entry}: the accelerator has no model (no ensemble): install one first")]
    NoModel { entry: &'static str },
    /// A truncation rank of zero or above `min(m, n)`.
    #[error("{entry}: rank {rank} is out of range: it must be in 1..={max} (min(m, n))")]
    Rank {
        entry: &'static str,
        rank: usize,
        max: usize,
    },
    /// An input of the wrong shape.
    #[error("{entry}: {what}: expected {expected}, got {got:?}")]
    Shape {
        entry: &'static str,
        what: &'static str,
        expected: String,
        got: Vec<usize>,
    },
    /// NaN or Inf in an input.
    #[error("{entry}: {what} holds NaN or Inf")]
    NonFinite {
        entry: &'static str,
        what: &'static str,
    },
    /// Any other invalid argument (an option out of range).
    #[error("{entry}: {reason}")]
    InvalidArgument { entry: &'static str, reason: String },
    /// The SVD iteration did not converge (not seen on finite input; reported, not hidden).
    #[error("{entry}: the SVD of a {rows}x{cols} matrix did not converge")]
    NoConvergence {
        entry: &'static str,
        rows: usize,
        cols: usize,
    },
    /// An error of the world model (wrong feature width, untrained ensemble, ...).
    #[error(transparent)]
    Model(#[from] RssmError),
    /// An error of the tensor layer.
    #[error(transparent)]
    Tensor(#[from] GpuError),
}

/// Shorthand for the model's results.
pub type Result<T, E = RssmError> = std::result::Result<T, E>;
