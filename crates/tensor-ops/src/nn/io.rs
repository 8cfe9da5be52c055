//! safetensors files of a [`ParamStore`]: f32 little-endian tensors under the parameters'
//! names, with optional string metadata. Loading checks every name, shape and dtype.

use super::copy::copy_into;
use super::store::ParamStore;
use crate::{GpuError, Result, Tensor};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use std::collections::{BTreeSet, HashMap};
use std::path::Path;

fn st_err(op: &'static str, e: impl std::fmt::Display) -> GpuError {
    GpuError::invalid(op, format!("safetensors: {e}"))
}

/// A readable sentence for a `safetensors` error (its own `Display` prints the bare variant
/// name, e.g. `MetadataIncompleteBuffer`).
pub fn describe_safetensors_error(e: &safetensors::SafeTensorError) -> String {
    use safetensors::SafeTensorError as E;
    match e {
        E::InvalidHeader => "the header is not valid UTF-8".into(),
        E::InvalidHeaderStart => "the header does not start with `{`".into(),
        E::InvalidHeaderDeserialization => "the header is not a valid tensor table".into(),
        E::HeaderTooLarge => "the header is larger than 100 MB".into(),
        E::HeaderTooSmall => "the file is shorter than its 8-byte header length".into(),
        E::InvalidHeaderLength => "the header length exceeds the file".into(),
        E::TensorNotFound(name) => format!("no tensor `{name}`"),
        E::TensorInvalidInfo => "a tensor's shape and dtype do not match its data offsets".into(),
        E::InvalidOffset(name) => {
            format!("tensor `{name}`'s data does not follow the previous one's")
        }
        E::IoError(io) => format!("I/O error: {io}"),
        E::JsonError(j) => format!("the header is not valid JSON: {j}"),
        E::InvalidTensorView(dtype, shape, len) => {
            format!("{len} bytes do not hold a {dtype:?} tensor of shape {shape:?}")
        }
        E::MetadataIncompleteBuffer => {
            "the tensors' data does not fill the file (truncated or padded)".into()
        }
        E::ValidationOverflow => "a tensor's size overflows".into(),
    }
}

/// Refuses safetensors bytes whose header lies about where its tensors lie, before the
/// `safetensors` crate parses them: it adds the last data offset to the header length
/// unchecked, which overflows (a panic in debug builds, a slice past the end in release) on a
/// header whose offsets are near `usize::MAX`. Checks that the header length fits the bytes,
/// that the header is a JSON object, and that no tensor's `data_offsets` lie past the end.
pub fn check_offsets(data: &[u8]) -> std::result::Result<(), String> {
    let Some(len_bytes) = data.get(..8) else {
        return Err(format!(
            "{} bytes, shorter than the 8-byte header length",
            data.len()
        ));
    };
    let n = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes"));
    let end = usize::try_from(n)
        .ok()
        .and_then(|n| n.checked_add(8))
        .filter(|&end| end <= data.len())
        .ok_or_else(|| format!("header length {n} exceeds the file ({} bytes)", data.len()))?;
    let header: serde_json::Value =
        serde_json::from_slice(&data[8..end]).map_err(|e| format!("header is not JSON: {e}"))?;
    let entries = header.as_object().ok_or("header is not a JSON object")?;
    let data_len = (data.len() - end) as u64;
    for (name, entry) in entries.iter().filter(|(k, _)| *k != "__metadata__") {
        let offsets = entry.get("data_offsets").and_then(|o| o.as_array());
        let past_end =
            offsets.is_some_and(|o| o.iter().any(|x| x.as_u64().is_none_or(|x| x > data_len)));
        if past_end {
            return Err(format!("tensor `{name}` lies past the end of the file"));
        }
    }
    Ok(())
}

/// [`SafeTensors::deserialize`] after [`check_offsets`], errors as `op`'s.
pub(crate) fn parse<'a>(op: &'static str, data: &'a [u8]) -> Result<SafeTensors<'a>> {
    check_offsets(data).map_err(|e| st_err(op, e))?;
    SafeTensors::deserialize(data).map_err(|e| st_err(op, describe_safetensors_error(&e)))
}

/// The string metadata of safetensors bytes (empty when the file has none).
pub fn read_metadata(data: &[u8]) -> Result<HashMap<String, String>> {
    check_offsets(data).map_err(|e| st_err("read_metadata", e))?;
    let (_, meta) = SafeTensors::read_metadata(data)
        .map_err(|e| st_err("read_metadata", describe_safetensors_error(&e)))?;
    Ok(meta.metadata().clone().unwrap_or_default())
}

