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
    let seed: u64 = rand::random();
    eprintln!("{test}: seed {seed}");
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
    let seed: u64 = rand::random();
    eprintln!("cpu_packed_attention_is_the_composed_form_bit_for_bit: seed {seed}");
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
