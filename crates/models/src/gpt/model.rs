//! The GPT model: its config, its layers on the module layer, the forward pass and generation.

use super::blocks::{Block, DropoutSeeds, Norm};
use gpu_core::nn::attention::{MAX_HEAD_DIM, MAX_SEQ_LEN};
use rand::{Rng, SeedableRng};
use tensor_ops::nn::{Dropout, Embedding, Init, Linear, Module, ModuleT, ParamStore};
use tensor_ops::Tensor;
use tensor_ops::{no_grad, Device, GpuError, Precision, Result};

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
    /// Dropout probability in training, at nanoGPT's sites: the embeddings, the attention
    /// probabilities, the attention and MLP outputs.
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

    /// The number of parameter elements [`Gpt::new`] allocates for this config, computed
    /// without allocating (`None` when it overflows `usize`): a checkpoint's header is checked
    /// against it before a model is built.
    pub fn num_params(&self) -> Option<usize> {
        // In u128: no product of three usize factors overflows it.
        let [c, v, h, t, l] = [
            self.n_embd,
            self.vocab_size,
            self.mlp_hidden(),
            self.block_size,
            self.n_layer,
        ]
        .map(|x| x as u128);
        let b = |n: u128| {
            if self.variant == Variant::Gpt2 && self.bias {
                n
            } else {
                0
            }
        };
        let norm = c + b(c);
        let attn = 3 * c * c + b(3 * c) + c * c + b(c);
        let (mlp, tables) = match self.variant {
            Variant::Gpt2 => (2 * c * h + b(h) + b(c), (v + t) * c),
            Variant::Llama => (3 * c * h, 2 * v * c),
        };
        let total = (2 * norm + attn + mlp).checked_mul(l)? + tables + norm;
        usize::try_from(total).ok()
    }

    /// The MLP's hidden width: 4·n_embd (GPT-2), or 8/3·n_embd rounded up to a multiple of 8
    /// (Llama).
    pub fn mlp_hidden(&self) -> usize {
        match self.variant {
            Variant::Gpt2 => 4 * self.n_embd,
            // Llama's 2/3·4·C rounded up to a multiple of 8.
            Variant::Llama => (8 * self.n_embd / 3).div_ceil(8) * 8,
        }
    }
}

/// The model: nanoGPT's GPT-2 or a Llama-style variant, its parameters in a [`ParamStore`]
/// under nanoGPT's names.
pub struct Gpt {
    pub config: GptConfig,
    store: ParamStore,
    wte: Embedding,
    /// Learned positions (GPT-2).
    wpe: Option<Embedding>,
    drop: Dropout,
    blocks: Vec<Block>,
    ln_f: Norm,
    /// The output head (Llama); GPT-2's is tied to `wte`.
    lm_head: Option<Linear>,
    /// The arithmetic of [`Gpt::forward`] (see [`tensor_ops::autocast`]); fp32 by default.
    precision: Precision,
}

impl Gpt {
    /// A freshly initialised model (nanoGPT's init: N(0, 0.02), residual projections scaled by
    /// 1/sqrt(2·n_layer), biases 0, norm weights 1), identical for a seed on every device.
    pub fn new(config: GptConfig, seed: u64, device: Device) -> Result<Gpt> {
        config.validate()?;
        let c = config.n_embd;
        let store = ParamStore::new(device, seed);
        let (wte, wpe, blocks, ln_f, lm_head) = {
            let tr = store.pp("transformer");
            let std = Init::Normal { std: 0.02 };
            let wte = Embedding::with_init(tr.pp("wte"), config.vocab_size, c, std)?;
            let wpe = match config.variant {
                Variant::Gpt2 => Some(Embedding::with_init(
                    tr.pp("wpe"),
                    config.block_size,
                    c,
                    std,
                )?),
                Variant::Llama => None,
            };
            let blocks = (0..config.n_layer)
                .map(|l| Block::new(tr.pp("h").pp(l), &config))
                .collect::<Result<Vec<_>>>()?;
            let ln_f = Norm::new(tr.pp("ln_f"), tr.pp("ln_f"), &config)?;
            let lm_head = match config.variant {
                Variant::Gpt2 => None,
                Variant::Llama => Some(Linear::with_init(
                    store.pp("lm_head"),
                    c,
                    config.vocab_size,
                    std,
                    None,
                )?),
            };
            (wte, wpe, blocks, ln_f, lm_head)
        };
        Ok(Gpt {
            config,
            store,
            wte,
            wpe,
            drop: Dropout::new(config.dropout)?,
            blocks,
            ln_f,
            lm_head,
            precision: Precision::Fp32,
        })
    }

