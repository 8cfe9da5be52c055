//! PNG drawing helpers for the reports (`plotters`): drawn into an in-memory RGB bitmap, text with the embedded
//! DejaVu Sans (the `ab_glyph` feature, no system fonts), encoded with the `png` crate.
//! Non-finite points are skipped; a single point or a flat curve still gets a non-zero axis range.

use std::path::Path;
use std::sync::OnceLock;

use anyhow::{anyhow, Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

/// DejaVu Sans 2.37, see `data/README.md` and `data/DejaVuSans-LICENSE.txt`.
const FONT: &[u8] = include_bytes!("../../data/DejaVuSans.ttf");
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
    let mut bytes = Vec::new();
    let mut encoder = png::Encoder::new(&mut bytes, width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    encoder.set_compression(png::Compression::Best);
    encoder.set_adaptive_filter(png::AdaptiveFilterType::Adaptive);
    let write = || -> Result<(), png::EncodingError> {
        let mut writer = encoder.write_header()?;
        writer.write_image_data(rgb)?;
        writer.finish()
    };
    write().with_context(|| format!("encoding PNG {}", path.display()))?;
    Ok(tensor_ops::fsio::write(path, "plot", &bytes)?)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn x_range_is_never_empty() {
        let (lo, hi) = x_range([7.0].into_iter(), 0.0);
        assert!(lo < 7.0 && hi > 7.0);
        assert_eq!(x_range([f64::NAN].into_iter(), 0.05), (0.0, 1.0));
    }

    #[test]
    fn font_registers_once_and_again_without_error() {
        ensure_font().unwrap();
        ensure_font().unwrap();
    }
}
