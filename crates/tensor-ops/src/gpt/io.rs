//! safetensors checkpoints (nanoGPT parameter names; the tied head is not stored twice).

use super::model::Gpt;
use crate::tensor::Tensor;
use crate::{GpuError, Result};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use std::collections::HashMap;
use std::path::Path;

fn st_err(e: impl std::fmt::Display) -> GpuError {
    GpuError::invalid("safetensors", e.to_string())
}

impl Gpt {
    /// Writes every parameter (f32, little-endian) and the config as metadata.
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut bytes: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
        for p in &self.params {
            let v = p.tensor.to_vec()?;
            bytes.push((
                p.name.clone(),
                p.tensor.shape().to_vec(),
                v.iter().flat_map(|f| f.to_le_bytes()).collect(),
            ));
        }
        let views: Vec<(String, TensorView<'_>)> = bytes
            .iter()
            .map(|(n, s, b)| {
                TensorView::new(Dtype::F32, s.clone(), b)
                    .map(|v| (n.clone(), v))
                    .map_err(st_err)
            })
            .collect::<Result<_>>()?;
        let meta = HashMap::from([(
            "config".to_string(),
            serde_json::to_string(&self.config).map_err(st_err)?,
        )]);
        let out = safetensors::serialize(views, &Some(meta)).map_err(st_err)?;
        std::fs::write(path, out)
            .map_err(|e| GpuError::invalid("save", format!("{}: {e}", path.display())))
    }

    /// Loads a checkpoint written by [`Gpt::save`] (or by the PyTorch parity script) onto
    /// `device`; every parameter must be present with the right shape.
    pub fn load(path: &Path, device: crate::Device) -> Result<Gpt> {
        let data = std::fs::read(path)
            .map_err(|e| GpuError::invalid("load", format!("{}: {e}", path.display())))?;
        let (_, meta) = SafeTensors::read_metadata(&data).map_err(st_err)?;
        let cfg = meta
            .metadata()
            .as_ref()
            .and_then(|m| m.get("config"))
            .ok_or_else(|| st_err("no config in the metadata"))?;
        let config = serde_json::from_str(cfg).map_err(st_err)?;
        let model = Gpt::new(config, 0, device)?;
        model.load_weights(&data)?;
        Ok(model)
    }

    /// Overwrites the parameters from safetensors bytes (names and shapes must match).
    pub fn load_weights(&self, data: &[u8]) -> Result<()> {
        let st = SafeTensors::deserialize(data).map_err(st_err)?;
        for p in &self.params {
            let view = st
                .tensor(&p.name)
                .map_err(|e| st_err(format!("{}: {e}", p.name)))?;
            if view.dtype() != Dtype::F32 || view.shape() != p.tensor.shape() {
                return Err(GpuError::shape(
                    "load",
                    format!("{} f32 {:?}", p.name, p.tensor.shape()),
                    format!("{:?} {:?}", view.dtype(), view.shape()),
                ));
            }
            let vals: Vec<f32> = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            let fresh = Tensor::from_vec(vals, p.tensor.shape(), p.tensor.device())?;
            // Swap the storage in place so optimisers holding the parameter see the new values.
            let src = std::mem::replace(
                &mut *fresh.write(),
                crate::Storage::Cpu(gpu_core::CpuStorage::F32(Vec::new())),
            );
            *p.tensor.write() = src;
        }
        Ok(())
    }
}
