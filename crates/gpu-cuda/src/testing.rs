//! Support for tests that need a GPU.
//!
//! [`backend_or_skip`] returns a backend, or prints why the test is skipped, straight to stderr
//! (past the test harness's capture), and appends the test's name to the file named by
//! `HYBRID_GPU_SKIP_LOG` so a runner can count skips. With `HYBRID_REQUIRE_GPU=1` a missing GPU
//! fails the test instead: the GPU bundle sets it so a skip can never pass for a pass.

use crate::CudaBackend;
use std::io::Write;

/// The backend for CUDA device 0, or `None` after reporting the skip.
pub fn backend_or_skip(test: &str) -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(b) => Some(b),
        Err(e) => {
            if std::env::var("HYBRID_REQUIRE_GPU").is_ok_and(|v| v == "1") {
                panic!("{test}: HYBRID_REQUIRE_GPU=1 but no GPU: {e}");
            }
            let _ = writeln!(std::io::stderr(), "SKIP {test}: no CUDA device ({e})");
            if let Ok(path) = std::env::var("HYBRID_GPU_SKIP_LOG") {
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
