//! The GPT's layers on the module layer: its norms, causal self-attention, MLPs and the
//! transformer block, with nanoGPT's parameter names and init.

use super::model::{GptConfig, Variant};
use tensor_ops::nn::{
    Dropout, Init, LayerNorm, Linear, Mode, Module, ModuleT, ParamBuilder, RmsNorm,
};
use tensor_ops::{Result, Tensor};

/// The norms' epsilon (LayerNorm and RMSNorm alike).
pub const EPS: f32 = 1e-5;

/// The dropout masks of one forward pass: the i-th dropout site draws the i-th seed of an LCG
/// started at the pass's seed (the GPT's sequence since before the module layer).
pub(crate) struct DropoutSeeds(Option<u64>);

impl DropoutSeeds {
    /// Training with masks from `seed`, or evaluation for `None`.
    pub(crate) fn new(seed: Option<u64>) -> Self {
        DropoutSeeds(seed)
    }

    /// The mode of the next dropout site.
    pub(crate) fn next_mode(&mut self) -> Mode {
        match &mut self.0 {
            None => Mode::Eval,
            Some(s) => {
                *s = lcg(*s);
                Mode::train(*s)
            }
        }
    }

    /// The seeds of the first `k` dropout sites of a training pass with `seed` (what
    /// [`DropoutSeeds::next_mode`] hands out, in order).
    pub(crate) fn site_seeds(seed: u64, k: usize) -> Vec<u64> {
        std::iter::successors(Some(lcg(seed)), |&s| Some(lcg(s)))
            .take(k)
            .collect()
    }
}

/// One step of the seeds' LCG (Knuth's MMIX constants).
fn lcg(s: u64) -> u64 {
    s.wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407)
}

/// LayerNorm (GPT-2, with a bias when the config has biases) or RMSNorm (Llama).
pub(crate) enum Norm {
    Layer(LayerNorm),
    Rms(RmsNorm),
}

impl Norm {
    /// The GPT-2 norm under `gpt2`, or the Llama norm under `llama` (their names differ).
    pub(crate) fn new(
        gpt2: ParamBuilder<'_>,
        llama: ParamBuilder<'_>,
        cfg: &GptConfig,
    ) -> Result<Norm> {
        Ok(match cfg.variant {
            Variant::Gpt2 => Norm::Layer(LayerNorm::new(gpt2, cfg.n_embd, EPS, cfg.bias)?),
            Variant::Llama => Norm::Rms(RmsNorm::new(llama, cfg.n_embd, EPS)?),
        })
    }
}

impl Module for Norm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Norm::Layer(n) => n.forward(x),
            Norm::Rms(n) => n.forward(x),
        }
    }
}

/// A linear layer with nanoGPT's init: weight N(0, std²), bias zeros when the config has
/// biases (GPT-2 only).
fn linear(vb: ParamBuilder<'_>, cfg: &GptConfig, i: usize, o: usize, std: f32) -> Result<Linear> {
    let bias = (cfg.variant == Variant::Gpt2 && cfg.bias).then_some(Init::ZEROS);
    Linear::with_init(vb, i, o, Init::Normal { std }, bias)
}

/// Causal self-attention: one `c_attn` projection to q, k, v, fused attention (RoPE on q and
/// k for Llama) with nanoGPT's `attn_dropout` of the attention probabilities
/// (`scaled_dot_product_attention(dropout_p)`), and the `c_proj` output projection.
struct Attention {
    c_attn: Linear,
    c_proj: Linear,
    n_head: usize,
    rope: bool,
    dropout: f32,
}

impl Attention {
    fn new(vb: ParamBuilder<'_>, cfg: &GptConfig, proj_std: f32) -> Result<Attention> {
        let c = cfg.n_embd;
        Ok(Attention {
            c_attn: linear(vb.pp("c_attn"), cfg, c, 3 * c, 0.02)?,
            c_proj: linear(vb.pp("c_proj"), cfg, c, c, proj_std)?,
            n_head: cfg.n_head,
            rope: cfg.variant == Variant::Llama,
            dropout: cfg.dropout,
        })
    }

    /// The fused attention of `qkv` with the probabilities' dropout in `mode`.
    fn attend(&self, qkv: &Tensor, mode: Mode) -> Result<Tensor> {
        let (seed, training) = match mode {
            Mode::Train { seed } => (seed, true),
            Mode::Eval => (0, false),
        };
        qkv.causal_attention_packed_dropout(self.n_head, self.dropout, seed, training)
    }

