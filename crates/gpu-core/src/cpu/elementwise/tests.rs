use super::*;
use crate::nn::elementwise::dropout_keep;
use crate::nn::BlockCopy;
use crate::{Backend, DType, GpuError};

fn run_binary(op: BinaryKind, a: &[f32], sa: &[usize], b: &[f32], sb: &[usize]) -> Vec<f32> {
    let cpu = CpuBackend;
    let n: usize = crate::nn::elementwise::broadcast_shape(sa, sb)
        .unwrap()
        .iter()
        .product();
    let mut out = cpu.allocate(DType::F32, n).unwrap();
    cpu.broadcast_binary(
        op,
        &cpu.upload(a).unwrap(),
        sa,
        &cpu.upload(b).unwrap(),
        sb,
        &mut out,
    )
    .unwrap();
    out.as_f32().unwrap().to_vec()
}

#[test]
fn normal_cdf_and_gelu_values() {
    // Reference values from mpmath at 30 digits.
    let cases = [
        (1.0, 0.841_344_746_068_542_9),
        (-3.0, 0.001_349_898_031_630_094_6),
        (-10.0, 7.619_853_024_160_527e-24),
        (2.5, 0.993_790_334_674_223_8),
    ];
    for (x, want) in cases {
        // Φ(x) = gelu(x)/x.
        let got = Activation::Gelu.eval(x) / x;
        assert!(
            ((got - want) / want).abs() < 1e-14,
            "Φ({x}) = {got}, want {want}"
        );
    }
    let g = Activation::Gelu.eval(1.0);
    assert!((g - 0.841_344_746_068_542_9).abs() < 1e-15);
}

/// Central differences in f64 (h = 1e-6) of every activation against its analytic derivative.
#[test]
fn activation_grads_match_f64_finite_differences() {
    let h = 1e-6;
    for &op in Activation::ALL {
        for k in 0..200 {
            let mut x = -6.0 + 12.0 * (k as f64 + 0.5) / 200.0;
            if op == Activation::Log {
                x = x.abs() + 0.05;
            }
            let fd = (op.eval(x + h) - op.eval(x - h)) / (2.0 * h);
            let g = op.backward(x, op.eval(x), 1.0);
            let tol = 1e-6 * g.abs().max(1.0);
            assert!((fd - g).abs() < tol, "{op:?} at {x}: fd {fd}, analytic {g}");
        }
    }
}

/// GELU and SiLU at ±inf: the limits (gelu, silu → 0 at −inf and +inf at +inf; their
/// derivatives → 0 and 1), not the NaN of `inf·0`. NaN stays NaN.
#[test]
fn gelu_and_silu_take_their_limits_at_infinity() {
    let (inf, ninf) = (f64::INFINITY, f64::NEG_INFINITY);
    for op in [Activation::Gelu, Activation::Silu] {
        assert_eq!(op.eval(ninf), 0.0, "{op:?}(-inf)");
        assert_eq!(op.eval(inf), inf, "{op:?}(inf)");
        assert_eq!(op.backward(ninf, 0.0, 1.0), 0.0, "{op:?}'(-inf)");
        assert_eq!(op.backward(inf, inf, 1.0), 1.0, "{op:?}'(inf)");
        assert!(op.eval(f64::NAN).is_nan());
        assert!(op.backward(f64::NAN, f64::NAN, 1.0).is_nan());
        // Continuous with the finite tails.
        assert_eq!(op.backward(1e300, 1e300, 1.0), 1.0, "{op:?}'(1e300)");
        assert_eq!(op.backward(-1e300, -0.0, 1.0), 0.0, "{op:?}'(-1e300)");
    }
    // Through the backend, in f32: dx = f'(x)·dy.
    let cpu = CpuBackend;
    let x = cpu.upload(&[f32::NEG_INFINITY, f32::INFINITY]).unwrap();
    let dy = cpu.upload(&[2.0f32, 3.0]).unwrap();
    for op in [Activation::Gelu, Activation::Silu] {
        let mut y = cpu.allocate(DType::F32, 2).unwrap();
        cpu.activation_fwd(op, &x, &mut y).unwrap();
        assert_eq!(y.as_f32().unwrap(), &[0.0, f32::INFINITY], "{op:?}");
        let mut dx = cpu.allocate(DType::F32, 2).unwrap();
        cpu.activation_bwd(op, &x, &y, &dy, &mut dx).unwrap();
        assert_eq!(dx.as_f32().unwrap(), &[0.0, 3.0], "{op:?}");
    }
}

