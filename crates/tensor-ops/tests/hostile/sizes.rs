//! Sizes: shapes whose element count overflows `usize`, ranges that overflow, allocations no
//! device can hold, degenerate (empty) operands.

use super::devices;
use tensor_ops::{Device, GpuError, Tensor};

const BIG: usize = (1 << 63) + 1;

fn is_invalid_shape<T: std::fmt::Debug>(what: &str, r: tensor_ops::Result<T>) {
    match r {
        Err(GpuError::InvalidShape { .. }) => {}
        other => panic!("{what}: expected InvalidShape, got {other:?}"),
    }
}

/// Every size product is checked: a reshape of 2 elements to `[2^63 + 1, 2]` was accepted (the
/// product wraps to 2), and cat, expand, broadcasting, matmul and embedding multiplied or added
/// sizes unchecked (a debug build panicked on the overflow).
#[test]
fn size_products_that_overflow_are_typed_errors_on_every_device() {
    for dev in devices("size_products_that_overflow_are_typed_errors_on_every_device") {
        let two = Tensor::from_vec(vec![1.0f32, 2.0], &[2], dev).unwrap();
        is_invalid_shape("reshape", two.reshape(&[BIG, 2]));
        is_invalid_shape("reshape", two.reshape(&[usize::MAX, usize::MAX, 0, 2]));
        is_invalid_shape("zeros", Tensor::zeros(&[BIG, 2], dev));
        is_invalid_shape(
            "zeros around a 0",
            Tensor::zeros(&[1 << 40, 0, 1 << 40], dev),
        );
        is_invalid_shape(
            "from_vec",
            Tensor::from_vec(Vec::<f32>::new(), &[1 << 40, 1 << 40, 0], dev),
        );
        is_invalid_shape("expand", two.reshape(&[1, 2]).unwrap().expand(&[BIG, 2]));

        // Empty tensors with huge dims: their results' sizes overflow.
        let tall = Tensor::zeros(&[1 << 63, 0], dev).unwrap();
        is_invalid_shape("cat", Tensor::cat(&[&tall, &tall], 0));
        let a = Tensor::zeros(&[1 << 40, 1, 0], dev).unwrap();
        let b = Tensor::zeros(&[1, 1 << 40, 0], dev).unwrap();
        is_invalid_shape("add (broadcast)", a.add(&b));
        let a = Tensor::zeros(&[1 << 40, 0], dev).unwrap();
        let b = Tensor::zeros(&[0, 1 << 40], dev).unwrap();
        is_invalid_shape("matmul", a.matmul(&b));
        let table = Tensor::zeros(&[4, 8], dev).unwrap();
        let ids = Tensor::from_vec(Vec::<u32>::new(), &[1 << 62, 0], dev).unwrap();
        is_invalid_shape("embedding", table.embedding(&ids));
    }
}

/// `narrow`'s error message computed `start + len` and overflowed itself.
#[test]
fn narrow_out_of_range_is_a_typed_error_even_when_start_plus_len_overflows() {
    let x = Tensor::zeros(&[4, 3], Device::Cpu).unwrap();
    for (start, len) in [(usize::MAX, 2), (2, usize::MAX), (3, 2)] {
        match x.narrow(0, start, len) {
            Err(GpuError::InvalidArgument { reason, .. }) => {
                assert!(reason.contains("size 4"), "{reason}")
            }
            other => panic!("narrow({start}, {len}): expected InvalidArgument, got {other:?}"),
        }
    }
}
