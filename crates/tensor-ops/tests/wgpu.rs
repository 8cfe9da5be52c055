//! The tensor layer on wgpu (`Storage::Wgpu`) against the CPU reference: transfers of every
//! dtype, elementwise ops, reductions, matmul, softmax and norm rows, attention, dropout,
//! embedding and cross-entropy forward and backward, a small MLP's backward through the module
//! layer, and AdamW steps. Inputs are random from a seed each test prints (`HYBRID_TEST_SEED`
//! replays it).
//!
//! Bounds: forwards and plain gradients within 1e-5 norm-wise relative (`rel_err`; f32 on wgpu,
//! where the CPU reference accumulates some sums in f64: a few ulps per op); gradients that
//! cancel (norms, attention) elementwise against the size of their cancelling terms
//! (`cancel::check`, as the CUDA tests). Dropout masks are the CPU's bit for bit (the same
//! counter hash), so dropout is held to the same 1e-5.
//!
//! Every test skips with `SKIP <test>: no wgpu adapter (<reason>)` where there is none, and
//! fails instead with `HYBRID_REQUIRE_WGPU=1`.

mod devcmp;
mod optim_hp;

use devcmp::loss_weights;
use gpu_cuda::testing::{cancel, rel_err, test_seed};
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::ops::Range;
use tensor_ops::{Device, Result, Tensor};

/// `Device::Wgpu` of adapter 0, or `None` after printing why the test is skipped.
fn wgpu(test: &str) -> Option<Device> {
    gpu_wgpu::testing::backend_or_skip(test).map(|b| Device::Wgpu(b.info().index))
}

/// The wgpu device, test `test`'s seeded rng and three dimensions drawn from `ranges` (printed
/// as `[names] = [..]`), or `None` after printing why the test is skipped.
fn wgpu_rng_dims(
    test: &str,
    names: &str,
    ranges: [Range<usize>; 3],
) -> Option<(Device, StdRng, [usize; 3])> {
    let dev = wgpu(test)?;
    let mut r = StdRng::seed_from_u64(test_seed(test));
    let dims = ranges.map(|range| r.random_range(range));
    eprintln!("{test}: [{names}] = {dims:?}");
    Some((dev, r, dims))
}

/// `n` values uniform in `[lo, hi)`.
fn uniform(r: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| r.random_range(lo..hi)).collect()
}

type Input = (Vec<f32>, Vec<usize>);

/// Forward within `tol`, and every gradient within `tol`, norm-wise.
fn compare(
    name: &str,
    dev: Device,
    inputs: &[Input],
    tol: f64,
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
) {
    let (gg, gc) = devcmp::compare_forward(name, dev, inputs, tol, f);
    for (i, (a, b)) in gg.iter().zip(&gc).enumerate() {
        match (a, b) {
            (Some(a), Some(b)) => {
                let e = rel_err(a, b);
                assert!(e < tol, "{name}: grad {i} rel err {e:e}");
            }
            (None, None) => {}
            _ => panic!("{name}: grad {i} present on one device only"),
        }
    }
}

/// Forward within `tol`; each gradient elementwise against its cancelling terms.
fn compare_terms(
    name: &str,
    dev: Device,
    inputs: &[Input],
    tol: f64,
    terms: &[Vec<f64>],
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
) {
    let (gg, gc) = devcmp::compare_forward(name, dev, inputs, tol, f);
    for (i, ((a, b), t)) in gg.iter().zip(&gc).zip(terms).enumerate() {
        let (a, b) = (a.as_ref().unwrap(), b.as_ref().unwrap());
        cancel::check(&format!("{name}: grad {i}"), a, b, t);
    }
}

