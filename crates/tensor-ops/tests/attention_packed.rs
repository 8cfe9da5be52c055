//! `Tensor::causal_attention_packed` (attention straight from a fused `[b, t, 3c]` projection)
//! against the composed form (split, permute, `causal_attention`, permute back), bit for bit,
//! output and the gradient of the projection: on CUDA, and on the CPU in both CPU modes. CUDA
//! against the CPU within the attention kernels' bound (`gpu-cuda/tests/nn_attention.rs`:
//! norm-wise 1e-5 forward, 3e-5 gradients). Typed errors for shapes that do not split. Tests
//! named `gpu_*` skip without a GPU.

use gpu_cuda::testing::{gpu_device_or_skip as gpu, rel_err};
use tensor_ops::{Device, Tensor};

fn composed(qkv: &Tensor, heads: usize) -> Tensor {
    let (b, t, c) = (qkv.shape()[0], qkv.shape()[1], qkv.shape()[2] / 3);
    let head = |i: usize| {
        qkv.narrow(2, i * c, c)
            .unwrap()
            .reshape(&[b, t, heads, c / heads])
            .unwrap()
            .permute(&[0, 2, 1, 3])
            .unwrap()
    };
    Tensor::causal_attention(&head(0), &head(1), &head(2))
        .unwrap()
        .permute(&[0, 2, 1, 3])
        .unwrap()
        .reshape(&[b, t, c])
        .unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec().unwrap().iter().map(|v| v.to_bits()).collect()
}

/// `(out, d loss/d qkv)` for loss = Σ out ∘ r.
fn run(qkv: &Tensor, r: &Tensor, heads: usize, packed: bool) -> (Tensor, Tensor) {
    let x = qkv.detach().requires_grad_().unwrap();
    let y = if packed {
        x.causal_attention_packed(heads).unwrap()
    } else {
        composed(&x, heads)
    };
    let g = y.mul(r).unwrap().sum_all().unwrap().backward().unwrap();
    (y.detach(), g.get(&x).unwrap().clone())
}

#[test]
fn gpu_packed_attention_is_the_composed_form_bit_for_bit() {
    let test = "gpu_packed_attention_is_the_composed_form_bit_for_bit";
    let Some(dev) = gpu(test) else {
        return;
    };
    let seed = gpu_cuda::testing::test_seed(test);
    for (i, (b, t, heads, d)) in [(2, 70, 3, 64), (1, 40, 2, 128), (3, 9, 1, 8)]
        .into_iter()
        .enumerate()
    {
        let c = heads * d;
        let s = seed.wrapping_add(i as u64);
        let qkv = Tensor::randn(&[b, t, 3 * c], 1.0, s, dev).unwrap();
        let r = Tensor::randn(&[b, t, c], 1.0, s ^ 7, dev).unwrap();
        let (yp, gp) = run(&qkv, &r, heads, true);
        let (yc, gc) = run(&qkv, &r, heads, false);
        let what = format!("b {b} t {t} heads {heads} d {d} (seed {seed})");
        assert_eq!(bits(&yp), bits(&yc), "{what}: output");
        assert_eq!(bits(&gp), bits(&gc), "{what}: gradient");
        // The CPU (the composed form over the f64 reference).
        let (ycpu, gcpu) = run(
            &qkv.to(Device::Cpu).unwrap(),
            &r.to(Device::Cpu).unwrap(),
            heads,
            true,
        );
        let e = rel_err(&yp.to_vec().unwrap(), &ycpu.to_vec().unwrap());
        assert!(e < 1e-5, "{what}: output against the CPU, rel. error {e:e}");
        let e = rel_err(&gp.to_vec().unwrap(), &gcpu.to_vec().unwrap());
        assert!(
            e < 3e-5,
            "{what}: gradient against the CPU, rel. error {e:e}"
        );
    }
}

#[test]
fn packed_attention_refuses_shapes_that_do_not_split() {
    let x = Tensor::zeros(&[2, 4, 24], Device::Cpu).unwrap();
    assert!(x.causal_attention_packed(0).is_err());
    assert!(x.causal_attention_packed(3).is_err()); // 24 = 3·8: 8 columns into 3 heads
    assert!(x.causal_attention_packed(5).is_err());
    assert!(Tensor::zeros(&[4, 24], Device::Cpu)
        .unwrap()
        .causal_attention_packed(2)
        .is_err());
    let ids = Tensor::from_vec(vec![0u32; 24], &[1, 1, 24], Device::Cpu).unwrap();
    assert!(ids.causal_attention_packed(2).is_err());
    // A valid call on the CPU is the composed form.
    let q = Tensor::randn(&[2, 4, 24], 1.0, 3, Device::Cpu).unwrap();
    assert_eq!(
        bits(&q.causal_attention_packed(2).unwrap()),
        bits(&composed(&q, 2))
    );
}

