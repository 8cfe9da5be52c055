use super::*;
use crate::nn::rows::LogitsIn;
use crate::nn::{Activation, BinaryKind, Primitives, RowOps};
use approx::assert_relative_eq;

#[test]
fn round_trip_every_dtype() {
    let cpu = CpuBackend;
    let x: Vec<f32> = (0..37).map(|i| i as f32 * 0.25).collect();
    assert_eq!(cpu.download::<f32>(&cpu.upload(&x).unwrap()).unwrap(), x);
    let h: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
    assert_eq!(cpu.download::<f16>(&cpu.upload(&h).unwrap()).unwrap(), h);
    let b: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
    assert_eq!(cpu.download::<bf16>(&cpu.upload(&b).unwrap()).unwrap(), b);
}

#[test]
fn transfers_check_dtype_and_length() {
    let cpu = CpuBackend;
    let mut buf = cpu.allocate(DType::F32, 4).unwrap();
    assert!(matches!(
        cpu.copy_to_device(&[f16::ONE; 4], &mut buf),
        Err(GpuError::DTypeMismatch { .. })
    ));
    assert!(matches!(
        cpu.copy_to_device(&[1.0f32; 3], &mut buf),
        Err(GpuError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        cpu.allocate(DType::F32, usize::MAX / 2),
        Err(GpuError::OutOfMemory { .. })
    ));
}

#[test]
fn elementwise_and_activations() {
    let cpu = CpuBackend;
    let a = cpu.upload(&[1.0f32, -2.0, 3.0]).unwrap();
    let b = cpu.upload(&[4.0f32, 5.0, -6.0]).unwrap();
    let mut o = cpu.allocate(DType::F32, 3).unwrap();
    let bin = |op, o: &mut CpuStorage| cpu.broadcast_binary(op, &a, &[3], &b, &[3], o);
    bin(BinaryKind::Add, &mut o).unwrap();
    assert_eq!(o.as_f32().unwrap(), &[5.0, 3.0, -3.0]);
    bin(BinaryKind::Mul, &mut o).unwrap();
    assert_eq!(o.as_f32().unwrap(), &[4.0, -10.0, -18.0]);
    cpu.activation_fwd(Activation::Relu, &a, &mut o).unwrap();
    assert_eq!(o.as_f32().unwrap(), &[1.0, 0.0, 3.0]);
    cpu.activation_fwd(Activation::Sigmoid, &a, &mut o).unwrap();
    assert_relative_eq!(o.as_f32().unwrap()[0], 0.731_058_6, max_relative = 1e-6);
    cpu.activation_fwd(Activation::Tanh, &a, &mut o).unwrap();
    assert_relative_eq!(
        o.as_f32().unwrap()[1],
        (-2.0f32).tanh(),
        max_relative = 1e-6
    );
    let short = cpu.upload(&[1.0f32]).unwrap();
    assert!(cpu
        .broadcast_binary(BinaryKind::Add, &a, &[3], &short, &[3], &mut o)
        .is_err());
    // f16 has no kernels, as input or output.
    let half = cpu.upload(&[f16::ONE; 3]).unwrap();
    let mut half_out = cpu.upload(&[f16::ZERO; 3]).unwrap();
    assert!(matches!(
        cpu.activation_fwd(Activation::Relu, &half, &mut half_out),
        Err(GpuError::UnsupportedDType { .. })
    ));
    assert!(matches!(
        cpu.activation_fwd(Activation::Relu, &half, &mut o),
        Err(GpuError::UnsupportedDType { .. })
    ));
    // bf16 in, f32 out: a mismatch (bf16 ops write bf16).
    let b16 = cpu.upload(&[half::bf16::ONE; 3]).unwrap();
    assert!(matches!(
        cpu.activation_fwd(Activation::Relu, &b16, &mut o),
        Err(GpuError::DTypeMismatch { .. })
    ));
}

#[test]
fn softmax_and_layernorm_rows() {
    let cpu = CpuBackend;
    let x = cpu
        .upload(&[1.0f32, 2.0, 3.0, 1000.0, 1000.0, 1000.0])
        .unwrap();
    let mut o = cpu.allocate(DType::F32, 6).unwrap();
    cpu.softmax_fwd(&x, &mut o, 3).unwrap();
    let o = o.as_f32().unwrap().to_vec();
    assert_relative_eq!(o[0] + o[1] + o[2], 1.0, max_relative = 1e-6);
    assert_relative_eq!(o[2], 0.665_240_9, max_relative = 1e-6);
    assert_relative_eq!(o[4], 1.0 / 3.0, max_relative = 1e-6);
    let mut o = cpu.allocate(DType::F32, 6).unwrap();
    assert!(cpu.softmax_fwd(&x, &mut o, 4).is_err());
    assert!(cpu.softmax_fwd(&x, &mut o, 0).is_err());

    let g = cpu.upload(&[1.0f32, 2.0, 1.0]).unwrap();
    let b = cpu.upload(&[0.0f32, 0.0, 1.0]).unwrap();
    let (mut mean, mut rstd) = (
        cpu.allocate(DType::F32, 2).unwrap(),
        cpu.allocate(DType::F32, 2).unwrap(),
    );
    cpu.layernorm_fwd((&x, &g, &b), (&mut o, &mut mean, &mut rstd), 3, 1e-5)
        .unwrap();
    let o = o.as_f32().unwrap();
    assert_relative_eq!(o[0], -1.224_736_8, max_relative = 1e-5);
    assert_relative_eq!(o[1], 0.0, epsilon = 1e-6);
    assert_relative_eq!(o[2], 2.224_736_8, max_relative = 1e-5);
    let mut o2 = cpu.allocate(DType::F32, 6).unwrap();
    assert!(cpu
        .layernorm_fwd((&x, &g, &b), (&mut o2, &mut mean, &mut rstd), 3, f32::NAN)
        .is_err());
    assert!(cpu
        .layernorm_fwd((&x, &g, &b), (&mut o2, &mut mean, &mut rstd), 2, 1e-5)
        .is_err());
}

#[test]
fn matmul_2x2_and_transposes() {
    let cpu = CpuBackend;
    let a = cpu.upload(&[1.0f32, 2.0, 3.0, 4.0]).unwrap();
    let b = cpu.upload(&[5.0f32, 6.0, 7.0, 8.0]).unwrap();
    let mut c = cpu.allocate(DType::F32, 4).unwrap();
    cpu.matmul(MatmulSpec::new(2, 2, 2), &a, &b, &mut c)
        .unwrap();
    assert_eq!(c.as_f32().unwrap(), &[19.0, 22.0, 43.0, 50.0]);
    let spec = MatmulSpec {
        trans_a: true,
        trans_b: true,
        ..MatmulSpec::new(2, 2, 2)
    };
    cpu.matmul(spec, &a, &b, &mut c).unwrap();
    // Aᵀ·Bᵀ = (B·A)ᵀ; B·A = [[23, 34], [31, 46]].
    assert_eq!(c.as_f32().unwrap(), &[23.0, 31.0, 34.0, 46.0]);
    let mut bad = cpu.allocate(DType::F32, 3).unwrap();
    assert!(cpu
        .matmul(MatmulSpec::new(2, 2, 2), &a, &b, &mut bad)
        .is_err());
    // k = 0: the product of empty matrices is all zeros.
    let e = cpu.allocate(DType::F32, 0).unwrap();
    cpu.fill(&mut c, 7.0).unwrap();
    cpu.matmul(MatmulSpec::new(2, 2, 0), &e, &e, &mut c)
        .unwrap();
    assert_eq!(c.as_f32().unwrap(), &[0.0; 4]);
}

/// Rows of equal logits `c` have log-softmax `−ln n` and cross-entropy `ln n` whatever `c`:
/// computed as `v − (max + ln Σ)`, `ln Σ` vanished into the rounding of `max` once |c| ≳ 1e12
/// (1e15 → −1.375, 1e16 → −2 for n = 4; cross-entropy 2 or 0 instead of ln 3).
#[test]
fn log_softmax_and_cross_entropy_of_equal_huge_logits_are_exact() {
    use crate::nn::RowOps;
    let cpu = CpuBackend;
    for c in [1e12f32, -1e12, 1e15, -1e15, 1e16, -1e16, 1e30, -1e30, 3e38] {
        let x = cpu.upload(&[c; 4]).unwrap();
        let mut out = cpu.allocate(DType::F32, 4).unwrap();
        cpu.log_softmax_fwd(&x, &mut out, 4).unwrap();
        let want = -(4.0f64).ln() as f32;
        assert_eq!(
            out.as_f32().unwrap(),
            &[want; 4],
            "log_softmax of [{c:e}; 4]"
        );

        let logits = cpu.upload(&[c; 6]).unwrap();
        let targets = cpu.upload(&[0u32, 2]).unwrap();
        let mut loss = cpu.allocate(DType::F32, 2).unwrap();
        cpu.cross_entropy_fwd(LogitsIn::new(&logits, &targets, 3), &mut loss)
            .unwrap();
        let want = (3.0f64).ln() as f32;
        assert_eq!(
            loss.as_f32().unwrap(),
            &[want; 2],
            "cross-entropy of [{c:e}; 3]"
        );
    }
}

/// f64 reference of op(A)·op(B) for one batch entry, and Σ|a·b| per element (the rounding bound).
fn matmul_f64(spec: MatmulSpec, a: &[f32], b: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let MatmulSpec { m, n, k, .. } = spec;
    let at = |i: usize, p: usize| a[if spec.trans_a { p * m + i } else { i * k + p }] as f64;
    let bt = |p: usize, j: usize| b[if spec.trans_b { j * k + p } else { p * n + j }] as f64;
    let (mut c, mut mag) = (vec![0.0; m * n], vec![0.0; m * n]);
    for i in 0..m {
        for j in 0..n {
            for p in 0..k {
                c[i * n + j] += at(i, p) * bt(p, j);
                mag[i * n + j] += (at(i, p) * bt(p, j)).abs();
            }
        }
    }
    (c, mag)
}

/// Odd shapes around the SIMD widths and the blocking sizes, every transpose, batched: each
/// element within k·u·Σ|a·b| of the f64 product (u = 2^-24; an f32 dot product of length k,
/// however it is blocked, rounds each partial sum once).
#[test]
fn matmul_matches_f64_on_odd_shapes_and_transposes() {
    let cpu = CpuBackend;
    let mut state = 0x2545f4914f6cdd1du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
    };
    for (batch, m, n, k) in [
        (1, 1, 1, 1),
        (2, 17, 33, 65),
        (1, 3, 130, 7),
        (3, 64, 5, 300),
        (1, 129, 95, 257),
    ] {
        for spec in crate::testing::every_transpose((batch, m, n, k)) {
            let a: Vec<f32> = (0..batch * m * k).map(|_| next()).collect();
            let b: Vec<f32> = (0..batch * k * n).map(|_| next()).collect();
            let mut c = cpu.upload(&vec![f32::NAN; batch * m * n]).unwrap();
            let (ab, bb) = (cpu.upload(&a).unwrap(), cpu.upload(&b).unwrap());
            cpu.matmul(spec, &ab, &bb, &mut c).unwrap();
            let got = c.as_f32().unwrap();
            for bi in 0..batch {
                let one = MatmulSpec { batch: 1, ..spec };
                let (want, mag) = matmul_f64(
                    one,
                    &a[bi * m * k..(bi + 1) * m * k],
                    &b[bi * k * n..(bi + 1) * k * n],
                );
                for (e, (w, s)) in want.iter().zip(&mag).enumerate() {
                    let g = got[bi * m * n + e] as f64;
                    let tol = k as f64 * s / (1u64 << 24) as f64 + 1e-30;
                    assert!(
                        (g - w).abs() <= tol,
                        "{spec:?} batch {bi} element {e}: {g} vs {w} (bound {tol:e})"
                    );
                }
            }
        }
    }
}

