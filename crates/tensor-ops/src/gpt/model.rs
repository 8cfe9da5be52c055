//! The GPT model: parameters, forward pass and generation.

use crate::tensor::Tensor;
use crate::{no_grad, Device, GpuError, Result};
use gpu_core::nn::attention::{MAX_HEAD_DIM, MAX_SEQ_LEN};
use rand::{Rng, SeedableRng};

/// Which architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Variant {
    /// LayerNorm, GELU MLP, learned positions, head tied to the token embedding.
    Gpt2,
    /// RMSNorm, RoPE, SwiGLU MLP, no positions table, separate head.
    Llama,
}

/// Model hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GptConfig {
    pub variant: Variant,
    pub vocab_size: usize,
    pub block_size: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_embd: usize,
    /// Dropout probability in training (attention output, MLP output, embeddings).
    pub dropout: f32,
    /// Biases in linear layers and LayerNorms (GPT-2 variant only).
    pub bias: bool,
}

impl GptConfig {
    /// nanoGPT's shakespeare-char model: 6 layers, 6 heads, width 384, context 256.
    pub fn shakespeare_char(vocab_size: usize) -> Self {
        Self {
            variant: Variant::Gpt2,
            vocab_size,
            block_size: 256,
            n_layer: 6,
            n_head: 6,
            n_embd: 384,
            dropout: 0.2,
            bias: false,
        }
    }

    /// The small CPU config: 4 layers, 4 heads, width 128, context 64.
    pub fn tiny(vocab_size: usize) -> Self {
        Self {
            variant: Variant::Gpt2,
            vocab_size,
            block_size: 64,
            n_layer: 4,
            n_head: 4,
            n_embd: 128,
            dropout: 0.0,
            bias: false,
        }
    }

