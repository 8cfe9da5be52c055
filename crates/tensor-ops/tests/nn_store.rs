//! The parameter store on the CPU: names, order and prefixes, seeded init, decay flags handed
//! to AdamW, snapshots restored in place under a live optimiser, and safetensors files checked
//! name by name. (`gpu_modules.rs` runs the device-side parts on CUDA.)

mod devcmp;

use safetensors::tensor::{Dtype, TensorView};
use std::collections::HashMap;
use tensor_ops::nn::{read_metadata, Init, Module, ParamStore};
use tensor_ops::optim::{AdamW, AdamWParams};
use tensor_ops::{Device, GpuError, Tensor};

const CPU: Device = Device::Cpu;

/// A small model: an encoder Linear + LayerNorm and a GRU cell, as the RSSM will have.
fn model(store: &ParamStore) {
    let enc = store.pp("encoder");
    enc.pp("fc").linear(4, 3, true).unwrap();
    enc.pp("norm").layer_norm(3, 1e-5, true).unwrap();
    store.pp("gru").pp(0).gru_cell(3, 2).unwrap();
}

const NAMES: [&str; 8] = [
    "encoder.fc.weight",
    "encoder.fc.bias",
    "encoder.norm.weight",
    "encoder.norm.bias",
    "gru.0.weight_ih",
    "gru.0.weight_hh",
    "gru.0.bias_ih",
    "gru.0.bias_hh",
];

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec().unwrap().iter().map(|v| v.to_bits()).collect()
}

fn all_bits(store: &ParamStore) -> Vec<Vec<u32>> {
    store.params().iter().map(|p| bits(p.tensor())).collect()
}

fn temp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "nn-store-{}-{name}.safetensors",
        std::process::id()
    ))
}

#[test]
fn names_order_decay_flags_and_seeded_init() {
    let store = ParamStore::new(CPU, 9);
    model(&store);
    assert_eq!(store.names(), NAMES);
    assert_eq!(store.len(), 8);
    assert_eq!(store.num_elements(), 12 + 3 + 3 + 3 + 18 + 12 + 6 + 6);
    let decays: Vec<bool> = store.params().iter().map(|p| p.decay()).collect();
    assert_eq!(
        decays,
        [true, false, false, false, true, true, false, false]
    );
    for p in store.params() {
        assert!(p.tensor().requires_grad(), "{}", p.name());
        assert_eq!(p.tensor().device(), CPU);
    }
    assert_eq!(store.get("gru.0.weight_hh").unwrap().shape(), [6, 2]);
    fn shareable<T: Send + Sync>(_: &T) {}
    shareable(&store); // a trainer may hold the store across threads
    assert!(store.get("gru.0.weight").is_none());
    // The same seed gives the same values, another seed others.
    let (same, other) = (ParamStore::new(CPU, 9), ParamStore::new(CPU, 10));
    model(&same);
    model(&other);
    assert_eq!(all_bits(&store), all_bits(&same));
    assert_ne!(all_bits(&store)[0], all_bits(&other)[0]);
    // Explicit decay flags and builder accessors.
    let b = store.pp("extra");
    assert_eq!(b.prefix(), "extra");
    assert_eq!(b.pp("x").prefix(), "extra.x");
    assert_eq!(b.device(), CPU);
    b.get_with_decay("scale", &[3], Init::ONES, true).unwrap();
    assert!(store.params().last().unwrap().decay());
}

