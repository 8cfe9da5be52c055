//! The module layer on CUDA against the CPU reference: every layer's forward and gradients
//! (the GRU cell over two steps), and the parameter store's init, snapshots (device-side: no
//! host transfer) and checkpoints across devices. Tests named `gpu_*` skip with a printed reason
//! where no GPU exists.

use rand::{rngs::StdRng, Rng, SeedableRng};
use tensor_ops::nn::{
    Dropout, Embedding, LayerNorm, Linear, Mode, Module, ModuleT, ParamStore, RmsNorm,
};
use tensor_ops::optim::AdamWParams;
use tensor_ops::{transfer_stats, Device, Result, Tensor};

mod devcmp;

use gpu_cuda::testing::{gpu_device_or_skip as gpu, rel_err};

type Inputs = Vec<(Vec<f32>, Vec<usize>)>;

/// Runs `f` on CPU and on `dev` leaves from the same data; compares the outputs (norm-wise
/// `tol`) and the gradients of ⟨f(x), R⟩ for a fixed R (10·`tol`; every leaf must get one).
fn compare(
    name: &str,
    dev: Device,
    inputs: &Inputs,
    tol: f64,
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
) {
    let (gg, gc) = devcmp::compare_forward(name, dev, inputs, tol, f);
    for (i, (a, b)) in gg.iter().zip(&gc).enumerate() {
        let (a, b) = (a.as_ref().unwrap(), b.as_ref().unwrap());
        let e = rel_err(a, b);
        assert!(e < 10.0 * tol, "{name}: gradient {i} rel err {e:e}");
    }
}

#[test]
fn gpu_modules_match_the_cpu() {
    let test = "gpu_modules_match_the_cpu";
    let Some(dev) = gpu(test) else {
        return;
    };
    let mut r = StdRng::seed_from_u64(gpu_cuda::testing::test_seed(test));
    let mut u = |s: &[usize], k: f32| {
        (
            (0..s.iter().product())
                .map(|_| r.random_range(-k..k))
                .collect(),
            s.to_vec(),
        )
    };
    let (inp, hid, batch) = (24, 32, 16);
    let gru: Inputs = devcmp::gru_leaves(&mut u, (batch, inp, hid), (1.5, 1.0, 0.2, 0.2));
    compare("gru_cell x3", dev, &gru, 1e-5, &|t| {
        let cell = devcmp::gru_cell(t)?;
        let h1 = cell.forward(&t[0], &t[1])?;
        let h2 = cell.forward(&t[0].tanh()?, &h1)?;
        let h3 = cell.forward(&t[0].mul_scalar(-0.5)?, &h2)?;
        Tensor::cat(&[&h1, &h2, &h3], 0)
    });
    let lin: Inputs = vec![u(&[4, 7, 48], 1.0), u(&[40, 48], 0.3), u(&[40], 0.3)];
    compare("linear", dev, &lin, 1e-5, &|t| {
        Linear::from_tensors(t[1].clone(), Some(t[2].clone()))?.forward(&t[0])
    });
    let norm: Inputs = vec![u(&[6, 10, 40], 2.0), u(&[40], 1.0), u(&[40], 0.5)];
    compare("layer_norm", dev, &norm, 1e-5, &|t| {
        LayerNorm::from_tensors(t[1].clone(), Some(t[2].clone()), 1e-5)?.forward(&t[0])
    });
    compare("rms_norm", dev, &norm[..2].to_vec(), 1e-5, &|t| {
        RmsNorm::from_tensor(t[1].clone(), 1e-5)?.forward(&t[0])
    });
    let ids: Vec<u32> = (0..60).map(|i| (i * 37 % 23) as u32).collect();
    let (ic, ig) = (
        Tensor::from_vec(ids.clone(), &[6, 10], Device::Cpu).unwrap(),
        Tensor::from_vec(ids, &[6, 10], dev).unwrap(),
    );
    compare("embedding", dev, &vec![u(&[23, 16], 1.0)], 1e-6, &|t| {
        let ids = if t[0].device() == Device::Cpu {
            &ic
        } else {
            &ig
        };
        Embedding::from_tensor(t[0].clone())?.forward(ids)
    });
    compare("dropout", dev, &vec![u(&[8, 100], 1.0)], 1e-6, &|t| {
        Dropout::new(0.3)?.forward_t(&t[0], Mode::train(5).fork(2))
    });
}

/// An encoder and a GRU cell, as the RSSM will register them.
fn model(store: &ParamStore) {
    store.pp("encoder").linear(32, 64, true).unwrap();
    store.pp("encoder_norm").layer_norm(64, 1e-5, true).unwrap();
    store.pp("gru").gru_cell(64, 48).unwrap();
}

fn bits(store: &ParamStore) -> Vec<Vec<u32>> {
    store
        .params()
        .iter()
        .map(|p| {
            p.tensor()
                .to_vec()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        })
        .collect()
}

#[test]
fn gpu_store_init_snapshots_and_checkpoints() {
    let Some(dev) = gpu("gpu_store_init_snapshots_and_checkpoints") else {
        return;
    };
    let (sg, sc) = (ParamStore::new(dev, 21), ParamStore::new(Device::Cpu, 21));
    model(&sg);
    model(&sc);
    assert_eq!(
        bits(&sg),
        bits(&sc),
        "a seed gives the same values on every device"
    );
    let start = bits(&sg);
    let mut opt = sg.adamw(AdamWParams::default()).unwrap();
    let step = |opt: &mut tensor_ops::optim::AdamW| {
        let loss = devcmp::sum_of_squares(&sg);
        opt.step(&loss.backward().unwrap(), 0.01).unwrap();
    };
    let before = transfer_stats();
    let snap = sg.snapshot().unwrap();
    step(&mut opt);
    sg.restore(&snap).unwrap();
    let after = transfer_stats();
    assert_eq!(
        after.host_to_device, before.host_to_device,
        "snapshot/restore upload nothing"
    );
    assert_eq!(
        after.device_to_host, before.device_to_host,
        "snapshot/restore download nothing"
    );
    assert_eq!(bits(&sg), start, "restored bit for bit");
    step(&mut opt);
    assert_ne!(
        bits(&sg),
        start,
        "the optimiser still trains the restored tensors"
    );
    // Checkpoints move between devices.
    let path = std::env::temp_dir().join(format!("gpu-store-{}.safetensors", std::process::id()));
    sg.save(&path).unwrap();
    let trained = bits(&sg);
    sc.load(&path).unwrap();
    assert_eq!(bits(&sc), trained, "GPU file into a CPU store");
    sg.restore(&snap).unwrap();
    sg.load(&path).unwrap();
    assert_eq!(bits(&sg), trained, "file back into the GPU store");
    std::fs::remove_file(&path).ok();
    let cpu_snap = sc.snapshot().unwrap();
    assert!(
        sg.restore(&cpu_snap).is_err(),
        "a snapshot on another device is an error"
    );
}
