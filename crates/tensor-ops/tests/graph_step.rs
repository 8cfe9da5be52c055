//! CUDA graphs of tensor code (`tensor_ops::graph`): dropout ops under device offsets take
//! them in order, `write_from_host` writes in place, and the CPU refuses graphs and device
//! offsets with a typed error (the captured GPT step's tests are `models`' `graph_step.rs`).
//! Tests named `gpu_*` skip with a printed reason where no GPU exists.

use gpu_cuda::testing::gpu_device_or_skip as gpu;
use rand::{rngs::StdRng, Rng, SeedableRng};
use tensor_ops::graph::{capture, with_dropout_offsets};
use tensor_ops::{Device, Tensor};

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec().unwrap().iter().map(|v| v.to_bits()).collect()
}

/// Under `with_dropout_offsets` the k-th training-mode dropout op (p = 0 included, evaluation
/// mode not) adds the k-th offset to its seed, forward and backward; one op more than the
/// offsets is a typed error.
#[test]
fn gpu_dropout_ops_take_their_offsets_in_order() {
    let test = "gpu_dropout_ops_take_their_offsets_in_order";
    let Some(dev) = gpu(test) else {
        return;
    };
    let seed = gpu_cuda::testing::test_seed(test);
    let mut r = StdRng::seed_from_u64(seed);
    let x = Tensor::randn(&[1000], 1.0, seed, dev)
        .unwrap()
        .requires_grad_()
        .unwrap();
    let (o0, o1): (u64, u64) = (r.random(), r.random());
    let words = vec![o0 as u32, (o0 >> 32) as u32, o1 as u32, (o1 >> 32) as u32];
    let offsets = Tensor::from_vec(words, &[4], dev).unwrap();
    let (a, c) = with_dropout_offsets(&offsets, || {
        let e = x.dropout(0.5, 99, false).unwrap(); // evaluation: takes no entry
                                                    // Refused ops take no entry either: a u32 input, and an input on the CPU.
        let ids = Tensor::from_vec(vec![1u32; 4], &[4], dev).unwrap();
        assert!(ids.dropout(0.5, 1, true).is_err());
        let host = Tensor::ones(&[4], Device::Cpu).unwrap();
        assert!(host.dropout(0.5, 1, true).is_err());
        let a = x.dropout(0.5, 10, true).unwrap(); // entry 0
        let _ = x.dropout(0.0, 11, true).unwrap(); // entry 1
        let c = x.dropout(0.5, 12, true).unwrap_err(); // none left
        (a.add(&e).unwrap(), c)
    })
    .unwrap();
    assert!(c.to_string().contains("dropout"), "{c}");
    let want = x
        .dropout(0.5, 10u64.wrapping_add(o0), true)
        .unwrap()
        .add(&x)
        .unwrap();
    assert_eq!(bits(&a), bits(&want));
    let (ga, gw) = (
        a.sum_all().unwrap().backward().unwrap(),
        want.sum_all().unwrap().backward().unwrap(),
    );
    assert_eq!(bits(ga.get(&x).unwrap()), bits(gw.get(&x).unwrap()));
}

#[test]
fn graphs_and_device_offsets_are_refused_on_the_cpu() {
    let e = capture(Device::Cpu, || Ok(())).unwrap_err();
    assert!(e.to_string().contains("CUDA"), "{e}");
    let off = Tensor::from_vec(vec![0u32; 2], &[2], Device::Cpu).unwrap();
    let e = with_dropout_offsets(&off, || ()).unwrap_err();
    assert!(e.to_string().contains("CUDA"), "{e}");
    let odd = Tensor::from_vec(vec![0u32; 3], &[3], Device::Cpu).unwrap();
    assert!(with_dropout_offsets(&odd, || ()).is_err());
}

/// `write_from_host` overwrites in place (every handle sees it) and refuses a wrong length or
/// dtype without writing.
#[test]
fn write_from_host_overwrites_in_place_or_refuses() {
    let t = Tensor::from_vec(vec![1u32, 2, 3], &[3], Device::Cpu).unwrap();
    let alias = t.clone();
    t.write_from_host(&[7u32, 8, 9]).unwrap();
    assert_eq!(alias.to_vec_u32().unwrap(), vec![7, 8, 9]);
    assert!(t.write_from_host(&[1u32, 2]).is_err());
    assert!(t.write_from_host(&[1.0f32, 2.0, 3.0]).is_err());
    let empty = Tensor::from_vec(Vec::<u32>::new(), &[0], Device::Cpu).unwrap();
    empty.write_from_host::<u32>(&[]).unwrap();
    assert!(empty.write_from_host(&[1u32]).is_err());
    assert_eq!(t.to_vec_u32().unwrap(), vec![7, 8, 9]);
    let w = Tensor::ones(&[2], Device::Cpu)
        .unwrap()
        .requires_grad_()
        .unwrap();
    let y = w.mul_scalar(2.0).unwrap();
    assert!(y.write_from_host(&[0.0f32, 0.0]).is_err());
}
