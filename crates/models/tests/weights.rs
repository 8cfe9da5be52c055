//! Model directories that validate, and each hostile case giving its typed error.

mod common;

use common::{serialize, tensors_for, value, write_config, write_sharded, write_single, Raw};
use models::{Checkpoint, ModelConfig, WeightsError};
use safetensors::Dtype;

fn open(dir: &std::path::Path) -> Result<Checkpoint, WeightsError> {
    let cfg = models::ModelConfig::from_dir(dir).unwrap();
    Checkpoint::open_checked(dir, &cfg)
}

/// A fresh directory with config `json` and its one weights file in `dtype`, opened.
fn open_single(json: &str, dtype: Dtype) -> (tempfile::TempDir, ModelConfig, Checkpoint) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_single(dir.path(), json, dtype);
    let ckpt = open(dir.path()).unwrap();
    (dir, cfg, ckpt)
}

#[test]
fn tiny_llama_gqa_validates_and_reads_bf16() {
    let (_dir, cfg, ckpt) = open_single(common::LLAMA_GQA, Dtype::BF16);
    assert_eq!(ckpt.names().count(), 1 + 2 * 9 + 2);
    let k = ckpt.info("model.layers.1.self_attn.k_proj.weight").unwrap();
    assert_eq!(
        k.shape,
        vec![cfg.num_kv_heads * cfg.head_dim, cfg.hidden_size]
    );
    let emb = ckpt.tensor_f32("model.embed_tokens.weight").unwrap();
    assert_eq!(emb.len(), 32 * 16);
    // Values are multiples of 0.25 in [-2, 2]: exact in bf16.
    assert!(emb.iter().enumerate().all(|(i, v)| *v == value(0, i)));
}

#[test]
fn tiny_qwen2_with_biases_tied_f16() {
    let (_dir, _, ckpt) = open_single(common::QWEN2, Dtype::F16);
    assert_eq!(
        ckpt.info("model.layers.0.self_attn.q_proj.bias")
            .unwrap()
            .shape,
        vec![8]
    );
    assert_eq!(
        ckpt.info("model.layers.0.self_attn.v_proj.bias")
            .unwrap()
            .shape,
        vec![4]
    );
    assert!(ckpt.info("lm_head.weight").is_none());
    let b = ckpt
        .tensor_f32("model.layers.0.self_attn.k_proj.bias")
        .unwrap();
    assert_eq!(b.len(), 4);
}

#[test]
fn tiny_mistral_validates() {
    let (_dir, _, ckpt) = open_single(common::MISTRAL, Dtype::F32);
    assert!(ckpt.info("lm_head.weight").is_some());
}

#[test]
fn tiny_gpt2_conv1d_layout() {
    let (_dir, _, ckpt) = open_single(common::GPT2, Dtype::F32);
    assert_eq!(
        ckpt.info("h.1.attn.c_attn.weight").unwrap().shape,
        vec![8, 24]
    );
    assert_eq!(ckpt.info("h.0.mlp.c_fc.weight").unwrap().shape, vec![8, 32]);
    assert_eq!(
        ckpt.info("h.0.mlp.c_proj.weight").unwrap().shape,
        vec![32, 8]
    );
    assert_eq!(ckpt.info("wpe.weight").unwrap().shape, vec![16, 8]);
    let wte = ckpt.tensor_f32("wte.weight").unwrap();
    assert!(wte.iter().enumerate().all(|(i, v)| *v == value(0, i)));
}

#[test]
fn gpt2_transformer_prefix_and_mask_buffers_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), common::GPT2);
    let mut tensors = tensors_for(&cfg, Dtype::F32);
    for t in &mut tensors {
        t.name = format!("transformer.{}", t.name);
    }
    tensors.push(Raw {
        name: "transformer.h.0.attn.bias".into(),
        dtype: Dtype::U8,
        shape: vec![1, 1, 16, 16],
        bytes: vec![1; 256],
    });
    std::fs::write(dir.path().join("model.safetensors"), serialize(&tensors)).unwrap();
    let ckpt = open(dir.path()).unwrap();
    assert!(ckpt.info("h.0.ln_1.bias").is_some());
}

#[test]
fn sharded_llama_validates() {
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path(), common::LLAMA_GQA, Dtype::BF16, 3);
    let ckpt = open(dir.path()).unwrap();
    assert_eq!(ckpt.names().count(), 21);
    assert_eq!(ckpt.tensor_f32("lm_head.weight").unwrap().len(), 32 * 16);
}

#[test]
fn missing_shard_is_named() {
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path(), common::LLAMA_GQA, Dtype::BF16, 3);
    std::fs::remove_file(dir.path().join("model-00002-of-00003.safetensors")).unwrap();
    match open(dir.path()) {
        Err(WeightsError::MissingShard(p)) => {
            assert!(p.ends_with("model-00002-of-00003.safetensors"))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn index_pointing_at_the_wrong_shard_or_outside_the_dir() {
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path(), common::LLAMA_GQA, Dtype::BF16, 2);
    let path = dir.path().join("model.safetensors.index.json");
    let mut index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    index["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors".into();
    std::fs::write(&path, index.to_string()).unwrap();
    assert!(matches!(
        open(dir.path()),
        Err(WeightsError::IndexMismatch { .. })
    ));
    index["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors".into();
    std::fs::write(&path, index.to_string()).unwrap();
    assert!(matches!(
        open(dir.path()),
        Err(WeightsError::BadIndex { .. })
    ));
    std::fs::write(&path, "{\"weight_map\": 3}").unwrap();
    assert!(matches!(
        open(dir.path()),
        Err(WeightsError::BadIndex { .. })
    ));
}

#[test]
fn no_weights_at_all() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), common::GPT2);
    assert!(matches!(open(dir.path()), Err(WeightsError::NoWeights(_))));
}