    /// Checks the config, so a model that cannot run fails when it is built, not in `forward`:
    /// positive sizes; `n_embd` split into `n_head` heads whose width the attention kernels take
    /// (a multiple of 4 in 4..=[`MAX_HEAD_DIM`]); a context of at most [`MAX_SEQ_LEN`]; every
    /// parameter's size within `usize`; dropout in `[0, 1)`.
    pub fn validate(&self) -> Result<()> {
        let bad = |r: String| Err(GpuError::invalid("GptConfig", r));
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("block_size", self.block_size),
            ("n_layer", self.n_layer),
            ("n_head", self.n_head),
            ("n_embd", self.n_embd),
        ] {
            if v == 0 {
                return bad(format!("{name} must be positive"));
            }
        }
        if !self.n_embd.is_multiple_of(self.n_head) {
            return bad(format!(
                "n_embd = {} does not split into n_head = {} heads",
                self.n_embd, self.n_head
            ));
        }
        let hd = self.n_embd / self.n_head;
        if !(4..=MAX_HEAD_DIM).contains(&hd) || !hd.is_multiple_of(4) {
            return bad(format!(
                "head width n_embd / n_head = {} / {} = {hd} must be a multiple of 4 in \
                 4..={MAX_HEAD_DIM} (the attention kernels' limits)",
                self.n_embd, self.n_head
            ));
        }
        if self.block_size > MAX_SEQ_LEN {
            return bad(format!(
                "block_size = {} exceeds the attention kernels' {MAX_SEQ_LEN}",
                self.block_size
            ));
        }
        // The widest parameters: the token and position tables, the attention and MLP weights
        // (the hidden width is computed from up to 8·n_embd, so that is checked first).
        let fits = |dims: &[usize]| gpu_core::shape::checked_numel(dims).is_some();
        let c = self.n_embd;
        if c.checked_mul(8).is_none()
            || !fits(&[self.vocab_size, c])
            || !fits(&[self.block_size, c])
            || !fits(&[self.mlp_hidden(), c, 2])
            || !fits(&[3 * c, c])
        {
            return bad(format!(
                "parameters of {self:?} have more elements than fit in usize"
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return bad(format!("dropout must be in [0, 1), got {}", self.dropout));
        }
        Ok(())
    }

    fn mlp_hidden(&self) -> usize {
        match self.variant {
            Variant::Gpt2 => 4 * self.n_embd,
            // Llama's 2/3·4·C rounded up to a multiple of 8.
            Variant::Llama => (8 * self.n_embd / 3).div_ceil(8) * 8,
        }
    }
}

/// A named parameter.
#[derive(Clone)]
pub(crate) struct Param {
    pub(crate) name: String,
    pub(crate) tensor: Tensor,
    /// Weight-decayed (2-D weights), as nanoGPT.
    pub(crate) decay: bool,
}

/// The model.
pub struct Gpt {
    pub config: GptConfig,
    pub(crate) params: Vec<Param>,
    device: Device,
}

impl Gpt {
    /// A freshly initialised model (nanoGPT's init: N(0, 0.02), residual projections scaled by
    /// 1/sqrt(2·n_layer), biases 0, norm weights 1), identical for a seed on every device.
    pub fn new(config: GptConfig, seed: u64, device: Device) -> Result<Gpt> {
        config.validate()?;
        let c = config.n_embd;
        let h = config.mlp_hidden();
        let proj_std = 0.02 / (2.0 * config.n_layer as f32).sqrt();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut params = Vec::new();
        let mut add = |name: String, shape: &[usize], init: Init| -> Result<()> {
            let t = match init {
                Init::Normal(std) => Tensor::randn(shape, std, rng.random(), device)?,
                Init::Ones => Tensor::ones(shape, device)?,
                Init::Zeros => Tensor::zeros(shape, device)?,
            };
            params.push(Param {
                name,
                tensor: t.requires_grad_()?,
                decay: shape.len() >= 2,
            });
            Ok(())
        };
        add(
            "transformer.wte.weight".into(),
            &[config.vocab_size, c],
            Init::Normal(0.02),
        )?;
        if config.variant == Variant::Gpt2 {
            add(
                "transformer.wpe.weight".into(),
                &[config.block_size, c],
                Init::Normal(0.02),
            )?;
        }
        for l in 0..config.n_layer {
            let p = |s: &str| format!("transformer.h.{l}.{s}");
            match config.variant {
                Variant::Gpt2 => {
                    add(p("ln_1.weight"), &[c], Init::Ones)?;
                    if config.bias {
                        add(p("ln_1.bias"), &[c], Init::Zeros)?;
                    }
                    add(p("attn.c_attn.weight"), &[3 * c, c], Init::Normal(0.02))?;
                    if config.bias {
                        add(p("attn.c_attn.bias"), &[3 * c], Init::Zeros)?;
                    }
                    add(p("attn.c_proj.weight"), &[c, c], Init::Normal(proj_std))?;
                    if config.bias {
                        add(p("attn.c_proj.bias"), &[c], Init::Zeros)?;
                    }
                    add(p("ln_2.weight"), &[c], Init::Ones)?;
                    if config.bias {
                        add(p("ln_2.bias"), &[c], Init::Zeros)?;
                    }
                    add(p("mlp.c_fc.weight"), &[h, c], Init::Normal(0.02))?;
                    if config.bias {
                        add(p("mlp.c_fc.bias"), &[h], Init::Zeros)?;
                    }
                    add(p("mlp.c_proj.weight"), &[c, h], Init::Normal(proj_std))?;
                    if config.bias {
                        add(p("mlp.c_proj.bias"), &[c], Init::Zeros)?;
                    }
                }
                Variant::Llama => {
                    add(p("attention_norm.weight"), &[c], Init::Ones)?;
                    add(p("attn.c_attn.weight"), &[3 * c, c], Init::Normal(0.02))?;
                    add(p("attn.c_proj.weight"), &[c, c], Init::Normal(proj_std))?;
                    add(p("ffn_norm.weight"), &[c], Init::Ones)?;
                    add(p("mlp.w1.weight"), &[h, c], Init::Normal(0.02))?;
                    add(p("mlp.w3.weight"), &[h, c], Init::Normal(0.02))?;
                    add(p("mlp.w2.weight"), &[c, h], Init::Normal(proj_std))?;
                }
            }
        }
        add("transformer.ln_f.weight".into(), &[c], Init::Ones)?;
        if config.variant == Variant::Gpt2 && config.bias {
            add("transformer.ln_f.bias".into(), &[c], Init::Zeros)?;
        }
        if config.variant == Variant::Llama {
            add(
                "lm_head.weight".into(),
                &[config.vocab_size, c],
                Init::Normal(0.02),
            )?;
        }
        Ok(Gpt {
            config,
            params,
            device,
        })
    }

