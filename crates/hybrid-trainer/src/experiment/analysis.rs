//! The experiment's figures from the runs' curves: the target (the median best validation loss
//! of AdamW at the given rate over the seeds), what each run spent to first reach it, paired
//! differences against AdamW at the given rate, the oracle (the best run of AdamW's sweep), and
//! the markdown tables.

use super::protocol::{Arm, Workload};
use crate::train_curve::RunCurve;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The runs of one workload: arm → seed → curve.
pub type Runs = BTreeMap<Arm, BTreeMap<u64, RunCurve>>;

/// What a run spent to first reach the target.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reach {
    pub backward: u64,
    pub forward: u64,
    pub seconds: f64,
}

fn median(mut xs: Vec<f64>) -> Option<f64> {
    xs.retain(|x| x.is_finite());
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    Some(if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    })
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len().max(1) as f64
}

/// The best validation loss of a run (NaN evaluations ignored; +inf when none is finite).
pub fn best_val(c: &RunCurve) -> f32 {
    c.evals
        .iter()
        .map(|e| e.val)
        .filter(|v| v.is_finite())
        .fold(f32::INFINITY, f32::min)
}

/// The median best validation loss of AdamW at the given rate over its seeds.
pub fn target(runs: &Runs) -> Option<f32> {
    let base = runs.get(&Arm::Adamw)?;
    median(base.values().map(|c| best_val(c) as f64).collect()).map(|m| m as f32)
}

/// The first evaluation at or below `target`.
pub fn reach(c: &RunCurve, target: f32) -> Option<Reach> {
    c.evals.iter().find(|e| e.val <= target).map(|e| Reach {
        backward: e.backward,
        forward: e.forward,
        seconds: e.seconds,
    })
}

/// What a run spent to the target: its first crossing, or (censored) everything it spent when
/// it never crossed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cost {
    pub reach: Reach,
    /// The run never reached the target: `reach` is its whole budget, a lower bound.
    pub censored: bool,
}

pub fn cost(c: &RunCurve, target: f32) -> Option<Cost> {
    match reach(c, target) {
        Some(r) => Some(Cost {
            reach: r,
            censored: false,
        }),
        None => c.evals.last().map(|e| Cost {
            reach: Reach {
                backward: e.backward,
                forward: e.forward,
                seconds: e.seconds,
            },
            censored: true,
        }),
    }
}

/// Per arm: the mean backward passes to the target over its seeds (a run that never reached
/// it counts as its whole budget) and whether any run was censored so.
pub fn mean_backward(runs: &BTreeMap<u64, RunCurve>, target: f32) -> Option<(f64, bool)> {
    let c: Vec<Cost> = runs.values().filter_map(|c| cost(c, target)).collect();
    (!c.is_empty()).then(|| {
        (
            mean(
                &c.iter()
                    .map(|c| c.reach.backward as f64)
                    .collect::<Vec<_>>(),
            ),
            c.iter().any(|c| c.censored),
        )
    })
}

/// The oracle: the arm of AdamW's sweep with the fewest mean backward passes to the target.
pub fn oracle(runs: &Runs, target: f32) -> Option<(Arm, f64, bool)> {
    Arm::SWEEP
        .iter()
        .filter_map(|a| {
            let (m, cens) = mean_backward(runs.get(a)?, target)?;
            Some((*a, m, cens))
        })
        .min_by(|x, y| x.1.total_cmp(&y.1))
}

/// A figure, marked `≥` when a censored run went into it.
fn mark(x: f64, censored: bool, prec: usize) -> String {
    format!("{}{x:.prec$}", if censored { "≥" } else { "" })
}

/// The mean over the seeds of `1 − arm/AdamW` (in %), seed by seed; marked `*` when a
/// censored run went into it (then it is a bound, not a measurement).
fn paired(
    seeds: &BTreeMap<u64, RunCurve>,
    base: &BTreeMap<u64, RunCurve>,
    target: f32,
    f: &dyn Fn(&Reach) -> f64,
) -> String {
    let mut d = Vec::new();
    let mut cens = false;
    for (seed, c) in seeds {
        let (Some(a), Some(b)) = (
            cost(c, target),
            base.get(seed).and_then(|b| cost(b, target)),
        ) else {
            continue;
        };
        if a.censored && b.censored {
            continue;
        }
        cens |= a.censored || b.censored;
        d.push(1.0 - f(&a.reach) / f(&b.reach));
    }
    if d.is_empty() {
        return "—".into();
    }
    format!("{:+.1}%{}", 100.0 * mean(&d), if cens { "*" } else { "" })
}

