//! Support for tests that need a GPU, and for randomised tests.
//!
//! [`backend_or_skip`] returns a backend, or prints why the test is skipped, straight to stderr
//! (past the test harness's capture), and appends the test's name to the file named by
//! `HYBRID_GPU_SKIP_LOG` so a runner can count skips. With `HYBRID_REQUIRE_GPU=1` a missing GPU
//! fails the test instead: the GPU bundle sets it so a skip can never pass for a pass.
//!
//! [`devices`] lists the devices a test that runs everywhere should cover (the CPU, then CUDA
//! device 0 where present), and [`test_seed`] gives a randomised test a seed, fixed per test
//! and printed, which `HYBRID_TEST_SEED` replays (or `fresh` redraws).

pub mod cancel;

use crate::CudaBackend;
use gpu_core::testing::{env_is_one, or_skip, report_skip, SkipRule};
use gpu_core::Device;
use std::io::Write;

/// The environment variable that sets a randomised test's seed.
pub use gpu_core::testing::SEED_ENV;

/// Whether `HYBRID_REQUIRE_GPU=1` (set by the GPU bundle).
fn gpu_required() -> bool {
    env_is_one("HYBRID_REQUIRE_GPU")
}

/// The backend for CUDA device 0, or `None` after reporting the skip.
pub fn backend_or_skip(test: &str) -> Option<CudaBackend> {
    let rule = SkipRule {
        require_env: "HYBRID_REQUIRE_GPU",
        log_env: "HYBRID_GPU_SKIP_LOG",
        absent: "GPU",
        skip: "no CUDA device",
    };
    or_skip(test, CudaBackend::new(0), rule)
}

/// The devices a test that must hold everywhere runs on: the CPU, then CUDA device 0 when one
/// is present. Without a GPU the CUDA part is reported as skipped on stderr (the test still
/// runs on the CPU, so it is not logged as a skipped GPU test); with `HYBRID_REQUIRE_GPU=1` a
/// missing GPU fails the test.
pub fn devices(test: &str) -> Vec<Device> {
    match CudaBackend::new(0) {
        Ok(b) => vec![Device::Cpu, Device::Cuda(b.info().ordinal)],
        Err(e) => {
            if gpu_required() {
                panic!("{test}: HYBRID_REQUIRE_GPU=1 but no GPU: {e}");
            }
            let _ = writeln!(
                std::io::stderr(),
                "note {test}: CPU only, CUDA part skipped (no CUDA device: {e})"
            );
            vec![Device::Cpu]
        }
    }
}

/// The seed of a randomised test ([`gpu_core::testing::test_seed`]: fixed per test, printed;
/// `HYBRID_TEST_SEED` replays a number or draws `fresh`).
pub fn test_seed(test: &str) -> u64 {
    gpu_core::testing::test_seed(test)
}

/// The number of CUDA devices when there are at least `n`, or `None` after reporting the skip
/// to stderr and to the file named by `HYBRID_MULTI_GPU_SKIP_LOG`: for the multi-GPU tests
/// (named `multigpu_*`), which the GPU bundle counts on a line of their own, since most GPU
/// machines have one GPU. With `HYBRID_REQUIRE_GPUS=m` (the bundle sets the machine's count)
/// and `m >= n`, a skip fails the test instead.
pub fn gpus_or_skip(test: &str, n: usize) -> Option<usize> {
    let count = crate::cuda_device_count().unwrap_or(0);
    if count >= n {
        return Some(count);
    }
    let required = std::env::var("HYBRID_REQUIRE_GPUS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    if required >= n {
        panic!("{test}: HYBRID_REQUIRE_GPUS={required} but CUDA reports {count} device(s)");
    }
    report_skip(
        test,
        &format!("needs {n} CUDA devices, this machine has {count}"),
        "HYBRID_MULTI_GPU_SKIP_LOG",
    );
    None
}

/// The CUDA device 0 as a [`Device`], or `None` after reporting the skip (see
/// [`backend_or_skip`]).
pub fn gpu_device_or_skip(test: &str) -> Option<Device> {
    backend_or_skip(test).map(|b| Device::Cuda(b.info().ordinal))
}

/// Norm-wise relative error `‖a − b‖ / ‖b‖` in f64: infinite when either holds a NaN, and the
/// absolute `‖a − b‖` when `b` is all zeros.
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "rel_err: lengths differ");
    if a.iter().chain(b).any(|v| v.is_nan()) {
        return f64::INFINITY;
    }
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}
