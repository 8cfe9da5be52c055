//! The experiment's protocol, fixed before it runs: the workloads, the arms, and the
//! `train-gpt` flags of each run (issue 41's: `docs/protocol-41.md`).

use crate::control::cli::TrainMode;
use crate::train_step::OptimizerKind;
use clap::ValueEnum;
use serde::{Deserialize, Serialize};

/// What a run of the protocol cannot be built without.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProtocolError {
    /// W7's given rate is W1's sweep best, not known before W1's sweep has run.
    #[error(
        "W7's given rate is W1's sweep best (the cosine-to-100% rate with the fewest mean \
         backward passes to W1's target), fixed and written into docs/protocol-41.md's history \
         before W7 runs: give it with --w7-lr"
    )]
    W7RateNotFixed,
    #[error("--w7-lr {0}: a rate must be positive and finite")]
    BadRate(f32),
    /// The arm is not one of the workload's (W8 runs AdamW, H41 and the rate sweep only).
    #[error("{0:?} does not run the arm {1}")]
    NotAnArmOf(Workload, &'static str),
}

/// What the protocol leaves to be given when the experiment runs: W7's rate.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Given {
    /// W7's given peak rate (W1's sweep best), once fixed.
    pub w7_lr: Option<f32>,
}

/// The text a workload trains on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Corpus {
    /// tinyshakespeare (embedded; `--data` replaces it).
    Shakespeare,
    /// The King James Bible of `scripts/corpus-kjv.sh` (`--kjv`), checked by its sha256.
    Kjv,
}

/// The sha256 of W6's corpus (`docs/protocol-41.md`).
pub const KJV_SHA256: &str = "b5c4940bcfeee072c0935b5200d0f9d88a00a0199cb0961d16133458fcdfae5d";

/// A workload: a model, its data and schedule, and the learning rate a user would have typed.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize, Hash, PartialOrd, Ord,
)]
pub enum Workload {
    /// nanoGPT's shakespeare-char model (6 × 384, context 256, batch 64, dropout 0.2), 2000
    /// steps, given peak rate 1e-3.
    W1,
    /// W1 at a given rate of 3e-4.
    W2,
    /// W1 at a given rate of 1e-2.
    W3,
    /// The Llama variant, 8 layers × 512, the same data, given rate 6e-4.
    W4,
    /// The main job's 4 × 128 model on the CPU at its defaults (600 steps, rate 1e-3).
    W5,
    /// W1's model and schedule on the King James Bible (`--kjv`), given rate 1e-3.
    W6,
    /// W1 at a given rate equal to W1's sweep best (`--w7-lr`, fixed before W7 runs).
    W7,
    /// 12 layers × 12 heads × 768, context 256, batch 32, dropout 0.1, 1000 steps, on W6's
    /// corpus, given rate 6e-4; AdamW, H41 and AdamW's 5-rate sweep only.
    W8,
}

