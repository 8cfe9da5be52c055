//! Issue 41's bar (item 5, `docs/protocol-41.md`) from the curves there are, H41 being the
//! `hybrid` arm:
//! (i) on every workload H41 ≤ 1.03 × AdamW-at-the-given-rate's mean backward passes and
//! mean seconds; (ii) H41 ≤ 1.10 × the schedule oracle's mean backward passes on W1 and W6,
//! ≤ 1.15 × the rate oracle's elsewhere; (iii) over the workloads (the mean of the
//! per-workload means, over the workloads where both ran), fewer mean backward passes than
//! each rate-free control at its best of its rates; (iv) over the workloads where both ran,
//! H41's mean backward passes or mean seconds at most 0.9 × those of each trivial-predictor
//! control (the same hybrid with `--predictor last` and `--predictor power-law`); (v) the
//! controller's and world model's
//! seconds (probes, world model, snapshots, weight average) ≤ 5% of the run's training
//! seconds, the mean over H41's seeds on every workload. Past the bar: H41 ≤ 1.0 × the schedule
//! oracle wherever it ran. A part with no runs says so; a part met on some workloads only
//! names the ones missing; a control run on only some of its protocol seeds on a workload is
//! left out of (iii) and (iv) there, and named. Every cost is to the workload's target, a
//! censored run at its whole budget (`*` on a figure it enters).

use super::analysis::{mean_cost, rate_oracle, schedule_oracle, target, MeanCost, Oracle, Runs};
use super::protocol::{Arm, Workload};
use std::fmt::Write as _;

/// A part's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Met,
    Missed,
    /// Nothing to judge it on (its runs have not run), or not built.
    NoData,
    /// Part (iii): every control that ran is beaten, but not every control ran.
    Incomplete,
}

impl Verdict {
    fn show(self) -> &'static str {
        match self {
            Verdict::Met => "met",
            Verdict::Missed => "missed",
            Verdict::NoData => "no runs",
            Verdict::Incomplete => "not every control ran",
        }
    }

    /// Met only when every workload judged met; missed when any missed.
    fn all(vs: &[Verdict]) -> Verdict {
        if vs.contains(&Verdict::Missed) {
            Verdict::Missed
        } else if vs.contains(&Verdict::Met) {
            Verdict::Met
        } else {
            Verdict::NoData
        }
    }
}

/// One row of the bar's table.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    pub name: &'static str,
    pub verdict: Verdict,
    /// The figures it was judged on, and what had no runs.
    pub figures: String,
}

/// A workload's target and H41's mean cost to it.
struct Judged<'a> {
    w: Workload,
    runs: &'a Runs,
    target: f32,
    h41: MeanCost,
}

fn judged(all: &[(Workload, Runs)]) -> (Vec<Judged<'_>>, Vec<Workload>) {
    let mut ok = Vec::new();
    let mut missing = Vec::new();
    for (w, runs) in all {
        let t = target(runs);
        match t.and_then(|t| Some((t, mean_cost(runs.get(&Arm::Hybrid)?, t)?))) {
            Some((target, h41)) => ok.push(Judged {
                w: *w,
                runs,
                target,
                h41,
            }),
            None => missing.push(*w),
        }
    }
    (ok, missing)
}

fn star(c: bool) -> &'static str {
    if c {
        "*"
    } else {
        ""
    }
}

/// `a/b` as `0.93×`, marked `*` when a censored run went into either.
fn ratio(a: f64, b: f64, censored: bool) -> String {
    format!("{:.2}×{}", a / b, star(censored))
}

fn missing_note(missing: &[Workload], what: &str) -> String {
    if missing.is_empty() {
        String::new()
    } else {
        format!("; no {what} on {missing:?}")
    }
}

/// The workloads the protocol runs no schedule sweep on: past the bar leaves them out.
fn unswept_note(unswept: &[Workload]) -> String {
    if unswept.is_empty() {
        String::new()
    } else {
        format!("; {unswept:?}: no schedule sweep in the protocol")
    }
}

