//! `--ema-decay D`: an exponential moving average of the weights, kept on the training device
//! beside them (one fused lerp after every step: `tensor_ops::optim::lerp_tensors`, no host
//! copy), evaluated at every evaluation on the same batches as the weights themselves
//! (`ema_val` in the curve). Training never reads it: a run with it trains bit for bit as the
//! run without it. A checkpoint keeps it (`ema.safetensors` under the parameters' names and
//! `ema.json`), so a resumed run's average goes on.
//!
//! The decay of update `t` (the first is 0) is `min(D, (1 + t)/(10 + t))`, TensorFlow's
//! `ExponentialMovingAverage` with `num_updates`: early on the average forgets its start (the
//! initial weights) quickly, and from update (10·D − 1)/(1 − D) on it decays at `D`.

use crate::tensor_file::{read_tensors, write_tensors, TensorFileError};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Instant;
use tensor_ops::optim::lerp_tensors;
use tensor_ops::Tensor;

/// The average's tensors in a checkpoint.
const TENSORS: &str = "ema.safetensors";
/// Its decay, update count and seconds.
const META: &str = "ema.json";

/// What can go wrong with the average.
#[derive(Debug, thiserror::Error)]
pub enum EmaError {
    #[error(transparent)]
    Tensor(#[from] tensor_ops::GpuError),
    #[error(transparent)]
    File(#[from] TensorFileError),
    #[error("{path}: {why}")]
    Io { path: String, why: String },
    /// A checkpoint without an average resumed with `--ema-decay`, or the other way round,
    /// or with another decay or model.
    #[error("{0}")]
    Mismatch(String),
}

/// The checkpoint's record of the average.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct EmaMeta {
    decay: f32,
    updates: u64,
    seconds: f64,
}

/// The moving average of the weights.
pub struct Ema {
    decay: f32,
    /// Updates so far.
    updates: u64,
    /// In the model's parameter order, each in its own storage.
    avg: Vec<Tensor>,
    /// Host seconds spent on the updates (the time of the launches on CUDA).
    pub seconds: f64,
}

/// The weight of the new weights at update `t`: `1 − min(decay, (1 + t)/(10 + t))`.
pub fn update_weight(decay: f32, t: u64) -> f32 {
    let warm = (1.0 + t as f64) / (10.0 + t as f64);
    (1.0 - (decay as f64).min(warm)) as f32
}

impl Ema {
    /// An average that starts at `params` (copies on their device).
    pub fn new(params: &[Tensor], decay: f32) -> Result<Ema, EmaError> {
        Ok(Ema {
            decay,
            updates: 0,
            avg: params
                .iter()
                .map(Tensor::deep_copy)
                .collect::<tensor_ops::Result<_>>()?,
            seconds: 0.0,
        })
    }

    pub fn tensors(&self) -> &[Tensor] {
        &self.avg
    }

    pub fn updates(&self) -> u64 {
        self.updates
    }

    /// Moves the average toward `params`, the weights after a step.
    pub fn update(&mut self, params: &[Tensor]) -> Result<(), EmaError> {
        let t = Instant::now();
        lerp_tensors(&self.avg, params, update_weight(self.decay, self.updates))?;
        self.updates += 1;
        self.seconds += t.elapsed().as_secs_f64();
        Ok(())
    }

    /// Runs `f` with the average in place of `params`, then puts the weights back bit for bit
    /// (also when `f` fails).
    pub fn swapped_in<R>(
        &self,
        params: &[Tensor],
        f: impl FnOnce() -> anyhow::Result<R>,
    ) -> anyhow::Result<R> {
        let saved: Vec<Tensor> = params
            .iter()
            .map(Tensor::deep_copy)
            .collect::<tensor_ops::Result<_>>()?;
        for (p, a) in params.iter().zip(&self.avg) {
            p.assign(a)?;
        }
        let out = f();
        for (p, s) in params.iter().zip(&saved) {
            p.assign(s)?;
        }
        out
    }

    /// Writes the average into a checkpoint's folder under the parameters' `names`.
    pub fn save(&self, dir: &Path, names: &[String]) -> Result<(), EmaError> {
        let named: Vec<(String, Tensor)> = names.iter().cloned().zip(self.avg.clone()).collect();
        write_tensors(&dir.join(TENSORS), &named)?;
        let meta = EmaMeta {
            decay: self.decay,
            updates: self.updates,
            seconds: self.seconds,
        };
        let path = dir.join(META);
        let text = serde_json::to_string(&meta).map_err(|e| io(&path, e))?;
        std::fs::write(&path, text).map_err(|e| io(&path, e))
    }

