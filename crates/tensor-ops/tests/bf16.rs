//! bf16 mixed precision at the tensor level, on the CPU and on CUDA (`devices`: the CUDA part
//! is reported as skipped where no GPU exists). The contract of every bf16 op: the f32 result
//! of the widened inputs, rounded once to nearest even. Where both devices compute that f32
//! result exactly (casts, +, −, ×, ÷, fused affine, dropout, data movement, max) the test asks
//! for the same bits as rounding the f32 op; where the f32 result itself carries an error
//! (activations, sums, matmuls) the bound is that error plus one bf16 ulp (2^-7 relative: the
//! rounding of two nearby f32 values can land on neighbouring bf16 values).

use gpu_cuda::testing::{devices, test_seed};
use rand::{rngs::StdRng, Rng, SeedableRng};
use tensor_ops::ops::Activation;
use tensor_ops::{autocast, DType, Device, Precision, Tensor};

mod bf16_util;

use bf16_util::*;

#[test]
fn bf16_casts_round_to_nearest_even_and_keep_specials() {
    let test = "bf16_casts_round_to_nearest_even_and_keep_specials";
    let mut r = StdRng::seed_from_u64(test_seed(test));
    let mut x = vec![
        1.0,
        1.0 + 1.0 / 256.0, // a tie: to even (1.0)
        1.0 + 3.0 / 512.0, // above the tie: up
        1.0 + 3.0 / 256.0, // a tie: to even (up)
        -0.0,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e30,
        -1e30,
        f32::MAX,     // above bf16's largest finite value: rounds to inf
        1e-40,        // an f32 denormal: a bf16 denormal
        -1e-45,       // the smallest f32 denormal: rounds to -0
        3.3895314e38, // bf16's largest finite value
    ];
    x.extend((0..1001).map(|_| r.random_range(-1e3f32..1e3)));
    let want = bf16_of(&x);
    for dev in devices(test) {
        // Each cast gives the dtype asked for and, read back as f32, the bits of `want`.
        let cast = |from: &Tensor, to: DType, what: &str| {
            let y = from.to_dtype(to).unwrap();
            assert_eq!(y.dtype(), to);
            same_bits(&format!("{what} on {dev}"), &y.to_vec().unwrap(), &want);
            y
        };
        let t = Tensor::from_vec(x.clone(), &[x.len()], dev).unwrap();
        let h = cast(&t, DType::BF16, "f32 -> bf16");
        cast(&h, DType::F32, "bf16 -> f32");
        // Empty tensors cast to empty tensors; u32 is refused with a typed error.
        let e = Tensor::zeros(&[0, 3], dev)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        assert_eq!((e.shape(), e.dtype()), (&[0usize, 3][..], DType::BF16));
        let ids = Tensor::from_vec(vec![1u32, 2], &[2], dev).unwrap();
        assert!(ids.to_dtype(DType::BF16).is_err());
    }
}

/// `f` on bf16 tensors against the f32 op on the widened values, rounded once.
fn exact_case(
    test: &str,
    devs: &[Device],
    shapes: &[&[usize]],
    r: &mut StdRng,
    f: &dyn Fn(&[Tensor]) -> tensor_ops::Result<Tensor>,
) {
    let data: Vec<Vec<f32>> = shapes.iter().map(|s| draw(r, s.iter().product())).collect();
    let f32_in: Vec<Tensor> = data
        .iter()
        .zip(shapes)
        .map(|(d, s)| Tensor::from_vec(d.clone(), s, Device::Cpu).unwrap())
        .collect();
    let want = bf16_of(&f(&f32_in).unwrap().to_vec().unwrap());
    for &dev in devs {
        let ins: Vec<Tensor> = data
            .iter()
            .zip(shapes)
            .map(|(d, s)| t_bf16(d, s, dev))
            .collect();
        let y = f(&ins).unwrap();
        assert_eq!(y.dtype(), DType::BF16, "{test}");
        same_bits(
            &format!("{test} {shapes:?} on {dev}"),
            &y.to_vec().unwrap(),
            &want,
        );
    }
}

