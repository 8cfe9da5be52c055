//! Report files: the main job's side-by-side report of AdamW and the hybrid ([`compare`]) is
//! written as markdown, JSON and a PNG (drawn with `plotters`) by one helper; non-finite
//! losses are written to JSON as `null`.

pub mod compare;
mod compare_plot;
mod plot;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;
use tensor_ops::fsio;

/// The three files a report writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportPaths {
    pub markdown: PathBuf,
    pub json: PathBuf,
    pub png: PathBuf,
}

impl ReportPaths {
    /// `<dir>/<stem>.md`, `.json` and `.png`.
    pub fn new(dir: &Path, stem: &str) -> Self {
        Self {
            markdown: dir.join(format!("{stem}.md")),
            json: dir.join(format!("{stem}.json")),
            png: dir.join(format!("{stem}.png")),
        }
    }

    /// Refuses a destination the report could not write (a FIFO, device or directory), so that
    /// a job refuses it before it runs rather than after.
    pub fn check(&self) -> Result<(), fsio::FileError> {
        for p in [&self.markdown, &self.json, &self.png] {
            fsio::check_destination(p, "report")?;
        }
        Ok(())
    }
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
    let paths = ReportPaths::new(dir, stem);
    let json = serde_json::to_string_pretty(value).context("serialising the report")?;
    fsio::write(&paths.json, "report", (json + "\n").as_bytes())?;
    plot(&paths.png)?;
    fsio::write(&paths.markdown, "report", md(&png_name).as_bytes())?;
    Ok(paths)
}

/// Serde helpers: JSON has no NaN or infinity, so non-finite floats are written as `null`.
pub(crate) mod finite {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn f32<S: Serializer>(v: &f32, s: S) -> Result<S::Ok, S::Error> {
        if v.is_finite() {
            s.serialize_f32(*v)
        } else {
            s.serialize_none()
        }
    }

    /// A number, or `null` read as NaN.
    pub fn de_f32<'de, D: Deserializer<'de>>(d: D) -> Result<f32, D::Error> {
        Ok(Option::<f32>::deserialize(d)?.unwrap_or(f32::NAN))
    }

    /// [`f32`] and [`de_f32`] for `#[serde(with = "crate::report::finite::f32_or_null")]`.
    pub mod f32_or_null {
        pub use super::de_f32 as deserialize;
        pub use super::f32 as serialize;
    }
}
