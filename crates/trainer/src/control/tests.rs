use super::world::Gate;
use super::*;

/// On an exact parabola the fit recovers its minimum; the clamps and the degenerate shapes give
/// the documented bounds.
#[test]
fn best_scale_finds_the_parabolas_minimum() {
    for (min, e) in [(1.3f64, 2.0f32), (0.7, 2.0), (1.0, 1.5), (1.9, 3.0)] {
        let f = |s: f64| (2.0 + 0.3 * (s - min).powi(2)) as f32;
        let s = best_scale(f(0.0), f(1.0), f(e as f64), e, 2.0).unwrap();
        assert!((s as f64 - min).abs() < 1e-3, "min {min}, e {e}: got {s}");
    }
    // Minimum beyond the bounds: clamped.
    let f = |s: f32| 1.0 + 0.1 * (s - 5.0).powi(2);
    assert_eq!(best_scale(f(0.0), f(1.0), f(2.0), 2.0, 2.0), Some(2.0));
    let f = |s: f32| 1.0 + 0.1 * (s + 3.0).powi(2);
    assert_eq!(best_scale(f(0.0), f(1.0), f(2.0), 2.0, 2.0), Some(0.5));
    // Concave, still falling past the end: the upper bound; rising: the lower one.
    assert_eq!(best_scale(3.0, 2.9, 2.5, 2.0, 2.0), Some(2.0));
    assert_eq!(best_scale(3.0, 3.1, 3.5, 2.0, 2.0), Some(0.5));
    // Flat: no information, the lower bound (do not grow on nothing).
    assert_eq!(best_scale(3.0, 3.0, 3.0, 2.0, 2.0), Some(0.5));
    for bad in [f32::NAN, f32::INFINITY] {
        assert_eq!(best_scale(bad, 1.0, 1.0, 2.0, 2.0), None);
        assert_eq!(best_scale(1.0, bad, 1.0, 2.0, 2.0), None);
        assert_eq!(best_scale(1.0, 1.0, bad, 2.0, 2.0), None);
    }
}

#[test]
fn every_bad_setting_is_named() {
    let ok = ControlConfig::default();
    ok.validate().unwrap();
    let cases: Vec<(&str, ControlConfig)> = vec![
        (
            "segment",
            ControlConfig {
                segment: 0,
                ..ok.clone()
            },
        ),
        (
            "probe_batches",
            ControlConfig {
                probe_batches: 0,
                ..ok.clone()
            },
        ),
        (
            "extrapolate",
            ControlConfig {
                extrapolate: 1.0,
                ..ok.clone()
            },
        ),
        (
            "extrapolate",
            ControlConfig {
                extrapolate: f32::NAN,
                ..ok.clone()
            },
        ),
        (
            "max_change",
            ControlConfig {
                max_change: 0.5,
                ..ok.clone()
            },
        ),
        (
            "max_multiplier",
            ControlConfig {
                max_multiplier: f32::INFINITY,
                ..ok.clone()
            },
        ),
        (
            "gain",
            ControlConfig {
                gain: -0.1,
                ..ok.clone()
            },
        ),
        (
            "adapt_until",
            ControlConfig {
                adapt_until: 1.5,
                ..ok.clone()
            },
        ),
        (
            "rollback_tolerance",
            ControlConfig {
                rollback_tolerance: Some(-1.0),
                ..ok.clone()
            },
        ),
        (
            "trust",
            ControlConfig {
                trust: f32::NAN,
                ..ok.clone()
            },
        ),
        (
            "initial_multiplier",
            ControlConfig {
                initial_multiplier: 1.0 / 65.0,
                ..ok.clone()
            },
        ),
        (
            "initial_multiplier",
            ControlConfig {
                initial_multiplier: f32::NAN,
                ..ok.clone()
            },
        ),
        (
            "aim",
            ControlConfig {
                aim: 0.0,
                ..ok.clone()
            },
        ),
        (
            "probe_holdout",
            ControlConfig {
                probe_holdout: 0.5,
                ..ok.clone()
            },
        ),
        (
            "probe_holdout",
            ControlConfig {
                probe_holdout: f32::NAN,
                ..ok.clone()
            },
        ),
    ];
    for (field, cfg) in cases {
        assert_eq!(cfg.validate().unwrap_err().field, field);
        assert!(Controller::new(cfg).is_err());
    }
}