/// Writes the tensors `cfg` implies after `edit`, then opens the directory.
fn edited(json: &str, edit: impl FnOnce(&mut Vec<Raw>)) -> Result<Checkpoint, WeightsError> {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), json);
    let mut tensors = tensors_for(&cfg, Dtype::BF16);
    edit(&mut tensors);
    std::fs::write(dir.path().join("model.safetensors"), serialize(&tensors)).unwrap();
    open(dir.path())
}

#[test]
fn missing_tensor_is_named() {
    let r = edited(common::QWEN2, |t| {
        t.retain(|t| !t.name.ends_with("k_proj.bias"))
    });
    match r {
        Err(WeightsError::MissingTensor(n)) => {
            assert_eq!(n, "model.layers.0.self_attn.k_proj.bias")
        }
        other => panic!("{other:?}"),
    }
    // Tied: a checkpoint for an untied Llama without lm_head is missing it.
    let r = edited(common::LLAMA_GQA, |t| {
        t.retain(|t| t.name != "lm_head.weight")
    });
    assert!(matches!(r, Err(WeightsError::MissingTensor(n)) if n == "lm_head.weight"));
}

#[test]
fn extra_tensor_is_named() {
    let r = edited(common::QWEN2, |t| {
        t.push(Raw {
            name: "model.layers.7.mlp.up_proj.weight".into(),
            dtype: Dtype::BF16,
            shape: vec![2],
            bytes: vec![0; 4],
        })
    });
    assert!(
        matches!(r, Err(WeightsError::UnexpectedTensor(n)) if n == "model.layers.7.mlp.up_proj.weight")
    );
}

#[test]
fn wrong_shape_is_named() {
    let r = edited(common::LLAMA_GQA, |t| {
        // A k_proj sized for full multi-head attention instead of GQA.
        let k = t
            .iter_mut()
            .find(|t| t.name == "model.layers.0.self_attn.k_proj.weight")
            .unwrap();
        k.shape = vec![16, 16];
        k.bytes = vec![0; 16 * 16 * 2];
    });
    match r {
        Err(WeightsError::WrongShape {
            name,
            expected,
            found,
        }) => {
            assert_eq!(name, "model.layers.0.self_attn.k_proj.weight");
            assert_eq!((expected, found), (vec![8, 16], vec![16, 16]));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn wrong_dtype_is_named() {
    let r = edited(common::GPT2, |t| {
        let w = t.iter_mut().find(|t| t.name == "ln_f.bias").unwrap();
        w.dtype = Dtype::I16;
    });
    assert!(
        matches!(r, Err(WeightsError::WrongDtype { name, found: Dtype::I16 }) if name == "ln_f.bias")
    );
}

#[test]
fn truncated_file_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    write_single(dir.path(), common::GPT2, Dtype::F32);
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    for keep in [0, 5, 8, 20, bytes.len() / 2, bytes.len() - 1] {
        std::fs::write(&path, &bytes[..keep]).unwrap();
        let r = open(dir.path());
        assert!(
            matches!(r, Err(WeightsError::Corrupt { .. })),
            "{keep}: {r:?}"
        );
    }
}

#[test]
fn reading_an_unknown_tensor_is_an_error() {
    let (_dir, _, ckpt) = open_single(common::GPT2, Dtype::F32);
    assert!(matches!(
        ckpt.tensor_f32("nope"),
        Err(WeightsError::MissingTensor(_))
    ));
}

#[test]
fn mixed_float_dtypes_are_accepted_and_converted() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), common::GPT2);
    let mut tensors = tensors_for(&cfg, Dtype::F32);
    let wpe = tensors.iter_mut().find(|t| t.name == "wpe.weight").unwrap();
    let vals: Vec<f32> = (0..16 * 8).map(|i| value(1, i)).collect();
    wpe.dtype = Dtype::F16;
    wpe.bytes = common::encode(&vals, Dtype::F16);
    std::fs::write(dir.path().join("model.safetensors"), serialize(&tensors)).unwrap();
    let ckpt = open(dir.path()).unwrap();
    assert_eq!(ckpt.info("wpe.weight").unwrap().dtype, Dtype::F16);
    assert_eq!(ckpt.tensor_f32("wpe.weight").unwrap(), vals);
}

#[test]
fn unchecked_open_reads_only_float_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let ints = Raw {
        name: "ids".into(),
        dtype: Dtype::I32,
        shape: vec![2],
        bytes: vec![0; 8],
    };
    std::fs::write(dir.path().join("model.safetensors"), serialize(&[ints])).unwrap();
    let ckpt = Checkpoint::open(dir.path(), models::Architecture::Llama).unwrap();
    let r = ckpt.tensor_f32("ids");
    assert!(matches!(
        r,
        Err(WeightsError::WrongDtype {
            found: Dtype::I32,
            ..
        })
    ));
    assert_eq!(ckpt.bytes("ids").unwrap().len(), 8);
}
