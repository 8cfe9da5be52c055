//! Support for tests that need a wgpu adapter.
//!
//! [`backend_or_skip`] returns the shared backend of adapter 0, or prints
//! `SKIP <test>: no wgpu adapter (<reason>)` to stderr and appends the test's name to the file
//! named by `HYBRID_WGPU_SKIP_LOG`. With `HYBRID_REQUIRE_WGPU=1` (set by CI, where lavapipe is
//! installed) a missing adapter fails the test instead, so a skip never passes for a pass.

pub use crate::sample::{sample_probe, SampleProbe};
use crate::WgpuBackend;
use std::io::Write;

/// The environment variable that turns a skip into a failure.
pub const REQUIRE_ENV: &str = "HYBRID_REQUIRE_WGPU";

/// Whether `HYBRID_REQUIRE_WGPU=1`.
pub fn wgpu_required() -> bool {
    std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1")
}

/// The backend of adapter 0, or `None` after reporting the skip.
pub fn backend_or_skip(test: &str) -> Option<WgpuBackend> {
    match WgpuBackend::shared(0) {
        Ok(b) => Some(b),
        Err(e) => {
            if wgpu_required() {
                panic!("{test}: {REQUIRE_ENV}=1 but no wgpu adapter: {e}");
            }
            let _ = writeln!(std::io::stderr(), "SKIP {test}: no wgpu adapter ({e})");
            if let Ok(path) = std::env::var("HYBRID_WGPU_SKIP_LOG") {
                if let Ok(mut f) = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                {
                    let _ = writeln!(f, "{test}");
                }
            }
            None
        }
    }
}