/// One run's configuration.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize, Hash, PartialOrd, Ord,
)]
pub enum Arm {
    /// AdamW at the given rate.
    Adamw,
    /// AdamW at 1/3, 1/2, 2 and 3 × the given rate (with `Adamw`, the sweep; its best is the
    /// oracle).
    AdamwThird,
    AdamwHalf,
    AdamwDouble,
    AdamwTriple,
    /// LR range test, then AdamW at its pick.
    RangeTest,
    /// Schedule-Free AdamW at the `schedulefree` package's defaults (lr 0.0025, no weight
    /// decay), after the workload's linear warm-up, constant after it.
    ScheduleFree,
    /// Prodigy at the `prodigyopt` package's defaults (lr 1.0, no weight decay), with the
    /// workload's warm-up and cosine decay (the package's advice).
    Prodigy,
    /// H41: the hybrid as issue 41's protocol froze it, with its world model (`--world-model`,
    /// off by default since the bar's part iv).
    Hybrid,
    /// Ablation: the hybrid without its world model (every decision measured: the default since
    /// the bar's part iv).
    HybridNoWorldModel,
    /// Ablation: the hybrid line-searching the raw iterates, not the weight average.
    HybridNoAverage,
    /// Ablation: the hybrid without rollback on a risen probe loss.
    HybridNoRollback,
    /// Ablation: the hybrid without decisions inside the warm-up.
    HybridNoWarmupDecisions,
    /// Ablation: the hybrid starting at the given rate (multiplier 1, not 1/2).
    HybridStartAtOne,
    /// Ablation: the hybrid settling where the line search answers 1 (the greedy optimum).
    HybridAimOne,
    /// Control for the world model (bar part iv): the same hybrid with `--predictor last`, the
    /// last measured `s*` again.
    HybridLastValue,
    /// Control for the world model (bar part iv): the same hybrid with `--predictor
    /// power-law`, a power law of the run's progress fit to the measured `s*`.
    HybridPowerLaw,
    /// Issue 41's schedule sweep: AdamW at the 5 rates with the cosine ending at 75% and 50%
    /// of the run (then flat at the minimum), and warm-up–stable–decay (linear decay over the
    /// last 20%). With the 5 cosine-to-100% arms above, the best of these 20 is the schedule
    /// oracle.
    AdamwThirdCos75,
    AdamwHalfCos75,
    AdamwCos75,
    AdamwDoubleCos75,
    AdamwTripleCos75,
    AdamwThirdCos50,
    AdamwHalfCos50,
    AdamwCos50,
    AdamwDoubleCos50,
    AdamwTripleCos50,
    AdamwThirdWsd,
    AdamwHalfWsd,
    AdamwWsd,
    AdamwDoubleWsd,
    AdamwTripleWsd,
    /// Schedule-Free AdamW at 1/3 and 3 × its default rate (with `ScheduleFree`, its 3 rates).
    ScheduleFreeThird,
    ScheduleFreeTriple,
    /// Prodigy at 1/3 and 3 × its default rate (with `Prodigy`, its 3 rates).
    ProdigyThird,
    ProdigyTriple,
}

/// A rate-free optimizer of the controls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateFree {
    ScheduleFree,
    Prodigy,
}

impl RateFree {
    /// Its package's default rate: `schedulefree`'s 0.0025, `prodigyopt`'s 1.0.
    pub fn default_lr(self) -> f32 {
        match self {
            RateFree::ScheduleFree => 0.0025,
            RateFree::Prodigy => 1.0,
        }
    }

    /// The optimizer it runs (`--optimizer` in its flags).
    pub fn optimizer(self) -> OptimizerKind {
        match self {
            RateFree::ScheduleFree => OptimizerKind::ScheduleFree,
            RateFree::Prodigy => OptimizerKind::Prodigy,
        }
    }

    /// Its `train-gpt` flags besides the rate.
    fn flags(self) -> &'static str {
        match self {
            RateFree::ScheduleFree => {
                "--optimizer schedule-free --schedule constant --weight-decay 0"
            }
            RateFree::Prodigy => "--optimizer prodigy --weight-decay 0",
        }
    }
}

/// The schedule of an arm of AdamW's sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepSchedule {
    /// Cosine to `min_lr` at this percentage of the run, then flat.
    Cosine(u32),
    /// Warm-up, stable, linear decay over the last 20% of the run.
    Wsd,
}

