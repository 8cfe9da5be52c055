//! Bad inputs give the same typed errors on every backend, before any launch.

use super::*;
use gpu_core::nn::BlockCopy;
use gpu_core::DType;

// One case a line: rustfmt would spread each over five.
#[rustfmt::skip]
fn errors_body<B: Dev>(b: &B, dev: &str, _rng: &mut StdRng) {
    use Activation::{Gelu, Silu};
    use BinaryKind::Add;
    use ReduceKind::{Max, Mean, Sum};
    let f = |n| b.allocate(DType::F32, n).unwrap();
    let (x6, x3, u6) = (f(6), f(3), b.allocate(DType::U32, 6).unwrap());
    let (mut o6, mut o3, mut o2) = (f(6), f(3), f(2));
    let mut ou = b.allocate(DType::U32, 6).unwrap();

    // broadcast_binary
    let rank8 = [1, 1, 1, 1, 1, 1, 2, 3];
    assert_err!(dev, InvalidShape, b.broadcast_binary(Add, &x6, &[2, 3], &x6, &[3, 2], &mut o6));
    assert_err!(dev, InvalidShape, b.broadcast_binary(Add, &x6, &rank8, &x3, &[3], &mut o6));
    assert_err!(dev, ShapeMismatch, b.broadcast_binary(Add, &x6, &[2, 3], &x6, &[3], &mut o6));
    assert_err!(dev, ShapeMismatch, b.broadcast_binary(Add, &x6, &[2, 3], &x3, &[3], &mut o3));
    assert_err!(dev, UnsupportedDType, b.broadcast_binary(Add, &u6, &[2, 3], &x3, &[3], &mut o6));
    assert_err!(dev, UnsupportedDType, b.broadcast_binary(Add, &x6, &[2, 3], &x3, &[3], &mut ou));
    assert_err!(dev, InvalidShape, b.broadcast_binary(Add, &x6, &[usize::MAX, 2], &x3, &[2], &mut o6));

    // activations and affine
    assert_err!(dev, ShapeMismatch, b.activation_fwd(Gelu, &x6, &mut o3));
    assert_err!(dev, UnsupportedDType, b.activation_fwd(Gelu, &u6, &mut o6));
    assert_err!(dev, ShapeMismatch, b.activation_bwd(Silu, &x6, &x6, &x3, &mut o6));
    assert_err!(dev, UnsupportedDType, b.activation_bwd(Silu, &x6, &u6, &x6, &mut o6));
    assert_err!(dev, ShapeMismatch, b.affine(&x6, 2.0, 1.0, &mut o3));

    // reduce_axis and max_axis_bwd
    let empty = f(0);
    assert_err!(dev, InvalidShape, b.reduce_axis(Mean, &empty, 2, 0, 3, &mut o6));
    assert_err!(dev, InvalidShape, b.reduce_axis(Max, &empty, 2, 0, 3, &mut o6));
    assert_err!(dev, ShapeMismatch, b.reduce_axis(Sum, &x6, 2, 2, 3, &mut o6));
    assert_err!(dev, ShapeMismatch, b.reduce_axis(Sum, &x6, 2, 3, 1, &mut o3));
    assert_err!(dev, InvalidShape, b.reduce_axis(Sum, &x6, usize::MAX, 2, 1, &mut o2));
    assert_err!(dev, UnsupportedDType, b.reduce_axis(Sum, &u6, 2, 3, 1, &mut o2));
    assert_err!(dev, InvalidShape, b.max_axis_bwd((&empty, &o6, &o6), [2, 0, 3], &mut f(0)));
    assert_err!(dev, ShapeMismatch, b.max_axis_bwd((&x6, &x3, &o2), [3, 2, 1], &mut o6));
    assert_err!(dev, ShapeMismatch, b.max_axis_bwd((&x6, &x3, &x3), [3, 2, 1], &mut o3));

    // copy_blocks
    let blocks = |src_offset, src_stride, dst_offset, dst_stride, outer, len| BlockCopy {
        src_offset, src_stride, dst_offset, dst_stride, outer, len,
    };
    assert_err!(dev, ShapeMismatch, b.copy_blocks(&x6, &mut o6, blocks(4, 0, 0, 0, 1, 3)));
    assert_err!(dev, ShapeMismatch, b.copy_blocks(&x6, &mut o3, blocks(0, 2, 0, 2, 2, 2)));
    assert_err!(dev, InvalidArgument, b.copy_blocks(&x6, &mut o6, blocks(0, 3, 0, 2, 2, 3)));
    assert_err!(dev, ShapeMismatch, b.copy_blocks(&x6, &mut o6, blocks(usize::MAX, 0, 0, 0, 1, 3)));
    assert_err!(dev, ShapeMismatch, b.copy_blocks(&x6, &mut o6, blocks(0, usize::MAX, 0, 3, 2, 3)));
    assert_err!(dev, UnsupportedDType, b.copy_blocks(&u6, &mut o6, blocks(0, 0, 0, 0, 1, 3)));

    // permute
    assert_err!(dev, InvalidArgument, b.permute(&x6, &[2, 3], &[0, 0], &mut o6));
    assert_err!(dev, InvalidArgument, b.permute(&x6, &[2, 3], &[0], &mut o6));
    assert_err!(dev, InvalidArgument, b.permute(&x6, &[2, 3], &[1, 2], &mut o6));
    assert_err!(dev, InvalidShape, b.permute(&x6, &[1, 1, 1, 1, 1, 2, 3], &[0, 1, 2, 3, 4, 5, 6], &mut o6));
    assert_err!(dev, ShapeMismatch, b.permute(&x6, &[2, 3], &[1, 0], &mut o3));
    assert_err!(dev, UnsupportedDType, b.permute(&u6, &[2, 3], &[1, 0], &mut o6));

    // dropout
    for p in [1.0, -0.1, 2.0, f32::NAN, f32::INFINITY] {
        assert_err!(dev, InvalidArgument, b.dropout(&x6, p, 7, &mut o6));
    }
    assert_err!(dev, ShapeMismatch, b.dropout(&x6, 0.5, 7, &mut o3));
    assert_err!(dev, UnsupportedDType, b.dropout(&u6, 0.5, 7, &mut o6));
}

every_device_test!(gpu_bad_inputs_are_typed_errors, errors_body);
