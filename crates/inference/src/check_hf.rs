//! `hybrid-trainer check-hf`: a Hugging Face model directory against the expectations that
//! `transformers` wrote beside it (`expected.safetensors`, made by `scripts/hf_gpu_parity.py`
//! at real model sizes, or the committed tiny fixtures of `crates/models/tests/fixtures/hf`):
//! the prompt's logits within a stated bound, and the same greedy tokens. Issue 30, item 6.
//!
//! The engine under test is anything that implements `models`' [`LogitsEngine`]: the f32
//! reference engine ([`CausalLm`]) or the fast engine ([`FastLogits`], f32 or bf16; the
//! reference in bf16 is refused with [`CheckHfError::Bf16Unavailable`]).
//!
//! # The f32 bound
//!
//! Both sides compute the same f32 functions with other summation orders (and other
//! `exp`/`tanh`/`cos`, a few ulps each). As in `crates/models/tests/parity.rs`: a sum of `K`
//! products computed in f32 is within `γ·Σ|aᵢbᵢ|` of the exact one, and normalisation keeps
//! every op's operands at about the scale of the logits, so a logit that passes through `N`
//! such ops is within `N·γ` of `max|logit|`. `N` counts the ops on a logit's path: 14 per
//! layer (norm, q, k, v, scores, softmax, weighted values, output projection, residual, norm,
//! gate or fc, up or activation, down, residual) and 2 after the last (norm, head). `K` is the
//! longest sum: the largest of the width, the MLP width, the attention width and the positions.
//!
//! The worst-case `γ = K·u` (u = 2⁻²⁴) of the tiny fixtures gives, at Llama-3.2-1B's depth and
//! width (K = 8192, N = 226), 0.11 of `max|logit|`: no check at all of the tokens (nearly every
//! step's top-two margin is below it). The bound here is instead the probabilistic one of
//! Higham and Mary ("A new approach to probabilistic rounding error analysis", SIAM J. Sci.
//! Comput. 41, 2019), for rounding errors that are independent and of mean zero:
//! `γ = λ·√K·u`, which holds for a sum with probability at least `1 − 2K·exp(−λ²/2)`. With
//! λ = 8 that is `1 − 2·10⁻¹⁰` per sum at K = 8192. Each side is within `N·γ`, so the two are
//! within `2·N·λ·√K·u` of `max|logit|`: 0.020 for Llama-3.2-1B, 0.022 for Qwen2.5-0.5B, 0.0090
//! for GPT-2 124M, 2.3e-4 for the 2-layer fixtures (whose own test uses 3e-4). The bound is a
//! function of the config alone ([`f32_bound`]), fixed before any run.
//!
//! A greedy token may differ from `transformers`' only where the two top logits were closer
//! than the two engines can be apart, `2·bound` (each may move by the bound): the recorded
//! margin of that step must be below it. After a differing token the two sequences continue
//! different prefixes, so later tokens are not compared.
//!
//! # The bf16 bound (for the fast engine)
//!
//! bf16 rounds every op's inputs to 8 significant bits, so the worst-case sum over the depth
//! exceeds the logits' scale. The yardstick is `transformers`' own bf16 deviation from the
//! f32 logits (`logits_bf16` in the file): the engine's bf16 logits must be within twice it of
//! the f32 logits.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Args, ValueEnum};
use models::{CausalLm, FastLogits, LogitsEngine, ModelConfig, ModelError};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use tensor_ops::nn::describe_safetensors_error as describe;
use tensor_ops::{DType, Device};
use thiserror::Error;

/// The file of expectations in a model directory.
pub const EXPECTED_FILE: &str = "expected.safetensors";
/// λ of the probabilistic summation bound (see the module's documentation).
pub const LAMBDA: f64 = 8.0;
/// f32's unit roundoff.
pub const F32_U: f64 = 1.0 / (1u64 << 24) as f64;
/// Ops on a logit's path per layer, and after the last layer.
pub const OPS_PER_LAYER: usize = 14;
pub const OPS_AFTER_LAYERS: usize = 2;

/// The arithmetic of the engine under test.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckDtype {
    /// The f32 reference engine (logits and greedy tokens).
    F32,
    /// bf16 weights and matmuls (the fast engine only; logits).
    Bf16,
}

/// Which engine is checked.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CheckEngine {
    /// `models::CausalLm`, the f32 reference.
    #[default]
    Reference,
    /// `models::Engine`: fused weights, the preallocated cache, graphed decode on CUDA.
    Fast,
}