#[test]
fn bad_names_are_typed_errors_that_leave_the_store_unchanged() {
    let store = ParamStore::new(CPU, 9);
    model(&store);
    let before = all_bits(&store);
    for (what, res) in [
        (
            "duplicate",
            store.pp("encoder").pp("fc").linear(4, 3, true).map(|_| ()),
        ),
        ("empty prefix", store.pp("").linear(2, 2, false).map(|_| ())),
        (
            "empty segment",
            store.pp("a..b").rms_norm(2, 1e-5).map(|_| ()),
        ),
        (
            "empty name",
            store.root().get("", &[2], Init::ZEROS).map(|_| ()),
        ),
        (
            "trailing dot",
            store.root().get("w.", &[2], Init::ZEROS).map(|_| ()),
        ),
    ] {
        let err = res.unwrap_err();
        assert!(
            matches!(err, GpuError::InvalidArgument { .. }),
            "{what}: {err}"
        );
    }
    assert_eq!(store.names(), NAMES);
    // A failed registration does not advance the generator: the next parameter gets the
    // values it would have got without it.
    let clean = ParamStore::new(CPU, 9);
    model(&clean);
    let w1 = store
        .pp("next")
        .get("w", &[5], Init::Normal { std: 1.0 })
        .unwrap();
    let w2 = clean
        .pp("next")
        .get("w", &[5], Init::Normal { std: 1.0 })
        .unwrap();
    assert_eq!(bits(&w1), bits(&w2));
    assert_eq!(all_bits(&store)[..8], before[..]);
}

#[test]
fn adamw_from_the_store_decays_by_each_parameters_flag() {
    let store = ParamStore::new(CPU, 1);
    let fc = store.pp("fc").linear(3, 2, true).unwrap();
    let (w0, b0) = (
        fc.weight().to_vec().unwrap(),
        fc.bias().unwrap().to_vec().unwrap(),
    );
    let mut opt = store
        .adamw(AdamWParams {
            weight_decay: 0.5,
            ..Default::default()
        })
        .unwrap();
    // A zero gradient: Adam's update is 0, so only weight decay moves a parameter.
    let x = Tensor::zeros(&[1, 3], CPU).unwrap();
    let loss = fc
        .forward(&x)
        .unwrap()
        .mul_scalar(0.0)
        .unwrap()
        .sum_all()
        .unwrap();
    opt.step(&loss.backward().unwrap(), 0.1).unwrap();
    let w1 = fc.weight().to_vec().unwrap();
    for (a, b) in w1.iter().zip(&w0) {
        assert!((a - b * 0.95).abs() < 1e-7, "weight decays: {a} vs {b}");
    }
    assert_eq!(
        fc.bias().unwrap().to_vec().unwrap(),
        b0,
        "bias does not decay"
    );
}

#[test]
fn snapshot_restores_in_place_under_a_live_optimizer() {
    let store = ParamStore::new(CPU, 2);
    model(&store);
    let mut opt = store.adamw(AdamWParams::default()).unwrap();
    let step = |opt: &mut AdamW| {
        let loss = devcmp::sum_of_squares(&store);
        opt.step(&loss.backward().unwrap(), 0.05).unwrap();
    };
    let start = all_bits(&store);
    let snap = store.snapshot().unwrap();
    assert_eq!(snap.len(), 8);
    assert_eq!(snap.names().collect::<Vec<_>>(), NAMES);
    assert!(!snap.get("gru.0.bias_hh").unwrap().requires_grad());
    step(&mut opt);
    let moved = all_bits(&store);
    assert_ne!(moved, start);
    let held: Vec<Vec<u32>> = NAMES.iter().map(|n| bits(snap.get(n).unwrap())).collect();
    assert_eq!(held, start, "the snapshot is a copy, not a view");
    let ids: Vec<u64> = store.params().iter().map(|p| p.tensor().id()).collect();
    store.restore(&snap).unwrap();
    assert_eq!(all_bits(&store), start);
    let ids_after: Vec<u64> = store.params().iter().map(|p| p.tensor().id()).collect();
    assert_eq!(ids, ids_after, "same tensors");
    // The optimiser still trains the store's tensors: a step after the restore moves them.
    step(&mut opt);
    assert_ne!(all_bits(&store), start);
    // A snapshot of another store of the same layout restores; a different layout does not.
    let twin = ParamStore::new(CPU, 77);
    model(&twin);
    twin.restore(&snap).unwrap();
    assert_eq!(all_bits(&twin), start);
    let other = ParamStore::new(CPU, 2);
    other.pp("encoder").pp("fc").linear(4, 3, true).unwrap();
    let err = other.restore(&snap).unwrap_err();
    assert!(err.to_string().contains("8 tensors"), "{err}");
    let wide = ParamStore::new(CPU, 2);
    let enc = wide.pp("encoder");
    enc.pp("fc").linear(5, 3, true).unwrap();
    enc.pp("norm").layer_norm(3, 1e-5, true).unwrap();
    wide.pp("gru").pp(0).gru_cell(3, 2).unwrap();
    let before = all_bits(&wide);
    let err = wide.restore(&snap).unwrap_err();
    assert!(
        matches!(&err, GpuError::ShapeMismatch { expected, .. } if expected.contains("encoder.fc.weight")),
        "{err}"
    );
    assert_eq!(all_bits(&wide), before, "nothing written on error");
    let renamed = ParamStore::new(CPU, 2);
    renamed.pp("enc").pp("fc").linear(4, 3, true).unwrap();
    let err = renamed.restore(&store.snapshot().unwrap()).unwrap_err();
    assert!(err.to_string().contains("8 tensors"), "{err}");
}

