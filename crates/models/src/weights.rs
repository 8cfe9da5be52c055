//! Memory-mapped safetensors weights (one file or an indexed set of shards), checked against the
//! tensors the config implies before any of them is read.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::TensorInfo;
use safetensors::{Dtype, SafeTensors};
use tensor_ops::fsio::{self, FileError};
use thiserror::Error;

use crate::config::{Architecture, ModelConfig, MODEL_DIR};
use crate::expected::{expected_iter, is_ignored_buffer};

mod scan;
pub use scan::{first_non_finite, NonFiniteTensor};

const SINGLE: &str = "model.safetensors";
const INDEX: &str = "model.safetensors.index.json";

/// Why a checkpoint's weights were refused.
#[derive(Debug, Error)]
pub enum WeightsError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The model directory or a weights file is not what it should be.
    #[error(transparent)]
    File(#[from] FileError),
    #[error("no {SINGLE} or {INDEX} in {0}")]
    NoWeights(PathBuf),
    #[error("bad shard index {path}: {reason}")]
    BadIndex { path: PathBuf, reason: String },
    #[error("shard {0} listed in the index is missing")]
    MissingShard(PathBuf),
    #[error("truncated or corrupt safetensors file {path}: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("tensor `{0}` is in more than one shard")]
    DuplicateTensor(String),
    #[error("the index puts tensor `{name}` in {shard}, which does not hold it")]
    IndexMismatch { name: String, shard: String },
    #[error("tensor `{0}` is missing")]
    MissingTensor(String),
    #[error("unexpected tensor `{0}` (not implied by the config)")]
    UnexpectedTensor(String),
    #[error("tensor `{name}` has shape {found:?}, expected {expected:?}")]
    WrongShape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("tensor `{name}` has dtype {found:?}; expected BF16, F16 or F32")]
    WrongDtype { name: String, found: Dtype },
}

/// One memory-mapped safetensors file with its parsed, validated header.
struct Shard {
    path: PathBuf,
    mmap: Mmap,
    data_start: usize,
    tensors: HashMap<String, TensorInfo>,
}

/// Where a tensor lives: shard index and its key in that shard.
#[derive(Debug, Clone)]
struct Location {
    shard: usize,
    key: String,
}

/// The weights of a model directory, memory-mapped; names are canonical (GPT-2's optional
/// `transformer.` prefix stripped, ignored buffers dropped).
pub struct Checkpoint {
    shards: Vec<Shard>,
    names: BTreeMap<String, Location>,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let paths: Vec<_> = self.shards.iter().map(|s| &s.path).collect();
        f.debug_struct("Checkpoint")
            .field("shards", &paths)
            .field("tensors", &self.names.len())
            .finish()
    }
}

impl Checkpoint {
    /// Maps the weights of `dir` without checking them against a config.
    pub fn open(dir: &Path, arch: Architecture) -> Result<Self, WeightsError> {
        let shards = shard_paths(dir)?;
        let mapped = shards
            .files
            .iter()
            .map(|p| Shard::open(p))
            .collect::<Result<Vec<_>, _>>()?;
        let names = locate(&mapped, arch)?;
        if let Some(map) = &shards.weight_map {
            check_index(map, &mapped, &names, arch)?;
        }
        Ok(Self {
            shards: mapped,
            names,
        })
    }

    /// Maps the weights of `dir` and checks them against the tensors `cfg` implies.
    pub fn open_checked(dir: &Path, cfg: &ModelConfig) -> Result<Self, WeightsError> {
        let ckpt = Self::open(dir, cfg.architecture)?;
        ckpt.check(cfg)?;
        Ok(ckpt)
    }

    /// Every expected tensor present with its shape and a float dtype, and nothing else. The
    /// config's tensors are listed one layer at a time and the first missing one stops the
    /// check, so a config claiming far more layers than the file holds fails at once without
    /// listing (or allocating) the rest.
    pub fn check(&self, cfg: &ModelConfig) -> Result<(), WeightsError> {
        let mut wanted = std::collections::HashSet::new();
        for e in expected_iter(cfg) {
            let info = self
                .info(&e.name)
                .ok_or_else(|| WeightsError::MissingTensor(e.name.clone()))?;
            check_dtype(&e.name, info.dtype)?;
            if info.shape != e.shape {
                return Err(WeightsError::WrongShape {
                    name: e.name.clone(),
                    expected: e.shape.clone(),
                    found: info.shape.clone(),
                });
            }
            wanted.insert(e.name);
        }
        match self.names.keys().find(|n| !wanted.contains(*n)) {
            Some(extra) => Err(WeightsError::UnexpectedTensor(extra.clone())),
            None => Ok(()),
        }
    }

    /// Canonical tensor names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.keys().map(String::as_str)
    }

    /// Dtype and shape of a tensor.
    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        let loc = self.names.get(name)?;
        self.shards[loc.shard].tensors.get(&loc.key)
    }

    /// A tensor's raw little-endian bytes (borrowed from the memory map).
    pub fn bytes(&self, name: &str) -> Result<&[u8], WeightsError> {
        let loc = self
            .names
            .get(name)
            .ok_or_else(|| WeightsError::MissingTensor(name.to_string()))?;
        let shard = &self.shards[loc.shard];
        let (s, e) = shard.tensors[&loc.key].data_offsets;
        // In bounds: the header was validated against the file length in `Shard::open`.
        Ok(&shard.mmap[shard.data_start + s..shard.data_start + e])
    }

    /// A tensor as f32, row-major, converting BF16/F16.
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>, WeightsError> {
        let bytes = self.bytes(name)?;
        let dtype = self.info(name).map(|i| i.dtype).unwrap_or(Dtype::U8);
        let out = match dtype {
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::F16 => bytes
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dtype::BF16 => bytes
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            found => {
                return Err(WeightsError::WrongDtype {
                    name: name.to_string(),
                    found,
                })
            }
        };
        Ok(out)
    }
}