/// Whether every seed the protocol gives `arm` (1 to `protocol_seeds`) ran on a workload:
/// `Some(true)` all, `Some(false)` some, `None` none. A control that ran on only some of its
/// seeds stays out of the means over the workloads (the figures name it), so that an
/// unfinished arm moves no verdict.
fn all_seeds(runs: &Runs, arm: Arm) -> Option<bool> {
    let ran = runs.get(&arm).filter(|r| !r.is_empty())?;
    Some((1..=arm.protocol_seeds()).all(|s| ran.contains_key(&s)))
}

fn part_run_note(part: &[Workload]) -> String {
    if part.is_empty() {
        String::new()
    } else {
        format!(" (left out, not all its seeds ran: {part:?})")
    }
}

/// Part (i).
pub fn never_later(all: &[(Workload, Runs)]) -> Part {
    let (judged, mut missing) = judged(all);
    let (mut vs, mut figs) = (Vec::new(), Vec::new());
    for j in &judged {
        let Some(b) = j.runs.get(&Arm::Adamw).and_then(|r| mean_cost(r, j.target)) else {
            missing.push(j.w);
            continue;
        };
        let c = j.h41.censored || b.censored;
        let ok = j.h41.backward <= 1.03 * b.backward && j.h41.seconds <= 1.03 * b.seconds;
        vs.push(if ok { Verdict::Met } else { Verdict::Missed });
        figs.push(format!(
            "{:?}: passes {}, seconds {}",
            j.w,
            ratio(j.h41.backward, b.backward, c),
            ratio(j.h41.seconds, b.seconds, c)
        ));
    }
    Part {
        name: "(i) never later: H41 ≤ 1.03× AdamW at the given rate (passes and seconds)",
        verdict: Verdict::all(&vs),
        figures: figs.join("; ") + &missing_note(&missing, "H41 and AdamW runs"),
    }
}

/// The oracle part (ii) compares with on `w`, and its bound.
fn oracle_for(w: Workload, runs: &Runs, target: f32) -> Option<(&'static str, Oracle, f64)> {
    match w {
        Workload::W1 | Workload::W6 => Some(("schedule", schedule_oracle(runs, target)?, 1.10)),
        _ => Some(("rate", rate_oracle(runs, target)?, 1.15)),
    }
}

/// Part (ii), and past the bar (≤ 1.0× the schedule oracle wherever it ran; W8 has none).
pub fn near_the_oracles(all: &[(Workload, Runs)]) -> [Part; 2] {
    let (judged, missing) = judged(all);
    let (mut vs, mut figs, mut gone) = (Vec::new(), Vec::new(), missing.clone());
    let (mut past, mut past_figs, mut unswept) = (Vec::new(), Vec::new(), Vec::new());
    for j in &judged {
        if !j.w.sweeps_schedules() {
            unswept.push(j.w);
        } else if let Some(o) = schedule_oracle(j.runs, j.target) {
            let ok = j.h41.backward <= o.cost.backward;
            past.push(if ok { Verdict::Met } else { Verdict::Missed });
            let c = j.h41.censored || o.cost.censored;
            past_figs.push(format!(
                "{:?}: {} ({})",
                j.w,
                ratio(j.h41.backward, o.cost.backward, c),
                o.arms()
            ));
        }
        let Some((kind, o, bound)) = oracle_for(j.w, j.runs, j.target) else {
            gone.push(j.w);
            continue;
        };
        let c = j.h41.censored || o.cost.censored;
        let ok = j.h41.backward <= bound * o.cost.backward;
        vs.push(if ok { Verdict::Met } else { Verdict::Missed });
        figs.push(format!(
            "{:?}: {} the {kind} oracle ({}, {}; seconds {})",
            j.w,
            ratio(j.h41.backward, o.cost.backward, c),
            o.arm.name(),
            o.arms(),
            ratio(j.h41.seconds, o.cost.seconds, c)
        ));
    }
    [
        Part {
            name: "(ii) ≤ 1.10× the schedule oracle on W1 and W6, ≤ 1.15× the rate oracle \
                   elsewhere (passes)",
            verdict: Verdict::all(&vs),
            figures: figs.join("; ") + &missing_note(&gone, "H41 or oracle runs"),
        },
        Part {
            name: "past the bar: ≤ 1.0× the schedule oracle everywhere (passes)",
            verdict: Verdict::all(&past),
            figures: (past_figs.join("; ")
                + &missing_note(&missing, "H41 runs")
                + &unswept_note(&unswept)
                + if past.len() + unswept.len() < judged.len() {
                    "; the schedule sweep has not run everywhere"
                } else {
                    ""
                })
            .trim_start_matches("; ")
            .to_string(),
        },
    ]
}

