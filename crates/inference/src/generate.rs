//! `hybrid-trainer generate`: text from a Hugging Face model directory (Llama 2/3, Qwen2,
//! Mistral, GPT-2: `config.json`, safetensors weights, `tokenizer.json`) through `models`' KV
//! cache, streamed to stdout as it is sampled; `hybrid-trainer perplexity`: the model's
//! perplexity on a text file. Both can round the weights to int8 or int4 first (`--quant`), and
//! both can run on the fast engine (`--engine fast`, Llama family and GPT-2, `--dtype
//! bf16|f32`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use models::{CausalLm, QuantKind, Sampler, Sampling, Tokenizer};
use tensor_ops::Device;

#[derive(Args, Debug, Clone)]
pub struct GenerateArgs {
    /// The model directory: config.json, model.safetensors (or shards and their index) and
    /// tokenizer.json.
    #[arg(long)]
    pub model: PathBuf,
    /// The text to continue; give it several times to decode the prompts as one batch (left
    /// padded; printed when done, not streamed).
    #[arg(long, required = true)]
    pub prompt: Vec<String>,
    /// Tokens to generate at most (fewer when the model emits its end-of-sequence token).
    #[arg(long, default_value_t = 64)]
    pub max_new_tokens: usize,
    /// Sampling temperature; 0 decodes greedily.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Keep the k most likely tokens when sampling.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Nucleus sampling: keep the most likely tokens up to this probability.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// transformers' repetition penalty (1: none).
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Do not add the tokenizer's special tokens (e.g. Llama's BOS) to the prompt.
    #[arg(long)]
    pub no_special_tokens: bool,
    /// Keep generating past the end-of-sequence token.
    #[arg(long)]
    pub ignore_eos: bool,
    #[command(flatten)]
    pub run: EngineArgs,
}

/// Which engine generates.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    Reference,
    Fast,
}

/// Weight-only quantization of the layers' projections.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quant {
    /// One scale per output channel.
    Int8,
    /// Groups of 128 inputs, a scale and an offset each.
    Int4,
    /// IEEE half precision (half the bytes of f32, no scales); wgpu and the CPU (on CUDA
    /// use `--dtype bf16`).
    F16,
}

impl From<Quant> for QuantKind {
    fn from(q: Quant) -> QuantKind {
        match q {
            Quant::Int8 => QuantKind::Int8,
            Quant::Int4 => QuantKind::Int4,
            Quant::F16 => QuantKind::F16,
        }
    }
}

/// The flags `generate` and `perplexity` share: which engine runs the model, and how its
/// weights are held.
#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// Round the projection weights to this format first. The reference engine computes in
    /// f32 from the dequantized weights (the format's accuracy; neither speed nor memory
    /// change); the fast engine keeps them quantized and dequantizes in its matmul kernels.
    #[arg(long, value_enum)]
    pub quant: Option<Quant>,
    /// The engine: the f32 reference (generate samples on the host), or the fast one (Llama
    /// family and GPT-2; bf16 or f32 weights, --quant projections kept quantized, a
    /// preallocated cache; generate runs the decode step as a CUDA graph on CUDA with the
    /// sampling on the device, so a seed gives other draws than the reference's). Both score
    /// windows of the model's context the same way for perplexity.
    #[arg(long, value_enum, default_value_t = EngineKind::Reference)]
    pub engine: EngineKind,
    /// The fast engine's weights and matmuls.
    #[arg(long, value_enum, default_value_t = crate::generate_fast::EngineDtype::Bf16)]
    pub dtype: crate::generate_fast::EngineDtype,
}

impl EngineArgs {
    /// The fast engine's options for `batch` rows of `capacity` positions.
    pub fn fast_options(&self, batch: usize, capacity: usize) -> models::EngineOptions {
        crate::generate_fast::engine_options(self.dtype, self.quant, batch, capacity)
    }
}

#[derive(Args, Debug, Clone)]
pub struct PerplexityArgs {
    /// The model directory (as for `generate`).
    #[arg(long)]
    pub model: PathBuf,
    /// The text to score.
    #[arg(long)]
    pub text: PathBuf,
    /// Score at most this many tokens of it (from the start).
    #[arg(long)]
    pub max_tokens: Option<usize>,
    #[command(flatten)]
    pub run: EngineArgs,
}

