//! The world model of the step-size controller: an [`rssm::Rssm`] ensemble over the sequence
//! of decisions. Each decision is one step of the sequence, described by [`FEATURES`]
//! features; the model learns to predict the next decision's features, and feature
//! [`SCALE`] of the next decision is the scale `s*` the current one will measure. So its
//! one-step prediction is a prediction of the line search, with the ensemble's spread as its
//! uncertainty. The [`Gate`] trusts it only while its measured error and that spread are small,
//! and never for more than a few decisions in a row.
//!
//! It runs through [`GpuAccelerator`], the trainer's door to the device work, on the device
//! that trains: `predict_batch` is the fused rollout on CUDA (the HAL's world family) and the
//! fast f32 engine on the CPU. On the CPU it trains on a thread of its own while the next
//! segment runs; on a GPU it trains on the caller's thread at the decision (a few dozen small
//! launches), so that nothing else is queued on the device while a training step of the model
//! being trained is captured into a CUDA graph. On W1 (H100) that training costs ~65 ms of host
//! time a decision, ~3.2 s of a 19 s run; a thread of its own did not hide it (19.0 s: its
//! read-backs wait behind the queued training steps), so it stays on the caller's thread.

use rssm::{GpuAccelerator, Rssm, RssmConfig, SequenceBatch};
use tensor_ops::{Device, Tensor};

/// Features of one decision.
pub const FEATURES: usize = 8;
/// The feature holding the previous decision's `ln s*`, scaled by `1/ln(max_change)`.
pub const SCALE: usize = 5;
/// Decisions the model reads before predicting.
pub const CONTEXT: usize = 6;

/// The state of the run at a decision, before its line search.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecisionState {
    /// Step / steps of the run.
    pub progress: f32,
    /// The multiplier in force during the segment.
    pub multiplier: f32,
    /// The scheduled rate at the segment's end over the peak rate.
    pub schedule: f32,
    /// Relative change of the probe loss over the segment, `(f1 − f0)/f0`.
    pub change: f32,
    /// The same for the segment before.
    pub prev_change: f32,
    /// `ln s*` of the previous decision (0 when none).
    pub last_log_scale: f32,
    /// Whether that one was measured.
    pub last_measured: bool,
    /// Running mean (β = 0.7) of the measured `ln s*`.
    pub mean_log_scale: f32,
}

impl DecisionState {
    /// The features, each a fixed affine map of its value clamped to ±4 (no running
    /// statistics: a resumed or replayed run computes the same numbers).
    pub fn features(&self, max_change: f32) -> [f32; FEATURES] {
        let lc = max_change.ln();
        let c = |x: f32| {
            if x.is_finite() {
                x.clamp(-4.0, 4.0)
            } else {
                0.0
            }
        };
        [
            c(self.progress),
            c(self.multiplier.ln() / 2.0),
            c(self.schedule.max(1e-6).ln()),
            c(100.0 * self.change / 4.0),
            c(100.0 * self.prev_change / 4.0),
            c(self.last_log_scale / lc),
            if self.last_measured { 1.0 } else { 0.0 },
            c(self.mean_log_scale / lc),
        ]
    }
}

/// Something that predicts the next `ln s*` (scaled as [`SCALE`]) from the decisions so far.
pub trait ScalePredictor {
    /// The prediction and the ensemble's standard deviation, both in units of `ln s*`
    /// scaled by `1/ln(max_change)`; `None` until it can predict.
    fn predict(&mut self, states: &[[f32; FEATURES]]) -> anyhow::Result<Option<(f32, f32)>>;
    /// Learns from every decision so far (the last one included).
    fn learn(&mut self, states: &[[f32; FEATURES]]) -> anyhow::Result<()>;
    /// Its learned state, for a checkpoint (`None`: it keeps none).
    fn snapshot(&mut self) -> anyhow::Result<Option<WorldSnapshot>> {
        Ok(None)
    }
    /// Takes back a [`ScalePredictor::snapshot`].
    fn restore(&mut self, _snap: &WorldSnapshot) -> anyhow::Result<()> {
        Ok(())
    }
}

