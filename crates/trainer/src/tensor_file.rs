//! Named f32 tensors in a safetensors file: what the checkpoints of `train-gpt` (the earlier
//! builds' AdamW moments) and of the hybrid (its rollback point, the world model's optimizer)
//! write and read besides the model's own weights.

use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use std::collections::HashMap;
use std::path::Path;
use tensor_ops::Tensor;

/// The model's weights alone, under their parameter names (loadable by `ParamStore::load`).
pub const MODEL_FILE: &str = "model.safetensors";

/// What can go wrong reading or writing a tensor file.
#[derive(Debug, thiserror::Error)]
pub enum TensorFileError {
    /// The file is missing, unreadable, malformed or not f32.
    #[error("checkpoint: {0}")]
    File(String),
    #[error(transparent)]
    Tensor(#[from] tensor_ops::GpuError),
}

fn ck(e: impl std::fmt::Display) -> TensorFileError {
    TensorFileError::File(e.to_string())
}

/// Writes `(name, tensor)` pairs as safetensors (one host copy each).
pub fn write_tensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<(), TensorFileError> {
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, t)| {
            let v = t.to_vec()?;
            Ok((
                n.clone(),
                t.shape().to_vec(),
                v.iter().flat_map(|f| f.to_le_bytes()).collect(),
            ))
        })
        .collect::<Result<_, TensorFileError>>()?;
    let views: Vec<(String, TensorView<'_>)> = bytes
        .iter()
        .map(|(n, s, b)| {
            Ok((
                n.clone(),
                TensorView::new(Dtype::F32, s.clone(), b).map_err(ck)?,
            ))
        })
        .collect::<Result<_, TensorFileError>>()?;
    let out = safetensors::serialize(views, &None).map_err(ck)?;
    std::fs::write(path, out).map_err(|e| ck(format!("{}: {e}", path.display())))
}

/// Host tensors by name: (shape, values).
pub type HostTensors = HashMap<String, (Vec<usize>, Vec<f32>)>;

/// Reads every f32 tensor of a safetensors file.
pub fn read_tensors(path: &Path) -> Result<HostTensors, TensorFileError> {
    let data =
        tensor_ops::fsio::read(path, "checkpoint", tensor_ops::fsio::TENSORS_MAX).map_err(ck)?;
    tensor_ops::nn::check_offsets(&data).map_err(|e| ck(format!("{}: {e}", path.display())))?;
    let st = SafeTensors::deserialize(&data).map_err(ck)?;
    let mut out = HashMap::new();
    for (name, view) in st.tensors() {
        if view.dtype() != Dtype::F32 {
            return Err(ck(format!("{name}: {:?}, expected F32", view.dtype())));
        }
        let vals = view
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        out.insert(name, (view.shape().to_vec(), vals));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensor_ops::Device;

    /// Tensors come back with their names, shapes and bits; a truncated file, a missing one
    /// and a non-f32 tensor are typed errors.
    #[test]
    fn tensors_round_trip_and_bad_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.safetensors");
        let a = Tensor::from_vec(
            vec![1.5, -0.0, f32::MIN_POSITIVE, 3.0],
            &[2, 2],
            Device::Cpu,
        )
        .unwrap();
        let b = Tensor::from_vec(vec![7.0], &[1], Device::Cpu).unwrap();
        write_tensors(&path, &[("a".into(), a), ("b.0".into(), b)]).unwrap();
        let host = read_tensors(&path).unwrap();
        assert_eq!(host.len(), 2);
        let (shape, vals) = &host["a"];
        assert_eq!(shape, &[2, 2]);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(vals), bits(&[1.5, -0.0, f32::MIN_POSITIVE, 3.0]));
        assert_eq!(host["b.0"], (vec![1], vec![7.0]));

        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        assert!(matches!(read_tensors(&path), Err(TensorFileError::File(_))));
        let missing = dir.path().join("none.safetensors");
        assert!(matches!(
            read_tensors(&missing),
            Err(TensorFileError::File(_))
        ));

        let raw = [0u8; 4];
        let view = TensorView::new(Dtype::I32, vec![1], &raw).unwrap();
        std::fs::write(&path, safetensors::serialize([("i", view)], &None).unwrap()).unwrap();
        let e = read_tensors(&path).unwrap_err();
        assert!(e.to_string().contains("expected F32"), "{e}");
    }
}
