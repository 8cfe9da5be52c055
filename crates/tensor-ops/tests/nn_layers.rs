//! The module layer's layers on the CPU: forwards against host formulas in f64 (the GRU cell
//! against PyTorch's `nn.GRUCell` equations), PyTorch's inits, typed errors for bad input, dropout
//! modes, and every layer's gradient against central finite differences.
//!
//! Random inputs come from a seed each test prints (`HYBRID_TEST_SEED` replays it).

mod devcmp;
mod finite_diff;

use finite_diff::gradcheck;
use rand::{rngs::StdRng, Rng, SeedableRng};
use tensor_ops::nn::{
    Dropout, Embedding, GruCell, Init, LayerNorm, Linear, Mode, Module, ModuleT, ParamStore,
    RmsNorm,
};
use tensor_ops::{Device, GpuError, Tensor};

const CPU: Device = Device::Cpu;

fn rng(test: &str) -> StdRng {
    StdRng::seed_from_u64(gpu_cuda::testing::test_seed(test))
}

fn uniform(r: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| r.random_range(lo..hi)).collect()
}

fn tensor(v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape, CPU).unwrap()
}

fn assert_close(what: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (*g as f64 - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

#[test]
fn linear_has_pytorch_layout_init_and_forward() {
    let store = ParamStore::new(CPU, 1);
    let fc = store.pp("fc").linear(5, 3, true).unwrap();
    let plain = store.pp("plain").linear(5, 3, false).unwrap();
    assert_eq!(store.names(), ["fc.weight", "fc.bias", "plain.weight"]);
    assert_eq!(fc.weight().shape(), [3, 5]);
    assert_eq!(fc.bias().unwrap().shape(), [3]);
    assert!(plain.bias().is_none());
    let k = 1.0 / 5f32.sqrt();
    let (w, b) = (
        fc.weight().to_vec().unwrap(),
        fc.bias().unwrap().to_vec().unwrap(),
    );
    assert!(
        w.iter().chain(&b).all(|v| (-k..k).contains(v)),
        "U(-1/sqrt(in), 1/sqrt(in))"
    );
    assert!(w.iter().any(|v| v.abs() > k / 2.0), "not all near 0: {w:?}");
    let mut r = rng("linear_has_pytorch_layout_init_and_forward");
    let x = uniform(&mut r, 2 * 5, -1.0, 1.0);
    let want: Vec<f64> = (0..2)
        .flat_map(|i| {
            let (x, w, b) = (&x, &w, &b);
            (0..3).map(move |o| {
                b[o] as f64
                    + (0..5)
                        .map(|j| x[i * 5 + j] as f64 * w[o * 5 + j] as f64)
                        .sum::<f64>()
            })
        })
        .collect();
    let y = fc.forward(&tensor(&x, &[2, 5])).unwrap();
    assert_eq!(y.shape(), [2, 3]);
    assert_close("linear", &y.to_vec().unwrap(), &want, 1e-6);
    let y1 = fc.forward(&tensor(&x[5..], &[5])).unwrap();
    assert_eq!(y1.shape(), [3]);
    assert_close("linear 1-D", &y1.to_vec().unwrap(), &want[3..], 1e-6);
    let err = fc.forward(&tensor(&x[..8], &[2, 4])).unwrap_err();
    assert!(
        matches!(err, GpuError::ShapeMismatch { op: "Linear", .. }),
        "{err}"
    );
    assert!(store.pp("zero").linear(0, 3, true).is_err());
    let bad = Linear::from_tensors(tensor(&w, &[3, 5]), Some(tensor(&b[..2], &[2])));
    assert!(matches!(bad, Err(GpuError::ShapeMismatch { .. })));
}

#[test]
fn norms_and_embedding_match_host_formulas() {
    let mut r = rng("norms_and_embedding_match_host_formulas");
    let store = ParamStore::new(CPU, 2);
    let ln = store.pp("ln").layer_norm(4, 1e-5, true).unwrap();
    let ln_nb = store.pp("ln_nb").layer_norm(4, 1e-5, false).unwrap();
    let rms = store.pp("rms").rms_norm(4, 1e-5).unwrap();
    let emb = store.pp("emb").embedding(6, 4).unwrap();
    assert_eq!(
        store.names(),
        [
            "ln.weight",
            "ln.bias",
            "ln_nb.weight",
            "rms.weight",
            "emb.weight"
        ]
    );
    assert_eq!(ln.weight().to_vec().unwrap(), [1.0; 4]);
    assert_eq!(ln.bias().unwrap().to_vec().unwrap(), [0.0; 4]);
    let x = uniform(&mut r, 3 * 4, -2.0, 2.0);
    let (mut want_ln, mut want_rms) = (Vec::new(), Vec::new());
    for row in x.chunks(4) {
        let row: Vec<f64> = row.iter().map(|v| *v as f64).collect();
        let mean = row.iter().sum::<f64>() / 4.0;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 4.0;
        want_ln.extend(row.iter().map(|v| (v - mean) / (var + 1e-5).sqrt()));
        let ms = row.iter().map(|v| v * v).sum::<f64>() / 4.0;
        want_rms.extend(row.iter().map(|v| v / (ms + 1e-5).sqrt()));
    }
    let xt = tensor(&x, &[3, 4]);
    assert_close(
        "layer_norm",
        &ln.forward(&xt).unwrap().to_vec().unwrap(),
        &want_ln,
        1e-5,
    );
    assert_close(
        "layer_norm no bias",
        &ln_nb.forward(&xt).unwrap().to_vec().unwrap(),
        &want_ln,
        1e-5,
    );
    assert_close(
        "rms_norm",
        &rms.forward(&xt).unwrap().to_vec().unwrap(),
        &want_rms,
        1e-5,
    );
    let ids = Tensor::from_vec(vec![5u32, 0, 5], &[3], CPU).unwrap();
    let table = emb.weight().to_vec().unwrap();
    let want: Vec<f64> = [5, 0, 5]
        .iter()
        .flat_map(|&i| table[i * 4..i * 4 + 4].iter().map(|v| *v as f64))
        .collect();
    assert_close(
        "embedding",
        &emb.forward(&ids).unwrap().to_vec().unwrap(),
        &want,
        0.0,
    );
    for bad in [
        ln.forward(&tensor(&x, &[4, 3])),
        rms.forward(&tensor(&x, &[2, 6])),
        store.pp("e").layer_norm(4, 0.0, true).map(|_| xt.clone()),
        store.pp("e").rms_norm(4, f32::NAN).map(|_| xt.clone()),
        store.pp("e").embedding(0, 4).map(|_| xt.clone()),
    ] {
        assert!(bad.is_err());
    }
    assert!(
        LayerNorm::from_tensors(tensor(&[1.0; 4], &[4]), Some(tensor(&[0.0; 3], &[3])), 1e-5)
            .is_err()
    );
    assert!(RmsNorm::from_tensor(tensor(&[1.0; 4], &[2, 2]), 1e-5).is_err());
    assert!(Embedding::from_tensor(tensor(&[1.0; 4], &[4])).is_err());
}

#[test]
fn dropout_is_the_identity_in_eval_and_a_seeded_mask_in_training() {
    let mut r = rng("dropout_is_the_identity_in_eval_and_a_seeded_mask_in_training");
    let x = tensor(&uniform(&mut r, 4000, 0.5, 1.5), &[40, 100]);
    let d = Dropout::new(0.25).unwrap();
    let xs = x.to_vec().unwrap();
    assert_eq!(d.forward_t(&x, Mode::Eval).unwrap().to_vec().unwrap(), xs);
    let a = d.forward_t(&x, Mode::train(7)).unwrap().to_vec().unwrap();
    let b = d.forward_t(&x, Mode::train(7)).unwrap().to_vec().unwrap();
    let c = d.forward_t(&x, Mode::train(8)).unwrap().to_vec().unwrap();
    assert_eq!(a, b, "same seed, same mask");
    assert_ne!(a, c, "another seed, another mask");
    let dropped = a.iter().filter(|v| **v == 0.0).count() as f64 / 4000.0;
    assert!((dropped - 0.25).abs() < 0.03, "dropped {dropped}");
    for (y, x) in a.iter().zip(&xs) {
        assert!(
            *y == 0.0 || (y - x / 0.75).abs() < 1e-6,
            "kept values scale by 1/(1-p)"
        );
    }
    // fork: distinct seeds per site, stable for a seed, evaluation stays evaluation.
    let m = Mode::train(7);
    assert_ne!(m.fork(0), m.fork(1));
    assert_ne!(m.fork(0), m);
    assert_eq!(m.fork(3), Mode::train(7).fork(3));
    assert_eq!(Mode::Eval.fork(3), Mode::Eval);
    assert!(m.is_train() && !Mode::Eval.is_train());
    for p in [-0.1, 1.0, f32::NAN] {
        assert!(Dropout::new(p).is_err(), "p = {p}");
    }
    // A Module is a ModuleT that ignores the mode.
    let store = ParamStore::new(CPU, 3);
    let fc = store.root().linear(100, 2, true).unwrap();
    let (e, t) = (
        fc.forward_t(&x, Mode::Eval).unwrap(),
        fc.forward_t(&x, Mode::train(1)).unwrap(),
    );
    assert_eq!(e.to_vec().unwrap(), t.to_vec().unwrap());
}

/// PyTorch's `nn.GRUCell` equations on the host in f64: input and state `(x, h)`, weights
/// `(wi, wh)`, biases `(bi, bh)`, sizes `(inp, hid)`.
fn gru_reference(
    (x, h): (&[f32], &[f32]),
    (wi, wh): (&[f32], &[f32]),
    (bi, bh): (&[f32], &[f32]),
    (inp, hid): (usize, usize),
) -> Vec<f64> {
    let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
    let batch = h.len() / hid;
    let mut out = Vec::new();
    for b in 0..batch {
        let (x, h) = (&x[b * inp..][..inp], &h[b * hid..][..hid]);
        let gate = |w: &[f32], v: &[f32], bias: &[f32], row: usize, n: usize| -> f64 {
            bias[row] as f64
                + (0..n)
                    .map(|j| w[row * n + j] as f64 * v[j] as f64)
                    .sum::<f64>()
        };
        for k in 0..hid {
            let r = sig(gate(wi, x, bi, k, inp) + gate(wh, h, bh, k, hid));
            let z = sig(gate(wi, x, bi, hid + k, inp) + gate(wh, h, bh, hid + k, hid));
            let n =
                (gate(wi, x, bi, 2 * hid + k, inp) + r * gate(wh, h, bh, 2 * hid + k, hid)).tanh();
            out.push((1.0 - z) * n + z * h[k] as f64);
        }
    }
    out
}

#[test]
fn gru_cell_follows_the_pytorch_equations() {
    let mut r = rng("gru_cell_follows_the_pytorch_equations");
    let (inp, hid, batch) = (5, 4, 3);
    let store = ParamStore::new(CPU, 4);
    let cell = store.pp("rnn").gru_cell(inp, hid).unwrap();
    assert_eq!(
        store.names(),
        [
            "rnn.weight_ih",
            "rnn.weight_hh",
            "rnn.bias_ih",
            "rnn.bias_hh"
        ]
    );
    assert_eq!(cell.weight_ih().shape(), [3 * hid, inp]);
    assert_eq!(cell.weight_hh().shape(), [3 * hid, hid]);
    assert_eq!((cell.input_size(), cell.hidden_size()), (inp, hid));
    let k = 0.5; // 1/sqrt(H)
    let vals: Vec<Vec<f32>> = [
        cell.weight_ih(),
        cell.weight_hh(),
        cell.bias_ih().unwrap(),
        cell.bias_hh().unwrap(),
    ]
    .iter()
    .map(|t| t.to_vec().unwrap())
    .collect();
    assert!(
        vals.iter().flatten().all(|v| (-k..k).contains(v)),
        "U(-1/sqrt(H), 1/sqrt(H))"
    );
    let x = uniform(&mut r, batch * inp, -2.0, 2.0);
    let h = uniform(&mut r, batch * hid, -1.0, 1.0);
    let want = gru_reference(
        (&x, &h),
        (&vals[0], &vals[1]),
        (&vals[2], &vals[3]),
        (inp, hid),
    );
    let got = cell
        .forward(&tensor(&x, &[batch, inp]), &tensor(&h, &[batch, hid]))
        .unwrap();
    assert_eq!(got.shape(), [batch, hid]);
    assert_close("gru", &got.to_vec().unwrap(), &want, 1e-6);
    // One sample without a batch dim, and leading dims beyond one.
    let one = cell
        .forward(&tensor(&x[..inp], &[inp]), &tensor(&h[..hid], &[hid]))
        .unwrap();
    assert_close("gru 1-D", &one.to_vec().unwrap(), &want[..hid], 1e-6);
    let x3 = tensor(&[x.clone(), x.clone()].concat(), &[2, batch, inp]);
    let h3 = tensor(&[h.clone(), h.clone()].concat(), &[2, batch, hid]);
    let y3 = cell.forward(&x3, &h3).unwrap();
    assert_close(
        "gru 3-D",
        &y3.to_vec().unwrap(),
        &[want.clone(), want].concat(),
        1e-6,
    );
    // Without biases.
    let nb = GruCell::new(store.pp("nb"), inp, hid, false).unwrap();
    let zeros = vec![0.0; 3 * hid];
    let (wi, wh) = (
        nb.weight_ih().to_vec().unwrap(),
        nb.weight_hh().to_vec().unwrap(),
    );
    let want = gru_reference((&x, &h), (&wi, &wh), (&zeros, &zeros), (inp, hid));
    let got = nb
        .forward(&tensor(&x, &[batch, inp]), &tensor(&h, &[batch, hid]))
        .unwrap();
    assert_close("gru without biases", &got.to_vec().unwrap(), &want, 1e-6);
    assert_eq!(
        nb.zero_state(2).unwrap().to_vec().unwrap(),
        vec![0.0; 2 * hid]
    );
}

#[test]
fn gru_cell_rejects_bad_shapes_with_typed_errors() {
    let store = ParamStore::new(CPU, 5);
    let cell = store.root().gru_cell(3, 2).unwrap();
    let shape_err = |x: &[usize], h: &[usize]| {
        let xt = Tensor::zeros(x, CPU).unwrap();
        let ht = Tensor::zeros(h, CPU).unwrap();
        match cell.forward(&xt, &ht) {
            Err(GpuError::ShapeMismatch {
                op: "GruCell::forward",
                ..
            }) => {}
            other => panic!("x {x:?}, h {h:?}: {other:?}"),
        }
    };
    shape_err(&[4, 2], &[4, 2]); // wrong input width
    shape_err(&[4, 3], &[4, 3]); // wrong hidden width
    shape_err(&[4, 3], &[5, 2]); // batch differs
    shape_err(&[4, 3], &[2]); // ranks differ
    assert!(GruCell::new(store.pp("z"), 0, 2, true).is_err());
    let w = |s: &[usize]| Tensor::zeros(s, CPU).unwrap();
    assert!(
        GruCell::from_tensors(w(&[6, 3]), w(&[6, 3]), None, None).is_err(),
        "weight_hh [3H, H]"
    );
    assert!(
        GruCell::from_tensors(w(&[5, 3]), w(&[5, 5]), None, None).is_err(),
        "3H rows"
    );
    assert!(GruCell::from_tensors(w(&[6, 3]), w(&[6, 2]), Some(w(&[5])), None).is_err());
    assert!(GruCell::from_tensors(w(&[6, 3]), w(&[6, 2]), Some(w(&[6])), Some(w(&[6]))).is_ok());
}

#[test]
fn gru_cell_gradients_match_finite_differences() {
    let mut r = rng("gru_cell_gradients_match_finite_differences");
    let (inp, hid, batch) = (3, 4, 2);
    let u = |shape: &[usize], s: f32| {
        (
            uniform(&mut r, shape.iter().product(), -s, s),
            shape.to_vec(),
        )
    };
    let inputs = devcmp::gru_leaves(u, (batch, inp, hid), (1.5, 1.0, 0.8, 0.5));
    // Two steps, so the gradient flows through h into the second step and accumulates.
    gradcheck("gru_cell", &inputs, 1e-2, 1e-3, |t| {
        let cell = devcmp::gru_cell(t)?;
        let h1 = cell.forward(&t[0], &t[1])?;
        let h2 = cell.forward(&t[0].mul_scalar(0.5)?, &h1)?;
        Tensor::cat(&[&h1, &h2], 1)
    });
}

#[test]
fn layer_gradients_match_finite_differences() {
    let mut r = rng("layer_gradients_match_finite_differences");
    let mut u = |shape: &[usize], lo: f32, hi: f32| {
        (
            uniform(&mut r, shape.iter().product(), lo, hi),
            shape.to_vec(),
        )
    };
    let lin = [
        u(&[2, 3, 4], -1.0, 1.0),
        u(&[5, 4], -1.0, 1.0),
        u(&[5], -1.0, 1.0),
    ];
    gradcheck("linear", &lin, 1e-2, 1e-3, |t| {
        Linear::from_tensors(t[1].clone(), Some(t[2].clone()))?.forward(&t[0])
    });
    gradcheck(
        "linear 1-D, no bias",
        &[u(&[4], -1.0, 1.0), u(&[3, 4], -1.0, 1.0)],
        1e-2,
        1e-3,
        |t| Linear::from_tensors(t[1].clone(), None)?.forward(&t[0]),
    );
    let ln = [u(&[3, 6], -2.0, 2.0), u(&[6], 0.5, 1.5), u(&[6], -0.5, 0.5)];
    gradcheck("layer_norm", &ln, 1e-2, 2e-3, |t| {
        LayerNorm::from_tensors(t[1].clone(), Some(t[2].clone()), 1e-5)?.forward(&t[0])
    });
    gradcheck("layer_norm no bias", &ln[..2], 1e-2, 2e-3, |t| {
        LayerNorm::from_tensors(t[1].clone(), None, 1e-5)?.forward(&t[0])
    });
    gradcheck("rms_norm", &ln[..2], 1e-2, 2e-3, |t| {
        RmsNorm::from_tensor(t[1].clone(), 1e-5)?.forward(&t[0])
    });
    let ids = Tensor::from_vec(vec![1u32, 3, 1, 0], &[2, 2], CPU).unwrap();
    gradcheck("embedding", &[u(&[5, 3], -1.0, 1.0)], 1e-2, 1e-3, |t| {
        Embedding::from_tensor(t[0].clone())?.forward(&ids)
    });
    gradcheck(
        "dropout (train)",
        &[u(&[4, 5], -1.0, 1.0)],
        1e-2,
        1e-3,
        |t| Dropout::new(0.3)?.forward_t(&t[0], Mode::train(11)),
    );
}

#[test]
fn inits_are_validated_and_pytorch_uniform_is_one_over_sqrt_fan() {
    assert_eq!(
        Init::pytorch_uniform(16).unwrap(),
        Init::Uniform {
            lo: -0.25,
            hi: 0.25
        }
    );
    assert!(Init::pytorch_uniform(0).is_err());
    let store = ParamStore::new(CPU, 6);
    for bad in [
        Init::Normal { std: -1.0 },
        Init::Normal { std: f32::NAN },
        Init::Uniform { lo: 1.0, hi: 1.0 },
        Init::Uniform {
            lo: 0.0,
            hi: f32::INFINITY,
        },
        Init::Const(f32::NAN),
    ] {
        let err = store.root().get("w", &[2], bad).unwrap_err();
        assert!(
            matches!(err, GpuError::InvalidArgument { .. }),
            "{bad:?}: {err}"
        );
    }
    assert!(
        store.is_empty(),
        "failed registrations leave nothing behind"
    );
    let n = store
        .root()
        .get("n", &[2000], Init::Normal { std: 0.5 })
        .unwrap()
        .to_vec()
        .unwrap();
    let mean = n.iter().map(|v| *v as f64).sum::<f64>() / 2000.0;
    let sd = (n.iter().map(|v| (*v as f64 - mean).powi(2)).sum::<f64>() / 2000.0).sqrt();
    assert!(
        mean.abs() < 0.05 && (sd - 0.5).abs() < 0.05,
        "mean {mean}, sd {sd}"
    );
    let c = store.root().get("c", &[3], Init::Const(2.5)).unwrap();
    assert_eq!(c.to_vec().unwrap(), [2.5; 3]);
}