    /// Sets the arithmetic of the forward pass (and so of its backward): under
    /// [`Precision::Bf16`] every linear layer runs in bf16 mixed precision
    /// ([`tensor_ops::autocast`]); the parameters and the optimiser stay f32. Also applies the
    /// device setting ([`Precision::apply`]: TF32 on CUDA; bf16 and tf32 are refused on the
    /// CPU).
    pub fn set_precision(&mut self, precision: Precision) -> Result<()> {
        precision.apply(self.device())?;
        self.precision = precision;
        Ok(())
    }

    /// The arithmetic of the forward pass.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The device the parameters live on.
    pub fn device(&self) -> Device {
        self.store.device()
    }

    /// The parameters: for AdamW ([`ParamStore::adamw`]), snapshots, checkpoints.
    pub fn store(&self) -> &ParamStore {
        &self.store
    }

    /// Parameters with their names and whether AdamW decays them, in registration order.
    pub fn parameters(&self) -> Vec<(String, Tensor, bool)> {
        self.store
            .params()
            .into_iter()
            .map(|p| (p.name().to_string(), p.tensor().clone(), p.decay()))
            .collect()
    }

    /// Total number of parameter elements.
    pub fn num_params(&self) -> usize {
        self.store.num_elements()
    }

    /// Logits `[b, t, vocab]` for u32 token ids `[b, t]` (`t <= block_size`). `dropout_seed`
    /// turns training-mode dropout on.
    pub fn forward(&self, idx: &Tensor, dropout_seed: Option<u64>) -> Result<Tensor> {
        tensor_ops::autocast(self.precision, || self.forward_impl(idx, dropout_seed))
    }

    fn forward_impl(&self, idx: &Tensor, dropout_seed: Option<u64>) -> Result<Tensor> {
        let cfg = &self.config;
        let t = match idx.shape() {
            [_, t] if *t > 0 && *t <= cfg.block_size => *t,
            s => {
                return Err(GpuError::shape(
                    "Gpt::forward",
                    format!("[batch, 1..={}]", cfg.block_size),
                    format!("{s:?}"),
                ))
            }
        };
        let mut seeds = DropoutSeeds::new(dropout_seed);
        let mut x = self.wte.forward(idx)?;
        if let Some(wpe) = &self.wpe {
            // Rows 0..t of the table are the embeddings of positions 0..t.
            x = x.add(&wpe.weight().narrow(0, 0, t)?)?;
        }
        x = self.drop.forward_t(&x, seeds.next_mode())?;
        for block in &self.blocks {
            x = block.forward(&x, &mut seeds)?;
        }
        let x = self.ln_f.forward(&x)?;
        match &self.lm_head {
            Some(head) => head.forward(&x),
            None => x.linear(self.wte.weight(), None),
        }
    }

    /// The dropout sites of a forward pass: the embeddings' and three a block (the attention
    /// probabilities and the two residual branches).
    pub(crate) fn dropout_sites(&self) -> usize {
        1 + 3 * self.blocks.len()
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
                let idx = Tensor::from_vec(ctx.to_vec(), &[1, ctx.len()], self.device())?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The embeddings' site and three a block (the attention probabilities, the two residual
    /// branches): what a captured step's seed offsets must cover.
    #[test]
    fn dropout_sites_count_the_attention_probabilities() {
        let cfg = GptConfig {
            n_layer: 3,
            dropout: 0.1,
            ..GptConfig::tiny(11)
        };
        let model = Gpt::new(cfg, 1, Device::Cpu).unwrap();
        assert_eq!(model.dropout_sites(), 1 + 3 * 3);
    }
}
