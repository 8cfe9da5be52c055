//! The main job's PNG: three panels drawn with `plotters` as [`super::plot`] draws (bitmap,
//! the embedded font, the `png` crate): validation loss against backward passes and against
//! seconds of training (both runs, with AdamW's best as a dashed target line), and the
//! hybrid's learning-rate multiplier over the steps, its decisions marked (filled: measured,
//! hollow: predicted by the world model, red cross: a rollback).

use std::path::Path;

use anyhow::Result;
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::compare::Comparison;
use super::plot::{finite, plot_err, render_sized, x_range, PALETTE};
use crate::train_curve::RunCurve;

const SIZE: (u32, u32) = (1400, 1000);
const ROLLBACK: RGBColor = RGBColor(214, 39, 40);

type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

/// Writes the comparison's three panels to `path` as PNG.
pub fn plot_comparison(path: &Path, cmp: &Comparison) -> Result<()> {
    render_sized(path, SIZE, |root| {
        let root = root
            .titled(&cmp.title, ("sans-serif", 26))
            .map_err(plot_err)?;
        let (top, bottom) = root.split_vertically(SIZE.1 * 55 / 100);
        let (left, right) = top.split_horizontally(SIZE.0 / 2);
        let by_backward = |e: &crate::train_curve::EvalPoint| e.backward as f64;
        let by_seconds = |e: &crate::train_curve::EvalPoint| e.seconds;
        val_panel(&left, cmp, "backward passes", &by_backward)?;
        val_panel(&right, cmp, "seconds of training", &by_seconds)?;
        multiplier_panel(&bottom, cmp.runs.get(1))
    })
}

/// The y range of validation losses: from the lowest to the 90th percentile (the first
/// evaluations, far above, are drawn on the edge), padded; `0..1` without any.
fn val_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let mut v: Vec<f64> = values.filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return (0.0, 1.0);
    }
    v.sort_by(f64::total_cmp);
    let hi = v[((v.len() - 1) as f64 * 0.9).ceil() as usize];
    let lo = v[0];
    let pad = if hi > lo { 0.05 * (hi - lo) } else { 0.1 };
    (lo - pad, hi + pad)
}

/// One panel: each run's val loss against `x` of its evaluations, and the target line.
fn val_panel(
    area: &Area<'_>,
    cmp: &Comparison,
    x_label: &str,
    x: &dyn Fn(&crate::train_curve::EvalPoint) -> f64,
) -> Result<()> {
    let curves: Vec<Vec<(f64, f64)>> = cmp
        .runs
        .iter()
        .map(|r| {
            r.evals
                .iter()
                .map(|e| (x(e), f64::from(e.val)))
                .filter(finite)
                .collect()
        })
        .collect();
    let all = || curves.iter().flatten();
    let (x0, x1) = x_range(all().map(|p| p.0), 0.02);
    let (y0, y1) = val_range(all().map(|p| p.1));
    let clip = move |&(x, y): &(f64, f64)| (x, y.clamp(y0, y1));
    let mut chart = ChartBuilder::on(area)
        .caption(format!("val loss against {x_label}"), ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc("val loss")
        .draw()
        .map_err(plot_err)?;
    let target = f64::from(cmp.target_val);
    if target.is_finite() {
        let style = BLACK.mix(0.5).stroke_width(1);
        chart
            .draw_series(DashedLineSeries::new(
                [(x0, target), (x1, target)],
                6,
                4,
                style,
            ))
            .map_err(plot_err)?
            .label(format!("target: AdamW's best {target:.4}"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
    }
    for (i, (run, points)) in cmp.runs.iter().zip(&curves).enumerate() {
        let style = PALETTE[i % PALETTE.len()].stroke_width(2);
        chart
            .draw_series(LineSeries::new(points.iter().map(clip), style).point_size(3))
            .map_err(plot_err)?
            .label(run.mode.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
    }
    legend(&mut chart)
}

/// The chart's legend, top right.
fn legend<'a, DB: DrawingBackend + 'a>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
) -> Result<()> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(plot_err)
}

/// The multiplier as the steps saw it: 1 from step 0, each decision's value from its step on,
/// up to the run's end.
fn multiplier_steps(h: &RunCurve) -> Vec<(f64, f64)> {
    let mut pts = vec![(0.0, 1.0)];
    let mut m = 1.0;
    for d in &h.decisions {
        let s = f64::from(d.step);
        pts.push((s, m));
        m = f64::from(d.multiplier);
        pts.push((s, m));
    }
    pts.push((f64::from(h.iters), m));
    pts.retain(finite);
    pts
}

/// The bottom panel: the hybrid's multiplier over the steps, its decisions marked.
fn multiplier_panel(area: &Area<'_>, hybrid: Option<&RunCurve>) -> Result<()> {
    let Some(h) = hybrid else {
        return Ok(());
    };
    let line = multiplier_steps(h);
    let (x0, x1) = x_range(line.iter().map(|p| p.0), 0.01);
    let (lo, hi) = line
        .iter()
        .fold((1.0f64, 1.0f64), |(lo, hi), p| (lo.min(p.1), hi.max(p.1)));
    let pad = 0.08 * (hi - lo).max(0.25);
    let mut chart = ChartBuilder::on(area)
        .caption(
            "the hybrid's learning-rate multiplier (× the schedule)",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, (lo - pad)..(hi + pad))
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc("multiplier")
        .draw()
        .map_err(plot_err)?;
    let colour = PALETTE[1];
    chart
        .draw_series(LineSeries::new(line, colour.stroke_width(2)))
        .map_err(plot_err)?
        .label("multiplier")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2)));
    let at = |d: &crate::control::DecisionRecord| (f64::from(d.step), f64::from(d.multiplier));
    let pick = |f: fn(&crate::control::DecisionRecord) -> bool| {
        h.decisions
            .iter()
            .filter(move |d| f(d))
            .map(at)
            .filter(finite)
    };
    chart
        .draw_series(pick(|d| d.measured).map(|p| Circle::new(p, 5, colour.filled())))
        .map_err(plot_err)?
        .label("decision, measured")
        .legend(move |(x, y)| Circle::new((x + 9, y), 5, colour.filled()));
    chart
        .draw_series(pick(|d| !d.measured).map(|p| Circle::new(p, 5, colour.stroke_width(2))))
        .map_err(plot_err)?
        .label("decision, predicted by the world model")
        .legend(move |(x, y)| Circle::new((x + 9, y), 5, colour.stroke_width(2)));
    let rollbacks = h.decisions.iter().filter(|d| d.rollback).count();
    chart
        .draw_series(pick(|d| d.rollback).map(|p| Cross::new(p, 8, ROLLBACK.stroke_width(3))))
        .map_err(plot_err)?
        .label(format!("rollback ({rollbacks})"))
        .legend(move |(x, y)| Cross::new((x + 9, y), 6, ROLLBACK.stroke_width(3)));
    legend(&mut chart)
}