#[test]
fn bf16_exact_ops_give_the_rounded_f32_result() {
    let test = "bf16_exact_ops_give_the_rounded_f32_result";
    let mut r = StdRng::seed_from_u64(test_seed(test));
    let devs = devices(test);
    type Op = fn(&Tensor, &Tensor) -> tensor_ops::Result<Tensor>;
    let ops: [(&str, Op); 4] = [
        ("add", Tensor::add),
        ("sub", Tensor::sub),
        ("mul", Tensor::mul),
        ("div", Tensor::div),
    ];
    // Same shapes (odd length: 16-byte units and a scalar tail), a row bias (16-byte, 4-wide
    // and scalar paths), a column, and a general broadcast.
    let pairs: [(&[usize], &[usize]); 6] = [
        (&[7, 33], &[7, 33]),
        (&[9, 24], &[24]),
        (&[5, 12], &[12]),
        (&[9, 13], &[13]),
        (&[6, 10], &[6, 1]),
        (&[2, 1, 5], &[3, 1]),
    ];
    for (name, op) in ops {
        for (a, b) in pairs {
            exact_case(&format!("{test} {name}"), &devs, &[a, b], &mut r, &|t| {
                op(&t[0], &t[1])
            });
        }
    }
    exact_case(test, &devs, &[&[1001]], &mut r, &|t| {
        t[0].affine(0.37, -1.5)
    });
    exact_case(test, &devs, &[&[4, 257]], &mut r, &|t| {
        t[0].dropout(0.3, 99, true)
    });
    exact_case(test, &devs, &[&[3, 5, 7]], &mut r, &|t| {
        t[0].permute(&[2, 0, 1])
    });
    exact_case(test, &devs, &[&[3, 40, 36]], &mut r, &|t| {
        t[0].permute(&[0, 2, 1])
    });
    // The last axis stays: units of 8 elements (16 bytes), of 4, and single elements; more
    // units than one step of the two-a-step loop leaves a last odd one.
    for last in [16usize, 12, 10] {
        exact_case(test, &devs, &[&[5, 7, 3, last]], &mut r, &|t| {
            t[0].permute(&[0, 2, 1, 3])
        });
    }
    // Max over rows and over columns (16-byte loads along a row, and across 8 columns).
    exact_case(test, &devs, &[&[2300, 16]], &mut r, &|t| t[0].max(1, false));
    exact_case(test, &devs, &[&[3, 20, 24]], &mut r, &|t| {
        t[0].max(1, false)
    });
    exact_case(test, &devs, &[&[5, 12]], &mut r, &|t| t[0].narrow(1, 4, 8));
    exact_case(test, &devs, &[&[6, 9, 4]], &mut r, &|t| t[0].max(1, false));
    // Max down 512 rows of 4096 columns: a split that sm_90 runs as clusters (tiles of 8 units).
    exact_case(test, &devs, &[&[512, 4096]], &mut r, &|t| {
        t[0].max(0, false)
    });
}

#[test]
fn bf16_hostile_values_round_like_f32_results() {
    // ±1e30, ±inf, NaN, f32 and bf16 denormals, bf16's largest value (whose sum overflows to
    // inf in bf16 but not in f32), signed zeros: the exact ops must still give the rounded f32
    // result bit for bit, and a NaN stays in its element.
    let test = "bf16_hostile_values_round_like_f32_results";
    let mut r = StdRng::seed_from_u64(test_seed(test));
    let specials = [
        1e30,
        -1e30,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1e-40,
        -9.2e-41,
        3.3895314e38,
        -0.0,
        0.0,
    ];
    // 37 columns take the scalar and 4-wide paths, 40 the 16-byte ones (rows of 5 vectors of 8,
    // columns in groups of 8).
    for (rows, cols) in [(4usize, 37usize), (6, 40)] {
        hostile_case(test, &mut r, &specials, (rows, cols));
    }
}

