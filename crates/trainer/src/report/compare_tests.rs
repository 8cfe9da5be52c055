//! Tests of the side-by-side report: the target, first reach, savings and verdicts (a win, a
//! loss, never reached), the JSON round trip and the three files.

use super::*;
use crate::control::hybrid::ControlCosts;
use crate::control::DecisionRecord;

/// A curve with evaluations every 10 steps of the given val losses (1 s a step).
fn curve(mode: &str, vals: &[f32], probes: u64) -> RunCurve {
    let evals = vals
        .iter()
        .enumerate()
        .map(|(i, &val)| {
            let it = 10 * i as u32;
            EvalPoint {
                iter: it,
                backward: u64::from(it),
                forward: u64::from(it) + probes * i as u64,
                seconds: f64::from(it) * 1.1,
                train: f32::NAN,
                val,
                lr: 1e-3,
                ema_val: f32::NAN,
            }
        })
        .collect();
    RunCurve {
        mode: mode.into(),
        iters: 10 * (vals.len() as u32 - 1),
        evals,
        ..RunCurve::default()
    }
}

fn compare(a: RunCurve, h: RunCurve) -> Comparison {
    Comparison::new(
        "t".into(),
        "cpu".into(),
        "c".into(),
        serde_json::json!({}),
        a,
        h,
    )
}

#[test]
fn a_hybrid_that_gets_there_first_shows_a_saving() {
    let c = compare(
        curve("adamw", &[4.0, 3.0, 2.5, 2.0], 0),
        curve("hybrid", &[4.0, 2.8, 2.0, 1.9], 2),
    );
    assert_eq!(c.target_val, 2.0);
    assert_eq!(c.rows[0].reached.unwrap().iter, 30);
    assert_eq!(c.rows[1].reached.unwrap().iter, 20);
    let b = c.savings.backward_pct.unwrap();
    assert!((b - 100.0 / 3.0).abs() < 1e-9, "{b}");
    assert!(c.verdict.contains("fewer backward"), "{}", c.verdict);
    assert!(!c.verdict.contains("no saving"), "{}", c.verdict);
}

#[test]
fn a_hybrid_that_is_slower_or_never_gets_there_says_so() {
    let slow = compare(
        curve("adamw", &[4.0, 2.0, 2.5], 0),
        curve("hybrid", &[4.0, 3.0, 2.0], 0),
    );
    assert!(slow.savings.backward_pct.unwrap() < 0.0);
    assert!(slow.verdict.contains("more backward passes") && slow.verdict.contains("no saving"));
    let never = compare(
        curve("adamw", &[4.0, 3.0, 2.0], 0),
        curve("hybrid", &[4.0, 3.0, f32::NAN], 0),
    );
    assert!(never.rows[1].reached.is_none());
    assert_eq!(never.savings, Savings::default());
    assert!(never.verdict.contains("never reached"), "{}", never.verdict);
    let md = markdown(&never, "x.png");
    assert!(md.contains("| hybrid | never | never | never |"), "{md}");
    let none = compare(curve("adamw", &[f32::NAN], 0), curve("hybrid", &[1.0], 0));
    assert!(none.target_val.is_nan() && none.rows[1].reached.is_none());
    assert!(none.verdict.contains("nothing to compare"));
}

#[test]
fn the_report_files_are_written_and_the_json_reads_back() {
    let mut h = curve("hybrid", &[4.0, 2.8, 2.0, 2.1], 3);
    h.decisions = vec![
        DecisionRecord {
            step: 10,
            multiplier: 1.4,
            scale: Some(2.0),
            measured: true,
            rollback: false,
            probe_loss: 2.9,
            probe_forwards: 6,
            overfit: false,
        },
        DecisionRecord {
            step: 20,
            multiplier: 0.7,
            scale: None,
            measured: false,
            rollback: true,
            probe_loss: f32::NAN,
            probe_forwards: 2,
            overfit: false,
        },
    ];
    h.rollbacks = 1;
    h.costs = Some(ControlCosts {
        probe_forwards: 9,
        probe_seconds: 0.5,
        measured: 1,
        predicted: 1,
        ..ControlCosts::default()
    });
    let c = compare(curve("adamw", &[4.0, 3.0, 2.5, 2.0], 0), h);
    let dir = std::env::temp_dir().join(format!("compare-report-{}", std::process::id()));
    let paths = write_comparison(&dir, "report", &c).unwrap();
    let md = std::fs::read_to_string(&paths.markdown).unwrap();
    assert!(md.contains("probe forward passes | 9"), "{md}");
    assert!(
        md.contains("| 20 | 0.700 | - | predicted | yes | NaN |"),
        "{md}"
    );
    let back: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&paths.json).unwrap()).unwrap();
    assert_eq!(back["runs"].as_array().unwrap().len(), 2);
    assert_eq!(back["runs"][1]["mode"], "hybrid");
    let png = std::fs::read(&paths.png).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    std::fs::remove_dir_all(&dir).ok();
}