    /// The device the parameters live on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Parameters with their names and whether AdamW decays them.
    pub fn parameters(&self) -> Vec<(String, Tensor, bool)> {
        self.params
            .iter()
            .map(|p| (p.name.clone(), p.tensor.clone(), p.decay))
            .collect()
    }

    /// Total number of parameter elements.
    pub fn num_params(&self) -> usize {
        self.params.iter().map(|p| p.tensor.numel()).sum()
    }

    pub(crate) fn get(&self, name: &str) -> Result<&Tensor> {
        self.params
            .iter()
            .find(|p| p.name == name)
            .map(|p| &p.tensor)
            .ok_or_else(|| GpuError::invalid("Gpt", format!("no parameter {name}")))
    }

    fn opt(&self, name: &str) -> Option<&Tensor> {
        self.params
            .iter()
            .find(|p| p.name == name)
            .map(|p| &p.tensor)
    }

    /// Logits `[b, t, vocab]` for u32 token ids `[b, t]` (`t <= block_size`). `dropout_seed`
    /// turns training-mode dropout on.
    pub fn forward(&self, idx: &Tensor, dropout_seed: Option<u64>) -> Result<Tensor> {
        let cfg = &self.config;
        let (b, t) = match idx.shape() {
            [b, t] if *t > 0 && *t <= cfg.block_size => (*b, *t),
            s => {
                return Err(GpuError::shape(
                    "Gpt::forward",
                    format!("[batch, 1..={}]", cfg.block_size),
                    format!("{s:?}"),
                ))
            }
        };
        let (c, nh) = (cfg.n_embd, cfg.n_head);
        let hd = c / nh;
        let training = dropout_seed.is_some();
        let mut seed = dropout_seed.unwrap_or(0);
        let mut next_seed = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            seed
        };
        let zeros_c = Tensor::zeros(&[c], self.device)?;
        let norm = |x: &Tensor, pre: &str, llama_name: &str| -> Result<Tensor> {
            match cfg.variant {
                Variant::Gpt2 => {
                    let w = self.get(&format!("{pre}.weight"))?;
                    let bias = self.opt(&format!("{pre}.bias")).unwrap_or(&zeros_c);
                    x.layer_norm(w, bias, 1e-5)
                }
                Variant::Llama => x.rms_norm(self.get(&format!("{llama_name}.weight"))?, 1e-5),
            }
        };
        let linear = |x: &Tensor, pre: &str| -> Result<Tensor> {
            x.linear(
                self.get(&format!("{pre}.weight"))?,
                self.opt(&format!("{pre}.bias")),
            )
        };
        let mut x = self.get("transformer.wte.weight")?.embedding(idx)?;
        if cfg.variant == Variant::Gpt2 {
            let pos = self.positions(t)?;
            x = x.add(&self.get("transformer.wpe.weight")?.embedding(&pos)?)?;
        }
        x = x.dropout(cfg.dropout, next_seed(), training)?;
        for l in 0..cfg.n_layer {
            let p = |s: &str| format!("transformer.h.{l}.{s}");
            let h = norm(&x, &p("ln_1"), &p("attention_norm"))?;
            let qkv = linear(&h, &p("attn.c_attn"))?; // [b, t, 3c]
            let heads = |i: usize| -> Result<Tensor> {
                qkv.narrow(2, i * c, c)?
                    .reshape(&[b, t, nh, hd])?
                    .permute(&[0, 2, 1, 3])
            };
            let (mut q, mut k, v) = (heads(0)?, heads(1)?, heads(2)?);
            if cfg.variant == Variant::Llama {
                q = q.rope(10_000.0)?;
                k = k.rope(10_000.0)?;
            }
            let y = Tensor::causal_attention(&q, &k, &v)?
                .permute(&[0, 2, 1, 3])?
                .reshape(&[b, t, c])?;
            let y = linear(&y, &p("attn.c_proj"))?.dropout(cfg.dropout, next_seed(), training)?;
            x = x.add(&y)?;
            let h = norm(&x, &p("ln_2"), &p("ffn_norm"))?;
            let h = match cfg.variant {
                Variant::Gpt2 => linear(&linear(&h, &p("mlp.c_fc"))?.gelu()?, &p("mlp.c_proj"))?,
                Variant::Llama => {
                    let gate = linear(&h, &p("mlp.w1"))?;
                    linear(&gate.swiglu(&linear(&h, &p("mlp.w3"))?)?, &p("mlp.w2"))?
                }
            };
            x = x.add(&h.dropout(cfg.dropout, next_seed(), training)?)?;
        }
        let x = norm(&x, "transformer.ln_f", "transformer.ln_f")?;
        let head = match cfg.variant {
            Variant::Gpt2 => self.get("transformer.wte.weight")?,
            Variant::Llama => self.get("lm_head.weight")?,
        };
        x.linear(head, None)
    }

