//! safetensors checkpoints (nanoGPT parameter names; the tied head is not stored twice), with
//! the config as metadata: the model's [`tensor_ops::nn::ParamStore`] file.

use super::model::Gpt;
use std::collections::HashMap;
use std::path::Path;
use tensor_ops::fsio;
use tensor_ops::nn::read_metadata;
use tensor_ops::{GpuError, Result};

impl Gpt {
    /// Writes every parameter (f32, little-endian) and the config as metadata.
    pub fn save(&self, path: &Path) -> Result<()> {
        let config = serde_json::to_string(&self.config)
            .map_err(|e| GpuError::invalid("Gpt::save", e.to_string()))?;
        self.store()
            .save_with_metadata(path, &HashMap::from([("config".to_string(), config)]))
    }

    /// Loads a checkpoint written by [`Gpt::save`] (or by the PyTorch parity script) onto
    /// `device`: exactly the model's parameters, each with its shape, f32.
    pub fn load(path: &Path, device: tensor_ops::Device) -> Result<Gpt> {
        let data = fsio::read(path, "checkpoint", fsio::TENSORS_MAX)
            .map_err(|e| GpuError::invalid("Gpt::load", e.to_string()))?;
        let meta = read_metadata(&data)?;
        let cfg = meta
            .get("config")
            .ok_or_else(|| GpuError::invalid("Gpt::load", "no config in the metadata"))?;
        let config = serde_json::from_str(cfg)
            .map_err(|e| GpuError::invalid("Gpt::load", format!("config: {e}")))?;
        let model = Gpt::new(config, 0, device)?;
        model.load_weights(&data)?;
        Ok(model)
    }

    /// Overwrites the parameters in place from safetensors bytes (see
    /// [`tensor_ops::nn::ParamStore::load_bytes`]: names, shapes and dtypes must match exactly).
    pub fn load_weights(&self, data: &[u8]) -> Result<()> {
        self.store().load_bytes(data)
    }
}