impl Arm {
    pub fn name(self) -> &'static str {
        match self {
            Arm::Adamw => "adamw",
            Arm::AdamwThird => "adamw-x1/3",
            Arm::AdamwHalf => "adamw-x1/2",
            Arm::AdamwDouble => "adamw-x2",
            Arm::AdamwTriple => "adamw-x3",
            Arm::RangeTest => "range-test",
            Arm::ScheduleFree => "schedule-free AdamW",
            Arm::Prodigy => "Prodigy",
            Arm::Hybrid => "hybrid",
            Arm::HybridNoWorldModel => "hybrid, no world model",
            Arm::HybridNoAverage => "hybrid, raw iterates",
            Arm::HybridNoRollback => "hybrid, no rollback",
            Arm::HybridNoWarmupDecisions => "hybrid, no warm-up decisions",
            Arm::HybridStartAtOne => "hybrid, starting at multiplier 1",
            Arm::HybridAimOne => "hybrid, aiming at s* = 1",
            Arm::HybridLastValue => "hybrid, predictor: last measured s*",
            Arm::HybridPowerLaw => "hybrid, predictor: power law of progress",
            Arm::AdamwThirdCos75 => "adamw-x1/3, cosine to 75%",
            Arm::AdamwHalfCos75 => "adamw-x1/2, cosine to 75%",
            Arm::AdamwCos75 => "adamw, cosine to 75%",
            Arm::AdamwDoubleCos75 => "adamw-x2, cosine to 75%",
            Arm::AdamwTripleCos75 => "adamw-x3, cosine to 75%",
            Arm::AdamwThirdCos50 => "adamw-x1/3, cosine to 50%",
            Arm::AdamwHalfCos50 => "adamw-x1/2, cosine to 50%",
            Arm::AdamwCos50 => "adamw, cosine to 50%",
            Arm::AdamwDoubleCos50 => "adamw-x2, cosine to 50%",
            Arm::AdamwTripleCos50 => "adamw-x3, cosine to 50%",
            Arm::AdamwThirdWsd => "adamw-x1/3, WSD",
            Arm::AdamwHalfWsd => "adamw-x1/2, WSD",
            Arm::AdamwWsd => "adamw, WSD",
            Arm::AdamwDoubleWsd => "adamw-x2, WSD",
            Arm::AdamwTripleWsd => "adamw-x3, WSD",
            Arm::ScheduleFreeThird => "schedule-free AdamW x1/3",
            Arm::ScheduleFreeTriple => "schedule-free AdamW x3",
            Arm::ProdigyThird => "Prodigy x1/3",
            Arm::ProdigyTriple => "Prodigy x3",
        }
    }

    /// The protocol's seeds of the arm: 1 to this (5 for AdamW at the given rate and H41, 3
    /// for every other arm).
    pub fn protocol_seeds(self) -> u64 {
        match self {
            Arm::Adamw | Arm::Hybrid => 5,
            _ => 3,
        }
    }

    /// A rate-free control's optimizer and its factor on the optimizer's default rate.
    pub fn rate_free_point(self) -> Option<(RateFree, f32)> {
        Some(match self {
            Arm::ScheduleFreeThird => (RateFree::ScheduleFree, 1.0 / 3.0),
            Arm::ScheduleFree => (RateFree::ScheduleFree, 1.0),
            Arm::ScheduleFreeTriple => (RateFree::ScheduleFree, 3.0),
            Arm::ProdigyThird => (RateFree::Prodigy, 1.0 / 3.0),
            Arm::Prodigy => (RateFree::Prodigy, 1.0),
            Arm::ProdigyTriple => (RateFree::Prodigy, 3.0),
            _ => return None,
        })
    }

    /// The world model's controls of the bar's part (iv): the same controller and gate with a
    /// trivial predictor of `s*`.
    pub const TRIVIAL_PREDICTORS: [Arm; 2] = [Arm::HybridLastValue, Arm::HybridPowerLaw];

    /// The rate-free controls of the bar's part (iii), each with its arms (its rates; the
    /// range test has none: it picks its own).
    pub const RATE_FREE_CONTROLS: [(&'static str, &'static [Arm]); 3] = [
        ("LR range test", &[Arm::RangeTest]),
        (
            "Schedule-Free AdamW",
            &[
                Arm::ScheduleFreeThird,
                Arm::ScheduleFree,
                Arm::ScheduleFreeTriple,
            ],
        ),
        (
            "Prodigy",
            &[Arm::ProdigyThird, Arm::Prodigy, Arm::ProdigyTriple],
        ),
    ];

    /// An arm of AdamW's rate × schedule sweep: its factor on the given rate and its
    /// schedule (`None`: not a sweep arm).
    pub fn sweep_point(self) -> Option<(f32, SweepSchedule)> {
        use SweepSchedule::{Cosine, Wsd};
        let (third, half) = (1.0 / 3.0, 0.5);
        Some(match self {
            Arm::AdamwThird => (third, Cosine(100)),
            Arm::AdamwHalf => (half, Cosine(100)),
            Arm::Adamw => (1.0, Cosine(100)),
            Arm::AdamwDouble => (2.0, Cosine(100)),
            Arm::AdamwTriple => (3.0, Cosine(100)),
            Arm::AdamwThirdCos75 => (third, Cosine(75)),
            Arm::AdamwHalfCos75 => (half, Cosine(75)),
            Arm::AdamwCos75 => (1.0, Cosine(75)),
            Arm::AdamwDoubleCos75 => (2.0, Cosine(75)),
            Arm::AdamwTripleCos75 => (3.0, Cosine(75)),
            Arm::AdamwThirdCos50 => (third, Cosine(50)),
            Arm::AdamwHalfCos50 => (half, Cosine(50)),
            Arm::AdamwCos50 => (1.0, Cosine(50)),
            Arm::AdamwDoubleCos50 => (2.0, Cosine(50)),
            Arm::AdamwTripleCos50 => (3.0, Cosine(50)),
            Arm::AdamwThirdWsd => (third, Wsd),
            Arm::AdamwHalfWsd => (half, Wsd),
            Arm::AdamwWsd => (1.0, Wsd),
            Arm::AdamwDoubleWsd => (2.0, Wsd),
            Arm::AdamwTripleWsd => (3.0, Wsd),
            _ => return None,
        })
    }

    /// A file-name-safe key.
    pub fn key(self) -> String {
        format!("{self:?}").to_lowercase()
    }

    /// The factor on the given rate (AdamW's sweep).
    pub fn lr_factor(self) -> f32 {
        self.sweep_point().map_or(1.0, |p| p.0)
    }

    /// Whether the arm ignores the given rate (its runs are the same on W1, W2, W3 and W7).
    pub fn lr_free(self) -> bool {
        self == Arm::RangeTest || self.rate_free_point().is_some()
    }

    /// The twenty runs of AdamW's rate × schedule sweep (issue 41): the schedule oracle is
    /// their best.
    pub const SCHEDULE_SWEEP: [Arm; 20] = [
        Arm::AdamwThird,
        Arm::AdamwHalf,
        Arm::Adamw,
        Arm::AdamwDouble,
        Arm::AdamwTriple,
        Arm::AdamwThirdCos75,
        Arm::AdamwHalfCos75,
        Arm::AdamwCos75,
        Arm::AdamwDoubleCos75,
        Arm::AdamwTripleCos75,
        Arm::AdamwThirdCos50,
        Arm::AdamwHalfCos50,
        Arm::AdamwCos50,
        Arm::AdamwDoubleCos50,
        Arm::AdamwTripleCos50,
        Arm::AdamwThirdWsd,
        Arm::AdamwHalfWsd,
        Arm::AdamwWsd,
        Arm::AdamwDoubleWsd,
        Arm::AdamwTripleWsd,
    ];

    /// The five runs of AdamW's sweep.
    pub const SWEEP: [Arm; 5] = [
        Arm::AdamwThird,
        Arm::AdamwHalf,
        Arm::Adamw,
        Arm::AdamwDouble,
        Arm::AdamwTriple,
    ];

    /// The mode and optimizer its runs' curves record (its `--mode` and `--optimizer`).
    pub fn curve_names(self) -> (&'static str, &'static str) {
        let opt = (self.rate_free_point()).map_or(OptimizerKind::Adamw, |(r, _)| r.optimizer());
        (self.mode().name(), opt.name())
    }

    fn mode(self) -> TrainMode {
        match self {
            Arm::RangeTest => TrainMode::RangeTest,
            Arm::Hybrid
            | Arm::HybridNoWorldModel
            | Arm::HybridNoAverage
            | Arm::HybridNoRollback
            | Arm::HybridNoWarmupDecisions
            | Arm::HybridStartAtOne
            | Arm::HybridAimOne
            | Arm::HybridLastValue
            | Arm::HybridPowerLaw => TrainMode::Hybrid,
            _ => TrainMode::Adamw,
        }
    }
}

