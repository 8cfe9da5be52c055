//! Parity of the wgpu primitives against the CPU reference (gpu-core's CPU backend where it has
//! the op, else an f64 host reference), on fresh random inputs (the seed is printed; replay with
//! `HYBRID_TEST_SEED`) and hostile ones. Without an adapter each test prints `SKIP` and returns
//! (fails with `HYBRID_REQUIRE_WGPU=1`).

mod common;

use common::{backend_and_rng, close, flushed, randn, rng, HOSTILE, SIZES, U};
use gpu_core::nn::Activation;
use gpu_core::nn::Primitives;
use gpu_core::{Backend, CpuBackend, DType, Device, GpuError};
use gpu_wgpu::testing::backend_or_skip;
use gpu_wgpu::{BinaryOp, RowReduce, UnaryOp, WgpuBackend};
use half::bf16;
use rand::Rng;

#[test]
fn adapter_is_reported_and_device_parses() {
    let Some(b) = backend_or_skip("adapter_is_reported_and_device_parses") else {
        return;
    };
    let info = b.info();
    eprintln!(
        "adapter: {} | {:?} | driver {} {} | type {:?}",
        info.adapter.name,
        info.adapter.backend,
        info.adapter.driver,
        info.adapter.driver_info,
        info.adapter.device_type
    );
    assert_eq!(b.device(), Device::Wgpu(0));
    assert!(b.memory_available().unwrap() > 0);
    gpu_wgpu::register_device_probe();
    Device::Wgpu(0).check_present().unwrap();
    let n = gpu_wgpu::adapters().unwrap().len();
    assert!(matches!(
        Device::Wgpu(n).check_present(),
        Err(GpuError::WgpuUnavailable(_))
    ));
    assert!(matches!(
        WgpuBackend::new(n),
        Err(GpuError::WgpuUnavailable(_))
    ));
}

#[test]
fn round_trip_every_dtype_and_pool_reuse() {
    let Some(b) = backend_or_skip("round_trip_every_dtype_and_pool_reuse") else {
        return;
    };
    let mut r = rng("round_trip");
    for n in SIZES {
        let f: Vec<f32> = randn(&mut r, n, 100.0);
        assert_eq!(b.download::<f32>(&b.upload(&f).unwrap()).unwrap(), f);
        let u: Vec<u32> = (0..n).map(|_| r.random()).collect();
        assert_eq!(b.download::<u32>(&b.upload(&u).unwrap()).unwrap(), u);
        let h: Vec<bf16> = f.iter().map(|&x| bf16::from_f32(x)).collect();
        assert_eq!(b.download::<bf16>(&b.upload(&h).unwrap()).unwrap(), h);
        let g: Vec<half::f16> = f.iter().map(|&x| half::f16::from_f32(x)).collect();
        let back = b.download::<half::f16>(&b.upload(&g).unwrap()).unwrap();
        assert!(back.iter().zip(&g).all(|(x, y)| x.to_bits() == y.to_bits()));
    }
    // Dtype and length are checked.
    let buf = b.upload(&[1.0f32, 2.0]).unwrap();
    assert!(matches!(
        b.download::<u32>(&buf),
        Err(GpuError::DTypeMismatch { .. })
    ));
    let mut three = [0f32; 3];
    assert!(b.copy_from_device(&buf, &mut three).is_err());
    // A freed buffer goes to the pool and the next allocation of its class takes it back.
    let own = WgpuBackend::new(0).unwrap();
    let x = own.allocate(DType::F32, 1000).unwrap();
    drop(x);
    let pooled = own.pooled_bytes();
    assert_eq!(pooled, 4096);
    let _y = own.allocate(DType::F32, 900).unwrap();
    assert_eq!(own.pooled_bytes(), 0);
    // Beyond the largest binding: Unsupported, not a panic or a wgpu validation error.
    let too_big = own.max_binding_bytes() as usize / 4 + 1;
    assert!(matches!(
        own.allocate(DType::F32, too_big),
        Err(GpuError::Unsupported { .. })
    ));
    // A buffer of another device is refused.
    let mut out = own.allocate(DType::F32, 2).unwrap();
    assert!(matches!(
        b.unary(UnaryOp::Neg, &buf, &mut out),
        Err(GpuError::ForeignBuffer { .. })
    ));
    b.synchronize().unwrap();
}

