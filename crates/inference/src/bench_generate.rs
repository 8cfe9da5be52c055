//! `hybrid-trainer bench-generate`: times the fast engine ([`models::Engine`]) on the prompts
//! that `benches/hf_generate_peer.py --save` wrote beside the same model, so both sides time
//! identical work in one device call. Every figure is the median of `--repeats` runs after a
//! warm-up, timed on the host around work that ends in a device-to-host copy (so the device
//! has finished):
//! - time to first token: prefill of the 512-token prompt at batch 1, its argmax, the copy;
//! - prefill tokens/s: prompt tokens over the time of that prefill (512 and 2048 tokens; the
//!   latter skipped, and the context recorded, where the model holds fewer positions);
//! - decode tokens/s at batch B: B·(N − 1) over the time of the N − 1 graphed greedy steps
//!   after the first token (each step: ids in, one replay, the new tokens out); again with
//!   the tokens sampled on the device (temperature 0.8, top-p 0.95, repetition penalty 1.1).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use clap::Args;
use models::{Engine, ModelConfig, Sampling};
use safetensors::SafeTensors;
use tensor_ops::{no_grad, Device};

use crate::generate::Quant;
use crate::generate_fast::EngineDtype;

#[derive(Args, Debug, Clone)]
pub struct BenchGenerateArgs {
    /// A Llama-family or GPT-2 model directory (as hf_generate_peer.py --save writes it).
    #[arg(long)]
    pub model: PathBuf,
    /// prompts.safetensors (prompt_512 [1,512], prompt_2048 [1,2048], batch16_512 [16,512]).
    #[arg(long)]
    pub prompts: PathBuf,
    #[arg(long, value_enum, default_value_t = EngineDtype::Bf16)]
    pub dtype: EngineDtype,
    /// Quantize the layers' projections at load (int8 per channel, int4 in groups of 128).
    #[arg(long, value_enum)]
    pub quant: Option<Quant>,
    /// New tokens per decode run.
    #[arg(long, default_value_t = 128)]
    pub new_tokens: usize,
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
    /// Writes the figures as JSON here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// On a wgpu device, also profiles this many greedy decode steps at batch 1 after a
    /// 512-token prefill (each kernel's GPU time, the host's waits and submissions: see
    /// `WgpuBackend::set_profiling`) and adds the table to the figures as `decode_profile`.
    #[arg(long, default_value_t = 0)]
    pub profile_steps: usize,
}

fn prompts(path: &std::path::Path, key: &str) -> Result<Vec<Vec<u32>>> {
    let bytes = tensor_ops::fsio::read(path, "prompts", tensor_ops::fsio::TENSORS_MAX)?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| {
        let why = tensor_ops::nn::describe_safetensors_error(&e);
        anyhow::anyhow!("{}: {why}", path.display())
    })?;
    let t = st
        .tensor(key)
        .with_context(|| format!("{key} in {}", path.display()))?;
    let shape = t.shape().to_vec();
    ensure!(
        shape.len() == 2 && t.dtype() == safetensors::Dtype::I64,
        "{key}: expected int64 [rows, len]"
    );
    let ids: Vec<u32> = t
        .data()
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")) as u32)
        .collect();
    Ok(ids.chunks(shape[1]).map(<[u32]>::to_vec).collect())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median seconds of `f` over `repeats` runs after one warm-up.
fn time(repeats: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut s = Vec::with_capacity(repeats);
    for _ in 0..repeats.max(1) {
        let t = Instant::now();
        f()?;
        s.push(t.elapsed().as_secs_f64());
    }
    Ok(median(s))
}

fn engine(a: &BenchGenerateArgs, device: Device, batch: usize, capacity: usize) -> Result<Engine> {
    let opts = crate::generate_fast::engine_options(a.dtype, a.quant, batch, capacity);
    Ok(Engine::load(&a.model, device, opts)?)
}

/// One prefill and its first tokens (the argmax, copied to the host).
fn prefill(e: &mut Engine, p: &[Vec<u32>]) -> Result<Vec<u32>> {
    let logits = e.prefill(p, false)?;
    Ok(no_grad(|| logits.argmax_last())?.to_vec_u32()?)
}

/// Median seconds of the `n − 1` decode steps after a prefill of `p` (run 0 is the warm-up:
/// it captures the decode graph), and row 0's tokens of the last run.
fn decode_time(
    e: &mut Engine,
    p: &[Vec<u32>],
    n: usize,
    repeats: usize,
    sampling: &Sampling,
) -> Result<(f64, Vec<u32>)> {
    let mut s = Vec::new();
    let mut row0 = Vec::with_capacity(n);
    for run in 0..=repeats.max(1) {
        let mut next = prefill(e, p)?;
        row0 = vec![next[0]];
        let t0 = Instant::now();
        for _ in 1..n {
            next = e.decode(&next, sampling)?;
            row0.push(next[0]);
        }
        if run > 0 {
            s.push(t0.elapsed().as_secs_f64());
        }
    }
    Ok((median(s), row0))
}

