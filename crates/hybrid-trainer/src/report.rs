//! Run records of the trainer and their reports: a markdown summary, the record as JSON and a
//! PNG of the loss curves (drawn by [`plot`] with `plotters`), written side by side by
//! [`write_report`]. Non-finite losses are kept in memory but written to JSON as `null`.
//! The main job's side-by-side report of AdamW and the hybrid is [`compare`].

pub mod compare;
mod compare_plot;
mod plot;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

pub use plot::{plot_curves, plot_run, Curve};

/// What a training step did.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum StepKind {
    /// A full step of the warm-up phase (the predictor is fitted, nothing is predicted yet).
    Warmup,
    /// A full forward + backward step.
    Full,
    /// A step whose update was predicted rather than computed.
    Predicted,
    /// A full step that corrects the predictor after predicted steps.
    Correct,
}

/// One training step.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StepPoint {
    pub step: u64,
    pub kind: StepKind,
    /// Training loss; `None` for a predicted step that ran no forward pass. A non-finite loss is
    /// written to JSON as `null`, so it reads back as `None`.
    #[serde(serialize_with = "finite::opt_f32")]
    pub loss: Option<f32>,
}

/// One evaluation: mean train and validation loss at `step`. A non-finite value is written to
/// JSON as `null` and reads back as NaN.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EvalPoint {
    pub step: u64,
    #[serde(serialize_with = "finite::f32", deserialize_with = "finite::de_f32")]
    pub train: f32,
    #[serde(serialize_with = "finite::f32", deserialize_with = "finite::de_f32")]
    pub val: f32,
}

/// Work done by a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Counters {
    pub steps: u64,
    pub forward_passes: u64,
    pub backward_passes: u64,
    pub predicted_steps: u64,
    pub rollbacks: u64,
    /// Written to JSON as `null` when non-finite, read back as NaN.
    #[serde(serialize_with = "finite::f64", deserialize_with = "finite::de_f64")]
    pub wall_seconds: f64,
}

/// Everything a report shows about one run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RunRecord {
    /// E.g. "hybrid, seed 1337".
    pub title: String,
    /// "hybrid", "baseline" or a control's name.
    pub mode: String,
    pub device: String,
    pub corpus: String,
    /// Free-form, shown as a JSON block in the markdown.
    pub config: serde_json::Value,
    pub steps: Vec<StepPoint>,
    pub evals: Vec<EvalPoint>,
    pub counters: Counters,
    /// Free lines appended to the markdown (e.g. rollback reasons).
    pub notes: Vec<String>,
}

impl RunRecord {
    /// Maximal runs of consecutive Predicted steps as half-open `[start, end)` step ranges.
    /// Consecutive means adjacent in `steps` with step numbers that follow each other
    /// (`next.step == prev.step + 1`); a gap or another kind ends a span.
    pub fn predicted_spans(&self) -> Vec<(u64, u64)> {
        let mut spans: Vec<(u64, u64)> = Vec::new();
        let mut open = false;
        for p in &self.steps {
            if p.kind != StepKind::Predicted {
                open = false;
                continue;
            }
            match spans.last_mut() {
                Some(last) if open && p.step == last.1 => last.1 = p.step.saturating_add(1),
                _ => spans.push((p.step, p.step.saturating_add(1))),
            }
            open = true;
        }
        spans
    }

    /// Best (lowest finite) validation loss and its step, the earliest on ties; `None` without
    /// evals or when no validation loss is finite.
    pub fn best_val(&self) -> Option<(u64, f32)> {
        self.evals
            .iter()
            .filter(|e| e.val.is_finite())
            .fold(None, |best: Option<(u64, f32)>, e| match best {
                Some((_, v)) if v <= e.val => best,
                _ => Some((e.step, e.val)),
            })
    }

