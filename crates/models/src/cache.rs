//! The key/value cache of a decoding run: per layer, the keys and values of every position
//! seen so far, `[batch, kv_heads, positions, head_dim]`, grown by each forward pass up to the
//! model's context.

use tensor_ops::Tensor;

use crate::error::ModelError;

/// One layer's keys and values.
#[derive(Default, Clone)]
pub struct LayerCache {
    kv: Option<(Tensor, Tensor)>,
}

impl LayerCache {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.kv.as_ref().map_or(0, |(k, _)| k.shape()[2])
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `k`, `v` `[b, kv, t, d]` and returns the whole keys and values.
    pub(crate) fn append(
        &mut self,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<(Tensor, Tensor), ModelError> {
        let (k, v) = match &self.kv {
            None => (k.clone(), v.clone()),
            Some((k0, v0)) => (Tensor::cat(&[k0, k], 2)?, Tensor::cat(&[v0, v], 2)?),
        };
        self.kv = Some((k.clone(), v.clone()));
        Ok((k, v))
    }
}

/// A run's cache: one [`LayerCache`] per layer, and the context it may not outgrow.
pub struct KvCache {
    pub(crate) layers: Vec<LayerCache>,
    /// Each row's left padding (slots), fixed by the first forward pass.
    pub(crate) pads: Vec<usize>,
    context: usize,
}

impl KvCache {
    /// An empty cache for `layers` layers and at most `context` positions.
    pub fn new(layers: usize, context: usize) -> Self {
        KvCache {
            layers: (0..layers).map(|_| LayerCache::default()).collect(),
            pads: Vec::new(),
            context,
        }
    }

    /// Positions held (the next token's position).
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, LayerCache::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most positions it may hold.
    pub fn context(&self) -> usize {
        self.context
    }

    /// Checks that `t` more positions fit; a refusal changes nothing.
    pub(crate) fn reserve(&self, t: usize) -> Result<(), ModelError> {
        let have = self.len();
        if t == 0 {
            return Err(ModelError::EmptyInput);
        }
        match have.checked_add(t) {
            Some(n) if n <= self.context => Ok(()),
            _ => Err(ModelError::ContextFull {
                have,
                more: t,
                context: self.context,
            }),
        }
    }
}