#[test]
fn special_values() {
    assert_eq!(Activation::Log.eval(0.0), f64::NEG_INFINITY);
    assert!(Activation::Log.eval(-1.0).is_nan());
    assert!(Activation::Relu.eval(f64::NAN).is_nan());
    assert_eq!(Activation::Relu.eval(-2.0), 0.0);
    assert_eq!(Activation::Gelu.eval(-40.0), -0.0);
    assert_eq!(Activation::Sigmoid.eval(800.0), 1.0);
}

#[test]
fn broadcasting_examples() {
    let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    assert_eq!(
        run_binary(BinaryKind::Add, &a, &[2, 3], &[10.0, 20.0, 30.0], &[3]),
        [11.0, 22.0, 33.0, 14.0, 25.0, 36.0]
    );
    assert_eq!(
        run_binary(
            BinaryKind::Sub,
            &[1.0, 2.0],
            &[2, 1],
            &[1.0, 2.0, 3.0],
            &[1, 3]
        ),
        [0.0, -1.0, -2.0, 1.0, 0.0, -1.0]
    );
    assert_eq!(
        run_binary(BinaryKind::Mul, &a, &[2, 3], &[2.0], &[]),
        [2.0, 4.0, 6.0, 8.0, 10.0, 12.0]
    );
    let d = run_binary(BinaryKind::Div, &[1.0, -1.0, 0.0], &[3], &[0.0], &[1]);
    assert_eq!(d[..2], [f32::INFINITY, f32::NEG_INFINITY]);
    assert!(d[2].is_nan());
    // A zero-size broadcast writes nothing and succeeds.
    assert!(run_binary(BinaryKind::Add, &[], &[0, 3], &[1.0, 2.0, 3.0], &[3]).is_empty());
}

#[test]
fn reductions_and_max_backward() {
    let cpu = CpuBackend;
    // x is [1, 3, 2]: columns (1, 5, 5) and (4, -2, NaN).
    let x = cpu
        .upload(&[1.0f32, 4.0, 5.0, -2.0, 5.0, f32::NAN])
        .unwrap();
    let mut out = cpu.allocate(DType::F32, 2).unwrap();
    cpu.reduce_axis(ReduceKind::Sum, &x, 1, 3, 2, &mut out)
        .unwrap();
    assert_eq!(out.as_f32().unwrap()[0], 11.0);
    assert!(out.as_f32().unwrap()[1].is_nan());
    cpu.reduce_axis(ReduceKind::Max, &x, 1, 3, 2, &mut out)
        .unwrap();
    let y = out.clone();
    assert_eq!(y.as_f32().unwrap()[0], 5.0);
    assert!(y.as_f32().unwrap()[1].is_nan());
    let dy = cpu.upload(&[10.0f32, 20.0]).unwrap();
    let mut dx = cpu.allocate(DType::F32, 6).unwrap();
    cpu.max_axis_bwd((&x, &y, &dy), [1, 3, 2], &mut dx).unwrap();
    // The first of the tied maxima (row 1) and the NaN (row 2) get the gradient.
    assert_eq!(dx.as_f32().unwrap(), &[0.0, 0.0, 10.0, 0.0, 0.0, 20.0]);

    let empty = cpu.allocate(DType::F32, 0).unwrap();
    let mut out = cpu.upload(&[7.0f32; 4]).unwrap();
    cpu.reduce_axis(ReduceKind::Sum, &empty, 2, 0, 2, &mut out)
        .unwrap();
    assert_eq!(out.as_f32().unwrap(), &[0.0; 4]);
    for op in [ReduceKind::Mean, ReduceKind::Max] {
        assert!(matches!(
            cpu.reduce_axis(op, &empty, 2, 0, 2, &mut out),
            Err(GpuError::InvalidShape { .. })
        ));
    }
    let x = cpu.upload(&[1.0f32, 2.0, 3.0, 4.0]).unwrap();
    let mut out = cpu.allocate(DType::F32, 2).unwrap();
    cpu.reduce_axis(ReduceKind::Mean, &x, 2, 2, 1, &mut out)
        .unwrap();
    assert_eq!(out.as_f32().unwrap(), &[1.5, 3.5]);
}

