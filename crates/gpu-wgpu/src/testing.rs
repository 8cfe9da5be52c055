//! Support for tests that need a wgpu adapter.
//!
//! [`backend_or_skip`] returns the shared backend of adapter 0, or prints
//! `SKIP <test>: no wgpu adapter (<reason>)` to stderr and appends the test's name to the file
//! named by `HYBRID_WGPU_SKIP_LOG`. With `HYBRID_REQUIRE_WGPU=1` (set by CI, where lavapipe is
//! installed) a missing adapter fails the test instead, so a skip never passes for a pass.

pub use crate::sample::{sample_probe, SampleProbe};
use crate::WgpuBackend;
use gpu_core::testing::{env_is_one, or_skip, SkipRule};

/// The environment variable that turns a skip into a failure.
pub const REQUIRE_ENV: &str = "HYBRID_REQUIRE_WGPU";

/// Whether `HYBRID_REQUIRE_WGPU=1`.
pub fn wgpu_required() -> bool {
    env_is_one(REQUIRE_ENV)
}

/// The backend of adapter 0, or `None` after reporting the skip.
pub fn backend_or_skip(test: &str) -> Option<WgpuBackend> {
    let rule = SkipRule {
        require_env: REQUIRE_ENV,
        log_env: "HYBRID_WGPU_SKIP_LOG",
        absent: "wgpu adapter",
        skip: "no wgpu adapter",
    };
    or_skip(test, WgpuBackend::shared(0), rule)
}
