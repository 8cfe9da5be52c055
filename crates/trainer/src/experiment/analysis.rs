//! The experiment's figures from the runs' curves: the target (the median best validation loss
//! of AdamW at the given rate over the seeds), what each run spent to first reach it (a run
//! that never did: flagged, at its whole budget), paired savings and ratios against AdamW at the
//! given rate (the ratios with a bootstrap interval: [`super::bootstrap`]), the oracles (rate:
//! the best of AdamW's 5 cosine-to-100% arms; schedule: the best of its 20 rate × schedule
//! arms), AdamW evaluated on the moving average of its weights as a row of its own, and the
//! markdown tables.

use super::bootstrap;
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

/// The costs `(arm's, baseline's)` of reaching `target`, for every seed both have run, in seed
/// order.
pub fn seed_costs<'a>(
    arm: &'a BTreeMap<u64, RunCurve>,
    base: &'a BTreeMap<u64, RunCurve>,
    target: f32,
) -> impl Iterator<Item = (Cost, Cost)> + 'a {
    arm.iter()
        .filter_map(move |(seed, c)| Some((cost(c, target)?, cost(base.get(seed)?, target)?)))
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

/// Per arm: the mean cost to the target over its seeds, a censored run at its whole budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MeanCost {
    pub backward: f64,
    pub seconds: f64,
    /// A run of it never reached the target.
    pub censored: bool,
    pub seeds: usize,
}

impl MeanCost {
    /// Whether `arm` ran on fewer seeds than the protocol's (`Arm::protocol_seeds`).
    fn short_of(&self, arm: Arm) -> bool {
        (self.seeds as u64) < arm.protocol_seeds()
    }
}

pub fn mean_cost(runs: &BTreeMap<u64, RunCurve>, target: f32) -> Option<MeanCost> {
    let c: Vec<Cost> = runs.values().filter_map(|c| cost(c, target)).collect();
    let m = |f: &dyn Fn(&Reach) -> f64| mean(&c.iter().map(|c| f(&c.reach)).collect::<Vec<_>>());
    (!c.is_empty()).then(|| MeanCost {
        backward: m(&|r| r.backward as f64),
        seconds: m(&|r| r.seconds),
        censored: c.iter().any(|c| c.censored),
        seeds: c.len(),
    })
}

/// The best of a set of arms by mean backward passes (each mean over its own seeds), how
/// many of the set ran, and how many of those on fewer seeds than the protocol's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Oracle {
    pub arm: Arm,
    pub cost: MeanCost,
    pub ran: usize,
    pub of: usize,
    /// Arms that ran on fewer seeds than `Arm::protocol_seeds` (the oracle may be among them).
    pub short: usize,
}

impl Oracle {
    /// `k of n arms`, and `, m of them on fewer seeds than the protocol's` when some are short.
    pub fn arms(&self) -> String {
        format!("{} of {} arms{}", self.ran, self.of, self.short_note())
    }

    fn short_note(&self) -> String {
        match self.short {
            0 => String::new(),
            m => format!(", {m} of them on fewer seeds than the protocol's"),
        }
    }

    /// `mean`, or `mean of k of its n seeds` when the oracle arm itself is short.
    fn mean_of(&self) -> String {
        if self.cost.short_of(self.arm) {
            let p = self.arm.protocol_seeds();
            format!("mean of {} of its {p} seeds", self.cost.seeds)
        } else {
            "mean".into()
        }
    }
}

fn best_of(runs: &Runs, arms: &[Arm], target: f32) -> Option<Oracle> {
    let ran: Vec<(Arm, MeanCost)> = arms
        .iter()
        .filter_map(|a| Some((*a, mean_cost(runs.get(a)?, target)?)))
        .collect();
    let n = ran.len();
    let short = ran.iter().filter(|(a, c)| c.short_of(*a)).count();
    // The first of equal means (the sweep's order) on a tie.
    let (arm, cost) = ran
        .into_iter()
        .reduce(|x, y| if y.1.backward < x.1.backward { y } else { x })?;
    Some(Oracle {
        arm,
        cost,
        ran: n,
        of: arms.len(),
        short,
    })
}