#[test]
fn data_movement() {
    let cpu = CpuBackend;
    let x = cpu.upload(&[0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
    let mut out = cpu.allocate(DType::F32, 6).unwrap();
    cpu.permute(&x, &[2, 3], &[1, 0], &mut out).unwrap();
    assert_eq!(out.as_f32().unwrap(), &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);

    let mut dst = cpu.upload(&[9.0f32; 8]).unwrap();
    cpu.copy_blocks(
        &x,
        &mut dst,
        BlockCopy {
            src_offset: 1,
            src_stride: 3,
            dst_offset: 0,
            dst_stride: 4,
            outer: 2,
            len: 2,
        },
    )
    .unwrap();
    assert_eq!(
        dst.as_f32().unwrap(),
        &[1.0, 2.0, 9.0, 9.0, 4.0, 5.0, 9.0, 9.0]
    );
    assert!(matches!(
        cpu.copy_blocks(
            &x,
            &mut dst,
            BlockCopy {
                src_offset: 0,
                src_stride: 3,
                dst_offset: 0,
                dst_stride: 1,
                outer: 2,
                len: 2
            }
        ),
        Err(GpuError::InvalidArgument { .. })
    ));
    assert!(matches!(
        cpu.copy_blocks(
            &x,
            &mut dst,
            BlockCopy {
                src_offset: 4,
                src_stride: 3,
                dst_offset: 0,
                dst_stride: 4,
                outer: 2,
                len: 2
            }
        ),
        Err(GpuError::ShapeMismatch { .. })
    ));
}

#[test]
fn dropout_follows_the_shared_hash() {
    let cpu = CpuBackend;
    let xs: Vec<f32> = (0..1000).map(|i| i as f32 + 1.0).collect();
    let mut out = cpu.allocate(DType::F32, xs.len()).unwrap();
    cpu.dropout(&cpu.upload(&xs).unwrap(), 0.25, 99, &mut out)
        .unwrap();
    for (i, (&o, &x)) in out.as_f32().unwrap().iter().zip(&xs).enumerate() {
        let want = if dropout_keep(99, i as u64, 0.25) {
            x * (1.0f32 / 0.75)
        } else {
            0.0
        };
        assert_eq!(o, want, "{i}");
    }
    let x = cpu.upload(&xs).unwrap();
    for p in [1.0, -0.1, f32::NAN] {
        assert!(matches!(
            cpu.dropout(&x, p, 1, &mut out),
            Err(GpuError::InvalidArgument { .. })
        ));
    }
}

/// A reduction over an empty axis of huge outer and inner sizes: the output size `outer·inner`
/// overflowed unchecked (the input size `outer·0·inner` is 0).
#[test]
fn reduce_over_an_empty_axis_with_overflowing_output_is_a_typed_error() {
    let cpu = CpuBackend;
    let x = cpu.allocate(DType::F32, 0).unwrap();
    let mut out = cpu.allocate(DType::F32, 0).unwrap();
    let r = cpu.reduce_axis(ReduceKind::Sum, &x, 1 << 40, 0, 1 << 40, &mut out);
    assert!(matches!(r, Err(GpuError::InvalidShape { .. })), "{r:?}");
}

/// Max over −0 and +0 is +0 in either order (the rule that makes device results order-free);
/// NaN still wins from either side.
#[test]
fn max_prefers_positive_zero_in_any_order() {
    for v in [[-0.0f32, 0.0], [0.0, -0.0]] {
        let got = reduce_max(&v);
        assert!(got == 0.0 && got.is_sign_positive(), "{v:?}: {got}");
    }
    assert_eq!(reduce_max(&[-0.0, -0.0]).to_bits(), (-0.0f32).to_bits());
    assert!(reduce_max(&[f32::NAN, 0.0]).is_nan() && reduce_max(&[0.0, f32::NAN]).is_nan());
}

fn reduce_max(v: &[f32]) -> f32 {
    let cpu = CpuBackend;
    let x = cpu.upload(v).unwrap();
    let mut out = cpu.allocate(DType::F32, 1).unwrap();
    cpu.reduce_axis(ReduceKind::Max, &x, 1, v.len(), 1, &mut out)
        .unwrap();
    cpu.download::<f32>(&out).unwrap()[0]
}
