//! The protocol's comparisons (`docs/protocol-41.md`, "Measures"): per-seed paired ratios (an
//! arm's seed k against AdamW-at-the-given-rate's seed k, each run's cost to the target, a
//! censored run at its whole budget) and a 95% bootstrap interval on their mean: 10 000
//! resamples of the seeds with replacement, percentile, from a fixed seed ([`SEED`], printed
//! with every table).

use super::analysis::{seed_costs, Reach};
use crate::train_curve::RunCurve;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;

/// The bootstrap's random seed (every interval of a report is drawn from it).
pub const SEED: u64 = 41;
/// Resamples of the seeds.
pub const RESAMPLES: usize = 10_000;

/// The paired ratios of an arm against the baseline and their mean's interval.
#[derive(Debug, Clone, PartialEq)]
pub struct Paired {
    /// Per seed both ran, in seed order: arm / baseline.
    pub ratios: Vec<f64>,
    pub mean: f64,
    /// The 95% percentile interval of the mean.
    pub lo: f64,
    pub hi: f64,
    /// A censored run (either side) went into it.
    pub censored: bool,
}

/// The mean of `xs` and its 95% percentile bootstrap interval: `resamples` means of `xs.len()`
/// draws with replacement from a generator seeded with `seed`; the interval is the sorted
/// means' ⌊0.025·R⌋-th and (⌈0.975·R⌉ − 1)-th (0-based). `None` when `xs` is empty.
pub fn interval(xs: &[f64], resamples: usize, seed: u64) -> Option<(f64, f64, f64)> {
    if xs.is_empty() || resamples == 0 {
        return None;
    }
    let n = xs.len();
    let mean = xs.iter().sum::<f64>() / n as f64;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut means: Vec<f64> = (0..resamples)
        .map(|_| (0..n).map(|_| xs[rng.random_range(0..n)]).sum::<f64>() / n as f64)
        .collect();
    means.sort_by(f64::total_cmp);
    let lo = (0.025 * resamples as f64).floor() as usize;
    let hi = ((0.975 * resamples as f64).ceil() as usize).clamp(1, resamples) - 1;
    Some((mean, means[lo.min(resamples - 1)], means[hi]))
}

/// `f(arm's cost) / f(baseline's cost)` for every seed both have (a censored run at its whole
/// budget), with the interval of their mean; `None` when no seed pairs. A seed whose baseline
/// cost is 0 (the target reached before the first step) has no ratio and is left out.
pub fn paired(
    arm: &BTreeMap<u64, RunCurve>,
    base: &BTreeMap<u64, RunCurve>,
    target: f32,
    f: &dyn Fn(&Reach) -> f64,
) -> Option<Paired> {
    let mut ratios = Vec::new();
    let mut censored = false;
    for (a, b) in seed_costs(arm, base, target) {
        let d = f(&b.reach);
        if d <= 0.0 {
            continue;
        }
        censored |= a.censored || b.censored;
        ratios.push(f(&a.reach) / d);
    }
    let (mean, lo, hi) = interval(&ratios, RESAMPLES, SEED)?;
    Some(Paired {
        ratios,
        mean,
        lo,
        hi,
        censored,
    })
}

impl Paired {
    /// `0.83 [0.71, 0.95]`, with `*` when a censored run went into it.
    pub fn show(&self) -> String {
        format!(
            "{:.2} [{:.2}, {:.2}]{}",
            self.mean,
            self.lo,
            self.hi,
            if self.censored { "*" } else { "" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run whose evaluations `vals` come every 10 backward passes and 2 seconds.
    fn curve(vals: &[f32]) -> RunCurve {
        RunCurve::every_ten_passes(vals, 2.0)
    }

    /// Equal ratios: a point interval. One value: itself. [1, 3]: the resampled means are 1,
    /// 2 or 3 with probabilities 1/4, 1/2, 1/4, so the 2.5% and 97.5% percentiles are 1 and 3.
    /// [0, 0, 0, 1]: the mean of 4 draws is k/4, k ~ Binomial(4, 1/4): P(k = 0) = 0.32, so the
    /// lower end is 0; P(k ≤ 2) = 0.949 < 0.975 ≤ P(k ≤ 3) = 0.996, so the upper end is 3/4.
    /// The same seed gives the same interval.
    #[test]
    fn intervals_computed_by_hand() {
        assert_eq!(interval(&[2.0; 5], RESAMPLES, SEED), Some((2.0, 2.0, 2.0)));
        assert_eq!(interval(&[0.7], RESAMPLES, SEED), Some((0.7, 0.7, 0.7)));
        assert_eq!(
            interval(&[1.0, 3.0], RESAMPLES, SEED),
            Some((2.0, 1.0, 3.0))
        );
        assert_eq!(
            interval(&[0.0, 0.0, 0.0, 1.0], RESAMPLES, SEED),
            Some((0.25, 0.0, 0.75))
        );
        assert_eq!(interval(&[], RESAMPLES, SEED), None);
        let xs = [0.5, 0.9, 1.1, 0.7, 1.3];
        let a = interval(&xs, RESAMPLES, SEED).unwrap();
        assert_eq!(a, interval(&xs, RESAMPLES, SEED).unwrap());
        assert!(a.1 < a.0 && a.0 < a.2 && a.1 >= 0.5 && a.2 <= 1.3, "{a:?}");
    }

    /// Seeds pair by number (a seed the baseline lacks is left out), a censored run counts at
    /// its whole budget and flags the ratio, and the ratio is of the function's cost.
    #[test]
    fn ratios_pair_seeds_and_count_censored_runs_at_their_budget() {
        let target = 1.0;
        // Baseline: seed 1 reaches at 20 passes (4 s), seed 2 at 40 (8 s), seed 3 never
        // (budget 30 passes, 6 s).
        let base = BTreeMap::from([
            (1, curve(&[3.0, 2.0, 1.0])),
            (2, curve(&[3.0, 2.0, 1.5, 1.2, 0.9])),
            (3, curve(&[3.0, 2.0, 1.5, 1.1])),
        ]);
        // Arm: seed 1 at 10 (ratio 1/2), seed 2 at 40 (1), seed 3 at 30 (1: against the
        // baseline's budget), seed 4 has no pair.
        let arm = BTreeMap::from([
            (1, curve(&[3.0, 0.5])),
            (2, curve(&[3.0, 2.0, 1.5, 1.2, 1.0])),
            (3, curve(&[3.0, 2.0, 1.5, 0.8])),
            (4, curve(&[0.1])),
        ]);
        let p = paired(&arm, &base, target, &|r| r.backward as f64).unwrap();
        assert_eq!(p.ratios, [0.5, 1.0, 1.0]);
        assert!((p.mean - 2.5 / 3.0).abs() < 1e-12);
        assert!(p.censored);
        assert!(p.lo >= 0.5 && p.hi <= 1.0 && p.lo < p.mean);
        assert!(p.show().ends_with('*'), "{}", p.show());
        // Without the censored seed: not flagged.
        let mut two = arm.clone();
        two.remove(&3);
        let p = paired(&two, &base, target, &|r| r.seconds).unwrap();
        assert_eq!(p.ratios, [0.5, 1.0]);
        assert_eq!((p.lo, p.hi), (0.5, 1.0));
        assert!(!p.censored);
        // No pairs, no ratio.
        let lone = BTreeMap::from([(9, curve(&[0.1]))]);
        assert_eq!(paired(&lone, &base, target, &|r| r.backward as f64), None);
    }
}
