//! The hybrid's state in a `train-gpt` checkpoint (a `hybrid/` folder beside the model and
//! optimizer's files), so that a resumed run continues bit for bit: the controller and its gate,
//! the decisions' features, the rollback point (weights, optimizer state, weight average, probe
//! losses; its data position is the step's), the running weight average, and the world model
//! (weights, its AdamW state and step count; its training under way is finished first).

use super::hybrid::{ControlCosts, StepSizeHybrid};
use super::probe::{SegmentStart, Weights};
use super::world::{Gate, WorldSnapshot, FEATURES};
use super::Controller;
use crate::tensor_file::{read_tensors, write_tensors, HostTensors};
use anyhow::{ensure, Context, Result};
use models::gpt::{Dataset, Gpt};
use serde::{Deserialize, Serialize};
use std::path::Path;
use tensor_ops::optim::{AdamWState, Optimizer, OptimizerState};
use tensor_ops::Tensor;

const STATE: &str = "control.json";
const TENSORS: &str = "tensors.safetensors";
const START_OPT: &str = "start_optimizer.safetensors";
const WORLD: &str = "world_model.safetensors";

/// The host state, as JSON.
#[derive(Serialize, Deserialize)]
pub(super) struct HostState {
    pub ctl: Controller,
    pub gate: Gate,
    pub states: Vec<[f32; FEATURES]>,
    pub prev_change: f32,
    pub last_log_scale: f32,
    pub last_measured: bool,
    pub mean_log_scale: Option<f32>,
    pub costs: ControlCosts,
    pub start_step: u32,
    pub start_loss: f32,
    pub start_avg_loss: Option<f32>,
    pub start_avg_end_loss: Option<f32>,
    pub has_average: bool,
    /// The world model's AdamW step count, when there is a world model.
    pub world_step: Option<u32>,
}

fn named(prefix: &str, w: &Weights) -> Vec<(String, Tensor)> {
    w.tensors()
        .iter()
        .enumerate()
        .map(|(i, t)| (format!("{prefix}.{i}"), t.clone()))
        .collect()
}

/// Reads `prefix.0 ..` back as tensors shaped like the model's parameters, on its device.
fn unnamed(host: &HostTensors, prefix: &str, model: &Gpt) -> Result<Weights> {
    let mut out = Vec::new();
    for (i, (name, p, _)) in model.parameters().into_iter().enumerate() {
        let key = format!("{prefix}.{i}");
        let (shape, vals) = host
            .get(&key)
            .with_context(|| format!("no tensor {key} ({name})"))?;
        ensure!(
            shape.as_slice() == p.shape(),
            "{key}: shape {shape:?}, the parameter {:?}",
            p.shape()
        );
        out.push(Tensor::from_vec(vals.clone(), shape, p.device())?);
    }
    Ok(Weights::from_tensors(out))
}

/// The tensors `prefix.0`, `prefix.1`, … on the CPU (the world model's device), in order.
fn host_list(host: &HostTensors, prefix: &str) -> Result<Vec<Tensor>> {
    let mut out = Vec::new();
    while let Some((shape, vals)) = host.get(&format!("{prefix}.{}", out.len())) {
        out.push(Tensor::from_vec(
            vals.clone(),
            shape,
            tensor_ops::Device::Cpu,
        )?);
    }
    Ok(out)
}

impl StepSizeHybrid {
    /// Writes the state into `dir` (created).
    pub fn save(&mut self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let (host, world) = self.host_state()?;
        let mut tensors = named("start", &self.start().weights);
        if let Some(w) = &world {
            for (prefix, ts) in [("world_m", &w.optimizer.m), ("world_v", &w.optimizer.v)] {
                tensors.extend(
                    ts.iter()
                        .enumerate()
                        .map(|(i, t)| (format!("{prefix}.{i}"), t.clone())),
                );
            }
        }
        if let Some(a) = &self.start().average {
            tensors.extend(named("start_average", a));
        }
        if let Some(a) = self.average() {
            tensors.extend(named("average", &a.avg));
        }
        write_tensors(&dir.join(TENSORS), &tensors).map_err(|e| anyhow::anyhow!("{e}"))?;
        self.start().optimizer.save(&dir.join(START_OPT))?;
        if let Some(w) = world {
            std::fs::write(dir.join(WORLD), w.weights)?;
        }
        std::fs::write(dir.join(STATE), serde_json::to_string(&host)?)?;
        Ok(())
    }

    /// A controller as [`StepSizeHybrid::save`] left it, for a run at `model` (already loaded)
    /// whose data stream restarts from `seed` (the segment start's position is its step's).
    pub fn load(
        dir: &Path,
        fresh: StepSizeHybrid,
        (ds, model, batch, block, seed): (&Dataset, &Gpt, usize, usize, u64),
    ) -> Result<StepSizeHybrid> {
        let text = tensor_ops::fsio::read_to_string(
            &dir.join(STATE),
            "control state",
            tensor_ops::fsio::JSON_MAX,
        )?;
        let host: HostState = serde_json::from_str(&text)?;
        ensure!(
            host.ctl.cfg == fresh.ctl.cfg,
            "{} was written with other step-size control settings",
            dir.display()
        );
        let t = read_tensors(&dir.join(TENSORS)).map_err(|e| anyhow::anyhow!("{e}"))?;
        let weights = unnamed(&t, "start", model)?;
        let start_average = host
            .has_average
            .then(|| unnamed(&t, "start_average", model))
            .transpose()?;
        let average = host
            .has_average
            .then(|| unnamed(&t, "average", model))
            .transpose()?;
        let optimizer = OptimizerState::load(&dir.join(START_OPT))?;
        let mut rng = Dataset::rng(seed);
        ds.skip_batches(false, batch, block, host.start_step as usize, &mut rng)?;
        let start = SegmentStart {
            step: host.start_step,
            weights,
            average: start_average,
            optimizer,
            rng,
            loss: host.start_loss,
            avg_loss: host.start_avg_loss,
            avg_end_loss: host.start_avg_end_loss,
        };
        let world = match host.world_step {
            Some(step) => Some(WorldSnapshot {
                weights: tensor_ops::fsio::read(
                    &dir.join(WORLD),
                    "world model",
                    tensor_ops::fsio::TENSORS_MAX,
                )?,
                optimizer: AdamWState {
                    m: host_list(&t, "world_m")?,
                    v: host_list(&t, "world_v")?,
                    step,
                },
            }),
            None => None,
        };
        fresh.restored(host, start, average, world)
    }
}

/// The optimizer state of a run, checked against the live optimizer's kind.
pub fn check_kind(state: &OptimizerState, opt: &dyn Optimizer) -> Result<()> {
    ensure!(
        state.optimizer == opt.name(),
        "the checkpoint's rollback point is {}'s, this run's optimizer is {}",
        state.optimizer,
        opt.name()
    );
    Ok(())
}