/// Loads `dir` on `device`, quantized when asked, and says what it loaded.
fn load(dir: &Path, device: Device, quant: Option<Quant>) -> Result<CausalLm> {
    let t = Instant::now();
    let mut model = CausalLm::load(dir, device)
        .with_context(|| format!("loading the model in {}", dir.display()))?;
    let cfg = model.config().clone();
    eprintln!(
        "model: {:?}, {} layers × {}, {} heads ({} key/value), vocab {}, context {}; loaded on {device} in {:.2} s",
        cfg.architecture,
        cfg.num_layers,
        cfg.hidden_size,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.vocab_size,
        cfg.max_position_embeddings,
        t.elapsed().as_secs_f64(),
    );
    if let Some(q) = quant {
        let bytes = model.quantize(q.into())?;
        eprintln!(
            "projections rounded to {q:?}: {:.2} MiB quantized (computed from the dequantized f32 weights)",
            bytes as f64 / (1 << 20) as f64
        );
    }
    Ok(model)
}

#[derive(Args, Debug, Clone)]
pub struct ExportArgs {
    /// A GPT saved by `train-gpt --save` (GPT-2 or Llama variant).
    #[arg(long)]
    pub model: PathBuf,
    /// The text it was trained on (its characters are the tokenizer's vocabulary).
    #[arg(long)]
    pub data: PathBuf,
    /// The directory to write (must not exist, or be empty).
    #[arg(long)]
    pub out: PathBuf,
}

/// Writes a `train-gpt --save` model as a Hugging Face directory of its variant's format
/// (`models::export_hf`: GPT-2 or `LlamaForCausalLM`).
pub fn export(a: &ExportArgs) -> Result<()> {
    let model = models::gpt::Gpt::load(&a.model, Device::Cpu)
        .with_context(|| format!("loading {}", a.model.display()))?;
    let text = tensor_ops::fsio::read_to_string(&a.data, "corpus", tensor_ops::fsio::TEXT_MAX)?;
    let ds = models::gpt::Dataset::from_text(&text, 0.9)?;
    models::export_hf(&model, &ds.tokenizer, &a.out)?;
    println!(
        "wrote {} ({:?} variant; config.json, model.safetensors, tokenizer.json): {} parameters, vocab {}",
        a.out.display(),
        model.config.variant,
        model.num_params(),
        ds.tokenizer.vocab_size()
    );
    Ok(())
}

/// `hybrid-trainer perplexity`; non-finite logits name their cause in the weights
/// ([`crate::nonfinite`]).
pub fn perplexity(device: Device, a: &PerplexityArgs) -> Result<()> {
    score(device, a).map_err(|e| crate::nonfinite::name_the_cause(&a.model, e))
}

fn score(device: Device, a: &PerplexityArgs) -> Result<()> {
    let tok = Tokenizer::from_dir(&a.model)?;
    let text = tensor_ops::fsio::read_to_string(&a.text, "text", tensor_ops::fsio::TEXT_MAX)?;
    let mut ids = tok.encode(&text, false)?;
    if let Some(n) = a.max_tokens {
        ids.truncate(n);
    }
    let (p, t) = match a.run.engine {
        EngineKind::Reference => {
            let model = load(&a.model, device, a.run.quant)?;
            let t = Instant::now();
            (model.perplexity(&ids)?, t)
        }
        EngineKind::Fast => {
            let cfg = models::ModelConfig::from_dir(&a.model)?;
            // One window: the context, or the whole text when shorter.
            let capacity = cfg.max_position_embeddings.min(ids.len()).max(1);
            let opts = a.run.fast_options(1, capacity);
            let t = Instant::now();
            let mut engine = models::Engine::load(&a.model, device, opts)
                .with_context(|| format!("loading the model in {}", a.model.display()))?;
            eprintln!(
                "fast engine ({}{}) on {device}: {} layers × {}, context {}, loaded in {:.2} s",
                opts.dtype,
                opts.quant
                    .map_or(String::new(), |q| format!(", projections {q:?}")),
                cfg.num_layers,
                cfg.hidden_size,
                cfg.max_position_embeddings,
                t.elapsed().as_secs_f64()
            );
            let t = Instant::now();
            (engine.perplexity(&ids)?, t)
        }
    };
    println!(
        "perplexity {p:.4} over {} tokens ({:.1} s)",
        ids.len(),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The tokens of a generated row that are printed: all but a final stop token. The
/// end-of-sequence token ends the text without being part of it, on both engines (as
/// `transformers`' pipelines decode with `skip_special_tokens`, real EOS tokens being special;
/// a tokenizer that does not mark it special would print its text otherwise).
pub(crate) fn printed<'a>(row: &'a [u32], stop: &[u32]) -> &'a [u32] {
    match row.split_last() {
        Some((last, rest)) if stop.contains(last) => rest,
        _ => row,
    }
}

/// `hybrid-trainer generate`; non-finite logits name their cause in the weights
/// ([`crate::nonfinite`]).
pub fn run(device: Device, a: &GenerateArgs) -> Result<()> {
    generate(device, a).map_err(|e| crate::nonfinite::name_the_cause(&a.model, e))
}

