//! Shared helpers of the GPU tests: fresh random inputs, error metrics, poisoning.
#![allow(dead_code)]

use gpu_core::nn::ElementwiseOps;
use gpu_core::{Backend, BufferInfo, CpuBackend};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// Awkward sizes: empty, one, below a warp, below a block of float4s, above a million and odd.
pub const SIZES: &[usize] = &[0, 1, 3, 31, 1023, 4099, (1 << 20) + 7];

/// A fresh seed for every run (or `HYBRID_TEST_SEED`), printed so a failure can be replayed.
pub fn rng(test: &str) -> (StdRng, u64) {
    let seed = gpu_cuda::testing::test_seed(test);
    (StdRng::seed_from_u64(seed), seed)
}

/// The CUDA backend and a seeded rng for test `test` (as [`rng`]), or `None` without a GPU
/// (the test then returns: it skips).
pub fn gpu_and_rng(test: &str) -> Option<(gpu_cuda::CudaBackend, StdRng)> {
    gpu_rng_and_seed(test).map(|(gpu, rng, _)| (gpu, rng))
}

/// As [`gpu_and_rng`], with the rng's seed too (for a test that also seeds a kernel with it).
pub fn gpu_rng_and_seed(test: &str) -> Option<(gpu_cuda::CudaBackend, StdRng, u64)> {
    let gpu = gpu_cuda::testing::backend_or_skip(test)?;
    let (rng, seed) = rng(test);
    Some((gpu, rng, seed))
}

/// A proptest configuration of `cases` cases whose generator is seeded by [`rng`]'s printed
/// seed, so `HYBRID_TEST_SEED` replays the cases; a failure also prints the shrunk input.
pub fn proptest_config(test: &str, cases: u32) -> proptest::test_runner::Config {
    proptest::test_runner::Config {
        cases,
        rng_seed: proptest::test_runner::RngSeed::Fixed(gpu_cuda::testing::test_seed(test)),
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    }
}

/// `n` values uniform in [-scale, scale).
pub fn random_vec(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

/// Asserts `got` matches `want`: every element finite where `want` is (so a poisoned, unwritten
/// element fails), elementwise `|got - want| <= rtol·|want| + atol`, and the norm-wise relative
/// error `‖got − want‖ / ‖want‖` under `rtol`.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], rtol: f64, atol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if w.is_nan() {
            assert!(g.is_nan(), "{what}[{i}]: want NaN, got {g}");
            continue;
        }
        assert!(
            g.is_finite() || g == w,
            "{what}[{i}]: got {g}, want {w} (unwritten?)"
        );
        let d = (g as f64 - w as f64).abs();
        assert!(
            d <= rtol * (w as f64).abs() + atol,
            "{what}[{i}]: got {g}, want {w}, diff {d:e}"
        );
        num += d * d;
        den += (w as f64) * (w as f64);
    }
    if den > 0.0 {
        let rel = (num / den).sqrt();
        assert!(
            rel < rtol,
            "{what}: norm-wise relative error {rel:e} >= {rtol:e}"
        );
    }
}

/// Tensor lengths for the optimisers' multi-tensor launches: awkward ones (one empty), then 62
/// small random ones: 69 non-empty tensors, so two launches of up to 64 (or of 48).
pub fn multi_tensor_lengths(rng: &mut StdRng) -> Vec<usize> {
    let mut v = vec![0, 1, 3, 1023, 100_003, 4096, 4097, 8191];
    v.extend((0..62).map(|_| rng.random_range(1..3000)));
    v
}

/// `n` bf16 values: uniform in [-scale, scale) as f32, then rounded.
pub fn bf16s(rng: &mut StdRng, n: usize, scale: f32) -> Vec<half::bf16> {
    (0..n)
        .map(|_| half::bf16::from_f32(rng.random_range(-scale..scale)))
        .collect()
}

/// The bits of every f32, for comparisons that must be exact (NaN equal to NaN).
pub fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// Uploads `data` to backend `b`.
pub fn up<B: Backend>(b: &B, data: &[f32]) -> B::Buffer {
    b.upload(data).expect("upload")
}

/// An output buffer of `n` f32 poisoned with NaN, so an element the kernel skips fails the check.
pub fn poisoned<B: ElementwiseOps>(b: &B, n: usize) -> B::Buffer {
    let mut out = b.allocate(gpu_core::DType::F32, n).expect("allocate");
    b.fill(&mut out, f32::NAN).expect("poison");
    out
}

