//! `Tensor::matmul_quant` and `QuantWeight` on the CPU: the product equals
//! `x.matmul_t(w.dequantize())` within the f32 summation bound, leading dims fold into rows,
//! the output keeps x's dtype, and bad weights or shapes are typed errors. The seed is printed;
//! `HYBRID_TEST_SEED` replays it.

use gpu_core::nn::quant::{QuantFormat, QuantSpec};
use rand::{Rng, SeedableRng};
use tensor_ops::{DType, Device, GpuError, QuantWeight, Tensor};

const U: f64 = 1.0 / (1u64 << 24) as f64;

fn seed(test: &str) -> rand::rngs::StdRng {
    let seed = std::env::var("HYBRID_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    println!("{test}: seed {seed} (HYBRID_TEST_SEED={seed} replays it)");
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// A random `n × k` weight in `format` on the CPU.
fn weight(r: &mut impl Rng, format: QuantFormat, n: usize, k: usize) -> QuantWeight {
    let spec = QuantSpec::weight(format, n, k);
    let half = |r: &mut _| half::f16::from_f32(Rng::random_range(r, -1.0..1.0)).to_bits() as u32;
    let words: Vec<u32> = (0..spec.data_len())
        .map(|_| match format {
            // Finite halves (random bits would hold infinities and NaNs).
            QuantFormat::F16 => half(r) | half(r) << 16,
            _ => r.random(),
        })
        .collect();
    let scales: Vec<f32> = (0..spec.scales_len())
        .map(|_| r.random_range(0.0..0.1))
        .collect();
    let mins: Vec<f32> = (0..spec.mins_len())
        .map(|_| r.random_range(-0.8..0.0))
        .collect();
    let g = format.groups_per_row(k);
    let (ss, ms) = match format {
        QuantFormat::Int8 => (vec![n], vec![0]),
        QuantFormat::Int4 => (vec![n, g], vec![n, g]),
        QuantFormat::F16 => (vec![0], vec![0]),
    };
    QuantWeight::new(
        Tensor::from_vec(words, &[n, spec.words_per_row()], Device::Cpu).unwrap(),
        Tensor::from_vec(scales, &ss, Device::Cpu).unwrap(),
        Tensor::from_vec(mins, &ms, Device::Cpu).unwrap(),
        format,
        n,
        k,
    )
    .unwrap()
}

/// Both sides are within `γ_k·Σ|x·w|` (f32 GEMM) and `u·|r|` (the reference's one rounding)
/// of the exact sum `r`; a bf16 output adds two bf16 roundings, `2^-8·(|r| + e)`.
#[test]
fn matmul_quant_equals_matmul_by_the_dequantized_weight() {
    let mut r = seed("matmul_quant_equals_matmul_by_the_dequantized_weight");
    for format in [QuantFormat::Int8, QuantFormat::Int4, QuantFormat::F16] {
        for (lead, n, k) in [(vec![1], 5, 8), (vec![2, 3], 7, 200), (vec![9], 4, 2048)] {
            let w = weight(&mut r, format, n, k);
            let deq = w.dequantize(DType::F32).unwrap();
            let mut shape = lead.clone();
            shape.push(k);
            let m: usize = lead.iter().product();
            let xs: Vec<f32> = (0..m * k).map(|_| r.random_range(-2.0..2.0)).collect();
            let x = Tensor::from_vec(xs.clone(), &shape, Device::Cpu).unwrap();
            let want = x.matmul_t(&deq, false, true).unwrap().to_vec().unwrap();
            let dv = deq.to_vec().unwrap();
            for dtype in [DType::F32, DType::BF16] {
                let xd = x.to_dtype(dtype).unwrap();
                let xv = xd.to_vec().unwrap();
                let got = xd.matmul_quant(&w).unwrap();
                let mut out_shape = lead.clone();
                out_shape.push(n);
                assert_eq!(got.shape(), out_shape.as_slice());
                assert_eq!(got.dtype(), dtype);
                let got = got.to_vec().unwrap();
                for idx in 0..m * n {
                    let (i, j) = (idx / n, idx % n);
                    let mag: f64 = (0..k)
                        .map(|t| (xv[i * k + t] as f64 * dv[j * k + t] as f64).abs())
                        .sum();
                    // bf16 x: the f32 reference's x differs by a bf16 rounding, 2^-9 each.
                    let x_round = if dtype == DType::BF16 {
                        1.0 / 512.0
                    } else {
                        0.0
                    };
                    let mut e = ((k as f64 + 2.0) * U * 1.01 + x_round) * mag;
                    if dtype == DType::BF16 {
                        e += (want[idx].abs() as f64 + e) / 256.0;
                    }
                    let err = (got[idx] as f64 - want[idx] as f64).abs();
                    assert!(err <= e, "{format:?} {dtype} ({i}, {j}): {err:e} > {e:e}");
                }
            }
        }
    }
}

#[test]
fn quant_weights_and_inputs_are_checked() {
    let mut r = seed("quant_weights_and_inputs_are_checked");
    let w = weight(&mut r, QuantFormat::Int4, 3, 16);
    let x = Tensor::from_vec(vec![1.0f32; 15], &[15], Device::Cpu).unwrap();
    assert!(matches!(
        x.matmul_quant(&w),
        Err(GpuError::ShapeMismatch { .. })
    ));
    let x = Tensor::from_vec(vec![1.0f32; 16], &[16], Device::Cpu).unwrap();
    assert_eq!(x.matmul_quant(&w).unwrap().shape(), [3]);
    let [d, s, m] = w.parts();
    // Scales of the wrong shape, data as f32, a k that is not a multiple of 8.
    let bad = [
        QuantWeight::new(
            d.clone(),
            m.reshape(&[3]).unwrap(),
            m.clone(),
            w.format(),
            3,
            16,
        ),
        QuantWeight::new(s.clone(), s.clone(), m.clone(), w.format(), 3, 16),
        QuantWeight::new(d.clone(), s.clone(), m.clone(), w.format(), 3, 12),
        QuantWeight::new(d.clone(), s.clone(), m.clone(), QuantFormat::Int8, 3, 16),
    ];
    for b in bad {
        assert!(b.is_err());
    }
    // An empty weight and an empty batch.
    let e = weight(&mut r, QuantFormat::Int8, 0, 8);
    let x = Tensor::from_vec(vec![1.0f32; 16], &[2, 8], Device::Cpu).unwrap();
    assert_eq!(x.matmul_quant(&e).unwrap().shape(), [2, 0]);
    let x = Tensor::from_vec(Vec::<f32>::new(), &[0, 16], Device::Cpu).unwrap();
    assert_eq!(x.matmul_quant(&w).unwrap().shape(), [0, 3]);
}
