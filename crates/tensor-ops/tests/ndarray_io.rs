//! `Tensor::from_ndarray` / `to_ndarray`: exact round trips at every rank (0 and empty dims
//! included), arrays of any layout read in logical order, typed errors for non-f32 tensors and
//! overflowing shapes, and the same on every device of `gpu_cuda::testing::devices`.

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestRunner};
use tensor_ops::ndarray::{arr0, Array, ArrayD, IxDyn, ShapeBuilder};
use tensor_ops::{DType, Device, GpuError, Tensor};

fn values(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32 * 0.5 - 3.25).collect()
}

#[test]
fn round_trips_every_rank_exactly_on_every_device() {
    let shapes: [&[usize]; 7] = [
        &[],
        &[5],
        &[3, 4],
        &[2, 3, 4],
        &[2, 1, 3, 2],
        &[0, 3],
        &[2, 0],
    ];
    for dev in gpu_cuda::testing::devices("round_trips_every_rank_exactly_on_every_device") {
        for shape in shapes {
            let n: usize = shape.iter().product();
            let a = ArrayD::from_shape_vec(IxDyn(shape), values(n)).unwrap();
            let t = Tensor::from_ndarray(&a, dev).unwrap();
            assert_eq!(t.shape(), shape, "{dev} {shape:?}");
            assert_eq!(t.device(), dev);
            assert_eq!(t.to_vec().unwrap(), values(n), "{dev} {shape:?}: elements");
            assert_eq!(t.to_ndarray().unwrap(), a, "{dev} {shape:?}: round trip");
        }
    }
}

#[test]
fn a_scalar_array_is_a_rank_0_tensor() {
    let t = Tensor::from_ndarray(&arr0(2.5f32), Device::Cpu).unwrap();
    assert_eq!(t.shape(), &[] as &[usize]);
    assert_eq!(t.item().unwrap(), 2.5);
    assert_eq!(t.to_ndarray().unwrap().ndim(), 0);
}

#[test]
fn non_standard_layouts_are_read_in_logical_order() {
    // A column-major array and a transposed view: the tensor holds the logical row-major order.
    let f = Array::from_shape_vec((2, 3).f(), values(6)).unwrap();
    let t = Tensor::from_ndarray(&f, Device::Cpu).unwrap();
    let want: Vec<f32> = f.iter().copied().collect();
    assert_eq!(t.to_vec().unwrap(), want);
    assert_eq!(t.to_ndarray().unwrap(), f.into_dyn());

    let c = Array::from_shape_vec((3, 4), values(12)).unwrap();
    let view = c.t();
    let t = Tensor::from_ndarray(&view, Device::Cpu).unwrap();
    assert_eq!(t.shape(), &[4, 3]);
    assert_eq!(t.to_ndarray().unwrap(), view.into_dyn());
    // A strided slice (every other column).
    let s = c.slice(tensor_ops::ndarray::s![.., ..;2]);
    let t = Tensor::from_ndarray(&s, Device::Cpu).unwrap();
    assert_eq!(t.to_ndarray().unwrap(), s.into_dyn());
}

#[test]
fn a_tensor_that_is_not_f32_is_a_typed_error() {
    let ids = Tensor::from_vec(vec![1u32, 2, 3], &[3], Device::Cpu).unwrap();
    match ids.to_ndarray() {
        Err(GpuError::DTypeMismatch { op, expected, got }) => {
            assert_eq!((op, expected, got), ("to_ndarray", DType::F32, DType::U32));
        }
        other => panic!("expected a dtype mismatch, got {other:?}"),
    }
}

#[test]
fn non_finite_values_are_kept_not_checked() {
    // A conversion copies; whether NaN is acceptable is the consumer's call.
    let a = Array::from_vec(vec![f32::NAN, f32::INFINITY, -0.0]);
    let back = Tensor::from_ndarray(&a, Device::Cpu)
        .unwrap()
        .to_vec()
        .unwrap();
    assert!(
        back[0].is_nan() && back[1] == f32::INFINITY && back[2].to_bits() == (-0.0f32).to_bits()
    );
}

/// Random shapes (rank 0 to 4, dims 0 to 3) and random bit patterns (NaNs replaced): the round
/// trip is bit for bit. The runner's seed is printed (`HYBRID_TEST_SEED` replays it).
#[test]
fn any_array_round_trips_bit_for_bit() {
    let test = "any_array_round_trips_bit_for_bit";
    let mut runner = TestRunner::new(Config {
        cases: 64,
        rng_seed: RngSeed::Fixed(gpu_cuda::testing::test_seed(test)),
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (proptest::collection::vec(0usize..4, 0..5), any::<u32>());
    runner
        .run(&strategy, |(dims, salt)| {
            let n: usize = dims.iter().product();
            let data: Vec<f32> = (0..n as u32)
                .map(|i| f32::from_bits(i.wrapping_mul(2_654_435_761) ^ salt))
                .map(|v| if v.is_nan() { 1.0 } else { v })
                .collect();
            let a = ArrayD::from_shape_vec(IxDyn(&dims), data).unwrap();
            let back = Tensor::from_ndarray(&a, Device::Cpu)
                .unwrap()
                .to_ndarray()
                .unwrap();
            prop_assert_eq!(back.shape(), a.shape());
            prop_assert!(back.iter().zip(&a).all(|(x, y)| x.to_bits() == y.to_bits()));
            Ok(())
        })
        .unwrap();
}