    /// Position ids `0..t` on the model's device, uploaded once per length and cached, so a
    /// training step transfers only its batch.
    fn positions(&self, t: usize) -> Result<Tensor> {
        use std::collections::HashMap;
        use std::sync::Mutex;
        static CACHE: Mutex<Option<HashMap<(Device, usize), Tensor>>> = Mutex::new(None);
        let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
        let map = cache.get_or_insert_with(HashMap::new);
        if let Some(p) = map.get(&(self.device, t)) {
            return Ok(p.clone());
        }
        let p = Tensor::from_vec((0..t as u32).collect::<Vec<u32>>(), &[t], self.device)?;
        map.insert((self.device, t), p.clone());
        Ok(p)
    }

    /// Mean cross-entropy of the next-token predictions for `x` against `y` (both `[b, t]`).
    pub fn loss(&self, x: &Tensor, y: &Tensor, dropout_seed: Option<u64>) -> Result<Tensor> {
        let logits = self.forward(x, dropout_seed)?;
        let (b, t) = (x.shape()[0], x.shape()[1]);
        logits
            .reshape(&[b * t, self.config.vocab_size])?
            .cross_entropy(&y.reshape(&[b * t])?)
    }

    /// Samples `new_tokens` tokens after `prompt` (temperature `temp`, top-k when given); the
    /// model runs on its device, one d2h copy of the last position's probabilities per token.
    pub fn generate(
        &self,
        prompt: &[u32],
        new_tokens: usize,
        temp: f32,
        top_k: Option<usize>,
        seed: u64,
    ) -> Result<Vec<u32>> {
        if prompt.is_empty() || temp.is_nan() || temp <= 0.0 {
            return Err(GpuError::invalid(
                "generate",
                "needs a non-empty prompt and temperature > 0",
            ));
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut out = prompt.to_vec();
        no_grad(|| {
            for _ in 0..new_tokens {
                let start = out.len().saturating_sub(self.config.block_size);
                let ctx = &out[start..];
                let idx = Tensor::from_vec(ctx.to_vec(), &[1, ctx.len()], self.device)?;
                let logits = self.forward(&idx, None)?;
                let v = self.config.vocab_size;
                let last = logits
                    .reshape(&[ctx.len(), v])?
                    .narrow(0, ctx.len() - 1, 1)?;
                let mut l = last.mul_scalar(1.0 / temp)?.to_vec()?;
                if let Some(k) = top_k.filter(|&k| k < v) {
                    let mut sorted = l.clone();
                    sorted.sort_by(|a, b| b.total_cmp(a));
                    let kth = sorted[k.max(1) - 1];
                    l.iter_mut()
                        .filter(|x| **x < kth)
                        .for_each(|x| *x = f32::NEG_INFINITY);
                }
                let m = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let w: Vec<f64> = l.iter().map(|&x| ((x - m) as f64).exp()).collect();
                let total: f64 = w.iter().sum();
                let mut u = rng.random::<f64>() * total;
                let mut pick = v - 1;
                for (i, wi) in w.iter().enumerate() {
                    if u < *wi {
                        pick = i;
                        break;
                    }
                    u -= wi;
                }
                out.push(pick as u32);
            }
            Ok(out)
        })
    }
}

enum Init {
    Normal(f32),
    Ones,
    Zeros,
}
