//! The pieces the architectures' reference forwards (`crate::arch::*::reference`) share,
//! composed from `tensor_ops` ops (so they run on the CPU and on CUDA alike): weights read from
//! a checkpoint, linear layers in PyTorch's or GPT-2's layout, rotary tables, the tanh GELU, and
//! causal attention of new queries against a KV cache. The fast forwards take the loading, the
//! LayerNorm, the rotary frequencies, the GELU and the transpose from here too; their own shared
//! pieces are `crate::arch::fast`.

use tensor_ops::{Device, Tensor};

use crate::cache::LayerCache;
use crate::config::{ModelConfig, RopeScaling};
use crate::error::ModelError;
use crate::quant::{QuantKind, Quantized};
use crate::weights::Checkpoint;

/// Reads tensor `name` as f32 onto `dev` with its stored shape.
pub(crate) fn load(ck: &Checkpoint, name: &str, dev: Device) -> Result<Tensor, ModelError> {
    let shape = ck
        .info(name)
        .map(|i| i.shape.clone())
        .ok_or_else(|| crate::weights::WeightsError::MissingTensor(name.to_string()))?;
    Ok(Tensor::from_vec(ck.tensor_f32(name)?, &shape, dev)?)
}

/// A LayerNorm's weight and bias (f32), as GPT-2 names them (`{prefix}.weight`, `.bias`).
pub(crate) struct LayerNorm {
    pub weight: Tensor,
    pub bias: Tensor,
}

impl LayerNorm {
    pub(crate) fn load(ck: &Checkpoint, prefix: &str, dev: Device) -> Result<Self, ModelError> {
        Ok(LayerNorm {
            weight: load(ck, &format!("{prefix}.weight"), dev)?,
            bias: load(ck, &format!("{prefix}.bias"), dev)?,
        })
    }

    /// The LayerNorm of `x` (f32).
    pub(crate) fn forward(&self, x: &Tensor, eps: f32) -> Result<Tensor, ModelError> {
        Ok(x.layer_norm(&self.weight, &self.bias, eps)?)
    }
}

/// A linear layer: `x·Wᵀ + b` with PyTorch's `[out, in]` weight, or `x·W + b` with GPT-2's
/// Conv1D `[in, out]` weight.
pub(crate) struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
    /// Whether the weight is stored `[in, out]` (GPT-2's Conv1D).
    conv1d: bool,
}

impl Linear {
    /// `{prefix}.weight` in PyTorch's layout, with `{prefix}.bias` when `bias`.
    pub(crate) fn torch(
        ck: &Checkpoint,
        prefix: &str,
        bias: bool,
        dev: Device,
    ) -> Result<Self, ModelError> {
        Ok(Linear {
            weight: load(ck, &format!("{prefix}.weight"), dev)?,
            bias: bias
                .then(|| load(ck, &format!("{prefix}.bias"), dev))
                .transpose()?,
            conv1d: false,
        })
    }

    /// GPT-2's Conv1D `{prefix}.weight` `[in, out]` and `{prefix}.bias`.
    pub(crate) fn conv1d(ck: &Checkpoint, prefix: &str, dev: Device) -> Result<Self, ModelError> {
        Ok(Linear {
            weight: load(ck, &format!("{prefix}.weight"), dev)?,
            bias: Some(load(ck, &format!("{prefix}.bias"), dev)?),
            conv1d: true,
        })
    }

    /// A layer over an existing `[out, in]` weight (a tied head).
    pub(crate) fn tied(weight: Tensor) -> Self {
        Linear {
            weight,
            bias: None,
            conv1d: false,
        }
    }

    /// The weight rounded to `kind` (per output channel, or groups along the inputs) and
    /// dequantized, and the bytes the quantized form takes. Changes nothing:
    /// [`Linear::set_weight`] installs it.
    pub(crate) fn quantized(&self, kind: QuantKind) -> Result<(Tensor, usize), ModelError> {
        let shape = self.weight.shape().to_vec();
        let (a, b) = (shape[0], shape[1]);
        let w = self.weight.to_vec()?;
        // Rows are output channels: GPT-2's `[in, out]` weight is transposed first and back.
        let t = transpose;
        let (q, d) = if self.conv1d {
            let q = Quantized::new(kind, &t(&w, a, b), b, a)?;
            let d = t(&q.dequantize(), b, a);
            (q, d)
        } else {
            let q = Quantized::new(kind, &w, a, b)?;
            let d = q.dequantize();
            (q, d)
        };
        Ok((
            Tensor::from_vec(d, &shape, self.weight.device())?,
            q.bytes(),
        ))
    }