#[test]
fn wgpu_transfers_keep_every_dtype_and_count_copies() {
    const T: &str = "wgpu_transfers_keep_every_dtype_and_count_copies";
    let Some(dev) = wgpu(T) else { return };
    let mut r = StdRng::seed_from_u64(test_seed(T));
    // Odd lengths: bf16/f16 pack two per word, so the last word is half padding.
    for n in [1usize, 7, 1001] {
        let v = uniform(&mut r, n, -3.0, 3.0);
        let t = Tensor::from_vec(v.clone(), &[n], dev).unwrap();
        assert_eq!(t.device(), dev);
        assert_eq!(t.to_vec().unwrap(), v, "f32 round trip, n={n}");
        // bf16: cast on the device (round to nearest even, as the CPU), then moved both ways.
        let bf16 = tensor_ops::DType::BF16;
        let want = Tensor::from_vec(v.clone(), &[n], Device::Cpu)
            .and_then(|c| c.to_dtype(bf16))
            .and_then(|c| c.to_vec())
            .unwrap();
        let got = t.to_dtype(bf16).unwrap();
        assert_eq!(got.dtype(), bf16);
        let host = got.to(Device::Cpu).unwrap();
        assert_eq!(host.dtype(), bf16);
        assert_eq!(got.to_vec().unwrap(), want, "bf16 cast, n={n}");
        let back = host.to(dev).unwrap();
        assert_eq!(back.to_vec().unwrap(), want, "bf16 upload, n={n}");
        // f16 (no f16 compute anywhere): host halves up and back, bits kept.
        let halves: Vec<half::f16> = v.iter().map(|&e| half::f16::from_f32(e)).collect();
        let h = Tensor::from_vec(halves.clone(), &[n], dev).unwrap();
        assert_eq!(h.dtype(), tensor_ops::DType::F16);
        let want: Vec<f32> = halves.iter().map(|e| e.to_f32()).collect();
        assert_eq!(h.to_vec().unwrap(), want, "f16 round trip, n={n}");
        let ids: Vec<u32> = (0..n as u32).map(|i| i.wrapping_mul(2654435761)).collect();
        let u = Tensor::from_vec(ids.clone(), &[n], dev).unwrap();
        assert_eq!(u.to_vec_u32().unwrap(), ids, "u32 round trip, n={n}");
    }
    // One upload in, one download out, counted with their bytes.
    let before = tensor_ops::transfer_stats();
    let t = Tensor::from_vec(vec![1.0f32; 10], &[10], dev).unwrap();
    let s = t.sum_all().unwrap().item().unwrap();
    let after = tensor_ops::transfer_stats();
    assert_eq!(s, 10.0);
    assert_eq!(after.host_to_device - before.host_to_device, 1);
    assert_eq!(after.host_to_device_bytes - before.host_to_device_bytes, 40);
    assert_eq!(after.device_to_host - before.device_to_host, 1);
    assert_eq!(after.device_to_host_bytes - before.device_to_host_bytes, 4);
    // An in-place write from the host reaches every view of the storage.
    let view = t.reshape(&[2, 5]).unwrap();
    let fresh: Vec<f32> = (0..10).map(|i| i as f32 - 4.5).collect();
    t.write_from_host(&fresh).unwrap();
    assert_eq!(view.to_vec().unwrap(), fresh);
    // Mixing devices is a typed error naming both.
    let c = Tensor::ones(&[10], Device::Cpu).unwrap();
    let e = t.add(&c).unwrap_err();
    assert!(
        matches!(e, tensor_ops::GpuError::DeviceMismatch { .. }),
        "{e}"
    );
    // An adapter that does not exist is a typed error, from creation and from `to`.
    let absent = Device::Wgpu(63);
    for e in [
        Tensor::zeros(&[2], absent).unwrap_err(),
        c.to(absent).unwrap_err(),
    ] {
        assert!(matches!(e, tensor_ops::GpuError::WgpuUnavailable(_)), "{e}");
    }
    // Gradients flow back through `to` to the source device.
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3], Device::Cpu)
        .unwrap()
        .requires_grad_()
        .unwrap();
    let y = x
        .to(dev)
        .unwrap()
        .mul(&x.to(dev).unwrap())
        .unwrap()
        .sum_all()
        .unwrap();
    let g = y.backward().unwrap();
    let gx = g.get(&x).unwrap();
    assert_eq!(gx.device(), Device::Cpu);
    assert_eq!(gx.to_vec().unwrap(), vec![2.0, 4.0, 6.0]);
}