impl Workload {
    /// The workload whose runs an lr-free arm shares (W2, W3 and W7 are W1 at other rates).
    pub fn model_workload(self) -> Workload {
        match self {
            Workload::W2 | Workload::W3 | Workload::W7 => Workload::W1,
            w => w,
        }
    }

    /// The given peak rate; W7's is `given.w7_lr` (refused until it is fixed).
    pub fn given_lr(self, given: Given) -> Result<f32, ProtocolError> {
        Ok(match self {
            Workload::W1 | Workload::W5 | Workload::W6 => 1e-3,
            Workload::W2 => 3e-4,
            Workload::W3 => 1e-2,
            Workload::W4 | Workload::W8 => 6e-4,
            Workload::W7 => match given.w7_lr {
                None => return Err(ProtocolError::W7RateNotFixed),
                Some(lr) if !(lr.is_finite() && lr > 0.0) => {
                    return Err(ProtocolError::BadRate(lr))
                }
                Some(lr) => lr,
            },
        })
    }

    /// The run's iterations (every arm's).
    pub fn iters(self) -> u32 {
        match self {
            Workload::W5 => 600,
            Workload::W8 => 1000,
            _ => 2000,
        }
    }

    /// The text it trains on.
    pub fn corpus(self) -> Corpus {
        match self {
            Workload::W6 | Workload::W8 => Corpus::Kjv,
            _ => Corpus::Shakespeare,
        }
    }