#[test]
fn fill_every_dtype() {
    let Some(b) = backend_or_skip("fill_every_dtype") else {
        return;
    };
    for n in SIZES {
        for v in [1.5f32, -0.0, f32::NAN, f32::INFINITY, 3.0e38] {
            let mut x = b.allocate(DType::F32, n).unwrap();
            b.fill(&mut x, v).unwrap();
            let got: Vec<f32> = b.download(&x).unwrap();
            assert!(got.iter().all(|g| g.to_bits() == v.to_bits()), "f32 {v}");
            let mut h = b.allocate(DType::BF16, n).unwrap();
            b.fill(&mut h, v).unwrap();
            let got: Vec<bf16> = b.download(&h).unwrap();
            assert!(got
                .iter()
                .all(|g| g.to_bits() == bf16::from_f32(v).to_bits()));
        }
        let mut u = b.allocate(DType::U32, n).unwrap();
        b.fill(&mut u, 7.0).unwrap();
        assert!(b.download::<u32>(&u).unwrap().iter().all(|&g| g == 7));
        // Same as the CPU backend's fill.
        let mut c = CpuBackend.allocate(DType::U32, n).unwrap();
        CpuBackend.fill(&mut c, 7.0).unwrap();
        assert_eq!(
            CpuBackend.download::<u32>(&c).unwrap(),
            b.download::<u32>(&u).unwrap()
        );
    }
}

#[test]
fn cast_f32_bf16_bitwise() {
    let Some((b, mut r)) = backend_and_rng("cast_f32_bf16_bitwise") else {
        return;
    };
    for n in SIZES {
        let mut x: Vec<f32> = (0..n).map(|_| f32::from_bits(r.random())).collect();
        for (i, h) in HOSTILE.iter().enumerate().take(n) {
            x[i] = *h;
        }
        // Ties: exactly half-way values, both rounding directions.
        for (i, t) in [0x3f80_8000u32, 0x3f81_8000, 0x7f7f_ffff, 0xffc0_0001]
            .iter()
            .enumerate()
        {
            if i + HOSTILE.len() < n {
                x[i + HOSTILE.len()] = f32::from_bits(*t);
            }
        }
        let xd = b.upload(&x).unwrap();
        let mut hd = b.allocate(DType::BF16, n).unwrap();
        b.cast(&xd, &mut hd).unwrap();
        let got: Vec<bf16> = b.download(&hd).unwrap();
        // The CPU backend's cast is the reference (half's round to nearest even).
        let xc = CpuBackend.upload(&x).unwrap();
        let mut hc = CpuBackend.allocate(DType::BF16, n).unwrap();
        CpuBackend.cast(&xc, &mut hc).unwrap();
        let want: Vec<bf16> = CpuBackend.download(&hc).unwrap();
        for i in 0..n {
            assert_eq!(
                got[i].to_bits(),
                want[i].to_bits(),
                "f32->bf16 of {:#x}",
                x[i].to_bits()
            );
        }
        let mut back = b.allocate(DType::F32, n).unwrap();
        b.cast(&hd, &mut back).unwrap();
        let back: Vec<f32> = b.download(&back).unwrap();
        for i in 0..n {
            assert_eq!(back[i].to_bits(), want[i].to_f32().to_bits());
        }
    }
}

/// f64 reference of each unary op (gpu-core's `Activation::eval` where it has the op).
fn unary_ref(op: UnaryOp, x: f64) -> f64 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Exp => Activation::Exp.eval(x),
        UnaryOp::Log => Activation::Log.eval(x),
        UnaryOp::Tanh => Activation::Tanh.eval(x),
        UnaryOp::Relu => Activation::Relu.eval(x),
        UnaryOp::GeluTanh if x == f64::NEG_INFINITY => 0.0,
        UnaryOp::GeluTanh => {
            0.5 * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
        }
        UnaryOp::Silu => Activation::Silu.eval(x),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
    }
}