    pub(crate) fn set_weight(&mut self, w: Tensor) {
        self.weight = w;
    }

    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        let y = x.matmul_t(&self.weight, false, !self.conv1d)?;
        Ok(match &self.bias {
            Some(b) => y.add(b)?,
            None => y,
        })
    }
}

/// The transpose `[c, r]` of the row-major matrix `v` `[r, c]`.
pub(crate) fn transpose(v: &[f32], r: usize, c: usize) -> Vec<f32> {
    (0..c)
        .flat_map(|j| (0..r).map(move |i| (i, j)))
        .map(|(i, j)| v[i * c + j])
        .collect()
}

/// GPT-2's `gelu_new`: `x/2·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
pub(crate) fn gelu_tanh(x: &Tensor) -> Result<Tensor, ModelError> {
    let c = (2.0f64 / std::f64::consts::PI).sqrt() as f32;
    let x3 = x.mul(x)?.mul(x)?;
    let inner = x.add(&x3.mul_scalar(0.044715)?)?.mul_scalar(c)?;
    Ok(x.mul(&inner.tanh()?.add_scalar(1.0)?)?.mul_scalar(0.5)?)
}

/// The rotary frequencies of a Llama-family config: `θ^(−2i/d)` for `i < d/2`, computed in f32
/// as `transformers` does, then Llama 3's scaling when configured.
pub(crate) fn inv_freq(cfg: &ModelConfig, theta: f64) -> Vec<f32> {
    let d = cfg.head_dim;
    let base = (0..d / 2)
        .map(|i| 1.0 / (theta as f32).powf((2 * i) as f32 / d as f32))
        .collect::<Vec<f32>>();
    match &cfg.rope_scaling {
        None => base,
        Some(s) => base.into_iter().map(|f| llama3_scale(f, s)).collect(),
    }
}

/// `transformers`' `_compute_llama3_parameters` for one frequency (f32 arithmetic).
fn llama3_scale(f: f32, s: &RopeScaling) -> f32 {
    let (factor, low, high) = (
        s.factor as f32,
        s.low_freq_factor as f32,
        s.high_freq_factor as f32,
    );
    let old = s.original_max_position_embeddings as f32;
    let (low_wavelen, high_wavelen) = (old / low, old / high);
    let wavelen = 2.0 * std::f32::consts::PI / f;
    if wavelen > low_wavelen {
        return f / factor;
    }
    if wavelen < high_wavelen {
        return f;
    }
    let smooth = (old / wavelen - low) / (high - low);
    (1.0 - smooth) * f / factor + smooth * f
}

/// Where a forward pass's tokens sit: slots `start..start + t` of each row, of which row
/// `r`'s first `pads[r]` slots of the whole sequence are left padding (masked out; the row's
/// real tokens are at positions 0, 1, … from slot `pads[r]`, as `transformers` numbers them).
pub(crate) struct Slots<'a> {
    pub start: usize,
    pub t: usize,
    pub pads: &'a [usize],
}

impl Slots<'_> {
    /// The position of each new token, `[b·t]` (0 for a padding slot).
    pub(crate) fn positions(&self) -> Vec<u32> {
        self.pads
            .iter()
            .flat_map(|&p| {
                (self.start..self.start + self.t).map(move |s| s.saturating_sub(p) as u32)
            })
            .collect()
    }

    /// The additive mask `[b, 1, t, start + t]`: query slot `i` sees key slot `j` when
    /// `pad ≤ j ≤ i` and, under a sliding `window` `W`, `i − W < j` (a padding query sees
    /// nothing and is never read).
    pub(crate) fn mask(&self, dev: Device, window: Option<usize>) -> Result<Tensor, ModelError> {
        let total = self.start + self.t;
        let mut m = Vec::with_capacity(self.pads.len() * self.t * total);
        for &pad in self.pads {
            for i in self.start..total {
                let lo = window.map_or(pad, |w| pad.max((i + 1).saturating_sub(w)));
                m.extend((0..total).map(|j| if j >= lo && j <= i { 0.0 } else { f32::MIN }));
            }
        }
        Ok(Tensor::from_vec(
            m,
            &[self.pads.len(), 1, self.t, total],
            dev,
        )?)
    }
}