/// A world model's learned state: its weights (safetensors bytes, with its step count) and its
/// AdamW moments and step, so that its training resumes bit for bit.
pub struct WorldSnapshot {
    pub weights: Vec<u8>,
    pub optimizer: tensor_ops::optim::AdamWState,
}

/// The RSSM predictor: small (5 members, GRU 32), through a [`GpuAccelerator`] on the training
/// device. On the CPU it learns on a thread of its own, started after a decision and joined at
/// the next one, so its training overlaps the segment's steps instead of stopping them; the
/// result does not depend on the timing.
pub struct StepSizeModel {
    /// The accelerator holding the model, when no training is under way.
    acc: Option<GpuAccelerator>,
    /// The training under way (CPU only): it gives the accelerator back.
    training: Option<std::thread::JoinHandle<anyhow::Result<GpuAccelerator>>>,
    device: Device,
    /// BPTT steps after each decision.
    train_steps: u32,
    lr: f32,
}

impl StepSizeModel {
    /// The predictor on `device` (the training device).
    pub fn new(seed: u64, device: Device) -> anyhow::Result<StepSizeModel> {
        let cfg = RssmConfig {
            feature_dim: FEATURES,
            output_dim: FEATURES,
            ensemble: 5,
            embed_dim: 32,
            hidden_dim: 32,
            latent_dim: 8,
            head_dim: 32,
            seed,
            ..RssmConfig::default()
        };
        Ok(StepSizeModel {
            acc: Some(GpuAccelerator::with_model(Rssm::new(cfg, device)?)),
            training: None,
            device,
            train_steps: 4,
            lr: 3e-3,
        })
    }

    /// The accelerator, after the training under way (if any) has finished.
    fn accelerator(&mut self) -> anyhow::Result<&mut GpuAccelerator> {
        if let Some(t) = self.training.take() {
            let acc = t
                .join()
                .map_err(|_| anyhow::anyhow!("the world model's training thread panicked"))??;
            self.acc = Some(acc);
        }
        self.acc
            .as_mut()
            .ok_or_else(|| anyhow::anyhow!("the world model was lost by a failed training"))
    }

    /// The model, after the training under way (if any) has finished.
    fn model(&mut self) -> anyhow::Result<&mut Rssm> {
        self.accelerator()?
            .model_mut()
            .ok_or_else(|| anyhow::anyhow!("the world model's accelerator holds no model"))
    }

    fn windows(
        states: &[[f32; FEATURES]],
        len: usize,
        device: Device,
    ) -> anyhow::Result<Option<Tensor>> {
        if states.len() < len {
            return Ok(None);
        }
        let n = states.len() - len + 1;
        let data: Vec<f32> = (0..n)
            .flat_map(|i| states[i..i + len].iter().flatten().copied())
            .collect();
        Ok(Some(Tensor::from_vec(data, &[n, len, FEATURES], device)?))
    }
}

fn train(
    acc: &mut GpuAccelerator,
    batch: &SequenceBatch,
    (steps, lr): (u32, f32),
) -> anyhow::Result<()> {
    let model = acc
        .model_mut()
        .ok_or_else(|| anyhow::anyhow!("the world model's accelerator holds no model"))?;
    for _ in 0..steps {
        model.train_step(batch, lr)?;
    }
    Ok(())
}

impl Drop for StepSizeModel {
    fn drop(&mut self) {
        if let Some(t) = self.training.take() {
            let _ = t.join();
        }
    }
}