    /// Whether the protocol runs `arm` on it: W8 runs AdamW at the given rate, H41 and
    /// AdamW's 5-rate cosine sweep; the others every arm.
    pub fn runs(self, arm: Arm) -> bool {
        self != Workload::W8 || arm == Arm::Hybrid || Arm::SWEEP.contains(&arm)
    }

    /// Whether the protocol runs AdamW's 20 rate × schedule arms on it (all but W8): where it
    /// does not, there is no schedule oracle, even though the given rate's cosine is one of them.
    pub fn sweeps_schedules(self) -> bool {
        Arm::SCHEDULE_SWEEP.iter().all(|&a| self.runs(a))
    }

    /// The decay of the moving average of AdamW-at-the-given-rate's weights (W1–W7): an
    /// average over about 1/(1 − D) = 5% of the run's steps (`docs/protocol-41.md`).
    pub fn ema_decay(self) -> Option<f32> {
        (self != Workload::W8).then(|| 1.0 - 20.0 / self.iters() as f32)
    }

    /// Whether it runs on the CPU whatever device the experiment has.
    pub fn cpu_only(self) -> bool {
        self == Workload::W5
    }

    /// The model, data and schedule flags of `train-gpt` (every arm shares them).
    fn model_flags(self) -> Vec<String> {
        let f = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        match self {
            Workload::W1 | Workload::W2 | Workload::W3 | Workload::W6 | Workload::W7 => f(
                "--layers 6 --heads 6 --embd 384 --block 256 --batch 64 --dropout 0.2 \
                 --iters 2000 --warmup 100 --precision bf16 --eval-interval 25 --eval-iters 20",
            ),
            Workload::W4 => f(
                "--variant llama --layers 8 --heads 8 --embd 512 --block 256 --batch 64 \
                 --dropout 0.2 --iters 2000 --warmup 100 --precision bf16 --eval-interval 25 \
                 --eval-iters 20",
            ),
            Workload::W5 => f(
                "--layers 4 --heads 4 --embd 128 --block 64 --batch 12 --dropout 0 --iters 600 \
                 --warmup 50 --precision fp32 --eval-interval 25 --eval-iters 10",
            ),
            Workload::W8 => f(
                "--layers 12 --heads 12 --embd 768 --block 256 --batch 32 --dropout 0.1 \
                 --iters 1000 --warmup 100 --precision bf16 --eval-interval 25 --eval-iters 20",
            ),
        }
    }

