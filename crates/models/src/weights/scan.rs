//! Which checkpoint tensor holds a non-finite value (NaN, ±∞): the cause of non-finite logits
//! named after the fact. Nothing runs it on the normal path; a caller that met
//! [`crate::ModelError::NonFiniteLogits`] scans the model directory once.

use std::path::{Path, PathBuf};

use rayon::prelude::*;
use safetensors::Dtype;

use super::{shard_paths, Shard, WeightsError};
use crate::expected::is_ignored_buffer;

/// Bytes one task of the scan counts (a multiple of every element's width).
const CHUNK: usize = 1 << 20;

/// A checkpoint tensor holding non-finite values, and how many of each kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NonFiniteTensor {
    /// Its key in the file (as stored: GPT-2's `transformer.` prefix kept).
    pub name: String,
    /// The safetensors file holding it.
    pub file: PathBuf,
    pub nan: usize,
    pub pos_inf: usize,
    pub neg_inf: usize,
}

impl std::fmt::Display for NonFiniteTensor {
    /// "tensor `lm_head.weight` holds 1 NaN", "… holds 2 NaN, 1 +inf".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kinds = [
            (self.nan, "NaN"),
            (self.pos_inf, "+inf"),
            (self.neg_inf, "-inf"),
        ];
        let counts: Vec<String> = kinds
            .iter()
            .filter(|(n, _)| *n > 0)
            .map(|(n, what)| format!("{n} {what}"))
            .collect();
        write!(f, "tensor `{}` holds {}", self.name, counts.join(", "))
    }
}

/// The first tensor of the model directory `dir` holding a NaN or an infinity (f32, bf16 and
/// f16 tensors; the buffers the loader ignores are skipped), or `None` when every weight is
/// finite. "First" is in the order of the files (`model.safetensors`, or the index's shards
/// sorted by name), then of the tensors' bytes in each. The files are found, memory-mapped and
/// their headers validated as the loader does ([`crate::Checkpoint`]); each tensor is counted
/// in chunks of [`CHUNK`] bytes in parallel. One pass over the weights' bytes at most.
pub fn first_non_finite(dir: &Path) -> Result<Option<NonFiniteTensor>, WeightsError> {
    for path in shard_paths(dir)?.files {
        let shard = Shard::open(&path)?;
        let mut tensors: Vec<_> = shard.tensors.iter().collect();
        tensors.sort_by_key(|(_, info)| info.data_offsets.0);
        for (name, info) in tensors {
            let Some(layout) = Layout::of(info.dtype) else {
                continue;
            };
            if is_ignored_buffer(name) {
                continue;
            }
            let (s, e) = info.data_offsets;
            // In bounds: the header was validated against the file length in `Shard::open`.
            let bytes = &shard.mmap[shard.data_start + s..shard.data_start + e];
            let n = count(bytes, layout);
            if n.nan + n.pos_inf + n.neg_inf > 0 {
                return Ok(Some(NonFiniteTensor {
                    name: name.clone(),
                    file: path.clone(),
                    nan: n.nan,
                    pos_inf: n.pos_inf,
                    neg_inf: n.neg_inf,
                }));
            }
        }
    }
    Ok(None)
}

/// Where a float format keeps its bits: all exponent bits set is ∞ (mantissa 0) or NaN.
#[derive(Clone, Copy)]
struct Layout {
    width: usize,
    exp: u32,
    man: u32,
    sign: u32,
}

impl Layout {
    fn of(dtype: Dtype) -> Option<Layout> {
        let (width, exp, man, sign) = match dtype {
            Dtype::F32 => (4, 0x7f80_0000, 0x007f_ffff, 0x8000_0000),
            Dtype::BF16 => (2, 0x7f80, 0x007f, 0x8000),
            Dtype::F16 => (2, 0x7c00, 0x03ff, 0x8000),
            _ => return None,
        };
        Some(Layout {
            width,
            exp,
            man,
            sign,
        })
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Counts {
    nan: usize,
    pos_inf: usize,
    neg_inf: usize,
}

impl Counts {
    fn add(self, o: Counts) -> Counts {
        Counts {
            nan: self.nan + o.nan,
            pos_inf: self.pos_inf + o.pos_inf,
            neg_inf: self.neg_inf + o.neg_inf,
        }
    }
}

/// The non-finite values of little-endian `bytes` of `layout`, counted in parallel chunks.
fn count(bytes: &[u8], layout: Layout) -> Counts {
    bytes
        .par_chunks(CHUNK)
        .map(|c| count_chunk(c, layout))
        .reduce(Counts::default, Counts::add)
}

fn count_chunk(bytes: &[u8], l: Layout) -> Counts {
    let mut n = Counts::default();
    for v in bytes.chunks_exact(l.width) {
        let bits = match *v {
            [a, b, c, d] => u32::from_le_bytes([a, b, c, d]),
            [a, b] => u32::from(u16::from_le_bytes([a, b])),
            _ => continue,
        };
        if bits & l.exp != l.exp {
            continue;
        }
        if bits & l.man != 0 {
            n.nan += 1;
        } else if bits & l.sign != 0 {
            n.neg_inf += 1;
        } else {
            n.pos_inf += 1;
        }
    }
    n
}