fn hostile_case(test: &str, r: &mut StdRng, specials: &[f32], (rows, cols): (usize, usize)) {
    let n = rows * cols;
    let pick = |r: &mut StdRng| -> Vec<f32> {
        let mut v = draw(r, n);
        for x in v.iter_mut() {
            if r.random_bool(0.3) {
                *x = specials[r.random_range(0..specials.len())];
            }
        }
        bf16_of(&v)
    };
    let (a, b) = (pick(r), pick(r));
    let devs = devices(test);
    type Op = fn(&Tensor, &Tensor) -> tensor_ops::Result<Tensor>;
    let ops: [Op; 4] = [Tensor::add, Tensor::sub, Tensor::mul, Tensor::div];
    let shape = [rows, cols];
    let f32_t = |v: &[f32]| Tensor::from_vec(v.to_vec(), &shape, Device::Cpu).unwrap();
    for op in ops {
        let want = bf16_of(&op(&f32_t(&a), &f32_t(&b)).unwrap().to_vec().unwrap());
        for &dev in &devs {
            let got = op(&t_bf16(&a, &shape, dev), &t_bf16(&b, &shape, dev)).unwrap();
            same_bits(
                &format!("{test} {shape:?} on {dev}"),
                &got.to_vec().unwrap(),
                &want,
            );
        }
    }
    let want = bf16_of(&f32_t(&a).dropout(0.25, 7, true).unwrap().to_vec().unwrap());
    let want_max = bf16_of(&f32_t(&a).max(1, false).unwrap().to_vec().unwrap());
    let want_max0 = bf16_of(&f32_t(&a).max(0, false).unwrap().to_vec().unwrap());
    // The values summed by each output of a sum over `dim`.
    let lines = |dim: isize| -> Vec<Vec<f32>> {
        if dim == 1 {
            a.chunks(cols).map(<[f32]>::to_vec).collect()
        } else {
            (0..cols)
                .map(|j| (0..rows).map(|i| a[i * cols + j]).collect())
                .collect()
        }
    };
    for &dev in &devs {
        let x = t_bf16(&a, &shape, dev);
        let got = x.dropout(0.25, 7, true).unwrap().to_vec().unwrap();
        same_bits(&format!("{test} {shape:?} dropout on {dev}"), &got, &want);
        let got = x.max(1, false).unwrap().to_vec().unwrap();
        same_bits(&format!("{test} {shape:?} max on {dev}"), &got, &want_max);
        let got = x.max(0, false).unwrap().to_vec().unwrap();
        same_bits(
            &format!("{test} {shape:?} max 0 on {dev}"),
            &got,
            &want_max0,
        );
        // Sums: a line with a NaN (or both infinities) is NaN, one with +inf and no NaN or -inf
        // is +inf. A line holding bf16's largest value twice may overflow to +inf in any order
        // of addition, so its infinities are not asserted.
        for dim in [1, 0] {
            let sums = x.sum(dim, false).unwrap().to_vec().unwrap();
            for (line, s) in lines(dim).iter().zip(&sums) {
                let what = format!("{test}: sum over {dim} of {shape:?} on {dev}: {s}");
                let big = line.iter().filter(|&&v| v == 3.3895314e38).count() >= 2;
                if line.iter().any(|v| v.is_nan()) {
                    assert!(s.is_nan(), "{what}");
                } else if big {
                    continue;
                } else if line.contains(&f32::INFINITY) && line.contains(&f32::NEG_INFINITY) {
                    assert!(s.is_nan(), "{what}");
                } else if line.contains(&f32::INFINITY) {
                    assert_eq!(*s, f32::INFINITY, "{what}");
                } else if line.contains(&f32::NEG_INFINITY) {
                    assert_eq!(*s, f32::NEG_INFINITY, "{what}");
                }
            }
        }
    }
}