/// The markdown table of one workload.
pub fn table(w: Workload, runs: &Runs) -> String {
    let mut s = String::new();
    let given = w.given_lr();
    let _ = writeln!(s, "### {w:?} (given peak rate {given:e})\n");
    let Some(target) = target(runs) else {
        let _ = writeln!(s, "AdamW at the given rate has not run: no target.\n");
        return s;
    };
    let base = runs.get(&Arm::Adamw).cloned().unwrap_or_default();
    let _ = writeln!(
        s,
        "Target: val {target:.4} (median best of AdamW at the given rate over {} seeds).",
        base.len()
    );
    if let Some((arm, b, cens)) = oracle(runs, target) {
        let _ = writeln!(
            s,
            "Oracle: {} ({} backward passes, mean).",
            arm.name(),
            mark(b, cens, 0)
        );
    }
    let _ = writeln!(
        s,
        "\n| arm | peak lr | seeds reached | backward passes (per seed) | mean | saved vs AdamW (paired) | forward passes (mean) | seconds (mean) | saved vs AdamW (paired) | best val | final val |\n|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (arm, seeds) in runs {
        let costs: Vec<Cost> = seeds.values().filter_map(|c| cost(c, target)).collect();
        let per_seed = costs
            .iter()
            .map(|c| {
                if c.censored {
                    "never".into()
                } else {
                    c.reach.backward.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join(" / ");
        let cens = costs.iter().any(|c| c.censored);
        let m = |f: &dyn Fn(&Reach) -> f64| {
            mean(&costs.iter().map(|c| f(&c.reach)).collect::<Vec<_>>())
        };
        let peak = mean(&seeds.values().map(|c| c.peak_lr as f64).collect::<Vec<_>>());
        let bests: Vec<f64> = seeds.values().map(|c| best_val(c) as f64).collect();
        let finals: Vec<f64> = seeds
            .values()
            .map(|c| c.evals.last().map_or(f64::NAN, |e| e.val as f64))
            .collect();
        let _ = writeln!(
            s,
            "| {} | {peak:.2e} | {}/{} | {per_seed} | {} | {} | {} | {} | {} | {:.4} | {:.4} |",
            arm.name(),
            costs.iter().filter(|c| !c.censored).count(),
            seeds.len(),
            mark(m(&|r| r.backward as f64), cens, 0),
            paired(seeds, &base, target, &|r| r.backward as f64),
            mark(m(&|r| r.forward as f64), cens, 0),
            mark(m(&|r| r.seconds), cens, 2),
            paired(seeds, &base, target, &|r| r.seconds),
            mean(&bests),
            mean(&finals),
        );
    }
    let _ = writeln!(
        s,
        "\nA run that never reached the target counts as its whole budget (`never`, and `≥` on \
         the means it enters); a paired saving marked `*` includes such a run and is a bound."
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train_curve::EvalPoint;

    fn curve(vals: &[f32]) -> RunCurve {
        RunCurve {
            evals: vals
                .iter()
                .enumerate()
                .map(|(i, &v)| EvalPoint {
                    iter: 25 * i as u32,
                    backward: 25 * i as u64,
                    forward: 26 * i as u64,
                    seconds: i as f64,
                    train: f32::NAN,
                    val: v,
                    lr: 1e-3,
                    ema_val: f32::NAN,
                })
                .collect(),
            peak_lr: 1e-3,
            ..RunCurve::default()
        }
    }

    /// The target is the median of AdamW's best values; a run reaches it at its first
    /// evaluation at or below it; the oracle is the sweep arm with the fewest passes.
    #[test]
    fn target_reach_and_oracle_follow_the_protocol() {
        let mut runs = Runs::new();
        runs.insert(
            Arm::Adamw,
            BTreeMap::from([
                (1, curve(&[3.0, 2.0, 1.5, 1.4])),
                (2, curve(&[3.0, 2.0, 1.6, 1.5])),
                (3, curve(&[3.0, f32::NAN, 1.7, 1.6])),
            ]),
        );
        runs.insert(
            Arm::AdamwDouble,
            BTreeMap::from([
                (1, curve(&[3.0, 1.5, 1.4])),
                (2, curve(&[3.0, 1.4, 1.3])),
                (3, curve(&[3.0, 1.6, 1.5])),
            ]),
        );
        runs.insert(
            Arm::Hybrid,
            BTreeMap::from([
                (1, curve(&[3.0, 1.2])),
                (2, curve(&[3.0, 2.0])),
                (3, curve(&[1.0])),
            ]),
        );
        let t = target(&runs).unwrap();
        assert_eq!(t, 1.5);
        assert_eq!(reach(&runs[&Arm::Adamw][&1], t).unwrap().backward, 50);
        assert_eq!(reach(&runs[&Arm::Adamw][&3], t), None);
        // Double: 25, 25, 50.
        let (m, cens) = mean_backward(&runs[&Arm::AdamwDouble], t).unwrap();
        assert!((m - 100.0 / 3.0).abs() < 1e-9 && !cens);
        // Hybrid: 25, never (its budget: 25), 0.
        let (m, cens) = mean_backward(&runs[&Arm::Hybrid], t).unwrap();
        assert!((m - 50.0 / 3.0).abs() < 1e-9 && cens);
        // AdamW: 50, 75, never (its budget: 75).
        let (m, cens) = mean_backward(&runs[&Arm::Adamw], t).unwrap();
        assert!((m - 200.0 / 3.0).abs() < 1e-9 && cens);
        let (arm, m, _) = oracle(&runs, t).unwrap();
        assert_eq!(arm, Arm::AdamwDouble);
        assert!((m - 100.0 / 3.0).abs() < 1e-9);
        let md = table(Workload::W1, &runs);
        assert!(md.contains("Target: val 1.5000"), "{md}");
        assert!(
            md.contains("| hybrid | 1.00e-3 | 2/3 | 25 / never / 0 | ≥17 |"),
            "{md}"
        );
        // Paired savings: seed 1: 1 − 25/50; seed 2: 1 − 25/75 (AdamW censored); seed 3:
        // 1 − 0/75 (AdamW censored).
        let want = 100.0 * (0.5 + (1.0 - 25.0 / 75.0) + 1.0) / 3.0;
        assert!(md.contains(&format!("{want:+.1}%*")), "{want} {md}");
    }

    #[test]
    fn no_adamw_runs_no_target() {
        let runs = Runs::new();
        assert_eq!(target(&runs), None);
        assert!(table(Workload::W2, &runs).contains("no target"));
    }
}