#[test]
fn wgpu_elementwise_and_reductions_match_the_cpu() {
    const T: &str = "wgpu_elementwise_and_reductions_match_the_cpu";
    let Some((dev, mut r, [a, b, c])) = wgpu_rng_dims(T, "a, b, c", [1..4, 1..20, 1..40]) else {
        return;
    };
    let mut x = |s: &[usize]| (uniform(&mut r, s.iter().product(), -1.5, 1.5), s.to_vec());
    let (x3, xc, xa1c, xbc, xbc2) = (
        x(&[a, b, c]),
        x(&[c]),
        x(&[a, 1, c]),
        x(&[b, c]),
        x(&[b, c]),
    );
    let pos = (
        xbc.0.iter().map(|v| v.abs() + 0.5).collect::<Vec<_>>(),
        vec![b, c],
    );
    let t = 1e-5;
    compare("add bcast", dev, &[x3.clone(), xc], t, &|v| v[0].add(&v[1]));
    compare("sub bcast", dev, &[x3.clone(), xa1c], t, &|v| {
        v[0].sub(&v[1])
    });
    compare("mul", dev, &[xbc.clone(), xbc2.clone()], t, &|v| {
        v[0].mul(&v[1])
    });
    compare("div", dev, &[xbc2, pos.clone()], t, &|v| v[0].div(&v[1]));
    for op in devcmp::UNARY {
        let inp = if op == "log" { pos.clone() } else { x3.clone() };
        compare(op, dev, &[inp], t, &|v| devcmp::unary(op, &v[0]));
    }
    for ax in [0isize, 1, 2] {
        compare("sum", dev, std::slice::from_ref(&x3), t, &|v| {
            v[0].sum(ax, false)
        });
        compare("mean", dev, std::slice::from_ref(&x3), t, &|v| {
            v[0].mean(ax, true)
        });
        compare("max", dev, std::slice::from_ref(&x3), t, &|v| {
            v[0].max(ax, false)
        });
    }
    compare("permute", dev, std::slice::from_ref(&x3), t, &|v| {
        v[0].permute(&[2, 0, 1])
    });
    compare("narrow", dev, std::slice::from_ref(&x3), t, &|v| {
        v[0].narrow(1, b / 2, b - b / 2)
    });
    compare("cat", dev, &[x3.clone(), x3.clone()], t, &|v| {
        Tensor::cat(&[&v[0], &v[1]], 2)
    });
    let seed = r.random::<u64>();
    compare("dropout", dev, &[x3], t, &|v| {
        v[0].dropout(0.25, seed, true)
    });
}

#[test]
fn wgpu_matmul_rows_and_losses_match_the_cpu() {
    const T: &str = "wgpu_matmul_rows_and_losses_match_the_cpu";
    let Some((dev, mut r, [a, b, c])) = wgpu_rng_dims(T, "a, b, c", [1..4, 1..24, 2..48]) else {
        return;
    };
    let mut x = |s: &[usize]| (uniform(&mut r, s.iter().product(), -1.5, 1.5), s.to_vec());
    let t = 1e-5;
    compare("matmul", dev, &[x(&[a, b, c]), x(&[c, b])], t, &|v| {
        v[0].matmul(&v[1])
    });
    compare("matmul_t", dev, &[x(&[a, c, b]), x(&[a, c, b])], t, &|v| {
        v[0].matmul_t(&v[1], true, false)
    });
    let rows = x(&[a, b, c]);
    compare("softmax", dev, std::slice::from_ref(&rows), t, &|v| {
        v[0].softmax()
    });
    compare("log_softmax", dev, std::slice::from_ref(&rows), t, &|v| {
        v[0].log_softmax()
    });
    let ws = (x(&[c]).0.iter().map(|v| v.abs() + 0.5).collect(), vec![c]);
    let bs = x(&[c]);
    let dy = loss_weights(a * b * c);
    compare_terms(
        "layer_norm",
        dev,
        &[rows.clone(), ws.clone(), bs],
        t,
        &cancel::norm(&rows.0, &ws.0, &dy, c, true),
        &|v| v[0].layer_norm(&v[1], &v[2], 1e-5),
    );
    compare_terms(
        "rms_norm",
        dev,
        &[rows.clone(), ws.clone()],
        t,
        &cancel::norm(&rows.0, &ws.0, &dy, c, false),
        &|v| v[0].rms_norm(&v[1], 1e-5),
    );
    let d = 4 * c.div_ceil(4).min(16);
    let (q, k, v) = (x(&[a, 2, b, d]), x(&[a, 2, b, d]), x(&[a, 2, b, d]));
    let dout = loss_weights(a * 2 * b * d);
    let scale = 1.0 / (d as f64).sqrt();
    compare_terms(
        "causal_attention",
        dev,
        &[q.clone(), k.clone(), v.clone()],
        t,
        &cancel::attention((&q.0, &k.0, &v.0, &dout), [a * 2, b, d], scale),
        &|v| Tensor::causal_attention(&v[0], &v[1], &v[2]),
    );
    let logits = x(&[a * b, c]);
    let table = x(&[c, 8]);
    let targets: Vec<u32> = (0..a * b).map(|_| r.random_range(0..c as u32)).collect();
    let ids: Vec<u32> = (0..a * b).map(|_| r.random_range(0..c as u32)).collect();
    let on = |ids: &[u32], shape: &[usize], d| Tensor::from_vec(ids.to_vec(), shape, d).unwrap();
    let (tc, tg) = (
        on(&targets, &[a * b], Device::Cpu),
        on(&targets, &[a * b], dev),
    );
    let (ic, ig) = (on(&ids, &[a, b], Device::Cpu), on(&ids, &[a, b], dev));
    let pick = move |d: Device, cpu: &Tensor, gpu: &Tensor| {
        if d == Device::Cpu {
            cpu.clone()
        } else {
            gpu.clone()
        }
    };
    compare("cross_entropy", dev, &[logits], t, &|v| {
        v[0].cross_entropy(&pick(v[0].device(), &tc, &tg))
    });
    compare("embedding", dev, &[table], t, &|v| {
        v[0].embedding(&pick(v[0].device(), &ic, &ig))
    });
    // An id past the table is a typed error on wgpu too, not a wrong read: checked on the
    // device, reported by the next read (its row NaN meanwhile, as on CUDA).
    let bad = Tensor::from_vec(vec![c as u32], &[1], dev).unwrap();
    let table = Tensor::zeros(&[c, 8], dev).unwrap();
    let e = table.embedding(&bad).and_then(|x| x.to_vec()).unwrap_err();
    assert!(
        matches!(e, tensor_ops::GpuError::IndexOutOfRange { .. }),
        "{e}"
    );
}