/// On the CPU the packed op gathers each sequence and runs the same per-sequence code as
/// `causal_attention`: the composed form's bits, output and gradient, in the exact (f64) mode
/// and in the fast (f32 SIMD) mode; ragged lengths and several head widths.
#[test]
fn cpu_packed_attention_is_the_composed_form_bit_for_bit() {
    let seed =
        gpu_cuda::testing::test_seed("cpu_packed_attention_is_the_composed_form_bit_for_bit");
    for mode in [gpu_core::cpu::CpuMode::Exact, gpu_core::cpu::CpuMode::Fast] {
        gpu_core::cpu::with_mode(mode, || {
            for (i, (b, t, heads, d)) in [(2, 17, 3, 8), (1, 64, 4, 32), (3, 5, 2, 64)]
                .into_iter()
                .enumerate()
            {
                let c = heads * d;
                let s = seed.wrapping_add(i as u64);
                let qkv = Tensor::randn(&[b, t, 3 * c], 1.0, s, Device::Cpu).unwrap();
                let r = Tensor::randn(&[b, t, c], 1.0, s ^ 7, Device::Cpu).unwrap();
                let (yp, gp) = run(&qkv, &r, heads, true);
                let (yc, gc) = run(&qkv, &r, heads, false);
                let what = format!("{mode:?} b {b} t {t} heads {heads} d {d} (seed {seed})");
                assert_eq!(bits(&yp), bits(&yc), "{what}: output");
                assert_eq!(bits(&gp), bits(&gc), "{what}: gradient");
            }
        });
    }
}

/// Hostile inputs on every device present: a NaN in one head's q, k and v (every row) stays in
/// that head (no other head's output changes by a bit); ±1e30 and ±inf in one head give that
/// head non-finite or saturated values without touching the others; empty batches and empty
/// sequences give empty results and gradients.
#[test]
fn gpu_packed_attention_keeps_heads_apart_and_takes_empty_shapes() {
    let test = "gpu_packed_attention_keeps_heads_apart_and_takes_empty_shapes";
    let seed = gpu_cuda::testing::test_seed(test);
    let mut devices = vec![Device::Cpu];
    devices.extend(gpu(test));
    let (b, t, heads, d) = (2, 19, 3, 8);
    let c = heads * d;
    for dev in devices {
        let clean = Tensor::randn(&[b, t, 3 * c], 1.0, seed, Device::Cpu)
            .unwrap()
            .to_vec()
            .unwrap();
        let base = Tensor::from_vec(clean.clone(), &[b, t, 3 * c], dev)
            .unwrap()
            .causal_attention_packed(heads)
            .unwrap()
            .to_vec()
            .unwrap();
        for bad in [f32::NAN, f32::INFINITY, -f32::INFINITY, 1e30, -1e30] {
            // Head 1 of q, k and v, every row.
            let mut x = clean.clone();
            for row in x.chunks_exact_mut(3 * c) {
                for blk in 0..3 {
                    row[blk * c + d..blk * c + 2 * d].fill(bad);
                }
            }
            let y = Tensor::from_vec(x, &[b, t, 3 * c], dev)
                .unwrap()
                .causal_attention_packed(heads)
                .unwrap()
                .to_vec()
                .unwrap();
            for (i, (got, want)) in y.iter().zip(&base).enumerate() {
                let head = i % c / d;
                if head != 1 {
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{dev} {bad}: entry {i} of head {head}"
                    );
                }
            }
        }
        for shape in [[0, t, 3 * c], [b, 0, 3 * c]] {
            let x = Tensor::zeros(&shape, dev)
                .unwrap()
                .requires_grad_()
                .unwrap();
            let y = x.causal_attention_packed(heads).unwrap();
            assert_eq!(y.shape(), &[shape[0], shape[1], c][..]);
            let g = y.sum_all().unwrap().backward().unwrap();
            assert_eq!(g.get(&x).unwrap().shape(), &shape[..], "{dev}");
        }
    }
}