    /// The rate `--lr` of `arm`'s runs.
    pub fn lr(self, arm: Arm, given: Given) -> Result<f32, ProtocolError> {
        Ok(match arm.rate_free_point() {
            Some((opt, factor)) => opt.default_lr() * factor,
            // The range test ignores the given rate (its pick replaces it): W1's, so that W2's,
            // W3's and W7's runs are W1's.
            None if arm == Arm::RangeTest => self.model_workload().given_lr(given)?,
            None => self.given_lr(given)? * arm.lr_factor(),
        })
    }

    /// The `train-gpt` arguments of one run (without `--data`, `--device` and `--curve`).
    pub fn args(self, arm: Arm, seed: u64, given: Given) -> Result<Vec<String>, ProtocolError> {
        if !self.runs(arm) {
            return Err(ProtocolError::NotAnArmOf(self, arm.name()));
        }
        let lr = self.lr(arm, given)?;
        let mut v = self.model_flags();
        v.extend([
            "--lr".to_string(),
            format!("{lr:e}"),
            "--min-lr".into(),
            format!("{:e}", lr / 10.0),
            "--seed".into(),
            seed.to_string(),
            "--mode".into(),
            arm.mode().name().into(),
            "--eval-splits".into(),
            "val".into(),
            "--eval-fixed".into(),
            "--sample".into(),
            "0".into(),
            "--log-interval".into(),
            "500".into(),
        ]);
        let f = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        if let Some((opt, _)) = arm.rate_free_point() {
            v.extend(f(opt.flags()));
        }
        // H41 has the world model, which is no longer the default (the bar's part iv); every
        // hybrid arm is H41 but for what its name changes.
        let own_predictor = matches!(
            arm,
            Arm::HybridNoWorldModel | Arm::HybridLastValue | Arm::HybridPowerLaw
        );
        if arm.mode() == TrainMode::Hybrid && !own_predictor {
            v.push("--world-model".into());
        }
        match arm {
            Arm::Adamw => {
                if let Some(d) = self.ema_decay() {
                    v.extend(["--ema-decay".to_string(), d.to_string()]);
                }
            }
            Arm::HybridNoWorldModel => v.push("--no-world-model".into()),
            Arm::HybridNoAverage => v.push("--no-average".into()),
            Arm::HybridNoRollback => v.push("--no-rollback".into()),
            Arm::HybridNoWarmupDecisions => v.push("--no-warmup-decisions".into()),
            Arm::HybridStartAtOne => v.extend(f("--initial-multiplier 1")),
            Arm::HybridAimOne => v.extend(f("--aim 1")),
            Arm::HybridLastValue => v.extend(f("--predictor last")),
            Arm::HybridPowerLaw => v.extend(f("--predictor power-law")),
            _ => {}
        }
        match arm.sweep_point() {
            Some((_, SweepSchedule::Cosine(pct))) if pct < 100 => {
                let decay = self.iters() * pct / 100;
                v.extend(["--lr-decay-iters".to_string(), decay.to_string()]);
            }
            Some((_, SweepSchedule::Wsd)) => v.extend(f("--schedule wsd --decay-fraction 0.2")),
            _ => {}
        }
        Ok(v)
    }
}

#[cfg(test)]
#[path = "protocol_tests.rs"]
mod tests;