    /// Losses that are present but not finite (step losses and eval values): plots skip them.
    pub fn non_finite_losses(&self) -> usize {
        let steps = self
            .steps
            .iter()
            .filter(|p| p.loss.is_some_and(|l| !l.is_finite()))
            .count();
        let evals: usize = self
            .evals
            .iter()
            .map(|e| usize::from(!e.train.is_finite()) + usize::from(!e.val.is_finite()))
            .sum();
        steps + evals
    }
}

/// The three files written by [`write_report`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportPaths {
    pub markdown: PathBuf,
    pub json: PathBuf,
    pub png: PathBuf,
}

/// Writes `<dir>/<stem>.md`, `<stem>.json` (the record, pretty) and `<stem>.png`: creates `dir`.
pub fn write_report(dir: &Path, stem: &str, rec: &RunRecord) -> Result<ReportPaths> {
    write_three(
        dir,
        stem,
        rec,
        |png| plot_run(png, rec),
        |name| markdown(rec, name),
    )
}

/// Writes `<dir>/<stem>.json` (`value`, pretty), `<stem>.png` (`plot`) and `<stem>.md`
/// (`md`, given the PNG's file name to link); creates `dir`.
pub(crate) fn write_three<T: Serialize>(
    dir: &Path,
    stem: &str,
    value: &T,
    plot: impl FnOnce(&Path) -> Result<()>,
    md: impl FnOnce(&str) -> String,
) -> Result<ReportPaths> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating report directory {}", dir.display()))?;
    let png_name = format!("{stem}.png");
    let paths = ReportPaths {
        markdown: dir.join(format!("{stem}.md")),
        json: dir.join(format!("{stem}.json")),
        png: dir.join(&png_name),
    };
    let json = serde_json::to_string_pretty(value).context("serialising the report")?;
    std::fs::write(&paths.json, json + "\n")
        .with_context(|| format!("writing {}", paths.json.display()))?;
    plot(&paths.png)?;
    std::fs::write(&paths.markdown, md(&png_name))
        .with_context(|| format!("writing {}", paths.markdown.display()))?;
    Ok(paths)
}