/// The multiplier moves by `s^gain`, is cut by a rollback, and stays within its bounds however
/// many decisions push it.
#[test]
fn the_multiplier_follows_the_decisions_within_its_bounds() {
    let mut c = Controller::new(ControlConfig::default()).unwrap();
    assert_eq!(c.multiplier(), ControlConfig::default().initial_multiplier);
    let start = c.multiplier();
    let up = Decision::Continue {
        scale: Some(2.0),
        measured: true,
    };
    c.apply(25, up, 2.0);
    // c ← c·(s/aim)^gain.
    let cfg = ControlConfig::default();
    let moved = start * (2.0 / cfg.aim).powf(cfg.gain);
    assert!((c.multiplier() - moved).abs() < 1e-6);
    c.apply(50, Decision::Rollback, f32::NAN);
    assert!((c.multiplier() - moved / 2.0).abs() < 1e-6);
    // At s* = aim the multiplier holds.
    let hold = Decision::Continue {
        scale: Some(cfg.aim),
        measured: true,
    };
    let before = c.multiplier();
    c.apply(60, hold, 2.0);
    assert!((c.multiplier() - before).abs() < 1e-6);
    assert_eq!(c.rollbacks, 1);
    // A scale outside [1/2, 2] counts as the bound.
    let huge = Decision::Continue {
        scale: Some(1e9),
        measured: false,
    };
    for i in 0..100 {
        c.apply(75 + i, huge, 1.0);
    }
    assert_eq!(c.multiplier(), 64.0);
    for i in 0..100 {
        c.apply(200 + i, Decision::Rollback, 1.0);
    }
    assert!(c.at_floor());
    assert_eq!(c.history.len(), 203);
    assert!(c.history[1].rollback && !c.history[0].rollback);
}

#[test]
fn rollback_on_a_non_finite_or_risen_loss() {
    let c = Controller::new(ControlConfig::default()).unwrap();
    assert!(c.must_roll_back(2.0, f32::NAN));
    assert!(c.must_roll_back(2.0, f32::INFINITY));
    assert!(c.must_roll_back(2.0, 2.05));
    assert!(!c.must_roll_back(2.0, 2.03));
    assert!(!c.must_roll_back(2.0, 1.5));
    let off = Controller::new(ControlConfig {
        rollback_tolerance: None,
        ..ControlConfig::default()
    })
    .unwrap();
    assert!(off.must_roll_back(2.0, f32::NAN));
    assert!(!off.must_roll_back(2.0, 9.0));
}

#[test]
fn adaptation_runs_to_its_end_fraction_from_the_start_or_the_warm_up_end() {
    let c = Controller::new(ControlConfig::default()).unwrap();
    assert!(c.adapting(1, 100, 2000));
    assert!(c.adapting(100, 100, 2000));
    let late = Controller::new(ControlConfig {
        adapt_in_warmup: false,
        ..ControlConfig::default()
    })
    .unwrap();
    assert!(!late.adapting(100, 100, 2000));
    assert!(late.adapting(101, 100, 2000));
    assert!(!late.adapting(1000, 100, 2000));
    assert!(c.adapting(101, 100, 2000));
    assert!(c.adapting(999, 100, 2000));
    assert!(!c.adapting(1000, 100, 2000));
    // The weight average moves from the first step (through the warm-up) to the same end.
    assert!(c.before_adaptation_ends(1, 2000));
    assert!(c.before_adaptation_ends(999, 2000));
    assert!(!c.before_adaptation_ends(1000, 2000));
}

/// The gate trusts a model only after enough measured decisions with a small error and spread,
/// never for more than `max_run` decisions in a row, and closes when the model starts lying.
#[test]
fn the_gate_trusts_only_a_model_that_keeps_being_right() {
    let mut g = Gate::new(0.15, 3, 2);
    assert!(!g.trusts(0.0), "no score yet");
    for _ in 0..3 {
        g.measured(Some(0.50), 0.52);
    }
    assert!(g.trusts(0.05));
    assert!(!g.trusts(0.5), "a wide ensemble is not trusted");
    assert!(!g.trusts(f32::NAN));
    g.predicted();
    g.predicted();
    assert!(
        !g.trusts(0.05),
        "two predictions in a row: the next is measured"
    );
    g.measured(Some(0.5), 0.5);
    assert!(g.trusts(0.05));
    // It lies: one wild prediction closes the gate at once.
    g.measured(Some(-1.0), 0.5);
    assert!(!g.trusts(0.0));
    g.measured(Some(f32::NAN), 0.5);
    assert!(!g.trusts(0.0));
    // Honest again: the error decays and the gate reopens.
    for _ in 0..20 {
        g.measured(Some(0.5), 0.5);
    }
    assert!(g.trusts(0.05));
}