#[test]
fn bf16_activations_sums_and_matmuls_are_within_their_bounds() {
    let test = "bf16_activations_sums_and_matmuls_are_within_their_bounds";
    let mut r = StdRng::seed_from_u64(test_seed(test));
    let devs = devices(test);
    let x = draw(&mut r, 2051);
    for op in Activation::ALL.iter().copied() {
        // log needs positive inputs.
        let xin: Vec<f32> = match op {
            Activation::Log => bf16_of(&x.iter().map(|v| v.abs() + 0.125).collect::<Vec<_>>()),
            _ => x.clone(),
        };
        let want = bf16_of(
            &Tensor::from_vec(xin.clone(), &[xin.len()], Device::Cpu)
                .unwrap()
                .activation(op)
                .unwrap()
                .to_vec()
                .unwrap(),
        );
        for &dev in &devs {
            let y = t_bf16(&xin, &[xin.len()], dev).activation(op).unwrap();
            // The f32 formula's error is a few f32 ulps: far below the bf16 ulp.
            let abs = vec![1e-30; xin.len()];
            within_ulp(
                &format!("{op:?} on {dev}"),
                &y.to_vec().unwrap(),
                &want,
                &abs,
            );
        }
    }
    // Sums over an axis: f32 accumulation (γ_n·Σ|x|), then one rounding.
    // Scalar columns, a split row (16-byte loads), scalar columns that are not 16 bytes wide,
    // many rows (a warp a row, 16-byte loads and scalar), 16-byte columns split and not, and
    // split in clusters.
    for shape in [
        [4usize, 300, 3],
        [2, 5000, 1],
        [3, 8, 130],
        [2500, 64, 1],
        [2500, 60, 1],
        [1, 3000, 48],
        [5, 40, 16],
        // Split 16-byte columns that sm_90 reduces in thread-block clusters: tiles of 16 and 32
        // units, three outer items, a last tile of one unit.
        [1, 512, 8192],
        [3, 200, 4096],
        [1, 300, 8200],
    ] {
        let v = draw(&mut r, shape.iter().product());
        let want = Tensor::from_vec(v.clone(), &shape, Device::Cpu)
            .unwrap()
            .sum(1, false)
            .unwrap()
            .to_vec()
            .unwrap();
        let abs_sum = Tensor::from_vec(v.iter().map(|a| a.abs()).collect(), &shape, Device::Cpu)
            .unwrap()
            .sum(1, false)
            .unwrap()
            .to_vec()
            .unwrap();
        let n = shape[1] as f64;
        let abs: Vec<f64> = abs_sum.iter().map(|&s| 2.0 * n * U32 * s as f64).collect();
        for &dev in &devs {
            let y = t_bf16(&v, &shape, dev).sum(1, false).unwrap();
            assert_eq!(y.dtype(), DType::BF16);
            within_ulp(
                &format!("sum {shape:?} on {dev}"),
                &y.to_vec().unwrap(),
                &want,
                &abs,
            );
        }
    }
    // Matmuls: the products of bf16 values are exact in f32; f32 sums (γ_k·Σ|a||b|), one
    // rounding. Plain, transposed and batched.
    for (ta, tb, batch, m, n, k) in [
        (false, false, 1, 17, 23, 40),
        (false, true, 1, 8, 64, 129),
        (true, false, 3, 5, 7, 33),
    ] {
        let sa: Vec<usize> = if ta {
            vec![batch, k, m]
        } else {
            vec![batch, m, k]
        };
        let sb: Vec<usize> = if tb {
            vec![batch, n, k]
        } else {
            vec![batch, k, n]
        };
        let (a, b) = (draw(&mut r, batch * m * k), draw(&mut r, batch * k * n));
        let f32_t = |v: &[f32], s: &[usize]| Tensor::from_vec(v.to_vec(), s, Device::Cpu).unwrap();
        let want = f32_t(&a, &sa)
            .matmul_t(&f32_t(&b, &sb), ta, tb)
            .unwrap()
            .to_vec()
            .unwrap();
        let abs_ab = |v: &[f32]| v.iter().map(|x| x.abs()).collect::<Vec<_>>();
        let mag = f32_t(&abs_ab(&a), &sa)
            .matmul_t(&f32_t(&abs_ab(&b), &sb), ta, tb)
            .unwrap()
            .to_vec()
            .unwrap();
        let abs: Vec<f64> = mag
            .iter()
            .map(|&s| 2.0 * k as f64 * U32 * s as f64)
            .collect();
        for &dev in &devs {
            let y = t_bf16(&a, &sa, dev)
                .matmul_t(&t_bf16(&b, &sb, dev), ta, tb)
                .unwrap();
            assert_eq!(y.dtype(), DType::BF16);
            let what = format!("matmul ta={ta} tb={tb} {batch}x{m}x{n}x{k} on {dev}");
            within_ulp(&what, &y.to_vec().unwrap(), &want, &abs);
        }
    }
}

#[test]
fn bf16_mixed_operands_promote_and_gradients_come_back_in_each_dtype() {
    let test = "bf16_mixed_operands_promote_and_gradients_come_back_in_each_dtype";
    let mut r = StdRng::seed_from_u64(test_seed(test));
    let (a, b) = (draw(&mut r, 24), draw(&mut r, 24));
    for dev in devices(test) {
        let x = Tensor::from_vec(a.clone(), &[4, 6], dev)
            .unwrap()
            .requires_grad_()
            .unwrap();
        let w = Tensor::from_vec(b.clone(), &[4, 6], dev)
            .unwrap()
            .requires_grad_()
            .unwrap();
        // f32 + bf16 computes in f32 (exact here: both operands are bf16 values).
        let h = w.to_dtype(DType::BF16).unwrap().gelu().unwrap();
        let y = x.add(&h).unwrap();
        assert_eq!(y.dtype(), DType::F32);
        let g = y.sum_all().unwrap().backward().unwrap();
        assert_eq!(g.get(&x).unwrap().dtype(), DType::F32);
        assert_eq!(g.get(&w).unwrap().dtype(), DType::F32, "through the cast");
        // x's gradient is exactly 1; w's is gelu'(w) rounded to bf16 (within a bf16 ulp).
        assert!(g
            .get(&x)
            .unwrap()
            .to_vec()
            .unwrap()
            .iter()
            .all(|&v| v == 1.0));
        let want = Tensor::from_vec(b.clone(), &[4, 6], Device::Cpu)
            .unwrap()
            .requires_grad_()
            .unwrap();
        let gw = want.gelu().unwrap().sum_all().unwrap().backward().unwrap();
        let want = gw.get(&want).unwrap().to_vec().unwrap();
        within_ulp(
            &format!("gelu' on {dev}"),
            &g.get(&w).unwrap().to_vec().unwrap(),
            &want,
            &[1e-30; 24],
        );
        // A bf16 loss seeds its backward in bf16.
        let l = w.to_dtype(DType::BF16).unwrap().sum_all().unwrap();
        assert_eq!(l.dtype(), DType::BF16);
        let g = l.backward().unwrap();
        assert!(g
            .get(&w)
            .unwrap()
            .to_vec()
            .unwrap()
            .iter()
            .all(|&v| v == 1.0));
        // Mixed dtypes where promotion does not apply are typed errors.
        let ids = Tensor::from_vec(vec![1u32; 24], &[4, 6], dev).unwrap();
        assert!(h.add(&ids).is_err());
    }
}

