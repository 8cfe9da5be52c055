//! Sizes: shapes whose element count overflows `usize`, ranges that overflow, allocations no
//! device can hold, degenerate (empty) operands.

use super::devices;
use tensor_ops::{Device, GpuError, Tensor};

const BIG: usize = (1 << 63) + 1;

expect_error!(is_invalid_shape, InvalidShape);

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

/// Products with an empty inner dim (`[3, 0]·[0, 4]` = zeros) or empty outer dims, forward and
/// backward. The 2-D backward with k = 0 failed with `ShapeMismatch`: it folded `a` to
/// `[numel / k.max(1), k]` = `[0, 0]` instead of `[3, 0]`.
#[test]
fn matmul_with_empty_inner_or_outer_dims_forward_and_backward_on_every_device() {
    /// `a`, `b`, whether each is transposed, the output shape.
    type Case<'a> = (&'a [usize], &'a [usize], bool, bool, &'a [usize]);
    let cases: &[Case] = &[
        (&[3, 0], &[0, 4], false, false, &[3, 4]),
        (&[3, 0], &[4, 0], false, true, &[3, 4]),
        (&[0, 3], &[0, 4], true, false, &[3, 4]),
        (&[2, 3, 0], &[0, 4], false, false, &[2, 3, 4]),
        (&[2, 3, 0], &[2, 0, 4], false, false, &[2, 3, 4]),
        (&[0, 5], &[5, 4], false, false, &[0, 4]),
        (&[3, 5], &[5, 0], false, false, &[3, 0]),
        (&[0, 3, 5], &[5, 4], false, false, &[0, 3, 4]),
        (&[0, 3, 5], &[0, 5, 4], false, false, &[0, 3, 4]),
    ];
    for dev in devices("matmul_with_empty_inner_or_outer_dims_forward_and_backward_on_every_device")
    {
        for &(sa, sb, ta, tb, so) in cases {
            let t = |f: bool| if f { "ᵀ" } else { "" };
            let what = format!("{dev}: {sa:?}{} · {sb:?}{}", t(ta), t(tb));
            let leaf = |s: &[usize], v: f32| {
                let n = s.iter().product();
                Tensor::from_vec(vec![v; n], s, dev)
                    .unwrap()
                    .requires_grad_()
                    .unwrap()
            };
            let (a, b) = (leaf(sa, 1.5), leaf(sb, -2.0));
            let out = a.matmul_t(&b, ta, tb).unwrap();
            assert_eq!(out.shape(), so, "{what}");
            assert!(out.to_vec().unwrap().iter().all(|&v| v == 0.0), "{what}");
            let grads = out.sum_all().unwrap().backward().unwrap_or_else(|e| {
                panic!("{what}: backward failed: {e}");
            });
            // Every gradient is a sum over an empty dim or of an empty output: all zeros.
            for t in [&a, &b] {
                let g = grads.get(t).expect("a gradient");
                assert_eq!(g.shape(), t.shape(), "{what}");
                assert!(g.to_vec().unwrap().iter().all(|&v| v == 0.0), "{what}");
            }
        }
    }
}

expect_error!(is_out_of_memory, OutOfMemory);

/// `Tensor::zeros(&[(1 << 61) + 1])` panicked in the CUDA pool ("attempt to divide by zero"
/// while rounding 2^63 + 4 bytes): a typed out-of-memory error on every device.
#[test]
fn allocations_past_the_address_space_are_out_of_memory_on_every_device() {
    for dev in devices("allocations_past_the_address_space_are_out_of_memory_on_every_device") {
        is_out_of_memory("zeros 2^61 + 1", Tensor::zeros(&[(1 << 61) + 1], dev));
        is_out_of_memory("zeros 2^62", Tensor::zeros(&[1 << 62], dev));
        is_out_of_memory("ones 2^63", Tensor::ones(&[1 << 31, 1 << 32], dev));
    }
}

/// A request that fits the address space but not the device (4 TiB): on the CPU it aborted the
/// process ("memory allocation of N bytes failed"); now OutOfMemory as on CUDA.
#[test]
fn allocations_the_device_cannot_hold_are_out_of_memory_on_every_device() {
    for dev in devices("allocations_the_device_cannot_hold_are_out_of_memory_on_every_device") {
        is_out_of_memory("zeros 4 TiB", Tensor::zeros(&[1 << 40], dev));
        is_out_of_memory(
            "randn 4 TiB",
            Tensor::randn(&[1 << 20, 1 << 20], 1.0, 0, dev),
        );
        // The device still works afterwards.
        let x = Tensor::ones(&[3], dev).unwrap();
        assert_eq!(x.to_vec().unwrap(), vec![1.0; 3]);
    }
}
