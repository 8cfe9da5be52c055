//! [`ParamStore`]: a model's parameters by name, in registration order, on one device.

use super::builder::ParamBuilder;
use super::copy::{copy_into, deep_copy};
use super::init::Init;
use crate::optim::{
    AdamW, AdamWParams, Prodigy, ProdigyParams, ScheduleFreeAdamW, ScheduleFreeParams,
};
use crate::{Device, GpuError, Result, Tensor};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

/// A named parameter: a leaf tensor with `requires_grad`, and whether AdamW decays it.
#[derive(Debug, Clone)]
pub struct Param {
    name: String,
    tensor: Tensor,
    decay: bool,
}

impl Param {
    /// The dotted name (`encoder.weight`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The tensor (shares its storage with the store's: updates are seen by both).
    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    /// Whether AdamW applies weight decay to it.
    pub fn decay(&self) -> bool {
        self.decay
    }
}

struct Inner {
    params: Vec<Param>,
    index: HashMap<String, usize>,
    rng: rand::rngs::StdRng,
}

/// Every parameter of a model, by name, in registration order, on one device.
///
/// Random inits draw their sub-seeds from one generator seeded at [`ParamStore::new`], in
/// registration order: a model that registers the same parameters in the same order gets the
/// same initial values for a seed, on every device. Layers register through
/// [`ParamStore::root`] / [`ParamStore::pp`]; the store's interior is locked, so builders for
/// several prefixes can be used side by side.
pub struct ParamStore {
    device: Device,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for ParamStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("ParamStore")
            .field("device", &self.device)
            .field("params", &inner.params.len())
            .finish()
    }
}

/// Makes `t` a parameter leaf. (The one place that marks parameters: `requires_grad_` is about
/// to return a `Result`.)
fn leaf(t: Tensor) -> Result<Tensor> {
    t.requires_grad_()
}

/// Checks a full parameter name: non-empty dot-separated segments.
fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.split('.').any(str::is_empty) {
        return Err(GpuError::invalid(
            "ParamStore",
            format!("parameter name '{name}' has an empty segment"),
        ));
    }
    Ok(())
}