#[test]
fn bf16_autocast_linear_is_within_its_rounding_bound() {
    let test = "bf16_autocast_linear_is_within_its_rounding_bound";
    let mut r = StdRng::seed_from_u64(test_seed(test));
    let (rows, i, o) = (9, 70, 24);
    let x: Vec<f32> = (0..rows * i)
        .map(|_| r.random_range(-2.0f32..2.0))
        .collect();
    let w: Vec<f32> = (0..o * i).map(|_| r.random_range(-0.3f32..0.3)).collect();
    let b: Vec<f32> = (0..o).map(|_| r.random_range(-1.0f32..1.0)).collect();
    // Exact references in f64: y = x·wᵀ + b, S = |x|·|w|ᵀ, and dW = column sums of x.
    let (mut y, s) = gpu_core::testing::exact_xwt(&x, &w, (rows, o, i));
    for (idx, y) in y.iter_mut().enumerate() {
        *y += b[idx % o] as f64;
    }
    for dev in devices(test) {
        let xt = Tensor::from_vec(x.clone(), &[rows, i], dev).unwrap();
        let wt = Tensor::from_vec(w.clone(), &[o, i], dev)
            .unwrap()
            .requires_grad_()
            .unwrap();
        let bt = Tensor::from_vec(b.clone(), &[o], dev)
            .unwrap()
            .requires_grad_()
            .unwrap();
        let out = autocast(Precision::Bf16, || xt.linear(&wt, Some(&bt))).unwrap();
        assert_eq!(out.dtype(), DType::BF16, "autocast gives bf16");
        let got = out.to_vec().unwrap();
        // x, w, b each rounded to bf16 (u), exact products, f32 sums (γ_k), the GEMM's output
        // rounded (u), the bias add rounded (u):
        // |ŷ − y| <= (2u + u² + γ_k)·S + u·(S + |b|) + u·|b| + u·|ŷ| (+ second order).
        for (e, (&g, (&yv, &sv))) in got.iter().zip(y.iter().zip(&s)).enumerate() {
            let bq = b[e % o].abs() as f64;
            let tol = (3.0 * U16 + U16 * U16 + 2.0 * i as f64 * U32) * sv * 1.01
                + 2.0 * U16 * bq
                + U16 * (g as f64).abs();
            let err = (g as f64 - yv).abs();
            assert!(
                err <= tol,
                "{dev}: y[{e}] = {g} vs {yv} (err {err:e}, tol {tol:e})"
            );
        }
        // Outside autocast the same call is f32.
        assert_eq!(xt.linear(&wt, Some(&bt)).unwrap().dtype(), DType::F32);
        // Gradients of the f32 parameters are f32: dW = Σ_rows x (times 1 from the sum).
        let grads = autocast(Precision::Bf16, || {
            xt.linear(&wt, Some(&bt))
                .and_then(|y| y.to_dtype(DType::F32))
                .and_then(|y| y.sum_all())
        })
        .unwrap()
        .backward()
        .unwrap();
        let (dw, db) = (grads.get(&wt).unwrap(), grads.get(&bt).unwrap());
        assert_eq!((dw.dtype(), db.dtype()), (DType::F32, DType::F32));
        let dw = dw.to_vec().unwrap();
        for q in 0..o {
            for t in 0..i {
                let col: Vec<f64> = (0..rows).map(|p| x[p * i + t] as f64).collect();
                let want: f64 = col.iter().sum();
                let mag: f64 = col.iter().map(|v| v.abs()).sum();
                let g = dw[q * i + t] as f64;
                // x rounded (u), f32 sums, the result rounded (u).
                let tol = (U16 + 2.0 * rows as f64 * U32) * mag * 1.01 + U16 * g.abs();
                assert!(
                    (g - want).abs() <= tol,
                    "{dev}: dW[{q},{t}] = {g} vs {want}"
                );
            }
        }
        assert!(db.to_vec().unwrap().iter().all(|&v| v == rows as f32));
    }
}
