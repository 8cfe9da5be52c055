//! GPT-2 in the fast engine: learned positions (`wpe`, each token's position given with its
//! id), pre-LayerNorm blocks with biases on every projection, the MLP's GELU (tanh or exact,
//! from the config) and the head tied to `wte` unless the checkpoint holds `lm_head`, as the
//! reference (`super::reference`) runs it. The projections are the checkpoint's Conv1D
//! `[in, out]` weights transposed at load to `[out, in]` (c_attn's q, k, v column blocks become
//! the fused q/k/v rows the cache ops read), then stored as the Llama family's are ([`Proj`]:
//! the engine's dtype, or int8/int4). The cache write is `rope_append` without rotation (an
//! empty `inv_freq`: cos 1, sin 0, an exact copy), the attention the Llama family's
//! (`prefill_attention` in a prefill, `cache_attention` in decode): the same cache, prefill and
//! decode. LayerNorms, biases, the GELU and the residual stream are f32; a projection's input
//! is rounded once to the engine's dtype.

use tensor_ops::{DType, Device, Tensor};

use crate::arch::fast::{bytes, FastPass, Proj};
use crate::arch::{DecoderModel, DecoderSource};
use crate::config::{Gpt2Activation, ModelConfig};
use crate::error::ModelError;
use crate::layers::{gelu_tanh, load, transpose, LayerNorm};
use crate::quant::QuantKind;
use crate::weights::Checkpoint;

/// A LayerNorm (f32) whose output the engine rounds to its dtype.
struct Norm(LayerNorm);

impl Norm {
    fn load(ck: &Checkpoint, prefix: &str, dev: Device) -> Result<Self, ModelError> {
        Ok(Norm(LayerNorm::load(ck, prefix, dev)?))
    }

    /// The LayerNorm of the f32 `x` (in f32), rounded to `dtype`.
    fn apply(&self, x: &Tensor, eps: f32, dtype: DType) -> Result<Tensor, ModelError> {
        Ok(self.0.forward(x, eps)?.to_dtype(dtype)?)
    }

    fn bytes(&self) -> usize {
        bytes(&self.0.weight) + bytes(&self.0.bias)
    }
}

/// A Conv1D layer: the projection `[out, in]` and its f32 bias `[out]`.
struct Affine {
    w: Proj,
    bias: Tensor,
}

impl Affine {
    /// `{prefix}.weight` (`[in, out]`, transposed here) and `{prefix}.bias`.
    fn load(
        ck: &Checkpoint,
        prefix: &str,
        dev: Device,
        dtype: DType,
        quant: Option<QuantKind>,
    ) -> Result<Self, ModelError> {
        let name = format!("{prefix}.weight");
        let w = load(ck, &name, Device::Cpu)?;
        let &[rows, cols] = w.shape() else {
            return Err(ModelError::Unsupported(format!(
                "{name} of shape {:?} (not a matrix)",
                w.shape()
            )));
        };
        let rows_out = Tensor::from_vec(
            transpose(&w.to_vec()?, rows, cols),
            &[cols, rows],
            Device::Cpu,
        )?;
        Ok(Affine {
            w: Proj::from_host(&rows_out, dev, dtype, quant)?,
            bias: load(ck, &format!("{prefix}.bias"), dev)?,
        })
    }

    /// `x · Wᵀ + b`, in f32 (the product in x's dtype, the bias added in f32).
    fn apply(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        Ok(self.w.apply(x)?.add(&self.bias)?)
    }

    fn bytes(&self) -> usize {
        self.w.bytes() + bytes(&self.bias)
    }
}

struct Block {
    ln_1: Norm,
    /// `[3·hidden, hidden]`: q, k, v rows.
    attn: Affine,
    attn_proj: Affine,
    ln_2: Norm,
    fc: Affine,
    mlp_proj: Affine,
}

/// GPT-2 as the fast engine runs it.
pub struct Gpt2Fast {
    cfg: ModelConfig,
    dtype: DType,
    /// f32 `[vocab, hidden]` and `[context, hidden]` (the embedding lookups read f32 tables).
    wte: Tensor,
    wpe: Tensor,
    blocks: Vec<Block>,
    ln_f: Norm,
    /// `[vocab, hidden]` in the engine's dtype: `wte` itself unless the checkpoint has `lm_head`.
    head: Tensor,
    activation: Gpt2Activation,
    /// An empty `inv_freq`: `rope_append` writes the keys without rotating them.
    no_rotation: Tensor,
}