impl ParamStore {
    /// An empty store on `device` whose random inits draw from `seed`.
    pub fn new(device: Device, seed: u64) -> ParamStore {
        ParamStore {
            device,
            inner: Mutex::new(Inner {
                params: Vec::new(),
                index: HashMap::new(),
                rng: rand::rngs::StdRng::seed_from_u64(seed),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The device every parameter lives on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// A builder registering names without a prefix.
    pub fn root(&self) -> ParamBuilder<'_> {
        ParamBuilder::root(self)
    }

    /// A builder registering names under `prefix.` (`store.pp("encoder")`).
    pub fn pp(&self, prefix: impl ToString) -> ParamBuilder<'_> {
        self.root().pp(prefix)
    }

    /// Registers a parameter `name` of `shape` drawn from `init`, with its decay flag, and
    /// returns it. A name registered twice, an invalid name or init, and an allocation failure
    /// are errors that leave the store (and its generator) as they were.
    pub(crate) fn register(
        &self,
        name: String,
        shape: &[usize],
        init: Init,
        decay: bool,
    ) -> Result<Tensor> {
        check_name(&name)?;
        init.validate()?;
        let mut inner = self.lock();
        if inner.index.contains_key(&name) {
            return Err(GpuError::invalid(
                "ParamStore",
                format!("parameter '{name}' is registered twice"),
            ));
        }
        let mut rng = inner.rng.clone();
        let seed = if init.is_random() { rng.random() } else { 0 };
        let tensor = leaf(init.tensor(shape, seed, self.device)?)?;
        inner.rng = rng;
        let i = inner.params.len();
        inner.index.insert(name.clone(), i);
        inner.params.push(Param {
            name,
            tensor: tensor.clone(),
            decay,
        });
        Ok(tensor)
    }

    /// Every parameter, in registration order.
    pub fn params(&self) -> Vec<Param> {
        self.lock().params.clone()
    }

    /// The names, in registration order.
    pub fn names(&self) -> Vec<String> {
        self.lock().params.iter().map(|p| p.name.clone()).collect()
    }

    /// The parameter called `name`.
    pub fn get(&self, name: &str) -> Option<Tensor> {
        let inner = self.lock();
        inner
            .index
            .get(name)
            .map(|&i| inner.params[i].tensor.clone())
    }

    /// Number of parameters.
    pub fn len(&self) -> usize {
        self.lock().params.len()
    }

    /// True when nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Total number of parameter elements.
    pub fn num_elements(&self) -> usize {
        self.lock().params.iter().map(|p| p.tensor.numel()).sum()
    }

    /// AdamW over every parameter, each decayed or not by its flag.
    pub fn adamw(&self, hp: AdamWParams) -> Result<AdamW> {
        AdamW::new(
            self.params()
                .into_iter()
                .map(|p| (p.tensor, p.decay))
                .collect(),
            hp,
        )
    }

    /// Schedule-Free AdamW over every parameter, each decayed or not by its flag.
    pub fn schedule_free_adamw(&self, hp: ScheduleFreeParams) -> Result<ScheduleFreeAdamW> {
        ScheduleFreeAdamW::new(self.decay_flags(), hp)
    }

    /// Prodigy over every parameter, each decayed or not by its flag.
    pub fn prodigy(&self, hp: ProdigyParams) -> Result<Prodigy> {
        Prodigy::new(self.decay_flags(), hp)
    }

    /// Every parameter with its weight-decay flag (nanoGPT decays 2-D weights only).
    fn decay_flags(&self) -> Vec<(Tensor, bool)> {
        self.params()
            .into_iter()
            .map(|p| (p.tensor, p.decay))
            .collect()
    }

    /// A copy of every parameter's values, made on the device (no host round trip).
    pub fn snapshot(&self) -> Result<Snapshot> {
        let entries = self
            .params()
            .iter()
            .map(|p| Ok((p.name.clone(), deep_copy(&p.tensor)?)))
            .collect::<Result<_>>()?;
        Ok(Snapshot { entries })
    }

    /// Writes a snapshot's values back into the parameters, in place (on the device): the
    /// tensors keep their identities, so an optimiser built over them trains the restored
    /// values. The snapshot must hold exactly this store's names, in order, with the same
    /// shapes on the same device (a snapshot of another store of the same layout is fine);
    /// everything is checked before anything is written.
    pub fn restore(&self, snap: &Snapshot) -> Result<()> {
        let params = self.params();
        let op = "ParamStore::restore";
        if snap.entries.len() != params.len() {
            return Err(GpuError::invalid(
                op,
                format!(
                    "the snapshot holds {} tensors, the store {} parameters",
                    snap.entries.len(),
                    params.len()
                ),
            ));
        }
        for (p, (name, t)) in params.iter().zip(&snap.entries) {
            if p.name != *name {
                return Err(GpuError::invalid(
                    op,
                    format!("parameter '{}' meets snapshot tensor '{name}'", p.name),
                ));
            }
            if t.shape() != p.tensor.shape() || t.device() != p.tensor.device() {
                return Err(GpuError::shape(
                    op,
                    format!("{name}: {:?} on {}", p.tensor.shape(), p.tensor.device()),
                    format!("{name}: {:?} on {}", t.shape(), t.device()),
                ));
            }
        }
        for (p, (_, t)) in params.iter().zip(&snap.entries) {
            copy_into(op, &p.tensor, t)?;
        }
        Ok(())
    }
}

/// Copies of a store's parameter values at one moment, on the store's device, by name.
#[derive(Debug, Clone)]
pub struct Snapshot {
    entries: Vec<(String, Tensor)>,
}

impl Snapshot {
    /// The copy of parameter `name`.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.entries.iter().find(|e| e.0 == name).map(|e| &e.1)
    }

    /// The names, in the store's order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.0.as_str())
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when the store was empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}