fn generate(device: Device, a: &GenerateArgs) -> Result<()> {
    let sampler = Sampling {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        repetition_penalty: a.repetition_penalty,
        seed: a.seed,
    };
    let settings = sampler;
    let mut sampler = Sampler::new(sampler)?;
    let tok = Tokenizer::from_dir(&a.model)?;
    let prompts = a
        .prompt
        .iter()
        .map(|p| tok.encode(p, !a.no_special_tokens))
        .collect::<Result<Vec<_>, _>>()?;
    if a.run.engine == EngineKind::Fast {
        return crate::generate_fast::run(device, a, &tok, &prompts, &settings);
    }
    let model = load(&a.model, device, a.run.quant)?;
    let stop = if a.ignore_eos {
        Vec::new()
    } else {
        model.config().eos_token_ids.clone()
    };
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    eprintln!(
        "prompts: {:?} tokens",
        prompts.iter().map(Vec::len).collect::<Vec<_>>()
    );
    let context = model.config().max_position_embeddings;
    anyhow::ensure!(
        longest.saturating_add(a.max_new_tokens) <= context,
        "the prompt's {longest} tokens and --max-new-tokens {} exceed the model's context of {context}",
        a.max_new_tokens
    );
    let run = Run {
        model: &model,
        tok: &tok,
        a,
        stop: &stop,
    };
    if prompts.len() > 1 {
        run.batch(&prompts, &mut sampler)
    } else {
        run.stream(&prompts[0], &a.prompt[0], &mut sampler)
    }
}

/// One reference-engine generation: the model, its tokenizer, the command's arguments and the
/// tokens that end a row.
struct Run<'a> {
    model: &'a CausalLm,
    tok: &'a Tokenizer,
    a: &'a GenerateArgs,
    stop: &'a [u32],
}

impl Run<'_> {
    /// Several prompts as one batch, each row printed when all are done.
    fn batch(&self, prompts: &[Vec<u32>], sampler: &mut Sampler) -> Result<()> {
        let (model, tok, a, stop) = (self.model, self.tok, self.a, self.stop);
        let refs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
        let t = Instant::now();
        let out = model.generate_batch(&refs, a.max_new_tokens, sampler, stop)?;
        let secs = t.elapsed().as_secs_f64();
        for (i, (p, new)) in a.prompt.iter().zip(&out).enumerate() {
            println!("[{i}] {p}{}", tok.decode(printed(new, stop), true)?);
        }
        let n: usize = out.iter().map(Vec::len).sum();
        eprintln!(
            "{} rows, {n} new tokens in {:.1} ms ({:.1} tokens/s)",
            out.len(),
            secs * 1e3,
            n as f64 / secs
        );
        Ok(())
    }

    /// One prompt, its continuation printed as it is sampled.
    fn stream(&self, prompt: &[u32], text: &str, sampler: &mut Sampler) -> Result<()> {
        let (model, tok, a, stop) = (self.model, self.tok, self.a, self.stop);
        let mut new: Vec<u32> = Vec::new();
        let mut shown = String::new();
        let mut first = None;
        let t = Instant::now();
        let (mut err, mut n) = (None, 0usize);
        model.generate(prompt, a.max_new_tokens, sampler, stop, |id| {
            // The prompt once a token is chosen: a model that cannot choose one (non-finite
            // logits) prints nothing.
            first.get_or_insert_with(|| {
                print!("{text}");
                t.elapsed().as_secs_f64()
            });
            n += 1;
            if stop.contains(&id) {
                return; // the end of the text, not printed (see `printed`)
            }
            new.push(id);
            // Decode the whole continuation and print what is new: multi-byte characters split
            // over tokens appear once whole.
            match tok.decode(&new, true) {
                Ok(text) if text.starts_with(&shown) => {
                    print!("{}", &text[shown.len()..]);
                    let _ = std::io::stdout().flush();
                    shown = text;
                }
                Ok(text) => shown = text,
                Err(e) => err = Some(e),
            }
        })?;
        if let Some(e) = err {
            return Err(e.into());
        }
        println!();
        let total = t.elapsed().as_secs_f64();
        let ttft = first.unwrap_or(total);
        let rest = n.saturating_sub(1);
        eprintln!(
            "{n} new tokens; first after {:.1} ms (prefill of {} tokens), then {:.1} tokens/s",
            ttft * 1e3,
            prompt.len(),
            if rest > 0 {
                rest as f64 / (total - ttft)
            } else {
                0.0
            }
        );
        Ok(())
    }
}