/// The masks of a pass ([`Slots::mask`]), one per distinct window, made when first asked for.
pub(crate) struct Masks<'a> {
    slots: &'a Slots<'a>,
    dev: Device,
    made: Vec<(Option<usize>, Tensor)>,
}

impl<'a> Masks<'a> {
    pub(crate) fn new(slots: &'a Slots<'a>, dev: Device) -> Self {
        Masks {
            slots,
            dev,
            made: Vec::new(),
        }
    }

    /// The mask of `window`.
    pub(crate) fn get(&mut self, window: Option<usize>) -> Result<Tensor, ModelError> {
        if let Some((_, m)) = self.made.iter().find(|(w, _)| *w == window) {
            return Ok(m.clone());
        }
        let m = self.slots.mask(self.dev, window)?;
        self.made.push((window, m.clone()));
        Ok(m)
    }
}

/// `cos` and `sin` `[b, 1, t, d]` of the given positions (`[b·t]`; each frequency twice, the
/// rotate-half layout), on `dev`.
pub(crate) fn rope_tables(
    freqs: &[f32],
    positions: &[u32],
    (b, t): (usize, usize),
    dev: Device,
) -> Result<(Tensor, Tensor), ModelError> {
    let d = 2 * freqs.len();
    let (mut cos, mut sin) = (Vec::with_capacity(b * t * d), Vec::with_capacity(b * t * d));
    for &p in positions {
        for _ in 0..2 {
            for &f in freqs {
                // The angle as an f32 product (as `transformers` computes it), its cosine and
                // sine rounded once.
                let a = (p as f32 * f) as f64;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
    }
    Ok((
        Tensor::from_vec(cos, &[b, 1, t, d], dev)?,
        Tensor::from_vec(sin, &[b, 1, t, d], dev)?,
    ))
}

/// `x·cos + rotate_half(x)·sin` for `x` `[b, h, t, d]` and tables `[b, 1, t, d]`.
pub(crate) fn apply_rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor, ModelError> {
    let d = x.shape()[3];
    let (x1, x2) = (x.narrow(3, 0, d / 2)?, x.narrow(3, d / 2, d / 2)?);
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], 3)?;
    Ok(x.mul(cos)?.add(&rotated.mul(sin)?)?)
}

/// `[b, t, h·d]` → `[b, h, t, d]`.
pub(crate) fn heads(x: &Tensor, h: usize) -> Result<Tensor, ModelError> {
    let (b, t, c) = (x.shape()[0], x.shape()[1], x.shape()[2]);
    Ok(x.reshape(&[b, t, h, c / h])?.permute(&[0, 2, 1, 3])?)
}

/// Attention of the new queries `q` `[b, h, t, d]` (slots `start..start + t`, where `start` is
/// what `cache` held before) against the cache extended with `k`, `v` `[b, kv, t, d]`, under
/// `mask` ([`Slots::mask`]), with scores `scale·q·k`; `h` is a multiple of `kv` (grouped-query
/// attention). Returns `[b, t, h·d]` and leaves `k`, `v` appended to the cache.
pub(crate) fn cached_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cache: &mut LayerCache,
    mask: &Tensor,
    scale: f32,
) -> Result<Tensor, ModelError> {
    let (b, h, t, d) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
    let start = cache.len();
    let (k, v) = cache.append(k, v)?;
    let total = start + t;
    let kv = k.shape()[1];
    let repeat = |x: &Tensor| -> Result<Tensor, ModelError> {
        if kv == h {
            return Ok(x.clone());
        }
        Ok(x.reshape(&[b, kv, 1, total, d])?
            .expand(&[b, kv, h / kv, total, d])?
            .reshape(&[b, h, total, d])?)
    };
    let (k, v) = (repeat(&k)?, repeat(&v)?);
    let scores = q.matmul_t(&k, false, true)?.mul_scalar(scale)?;
    let probs = scores.add(mask)?.softmax()?;
    Ok(probs
        .matmul(&v)?
        .permute(&[0, 2, 1, 3])?
        .reshape(&[b, t, h * d])?)
}
