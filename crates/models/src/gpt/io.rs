//! safetensors checkpoints (nanoGPT parameter names; the tied head is not stored twice), with
//! the config as metadata: the model's [`tensor_ops::nn::ParamStore`] file.

use super::model::{Gpt, GptConfig};
use safetensors::SafeTensors;
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
        let config: GptConfig = serde_json::from_str(cfg)
            .map_err(|e| GpuError::invalid("Gpt::load", format!("config: {e}")))?;
        config.validate()?;
        check_header(&data, &config)
            .map_err(|e| GpuError::invalid("Gpt::load", format!("{}: {e}", path.display())))?;
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

/// The checkpoint's tensors (from its header, bounded by the file) against the config in its
/// metadata, before any parameter is allocated: every layer `0..n_layer` present
/// (`transformer.h.{l}.*`), and as many elements in all as the config implies. A config
/// claiming 10^9 layers is refused here, naming the first missing layer.
fn check_header(data: &[u8], config: &GptConfig) -> std::result::Result<(), String> {
    let (_, meta) = SafeTensors::read_metadata(data)
        .map_err(|e| tensor_ops::nn::describe_safetensors_error(&e))?;
    let tensors = meta.tensors();
    let layers: std::collections::HashSet<usize> = tensors
        .keys()
        .filter_map(|k| {
            k.strip_prefix("transformer.h.")?
                .split('.')
                .next()?
                .parse()
                .ok()
        })
        .collect();
    if let Some(l) = (0..config.n_layer).find(|l| !layers.contains(l)) {
        return Err(format!(
            "the config says n_layer = {}, but the file holds no tensor of layer {l} \
             (transformer.h.{l}.*; it holds {} layers)",
            config.n_layer,
            layers.len()
        ));
    }
    let held = tensors
        .values()
        .try_fold(0usize, |n, t| n.checked_add(t.shape.iter().product()))
        .ok_or("the tensors' element counts overflow")?;
    match config.num_params() {
        Some(want) if want == held => Ok(()),
        want => Err(format!(
            "the config implies {} parameter elements, the file holds {held}",
            want.map_or("more than usize".to_string(), |w| w.to_string())
        )),
    }
}
