use super::*;
use clap::ValueEnum;

fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1).map(String::as_str)
}

/// W7's rate as a test gives it.
const GIVEN: Given = Given { w7_lr: Some(2e-3) };

/// Every arm's run parses as `train-gpt` flags, at the rate the protocol gives it; W8 refuses
/// the arms it does not run.
#[test]
fn every_run_is_a_valid_train_gpt_command_at_its_rate() {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: crate::train_args::TrainArgs,
    }
    use clap::Parser;
    let mut runs = 0;
    for &w in Workload::value_variants() {
        for &arm in Arm::value_variants() {
            let Ok(args) = w.args(arm, 3, GIVEN) else {
                assert_eq!(w, Workload::W8, "{arm:?}");
                assert!(!w.runs(arm), "{arm:?}");
                continue;
            };
            runs += 1;
            let mut argv = vec!["t".to_string(), "--data".into(), "x.txt".into()];
            argv.extend(args.iter().cloned());
            let parsed = Cli::try_parse_from(&argv)
                .unwrap_or_else(|e| panic!("{w:?} {arm:?}: {e}"))
                .args;
            let given = if w == Workload::W7 {
                2e-3
            } else {
                w.given_lr(GIVEN).unwrap()
            };
            let want = match arm {
                Arm::ScheduleFree => 0.0025,
                Arm::ScheduleFreeThird => 0.0025 / 3.0,
                Arm::ScheduleFreeTriple => 0.0075,
                Arm::Prodigy => 1.0,
                Arm::ProdigyThird => 1.0 / 3.0,
                Arm::ProdigyTriple => 3.0,
                Arm::RangeTest => w.model_workload().given_lr(GIVEN).unwrap(),
                _ => given * arm.lr_factor(),
            };
            assert!((parsed.lr - want).abs() <= 1e-6 * want, "{w:?} {arm:?}");
            assert!((parsed.min_lr - want / 10.0).abs() <= 1e-6 * want);
            assert_eq!(flag(&args, "--seed"), Some("3"));
            assert!(parsed.eval_fixed);
            // What the report checks a curve against is what the run records.
            let recorded = (parsed.mode.name(), parsed.optimizer.name());
            assert_eq!(recorded, arm.curve_names(), "{w:?} {arm:?}");
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
            // The rate-free controls: their optimizer at every rate.
            let opt = match arm.rate_free_point() {
                Some((RateFree::ScheduleFree, _)) => OptimizerKind::ScheduleFree,
                Some((RateFree::Prodigy, _)) => OptimizerKind::Prodigy,
                None => OptimizerKind::Adamw,
            };
            assert_eq!(a.optimizer, opt, "{w:?} {arm:?}");
            // H41 and its ablations with the world model (not the default since the bar's part
            // iv), the controls with their predictor, the no-world-model ablation with none.
            let c = a.control.config();
            let want_predictor = match arm {
                _ if arm.mode() != TrainMode::Hybrid => None,
                Arm::HybridNoWorldModel => None,
                Arm::HybridLastValue => Some(Predictor::Last),
                Arm::HybridPowerLaw => Some(Predictor::PowerLaw),
                _ => Some(Predictor::Rssm),
            };
            let got = c.world_model.then_some(c.predictor);
            assert_eq!(got, want_predictor, "{w:?} {arm:?}");
            // The average of the weights: AdamW at the given rate only, W1–W7 only.
            let ema = arm == Arm::Adamw && w != Workload::W8;
            assert_eq!(a.ema_decay.is_some(), ema, "{w:?} {arm:?}");
        }
    }
    // 7 workloads × 36 arms, and W8's 6.
    assert_eq!(Arm::value_variants().len(), 36);
    assert_eq!(runs, 7 * 36 + 6);
}

use crate::control::cli::TrainMode;
use crate::control::trivial::Predictor;
use crate::train_step::OptimizerKind;