/// Part (iii): per control, H41's and the control's mean passes over the workloads where both
/// ran (the control at its best rate on each workload; a workload where one of its rates ran
/// on only some seeds is left out and named).
pub fn rate_free(all: &[(Workload, Runs)]) -> Part {
    let (judged, _) = judged(all);
    let (mut vs, mut figs) = (Vec::new(), Vec::new());
    for (name, arms) in Arm::RATE_FREE_CONTROLS {
        let (mut h, mut c, mut on, mut cens) = (Vec::new(), Vec::new(), Vec::new(), false);
        let mut part = Vec::new();
        for j in &judged {
            if arms.iter().any(|a| all_seeds(j.runs, *a) == Some(false)) {
                part.push(j.w);
                continue;
            }
            let best = (arms.iter())
                .filter_map(|a| mean_cost(j.runs.get(a)?, j.target))
                .reduce(|x, y| if y.backward < x.backward { y } else { x });
            if let Some(b) = best {
                h.push(j.h41.backward);
                c.push(b.backward);
                on.push(j.w);
                cens |= b.censored || j.h41.censored;
            }
        }
        if on.is_empty() {
            vs.push(Verdict::NoData);
            figs.push(format!("{name}: no runs{}", part_run_note(&part)));
            continue;
        }
        let (hm, cm) = (
            h.iter().sum::<f64>() / h.len() as f64,
            c.iter().sum::<f64>() / c.len() as f64,
        );
        vs.push(if hm < cm {
            Verdict::Met
        } else {
            Verdict::Missed
        });
        figs.push(format!(
            "{name}: H41 {hm:.0} vs {cm:.0} passes over {on:?}{}{}",
            star(cens),
            part_run_note(&part)
        ));
    }
    // Every control must be beaten: one without runs leaves the part unjudged.
    let verdict = match Verdict::all(&vs) {
        Verdict::Met if vs.contains(&Verdict::NoData) => Verdict::Incomplete,
        v => v,
    };
    Part {
        name: "(iii) fewer mean passes over the workloads than each rate-free control at its \
               best of 3 rates",
        verdict,
        figures: figs.join("; "),
    }
}

