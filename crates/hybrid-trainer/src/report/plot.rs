//! PNG loss curves with `plotters`: drawn into an in-memory RGB bitmap, text with the embedded
//! DejaVu Sans (the `ab_glyph` feature, no system fonts), encoded with the `png` crate.
//! Non-finite points are skipped; a single point or a flat curve still gets a non-zero axis range.

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;
use std::sync::OnceLock;

use anyhow::{anyhow, Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

use super::RunRecord;

/// DejaVu Sans 2.37, see `data/README.md` and `data/DejaVuSans-LICENSE.txt`.
const FONT: &[u8] = include_bytes!("../../data/DejaVuSans.ttf");
const WIDTH: u32 = 1200;
const HEIGHT: u32 = 700;
/// Tableau 10: one colour per curve, cycled.
pub(super) const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];
const TRAIN_STEP: RGBColor = PALETTE[0];
const EVAL_TRAIN: RGBColor = PALETTE[1];
const EVAL_VAL: RGBColor = PALETTE[2];
const PREDICTED: RGBColor = PALETTE[4];

/// One curve of [`plot_curves`]: a label for the legend and its `(x, y)` points.
#[derive(Debug, Clone, PartialEq)]
pub struct Curve {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// Registers the embedded font for the families plotters asks for, once per process; the
/// outcome is kept so a failure is reported by every call.
fn ensure_font() -> Result<()> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            for family in ["sans-serif", "serif", "monospace"] {
                plotters::style::register_font(family, FontStyle::Normal, FONT)
                    .map_err(|_| format!("the embedded font is invalid ({family})"))?;
            }
            Ok(())
        })
        .clone()
        .map_err(|e| anyhow!("registering the plot font: {e}"))
}

pub(super) fn plot_err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("drawing the plot: {e}")
}

/// Draws with `draw` on a white `WIDTH`×`HEIGHT` bitmap and writes it to `path` as PNG.
fn render(
    path: &Path,
    draw: impl FnOnce(&DrawingArea<BitMapBackend<'_>, Shift>) -> Result<()>,
) -> Result<()> {
    render_sized(path, (WIDTH, HEIGHT), draw)
}

/// Draws with `draw` on a white bitmap of `size` (width, height) and writes it to `path` as
/// PNG.
pub(super) fn render_sized(
    path: &Path,
    (width, height): (u32, u32),
    draw: impl FnOnce(&DrawingArea<BitMapBackend<'_>, Shift>) -> Result<()>,
) -> Result<()> {
    ensure_font()?;
    let mut rgb = vec![0u8; width as usize * height as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        draw(&root).with_context(|| format!("plotting {}", path.display()))?;
        root.present().map_err(plot_err)?;
    }
    write_png(path, width, height, &rgb)
}

fn write_png(path: &Path, width: u32, height: u32, rgb: &[u8]) -> Result<()> {
    let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut encoder = png::Encoder::new(BufWriter::new(file), width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    encoder.set_compression(png::Compression::Best);
    encoder.set_adaptive_filter(png::AdaptiveFilterType::Adaptive);
    let write = || -> Result<(), png::EncodingError> {
        let mut writer = encoder.write_header()?;
        writer.write_image_data(rgb)?;
        writer.finish()
    };
    write().with_context(|| format!("writing PNG {}", path.display()))
}

/// Pads `[lo, hi]` so that it is never empty: 5 % each side, or ±10 % of the value (±1 at 0)
/// when `lo == hi`.
fn padded(lo: f64, hi: f64, frac: f64) -> (f64, f64) {
    let span = hi - lo;
    let (a, b) = if span > 0.0 && span.is_finite() {
        (lo - frac * span, hi + frac * span)
    } else {
        let d = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
        (lo - d, hi + d)
    };
    if a.is_finite() && b.is_finite() && a < b {
        (a, b)
    } else {
        (-1.0, 1.0)
    }
}

/// The y range of the finite `values`: their 1st..99th percentile (nearest rank), padded;
/// `0..1` without any.
pub(super) fn y_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let mut v: Vec<f64> = values.filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return (0.0, 1.0);
    }
    v.sort_by(f64::total_cmp);
    let last = (v.len() - 1) as f64;
    let lo = v[(last * 0.01).floor() as usize];
    let hi = v[(last * 0.99).ceil() as usize];
    padded(lo, hi, 0.05)
}

/// The x range of the finite `values`: min..max, widened when empty or a single value.
pub(super) fn x_range(values: impl Iterator<Item = f64>, frac: f64) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|x| x.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        });
    if lo > hi {
        (0.0, 1.0)
    } else {
        padded(lo, hi, frac)
    }
}

pub(super) fn finite(p: &(f64, f64)) -> bool {
    p.0.is_finite() && p.1.is_finite()
}

