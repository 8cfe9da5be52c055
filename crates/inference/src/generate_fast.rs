//! `hybrid-trainer generate --engine fast`: decoding through [`models::Engine`] (the
//! preallocated cache, the graphed decode step on CUDA, greedy or sampled on the device),
//! streamed for one prompt, printed per row for several.

use std::io::Write;
use std::time::Instant;

use anyhow::Result;
use clap::ValueEnum;
use models::{Engine, EngineOptions, ModelConfig, Sampling, Tokenizer};
use tensor_ops::{DType, Device};

use crate::generate::GenerateArgs;

/// The fast engine's weights and matmuls (`--dtype` of `generate --engine fast` and
/// `bench-generate`).
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineDtype {
    Bf16,
    F32,
}

impl From<EngineDtype> for DType {
    fn from(d: EngineDtype) -> DType {
        match d {
            EngineDtype::Bf16 => DType::BF16,
            EngineDtype::F32 => DType::F32,
        }
    }
}

/// The fast engine's options: `dtype` weights, `batch` rows of `capacity` positions, the
/// projections quantized to `quant` when set.
pub fn engine_options(
    dtype: EngineDtype,
    quant: Option<crate::generate::Quant>,
    batch: usize,
    capacity: usize,
) -> EngineOptions {
    EngineOptions {
        dtype: dtype.into(),
        batch,
        capacity,
        quant: quant.map(Into::into),
    }
}

pub fn run(
    device: Device,
    a: &GenerateArgs,
    tok: &Tokenizer,
    prompts: &[Vec<u32>],
    sampling: &Sampling,
) -> Result<()> {
    let cfg = ModelConfig::from_dir(&a.model)?;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let capacity = longest.saturating_add(a.max_new_tokens);
    anyhow::ensure!(
        capacity <= cfg.max_position_embeddings,
        "the prompt's {longest} tokens and --max-new-tokens {} exceed the model's context of {}",
        a.max_new_tokens,
        cfg.max_position_embeddings
    );
    let stop = if a.ignore_eos {
        Vec::new()
    } else {
        cfg.eos_token_ids.clone()
    };
    let opts = a.run.fast_options(prompts.len(), capacity.max(1));
    let t = Instant::now();
    let mut engine = Engine::load(&a.model, device, opts)?;
    eprintln!(
        "fast engine ({}{}) on {device}: {} layers × {}, loaded in {:.2} s",
        opts.dtype,
        opts.quant
            .map_or(String::new(), |q| format!(", projections {q:?}")),
        cfg.num_layers,
        cfg.hidden_size,
        t.elapsed().as_secs_f64()
    );
    let one = prompts.len() == 1;
    let (mut new, mut shown) = (Vec::new(), String::new());
    let (mut first, mut err) = (None, None);
    let t = Instant::now();
    let out = engine.generate(prompts, a.max_new_tokens, &stop, sampling, |step| {
        // The prompt once the first tokens are chosen: a model that cannot choose them
        // (non-finite logits) prints nothing.
        first.get_or_insert_with(|| {
            if one {
                print!("{}", a.prompt[0]);
            }
            t.elapsed().as_secs_f64()
        });
        // A stop token ends the text without being printed (`generate::printed`).
        if one && err.is_none() && !stop.contains(&step[0]) {
            new.push(step[0]);
            // Print what the whole continuation adds (characters split over tokens once whole).
            match tok.decode(&new, true) {
                Ok(text) => {
                    if let Some(more) = text.strip_prefix(shown.as_str()) {
                        print!("{more}");
                        let _ = std::io::stdout().flush();
                    }
                    shown = text;
                }
                Err(e) => err = Some(e),
            }
        }
    })?;
    if let Some(e) = err {
        println!();
        return Err(e.into());
    }
    let secs = t.elapsed().as_secs_f64();
    if one {
        println!();
    } else {
        for (i, (p, row)) in a.prompt.iter().zip(&out).enumerate() {
            let text = tok.decode(crate::generate::printed(row, &stop), true)?;
            println!("[{i}] {p}{text}");
        }
    }
    let n: usize = out.iter().map(Vec::len).sum();
    eprintln!(
        "{n} new tokens in {:.1} ms (first after {:.1} ms; {:.1} tokens/s)",
        secs * 1e3,
        first.unwrap_or(0.0) * 1e3,
        n as f64 / secs
    );
    Ok(())
}