pub fn run(device: Device, a: &BenchGenerateArgs) -> Result<()> {
    let n = a.new_tokens.max(2);
    let p512 = prompts(&a.prompts, "prompt_512")?;
    let p2048 = prompts(&a.prompts, "prompt_2048")?;
    let b16 = prompts(&a.prompts, "batch16_512")?;
    let mut fig = serde_json::Map::new();
    // The 2048-token prompt where the model's context holds it (GPT-2's 1024 does not).
    let context = ModelConfig::from_dir(&a.model)?.max_position_embeddings;
    let long = 2048 + n <= context;
    let mut e1 = engine(a, device, 1, if long { 2048 + n } else { 512 + n })?;
    fig.insert(
        "weight_bytes_per_step".into(),
        e1.weight_bytes_per_step().into(),
    );
    let ttft = time(a.repeats, || prefill(&mut e1, &p512).map(drop))?;
    fig.insert("ttft_ms_512".into(), (ttft * 1e3).into());
    fig.insert("prefill_tok_s_512".into(), (512.0 / ttft).into());
    if long {
        let t2048 = time(a.repeats, || prefill(&mut e1, &p2048).map(drop))?;
        fig.insert("prefill_tok_s_2048".into(), (2048.0 / t2048).into());
    } else {
        fig.insert("prefill_2048_skipped_context".into(), context.into());
    }
    // Batch 1 decodes on the same engine (its cache holds 2048 + n slots): one load less.
    let mut e1 = Some(e1);
    let sampled = Sampling {
        temperature: 0.8,
        top_p: 0.95,
        repetition_penalty: 1.1,
        seed: 1,
        ..Sampling::default()
    };
    for (batch, p) in [(1usize, &p512), (16, &b16)] {
        let mut e = match e1.take() {
            Some(e) if batch == 1 => e,
            _ => engine(a, device, batch, 512 + n)?,
        };
        let (dt, row0) = decode_time(&mut e, p, n, a.repeats, &Sampling::default())?;
        // transformers' greedy tokens of row 0, where the peer saved them: how many leading
        // tokens agree (random weights repeat tokens; a bf16 near-tie may flip one).
        let peer = a.model.join("greedy.safetensors");
        if peer.exists() {
            let want = prompts(&peer, &format!("b{batch}"))?;
            let same = row0
                .iter()
                .zip(&want[0])
                .take_while(|(x, y)| x == y)
                .count();
            fig.insert(format!("greedy_prefix_agrees_b{batch}"), same.into());
        }
        fig.insert(
            format!("decode_tok_s_b{batch}"),
            ((batch * (n - 1)) as f64 / dt).into(),
        );
        fig.insert(
            format!("decode_step_ms_b{batch}"),
            (dt / (n - 1) as f64 * 1e3).into(),
        );
        let (ds, _) = decode_time(&mut e, p, n, a.repeats, &sampled)?;
        fig.insert(
            format!("decode_sampled_tok_s_b{batch}"),
            ((batch * (n - 1)) as f64 / ds).into(),
        );
    }
    if let (Device::Wgpu(index), n @ 1..) = (device, a.profile_steps) {
        let mut e = engine(a, device, 1, 512 + n + 1)?;
        fig.insert(
            "decode_profile".into(),
            profile_decode(&mut e, &p512, n, index)?,
        );
    }
    let json = serde_json::Value::Object(fig);
    println!("{}", serde_json::to_string_pretty(&json)?);
    if let Some(out) = &a.out {
        std::fs::write(out, serde_json::to_string_pretty(&json)?)?;
    }
    Ok(())
}

/// The per-kernel profile of a prefill of `p` and of `steps` greedy decode steps after it on
/// wgpu adapter `index` (each with the unprofiled wall time of the same work).
fn profile_decode(
    e: &mut Engine,
    p: &[Vec<u32>],
    steps: usize,
    index: usize,
) -> Result<serde_json::Value> {
    let gpu = tensor_ops::wgpu_backend(index)?;
    let (wall, _) = decode_time(e, p, steps + 1, 1, &Sampling::default())?;
    let t = Instant::now();
    prefill(e, p)?;
    let prefill_wall = t.elapsed().as_secs_f64();
    gpu.set_profiling(true)?;
    let mut next = prefill(e, p)?;
    let pre = gpu.profile();
    gpu.set_profiling(false)?;
    gpu.set_profiling(true)?;
    for _ in 0..steps {
        next = e.decode(&next, &Sampling::default())?;
    }
    let dec = gpu.profile();
    gpu.set_profiling(false)?;
    Ok(serde_json::json!({
        "prefill": profile_table(pre, 1, prefill_wall),
        "decode": profile_table(dec, steps, wall / steps as f64),
    }))
}

/// A profile as JSON: per kernel (or host key in parentheses) the launches, GPU and host
/// microseconds per repetition (of `reps`), most GPU time first; their GPU total, the
/// unprofiled wall time of one repetition (`wall_s`) and the submissions whose timestamps
/// were lost.
fn profile_table(
    (prof, lost): (Vec<tensor_ops::KernelTime>, u64),
    reps: usize,
    wall_s: f64,
) -> serde_json::Value {
    let per = |x: f64| x / reps as f64 / 1e3;
    let rows: Vec<serde_json::Value> = prof
        .iter()
        .map(|k| {
            serde_json::json!({
                "key": k.key,
                "launches": k.launches as f64 / reps as f64,
                "gpu_us": per(k.gpu_ns),
                "host_us": per(k.host_ns),
            })
        })
        .collect();
    serde_json::json!({
        "reps": reps,
        "unprofiled_wall_us": wall_s * 1e6,
        "gpu_us": prof.iter().map(|k| per(k.gpu_ns)).sum::<f64>(),
        "lost_batches": lost,
        "kernels": rows,
    })
}
