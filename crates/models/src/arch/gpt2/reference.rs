//! GPT-2's reference forward, what [`crate::CausalLm`] runs: learned positions, pre-LayerNorm
//! blocks, Conv1D (`[in, out]`) projections, the tanh GELU (or the exact one when
//! `activation_function` is `"gelu"`), and the head tied to the token embedding unless the
//! checkpoint holds `lm_head`. Weights in `transformers`' names (with or without
//! `transformer.`); arithmetic in f32.

use tensor_ops::{Device, Tensor};

use crate::arch::{lm_head, load_layers, RefPass, ReferenceModel};
use crate::config::{Gpt2Activation, ModelConfig};
use crate::error::ModelError;
use crate::layers::{cached_attention, gelu_tanh, heads, load, LayerNorm, Linear};
use crate::weights::Checkpoint;

struct Block {
    ln_1: LayerNorm,
    attn: Linear,
    proj: Linear,
    ln_2: LayerNorm,
    fc: Linear,
    fc_proj: Linear,
}

/// GPT-2 as the f32 reference runs it.
pub(crate) struct Gpt2Reference {
    cfg: ModelConfig,
    wte: Tensor,
    wpe: Tensor,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
    head: Linear,
    activation: Gpt2Activation,
}

impl Gpt2Reference {
    pub(crate) fn load(
        cfg: &ModelConfig,
        ck: &Checkpoint,
        dev: Device,
    ) -> Result<Self, ModelError> {
        let blocks = load_layers(cfg, "h", |p| {
            Ok(Block {
                ln_1: LayerNorm::load(ck, &format!("{p}.ln_1"), dev)?,
                attn: Linear::conv1d(ck, &format!("{p}.attn.c_attn"), dev)?,
                proj: Linear::conv1d(ck, &format!("{p}.attn.c_proj"), dev)?,
                ln_2: LayerNorm::load(ck, &format!("{p}.ln_2"), dev)?,
                fc: Linear::conv1d(ck, &format!("{p}.mlp.c_fc"), dev)?,
                fc_proj: Linear::conv1d(ck, &format!("{p}.mlp.c_proj"), dev)?,
            })
        })?;
        let wte = load(ck, "wte.weight", dev)?;
        let head = lm_head(ck, &wte, ck.info("lm_head.weight").is_none(), dev)?;
        Ok(Gpt2Reference {
            cfg: cfg.clone(),
            wte,
            wpe: load(ck, "wpe.weight", dev)?,
            blocks,
            ln_f: LayerNorm::load(ck, "ln_f", dev)?,
            head,
            activation: cfg.gpt2_activation.unwrap_or(Gpt2Activation::GeluTanh),
        })
    }

    /// The MLP's activation: the tanh GELU, or `tensor_ops`' exact (erf) GELU.
    fn activate(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        match self.activation {
            Gpt2Activation::GeluTanh => gelu_tanh(x),
            Gpt2Activation::GeluErf => Ok(x.gelu()?),
        }
    }
}

impl ReferenceModel for Gpt2Reference {
    /// Logits `[b, t, vocab]` of token ids `ids` `[b, t]` in `slots`.
    fn forward(&self, pass: RefPass<'_>) -> Result<Tensor, ModelError> {
        let RefPass { ids, slots, caches } = pass;
        let (c, nh) = (self.cfg.hidden_size, self.cfg.num_heads);
        let eps = self.cfg.norm_eps as f32;
        let (b, t) = (ids.shape()[0], ids.shape()[1]);
        let pos = Tensor::from_vec(slots.positions(), &[b, t], ids.device())?;
        let mask = slots.mask(ids.device(), None)?;
        let mut x = self.wte.embedding(ids)?.add(&self.wpe.embedding(&pos)?)?;
        for (l, (b, cache)) in self.blocks.iter().zip(caches).enumerate() {
            let qkv = b.attn.forward(&b.ln_1.forward(&x, eps)?)?;
            let part = |i: usize| heads(&qkv.narrow(2, i * c, c)?, nh);
            let scale = self.cfg.attention_scale(l);
            let y = cached_attention(&part(0)?, &part(1)?, &part(2)?, cache, &mask, scale)?;
            x = x.add(&b.proj.forward(&y)?)?;
            let m = self.activate(&b.fc.forward(&b.ln_2.forward(&x, eps)?)?)?;
            x = x.add(&b.fc_proj.forward(&m)?)?;
        }
        self.head.forward(&self.ln_f.forward(&x, eps)?)
    }

    /// The projections of every block (not the embeddings or the head).
    fn linears_mut(&mut self) -> Vec<&mut Linear> {
        self.blocks
            .iter_mut()
            .flat_map(|b| [&mut b.attn, &mut b.proj, &mut b.fc, &mut b.fc_proj])
            .collect()
    }
}