impl ScalePredictor for StepSizeModel {
    fn predict(&mut self, states: &[[f32; FEATURES]]) -> anyhow::Result<Option<(f32, f32)>> {
        let device = self.device;
        if !self.model()?.is_trained() || states.len() < CONTEXT {
            return Ok(None);
        }
        let ctx = &states[states.len() - CONTEXT..];
        let Some(x) = Self::windows(ctx, CONTEXT, device)? else {
            return Ok(None);
        };
        let p = self.accelerator()?.predict_batch(&x, 1)?;
        // members [M, 1, 1, F]: the scale column of each member.
        let members = p.members.to_vec()?;
        let m = members.len() / FEATURES;
        let vals: Vec<f32> = (0..m).map(|i| members[i * FEATURES + SCALE]).collect();
        let mean = vals.iter().sum::<f32>() / m as f32;
        let var = vals.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / m as f32;
        Ok(Some((mean, var.sqrt())))
    }

    fn snapshot(&mut self) -> anyhow::Result<Option<WorldSnapshot>> {
        let rssm = self.model()?;
        Ok(Some(WorldSnapshot {
            weights: rssm.to_bytes()?,
            optimizer: rssm.optimizer_state()?,
        }))
    }

    fn restore(&mut self, snap: &WorldSnapshot) -> anyhow::Result<()> {
        let rssm = self.model()?;
        rssm.load_bytes(&snap.weights)?;
        rssm.load_optimizer_state(&snap.optimizer)?;
        Ok(())
    }

    /// Trains the model on every decision so far: on the CPU on its own thread (returns at
    /// once), on a GPU here.
    fn learn(&mut self, states: &[[f32; FEATURES]]) -> anyhow::Result<()> {
        // Windows one longer than the context: the last step of each is a prediction target.
        let Some(x) = Self::windows(states, CONTEXT + 1, self.device)? else {
            return Ok(());
        };
        let batch = SequenceBatch::new(x);
        let settings = (self.train_steps, self.lr);
        if self.device != Device::Cpu {
            return train(self.accelerator()?, &batch, settings);
        }
        self.accelerator()?;
        let mut acc = self.acc.take().expect("accelerator() put it back");
        self.training = Some(std::thread::spawn(move || {
            train(&mut acc, &batch, settings)?;
            Ok(acc)
        }));
        Ok(())
    }
}

/// The largest error one prediction adds to the gate's running error (scaled `ln s*`; the
/// scale spans [-1, 1], so 10 is far outside anything a sane model predicts).
const ERROR_CAP: f32 = 10.0;

/// When the world model's prediction replaces the measurement.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Gate {
    trust: f32,
    min_examples: u32,
    max_run: u32,
    /// Running mean (β = 0.7) of |predicted − measured| on measured decisions (scaled units).
    error: Option<f32>,
    /// Measured decisions the model was scored on.
    scored: u32,
    /// Predicted decisions in a row.
    run: u32,
}

impl Gate {
    pub fn new(trust: f32, min_examples: u32, max_run: u32) -> Gate {
        Gate {
            trust,
            min_examples,
            max_run,
            error: None,
            scored: 0,
            run: 0,
        }
    }

    /// Whether a prediction with ensemble spread `spread` may be used instead of measuring.
    pub fn trusts(&self, spread: f32) -> bool {
        let Some(err) = self.error else {
            return false;
        };
        self.scored >= self.min_examples
            && self.run < self.max_run
            && err < self.trust
            && spread.is_finite()
            && spread < self.trust
    }

    /// Records a measured decision and the prediction that was made for it (if any).
    pub fn measured(&mut self, predicted: Option<f32>, measured: f32) {
        self.run = 0;
        if let Some(p) = predicted {
            // Capped (a NaN counts as the cap): one wild prediction closes the gate, and the
            // running error can still decay if the model is right again.
            let e = if p.is_finite() {
                (p - measured).abs().min(ERROR_CAP)
            } else {
                ERROR_CAP
            };
            self.error = Some(match self.error {
                Some(old) => 0.7 * old + 0.3 * e,
                None => e,
            });
            self.scored += 1;
        }
    }

    /// Records a decision that used the prediction.
    pub fn predicted(&mut self) {
        self.run += 1;
    }

    /// The running error, when scored.
    pub fn error(&self) -> Option<f32> {
        self.error
    }
}
