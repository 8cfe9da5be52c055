//! The main job's report: AdamW and the hybrid side by side. The target is AdamW's best
//! validation loss; for each run, what it spent to first reach it (backward and forward
//! passes, seconds of training), its best and final validation loss; the hybrid's saving or
//! its loss in %, stated as the numbers show it; and the hybrid's own costs. Written as
//! `<stem>.md`, `<stem>.json` (the [`Comparison`]) and `<stem>.png` ([`plot_comparison`]).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use super::compare_plot::plot_comparison;
use super::ReportPaths;
use crate::train_curve::{EvalPoint, RunCurve};

/// What a run had spent when it first reached the target (at an evaluation).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Reach {
    pub iter: u32,
    pub backward: u64,
    pub forward: u64,
    pub seconds: f64,
}

impl From<&EvalPoint> for Reach {
    fn from(e: &EvalPoint) -> Self {
        Reach {
            iter: e.iter,
            backward: e.backward,
            forward: e.forward,
            seconds: e.seconds,
        }
    }
}

/// One run's line of the table.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunRow {
    pub mode: String,
    /// `None`: the run never reached the target.
    pub reached: Option<Reach>,
    #[serde(with = "crate::report::finite::f32_or_null")]
    pub best_val: f32,
    #[serde(with = "crate::report::finite::f32_or_null")]
    pub final_val: f32,
    /// What the whole run spent (at its last evaluation).
    pub total: Option<Reach>,
}

impl RunRow {
    fn of(c: &RunCurve, target: f32) -> RunRow {
        let best = c
            .evals
            .iter()
            .map(|e| e.val)
            .filter(|v| v.is_finite())
            .fold(f32::INFINITY, f32::min);
        RunRow {
            mode: c.mode.clone(),
            reached: first_reach(c, target).map(Reach::from),
            best_val: if best.is_finite() { best } else { f32::NAN },
            final_val: c.evals.last().map_or(f32::NAN, |e| e.val),
            total: c.evals.last().map(Reach::from),
        }
    }
}

/// The first evaluation at or below `target` (none when the target is not finite).
pub fn first_reach(c: &RunCurve, target: f32) -> Option<&EvalPoint> {
    if !target.is_finite() {
        return None;
    }
    c.evals.iter().find(|e| e.val <= target)
}

/// The hybrid's saving to the target, in % of AdamW's spend (negative: it spent more);
/// `None` where a run never reached it or AdamW spent nothing.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct Savings {
    pub backward_pct: Option<f64>,
    pub forward_pct: Option<f64>,
    pub seconds_pct: Option<f64>,
}

fn saving(adamw: f64, hybrid: f64) -> Option<f64> {
    (adamw > 0.0).then(|| 100.0 * (adamw - hybrid) / adamw)
}

/// Everything the main job's report shows (and `report.json` holds).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Comparison {
    pub title: String,
    pub device: String,
    pub corpus: String,
    /// The job's flags.
    pub config: serde_json::Value,
    /// AdamW's best validation loss (`null` when it had none finite).
    #[serde(with = "crate::report::finite::f32_or_null")]
    pub target_val: f32,
    /// AdamW first, the hybrid second.
    pub runs: Vec<RunCurve>,
    /// One row a run, in the order of `runs`.
    pub rows: Vec<RunRow>,
    pub savings: Savings,
    /// The outcome in one plain sentence.
    pub verdict: String,
}

impl Comparison {
    /// The comparison of two runs of the same model and data.
    pub fn new(
        title: String,
        device: String,
        corpus: String,
        config: serde_json::Value,
        adamw: RunCurve,
        hybrid: RunCurve,
    ) -> Comparison {
        let target = RunRow::of(&adamw, f32::NAN).best_val;
        let rows = vec![RunRow::of(&adamw, target), RunRow::of(&hybrid, target)];
        let savings = match (rows[0].reached, rows[1].reached) {
            (Some(a), Some(h)) => Savings {
                backward_pct: saving(a.backward as f64, h.backward as f64),
                forward_pct: saving(a.forward as f64, h.forward as f64),
                seconds_pct: saving(a.seconds, h.seconds),
            },
            _ => Savings::default(),
        };
        let verdict = verdict(target, &rows, &savings);
        Comparison {
            title,
            device,
            corpus,
            config,
            target_val: target,
            runs: vec![adamw, hybrid],
            rows,
            savings,
            verdict,
        }
    }