/// The rate oracle: the best of AdamW's 5 cosine-to-100% arms (`Arm::SWEEP`).
pub fn oracle(runs: &Runs, target: f32) -> Option<(Arm, f64, bool)> {
    rate_oracle(runs, target).map(|o| (o.arm, o.cost.backward, o.cost.censored))
}

pub fn rate_oracle(runs: &Runs, target: f32) -> Option<Oracle> {
    best_of(runs, &Arm::SWEEP, target)
}

/// The schedule oracle: the best of AdamW's 20 rate × schedule arms (`Arm::SCHEDULE_SWEEP`).
pub fn schedule_oracle(runs: &Runs, target: f32) -> Option<Oracle> {
    best_of(runs, &Arm::SCHEDULE_SWEEP, target)
}

/// AdamW at the given rate evaluated on the moving average of its weights: its runs with
/// `val` replaced by `ema_val` (the runs that kept an average; `None` when none did).
pub fn ema_runs(runs: &Runs) -> Option<BTreeMap<u64, RunCurve>> {
    let out: BTreeMap<u64, RunCurve> = (runs.get(&Arm::Adamw)?.iter())
        .filter(|(_, c)| c.ema.is_some())
        .map(|(seed, c)| {
            let mut c = c.clone();
            for e in &mut c.evals {
                e.val = e.ema_val;
            }
            (*seed, c)
        })
        .collect();
    (!out.is_empty()).then_some(out)
}