/// The loss-curve PNG of one run: training loss of observed steps (a thin line), eval
/// train/val curves, and every predicted span shaded as a translucent band, with a legend.
/// The linear y axis covers the 1st..99th percentile of the finite losses; points outside
/// are drawn on its edge, and non-finite points are skipped.
pub fn plot_run(path: &Path, rec: &RunRecord) -> Result<()> {
    let train: Vec<(f64, f64)> = rec
        .steps
        .iter()
        .filter_map(|p| Some((p.step as f64, f64::from(p.loss?))))
        .filter(finite)
        .collect();
    let eval_train: Vec<(f64, f64)> = rec
        .evals
        .iter()
        .map(|e| (e.step as f64, f64::from(e.train)))
        .filter(finite)
        .collect();
    let eval_val: Vec<(f64, f64)> = rec
        .evals
        .iter()
        .map(|e| (e.step as f64, f64::from(e.val)))
        .filter(finite)
        .collect();
    let spans = rec.predicted_spans();
    let all = || train.iter().chain(&eval_train).chain(&eval_val);
    let xs = all()
        .map(|p| p.0)
        .chain(spans.iter().flat_map(|&(s, e)| [s as f64, e as f64]));
    let (x0, x1) = x_range(xs, 0.0);
    let (y0, y1) = y_range(all().map(|p| p.1));
    let clip = |&(x, y): &(f64, f64)| (x, y.clamp(y0, y1));

    let mut caption = rec.title.clone();
    if all().next().is_none() {
        caption.push_str(" (no finite losses)");
    }
    render(path, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(&caption, ("sans-serif", 24))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc("step")
            .y_desc("loss")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .draw()
            .map_err(plot_err)?;
        let band = PREDICTED.mix(0.22).filled();
        let mut labelled = false;
        if !spans.is_empty() {
            let label = format!(
                "predicted steps ({} span{})",
                spans.len(),
                if spans.len() == 1 { "" } else { "s" }
            );
            chart
                .draw_series(
                    spans
                        .iter()
                        .map(|&(s, e)| Rectangle::new([(s as f64, y0), (e as f64, y1)], band)),
                )
                .map_err(plot_err)?
                .label(label)
                .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 18, y + 6)], band));
            labelled = true;
        }
        if !train.is_empty() {
            let style = TRAIN_STEP.mix(0.7).stroke_width(1);
            let size = if train.len() < 50 { 2 } else { 0 };
            chart
                .draw_series(LineSeries::new(train.iter().map(clip), style).point_size(size))
                .map_err(plot_err)?
                .label("train loss (observed steps)")
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
            labelled = true;
        }
        for (points, colour, label) in [
            (&eval_train, EVAL_TRAIN, "eval train loss"),
            (&eval_val, EVAL_VAL, "eval val loss"),
        ] {
            if points.is_empty() {
                continue;
            }
            let style = colour.stroke_width(2);
            chart
                .draw_series(LineSeries::new(points.iter().map(clip), style).point_size(3))
                .map_err(plot_err)?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
            labelled = true;
        }
        if labelled {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(plot_err)?;
        }
        Ok(())
    })
}

/// Several runs' curves in one PNG (e.g. the validation loss of each arm of an experiment
/// against the step or any other abscissa), one colour per curve, with `title` and axis
/// labels. Non-finite points are skipped; a curve left without points keeps its legend entry.
pub fn plot_curves(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    curves: &[Curve],
) -> Result<()> {
    let kept: Vec<Vec<(f64, f64)>> = curves
        .iter()
        .map(|c| c.points.iter().copied().filter(finite).collect())
        .collect();
    let all = || kept.iter().flatten();
    let (x0, x1) = x_range(all().map(|p| p.0), 0.02);
    let (y0, y1) = y_range(all().map(|p| p.1));
    let clip = |&(x, y): &(f64, f64)| (x, y.clamp(y0, y1));
    render(path, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, ("sans-serif", 24))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .draw()
            .map_err(plot_err)?;
        for (i, (curve, points)) in curves.iter().zip(&kept).enumerate() {
            let style = PALETTE[i % PALETTE.len()].stroke_width(2);
            let size = if points.len() <= 60 { 3 } else { 0 };
            let label = if points.is_empty() {
                format!("{} (no finite points)", curve.label)
            } else {
                curve.label.clone()
            };
            chart
                .draw_series(LineSeries::new(points.iter().map(clip), style).point_size(size))
                .map_err(plot_err)?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
        }
        if !curves.is_empty() {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(plot_err)?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn y_range_clips_to_percentiles_and_is_never_empty() {
        // 300 finite points: two huge early losses fall outside the 1st..99th percentile.
        let mut v: Vec<f64> = (0..298).map(|i| 2.0 + f64::from(i) / 298.0).collect();
        v.extend([1e6, 5e5, f64::NAN, f64::INFINITY]);
        let (lo, hi) = y_range(v.into_iter());
        assert!(lo > 1.8 && lo < 2.0, "{lo}");
        assert!(hi > 3.0 && hi < 3.2, "{hi}");
        assert_eq!(y_range(std::iter::empty()), (0.0, 1.0));
        let (lo, hi) = y_range([2.5].into_iter());
        assert!(lo < 2.5 && hi > 2.5);
        let (lo, hi) = y_range([0.0, 0.0].into_iter());
        assert!(lo < 0.0 && hi > 0.0);
        let (lo, hi) = x_range([7.0].into_iter(), 0.0);
        assert!(lo < 7.0 && hi > 7.0);
    }

    #[test]
    fn font_registers_once_and_again_without_error() {
        ensure_font().unwrap();
        ensure_font().unwrap();
    }
}