    /// The lines the job prints at its end: target, each run, the verdict.
    pub fn summary_lines(&self) -> Vec<String> {
        let mut out = vec![format!(
            "target: AdamW's best val loss {}",
            loss(self.target_val)
        )];
        for r in &self.rows {
            out.push(format!(
                "{:>6}: {}; best val {}, final val {}",
                r.mode,
                reach_text(r.reached),
                loss(r.best_val),
                loss(r.final_val)
            ));
        }
        if let Some(c) = self.runs.get(1).and_then(|h| h.costs.as_ref()) {
            out.push(format!(
                "hybrid's own costs: {} probe forward passes ({:.1} s), world model {:.2} s, \
                 snapshots {:.2} s; {} decisions measured, {} predicted; {} rollbacks",
                c.probe_forwards,
                c.probe_seconds,
                c.world_seconds,
                c.snapshot_seconds,
                c.measured,
                c.predicted,
                self.runs[1].rollbacks
            ));
        }
        out.push(self.verdict.clone());
        out
    }
}

/// "reached it at iter N: B backward, F forward passes, S s" or "never reached it".
fn reach_text(r: Option<Reach>) -> String {
    match r {
        Some(r) => format!(
            "reached it at iter {}: {} backward, {} forward passes, {:.1} s",
            r.iter, r.backward, r.forward, r.seconds
        ),
        None => "never reached it".into(),
    }
}

/// "12.3% fewer" / "4.5% more" of a saving in %.
fn delta(pct: Option<f64>, less: &str, more: &str) -> String {
    match pct {
        Some(p) if p >= 0.0 => format!("{p:.1}% {less}"),
        Some(p) => format!("{:.1}% {more}", -p),
        None => "n/a".into(),
    }
}

/// The outcome in one sentence, only what the numbers show.
fn verdict(target: f32, rows: &[RunRow], s: &Savings) -> String {
    if !target.is_finite() {
        return "AdamW reached no finite validation loss: there is nothing to compare against."
            .into();
    }
    let h = &rows[1];
    if h.reached.is_none() {
        return format!(
            "The hybrid never reached AdamW's best val loss {} (its best: {}): no saving; it \
             did worse than AdamW on this run.",
            loss(target),
            loss(h.best_val)
        );
    }
    let gain = s.backward_pct.unwrap_or(0.0) > 0.0 || s.seconds_pct.unwrap_or(0.0) > 0.0;
    format!(
        "The hybrid reached AdamW's best val loss {} with {} backward passes, {} forward \
         passes and {} time than AdamW{}.",
        loss(target),
        delta(s.backward_pct, "fewer", "more"),
        delta(s.forward_pct, "fewer", "more"),
        delta(s.seconds_pct, "less", "more"),
        if gain { "" } else { ": no saving" }
    )
}

/// A loss: four decimals, or `NaN` / `inf`.
fn loss(v: f32) -> String {
    if v.is_finite() {
        format!("{v:.4}")
    } else {
        format!("{v}")
    }
}

/// Writes `<dir>/<stem>.md`, `<stem>.json` and `<stem>.png`; creates `dir`.
pub fn write_comparison(dir: &Path, stem: &str, cmp: &Comparison) -> Result<ReportPaths> {
    super::write_three(
        dir,
        stem,
        cmp,
        |png| plot_comparison(png, cmp),
        |name| markdown(cmp, name),
    )
}