fn check_dtype(name: &str, dtype: Dtype) -> Result<(), WeightsError> {
    match dtype {
        Dtype::BF16 | Dtype::F16 | Dtype::F32 => Ok(()),
        found => Err(WeightsError::WrongDtype {
            name: name.to_string(),
            found,
        }),
    }
}

/// Canonical name of a stored key; `None` for buffers to skip.
fn canonical(key: &str, arch: Architecture) -> Option<&str> {
    let name = match arch {
        Architecture::Gpt2 => key.strip_prefix("transformer.").unwrap_or(key),
        _ => key,
    };
    (!is_ignored_buffer(name)).then_some(name)
}

fn locate(
    shards: &[Shard],
    arch: Architecture,
) -> Result<BTreeMap<String, Location>, WeightsError> {
    let mut names = BTreeMap::new();
    for (i, shard) in shards.iter().enumerate() {
        for key in shard.tensors.keys() {
            let Some(name) = canonical(key, arch) else {
                continue;
            };
            let loc = Location {
                shard: i,
                key: key.clone(),
            };
            if names.insert(name.to_string(), loc).is_some() {
                return Err(WeightsError::DuplicateTensor(name.to_string()));
            }
        }
    }
    Ok(names)
}

/// Each index entry must name the shard that actually holds the tensor.
fn check_index(
    map: &BTreeMap<String, String>,
    shards: &[Shard],
    names: &BTreeMap<String, Location>,
    arch: Architecture,
) -> Result<(), WeightsError> {
    for (key, file) in map {
        let Some(name) = canonical(key, arch) else {
            continue;
        };
        let holder = names.get(name).map(|l| &shards[l.shard].path);
        if holder.and_then(|p| p.file_name()).and_then(|f| f.to_str()) != Some(file.as_str()) {
            return Err(WeightsError::IndexMismatch {
                name: name.to_string(),
                shard: file.clone(),
            });
        }
    }
    Ok(())
}

struct ShardList {
    files: Vec<PathBuf>,
    weight_map: Option<BTreeMap<String, String>>,
}

/// `model.safetensors`, else the distinct shards of `model.safetensors.index.json`.
/// A directory or a FIFO in place of a file is a [`WeightsError::File`], not "missing".
fn shard_paths(dir: &Path) -> Result<ShardList, WeightsError> {
    fsio::check_dir(dir, MODEL_DIR)?;
    let single = dir.join(SINGLE);
    if exists(&single, "weights file")? {
        return Ok(ShardList {
            files: vec![single],
            weight_map: None,
        });
    }
    let index = dir.join(INDEX);
    if !exists(&index, "shard index")? {
        return Err(WeightsError::NoWeights(dir.to_path_buf()));
    }
    let map = read_index(&index)?;
    let mut files: Vec<&String> = map.values().collect();
    files.sort();
    files.dedup();
    let files = files.into_iter().map(|f| dir.join(f)).collect::<Vec<_>>();
    for f in &files {
        if !exists(f, "weights shard")? {
            return Err(WeightsError::MissingShard(f.clone()));
        }
    }
    Ok(ShardList {
        files,
        weight_map: Some(map),
    })
}

/// Whether `path` is a regular file (`false`: it does not exist; anything else is refused).
fn exists(path: &Path, what: &'static str) -> Result<bool, WeightsError> {
    match fsio::check_file(path, what) {
        Ok(_) => Ok(true),
        Err(e) if e.is_missing() => Ok(false),
        Err(e) => Err(e.into()),
    }
}

fn read_index(path: &Path) -> Result<BTreeMap<String, String>, WeightsError> {
    #[derive(serde::Deserialize)]
    struct Index {
        weight_map: BTreeMap<String, String>,
    }
    let bad = |reason: String| WeightsError::BadIndex {
        path: path.to_path_buf(),
        reason,
    };
    let text = fsio::read_to_string(path, "shard index", fsio::JSON_MAX)?;
    let index: Index = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let plain = |f: &String| !f.is_empty() && !f.contains(['/', '\\']) && f != ".." && f != ".";
    match index.weight_map.values().find(|f| !plain(f)) {
        Some(f) => Err(bad(format!("shard name `{f}` is not a plain file name"))),
        None => Ok(index.weight_map),
    }
}

impl Shard {
    fn open(path: &Path) -> Result<Self, WeightsError> {
        let io = |source| WeightsError::Io {
            path: path.to_path_buf(),
            source,
        };
        let (file, _) = fsio::open(path, "weights file", u64::MAX)?;
        // SAFETY: the map is read-only; like every mmap-based loader we assume the checkpoint
        // is not modified while the process holds it.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
        let (header_len, tensors) =
            parse_header(&mmap).map_err(|reason| WeightsError::Corrupt {
                path: path.to_path_buf(),
                reason,
            })?;
        Ok(Self {
            path: path.to_path_buf(),
            mmap,
            data_start: 8 + header_len,
            tensors,
        })
    }
}

/// Parses and validates a safetensors header: every tensor's bytes lie inside the buffer.
pub(crate) fn parse_header(buf: &[u8]) -> Result<(usize, HashMap<String, TensorInfo>), String> {
    tensor_ops::nn::check_offsets(buf)?;
    let (n, meta) = SafeTensors::read_metadata(buf)
        .map_err(|e| tensor_ops::nn::describe_safetensors_error(&e))?;
    let tensors = meta
        .tensors()
        .into_iter()
        .map(|(k, v)| (k, v.clone()))
        .collect();
    Ok((n, tensors))
}
