//! bf16 packed causal attention at the tensor level, on the CPU and on CUDA (`devices`: the
//! CUDA part is reported as skipped where no GPU exists): within the f32 result's bound plus
//! one bf16 ulp, and masked positions never reaching earlier rows.

mod bf16_util;

use bf16_util::*;
use gpu_cuda::testing::{devices, test_seed};
use rand::{rngs::StdRng, Rng, SeedableRng};
use tensor_ops::{DType, Device, Tensor};

/// A packed attention input at head dimension 64 (the bf16 kernels): batch 2, 2 heads, `t`
/// positions. Returns the test's rng (seeded from its name) after drawing, the dims
/// `(b, t, heads, d)` and the random `[b, t, 3·heads·d]` values.
fn packed_attention_input(
    test: &str,
    t: usize,
) -> (StdRng, (usize, usize, usize, usize), Vec<f32>) {
    let mut r = StdRng::seed_from_u64(test_seed(test));
    let (b, heads, d) = (2, 2, 64);
    let qkv = draw(&mut r, b * t * 3 * heads * d);
    (r, (b, t, heads, d), qkv)
}

#[test]
fn bf16_packed_attention_is_within_its_rounding_bound_on_both_devices() {
    // Head dimension 64 takes the bf16 kernels (CUDA: tensor cores; CPU: their reference).
    // Against the exact attention of the same (bf16) values: the probabilities are rounded to
    // bf16 for P·V (each by at most 2^-8 relatively, so the output moves by at most
    // 2^-8·Σ_j p_ij·|v_j|), f32 sums, and the output is rounded once (2^-8·|o|).
    let test = "bf16_packed_attention_is_within_its_rounding_bound_on_both_devices";
    let (_, (b, t, heads, d), qkv) = packed_attention_input(test, 37);
    let c = heads * d;
    let exact = |v: &[f32]| {
        gpu_core::cpu::with_mode(gpu_core::cpu::CpuMode::Exact, || {
            Tensor::from_vec(v.to_vec(), &[b, t, 3 * c], Device::Cpu)
                .unwrap()
                .causal_attention_packed(heads)
                .unwrap()
                .to_vec()
                .unwrap()
        })
    };
    let want = exact(&qkv);
    // Σ_j p_ij·|v_j|: the same attention with |v| (the v block is the last third of each row).
    let abs_v: Vec<f32> = qkv
        .iter()
        .enumerate()
        .map(|(i, &x)| if i % (3 * c) >= 2 * c { x.abs() } else { x })
        .collect();
    let mag = exact(&abs_v);
    for dev in devices(test) {
        let y = t_bf16(&qkv, &[b, t, 3 * c], dev)
            .causal_attention_packed(heads)
            .unwrap();
        assert_eq!(y.dtype(), DType::BF16, "bf16 in, bf16 out at d = 64");
        let got = y.to_vec().unwrap();
        for (i, ((&g, &w), &m)) in got.iter().zip(&want).zip(&mag).enumerate() {
            let tol = U16 * m as f64 * 1.05 + U16 * (g as f64).abs() + 1e-6;
            let err = (g as f64 - w as f64).abs();
            assert!(
                err <= tol,
                "{dev}: out[{i}] = {g} vs {w} (err {err:e}, tol {tol:e})"
            );
        }
        // Another head width computes in f32 and says so in its dtype.
        let narrow = t_bf16(&qkv[..b * t * 3 * 64], &[b, t, 3 * 64], dev);
        let y = narrow.causal_attention_packed(2).unwrap();
        assert_eq!(y.dtype(), DType::F32, "d = 32: the f32 kernels");
    }
}

#[test]
fn bf16_attention_masked_positions_never_reach_earlier_rows() {
    // A NaN or inf at position p of one sequence's k, v or q may reach rows >= p only: out and
    // dq of every row i < p keep the clean run's bits (the tensor cores multiply masked zeros by
    // the later operands, which the kernels must not let through), on both devices.
    let test = "bf16_attention_masked_positions_never_reach_earlier_rows";
    let (mut r, (b, t, heads, d), clean) = packed_attention_input(test, 70);
    let c = heads * d;
    let rr = draw(&mut r, b * t * c);
    for dev in devices(test) {
        let run = |qkv: &[f32]| {
            let x = t_bf16(qkv, &[b, t, 3 * c], dev).requires_grad_().unwrap();
            let out = x.causal_attention_packed(heads).unwrap();
            let w = t_bf16(&rr, &[b, t, c], dev);
            let g = out.mul(&w).unwrap().to_dtype(DType::F32).unwrap();
            let grads = g.sum_all().unwrap().backward().unwrap();
            (
                out.to_vec().unwrap(),
                grads.get(&x).unwrap().to_vec().unwrap(),
            )
        };
        let (out0, g0) = run(&clean);
        for (block, bad) in [
            (1, f32::INFINITY),
            (2, f32::NAN),
            (2, f32::NEG_INFINITY),
            (0, f32::NAN),
        ] {
            let p = r.random_range(1..t);
            let (bi, h, x) = (
                r.random_range(0..b),
                r.random_range(0..heads),
                r.random_range(0..d),
            );
            let mut qkv = clean.clone();
            qkv[(bi * t + p) * 3 * c + block * c + h * d + x] = bad;
            let (out1, g1) = run(&qkv);
            let what = format!("{dev}: {bad} in block {block} at position {p} of sequence {bi}");
            for i in 0..p {
                let o = (bi * t + i) * c;
                same_bits(
                    &format!("{what}: out row {i}"),
                    &out1[o..o + c],
                    &out0[o..o + c],
                );
                let q = (bi * t + i) * 3 * c;
                same_bits(&format!("{what}: dq row {i}"), &g1[q..q + c], &g0[q..q + c]);
            }
            // The other sequence of the batch is untouched everywhere.
            let other = 1 - bi;
            let (o, q) = (other * t * c, other * t * 3 * c);
            same_bits(
                &format!("{what}: other out"),
                &out1[o..o + t * c],
                &out0[o..o + t * c],
            );
            same_bits(
                &format!("{what}: other grad"),
                &g1[q..q + 3 * t * c],
                &g0[q..q + 3 * t * c],
            );
        }
    }
}
