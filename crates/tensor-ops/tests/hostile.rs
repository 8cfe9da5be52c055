//! Correctness under hostile input: extreme values, degenerate and overflowing sizes, ids out of
//! range, bad hyper-parameters. Every test runs on each device of
//! [`gpu_cuda::testing::devices`] (the CPU, then CUDA where present) and expects the same
//! result, or the same typed error, on each.

/// Defines `fn $name(what, r)`: panics (naming `what`) unless `r` failed with `GpuError::$variant`.
macro_rules! expect_error {
    ($name:ident, $variant:ident) => {
        fn $name<T: std::fmt::Debug>(what: &str, r: tensor_ops::Result<T>) {
            match r {
                Err(GpuError::$variant { .. }) => {}
                other => panic!("{what}: expected {}, got {other:?}", stringify!($variant)),
            }
        }
    };
}

#[path = "hostile/api.rs"]
mod api;
#[path = "hostile/ids.rs"]
mod ids;
#[path = "hostile/numerics.rs"]
mod numerics;
#[path = "hostile/optim.rs"]
mod optim;
#[path = "hostile/optim_adaptive.rs"]
mod optim_adaptive;
#[path = "hostile/sizes.rs"]
mod sizes;

use tensor_ops::Device;

/// The devices this test covers (prints a note when the CUDA part is skipped).
pub fn devices(test: &str) -> Vec<Device> {
    gpu_cuda::testing::devices(test)
}
