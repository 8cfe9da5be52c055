//! Checkpoints of a [`HybridTrainer`]: everything a resumed run needs to continue bit for bit
//! — the model's weights, AdamW's moments and step, the world model and its optimiser, the
//! update history and basis, the last good snapshot and the host-side state — as safetensors
//! files (f32 tensors) and one JSON file, in a directory.

use super::run::{Counters, Good, HostState, HybridTrainer, Span};
use super::updates::Basis;
use super::HybridError;
pub use crate::tensor_file::MODEL_FILE;
use crate::tensor_file::{read_tensors, write_tensors, HostTensors, TensorFileError};
use serde::{Deserialize, Serialize};
use std::path::Path;
use tensor_ops::optim::AdamWState;
use tensor_ops::Tensor;

const TENSORS: &str = "trainer.safetensors";
const WORLD: &str = "world_model.safetensors";
const STATE: &str = "trainer.json";

fn ck(e: impl std::fmt::Display) -> HybridError {
    HybridError::Checkpoint(e.to_string())
}

/// The JSON part of a checkpoint.
#[derive(Serialize, Deserialize)]
struct Saved {
    format: u32,
    names: Vec<String>,
    total_steps: u64,
    host: HostState,
    counters: Counters,
    opt_step: u32,
    span: Option<(Vec<Vec<f32>>, Vec<f32>, usize)>,
    deltas: usize,
    scales: Option<Vec<Vec<f32>>>,
    last_delta: bool,
    last_delta_sq: f64,
    good: Option<(HostState, u32)>,
    world_opt_step: Option<u32>,
}

impl From<TensorFileError> for HybridError {
    fn from(e: TensorFileError) -> Self {
        match e {
            TensorFileError::File(s) => HybridError::Checkpoint(s),
            TensorFileError::Tensor(t) => HybridError::Tensor(t),
        }
    }
}

impl HybridTrainer {
    /// Writes a checkpoint into `dir` (created): see the module docs.
    pub fn save(&self, dir: &Path) -> Result<(), HybridError> {
        std::fs::create_dir_all(dir).map_err(|e| ck(format!("{}: {e}", dir.display())))?;
        let mut ts: Vec<(String, Tensor)> = Vec::new();
        let named = |ts: &mut Vec<(String, Tensor)>, prefix: &str, xs: &[Tensor]| {
            for (i, t) in xs.iter().enumerate() {
                ts.push((format!("{prefix}.{i}"), t.clone()));
            }
        };
        let model: Vec<(String, Tensor)> = self
            .names
            .iter()
            .cloned()
            .zip(self.params.iter().cloned())
            .collect();
        write_tensors(&dir.join(MODEL_FILE), &model)?;
        let (m, v) = self.opt.moments();
        named(&mut ts, "opt.m", m);
        named(&mut ts, "opt.v", v);
        for (j, d) in self.history.deltas.iter().enumerate() {
            named(&mut ts, &format!("history.{j}"), d);
        }
        if let Some(b) = &self.history.basis {
            let vs: Vec<Tensor> = b.iter().map(|b| b.v.clone()).collect();
            named(&mut ts, "basis", &vs);
        }
        if let Some(d) = &self.last_delta {
            named(&mut ts, "last_delta", d);
        }
        if let Some(g) = &self.good {
            named(&mut ts, "good.weights", &g.weights);
            named(&mut ts, "good.m", &g.opt.m);
            named(&mut ts, "good.v", &g.opt.v);
        }
        let mut world_opt_step = None;
        if let Some(w) = self.acc.model() {
            std::fs::write(dir.join(WORLD), w.to_bytes()?).map_err(ck)?;
            let st = w.optimizer_state()?;
            named(&mut ts, "world.m", &st.m);
            named(&mut ts, "world.v", &st.v);
            world_opt_step = Some(st.step);
        }
        write_tensors(&dir.join(TENSORS), &ts)?;
        let saved = Saved {
            format: 1,
            names: self.names.clone(),
            total_steps: self.total_steps,
            host: self.host.clone(),
            counters: self.counters.clone(),
            opt_step: self.opt.steps(),
            span: self
                .span
                .as_ref()
                .map(|s| (s.coefs.clone(), s.disagreement.clone(), s.taken)),
            deltas: self.history.deltas.len(),
            scales: self
                .history
                .basis
                .as_ref()
                .map(|b| b.iter().map(|b| b.scale.clone()).collect()),
            last_delta: self.last_delta.is_some(),
            last_delta_sq: self.last_delta_sq,
            good: self.good.as_ref().map(|g| (g.host.clone(), g.opt.step)),
            world_opt_step,
        };
        let json = serde_json::to_string(&saved).map_err(ck)?;
        std::fs::write(dir.join(STATE), json).map_err(ck)
    }