/// `Linear` under bf16 autocast (bf16 operands, f32 accumulation, a bf16 result; f32 master
/// weights whose gradients come back f32 through the casts), then a scalar `affine` of the bf16
/// result, against the CPU's reference of the same roundings. Bound: 2⁻⁷ norm-wise relative, two bf16 ulps (both round the same products,
/// summed in different orders, so an output may land on the neighbouring bf16 value; the
/// backward's matmuls round again).
#[test]
fn wgpu_bf16_autocast_linear_matches_the_cpu() {
    const T: &str = "wgpu_bf16_autocast_linear_matches_the_cpu";
    let Some((dev, mut r, [n, din, dout])) = wgpu_rng_dims(T, "n, in, out", [1..20, 1..40, 1..30])
    else {
        return;
    };
    let mut x = |s: &[usize]| (uniform(&mut r, s.iter().product(), -1.5, 1.5), s.to_vec());
    let inputs = [x(&[n, din]), x(&[dout, din]), x(&[dout])];
    let bf16 = tensor_ops::Precision::Bf16;
    compare("bf16 linear", dev, &inputs, 1.0 / 128.0, &|v| {
        let y = tensor_ops::autocast(bf16, || v[0].linear(&v[1], Some(&v[2])))?;
        assert_eq!(y.dtype(), tensor_ops::DType::BF16);
        // A scalar op on the bf16 result stays bf16 (gpu-core's default `affine` widens it).
        let y = y.affine(1.5, -0.25)?;
        assert_eq!(y.dtype(), tensor_ops::DType::BF16);
        y.to_dtype(tensor_ops::DType::F32)
    });
}

/// A two-layer MLP (`Linear`, GELU, `LayerNorm`, `Linear`, cross-entropy) on `dev`, built from
/// `seed` (inits are drawn on the host: the same values on every device).
struct Mlp {
    store: tensor_ops::nn::ParamStore,
    l1: tensor_ops::nn::Linear,
    norm: tensor_ops::nn::LayerNorm,
    l2: tensor_ops::nn::Linear,
}

impl Mlp {
    fn new(dev: Device, seed: u64, dims: [usize; 3]) -> Mlp {
        use tensor_ops::nn::{LayerNorm, Linear, ParamStore};
        let store = ParamStore::new(dev, seed);
        let l1 = Linear::new(store.pp("l1"), dims[0], dims[1], true).unwrap();
        let norm = LayerNorm::new(store.pp("norm"), dims[1], 1e-5, true).unwrap();
        let l2 = Linear::new(store.pp("l2"), dims[1], dims[2], true).unwrap();
        Mlp {
            store,
            l1,
            norm,
            l2,
        }
    }

    fn loss(&self, x: &Tensor, y: &Tensor) -> Result<Tensor> {
        use tensor_ops::nn::Module;
        let h = self.norm.forward(&self.l1.forward(x)?.gelu()?)?;
        self.l2.forward(&h)?.cross_entropy(y)
    }
}

/// One parameter after training: name, first step's gradient, initial and final values.
struct ParamRun {
    name: String,
    grad: Vec<f32>,
    init: Vec<f32>,
    fin: Vec<f32>,
}

/// An optimizer over a store (global-norm clipping at 1 in each, so the clip runs too) and
/// the learning rate it steps with.
type Make = fn(&tensor_ops::nn::ParamStore) -> Box<dyn tensor_ops::optim::Optimizer>;