/// `Oracle: arm (N backward passes, S s, mean; k of n arms ran)`, with the seeds it and the
/// other arms lack when they ran on fewer than the protocol's.
fn oracle_line(name: &str, o: Option<Oracle>) -> String {
    match o {
        None => format!("{name}: none of its arms has run."),
        Some(o) => format!(
            "{name}: {} ({} backward passes, {} s, {}; {} of its {} arms ran{}).",
            o.arm.name(),
            mark(o.cost.backward, o.cost.censored, 0),
            mark(o.cost.seconds, o.cost.censored, 2),
            o.mean_of(),
            o.ran,
            o.of,
            o.short_note()
        ),
    }
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
    for (a, b) in seed_costs(seeds, base, target) {
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
    // The rate the runs were given (W7's is fixed when it runs).
    let given = (runs.get(&Arm::Adamw).and_then(|r| r.values().next()))
        .map_or_else(|| "not run".to_string(), |c| format!("{:e}", c.given_lr));
    let _ = writeln!(s, "### {w:?} (given peak rate {given})\n");
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
    let _ = writeln!(
        s,
        "{}",
        oracle_line("Rate oracle", rate_oracle(runs, target))
    );
    let schedule = if w.sweeps_schedules() {
        oracle_line("Schedule oracle", schedule_oracle(runs, target))
    } else {
        format!("Schedule oracle: none (the protocol runs no schedule sweep on {w:?}).")
    };
    let _ = writeln!(s, "{schedule}");
    let _ = writeln!(
        s,
        "\n| arm | peak lr | seeds reached | backward passes (per seed) | mean | saved vs AdamW (paired) | ÷ AdamW (paired, 95% CI) | forward passes (mean) | seconds (mean) | saved vs AdamW (paired) | ÷ AdamW (paired, 95% CI) | best val | final val |\n|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    let ema = ema_runs(runs);
    let rows = (runs
        .iter()
        .map(|(arm, seeds)| (arm.name().to_string(), seeds)))
    .chain(ema.iter().map(|e| ("adamw on its EMA".to_string(), e)));
    for (name, seeds) in rows {
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
        let ratio = |f: &dyn Fn(&Reach) -> f64| {
            bootstrap::paired(seeds, &base, target, f).map_or_else(|| "—".into(), |p| p.show())
        };
        let _ = writeln!(
            s,
            "| {name} | {peak:.2e} | {}/{} | {per_seed} | {} | {} | {} | {} | {} | {} | {} | {:.4} | {:.4} |",
            costs.iter().filter(|c| !c.censored).count(),
            seeds.len(),
            mark(m(&|r| r.backward as f64), cens, 0),
            paired(seeds, &base, target, &|r| r.backward as f64),
            ratio(&|r| r.backward as f64),
            mark(m(&|r| r.forward as f64), cens, 0),
            mark(m(&|r| r.seconds), cens, 2),
            paired(seeds, &base, target, &|r| r.seconds),
            ratio(&|r| r.seconds),
            mean(&bests),
            mean(&finals),
        );
    }
    let _ = writeln!(
        s,
        "\nA run that never reached the target counts as its whole budget (`never`, and `≥` on \
         the means it enters); a paired saving or ratio marked `*` includes such a run and is a \
         bound. Ratios: per seed, the arm's cost over AdamW's of the same seed, their mean and \
         its 95% bootstrap interval ({} resamples of the seeds, percentile, seed {}). \
         `adamw on its EMA`: AdamW at the given rate evaluated on the moving average of its \
         weights in the same runs (its best and final val are the average's).",
        bootstrap::RESAMPLES,
        bootstrap::SEED
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

    /// A run at val 3.0 for `k` evaluations, then at 1.0 (`25·k` passes, `k` seconds).
    fn at(k: usize) -> RunCurve {
        let mut v = vec![3.0; k];
        v.push(1.0);
        curve(&v)
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

    /// W8 runs AdamW at the given rate (one of the 20 schedule arms) but no schedule sweep:
    /// its table names no schedule oracle; W1's, with the same runs, does.
    #[test]
    fn w8_has_no_schedule_oracle() {
        let runs = Runs::from([(
            Arm::Adamw,
            BTreeMap::from([(1, RunCurve::every_ten_passes(&[3.0, 1.0], 1.0))]),
        )]);
        let md = table(Workload::W8, &runs);
        assert!(
            md.contains("Schedule oracle: none (the protocol runs no schedule sweep on W8)."),
            "{md}"
        );
        assert!(table(Workload::W1, &runs).contains("Schedule oracle: adamw ("));
    }

    #[test]
    fn no_adamw_runs_no_target() {
        let runs = Runs::new();
        assert_eq!(target(&runs), None);
        assert!(table(Workload::W2, &runs).contains("no target"));
    }

    /// The schedule oracle is the best of the 20 rate × schedule arms, the rate oracle of the
    /// 5 cosine-to-100% arms only; on a tie the sweep's first arm; the count of arms that ran
    /// is kept (a missing arm is not a zero).
    #[test]
    fn schedule_and_rate_oracles_with_a_tie_and_missing_arms() {
        let mut runs = Runs::new();
        runs.insert(Arm::Adamw, BTreeMap::from([(1, at(4)), (2, at(4))]));
        // ×1/2 and ×2: 50 passes each (a tie), ×2 at cosine to 50%: 25.
        runs.insert(Arm::AdamwHalf, BTreeMap::from([(1, at(2)), (2, at(2))]));
        runs.insert(Arm::AdamwDouble, BTreeMap::from([(1, at(1)), (2, at(3))]));
        runs.insert(Arm::AdamwDoubleCos50, BTreeMap::from([(1, at(1))]));
        let t = target(&runs).unwrap();
        assert_eq!(t, 1.0);
        let r = rate_oracle(&runs, t).unwrap();
        assert_eq!(
            (r.arm, r.cost.backward, r.ran, r.of),
            (Arm::AdamwHalf, 50.0, 3, 5)
        );
        assert_eq!(oracle(&runs, t), Some((Arm::AdamwHalf, 50.0, false)));
        let s = schedule_oracle(&runs, t).unwrap();
        assert_eq!(
            (s.arm, s.cost.backward, s.ran, s.of, s.short),
            (Arm::AdamwDoubleCos50, 25.0, 4, 20, 4)
        );
        let md = table(Workload::W1, &runs);
        assert!(
            md.contains(
                "Schedule oracle: adamw-x2, cosine to 50% (25 backward passes, 1.00 s, mean of 1 \
                 of its 3 seeds; 4 of its 20 arms ran, 4 of them on fewer seeds than the \
                 protocol's)."
            ),
            "{md}"
        );
        assert!(md.contains("Rate oracle: adamw-x1/2 (50 backward"), "{md}");
        assert_eq!(schedule_oracle(&Runs::new(), t), None);
    }

    /// An oracle over arms that all ran their protocol's seeds says plain `mean` and names no
    /// shortfall; with one seed fewer on the oracle's arm, both its seeds and the arm count say so.
    #[test]
    fn an_oracle_names_the_seeds_its_arms_lack() {
        let mut runs = Runs::new();
        runs.insert(Arm::Adamw, (1..=5).map(|s| (s, at(4))).collect());
        runs.insert(Arm::AdamwCos75, (1..=3).map(|s| (s, at(2))).collect());
        let t = target(&runs).unwrap();
        let s = schedule_oracle(&runs, t).unwrap();
        assert_eq!((s.arm, s.ran, s.short), (Arm::AdamwCos75, 2, 0));
        assert_eq!(s.arms(), "2 of 20 arms");
        let md = table(Workload::W1, &runs);
        let full = "Schedule oracle: adamw, cosine to 75% (50 backward passes, 2.00 s, mean; 2 of \
                    its 20 arms ran).";
        assert!(md.contains(full), "{md}");

        runs.get_mut(&Arm::AdamwCos75).unwrap().remove(&3);
        let s = schedule_oracle(&runs, t).unwrap();
        assert_eq!((s.arm, s.ran, s.short), (Arm::AdamwCos75, 2, 1));
        assert_eq!(
            s.arms(),
            "2 of 20 arms, 1 of them on fewer seeds than the protocol's"
        );
        let md = table(Workload::W1, &runs);
        let short = "Schedule oracle: adamw, cosine to 75% (50 backward passes, 2.00 s, mean of 2 \
                     of its 3 seeds; 2 of its 20 arms ran, 1 of them on fewer seeds than the \
                     protocol's).";
        assert!(md.contains(short), "{md}");
    }

    /// AdamW's runs that kept an average give a row of their own, costed by `ema_val` against
    /// the target of AdamW's own `val` (1.5 here): seed 1's average reaches it at 25 passes
    /// (AdamW at 50: ratio 0.5), seed 2's never (budget 75; AdamW at 75: ratio 1): mean 0.75.
    #[test]
    fn adamw_on_its_ema_is_a_row_of_its_own() {
        let with_ema = |vals: &[f32], ema: &[f32]| {
            let mut c = curve(vals);
            for (e, &v) in c.evals.iter_mut().zip(ema) {
                e.ema_val = v;
            }
            c.ema = Some(crate::train_curve::EmaRecord {
                decay: 0.99,
                updates: 75,
                seconds: 0.0,
            });
            c
        };
        let mut runs = Runs::new();
        runs.insert(
            Arm::Adamw,
            BTreeMap::from([
                (1, with_ema(&[3.0, 2.0, 1.5, 1.5], &[3.0, 1.5, 1.2, 1.1])),
                (2, with_ema(&[3.0, 2.0, 1.6, 1.5], &[3.0, 2.5, 2.0, 1.9])),
            ]),
        );
        let ema = ema_runs(&runs).unwrap();
        assert_eq!(best_val(&ema[&1]), 1.1);
        let md = table(Workload::W1, &runs);
        let row = md
            .lines()
            .find(|l| l.starts_with("| adamw on its EMA |"))
            .unwrap_or_else(|| panic!("{md}"));
        assert!(row.contains("| 1/2 | 25 / never | ≥50 |"), "{row}");
        assert!(row.contains("| 0.75 [0.50, 1.00]* |"), "{row}");
        // Runs without an average: no row.
        let plain = Runs::from([(Arm::Adamw, BTreeMap::from([(1, curve(&[3.0, 1.0]))]))]);
        assert!(ema_runs(&plain).is_none());
        assert!(!table(Workload::W1, &plain).contains("EMA |"));
    }
}