    /// Loads a checkpoint written by [`HybridTrainer::save`] of a trainer built the same way
    /// (same model layout, config and device). Everything is read and checked before anything
    /// is written.
    pub fn load(&mut self, dir: &Path) -> Result<(), HybridError> {
        let json = tensor_ops::fsio::read_to_string(
            &dir.join(STATE),
            "hybrid state",
            tensor_ops::fsio::JSON_MAX,
        )
        .map_err(ck)?;
        let saved: Saved = serde_json::from_str(&json).map_err(ck)?;
        if saved.format != 1 || saved.names != self.names {
            return Err(ck("the checkpoint is of another model layout or format"));
        }
        let model = read_tensors(&dir.join(MODEL_FILE))?;
        let ts = read_tensors(&dir.join(TENSORS))?;
        let dev = self.device;
        // A tensor by name, checked against the shape it must have (None: any).
        let take = |map: &HostTensors, name: &str, want: Option<&[usize]>| {
            let (shape, vals) = map
                .get(name)
                .ok_or_else(|| ck(format!("missing tensor {name}")))?;
            if let Some(w) = want {
                if w != shape.as_slice() {
                    return Err(ck(format!("{name}: shape {shape:?}, expected {w:?}")));
                }
            }
            Ok(Tensor::from_vec(vals.clone(), shape, dev)?)
        };
        let list = |prefix: &str, shapes: &[Vec<usize>]| -> Result<Vec<Tensor>, HybridError> {
            shapes
                .iter()
                .enumerate()
                .map(|(i, w)| take(&ts, &format!("{prefix}.{i}"), Some(w)))
                .collect()
        };
        let shapes_of =
            |ts: &[Tensor]| -> Vec<Vec<usize>> { ts.iter().map(|t| t.shape().to_vec()).collect() };
        let params = shapes_of(&self.params);
        let weights: Vec<Tensor> = self
            .names
            .iter()
            .zip(&self.params)
            .map(|(n, p)| take(&model, n, Some(p.shape())))
            .collect::<Result<_, _>>()?;
        let flat: Vec<Vec<usize>> = self.params.iter().map(|p| vec![p.numel()]).collect();
        let m = list("opt.m", &params)?;
        let v = list("opt.v", &params)?;
        let sizes = self.history.group_sizes();
        let groups: Vec<Vec<usize>> = sizes.iter().map(|&n| vec![n]).collect();
        let deltas: Vec<Vec<Tensor>> = (0..saved.deltas)
            .map(|j| list(&format!("history.{j}"), &groups))
            .collect::<Result<_, _>>()?;
        let basis = match &saved.scales {
            Some(scales) => Some(
                scales
                    .iter()
                    .enumerate()
                    .map(|(i, sc)| {
                        let want = [sizes.get(i).copied().unwrap_or(0), sc.len()];
                        let v = take(&ts, &format!("basis.{i}"), Some(&want))?;
                        Ok(Basis {
                            slices: self.history.slices(i, &v)?,
                            v,
                            scale: sc.clone(),
                        })
                    })
                    .collect::<Result<Vec<_>, HybridError>>()?,
            ),
            None => None,
        };
        let last_delta = if saved.last_delta {
            Some(list("last_delta", &flat)?)
        } else {
            None
        };
        let good = match &saved.good {
            Some((host, step)) => Some(Good {
                weights: list("good.weights", &params)?,
                opt: AdamWState {
                    m: list("good.m", &params)?,
                    v: list("good.v", &params)?,
                    step: *step,
                },
                host: host.clone(),
            }),
            None => None,
        };
        let world = match (self.acc.model(), saved.world_opt_step) {
            (Some(w), Some(step)) => {
                let bytes = tensor_ops::fsio::read(
                    &dir.join(WORLD),
                    "world model",
                    tensor_ops::fsio::TENSORS_MAX,
                )
                .map_err(ck)?;
                let st = w.optimizer_state()?;
                Some((
                    bytes,
                    AdamWState {
                        m: list("world.m", &shapes_of(&st.m))?,
                        v: list("world.v", &shapes_of(&st.v))?,
                        step,
                    },
                ))
            }
            (None, None) => None,
            _ => {
                return Err(ck(
                    "the checkpoint's world model does not match this trainer's mode",
                ))
            }
        };
        // Everything read and checked: write (the world model first: its loader checks its
        // own names and shapes before writing).
        if let (Some((bytes, st)), Some(w)) = (world, self.acc.model_mut()) {
            w.load_bytes(&bytes)?;
            w.load_optimizer_state(&st)?;
        }
        for (p, w) in self.params.iter().zip(&weights) {
            p.assign(w)?;
        }
        self.opt.load_state(&AdamWState {
            m,
            v,
            step: saved.opt_step,
        })?;
        self.history.deltas = deltas.into();
        self.history.basis = basis;
        self.last_delta = last_delta;
        self.last_delta_sq = saved.last_delta_sq;
        self.good = good;
        self.host = saved.host;
        self.counters = saved.counters;
        self.total_steps = saved.total_steps;
        self.span = saved.span.map(|(coefs, disagreement, taken)| Span {
            coefs,
            disagreement,
            taken,
        });
        Ok(())
    }
}