    /// The average a checkpoint's folder keeps, for the parameters `params` named `names` and
    /// the run's `decay` (`None`: the run keeps none). A checkpoint with an average resumed
    /// without one (or the other way round), with another decay, or whose tensors do not
    /// match the model is refused.
    pub fn load(
        dir: &Path,
        decay: Option<f32>,
        (names, params): (&[String], &[Tensor]),
    ) -> Result<Option<Ema>, EmaError> {
        let path = dir.join(META);
        let kept = path.is_file();
        let decay = match (decay, kept) {
            (None, false) => return Ok(None),
            (Some(_), false) => {
                return Err(EmaError::Mismatch(format!(
                    "{} keeps no average of the weights: resume it without --ema-decay",
                    dir.display()
                )))
            }
            (None, true) => {
                return Err(EmaError::Mismatch(format!(
                    "{} keeps an average of the weights: resume it with its --ema-decay",
                    dir.display()
                )))
            }
            (Some(d), true) => d,
        };
        let text = tensor_ops::fsio::read_to_string(&path, "EMA", tensor_ops::fsio::JSON_MAX)
            .map_err(|e| io(&path, e))?;
        let meta: EmaMeta = serde_json::from_str(&text).map_err(|e| io(&path, e))?;
        if meta.decay != decay {
            return Err(EmaError::Mismatch(format!(
                "{} keeps an average of decay {}, this run has --ema-decay {decay}",
                dir.display(),
                meta.decay
            )));
        }
        let host = read_tensors(&dir.join(TENSORS))?;
        let mut avg = Vec::with_capacity(params.len());
        for (name, p) in names.iter().zip(params) {
            let Some((shape, vals)) = host.get(name) else {
                return Err(EmaError::Mismatch(format!("{TENSORS}: no tensor {name}")));
            };
            if shape.as_slice() != p.shape() {
                return Err(EmaError::Mismatch(format!(
                    "{TENSORS}: {name} has shape {shape:?}, the parameter {:?}",
                    p.shape()
                )));
            }
            avg.push(Tensor::from_vec(vals.clone(), shape, p.device())?);
        }
        Ok(Some(Ema {
            decay,
            updates: meta.updates,
            avg,
            seconds: meta.seconds,
        }))
    }
}

fn io(path: &Path, e: impl std::fmt::Display) -> EmaError {
    EmaError::Io {
        path: path.display().to_string(),
        why: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensor_ops::Device;

    /// The decay's warm-up: 0.1, then 2/11, …, reaching `D` and staying there.
    #[test]
    fn the_update_weight_warms_up_to_the_decay() {
        assert!((update_weight(0.99, 0) - 0.9).abs() < 1e-7);
        assert!((update_weight(0.99, 1) - (1.0 - 2.0 / 11.0)).abs() < 1e-7);
        // (1 + t)/(10 + t) ≥ 0.99 from t = (10·0.99 − 1)/(1 − 0.99) = 890 on.
        assert!(update_weight(0.99, 889) > 0.0100001);
        assert!((update_weight(0.99, 890) - 0.01).abs() < 1e-7);
        assert!((update_weight(0.99, 1_000_000) - 0.01).abs() < 1e-7);
    }

    /// Updates against a host average in f64 (bound 1e-6 absolute); the swap restores the
    /// weights bit for bit; a checkpoint round trip keeps the average, and a mismatch is
    /// refused.
    #[test]
    fn updates_swap_and_checkpoint_round_trip() {
        let dev = Device::Cpu;
        let w = Tensor::from_vec(vec![1.0f32, -2.0, 0.5], &[3], dev).unwrap();
        let mut ema = Ema::new(std::slice::from_ref(&w), 0.5).unwrap();
        let mut host = [1.0f64, -2.0, 0.5];
        for (t, step) in [[0.5f32, 1.0, -1.0], [2.0, 0.0, 3.0], [-1.0, 4.0, 0.25]]
            .iter()
            .enumerate()
        {
            w.assign(&Tensor::from_vec(step.to_vec(), &[3], dev).unwrap())
                .unwrap();
            ema.update(std::slice::from_ref(&w)).unwrap();
            let d = (0.5f64).min((1.0 + t as f64) / (10.0 + t as f64));
            for (h, x) in host.iter_mut().zip(step) {
                *h = d * *h + (1.0 - d) * *x as f64;
            }
        }
        let got = ema.tensors()[0].to_vec().unwrap();
        for (g, h) in got.iter().zip(host) {
            assert!((*g as f64 - h).abs() < 1e-6, "{g} vs {h}");
        }
        let before = w.to_vec().unwrap();
        let inside = ema
            .swapped_in(std::slice::from_ref(&w), || Ok(w.to_vec()?))
            .unwrap();
        assert_eq!(inside, got);
        assert_eq!(w.to_vec().unwrap(), before);
        let dir = tempfile::tempdir().unwrap();
        let names = vec!["w".to_string()];
        ema.save(dir.path(), &names).unwrap();
        let params = std::slice::from_ref(&w);
        let back = Ema::load(dir.path(), Some(0.5), (&names, params))
            .unwrap()
            .unwrap();
        assert_eq!(back.updates(), 3);
        assert_eq!(back.tensors()[0].to_vec().unwrap(), got);
        for (decay, want) in [(None, "with its --ema-decay"), (Some(0.9), "decay 0.5")] {
            let err = Ema::load(dir.path(), decay, (&names, params))
                .err()
                .unwrap();
            assert!(err.to_string().contains(want), "{err}");
        }
        let other = vec!["v".to_string()];
        let err = Ema::load(dir.path(), Some(0.5), (&other, params)).err();
        assert!(err.unwrap().to_string().contains("no tensor v"));
        let empty = tempfile::tempdir().unwrap();
        let err = Ema::load(empty.path(), Some(0.5), (&names, params)).err();
        assert!(err.unwrap().to_string().contains("keeps no average"));
        assert!(Ema::load(empty.path(), None, (&names, params))
            .unwrap()
            .is_none());
    }
}