/// The rate-free arms of W2, W3 and W7 are W1's runs; nothing else is shared.
#[test]
fn only_rate_free_arms_share_runs() {
    for &arm in Arm::value_variants() {
        for w in [Workload::W2, Workload::W3, Workload::W7] {
            assert_eq!(
                w.args(arm, 1, GIVEN).unwrap() == Workload::W1.args(arm, 1, GIVEN).unwrap(),
                arm.lr_free(),
                "{w:?} {arm:?}"
            );
        }
    }
    assert_eq!(Workload::W3.model_workload(), Workload::W1);
    // The schedule sweep is the 5 rates × 4 schedules, each once.
    let points: std::collections::BTreeSet<String> = Arm::SCHEDULE_SWEEP
        .iter()
        .map(|a| format!("{:?}", a.sweep_point().unwrap()))
        .collect();
    assert_eq!(points.len(), 20);
    for w in [Workload::W4, Workload::W6, Workload::W8] {
        assert_eq!(w.model_workload(), w);
    }
    // Each rate-free control at 1/3, 1 and 3 × its default (the range test: its own pick).
    for (name, arms) in Arm::RATE_FREE_CONTROLS {
        let factors: Vec<f32> = arms
            .iter()
            .filter_map(|a| a.rate_free_point())
            .map(|p| p.1)
            .collect();
        match name {
            "LR range test" => assert!(factors.is_empty()),
            _ => assert_eq!(factors, [1.0 / 3.0, 1.0, 3.0], "{name}"),
        }
        assert!(arms.iter().all(|a| a.lr_free()));
    }
}

/// W7 refuses to run until its rate is given (never a guessed one), and a given rate that is
/// not one is refused; W6 and W8 train on the KJV corpus, W8 its own model, 1000 steps.
#[test]
fn w6_to_w8_follow_the_protocol() {
    let none = Given::default();
    assert_eq!(
        Workload::W7.args(Arm::Adamw, 1, none),
        Err(ProtocolError::W7RateNotFixed)
    );
    assert!(ProtocolError::W7RateNotFixed
        .to_string()
        .contains("--w7-lr"));
    for bad in [0.0, -1e-3, f32::NAN, f32::INFINITY] {
        let g = Given { w7_lr: Some(bad) };
        assert!(matches!(
            Workload::W7.given_lr(g),
            Err(ProtocolError::BadRate(_))
        ));
    }
    // W7's lr-free arms are W1's runs: they need no rate.
    assert!(Workload::W7.args(Arm::Prodigy, 1, none).is_ok());
    assert!(Workload::W7.args(Arm::RangeTest, 1, none).is_ok());
    let w7 = Workload::W7.args(Arm::AdamwTriple, 1, GIVEN).unwrap();
    assert_eq!(flag(&w7, "--lr"), Some("6e-3"));
    assert_eq!(Workload::W6.corpus(), Corpus::Kjv);
    assert_eq!(Workload::W8.corpus(), Corpus::Kjv);
    assert_eq!(Workload::W7.corpus(), Corpus::Shakespeare);
    let w8 = Workload::W8.args(Arm::Hybrid, 2, none).unwrap();
    for (name, want) in [
        ("--layers", "12"),
        ("--heads", "12"),
        ("--embd", "768"),
        ("--block", "256"),
        ("--batch", "32"),
        ("--dropout", "0.1"),
        ("--iters", "1000"),
        ("--warmup", "100"),
        ("--precision", "bf16"),
        ("--lr", "6e-4"),
        ("--mode", "hybrid"),
    ] {
        assert_eq!(flag(&w8, name), Some(want), "{name}");
    }
    let ran: Vec<Arm> = Arm::value_variants()
        .iter()
        .copied()
        .filter(|a| Workload::W8.runs(*a))
        .collect();
    let mut want = Arm::SWEEP.to_vec();
    want.push(Arm::Hybrid);
    want.sort();
    assert_eq!(ran, want);
    assert_eq!(
        Workload::W8.args(Arm::Prodigy, 1, none),
        Err(ProtocolError::NotAnArmOf(Workload::W8, "Prodigy"))
    );
    // The average's decay: 5% of the run's steps.
    assert_eq!(Workload::W1.ema_decay(), Some(0.99));
    let w1 = Workload::W1.args(Arm::Adamw, 1, none).unwrap();
    assert_eq!(flag(&w1, "--ema-decay"), Some("0.99"));
    assert!((Workload::W5.ema_decay().unwrap() - (1.0 - 1.0 / 30.0)).abs() < 1e-6);
    assert_eq!(Workload::W8.ema_decay(), None);
}

/// W7's rate, fixed from W1's completed rate sweep (`docs/protocol-41.md`), is W1's given rate:
/// then every arm of W7 runs `train-gpt` with W1's arguments, seed for seed, so W7 is W1 and
/// is not run again.
#[test]
fn w7_at_its_fixed_rate_runs_what_w1_runs() {
    let fixed = Given { w7_lr: Some(1e-3) };
    assert_eq!(Workload::W1.given_lr(fixed).unwrap(), 1e-3);
    for &arm in Arm::value_variants() {
        for seed in 1..=5 {
            assert_eq!(
                Workload::W7.args(arm, seed, fixed).unwrap(),
                Workload::W1.args(arm, seed, fixed).unwrap(),
                "{arm:?} seed {seed}"
            );
        }
    }
}