/// `((i·mul) % modulus) / scale − offset` for `i < len`: a deterministic test matrix.
fn pattern(len: usize, (mul, modulus): (usize, usize), (scale, offset): (f32, f32)) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * mul) % modulus) as f32 / scale - offset)
        .collect()
}

/// The product is the same, bit for bit, on 1, 2 and 5 threads (training runs resume bit-exactly
/// on a machine with another core count).
#[test]
fn matmul_results_do_not_depend_on_the_thread_count() {
    let (m, n, k) = (300, 260, 1100);
    let a = pattern(m * k, (7919, 1000), (250.0, 2.0));
    let b = pattern(k * n, (104729, 997), (250.0, 2.0));
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let mut c = vec![0.0f32; m * n];
        pool.install(|| sgemm_rows(MatmulSpec::new(m, n, k), &a, &b, &mut c));
        c.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    };
    let one = run(1);
    assert_eq!(run(2), one, "2 threads");
    assert_eq!(run(5), one, "5 threads");
}

/// Non-finite inputs reach exactly the outputs that read them: a NaN in row 1 of A makes row 1
/// of C NaN and leaves the other rows finite and exact; +inf in column 2 of B makes column 2
/// ±inf or NaN only. The output starts poisoned, so an unwritten element would show.
#[test]
fn matmul_non_finite_inputs_reach_only_their_row_or_column() {
    let cpu = CpuBackend;
    let (m, n, k) = (37, 41, 70);
    let a = pattern(m * k, (31, 17), (8.0, 1.0));
    let b = pattern(k * n, (13, 11), (4.0, 1.0));
    let run = |a: &[f32], b: &[f32]| {
        let mut c = cpu.upload(&vec![-7.5f32; m * n]).unwrap();
        let (ab, bb) = (cpu.upload(a).unwrap(), cpu.upload(b).unwrap());
        cpu.matmul(MatmulSpec::new(m, n, k), &ab, &bb, &mut c)
            .unwrap();
        c.as_f32().unwrap().to_vec()
    };
    let clean = run(&a, &b);
    let mut an = a.clone();
    an[k + 5] = f32::NAN;
    let c = run(&an, &b);
    for i in 0..m {
        for j in 0..n {
            let (g, w) = (c[i * n + j], clean[i * n + j]);
            if i == 1 {
                assert!(g.is_nan(), "C[1][{j}] = {g}, want NaN");
            } else {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "C[{i}][{j}] moved by a NaN in row 1"
                );
            }
        }
    }
    let mut binf = b.clone();
    binf[3 * n + 2] = f32::INFINITY;
    let c = run(&a, &binf);
    for i in 0..m {
        for j in 0..n {
            let (g, w) = (c[i * n + j], clean[i * n + j]);
            if j == 2 {
                assert!(!g.is_finite(), "C[{i}][2] = {g}, want ±inf or NaN");
            } else {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "C[{i}][{j}] moved by an inf in column 2"
                );
            }
        }
    }
}

/// `on_pool` runs its closure on a worker of rayon's global pool (not on the caller), with the
/// caller's mode override, returns its value, runs nested calls in place, and hands a panic
/// back to the caller.
#[test]
fn on_pool_runs_on_a_worker_with_the_callers_mode() {
    use crate::cpu::{mode, on_pool, with_mode, CpuMode};
    // The test harness runs tests on threads of its own, never on rayon's workers.
    assert_eq!(rayon::current_thread_index(), None);
    let caller = std::thread::current().id();
    let (index, thread, m, nested) = with_mode(CpuMode::Fast, || {
        on_pool(|| {
            let here = std::thread::current().id();
            let nested = on_pool(|| std::thread::current().id() == here);
            (rayon::current_thread_index(), here, mode(), nested)
        })
    });
    assert!(index.is_some(), "not on a worker");
    assert_ne!(thread, caller);
    assert_eq!(m, CpuMode::Fast, "the caller's override did not go along");
    assert!(nested, "a nested call moved to another thread");
    assert_eq!(on_pool(mode), CpuMode::Exact, "no override: the default");
    let panicked = std::panic::catch_unwind(|| on_pool(|| panic!("inside the pool")));
    assert!(panicked.is_err());
}