#[derive(Args, Debug, Clone)]
pub struct CheckHfArgs {
    /// The model directory: config.json, model.safetensors (or shards and their index) and
    /// expected.safetensors (scripts/hf_gpu_parity.py).
    #[arg(long)]
    pub model: PathBuf,
    /// The engine's arithmetic.
    #[arg(long, value_enum, default_value_t = CheckDtype::F32)]
    pub dtype: CheckDtype,
    /// The engine checked (bf16 needs the fast one).
    #[arg(long, value_enum, default_value_t = CheckEngine::Reference)]
    pub engine: CheckEngine,
}

/// Why a check could not be run (a check that ran and failed is a [`Check`] with `pass`
/// false, not an error).
#[derive(Debug, Error)]
pub enum CheckHfError {
    #[error(transparent)]
    Io(#[from] tensor_ops::fsio::FileError),
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {msg}")]
    BadExpected { path: PathBuf, msg: String },
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("the expectations and the model disagree: {0}")]
    Mismatch(String),
    #[error("bf16 needs the fast engine (--engine fast)")]
    Bf16Unavailable,
}

/// What `transformers` computed, read from [`EXPECTED_FILE`].
#[derive(Debug, Clone, PartialEq)]
pub struct Expected {
    /// The prompt.
    pub ids: Vec<u32>,
    /// Its f32 logits, `[ids.len(), vocab]` row-major.
    pub logits: Vec<f32>,
    /// The greedy tokens after the prompt.
    pub greedy: Vec<u32>,
    /// Per greedy token, the top1 − top2 margin of the logits that chose it (absent in the
    /// tiny fixtures: then no differing token is accepted).
    pub margins: Option<Vec<f32>>,
    /// The prompt's logits from the model in bf16, widened to f32.
    pub logits_bf16: Option<Vec<f32>>,
    /// The file's metadata (versions, device, seed).
    pub meta: BTreeMap<String, String>,
}

