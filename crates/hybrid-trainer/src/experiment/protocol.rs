//! The experiment's protocol, fixed before it runs: the workloads, the arms, and the
//! `train-gpt` flags of each run.

use crate::control::cli::TrainMode;
use serde::{Deserialize, Serialize};

/// A workload: a model, its data and schedule, and the learning rate a user would have typed.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    clap::ValueEnum,
    Serialize,
    Deserialize,
    Hash,
    PartialOrd,
    Ord,
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
}

/// One run's configuration.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    clap::ValueEnum,
    Serialize,
    Deserialize,
    Hash,
    PartialOrd,
    Ord,
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
    /// The hybrid trainer (default configuration).
    Hybrid,
    /// Ablation: the hybrid without its world model (every decision measured).
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
        }
    }

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

    /// Whether the arm ignores the given rate (its runs are the same on W1, W2 and W3).
    pub fn lr_free(self) -> bool {
        matches!(self, Arm::RangeTest | Arm::ScheduleFree | Arm::Prodigy)
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

    fn mode(self) -> TrainMode {
        match self {
            Arm::RangeTest => TrainMode::RangeTest,
            Arm::Hybrid
            | Arm::HybridNoWorldModel
            | Arm::HybridNoAverage
            | Arm::HybridNoRollback
            | Arm::HybridNoWarmupDecisions
            | Arm::HybridStartAtOne
            | Arm::HybridAimOne => TrainMode::Hybrid,
            _ => TrainMode::Adamw,
        }
    }
}

impl Workload {
    /// The workload whose runs an lr-free arm shares (W2 and W3 are W1 at other rates).
    pub fn model_workload(self) -> Workload {
        match self {
            Workload::W2 | Workload::W3 => Workload::W1,
            w => w,
        }
    }

    pub fn given_lr(self) -> f32 {
        match self {
            Workload::W1 | Workload::W5 => 1e-3,
            Workload::W2 => 3e-4,
            Workload::W3 => 1e-2,
            Workload::W4 => 6e-4,
        }
    }

    /// The run's iterations (every arm's).
    pub fn iters(self) -> u32 {
        match self {
            Workload::W5 => 600,
            _ => 2000,
        }
    }

    /// Whether it runs on the CPU whatever device the experiment has.
    pub fn cpu_only(self) -> bool {
        self == Workload::W5
    }

    /// The model, data and schedule flags of `train-gpt` (every arm shares them).
    fn model_flags(self) -> Vec<String> {
        let f = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        match self {
            Workload::W1 | Workload::W2 | Workload::W3 => f(
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
        }
    }

    /// The `train-gpt` arguments of one run (without `--data`, `--device` and `--curve`).
    pub fn args(self, arm: Arm, seed: u64) -> Vec<String> {
        let lr = match arm {
            Arm::ScheduleFree => 0.0025,
            Arm::Prodigy => 1.0,
            // The range test ignores the given rate (its pick replaces it): W1's, so that W2's
            // and W3's runs are W1's.
            Arm::RangeTest => self.model_workload().given_lr(),
            _ => self.given_lr() * arm.lr_factor(),
        };
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
        match arm {
            Arm::ScheduleFree => v.extend(f(
                "--optimizer schedule-free --schedule constant --weight-decay 0",
            )),
            Arm::Prodigy => v.extend(f("--optimizer prodigy --weight-decay 0")),
            Arm::HybridNoWorldModel => v.push("--no-world-model".into()),
            Arm::HybridNoAverage => v.push("--no-average".into()),
            Arm::HybridNoRollback => v.push("--no-rollback".into()),
            Arm::HybridNoWarmupDecisions => v.push("--no-warmup-decisions".into()),
            Arm::HybridStartAtOne => v.extend(f("--initial-multiplier 1")),
            Arm::HybridAimOne => v.extend(f("--aim 1")),
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
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
        let i = args.iter().position(|a| a == name)?;
        args.get(i + 1).map(String::as_str)
    }

    /// Every arm's run parses as `train-gpt` flags, at the rate the protocol gives it.
    #[test]
    fn every_run_is_a_valid_train_gpt_command_at_its_rate() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: crate::train_args::TrainArgs,
        }
        use clap::{Parser, ValueEnum};
        for &w in Workload::value_variants() {
            for &arm in Arm::value_variants() {
                let args = w.args(arm, 3);
                let mut argv = vec!["t".to_string(), "--data".into(), "x.txt".into()];
                argv.extend(args.iter().cloned());
                let parsed = Cli::try_parse_from(&argv)
                    .unwrap_or_else(|e| panic!("{w:?} {arm:?}: {e}"))
                    .args;
                let want = match arm {
                    Arm::ScheduleFree => 0.0025,
                    Arm::Prodigy => 1.0,
                    Arm::RangeTest => w.model_workload().given_lr(),
                    _ => w.given_lr() * arm.lr_factor(),
                };
                assert!((parsed.lr - want).abs() <= 1e-6 * want, "{w:?} {arm:?}");
                assert!((parsed.min_lr - want / 10.0).abs() <= 1e-6 * want);
                assert_eq!(flag(&args, "--seed"), Some("3"));
                assert!(parsed.eval_fixed);
                let a = &parsed;
                assert_eq!(a.iters, w.iters(), "{w:?}");
                let lr = |it| crate::train_args::learning_rate(a, it);
                match arm.sweep_point() {
                    Some((_, SweepSchedule::Cosine(pct))) => {
                        assert_eq!(a.decay_iters(), w.iters() * pct / 100, "{w:?} {arm:?}");
                        let flat = a.decay_iters() < a.iters;
                        assert_eq!(lr(a.iters - 1) == a.min_lr, flat, "{w:?} {arm:?}");
                    }
                    Some((_, SweepSchedule::Wsd)) => {
                        let stable = w.iters() * 4 / 5;
                        assert_eq!(lr(stable), a.lr, "{w:?} {arm:?}");
                        assert!(lr(stable + 1) < a.lr && lr(a.iters) == a.min_lr);
                    }
                    None => {}
                }
            }
        }
    }

    /// The rate-free arms of W2 and W3 are W1's runs; nothing else is shared.
    #[test]
    fn only_rate_free_arms_share_runs() {
        use clap::ValueEnum;
        for &arm in Arm::value_variants() {
            assert_eq!(
                Workload::W2.args(arm, 1) == Workload::W1.args(arm, 1),
                arm.lr_free(),
                "{arm:?}"
            );
        }
        assert_eq!(Workload::W3.model_workload(), Workload::W1);
        // The schedule sweep is the 5 rates × 4 schedules, each once.
        let points: std::collections::BTreeSet<String> = Arm::SCHEDULE_SWEEP
            .iter()
            .map(|a| format!("{:?}", a.sweep_point().unwrap()))
            .collect();
        assert_eq!(points.len(), 20);
        assert_eq!(Workload::W4.model_workload(), Workload::W4);
    }
}
