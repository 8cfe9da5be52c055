//! [`OptimizerState`]: an optimiser's state as named tensors plus named host scalars, its
//! safetensors form (f32 tensors; the optimiser's name, the tensors' order and the scalars in
//! the string metadata), and the checked restore every optimiser's `load_state` uses.

use crate::tensor::Tensor;
use gpu_core::{DType, Device, GpuError, Result};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use std::collections::HashMap;
use std::path::Path;

/// A copy of an optimiser's state ([`super::Optimizer::state`]): every state tensor (device
/// copies, f32) under a name (`"m.0"`, `"z.3"`, ...) in the optimiser's order, and its host
/// scalars (step counts, running sums) as f64.
#[derive(Debug, Clone)]
pub struct OptimizerState {
    /// The optimiser's [`super::Optimizer::name`].
    pub optimizer: String,
    /// The state tensors, in order.
    pub tensors: Vec<(String, Tensor)>,
    /// The host scalars, in order.
    pub scalars: Vec<(String, f64)>,
}

fn st_err(op: &'static str, e: impl std::fmt::Display) -> GpuError {
    GpuError::invalid(op, format!("safetensors: {e}"))
}

fn meta_get<'a>(op: &'static str, m: &'a HashMap<String, String>, key: &str) -> Result<&'a str> {
    m.get(key)
        .map(String::as_str)
        .ok_or_else(|| GpuError::invalid(op, format!("metadata '{key}' is missing")))
}

/// Splits a comma-joined list (empty string: no names).
fn names(list: &str) -> Vec<&str> {
    list.split(',').filter(|s| !s.is_empty()).collect()
}

impl OptimizerState {
    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        self.tensors.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }

    /// The scalar called `name`.
    pub fn scalar(&self, name: &str) -> Option<f64> {
        self.scalars
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
    }

    /// The state as safetensors bytes: each tensor f32 under its name; metadata `optimizer`,
    /// `tensors` (the names in order, comma-joined) and `scalar.NAME` (each scalar, written
    /// so that it reads back exactly) with `scalars` (their names in order).
    pub fn to_safetensors(&self) -> Result<Vec<u8>> {
        const OP: &str = "OptimizerState::save";
        let mut data = Vec::with_capacity(self.tensors.len());
        for (name, t) in &self.tensors {
            if name.contains(',') || t.dtype() != DType::F32 {
                return Err(GpuError::invalid(
                    OP,
                    format!("tensor '{name}': names without commas, f32 tensors only"),
                ));
            }
            let bytes: Vec<u8> = t.to_vec()?.iter().flat_map(|f| f.to_le_bytes()).collect();
            data.push((name.clone(), t.shape().to_vec(), bytes));
        }
        let views: Vec<(String, TensorView<'_>)> = data
            .iter()
            .map(|(n, s, b)| {
                TensorView::new(Dtype::F32, s.clone(), b)
                    .map(|v| (n.clone(), v))
                    .map_err(|e| st_err(OP, format!("{n}: {e}")))
            })
            .collect::<Result<_>>()?;
        let mut meta = HashMap::new();
        meta.insert("optimizer".to_string(), self.optimizer.clone());
        let tensor_names: Vec<&str> = self.tensors.iter().map(|(n, _)| n.as_str()).collect();
        meta.insert("tensors".to_string(), tensor_names.join(","));
        let scalar_names: Vec<&str> = self.scalars.iter().map(|(n, _)| n.as_str()).collect();
        meta.insert("scalars".to_string(), scalar_names.join(","));
        for (n, v) in &self.scalars {
            meta.insert(format!("scalar.{n}"), format!("{v:?}"));
        }
        safetensors::serialize(views, &Some(meta)).map_err(|e| st_err(OP, e))
    }

    /// Reads bytes from [`OptimizerState::to_safetensors`]; the tensors land on the CPU
    /// (`load_state` uploads them to the optimiser's device).
    pub fn from_safetensors(data: &[u8]) -> Result<OptimizerState> {
        const OP: &str = "OptimizerState::load";
        let st = crate::nn::io::parse(OP, data)?;
        let (_, header) = SafeTensors::read_metadata(data).map_err(|e| st_err(OP, e))?;
        let meta = header.metadata().clone().unwrap_or_default();
        let mut tensors = Vec::new();
        for name in names(meta_get(OP, &meta, "tensors")?) {
            let view = st
                .tensor(name)
                .map_err(|_| GpuError::invalid(OP, format!("missing tensor '{name}'")))?;
            if view.dtype() != Dtype::F32 {
                return Err(GpuError::invalid(
                    OP,
                    format!("tensor '{name}' is {:?}, expected F32", view.dtype()),
                ));
            }
            let vals: Vec<f32> = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            tensors.push((
                name.to_string(),
                Tensor::from_vec(vals, view.shape(), Device::Cpu)?,
            ));
        }
        if st.names().len() != tensors.len() {
            return Err(GpuError::invalid(
                OP,
                "the file holds tensors not listed in its metadata",
            ));
        }
        let mut scalars = Vec::new();
        for name in names(meta_get(OP, &meta, "scalars")?) {
            let text = meta_get(OP, &meta, &format!("scalar.{name}"))?;
            let v = text
                .parse::<f64>()
                .map_err(|e| GpuError::invalid(OP, format!("scalar '{name}' = '{text}': {e}")))?;
            scalars.push((name.to_string(), v));
        }
        Ok(OptimizerState {
            optimizer: meta_get(OP, &meta, "optimizer")?.to_string(),
            tensors,
            scalars,
        })
    }

    /// Writes [`OptimizerState::to_safetensors`] to `path`.
    pub fn save(&self, path: &Path) -> Result<()> {
        let bytes = self.to_safetensors()?;
        std::fs::write(path, bytes).map_err(|e| {
            GpuError::invalid("OptimizerState::save", format!("{}: {e}", path.display()))
        })
    }

    /// Reads a file written by [`OptimizerState::save`].
    pub fn load(path: &Path) -> Result<OptimizerState> {
        let data = crate::fsio::read(path, "optimizer state", crate::fsio::TENSORS_MAX)
            .map_err(|e| GpuError::invalid("OptimizerState::load", e.to_string()))?;
        Self::from_safetensors(&data)
    }
}