impl DecoderModel for Gpt2Fast {
    fn load(src: DecoderSource<'_>) -> Result<Self, ModelError> {
        let (cfg, ck, dev, dtype) = (src.cfg, src.ck, src.device, src.dtype);
        let affine = |name: &str| Affine::load(ck, name, dev, dtype, src.quant);
        let blocks = crate::arch::load_layers(cfg, "h", |p| {
            Ok(Block {
                ln_1: Norm::load(ck, &format!("{p}.ln_1"), dev)?,
                attn: affine(&format!("{p}.attn.c_attn"))?,
                attn_proj: affine(&format!("{p}.attn.c_proj"))?,
                ln_2: Norm::load(ck, &format!("{p}.ln_2"), dev)?,
                fc: affine(&format!("{p}.mlp.c_fc"))?,
                mlp_proj: affine(&format!("{p}.mlp.c_proj"))?,
            })
        })?;
        let wte = src.f32("wte.weight")?;
        let head = match ck.info("lm_head.weight") {
            Some(_) => src.in_dtype("lm_head.weight")?,
            None => wte.to_dtype(dtype)?,
        };
        Ok(Gpt2Fast {
            cfg: cfg.clone(),
            dtype,
            wpe: src.f32("wpe.weight")?,
            wte,
            blocks,
            ln_f: Norm::load(ck, "ln_f", dev)?,
            head,
            activation: cfg.gpt2_activation.unwrap_or(Gpt2Activation::GeluTanh),
            no_rotation: Tensor::from_vec(Vec::<f32>::new(), &[0], dev)?,
        })
    }

    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn dtype(&self) -> DType {
        self.dtype
    }

    fn learned_positions(&self) -> bool {
        true
    }

    /// Tokens `pass.ids` at positions `pass.pos` (u32, both `[b, t]`; a pass without positions
    /// is refused).
    fn forward(&self, pass: &FastPass<'_>) -> Result<Tensor, ModelError> {
        let Some(pos) = pass.pos else {
            return Err(ModelError::Unsupported(
                "a GPT-2 pass without the tokens' positions".into(),
            ));
        };
        let cfg = &self.cfg;
        let (eps, dt) = (cfg.norm_eps as f32, self.dtype);
        let mut x = self
            .wte
            .embedding(pass.ids)?
            .add(&self.wpe.embedding(pos)?)?;
        for (l, (b, kv)) in self.blocks.iter().zip(pass.kv.layers).enumerate() {
            let view = pass.kv.view(kv, cfg.layer_windows.get(l));
            let qkv = b.attn.apply(&b.ln_1.apply(&x, eps, dt)?)?;
            let q = qkv.rope_append(&self.no_rotation, view, cfg.num_heads, dt)?;
            let y = pass.attention(&q, view, cfg.attention_scale(l))?;
            x = x.add(&b.attn_proj.apply(&y)?)?;
            let m = self.activate(&b.fc.apply(&b.ln_2.apply(&x, eps, dt)?)?)?;
            x = x.add(&b.mlp_proj.apply(&m.to_dtype(dt)?)?)?;
        }
        let t = pass.ids.shape()[1];
        if pass.last_only && t > 1 {
            x = x.narrow(1, t - 1, 1)?;
        }
        let h = self.ln_f.apply(&x, eps, dt)?;
        Ok(h.matmul_t(&self.head, false, true)?)
    }

    fn bytes_per_step(&self) -> usize {
        let blocks: usize = self
            .blocks
            .iter()
            .map(|b| {
                b.ln_1.bytes()
                    + b.attn.bytes()
                    + b.attn_proj.bytes()
                    + b.ln_2.bytes()
                    + b.fc.bytes()
                    + b.mlp_proj.bytes()
            })
            .sum();
        blocks + self.ln_f.bytes() + bytes(&self.head)
    }
}

impl Gpt2Fast {
    /// The MLP's activation of the f32 `x`, in f32.
    fn activate(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        match self.activation {
            Gpt2Activation::GeluTanh => gelu_tanh(x),
            Gpt2Activation::GeluErf => Ok(x.gelu()?),
        }
    }
}