/// The markdown text of a run's report (also used by [`write_report`]): title, device, corpus,
/// counters table (with the backward passes saved in %), final and best val loss, the eval
/// table, predicted spans summary, notes, config JSON, and a link to the PNG by file name.
pub fn markdown(rec: &RunRecord, png_name: &str) -> String {
    let mut md = String::new();
    let c = &rec.counters;
    // Writing to a String cannot fail.
    let _ = writeln!(md, "# {}\n", rec.title);
    let _ = writeln!(md, "- mode: {}", rec.mode);
    let _ = writeln!(md, "- device: {}", rec.device);
    let _ = writeln!(md, "- corpus: {}\n", rec.corpus);

    md.push_str("## Counters\n\n| counter | value |\n|---|---:|\n");
    let _ = writeln!(md, "| steps | {} |", c.steps);
    let _ = writeln!(md, "| forward passes | {} |", c.forward_passes);
    let _ = writeln!(md, "| backward passes | {} |", c.backward_passes);
    let _ = writeln!(md, "| predicted steps | {} |", c.predicted_steps);
    let _ = writeln!(md, "| rollbacks | {} |", c.rollbacks);
    let _ = writeln!(md, "| wall-clock | {:.1} s |", c.wall_seconds);
    let saved = if c.steps == 0 {
        "n/a".to_string()
    } else {
        let pct = 100.0 * (c.steps as f64 - c.backward_passes as f64) / c.steps as f64;
        format!("{pct:.1} %")
    };
    let _ = writeln!(
        md,
        "| backward passes saved (vs one per step) | {saved} |\n"
    );
    let kinds = [
        StepKind::Warmup,
        StepKind::Full,
        StepKind::Predicted,
        StepKind::Correct,
    ];
    let by_kind: Vec<String> = kinds
        .iter()
        .map(|&k| {
            let n = rec.steps.iter().filter(|p| p.kind == k).count();
            format!("{} {n}", kind_name(k))
        })
        .collect();
    let _ = writeln!(
        md,
        "Recorded steps: {} ({}).\n",
        rec.steps.len(),
        by_kind.join(", ")
    );

    md.push_str("## Loss\n\n");
    match rec.evals.last() {
        Some(e) => {
            let _ = writeln!(md, "- final val loss: {} (step {})", loss(e.val), e.step);
        }
        None => md.push_str("- final val loss: n/a (no evals)\n"),
    }
    match rec.best_val() {
        Some((step, v)) => {
            let _ = writeln!(md, "- best val loss: {} (step {step})", loss(v));
        }
        None => md.push_str("- best val loss: n/a\n"),
    }
    let skipped = rec.non_finite_losses();
    if skipped > 0 {
        let _ = writeln!(
            md,
            "- non-finite losses (NaN/inf, skipped in the plot): {skipped}"
        );
    }
    if !rec.evals.is_empty() {
        md.push_str("\n| step | train | val |\n|---:|---:|---:|\n");
        for e in &rec.evals {
            let _ = writeln!(md, "| {} | {} | {} |", e.step, loss(e.train), loss(e.val));
        }
    }
    md.push('\n');

    md.push_str("## Predicted spans\n\n");
    let spans = rec.predicted_spans();
    if spans.is_empty() {
        md.push_str("No predicted steps recorded.\n\n");
    } else {
        let total: u64 = spans.iter().map(|(s, e)| e - s).sum();
        let (ls, le) = spans
            .iter()
            .copied()
            .max_by_key(|(s, e)| (e - s, std::cmp::Reverse(*s)))
            .unwrap_or((0, 0));
        let _ = writeln!(
            md,
            "{} spans, {total} predicted steps in all, longest {} steps ([{ls}, {le})).\n",
            spans.len(),
            le - ls
        );
    }

    if !rec.notes.is_empty() {
        md.push_str("## Notes\n\n");
        for n in &rec.notes {
            let _ = writeln!(md, "- {n}");
        }
        md.push('\n');
    }

    let config = serde_json::to_string_pretty(&rec.config).unwrap_or_else(|e| format!("{e}"));
    let _ = writeln!(md, "## Config\n\n```json\n{config}\n```\n");
    let _ = writeln!(md, "## Loss curves\n\n![loss curves]({png_name})");
    md
}

fn kind_name(k: StepKind) -> &'static str {
    match k {
        StepKind::Warmup => "warmup",
        StepKind::Full => "full",
        StepKind::Predicted => "predicted",
        StepKind::Correct => "correct",
    }
}

/// A loss for the markdown: four decimals, or `NaN` / `inf` / `-inf`.
fn loss(v: f32) -> String {
    if v.is_finite() {
        format!("{v:.4}")
    } else {
        format!("{v}")
    }
}

/// Serde helpers: JSON has no NaN or infinity, so non-finite floats are written as `null`.
pub(crate) mod finite {
    use serde::{Deserialize, Deserializer, Serializer};

    /// `Some(finite)` as a number, anything else (None, NaN, inf) as `null`.
    pub fn opt_f32<S: Serializer>(v: &Option<f32>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(x) if x.is_finite() => s.serialize_some(x),
            _ => s.serialize_none(),
        }
    }

    pub fn f32<S: Serializer>(v: &f32, s: S) -> Result<S::Ok, S::Error> {
        if v.is_finite() {
            s.serialize_f32(*v)
        } else {
            s.serialize_none()
        }
    }

    pub fn f64<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        if v.is_finite() {
            s.serialize_f64(*v)
        } else {
            s.serialize_none()
        }
    }

    /// A number, or `null` read as NaN.
    pub fn de_f32<'de, D: Deserializer<'de>>(d: D) -> Result<f32, D::Error> {
        Ok(Option::<f32>::deserialize(d)?.unwrap_or(f32::NAN))
    }

    pub fn de_f64<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
    }

    /// [`f32`] and [`de_f32`] for `#[serde(with = "crate::report::finite::f32_or_null")]`.
    pub mod f32_or_null {
        pub use super::de_f32 as deserialize;
        pub use super::f32 as serialize;
    }
}

#[cfg(test)]
mod tests;
