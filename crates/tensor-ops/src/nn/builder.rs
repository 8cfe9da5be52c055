//! [`ParamBuilder`]: registers parameters in a [`ParamStore`] under a dotted prefix.

use super::init::Init;
use super::store::ParamStore;
use crate::{Device, Result, Tensor};

/// A view of a [`ParamStore`] under a name prefix: `store.pp("encoder").pp(0)` registers
/// `encoder.0.weight` for `get("weight", ..)`. Cheap to clone; layers' constructors take one by
/// value (`Linear::new(store.pp("fc"), 4, 3, true)`), or it builds them (`store.pp("fc")
/// .linear(4, 3, true)`). Names are checked at registration: an empty segment (`pp("")`) or a
/// name registered twice is an error.
#[derive(Clone)]
pub struct ParamBuilder<'a> {
    store: &'a ParamStore,
    /// The prefix's segments (an empty one makes every name under it invalid).
    segments: Vec<String>,
    /// The segments joined by dots.
    prefix: String,
}

impl<'a> ParamBuilder<'a> {
    pub(crate) fn root(store: &'a ParamStore) -> Self {
        Self {
            store,
            segments: Vec::new(),
            prefix: String::new(),
        }
    }

    /// This builder's prefix extended by `.name` (or `name` at the root).
    pub fn pp(&self, name: impl ToString) -> ParamBuilder<'a> {
        let mut segments = self.segments.clone();
        segments.push(name.to_string());
        ParamBuilder {
            store: self.store,
            prefix: segments.join("."),
            segments,
        }
    }

    /// The prefix (empty at the root).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The store's device.
    pub fn device(&self) -> Device {
        self.store.device()
    }

    /// The store.
    pub fn store(&self) -> &'a ParamStore {
        self.store
    }

    fn full_name(&self, name: &str) -> String {
        if self.segments.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        }
    }

    /// Registers `prefix.name` of `shape`, initialised by `init`, weight-decayed when it has
    /// two or more dims (nanoGPT's rule: matrices and embeddings decay, vectors do not).
    pub fn get(&self, name: &str, shape: &[usize], init: Init) -> Result<Tensor> {
        self.get_with_decay(name, shape, init, shape.len() >= 2)
    }

    /// [`ParamBuilder::get`] with the decay flag given.
    pub fn get_with_decay(
        &self,
        name: &str,
        shape: &[usize],
        init: Init,
        decay: bool,
    ) -> Result<Tensor> {
        self.store
            .register(self.full_name(name), shape, init, decay)
    }
}