/// Runs `op(inputs, output)` on backend `b`: `ins` uploaded, the `n`-element f32 output
/// poisoned (as [`poisoned`]) before the call and downloaded after.
pub fn run_op<B: ElementwiseOps, const N: usize>(
    b: &B,
    ins: [&[f32]; N],
    n: usize,
    op: impl FnOnce(&[B::Buffer; N], &mut B::Buffer) -> gpu_core::Result<()>,
) -> Vec<f32> {
    let mut o = poisoned(b, n);
    op(&ins.map(|x| up(b, x)), &mut o).unwrap();
    down(b, &o)
}

/// Downloads an f32 buffer.
pub fn down<B: Backend>(b: &B, buf: &B::Buffer) -> Vec<f32> {
    assert_eq!(buf.dtype(), gpu_core::DType::F32);
    b.download(buf).expect("download")
}

/// Uploads `x` as `dtype`: f32, or bf16 rounded to nearest even first (give the CPU the same
/// buffer and both sides see the same values).
pub fn put<B: Backend>(b: &B, x: &[f32], dtype: gpu_core::DType) -> B::Buffer {
    match dtype {
        gpu_core::DType::BF16 => b
            .upload(
                &x.iter()
                    .map(|&v| half::bf16::from_f32(v))
                    .collect::<Vec<_>>(),
            )
            .expect("upload"),
        _ => b.upload(x).expect("upload"),
    }
}

/// Downloads an f32 or bf16 buffer as f32.
pub fn get<B: Backend>(b: &B, x: &B::Buffer) -> Vec<f32> {
    match x.dtype() {
        gpu_core::DType::BF16 => b
            .download::<half::bf16>(x)
            .expect("download")
            .iter()
            .map(|v| v.to_f32())
            .collect(),
        _ => b.download::<f32>(x).expect("download"),
    }
}

/// `assert_err!(what, Kind, call)`: `call` must give `Err(GpuError::Kind { .. })`; `what`
/// (anything `Display`) and the call's text name the case in the failure.
#[macro_export]
macro_rules! assert_err {
    ($what:expr, $kind:ident, $call:expr) => {{
        let r = $call;
        assert!(
            matches!(r, Err(gpu_core::GpuError::$kind { .. })),
            "{}: {} gave {:?}",
            $what,
            stringify!($call),
            r.err()
        );
    }};
}

/// The CPU reference backend.
pub const CPU: CpuBackend = CpuBackend;

/// Runs a generic test body `fn(&B, dev: &str, &mut StdRng)` on the CPU backend, then on CUDA
/// (when present) under every launcher × image, with one printed, replayable seed.
#[macro_export]
macro_rules! on_every_device {
    ($test:expr, $body:ident) => {{
        let (mut rng, _) = $crate::common::rng($test);
        $body(&$crate::common::CPU, "cpu", &mut rng);
        if let Some(gpu) = gpu_cuda::testing::backend_or_skip($test) {
            for path in [
                gpu_cuda::LaunchPath::Cudarc,
                gpu_cuda::LaunchPath::RawDriver,
            ] {
                for image in [gpu_cuda::ImageKind::Fatbin, gpu_cuda::ImageKind::Ptx] {
                    gpu.set_launch_path(path);
                    gpu.set_image_kind(image);
                    $body(&gpu, &format!("cuda {path:?} {image:?}"), &mut rng);
                }
            }
        }
    }};
}

/// `every_device_test!(name, body)`: the test `name`, which runs `body` through
/// [`on_every_device!`] under its own name (the seed's key).
#[macro_export]
macro_rules! every_device_test {
    ($test:ident, $body:ident) => {
        #[test]
        fn $test() {
            $crate::on_every_device!(stringify!($test), $body);
        }
    };
}

/// `skip_unless!(gpu_and_rng(test))`: what the `Some` holds, or a return from the test, which
/// then skips (the helpers that give `None`, [`gpu_and_rng`] and `backend_or_skip`, have
/// printed why).
#[macro_export]
macro_rules! skip_unless {
    ($found:expr) => {
        match $found {
            Some(found) => found,
            None => return,
        }
    };
}

/// The dims of a decode or prefill call from `(b, t, heads, kv_heads, d, cap)` (the order of
/// the decode tests' shape tables) and the attention window.
pub fn decode_dims(
    (b, t, heads, kv_heads, d, cap): (usize, usize, usize, usize, usize, usize),
    window: Option<usize>,
) -> gpu_core::nn::decode::DecodeDims {
    gpu_core::nn::decode::DecodeDims {
        b,
        t,
        heads,
        kv_heads,
        d,
        cap,
        window,
    }
}