    /// `x` `[b, t, c]`; `mode`: the attention dropout site's.
    fn forward_t(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        let (b, t, c) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        let (nh, hd) = (self.n_head, c / self.n_head);
        let qkv = self.c_attn.forward(x)?; // [b, t, 3c]
        if !self.rope {
            // q, k, v read where they lie (no split or permute copies on CUDA).
            return self.c_proj.forward(&self.attend(&qkv, mode)?);
        }
        // RoPE on q and k (in f32, rounded back to qkv's dtype as PyTorch's autocast rounds
        // them for its attention), packed again beside v: the attention then runs the packed
        // kernels (bf16 tensor cores under bf16; in f32, the same bits as the split form).
        let rotated = |i: usize| -> Result<Tensor> {
            qkv.narrow(2, i * c, c)?
                .reshape(&[b, t, nh, hd])?
                .permute(&[0, 2, 1, 3])?
                .rope(10_000.0)?
                .permute(&[0, 2, 1, 3])?
                .reshape(&[b, t, c])?
                .to_dtype(qkv.dtype())
        };
        let v = qkv.narrow(2, 2 * c, c)?;
        let qkv = Tensor::cat(&[&rotated(0)?, &rotated(1)?, &v], 2)?;
        self.c_proj.forward(&self.attend(&qkv, mode)?)
    }
}

/// GPT-2's GELU MLP (`c_fc`, `c_proj`) or Llama's SwiGLU (`w1`, `w3`, `w2`).
enum Mlp {
    Gelu { c_fc: Linear, c_proj: Linear },
    SwiGlu { w1: Linear, w3: Linear, w2: Linear },
}

impl Mlp {
    fn new(vb: ParamBuilder<'_>, cfg: &GptConfig, proj_std: f32) -> Result<Mlp> {
        let (c, h) = (cfg.n_embd, cfg.mlp_hidden());
        Ok(match cfg.variant {
            Variant::Gpt2 => Mlp::Gelu {
                c_fc: linear(vb.pp("c_fc"), cfg, c, h, 0.02)?,
                c_proj: linear(vb.pp("c_proj"), cfg, h, c, proj_std)?,
            },
            Variant::Llama => Mlp::SwiGlu {
                w1: linear(vb.pp("w1"), cfg, c, h, 0.02)?,
                w3: linear(vb.pp("w3"), cfg, c, h, 0.02)?,
                w2: linear(vb.pp("w2"), cfg, h, c, proj_std)?,
            },
        })
    }
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Mlp::Gelu { c_fc, c_proj } => c_proj.forward(&c_fc.forward(x)?.gelu()?),
            Mlp::SwiGlu { w1, w3, w2 } => w2.forward(&w1.forward(x)?.swiglu(&w3.forward(x)?)?),
        }
    }
}

/// A pre-norm transformer block: `x + drop(attn(norm1(x)))` (with dropout of the attention
/// probabilities inside `attn`), then `x + drop(mlp(norm2(x)))`.
pub(crate) struct Block {
    norm1: Norm,
    attn: Attention,
    norm2: Norm,
    mlp: Mlp,
    drop: Dropout,
}

impl Block {
    /// The block under `vb` (`transformer.h.{l}`), registering in nanoGPT's order.
    pub(crate) fn new(vb: ParamBuilder<'_>, cfg: &GptConfig) -> Result<Block> {
        let proj_std = 0.02 / (2.0 * cfg.n_layer as f32).sqrt();
        Ok(Block {
            norm1: Norm::new(vb.pp("ln_1"), vb.pp("attention_norm"), cfg)?,
            attn: Attention::new(vb.pp("attn"), cfg, proj_std)?,
            norm2: Norm::new(vb.pp("ln_2"), vb.pp("ffn_norm"), cfg)?,
            mlp: Mlp::new(vb.pp("mlp"), cfg, proj_std)?,
            drop: Dropout::new(cfg.dropout)?,
        })
    }

    /// `x` `[b, t, c]`; the three dropout sites (the attention probabilities, then the two
    /// residual branches, nanoGPT's order) take the next three seeds.
    pub(crate) fn forward(&self, x: &Tensor, seeds: &mut DropoutSeeds) -> Result<Tensor> {
        let y = self
            .attn
            .forward_t(&self.norm1.forward(x)?, seeds.next_mode())?;
        let x = x.add(&self.drop.forward_t(&y, seeds.next_mode())?)?;
        let y = self.mlp.forward(&self.norm2.forward(&x)?)?;
        x.add(&self.drop.forward_t(&y, seeds.next_mode())?)
    }
}