fn optimizers() -> [(&'static str, Make, f32); 3] {
    [
        (
            "AdamW",
            |s| Box::new(s.adamw(optim_hp::adamw()).unwrap()),
            1e-2,
        ),
        (
            "Schedule-Free AdamW",
            |s| Box::new(s.schedule_free_adamw(optim_hp::schedule_free()).unwrap()),
            1e-2,
        ),
        (
            "Prodigy",
            |s| Box::new(s.prodigy(optim_hp::prodigy()).unwrap()),
            1.0,
        ),
    ]
}

/// The losses of [`STEPS`] steps of `make`'s optimizer on the MLP, and every parameter.
fn train_mlp(dev: Device, data: &MlpData, (make, lr): (Make, f32)) -> (Vec<f32>, Vec<ParamRun>) {
    let [n, din, hidden, classes] = data.dims;
    let m = Mlp::new(dev, data.seed, [din, hidden, classes]);
    let params = m.store.params();
    let init: Vec<Vec<f32>> = params
        .iter()
        .map(|p| p.tensor().to_vec().unwrap())
        .collect();
    let mut opt = make(&m.store);
    let xt = Tensor::from_vec(data.x.clone(), &[n, din], dev).unwrap();
    let yt = Tensor::from_vec(data.y.clone(), &[n], dev).unwrap();
    let (mut losses, mut grads) = (Vec::new(), Vec::new());
    for step in 0..STEPS {
        let loss = m.loss(&xt, &yt).unwrap();
        losses.push(loss.item().unwrap());
        let g = loss.backward().unwrap();
        if step == 0 {
            for p in &params {
                grads.push(g.get(p.tensor()).unwrap().to_vec().unwrap());
            }
        }
        opt.step(&g, lr).unwrap();
    }
    let runs = params
        .iter()
        .zip(grads.into_iter().zip(init))
        .map(|(p, (grad, init))| ParamRun {
            name: p.name().to_string(),
            grad,
            init,
            fin: p.tensor().to_vec().unwrap(),
        })
        .collect();
    (losses, runs)
}

/// Steps taken by each optimizer.
const STEPS: usize = 3;

/// The MLP's seed, dims `[n, in, hidden, classes]`, inputs and targets.
struct MlpData {
    seed: u64,
    dims: [usize; 4],
    x: Vec<f32>,
    y: Vec<u32>,
}

/// Bounds: losses and first gradients within 1e-5 norm-wise relative (f32 against the CPU's
/// f64 sums); parameters after three steps within `1e-5·scale + 1e-2·max|Δ|` per element,
/// `max|Δ|` the largest distance any element of that parameter moved on the CPU (Adam-type
/// optimizers normalise each gradient entry, so an entry with a tiny gradient moves by a full
/// step times its relative error: 1% of a step allowed, as `models`' primitives-only GPT test).
#[test]
fn wgpu_mlp_backward_and_optimizer_steps_match_the_cpu() {
    const T: &str = "wgpu_mlp_backward_and_optimizer_steps_match_the_cpu";
    let Some(dev) = wgpu(T) else { return };
    let seed = test_seed(T);
    let mut r = StdRng::seed_from_u64(seed);
    let dims = [
        r.random_range(4..17),
        r.random_range(3..20),
        r.random_range(8..40),
        5,
    ];
    eprintln!("{T}: [n, in, hidden, classes] = {dims:?}");
    let x = uniform(&mut r, dims[0] * dims[1], -2.0, 2.0);
    let y = (0..dims[0])
        .map(|_| r.random_range(0..dims[3] as u32))
        .collect();
    let data = MlpData { seed, dims, x, y };
    for (opt, make, lr) in optimizers() {
        let (lc, pc) = train_mlp(Device::Cpu, &data, (make, lr));
        let (lg, pg) = train_mlp(dev, &data, (make, lr));
        eprintln!("{T}: {opt}: losses {lg:?} (cpu {lc:?})");
        let e = rel_err(&lg, &lc);
        assert!(e < 1e-5, "{opt}: losses {lg:?} vs {lc:?}: rel err {e:e}");
        assert_eq!(pg.len(), 6);
        for (g, c) in pg.iter().zip(&pc) {
            let name = &c.name;
            let e = rel_err(&g.grad, &c.grad);
            assert!(e < 1e-5, "{opt} {name}: first gradient rel err {e:e}");
            let scale = c.fin.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
            let moved = c
                .fin
                .iter()
                .zip(&c.init)
                .fold(0f32, |m, (f, i)| m.max((f - i).abs()));
            assert!(moved > 0.0, "{opt} {name}: the CPU's steps moved it");
            for (i, (a, b)) in g.fin.iter().zip(&c.fin).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 * scale + 1e-2 * moved,
                    "{opt} {name}[{i}] after {STEPS} steps: {a} vs {b}"
                );
            }
        }
    }
}
