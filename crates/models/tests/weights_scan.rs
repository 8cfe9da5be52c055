//! `models::weights::first_non_finite`: the checkpoint tensor that holds a NaN or an infinity
//! (the cause of non-finite logits, named after the fact), in f32, bf16 and f16 files, one file
//! or shards.

mod common;
mod hf_fixture;

use std::path::Path;

use common::encode;
use hf_fixture::{dir, poisoned_copy, FIXTURES};
use models::weights::{first_non_finite, NonFiniteTensor};
use safetensors::tensor::TensorView;
use safetensors::Dtype;

/// Writes `tensors` (name, dtype, values; 1-D) as the safetensors file `path`.
fn write(path: &Path, tensors: &[(&str, Dtype, Vec<f32>)]) {
    let data: Vec<_> = tensors
        .iter()
        .map(|(n, d, v)| (*n, *d, v.len(), encode(v, *d)))
        .collect();
    let views = data
        .iter()
        .map(|(n, d, len, b)| (n.to_string(), TensorView::new(*d, vec![*len], b).unwrap()));
    std::fs::write(path, safetensors::serialize(views, &None).unwrap()).unwrap();
}

fn counts(t: &NonFiniteTensor) -> (usize, usize, usize) {
    (t.nan, t.pos_inf, t.neg_inf)
}

#[test]
fn every_committed_fixture_is_finite() {
    for name in FIXTURES {
        assert_eq!(first_non_finite(&dir(name)).unwrap(), None, "{name}");
    }
}

/// A poisoned copy names its tensor and the count, as the message reads it.
#[test]
fn a_poisoned_copy_names_its_tensor() {
    let q = "model.layers.0.self_attn.q_proj.weight";
    let tmp = poisoned_copy("llama3", q, 5..8, f32::NAN);
    let t = first_non_finite(tmp.path()).unwrap().unwrap();
    assert_eq!((t.name.as_str(), counts(&t)), (q, (3, 0, 0)));
    assert_eq!(t.to_string(), format!("tensor `{q}` holds 3 NaN"));
    // Finite but huge: nothing to name.
    let tmp = poisoned_copy("llama3", q, 0..64, 1e38);
    assert_eq!(first_non_finite(tmp.path()).unwrap(), None);
}

/// Each float format's NaN, +∞ and −∞ are counted (and only they: −0, the smallest normal,
/// f16's largest finite value are not); the first tensor in the file's byte order is named;
/// buffers the loader ignores and integer tensors are skipped; a tensor larger than a chunk of
/// the scan is counted whole.
#[test]
fn each_format_and_the_first_tensor_in_file_order() {
    let odd = vec![
        1.0,
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        f32::MIN_POSITIVE,
        65504.0,
    ];
    for dtype in [Dtype::F32, Dtype::BF16, Dtype::F16] {
        let tmp = tempfile::tempdir().unwrap();
        // safetensors lays tensors out by dtype then name: "b" (clean) before "c".
        let tensors = [
            ("a.attn.masked_bias", dtype, vec![f32::NAN]),
            ("b", dtype, vec![2.0; 4]),
            ("c", dtype, odd.clone()),
            ("d", dtype, vec![f32::NAN; 4]),
        ];
        write(&tmp.path().join("model.safetensors"), &tensors);
        let t = first_non_finite(tmp.path()).unwrap().unwrap();
        assert_eq!((t.name.as_str(), counts(&t)), ("c", (2, 1, 1)), "{dtype:?}");
        assert_eq!(t.to_string(), "tensor `c` holds 2 NaN, 1 +inf, 1 -inf");
    }
    // 1e38 is finite in f32 and bf16, +∞ once stored as f16.
    let tmp = tempfile::tempdir().unwrap();
    let huge = |d| ("w", d, vec![1e38]);
    for (d, want) in [
        (Dtype::F32, None),
        (Dtype::BF16, None),
        (Dtype::F16, Some((0, 1, 0))),
    ] {
        write(&tmp.path().join("model.safetensors"), &[huge(d)]);
        let got = first_non_finite(tmp.path()).unwrap();
        assert_eq!(got.as_ref().map(counts), want, "{d:?}");
    }
    // Several chunks (the scan counts 1 MiB at a time): NaNs at their edges all counted.
    let mut big = vec![0.5f32; 700_000];
    for i in [0, 262_143, 262_144, 699_999] {
        big[i] = f32::NAN;
    }
    write(
        &tmp.path().join("model.safetensors"),
        &[("big", Dtype::F32, big)],
    );
    let t = first_non_finite(tmp.path()).unwrap().unwrap();
    assert_eq!(counts(&t), (4, 0, 0));
}

/// Shards: the index's files in name order; a missing file is the loader's error.
#[test]
fn shards_are_scanned_in_name_order() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    write(
        &d.join("model-00001-of-00002.safetensors"),
        &[("x", Dtype::BF16, vec![1.0, f32::NEG_INFINITY])],
    );
    write(
        &d.join("model-00002-of-00002.safetensors"),
        &[("a", Dtype::F32, vec![f32::NAN])],
    );
    let index = r#"{"weight_map": {"a": "model-00002-of-00002.safetensors",
        "x": "model-00001-of-00002.safetensors"}}"#;
    std::fs::write(d.join("model.safetensors.index.json"), index).unwrap();
    let t = first_non_finite(d).unwrap().unwrap();
    assert_eq!((t.name.as_str(), counts(&t)), ("x", (0, 0, 1)));
    assert!(t.file.ends_with("model-00001-of-00002.safetensors"));
    std::fs::remove_file(d.join("model-00001-of-00002.safetensors")).unwrap();
    let e = first_non_finite(d).unwrap_err();
    assert!(matches!(e, models::WeightsError::MissingShard(_)), "{e}");
    assert!(first_non_finite(&d.join("nowhere")).is_err());
}