/// Checks `state` against an optimiser's layout (its name, its tensors' names, f32 dtypes and
/// shapes in order, its scalars' names in order), uploads tensors held on another device, and
/// returns the tensors to write (in `mine`'s order) with the scalars' values. Writes nothing.
pub(crate) fn checked_state(
    op: &'static str,
    name: &str,
    mine: &[(String, &Tensor)],
    scalar_names: &[&str],
    state: &OptimizerState,
) -> Result<(Vec<Tensor>, Vec<f64>)> {
    if state.optimizer != name {
        return Err(GpuError::invalid(
            op,
            format!(
                "a state of '{}', this optimiser is '{name}'",
                state.optimizer
            ),
        ));
    }
    if state.tensors.len() != mine.len() {
        return Err(GpuError::invalid(
            op,
            format!(
                "the state holds {} tensors, the optimiser {}",
                state.tensors.len(),
                mine.len()
            ),
        ));
    }
    for ((n, t), (sn, st)) in mine.iter().zip(&state.tensors) {
        if n != sn || t.shape() != st.shape() || st.dtype() != DType::F32 {
            return Err(GpuError::shape(
                op,
                format!("'{n}': f32 {:?}", t.shape()),
                format!("'{sn}': {} {:?}", st.dtype(), st.shape()),
            ));
        }
    }
    let got: Vec<&str> = state.scalars.iter().map(|(n, _)| n.as_str()).collect();
    if got != scalar_names {
        return Err(GpuError::invalid(
            op,
            format!("scalars {got:?}, the optimiser keeps {scalar_names:?}"),
        ));
    }
    let mut fresh = Vec::with_capacity(mine.len());
    for ((_, t), (_, st)) in mine.iter().zip(&state.tensors) {
        fresh.push(st.to(t.device())?);
    }
    Ok((fresh, state.scalars.iter().map(|(_, v)| *v).collect()))
}

/// A host scalar that must be a whole number in `0..=u32::MAX` (a step count).
pub(crate) fn count_scalar(op: &'static str, what: &str, v: f64) -> Result<u32> {
    if v.fract() == 0.0 && (0.0..=u32::MAX as f64).contains(&v) {
        Ok(v as u32)
    } else {
        Err(GpuError::invalid(
            op,
            format!("{what} must be a whole number in 0..=u32::MAX, got {v}"),
        ))
    }
}

/// Writes checked tensors ([`checked_state`]) into the optimiser's, in place.
pub(crate) fn assign_all(mine: &[(String, &Tensor)], fresh: &[Tensor]) -> Result<()> {
    for ((_, t), f) in mine.iter().zip(fresh) {
        t.assign(f)?;
    }
    Ok(())
}

/// Restores `state` for an optimiser whose one host scalar is its step count: checks it
/// against `mine` ([`checked_state`]) and the count ([`count_scalar`]), then writes the
/// tensors and returns the count.
pub(crate) fn load_counted(
    op: &'static str,
    name: &str,
    mine: &[(String, &Tensor)],
    state: &OptimizerState,
) -> Result<u32> {
    let (fresh, sc) = checked_state(op, name, mine, &["step"], state)?;
    let step = count_scalar(op, "step", sc[0])?;
    assign_all(mine, &fresh)?;
    Ok(step)
}

/// `(prefix.i, tensor)` for each tensor of each `(prefix, list)`, in order.
pub(crate) fn named<'a>(lists: &[(&str, &'a [Tensor])]) -> Vec<(String, &'a Tensor)> {
    lists
        .iter()
        .flat_map(|(prefix, ts)| {
            ts.iter()
                .enumerate()
                .map(move |(i, t)| (format!("{prefix}.{i}"), t))
        })
        .collect()
}

/// Device copies of named tensors.
pub(crate) fn copy_named(ts: &[(String, &Tensor)]) -> Result<Vec<(String, Tensor)>> {
    ts.iter()
        .map(|(n, t)| Ok((n.clone(), t.deep_copy()?)))
        .collect()
}
