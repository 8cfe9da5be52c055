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

/// Per arm: the mean backward passes to the target over the seeds that reached it, and how
/// many did.
pub fn mean_backward(runs: &BTreeMap<u64, RunCurve>, target: f32) -> (Option<f64>, usize) {
    let r: Vec<f64> = runs
        .values()
        .filter_map(|c| reach(c, target))
        .map(|r| r.backward as f64)
        .collect();
    let n = r.len();
    ((n == runs.len() && n > 0).then(|| mean(&r)), n)
}

/// The oracle: the arm of AdamW's sweep with the fewest mean backward passes to the target,
/// every seed reaching it.
pub fn oracle(runs: &Runs, target: f32) -> Option<(Arm, f64)> {
    Arm::SWEEP
        .iter()
        .filter_map(|a| Some((*a, mean_backward(runs.get(a)?, target).0?)))
        .min_by(|x, y| x.1.total_cmp(&y.1))
}

fn fmt_opt(x: Option<f64>, prec: usize) -> String {
    x.map_or("—".into(), |v| format!("{v:.prec$}"))
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
    if let Some((arm, b)) = oracle(runs, target) {
        let _ = writeln!(s, "Oracle: {} ({b:.0} backward passes, mean).", arm.name());
    }
    let _ = writeln!(
        s,
        "\n| arm | peak lr | reached | backward passes (per seed) | mean | vs AdamW (paired) | forward passes | seconds (mean) | vs AdamW (paired) | best val | final val |\n|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (arm, seeds) in runs {
        let reaches: Vec<Option<Reach>> = seeds.values().map(|c| reach(c, target)).collect();
        let per_seed = reaches
            .iter()
            .map(|r| r.map_or("never".into(), |r| r.backward.to_string()))
            .collect::<Vec<_>>()
            .join(" / ");
        let got: Vec<Reach> = reaches.iter().flatten().copied().collect();
        let all = got.len() == seeds.len();
        let m =
            |f: &dyn Fn(&Reach) -> f64| all.then(|| mean(&got.iter().map(f).collect::<Vec<_>>()));
        // Paired: the relative saving against AdamW at the given rate, seed by seed.
        let paired = |f: &dyn Fn(&Reach) -> f64| -> Option<f64> {
            let d: Vec<f64> = seeds
                .iter()
                .map(|(seed, c)| {
                    let r = reach(c, target)?;
                    let b = reach(base.get(seed)?, target)?;
                    Some(1.0 - f(&r) / f(&b))
                })
                .collect::<Option<Vec<_>>>()?;
            Some(100.0 * mean(&d))
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
            got.len(),
            seeds.len(),
            fmt_opt(m(&|r| r.backward as f64), 0),
            fmt_opt(paired(&|r| r.backward as f64), 1).to_string() + "%",
            fmt_opt(m(&|r| r.forward as f64), 0),
            fmt_opt(m(&|r| r.seconds), 2),
            fmt_opt(paired(&|r| r.seconds), 1).to_string() + "%",
            mean(&bests),
            mean(&finals),
        );
    }
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
        assert_eq!(mean_backward(&runs[&Arm::AdamwDouble], t), (Some(25.0), 3));
        assert_eq!(mean_backward(&runs[&Arm::Hybrid], t), (None, 2));
        assert_eq!(oracle(&runs, t), Some((Arm::AdamwDouble, 25.0)));
        let md = table(Workload::W1, &runs);
        assert!(md.contains("Target: val 1.5000"), "{md}");
        assert!(
            md.contains("| hybrid | 1.00e-3 | 2/3 | 25 / never / 0 |"),
            "{md}"
        );
    }

    #[test]
    fn no_adamw_runs_no_target() {
        let runs = Runs::new();
        assert_eq!(target(&runs), None);
        assert!(table(Workload::W2, &runs).contains("no target"));
    }
}