/// Writes `tensors` (name, dtype, shape, bytes) as a safetensors file.
fn write_raw(path: &std::path::Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    std::fs::write(path, safetensors::serialize(views, &None).unwrap()).unwrap();
}

#[test]
fn save_and_load_round_trip_and_check_every_name_shape_and_dtype() {
    let store = ParamStore::new(CPU, 3);
    model(&store);
    let path = temp("round-trip");
    let meta = HashMap::from([("kind".to_string(), "rssm-test".to_string())]);
    store.save_with_metadata(&path, &meta).unwrap();
    let data = std::fs::read(&path).unwrap();
    assert_eq!(read_metadata(&data).unwrap(), meta);
    let saved = all_bits(&store);
    let other = ParamStore::new(CPU, 4);
    model(&other);
    let ids: Vec<u64> = other.params().iter().map(|p| p.tensor().id()).collect();
    other.load(&path).unwrap();
    assert_eq!(all_bits(&other), saved);
    let ids_after: Vec<u64> = other.params().iter().map(|p| p.tensor().id()).collect();
    assert_eq!(ids, ids_after, "loading writes in place");

    // Every mismatch is a typed error naming the tensor, and leaves the values alone.
    let fresh = ParamStore::new(CPU, 5);
    model(&fresh);
    let before = all_bits(&fresh);
    let f32_bytes = |n: usize| vec![0u8; 4 * n];
    let mut full: Vec<(&str, Dtype, Vec<usize>, Vec<u8>)> = fresh
        .params()
        .iter()
        .map(|p| {
            let name: &'static str = NAMES.iter().find(|n| **n == p.name()).unwrap();
            (
                name,
                Dtype::F32,
                p.tensor().shape().to_vec(),
                f32_bytes(p.tensor().numel()),
            )
        })
        .collect();
    let check = |case: &str, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)], name: &str| {
        let p = temp(case);
        write_raw(&p, tensors);
        let err = fresh.load(&p).unwrap_err();
        std::fs::remove_file(&p).ok();
        assert!(err.to_string().contains(name), "{case}: {err}");
        assert_eq!(all_bits(&fresh), before, "{case}: nothing written");
        err
    };
    let missing = check("missing", &full[1..], "encoder.fc.weight");
    assert!(matches!(missing, GpuError::InvalidArgument { .. }));
    let mut extra = full.clone();
    extra.push(("decoder.weight", Dtype::F32, vec![2], f32_bytes(2)));
    check("extra", &extra, "decoder.weight");
    full[5].2 = vec![2, 6];
    let wrong_shape = check("shape", &full, "gru.0.weight_hh");
    assert!(matches!(wrong_shape, GpuError::ShapeMismatch { .. }));
    full[5].2 = vec![6, 2];
    full[2] = ("encoder.norm.weight", Dtype::F64, vec![3], vec![0u8; 24]);
    check("dtype", &full, "encoder.norm.weight");
    full[2] = ("encoder.norm.weight", Dtype::F32, vec![3], f32_bytes(3));
    let p = temp("all-zero");
    write_raw(&p, &full);
    fresh.load(&p).unwrap();
    std::fs::remove_file(&p).ok();
    assert!(
        all_bits(&fresh).iter().flatten().all(|b| *b == 0),
        "a valid file loads"
    );
    let err = fresh.load(&temp("does-not-exist")).unwrap_err();
    assert!(matches!(err, GpuError::InvalidArgument { .. }), "{err}");
    assert!(fresh.load_bytes(b"not a safetensors file").is_err());
    std::fs::remove_file(&path).ok();
}