/// Part (iv): per trivial predictor, H41's and the control's mean passes and seconds over the
/// workloads where both ran (the control on all its seeds; part-run workloads are named);
/// met when H41 is ≥ 10% below the control in either, for both.
pub fn world_model_pays(all: &[(Workload, Runs)]) -> Part {
    let (judged, _) = judged(all);
    let (mut vs, mut figs) = (Vec::new(), Vec::new());
    for arm in Arm::TRIVIAL_PREDICTORS {
        let (mut h, mut c, mut on, mut cens) = (Vec::new(), Vec::new(), Vec::new(), false);
        let mut part = Vec::new();
        for j in &judged {
            if all_seeds(j.runs, arm) == Some(false) {
                part.push(j.w);
            } else if let Some(b) = j.runs.get(&arm).and_then(|r| mean_cost(r, j.target)) {
                h.push((j.h41.backward, j.h41.seconds));
                c.push((b.backward, b.seconds));
                on.push(j.w);
                cens |= b.censored || j.h41.censored;
            }
        }
        if on.is_empty() {
            vs.push(Verdict::NoData);
            figs.push(format!("{}: no runs{}", arm.name(), part_run_note(&part)));
            continue;
        }
        let mean = |xs: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| {
            xs.iter().map(f).sum::<f64>() / xs.len() as f64
        };
        let (hp, cp) = (mean(&h, |x| x.0), mean(&c, |x| x.0));
        let (hs, cs) = (mean(&h, |x| x.1), mean(&c, |x| x.1));
        let ok = hp <= 0.9 * cp || hs <= 0.9 * cs;
        vs.push(if ok { Verdict::Met } else { Verdict::Missed });
        figs.push(format!(
            "{}: passes {}, seconds {} over {on:?}{}",
            arm.name(),
            ratio(hp, cp, cens),
            ratio(hs, cs, cens),
            part_run_note(&part)
        ));
    }
    let verdict = match Verdict::all(&vs) {
        Verdict::Met if vs.contains(&Verdict::NoData) => Verdict::Incomplete,
        v => v,
    };
    Part {
        name: "(iv) the world model beats the controller with a trivial predictor by ≥ 10% \
               (passes or seconds)",
        verdict,
        figures: figs.join("; "),
    }
}

/// Part (v): the controller's and world model's seconds over the training seconds, H41's runs.
pub fn overhead(all: &[(Workload, Runs)]) -> Part {
    let (mut vs, mut figs, mut missing) = (Vec::new(), Vec::new(), Vec::new());
    for (w, runs) in all {
        let fracs: Vec<f64> = (runs.get(&Arm::Hybrid).into_iter().flat_map(|r| r.values()))
            .filter_map(|c| {
                let k = c.costs.as_ref()?;
                let total = c.evals.last()?.seconds;
                let own =
                    k.probe_seconds + k.world_seconds + k.snapshot_seconds + k.average_seconds;
                (total > 0.0).then(|| own / total)
            })
            .collect();
        if fracs.is_empty() {
            missing.push(*w);
            continue;
        }
        let m = fracs.iter().sum::<f64>() / fracs.len() as f64;
        let max = fracs.iter().copied().fold(0.0, f64::max);
        vs.push(if m <= 0.05 {
            Verdict::Met
        } else {
            Verdict::Missed
        });
        let cpu = if w.cpu_only() { ", CPU" } else { "" };
        figs.push(format!(
            "{w:?}: {:.1}% (max {:.1}%{cpu})",
            100.0 * m,
            100.0 * max
        ));
    }
    Part {
        name: "(v) the controller and world model ≤ 5% of the wall-clock",
        verdict: Verdict::all(&vs),
        figures: figs.join("; ") + &missing_note(&missing, "H41 runs"),
    }
}

/// Every part.
pub fn parts(all: &[(Workload, Runs)]) -> Vec<Part> {
    let [ii, past] = near_the_oracles(all);
    vec![
        never_later(all),
        ii,
        rate_free(all),
        world_model_pays(all),
        overhead(all),
        past,
    ]
}

/// The bar's markdown table.
pub fn table(all: &[(Workload, Runs)]) -> String {
    let mut s = String::from(
        "### The bar (issue 41, item 5)\n\n| part | verdict | figures |\n|---|---|---|\n",
    );
    for p in parts(all) {
        let _ = writeln!(s, "| {} | {} | {} |", p.name, p.verdict.show(), p.figures);
    }
    s.push_str(
        "\nCosts to each workload's target, H41 = the `hybrid` arm. `*` on a figure: a run \
         that never reached the target went into it at its whole budget (it is then a bound, \
         not a measurement). A verdict over the workloads is met only when no workload \
         missed it; the workloads without the runs are named.\n",
    );
    s
}

#[cfg(test)]
#[path = "bar_tests.rs"]
mod tests;