/// The markdown of a comparison: the table, the verdict, the hybrid's costs and decisions,
/// the flags, and the PNG.
pub fn markdown(cmp: &Comparison, png_name: &str) -> String {
    let mut md = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(md, "# {}\n", cmp.title);
    let _ = writeln!(md, "- device: {}", cmp.device);
    let _ = writeln!(md, "- corpus: {}", cmp.corpus);
    let _ = writeln!(
        md,
        "- target: AdamW's best validation loss, {} (reached = first evaluation at or below it)\n",
        loss(cmp.target_val)
    );
    table(&mut md, cmp);
    let _ = writeln!(md, "**{}**\n", cmp.verdict);
    md.push_str(
        "Seconds are training time (steps, the hybrid's probes, world model and snapshots), \
         evaluations excluded. Forward passes include the hybrid's probes. The target is \
         checked only at evaluations.\n\n",
    );
    if let Some(h) = cmp.runs.get(1) {
        costs(&mut md, h);
    }
    for r in &cmp.runs {
        if let Some(why) = &r.diverged {
            let _ = writeln!(md, "- the {} run stopped early: {why}", r.mode);
        }
    }
    let config = serde_json::to_string_pretty(&cmp.config).unwrap_or_else(|e| format!("{e}"));
    let _ = writeln!(md, "## Flags\n\n```json\n{config}\n```\n");
    let _ = writeln!(
        md,
        "## Curves\n\nVal loss against backward passes and against seconds; the hybrid's \
         learning-rate multiplier (rollbacks marked).\n\n![curves]({png_name})"
    );
    md
}

/// The side-by-side table.
fn table(md: &mut String, cmp: &Comparison) {
    md.push_str(
        "| run | backward passes to target | forward passes to target | seconds to target | \
         best val | final val | backward / seconds in all |\n|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in &cmp.rows {
        let (b, f, s) = match r.reached {
            Some(x) => (
                x.backward.to_string(),
                x.forward.to_string(),
                format!("{:.1}", x.seconds),
            ),
            None => ("never".into(), "never".into(), "never".into()),
        };
        let all = r.total.map_or("n/a".into(), |t| {
            format!("{} / {:.1} s", t.backward, t.seconds)
        });
        let _ = writeln!(
            md,
            "| {} | {b} | {f} | {s} | {} | {} | {all} |",
            r.mode,
            loss(r.best_val),
            loss(r.final_val)
        );
    }
    let s = &cmp.savings;
    let pct = |p: Option<f64>| p.map_or("n/a".into(), |p| format!("{p:+.1}%"));
    let _ = writeln!(
        md,
        "| hybrid's saving (+: fewer/less than AdamW, −: more) | {} | {} | {} | | | |\n",
        pct(s.backward_pct),
        pct(s.forward_pct),
        pct(s.seconds_pct)
    );
}

/// The hybrid's own costs and its decisions.
fn costs(md: &mut String, h: &RunCurve) {
    let Some(c) = &h.costs else {
        return;
    };
    let total = h.evals.last().map_or(f64::NAN, |e| e.seconds);
    let own = c.probe_seconds + c.world_seconds + c.snapshot_seconds + c.average_seconds;
    md.push_str("## The hybrid's own costs\n\n| cost | value |\n|---|---:|\n");
    let _ = writeln!(md, "| probe forward passes | {} |", c.probe_forwards);
    for (what, secs) in [
        ("probe", c.probe_seconds),
        ("world-model", c.world_seconds),
        ("snapshot", c.snapshot_seconds),
        ("weight-average", c.average_seconds),
    ] {
        let _ = writeln!(md, "| {what} seconds | {secs:.2} |");
    }
    let _ = writeln!(
        md,
        "| all of these, share of its training seconds | {:.2} s ({:.1}%) |",
        own,
        100.0 * own / total
    );
    let _ = writeln!(
        md,
        "| decisions measured / predicted by the world model | {} / {} |",
        c.measured, c.predicted
    );
    let _ = writeln!(md, "| rollbacks | {} |\n", h.rollbacks);
    if h.decisions.is_empty() {
        return;
    }
    md.push_str("| step | multiplier | s* | how | rollback | probe loss |\n");
    md.push_str("|---:|---:|---:|---|---|---:|\n");
    for d in &h.decisions {
        let scale = d.scale.map_or("-".into(), |s| format!("{s:.3}"));
        let _ = writeln!(
            md,
            "| {} | {:.3} | {scale} | {} | {} | {} |",
            d.step,
            d.multiplier,
            if d.measured { "measured" } else { "predicted" },
            if d.rollback { "yes" } else { "" },
            loss(d.probe_loss)
        );
    }
    md.push('\n');
}

#[cfg(test)]
#[path = "compare_tests.rs"]
mod tests;