#[test]
fn unary_parity() {
    let Some((b, mut r)) = backend_and_rng("unary_parity") else {
        return;
    };
    for op in UnaryOp::ALL {
        for n in SIZES {
            let mut x = randn(&mut r, n, 8.0);
            if matches!(op, UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt) {
                x.iter_mut().for_each(|v| *v = v.abs() + 1e-3);
            }
            for (i, h) in HOSTILE.iter().enumerate().take(n) {
                x[i] = *h;
            }
            let xd = b.upload(&x).unwrap();
            let mut out = b.allocate(DType::F32, n).unwrap();
            b.fill(&mut out, f32::NAN).unwrap();
            b.unary(op, &xd, &mut out).unwrap();
            let got: Vec<f32> = b.download(&out).unwrap();
            for i in 0..n {
                let want = unary_ref(op, x[i] as f64);
                // Bound: exact for neg/relu; else 2^-17 relative plus 2^-20 absolute (Vulkan's
                // exp/log are 3 ulp + 2|x| ulp; the tanh form loses a few ulp near 1).
                let tol = match op {
                    UnaryOp::Neg | UnaryOp::Relu => 0.0,
                    _ => want.abs() * 128.0 * U + 16.0 * U,
                };
                // Values past f32's range (exp of large x) must be +inf.
                let want = if want.abs() > f32::MAX as f64 {
                    want.signum() * f64::INFINITY
                } else {
                    want
                };
                // WGSL leaves subnormal values to the device (flushing is allowed; lavapipe's
                // log(1e-40) is -88.02, ln 2^-127; NVIDIA's -1e-40 is -0).
                assert!(
                    close(got[i], want, tol) || flushed(&[x[i]], got[i], want as f32),
                    "{op:?}({}) = {} want {want} (tol {tol})",
                    x[i],
                    got[i]
                );
            }
        }
    }
    // Pipelines are compiled once: a second round compiles nothing. On a backend of its own:
    // the shared one compiles other tests' pipelines meanwhile (this raced on the H100).
    let own = gpu_wgpu::WgpuBackend::new(0).unwrap();
    let x = own.upload(&[1.0f32, 2.0]).unwrap();
    let mut o = own.allocate(DType::F32, 2).unwrap();
    let mut counts = Vec::new();
    for _ in 0..2 {
        for op in UnaryOp::ALL {
            own.unary(op, &x, &mut o).unwrap();
        }
        counts.push(own.pipeline_count());
    }
    assert!(
        counts[0] > 0,
        "the first round compiles the unary pipelines"
    );
    assert_eq!(counts[1], counts[0], "the second round compiles nothing");
}

fn binary_ref(op: BinaryOp, x: f32, y: f32) -> f64 {
    let (x, y) = (x as f64, y as f64);
    match op {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
        BinaryOp::Max if x.is_nan() || y.is_nan() => f64::NAN,
        BinaryOp::Min if x.is_nan() || y.is_nan() => f64::NAN,
        BinaryOp::Max => x.max(y),
        BinaryOp::Min => x.min(y),
    }
}

#[test]
fn binary_parity_equal_and_last_axis_broadcast() {
    let Some(b) = backend_or_skip("binary_parity_equal_and_last_axis_broadcast") else {
        return;
    };
    let mut r = rng("binary_parity");
    for op in BinaryOp::ALL {
        for (rows, cols) in [(0, 3), (1, 1), (3, 1), (7, 37), (17, 257), (2, 1000)] {
            let n = rows * cols;
            let mut a = randn(&mut r, n, 10.0);
            for (i, h) in HOSTILE.iter().enumerate().take(n) {
                a[i] = *h;
            }
            for bcast in [false, true] {
                let mut bv = randn(&mut r, if bcast { cols } else { n }, 10.0);
                if let Some(v) = bv.last_mut() {
                    *v = f32::NAN;
                }
                if bv.len() > 1 {
                    bv[0] = f32::INFINITY;
                }
                let (ad, bd) = (b.upload(&a).unwrap(), b.upload(&bv).unwrap());
                let mut out = b.allocate(DType::F32, n).unwrap();
                b.binary(op, &ad, &bd, &mut out).unwrap();
                let got: Vec<f32> = b.download(&out).unwrap();
                for i in 0..n {
                    let y = bv[i % bv.len()];
                    let want = binary_ref(op, a[i], y);
                    // One rounding of the exact result: |err| <= 2^-24·|want|; WGSL's division
                    // may be 2.5 ulp off (NVIDIA's Vulkan driver's is: f32::MAX / 5.89 came
                    // 1.3 ulp off): 5·2^-24·|want|.
                    let want_f = want as f32;
                    let ulps = if op == BinaryOp::Div { 5.0 } else { 1.0 };
                    assert!(
                        close(got[i], want_f as f64, ulps * want.abs() * U)
                            || got[i].to_bits() == want_f.to_bits()
                            || flushed(&[a[i], y], got[i], want_f),
                        "{op:?}({}, {y}) = {} want {want}",
                        a[i],
                        got[i]
                    );
                }
                // The CPU backend agrees where it has the op (add/sub/mul/div, no NaN inputs).
                if let (Some(kind), false) = (
                    match op {
                        BinaryOp::Add => Some(gpu_core::nn::elementwise::BinaryKind::Add),
                        BinaryOp::Sub => Some(gpu_core::nn::elementwise::BinaryKind::Sub),
                        BinaryOp::Mul => Some(gpu_core::nn::elementwise::BinaryKind::Mul),
                        BinaryOp::Div => Some(gpu_core::nn::elementwise::BinaryKind::Div),
                        _ => None,
                    },
                    n == 0,
                ) {
                    let (ac, bc) = (
                        CpuBackend.upload(&a).unwrap(),
                        CpuBackend.upload(&bv).unwrap(),
                    );
                    let mut oc = CpuBackend.allocate(DType::F32, n).unwrap();
                    let bshape = if bcast { vec![cols] } else { vec![rows, cols] };
                    CpuBackend
                        .broadcast_binary(kind, &ac, &[rows, cols], &bc, &bshape, &mut oc)
                        .unwrap();
                    let want: Vec<f32> = CpuBackend.download(&oc).unwrap();
                    for i in 0..n {
                        let y = bv[i % bv.len()];
                        let div = op == BinaryOp::Div
                            && close(got[i], want[i] as f64, 6.0 * U * want[i].abs() as f64);
                        assert!(
                            got[i].to_bits() == want[i].to_bits()
                                || (got[i].is_nan() && want[i].is_nan())
                                || div
                                || flushed(&[a[i], y], got[i], want[i]),
                            "{op:?} vs CPU at {i}: {} vs {}",
                            got[i],
                            want[i]
                        );
                    }
                }
            }
        }
    }
    let a = b.upload(&[1.0f32; 6]).unwrap();
    let bad = b.upload(&[1.0f32; 4]).unwrap();
    let mut o = b.allocate(DType::F32, 6).unwrap();
    assert!(matches!(
        b.binary(BinaryOp::Add, &a, &bad, &mut o),
        Err(GpuError::ShapeMismatch { .. })
    ));
}