impl ParamStore {
    /// The parameters as safetensors bytes, with `metadata` (one host copy per parameter).
    pub fn to_safetensors(&self, metadata: &HashMap<String, String>) -> Result<Vec<u8>> {
        let op = "ParamStore::save";
        let mut bytes: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
        for p in self.params() {
            let v = p.tensor().to_vec()?;
            bytes.push((
                p.name().to_string(),
                p.tensor().shape().to_vec(),
                v.iter().flat_map(|f| f.to_le_bytes()).collect(),
            ));
        }
        let views: Vec<(String, TensorView<'_>)> = bytes
            .iter()
            .map(|(n, s, b)| {
                TensorView::new(Dtype::F32, s.clone(), b)
                    .map(|v| (n.clone(), v))
                    .map_err(|e| st_err(op, format!("{n}: {}", describe_safetensors_error(&e))))
            })
            .collect::<Result<_>>()?;
        let meta = (!metadata.is_empty()).then(|| metadata.clone());
        safetensors::serialize(views, &meta).map_err(|e| st_err(op, describe_safetensors_error(&e)))
    }

    /// Writes every parameter to `path` (no metadata).
    pub fn save(&self, path: &Path) -> Result<()> {
        self.save_with_metadata(path, &HashMap::new())
    }

    /// Writes every parameter and `metadata` to `path`.
    pub fn save_with_metadata(
        &self,
        path: &Path,
        metadata: &HashMap<String, String>,
    ) -> Result<()> {
        let out = self.to_safetensors(metadata)?;
        std::fs::write(path, out)
            .map_err(|e| GpuError::invalid("ParamStore::save", format!("{}: {e}", path.display())))
    }

    /// Overwrites the parameters, in place, from the safetensors file at `path` (see
    /// [`ParamStore::load_bytes`]).
    pub fn load(&self, path: &Path) -> Result<()> {
        let data = crate::fsio::read(path, "checkpoint", crate::fsio::TENSORS_MAX)
            .map_err(|e| GpuError::invalid("ParamStore::load", e.to_string()))?;
        self.load_bytes(&data)
    }

    /// Overwrites the parameters, in place (optimisers keep referring to them), from
    /// safetensors bytes. The file must hold exactly the store's names, each f32 with the
    /// parameter's shape: a missing or extra tensor, a wrong shape or dtype is a typed error
    /// naming the tensor. Everything is checked, and every value uploaded, before any
    /// parameter is written.
    pub fn load_bytes(&self, data: &[u8]) -> Result<()> {
        let op = "ParamStore::load";
        let st = parse(op, data)?;
        let params = self.params();
        let mut fresh = Vec::with_capacity(params.len());
        for p in &params {
            let name = p.name();
            let shape = p.tensor().shape();
            let view = st.tensor(name).map_err(|_| {
                GpuError::invalid(op, format!("missing tensor '{name}' (f32 {shape:?})"))
            })?;
            if view.dtype() != Dtype::F32 {
                return Err(GpuError::invalid(
                    op,
                    format!("tensor '{name}' is {:?}, expected F32", view.dtype()),
                ));
            }
            if view.shape() != shape {
                return Err(GpuError::shape(
                    op,
                    format!("'{name}' of shape {shape:?}"),
                    format!("'{name}' of shape {:?}", view.shape()),
                ));
            }
            fresh.push(view);
        }
        let known: BTreeSet<&str> = params.iter().map(|p| p.name()).collect();
        let extra: BTreeSet<&str> = st
            .names()
            .into_iter()
            .map(String::as_str)
            .filter(|n| !known.contains(n))
            .collect();
        if !extra.is_empty() {
            let list: Vec<&str> = extra.into_iter().collect();
            return Err(GpuError::invalid(
                op,
                format!(
                    "unexpected tensor(s) not in the store: '{}'",
                    list.join("', '")
                ),
            ));
        }
        let uploaded = fresh
            .iter()
            .zip(&params)
            .map(|(view, p)| {
                let vals: Vec<f32> = view
                    .data()
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
                Tensor::from_vec(vals, p.tensor().shape(), p.tensor().device())
            })
            .collect::<Result<Vec<_>>>()?;
        for (p, t) in params.iter().zip(&uploaded) {
            copy_into(op, p.tensor(), t)?;
        }
        Ok(())
    }
}