fn bad(path: &Path, msg: impl Into<String>) -> CheckHfError {
    CheckHfError::BadExpected {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

/// The elements of tensor `key` as `T` (from little-endian `N`-byte values of `dtype`).
fn read<T, const N: usize>(
    st: &SafeTensors,
    path: &Path,
    key: &str,
    dtype: Dtype,
    conv: fn([u8; N]) -> T,
) -> Result<Option<Vec<T>>, CheckHfError> {
    let t = match st.tensor(key) {
        Ok(t) => t,
        Err(safetensors::SafeTensorError::TensorNotFound(_)) => return Ok(None),
        Err(e) => return Err(bad(path, format!("{key}: {}", describe(&e)))),
    };
    if t.dtype() != dtype {
        return Err(bad(
            path,
            format!("{key} is {:?}, not {dtype:?}", t.dtype()),
        ));
    }
    let v = t
        .data()
        .chunks_exact(N)
        .map(|c| conv(c.try_into().unwrap_or([0; N])))
        .collect();
    Ok(Some(v))
}

fn ids_of(v: Vec<i64>, path: &Path, key: &str) -> Result<Vec<u32>, CheckHfError> {
    v.into_iter()
        .map(|x| u32::try_from(x).map_err(|_| bad(path, format!("{key}: id {x} out of range"))))
        .collect()
}

impl Expected {
    /// Reads `path`: `input_ids` (i64 `[1, t]`), `logits` (f32 `[1, t, V]`), `greedy` (i64
    /// `[1, t + n]`, starting with the prompt), and the optional `greedy_margins` (f32 `[n]`)
    /// and `logits_bf16` (f32 `[1, t, V]`).
    pub fn read(path: &Path) -> Result<Self, CheckHfError> {
        let bytes = tensor_ops::fsio::read(path, "expectations", tensor_ops::fsio::TENSORS_MAX)?;
        let st = SafeTensors::deserialize(&bytes).map_err(|e| bad(path, describe(&e)))?;
        let (_, header) =
            SafeTensors::read_metadata(&bytes).map_err(|e| bad(path, describe(&e)))?;
        let meta = header
            .metadata()
            .clone()
            .map(|m| m.into_iter().collect())
            .unwrap_or_default();
        let i64s = |k: &str| read(&st, path, k, Dtype::I64, i64::from_le_bytes);
        let f32s = |k: &str| read(&st, path, k, Dtype::F32, f32::from_le_bytes);
        let need = |k: &str| bad(path, format!("no tensor {k}"));
        let ids = ids_of(
            i64s("input_ids")?.ok_or_else(|| need("input_ids"))?,
            path,
            "input_ids",
        )?;
        let logits = f32s("logits")?.ok_or_else(|| need("logits"))?;
        let full = ids_of(
            i64s("greedy")?.ok_or_else(|| need("greedy"))?,
            path,
            "greedy",
        )?;
        if ids.is_empty() || !full.starts_with(&ids) {
            return Err(bad(path, "greedy does not start with the prompt input_ids"));
        }
        if logits.is_empty() || !logits.len().is_multiple_of(ids.len()) {
            return Err(bad(path, "logits are not [prompt, vocab]"));
        }
        let greedy = full[ids.len()..].to_vec();
        let margins = f32s("greedy_margins")?;
        if margins.as_ref().is_some_and(|m| m.len() != greedy.len()) {
            return Err(bad(path, "greedy_margins: not one per greedy token"));
        }
        let logits_bf16 = f32s("logits_bf16")?;
        if logits_bf16
            .as_ref()
            .is_some_and(|b| b.len() != logits.len())
        {
            return Err(bad(path, "logits_bf16: not the shape of logits"));
        }
        Ok(Expected {
            ids,
            logits,
            greedy,
            margins,
            logits_bf16,
            meta,
        })
    }

    /// Writes the expectations to `path` in the format [`Expected::read`] reads.
    pub fn write(&self, path: &Path) -> Result<(), CheckHfError> {
        let (t, v) = (self.ids.len(), self.vocab());
        let i64b =
            |x: &[u32]| -> Vec<u8> { x.iter().flat_map(|&i| i64::from(i).to_le_bytes()).collect() };
        let f32b = |x: &[f32]| -> Vec<u8> { x.iter().flat_map(|f| f.to_le_bytes()).collect() };
        let full: Vec<u32> = self.ids.iter().chain(&self.greedy).copied().collect();
        let mut data: Vec<(&str, Dtype, Vec<usize>, Vec<u8>)> = vec![
            ("input_ids", Dtype::I64, vec![1, t], i64b(&self.ids)),
            ("logits", Dtype::F32, vec![1, t, v], f32b(&self.logits)),
            ("greedy", Dtype::I64, vec![1, full.len()], i64b(&full)),
        ];
        if let Some(m) = &self.margins {
            data.push(("greedy_margins", Dtype::F32, vec![m.len()], f32b(m)));
        }
        if let Some(b) = &self.logits_bf16 {
            data.push(("logits_bf16", Dtype::F32, vec![1, t, v], f32b(b)));
        }
        let views = data
            .iter()
            .map(|(k, d, s, b)| {
                TensorView::new(*d, s.clone(), b)
                    .map(|view| (*k, view))
                    .map_err(|e| bad(path, describe(&e)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let meta = (!self.meta.is_empty()).then(|| self.meta.clone().into_iter().collect());
        let bytes = safetensors::serialize(views, &meta).map_err(|e| bad(path, describe(&e)))?;
        std::fs::write(path, bytes).map_err(|source| CheckHfError::Write {
            path: path.to_path_buf(),
            source,
        })
    }

    /// The vocabulary (the logits' last dimension).
    pub fn vocab(&self) -> usize {
        self.logits.len() / self.ids.len().max(1)
    }
}

/// The engine of `kind` and `dtype` for the model in `dir` on `device` (bf16: the fast
/// engine only).
pub fn engine(
    kind: CheckEngine,
    dtype: CheckDtype,
    dir: &Path,
    device: Device,
) -> Result<Box<dyn LogitsEngine>, CheckHfError> {
    match (kind, dtype) {
        (CheckEngine::Reference, CheckDtype::F32) => Ok(Box::new(CausalLm::load(dir, device)?)),
        (CheckEngine::Reference, CheckDtype::Bf16) => Err(CheckHfError::Bf16Unavailable),
        (CheckEngine::Fast, CheckDtype::F32) => {
            Ok(Box::new(FastLogits::load(dir, device, DType::F32)?))
        }
        (CheckEngine::Fast, CheckDtype::Bf16) => {
            Ok(Box::new(FastLogits::load(dir, device, DType::BF16)?))
        }
    }
}

/// The f32 bound of a config: relative to `max|logit|`, with its terms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct F32Bound {
    /// Ops on a logit's path.
    pub ops: usize,
    /// The longest sum.
    pub k: usize,
    /// `2·ops·λ·√k·u`.
    pub rel: f64,
}

/// The bound on |engine − transformers| / max|logit| for `cfg` over `positions` positions
/// (the module's documentation derives it).
pub fn f32_bound(cfg: &ModelConfig, positions: usize) -> F32Bound {
    let ops = OPS_PER_LAYER * cfg.num_layers + OPS_AFTER_LAYERS;
    let k = [
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.num_heads * cfg.head_dim,
        positions,
    ]
    .into_iter()
    .max()
    .unwrap_or(1);
    let rel = 2.0 * ops as f64 * LAMBDA * (k as f64).sqrt() * F32_U;
    F32Bound { ops, k, rel }
}

/// One check's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// "logits f32", "greedy f32", "logits bf16".
    pub what: String,
    pub pass: bool,
    /// The measured error and the bound, in words.
    pub detail: String,
}

impl Check {
    /// The one-line summary: `PASS|FAIL <model> <what>: <detail>`.
    pub fn line(&self, model: &str) -> String {
        let tag = if self.pass { "PASS" } else { "FAIL" };
        format!("{tag} {model} {}: {}", self.what, self.detail)
    }
}

/// The largest |got − want| and where; `None` if either has a non-finite value (a NaN would
/// otherwise slip through the maximum).
fn max_error(got: &[f32], want: &[f32]) -> Option<(usize, f32)> {
    if got.iter().chain(want).any(|v| !v.is_finite()) {
        return None;
    }
    Some(
        got.iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .enumerate()
            .fold((0, 0f32), |m, (i, e)| if e > m.1 { (i, e) } else { m }),
    )
}

fn scale_of(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |m, x| m.max(x.abs()))
}

/// Compares logits with an absolute tolerance `tol`; `how` says where the bound comes from.
fn logits_check(what: &str, got: &[f32], want: &[f32], tol: f64, how: &str) -> Check {
    let vocab_note = |i: usize| format!("at {i}: {} against {}", got[i], want[i]);
    let scale = scale_of(want) as f64;
    let (pass, detail) = if got.len() != want.len() {
        (
            false,
            format!("{} values, {} expected", got.len(), want.len()),
        )
    } else {
        match max_error(got, want) {
            None => (false, "non-finite logits (the engine's or the expected)".to_string()),
            Some((i, err)) => (
                f64::from(err) <= tol,
                format!(
                    "max |Δ| {err:.3e} = {:.2e} of max|logit| {scale:.4} ({}; bound {tol:.3e} = {:.2e} of it: {how})",
                    f64::from(err) / scale,
                    vocab_note(i),
                    tol / scale
                ),
            ),
        }
    };
    Check {
        what: what.to_string(),
        pass,
        detail,
    }
}

/// Compares greedy tokens; a differing token is accepted only at a step whose recorded
/// margin is below `tie` (then later tokens are not compared).
fn greedy_check(got: &[u32], want: &[u32], margins: Option<&[f32]>, tie: f64) -> Check {
    let what = "greedy f32".to_string();
    let n = want.len();
    let min_margin = margins.map(|m| m.iter().fold(f32::INFINITY, |a, &b| a.min(b)));
    let margin_note = match min_margin {
        Some(m) => format!(
            "min top1-top2 margin {m:.3e}, near-tie threshold 2·bound {tie:.3e}{}",
            if f64::from(m) < tie {
                " (a flip at that step would be accepted)"
            } else {
                ""
            }
        ),
        None => "no margins recorded: no differing token is accepted".to_string(),
    };
    let first = got.iter().zip(want).position(|(a, b)| a != b);
    let (pass, detail) = match first {
        None if got.len() == n => (true, format!("{n}/{n} tokens equal; {margin_note}")),
        None => (false, format!("{} tokens, {n} expected", got.len())),
        Some(s) => {
            let m = margins.map(|m| m[s]);
            let tied = m.is_some_and(|m| f64::from(m) < tie);
            let head = format!(
                "tokens equal through step {s} of {n}, then {} where transformers has {}",
                got[s], want[s]
            );
            match m {
                Some(m) if tied => (
                    true,
                    format!(
                        "{head}: accepted, that step's margin {m:.3e} is below 2·bound {tie:.3e} \
                         (a near tie the rounding may flip); later tokens follow another prefix \
                         and are not compared"
                    ),
                ),
                Some(m) => (
                    false,
                    format!("{head}: that step's margin {m:.3e} is above 2·bound {tie:.3e}"),
                ),
                None => (false, format!("{head}; {margin_note}")),
            }
        }
    };
    Check { what, pass, detail }
}

/// Runs the checks of `dtype` on `engine` against `e` for a model of config `cfg`.
pub fn check(
    engine: &mut dyn LogitsEngine,
    cfg: &ModelConfig,
    e: &Expected,
    dtype: CheckDtype,
) -> Result<Vec<Check>, CheckHfError> {
    if e.vocab() != cfg.vocab_size {
        return Err(CheckHfError::Mismatch(format!(
            "the logits have {} columns, the model's vocabulary is {}",
            e.vocab(),
            cfg.vocab_size
        )));
    }
    let t = Instant::now();
    let got = engine.prompt_logits(&e.ids)?;
    eprintln!(
        "prompt of {} tokens: logits in {:.1} ms",
        e.ids.len(),
        t.elapsed().as_secs_f64() * 1e3
    );
    let scale = f64::from(scale_of(&e.logits));
    match dtype {
        CheckDtype::F32 => {
            let b = f32_bound(cfg, e.ids.len() + e.greedy.len());
            let how = format!(
                "2 × {} ops × {LAMBDA}·√{}·2⁻²⁴, see check_hf.rs",
                b.ops, b.k
            );
            let logits = logits_check("logits f32", &got, &e.logits, b.rel * scale, &how);
            let t = Instant::now();
            let tokens = engine.greedy(&e.ids, e.greedy.len())?;
            let secs = t.elapsed().as_secs_f64();
            eprintln!(
                "{} greedy tokens in {:.2} s ({:.1} tokens/s)",
                tokens.len(),
                secs,
                tokens.len() as f64 / secs
            );
            let greedy = greedy_check(
                &tokens,
                &e.greedy,
                e.margins.as_deref(),
                2.0 * b.rel * scale,
            );
            Ok(vec![logits, greedy])
        }
        CheckDtype::Bf16 => {
            let Some(hf) = &e.logits_bf16 else {
                return Err(CheckHfError::Mismatch(
                    "no logits_bf16 in the expectations".into(),
                ));
            };
            let hf_err = max_error(hf, &e.logits).map_or(f32::INFINITY, |(_, err)| err);
            let how = format!("2 × transformers' own bf16 deviation {hf_err:.3e}");
            let tol = 2.0 * f64::from(hf_err);
            Ok(vec![logits_check(
                "logits bf16",
                &got,
                &e.logits,
                tol,
                &how,
            )])
        }
    }
}

/// The model's name for the report: the expectations' `name`, else the directory's.
fn model_name(dir: &Path, e: &Expected) -> String {
    e.meta.get("name").cloned().unwrap_or_else(|| {
        dir.file_name()
            .map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into())
    })
}

/// Loads the expectations and the engine, runs the checks, prints one line per check; the
/// checks (the caller fails if any failed).
pub fn run_checks(
    dir: &Path,
    device: Device,
    dtype: CheckDtype,
) -> Result<(String, Vec<Check>), CheckHfError> {
    let kind = match dtype {
        CheckDtype::F32 => CheckEngine::Reference,
        CheckDtype::Bf16 => CheckEngine::Fast,
    };
    run_checks_of(dir, device, kind, dtype)
}

/// [`run_checks`] of the engine `kind`.
pub fn run_checks_of(
    dir: &Path,
    device: Device,
    kind: CheckEngine,
    dtype: CheckDtype,
) -> Result<(String, Vec<Check>), CheckHfError> {
    models::check_model_dir(dir)?;
    let e = Expected::read(&dir.join(EXPECTED_FILE))?;
    let name = model_name(dir, &e);
    if !e.meta.is_empty() {
        let m: Vec<String> = e.meta.iter().map(|(k, v)| format!("{k}={v}")).collect();
        eprintln!("expectations: {}", m.join(", "));
    }
    let cfg = ModelConfig::from_dir(dir).map_err(ModelError::from)?;
    let t = Instant::now();
    let mut eng = engine(kind, dtype, dir, device)?;
    eprintln!(
        "{name}: {} ({:?}, {} layers × {}, vocab {}), loaded in {:.1} s",
        eng.describe(),
        cfg.architecture,
        cfg.num_layers,
        cfg.hidden_size,
        cfg.vocab_size,
        t.elapsed().as_secs_f64()
    );
    let checks = check(eng.as_mut(), &cfg, &e, dtype)?;
    for c in &checks {
        println!("{}", c.line(&name));
    }
    Ok((name, checks))
}

/// `hybrid-trainer check-hf`: runs the checks; an error when any failed.
pub fn run(device: Device, a: &CheckHfArgs) -> anyhow::Result<()> {
    let (name, checks) = run_checks_of(&a.model, device, a.engine, a.dtype)
        .map_err(|e| crate::nonfinite::name_the_cause(&a.model, e.into()))?;
    let failed = checks.iter().filter(|c| !c.pass).count();
    anyhow::ensure!(
        failed == 0,
        "check-hf {name}: {failed} of {} checks failed",
        checks.len()
    );
    Ok(())
}