/// Trains `store` for `steps` AdamW steps on a fixed quadratic loss.
fn train(store: &ParamStore, opt: &mut AdamW, steps: usize) {
    for _ in 0..steps {
        let mut loss = Tensor::zeros(&[], CPU).unwrap();
        for p in store.params() {
            let t = p.tensor();
            loss = loss.add(&t.mul(t).unwrap().sum_all().unwrap()).unwrap();
        }
        opt.step(&loss.backward().unwrap(), 0.05).unwrap();
    }
}

/// Saving the optimiser's state with the weights and loading both back continues the run bit
/// for bit (moments and the bias-correction step count both matter), and a state of the wrong
/// layout is refused before anything is written.
#[test]
fn adamw_state_round_trips_and_resumes_bit_for_bit() {
    let hp = AdamWParams {
        weight_decay: 0.1,
        ..AdamWParams::default()
    };
    let store = ParamStore::new(CPU, 3);
    model(&store);
    let mut opt = store.adamw(hp).unwrap();
    train(&store, &mut opt, 3);
    let (weights, state) = (store.snapshot().unwrap(), opt.state().unwrap());
    assert_eq!(state.step, 3);
    train(&store, &mut opt, 4);
    let straight = all_bits(&store);

    // Another optimiser over another store of the same layout, loaded and resumed.
    let other = ParamStore::new(CPU, 77);
    model(&other);
    let mut opt2 = other.adamw(hp).unwrap();
    other.restore(&weights).unwrap();
    opt2.load_state(&state).unwrap();
    assert_eq!(opt2.steps(), 3);
    train(&other, &mut opt2, 4);
    assert_eq!(all_bits(&other), straight);

    // Without the moments the resumed run differs: the test can fail.
    let third = ParamStore::new(CPU, 77);
    model(&third);
    let mut opt3 = third.adamw(hp).unwrap();
    third.restore(&weights).unwrap();
    train(&third, &mut opt3, 4);
    assert_ne!(all_bits(&third), straight);

    // A state of another layout: refused, nothing written.
    let small = ParamStore::new(CPU, 1);
    small.pp("x").linear(2, 2, true).unwrap();
    let mut opt4 = small.adamw(hp).unwrap();
    let before = opt2.state().unwrap();
    let e = opt2.load_state(&opt4.state().unwrap()).unwrap_err();
    assert!(e.to_string().contains("moments"), "{e}");
    assert_eq!(opt2.steps(), before.step);
    let mut wrong = state.clone();
    wrong.v[0] = Tensor::zeros(&[1], CPU).unwrap();
    assert!(opt2.load_state(&wrong).is_err());
    for (a, b) in opt2.moments().0.iter().zip(&before.m) {
        assert_eq!(bits(a), bits(b));
    }
    train(&small, &mut opt4, 1);
}

/// safetensors bytes whose header puts a tensor's data near `usize::MAX` (the `safetensors`
/// crate adds that offset unchecked: a panic in debug builds) or past the end, or whose header
/// length exceeds the file, are typed errors for every reader, never a panic.
#[test]
fn lying_headers_are_errors_not_panics() {
    let file = |header: &str, data: usize| {
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(header.as_bytes());
        b.extend(std::iter::repeat_n(0u8, data));
        b
    };
    let max = usize::MAX;
    let huge = format!(r#"{{"w":{{"dtype":"U8","shape":[{max}],"data_offsets":[0,{max}]}}}}"#);
    let past = r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    let mut long = file(past, 8);
    long[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    let store = ParamStore::new(Device::Cpu, 1);
    model(&store);
    let before = all_bits(&store);
    for bytes in [file(&huge, 4), file(past, 4), long] {
        assert!(matches!(
            store.load_bytes(&bytes),
            Err(GpuError::InvalidArgument { .. })
        ));
        assert!(read_metadata(&bytes).is_err());
        assert!(tensor_ops::optim::OptimizerState::from_safetensors(&bytes).is_err());
    }
    assert_eq!(all_bits(&store), before);
}
