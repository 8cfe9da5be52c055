//! The module layer: layers that own their parameters, and the [`ParamStore`] that holds every
//! parameter of a model by name.
//!
//! A model registers its parameters through a [`ParamBuilder`] with dotted prefixes, as
//! `store.pp("encoder").linear(64, 32, true)` (which registers `encoder.weight` and
//! `encoder.bias`); each layer keeps its tensors and runs [`Module::forward`] without name
//! lookups. The store initialises parameters from one seeded generator in registration order,
//! hands AdamW its parameters with their weight-decay flags ([`ParamStore::adamw`]), takes
//! device-side [`Snapshot`]s and restores them in place, and saves and loads safetensors files
//! with every name, shape and dtype checked.
//!
//! Dropout is the only layer whose forward depends on training: layers implement [`ModuleT`]
//! and take a [`Mode`], which in training carries the seed of the dropout masks. Every
//! [`Module`] is a [`ModuleT`] that ignores the mode.

mod builder;
mod copy;
mod gru;
mod init;
pub(crate) mod io;
mod layers;
mod store;

pub use builder::ParamBuilder;
pub use gru::GruCell;
pub use init::Init;
pub use io::{check_offsets, describe_safetensors_error, read_metadata};
pub use layers::{Dropout, Embedding, LayerNorm, Linear, RmsNorm};
pub use store::{Param, ParamStore, Snapshot};

use crate::{Result, Tensor};

/// A layer with one input whose forward does not depend on training or evaluation.
pub trait Module {
    /// The layer applied to `x`.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;
}

/// A layer whose forward may depend on the [`Mode`] (dropout).
pub trait ModuleT {
    /// The layer applied to `x` in `mode`.
    fn forward_t(&self, x: &Tensor, mode: Mode) -> Result<Tensor>;
}

impl<M: Module + ?Sized> ModuleT for M {
    fn forward_t(&self, x: &Tensor, _mode: Mode) -> Result<Tensor> {
        self.forward(x)
    }
}

/// Training or evaluation. In training, `seed` fixes every dropout mask of the call, so a
/// forward pass is reproducible from its seed (a trainer passes one per step).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Evaluation: dropout is the identity.
    Eval,
    /// Training with the masks drawn from `seed`.
    Train { seed: u64 },
}

impl Mode {
    /// Training with masks drawn from `seed`.
    pub fn train(seed: u64) -> Mode {
        Mode::Train { seed }
    }

    /// Whether this is training.
    pub fn is_train(self) -> bool {
        matches!(self, Mode::Train { .. })
    }

    /// The mode of the `site`-th random layer under this one: evaluation stays evaluation; in
    /// training, a seed mixed from this seed and `site` (SplitMix64), so two dropout layers of
    /// one model given `fork(0)` and `fork(1)` draw independent masks.
    pub fn fork(self, site: u64) -> Mode {
        match self {
            Mode::Eval => Mode::Eval,
            Mode::Train { seed } => {
                let mut z = seed ^ site.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                Mode::Train {
                    seed: z ^ (z >> 31),
                }
            }
        }
    }
}