#[test]
fn reduce_rows_parity() {
    let Some((b, mut r)) = backend_and_rng("reduce_rows_parity") else {
        return;
    };
    for (rows, cols) in [
        (0, 5),
        (3, 0),
        (1, 1),
        (5, 3),
        (7, 255),
        (3, 257),
        (2, 5000),
        (300, 17),
    ] {
        let n = rows * cols;
        let mut x = randn(&mut r, n, 100.0);
        if rows >= 3 && cols >= 2 {
            x[cols] = f32::NAN; // row 1
            x[2 * cols] = f32::INFINITY; // row 2
        }
        let xd = b.upload(&x).unwrap();
        for op in [RowReduce::Sum, RowReduce::Max] {
            let mut out = b.allocate(DType::F32, rows).unwrap();
            b.reduce_rows(op, &xd, cols, &mut out).unwrap();
            let got: Vec<f32> = b.download(&out).unwrap();
            for row in 0..rows {
                let xs = &x[row * cols..(row + 1) * cols];
                let (want, tol) = match op {
                    // Bound: cols·2^-24·Σ|x| (f32 accumulation in any order).
                    RowReduce::Sum => (
                        xs.iter().map(|&v| v as f64).sum::<f64>(),
                        cols as f64 * U * xs.iter().map(|&v| (v as f64).abs()).sum::<f64>(),
                    ),
                    RowReduce::Max => (
                        xs.iter().fold(f64::NEG_INFINITY, |m, &v| {
                            if m.is_nan() || v.is_nan() {
                                f64::NAN
                            } else {
                                m.max(v as f64)
                            }
                        }),
                        0.0,
                    ),
                };
                assert!(
                    close(got[row], want, tol),
                    "{op:?} {rows}x{cols} row {row}: {} want {want}",
                    got[row]
                );
            }
            // The CPU backend's reduce_axis agrees (rows without NaN/inf, non-empty).
            if cols > 0 && rows > 0 {
                let kind = match op {
                    RowReduce::Sum => gpu_core::nn::elementwise::ReduceKind::Sum,
                    RowReduce::Max => gpu_core::nn::elementwise::ReduceKind::Max,
                };
                let xc = CpuBackend.upload(&x).unwrap();
                let mut oc = CpuBackend.allocate(DType::F32, rows).unwrap();
                CpuBackend
                    .reduce_axis(kind, &xc, rows, cols, 1, &mut oc)
                    .unwrap();
                let want: Vec<f32> = CpuBackend.download(&oc).unwrap();
                for row in (0..rows).filter(|&r| !(rows >= 3 && cols >= 2 && (r == 1 || r == 2))) {
                    let abs: f64 = x[row * cols..(row + 1) * cols]
                        .iter()
                        .map(|v| v.abs() as f64)
                        .sum();
                    assert!(((got[row] - want[row]) as f64).abs() <= 2.0 * cols as f64 * U * abs);
                }
            }
        }
    }
}

