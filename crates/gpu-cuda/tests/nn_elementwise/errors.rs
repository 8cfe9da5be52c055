//! Bad inputs give the same typed errors on every backend, before any launch.

use super::*;
use gpu_core::nn::BlockCopy;
use gpu_core::{DType, GpuError};

macro_rules! assert_err {
    ($dev:expr, $call:expr, $pat:pat) => {{
        let r = $call;
        assert!(
            matches!(r, Err($pat)),
            "{}: {} gave {:?}",
            $dev,
            stringify!($call),
            r.err()
        );
    }};
}

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
    assert_err!(
        dev,
        b.broadcast_binary(Add, &x6, &[2, 3], &x6, &[3, 2], &mut o6),
        GpuError::InvalidShape { .. }
    );
    assert_err!(
        dev,
        b.broadcast_binary(Add, &x6, &rank8, &x3, &[3], &mut o6),
        GpuError::InvalidShape { .. }
    );
    assert_err!(
        dev,
        b.broadcast_binary(Add, &x6, &[2, 3], &x6, &[3], &mut o6),
        GpuError::ShapeMismatch { .. }
    );
    assert_err!(
        dev,
        b.broadcast_binary(Add, &x6, &[2, 3], &x3, &[3], &mut o3),
        GpuError::ShapeMismatch { .. }
    );
    assert_err!(
        dev,
        b.broadcast_binary(Add, &u6, &[2, 3], &x3, &[3], &mut o6),
        GpuError::UnsupportedDType { .. }
    );
    assert_err!(
        dev,
        b.broadcast_binary(Add, &x6, &[2, 3], &x3, &[3], &mut ou),
        GpuError::UnsupportedDType { .. }
    );
    assert_err!(
        dev,
        b.broadcast_binary(Add, &x6, &[usize::MAX, 2], &x3, &[2], &mut o6),
        GpuError::InvalidShape { .. }
    );

    // activations and affine
    assert_err!(
        dev,
        b.activation_fwd(Gelu, &x6, &mut o3),
        GpuError::ShapeMismatch { .. }
    );
    assert_err!(
        dev,
        b.activation_fwd(Gelu, &u6, &mut o6),
        GpuError::UnsupportedDType { .. }
    );
    assert_err!(
        dev,
        b.activation_bwd(Silu, &x6, &x6, &x3, &mut o6),
        GpuError::ShapeMismatch { .. }
    );
    assert_err!(
        dev,
        b.activation_bwd(Silu, &x6, &u6, &x6, &mut o6),
        GpuError::UnsupportedDType { .. }
    );
    assert_err!(
        dev,
        b.affine(&x6, 2.0, 1.0, &mut o3),
        GpuError::ShapeMismatch { .. }
    );

    // reduce_axis and max_axis_bwd
    let empty = f(0);
    assert_err!(
        dev,
        b.reduce_axis(Mean, &empty, 2, 0, 3, &mut o6),
        GpuError::InvalidShape { .. }
    );
    assert_err!(
        dev,
        b.reduce_axis(Max, &empty, 2, 0, 3, &mut o6),
        GpuError::InvalidShape { .. }
    );
    assert_err!(
        dev,
        b.reduce_axis(Sum, &x6, 2, 2, 3, &mut o6),
        GpuError::ShapeMismatch { .. }
    );
    assert_err!(
        dev,
        b.reduce_axis(Sum, &x6, 2, 3, 1, &mut o3),
        GpuError::ShapeMismatch { .. }
    );
    assert_err!(
        dev,
        b.reduce_axis(Sum, &x6, usize::MAX, 2, 1, &mut o2),
        GpuError::InvalidShape { .. }
    );
    assert_err!(
        dev,
        b.reduce_axis(Sum, &u6, 2, 3, 1, &mut o2),
        GpuError::UnsupportedDType { .. }
    );
    assert_err!(
        dev,
        b.max_axis_bwd((&empty, &o6, &o6), [2, 0, 3], &mut f(0)),
        GpuError::InvalidShape { .. }
    );
    assert_err!(
        dev,
        b.max_axis_bwd((&x6, &x3, &o2), [3, 2, 1], &mut o6),
        GpuError::ShapeMismatch { .. }
    );
    assert_err!(
        dev,
        b.max_axis_bwd((&x6, &x3, &x3), [3, 2, 1], &mut o3),
        GpuError::ShapeMismatch { .. }
    );

    // copy_blocks
    assert_err!(
        dev,
        b.copy_blocks(
            &x6,
            &mut o6,
            BlockCopy {
                src_offset: 4,
                src_stride: 0,
                dst_offset: 0,
                dst_stride: 0,
                outer: 1,
                len: 3
            }
        ),
        GpuError::ShapeMismatch { .. }
    );
    assert_err!(
        dev,
        b.copy_blocks(
            &x6,
            &mut o3,
            BlockCopy {
                src_offset: 0,
                src_stride: 2,
                dst_offset: 0,
                dst_stride: 2,
                outer: 2,
                len: 2
            }
        ),
        GpuError::ShapeMismatch { .. }
    );
    assert_err!(
        dev,
        b.copy_blocks(
            &x6,
            &mut o6,
            BlockCopy {
                src_offset: 0,
                src_stride: 3,
                dst_offset: 0,
                dst_stride: 2,
                outer: 2,
                len: 3
            }
        ),
        GpuError::InvalidArgument { .. }
    );
    assert_err!(
        dev,
        b.copy_blocks(
            &x6,
            &mut o6,
            BlockCopy {
                src_offset: usize::MAX,
                src_stride: 0,
                dst_offset: 0,
                dst_stride: 0,
                outer: 1,
                len: 3
            }
        ),
        GpuError::ShapeMismatch { .. }
    );
    assert_err!(
        dev,
        b.copy_blocks(
            &x6,
            &mut o6,
            BlockCopy {
                src_offset: 0,
                src_stride: usize::MAX,
                dst_offset: 0,
                dst_stride: 3,
                outer: 2,
                len: 3
            }
        ),
        GpuError::ShapeMismatch { .. }
    );
    assert_err!(
        dev,
        b.copy_blocks(
            &u6,
            &mut o6,
            BlockCopy {
                src_offset: 0,
                src_stride: 0,
                dst_offset: 0,
                dst_stride: 0,
                outer: 1,
                len: 3
            }
        ),
        GpuError::UnsupportedDType { .. }
    );

    // permute
    assert_err!(
        dev,
        b.permute(&x6, &[2, 3], &[0, 0], &mut o6),
        GpuError::InvalidArgument { .. }
    );
    assert_err!(
        dev,
        b.permute(&x6, &[2, 3], &[0], &mut o6),
        GpuError::InvalidArgument { .. }
    );
    assert_err!(
        dev,
        b.permute(&x6, &[2, 3], &[1, 2], &mut o6),
        GpuError::InvalidArgument { .. }
    );
    assert_err!(
        dev,
        b.permute(&x6, &[1, 1, 1, 1, 1, 2, 3], &[0, 1, 2, 3, 4, 5, 6], &mut o6),
        GpuError::InvalidShape { .. }
    );
    assert_err!(
        dev,
        b.permute(&x6, &[2, 3], &[1, 0], &mut o3),
        GpuError::ShapeMismatch { .. }
    );
    assert_err!(
        dev,
        b.permute(&u6, &[2, 3], &[1, 0], &mut o6),
        GpuError::UnsupportedDType { .. }
    );

    // dropout
    for p in [1.0, -0.1, 2.0, f32::NAN, f32::INFINITY] {
        assert_err!(
            dev,
            b.dropout(&x6, p, 7, &mut o6),
            GpuError::InvalidArgument { .. }
        );
    }
    assert_err!(
        dev,
        b.dropout(&x6, 0.5, 7, &mut o3),
        GpuError::ShapeMismatch { .. }
    );
    assert_err!(
        dev,
        b.dropout(&u6, 0.5, 7, &mut o6),
        GpuError::UnsupportedDType { .. }
    );
}

#[test]
fn gpu_bad_inputs_are_typed_errors() {
    on_every_device!("gpu_bad_inputs_are_typed_errors", errors_body);
}
