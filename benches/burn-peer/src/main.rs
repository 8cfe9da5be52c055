//! `burn-peer`: `wgpu-bench`'s rows on burn's wgpu backend (burn 0.22, CubeCL, the same wgpu
//! 30; its default device and float dtype, f32), timed as `wgpu-bench` times its own: the median over `REPS` samples of a burst of
//! `BURST` calls queued back to back, host clock around the burst and a device sync, after
//! warm-up. Prints one line a row (µs a call), then the rows as JSON. `--small`: the sizes of
//! `wgpu-bench --small` (a software adapter).

use burn::tensor::{activation, Device, DeviceKind, Distribution, Tensor};
use std::time::Instant;

const REPS: usize = 5;
const BURST: usize = 3;

/// Median microseconds of one call of `f` (see the crate's doc).
fn time<T>(dev: &Device, mut f: impl FnMut() -> T) -> f64 {
    for _ in 0..2 {
        drop(f());
    }
    dev.sync().expect("burn: device sync");
    let mut s: Vec<f64> = (0..REPS)
        .map(|_| {
            let t0 = Instant::now();
            let outs: Vec<T> = (0..BURST).map(|_| f()).collect();
            dev.sync().expect("burn: device sync");
            drop(outs);
            t0.elapsed().as_secs_f64() * 1e6 / BURST as f64
        })
        .collect();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

fn main() {
    let small = std::env::args().any(|a| a == "--small");
    let (rows, cols, n) = if small {
        (256, 256, 256)
    } else {
        (8192, 4096, 4096)
    };
    let dev = Device::wgpu(DeviceKind::DefaultDevice);
    let x = Tensor::<2>::random([rows, cols], Distribution::Uniform(-4.0, 4.0), &dev);
    let y = Tensor::<2>::random([rows, cols], Distribution::Uniform(-4.0, 4.0), &dev);
    let bytes = (rows * cols * 4) as f64;
    let mut out = Vec::new();
    let mut row = |id: &str, what: String, us: f64, rate: String| {
        println!("{id:>12}: {us:12.1} us  {what}  {rate}");
        out.push(format!(
            "{{\"id\":\"{id}\",\"what\":\"{what}\",\"median_us\":{us:.3}}}"
        ));
    };
    let gbs = |us: f64, b: f64| format!("{:.1} GB/s", b / (us * 1e-6) / 1e9);
    let size = format!("{rows}×{cols} f32");
    let us = time(&dev, || x.clone() + 0.0);
    row(
        "copy",
        format!("x + 0 (a kernel copy), {size}"),
        us,
        gbs(us, 2.0 * bytes),
    );
    let us = time(&dev, || x.clone() + y.clone());
    row("add", format!("add, {size}"), us, gbs(us, 3.0 * bytes));
    let us = time(&dev, || activation::gelu(x.clone()));
    row(
        "gelu",
        format!("GELU forward, {size}"),
        us,
        gbs(us, 2.0 * bytes),
    );
    let us = time(&dev, || activation::softmax(x.clone(), 1));
    row(
        "softmax",
        format!("softmax over rows, {size}"),
        us,
        gbs(us, 2.0 * bytes),
    );
    let a = Tensor::<2>::random([n, n], Distribution::Uniform(-1.0, 1.0), &dev);
    let b = Tensor::<2>::random([n, n], Distribution::Uniform(-1.0, 1.0), &dev);
    let us = time(&dev, || a.clone().matmul(b.clone()));
    let tflops = 2.0 * (n as f64).powi(3) / (us * 1e-6) / 1e12;
    row(
        "sgemm",
        format!("f32 GEMM {n}³"),
        us,
        format!("{tflops:.2} TFLOP/s"),
    );
    println!("[{}]", out.join(","));
}
