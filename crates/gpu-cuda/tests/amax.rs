//! The one-pass max-abs and finiteness scan (`gpu_cuda::amax`) against its CPU reference, bit
//! for bit, on fresh random inputs (seed printed; `HYBRID_TEST_SEED` replays) of every length
//! class the kernel's float4 body and scalar tail meet, with hostile values planted at random
//! places; its typed errors. The reference's own test runs everywhere; the GPU test prints why
//! it skips without a GPU.

mod common;

use common::gpu_and_rng;
use gpu_core::{Backend, DType};
use gpu_cuda::amax::{max_abs_bits_reference, INF_BITS};
use rand::Rng;

#[test]
fn max_abs_bits_reference_orders_magnitudes_and_flags_nan() {
    assert_eq!(max_abs_bits_reference(&[]), 0);
    assert_eq!(max_abs_bits_reference(&[-0.0, 0.0]), 0);
    assert_eq!(
        f32::from_bits(max_abs_bits_reference(&[1.0, -3.5, 2.0])),
        3.5
    );
    let tiny = f32::from_bits(1); // the smallest denormal
    assert_eq!(max_abs_bits_reference(&[-tiny, 0.0]), 1);
    assert_eq!(
        max_abs_bits_reference(&[f32::MAX, -f32::INFINITY]),
        INF_BITS
    );
    assert!(max_abs_bits_reference(&[1.0, f32::NAN, f32::INFINITY]) > INF_BITS);
    assert!(max_abs_bits_reference(&[-f32::NAN]) > INF_BITS);
}

#[test]
fn gpu_max_abs_bits_matches_its_reference() {
    let test = "gpu_max_abs_bits_matches_its_reference";
    let (gpu, mut r) = skip_unless!(gpu_and_rng(test));
    let hostile = [
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -1e30,
        1e30,
        f32::MAX,
        -f32::MIN_POSITIVE,
        f32::from_bits(1),
        -0.0,
    ];
    for n in [0usize, 1, 3, 4, 5, 7, 255, 1024, 4099, (1 << 20) + 3] {
        for plant in [None, Some(0usize), Some(1), Some(2)] {
            let mut x: Vec<f32> = (0..n).map(|_| r.random_range(-2.0f32..2.0)).collect();
            if let (Some(k), true) = (plant, n > 0) {
                // k + 1 hostile values at random places (the first at the end: the tail).
                for j in 0..=k {
                    let at = if j == 0 { n - 1 } else { r.random_range(0..n) };
                    x[at] = hostile[r.random_range(0..hostile.len())];
                }
            }
            let want = max_abs_bits_reference(&x);
            let buf = gpu.upload(&x).unwrap();
            let got = gpu.max_abs_bits(&buf, n).unwrap();
            assert_eq!(got, want, "n {n}, plant {plant:?}");
        }
    }
    // A prefix: elements past n never count.
    let x = [1.0f32, 2.0, f32::NAN, 100.0, 5.0];
    let buf = gpu.upload(&x).unwrap();
    assert_eq!(f32::from_bits(gpu.max_abs_bits(&buf, 2).unwrap()), 2.0);
    // A running maximum over two buffers through one `out`.
    let mut out = gpu.upload(&[0u32]).unwrap();
    let a = gpu.upload(&[3.0f32, -1.0]).unwrap();
    let b = gpu.upload(&[-7.0f32; 9]).unwrap();
    gpu.max_abs_bits_into(&a, 2, &mut out).unwrap();
    gpu.max_abs_bits_into(&b, 9, &mut out).unwrap();
    assert_eq!(f32::from_bits(gpu.download::<u32>(&out).unwrap()[0]), 7.0);
    // Typed errors: too short, wrong dtypes.
    let short = gpu.allocate(DType::F32, 3).unwrap();
    assert!(gpu.max_abs_bits(&short, 4).is_err());
    let ints = gpu.upload(&[1u32, 2]).unwrap();
    assert!(gpu.max_abs_bits(&ints, 2).is_err());
    let mut not_u32 = gpu.allocate(DType::F32, 1).unwrap();
    assert!(gpu.max_abs_bits_into(&short, 3, &mut not_u32).is_err());
}