/// Launches are recorded and submitted in batches: a host write, a drop that frees a buffer
/// and a read must still see them in program order. A buffer read by a recorded launch and
/// then overwritten from the host gives the launch the old values; a freed input reused at
/// once by the next allocation does too; 100 chained launches (more than a batch) read back
/// in order.
#[test]
fn recorded_launches_keep_program_order() {
    let Some(b) = backend_or_skip("recorded_launches_keep_program_order") else {
        return;
    };
    let n = 1000;
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut xd = b.upload(&x).unwrap();
    let mut y = b.allocate(DType::F32, n).unwrap();
    b.unary(UnaryOp::Neg, &xd, &mut y).unwrap();
    b.copy_to_device(&vec![7.0f32; n], &mut xd).unwrap();
    let got: Vec<f32> = b.download(&y).unwrap();
    assert!(got.iter().zip(&x).all(|(g, v)| *g == -v), "{:?}", &got[..4]);
    // The input freed after its launch is recorded; the next allocation of its size reuses
    // it from the pool and is overwritten from the host before the launch was submitted.
    let src = b.upload(&x).unwrap();
    b.unary(UnaryOp::Neg, &src, &mut y).unwrap();
    drop(src);
    let reuse = b.upload(&vec![3.0f32; n]).unwrap();
    let got: Vec<f32> = b.download(&y).unwrap();
    assert!(got.iter().zip(&x).all(|(g, v)| *g == -v), "{:?}", &got[..4]);
    drop(reuse);
    // A chain longer than a batch: y = -(-(...x)) 100 times is x.
    let mut a = b.upload(&x).unwrap();
    for _ in 0..50 {
        b.unary(UnaryOp::Neg, &a, &mut y).unwrap();
        b.unary(UnaryOp::Neg, &y, &mut a).unwrap();
    }
    let got: Vec<f32> = b.download(&a).unwrap();
    assert_eq!(got, x);
}

#[test]
fn profile_counts_each_kernel_launch_and_leaves_results_alone() {
    if backend_or_skip("profile_counts_each_kernel_launch").is_none() {
        return;
    }
    // A device of its own: the profile's waits would slow the other tests' shared one.
    let b = WgpuBackend::new(0).unwrap();
    if !b
        .wgpu_device()
        .features()
        .contains(wgpu::Features::TIMESTAMP_QUERY)
    {
        let e = b.set_profiling(true).unwrap_err();
        assert!(matches!(e, GpuError::Unsupported { .. }), "{e}");
        eprintln!("SKIP profile part: no timestamp queries on this adapter ({e})");
        return;
    }
    b.set_profiling(true).unwrap();
    let mut r = rng("profile");
    let x = randn(&mut r, 4099, 2.0);
    let xb = b.upload(&x).unwrap();
    let mut y = b.allocate(DType::F32, x.len()).unwrap();
    for _ in 0..3 {
        b.unary(UnaryOp::Exp, &xb, &mut y).unwrap();
    }
    // More launches than one submission holds, so the totals span several batches.
    let mut z = b.allocate(DType::F32, x.len()).unwrap();
    for _ in 0..70 {
        b.binary(BinaryOp::Add, &xb, &xb, &mut z).unwrap();
    }
    let got = b.download::<f32>(&z).unwrap();
    let (prof, lost) = b.profile();
    assert_eq!(lost, 0);
    let count = |key: &str| prof.iter().find(|k| k.key == key).map(|k| k.launches);
    assert_eq!(count("unary_exp"), Some(3), "{prof:?}");
    assert_eq!(count("binary_add"), Some(70), "{prof:?}");
    assert!(prof.iter().all(|k| k.gpu_ns.is_finite() && k.gpu_ns >= 0.0));
    assert!(prof.windows(2).all(|w| w[0].gpu_ns >= w[1].gpu_ns));
    for (g, v) in got.iter().zip(&x) {
        assert_eq!(*g, v + v);
    }
    b.set_profiling(false).unwrap();
    b.unary(UnaryOp::Exp, &xb, &mut y).unwrap();
    assert!(b.profile().0.is_empty());
}
