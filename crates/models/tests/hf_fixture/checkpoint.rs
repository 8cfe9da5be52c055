//! Rewriting a fixture's f32 weights (`model.safetensors`): part of `hf_fixture`, and included
//! by path in `hybrid-trainer`'s command-line tests, so it needs only `safetensors`, `tempfile`
//! and std.
#![allow(dead_code)]

use std::ops::Range;
use std::path::Path;

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

/// Writes `tensors` (name, shape, little-endian f32 bytes) as `dir/model.safetensors`: a
/// fixture's weights rewritten by a test.
pub fn write_f32_checkpoint(dir: &Path, tensors: &[(String, Vec<usize>, Vec<u8>)]) {
    let views = tensors.iter().map(|(n, shape, b)| {
        (
            n.clone(),
            TensorView::new(Dtype::F32, shape.clone(), b).unwrap(),
        )
    });
    let out = safetensors::serialize(views, &None).unwrap();
    std::fs::write(dir.join("model.safetensors"), out).unwrap();
}

/// Writes `src/model.safetensors` again as `dir/model.safetensors` in f32, each tensor's bytes
/// those `f` makes of it (given its name and view); returns the tensors' names.
pub fn rewrite_checkpoint(
    src: &Path,
    dir: &Path,
    f: impl Fn(&str, &TensorView<'_>) -> Vec<u8>,
) -> Vec<String> {
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| {
            let b = f(&n, &v);
            (n, v.shape().to_vec(), b)
        })
        .collect();
    write_f32_checkpoint(dir, &data);
    data.into_iter().map(|(n, ..)| n).collect()
}

/// A copy of the fixture folder `src` (its `files` as they are, its f32 weights) whose tensor
/// `tensor` holds `value` at the elements `at`: a checkpoint with corrupt weights.
pub fn poisoned(
    src: &Path,
    files: &[&str],
    tensor: &str,
    at: Range<usize>,
    value: f32,
) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for f in files {
        std::fs::copy(src.join(f), tmp.path().join(f)).unwrap();
    }
    let names = rewrite_checkpoint(src, tmp.path(), |n, v| {
        assert_eq!(v.dtype(), Dtype::F32, "{n}");
        let mut b = v.data().to_vec();
        if n == tensor {
            for c in b[at.start * 4..at.end * 4].chunks_exact_mut(4) {
                c.copy_from_slice(&value.to_le_bytes());
            }
        }
        b
    });
    let name = src.file_name().unwrap_or_default().to_string_lossy();
    assert!(names.iter().any(|n| n == tensor), "{name} has no {tensor}");
    tmp
}
