//! Checkpoints of `train-gpt` (`--checkpoint DIR`, `--resume DIR`): the model's weights, AdamW's
//! moments and step, and the iteration reached, in `DIR/iter-NNNNNNN/` (`model.safetensors`
//! under the parameters' names, `optim.safetensors`, `state.json`), with `DIR/latest` naming the
//! newest one (replaced atomically, so a crash while writing leaves the previous checkpoint).
//!
//! Nothing in a checkpoint depends on the number of ranks: every rank draws the same global
//! batches from the run's seed (the draws of the iterations before are replayed on resume), so
//! a run resumes on any number of GPUs — or on the CPU — and a single-device resume continues
//! bit for bit. Dropout masks depend on the iteration and the rank (rank 0's are a single
//! device's), so with `--dropout > 0` a resume on another number of GPUs draws other masks for
//! the rows that move to another rank.

use crate::hybrid::checkpoint::{read_tensors, write_tensors, MODEL_FILE};
use anyhow::{bail, ensure, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use tensor_ops::gpt::Gpt;
use tensor_ops::optim::{AdamW, AdamWState};
use tensor_ops::Tensor;

const OPTIM: &str = "optim.safetensors";
const STATE: &str = "state.json";
const LATEST: &str = "latest";

/// What a checkpoint records besides the tensors; the run's shape is checked on resume.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// Iterations done (the resumed run starts at this one).
    pub iter: u32,
    pub opt_step: u32,
    pub seed: u64,
    /// The global batch and the context: the data stream depends on them.
    pub batch: u32,
    pub block: u32,
    pub params: usize,
    /// The ranks that wrote it (for the record only).
    pub ranks: usize,
}

fn ck(e: crate::hybrid::HybridError) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

/// Writes a checkpoint of `model` and `opt` at `state.iter` into `dir` and points `latest` at it.
/// The files go into a scratch directory that is renamed into place when complete (replacing
/// an older `iter-N` of the same number, left by an earlier run in the same directory), so a
/// crash never leaves a mix of two runs' files. A model or moment that is not finite (a
/// diverged run) is an error, and nothing is written.
pub fn save(dir: &Path, model: &Gpt, opt: &AdamW, state: &TrainState) -> Result<PathBuf> {
    save_with(dir, model, opt, state, &mut |_| Ok(()))
}

/// [`save`], with `extra` writing more files into the checkpoint's folder before it is renamed
/// into place (the driver's counters, the hybrid's state): all of it lands, or none.
pub fn save_with(
    dir: &Path,
    model: &Gpt,
    opt: &AdamW,
    state: &TrainState,
    extra: &mut dyn FnMut(&Path) -> Result<()>,
) -> Result<PathBuf> {
    let params = model.parameters();
    let (m, v) = opt.moments();
    let mut moments = Vec::with_capacity(2 * params.len());
    for (i, (name, p, _)) in params.iter().enumerate() {
        finite(&format!("the weight {name}"), p)?;
        finite(&format!("AdamW's first moment of {name}"), &m[i])?;
        finite(&format!("AdamW's second moment of {name}"), &v[i])?;
        moments.push((format!("m.{name}"), m[i].clone()));
        moments.push((format!("v.{name}"), v[i].clone()));
    }
    let name = format!("iter-{:07}", state.iter);
    let sub = dir.join(&name);
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let written = (|| -> Result<()> {
        model.store().save(&tmp.join(MODEL_FILE))?;
        write_tensors(&tmp.join(OPTIM), &moments).map_err(ck)?;
        std::fs::write(tmp.join(STATE), serde_json::to_string_pretty(state)?)?;
        extra(&tmp)?;
        if sub.exists() {
            let old = dir.join(format!(".{name}.old.{}", std::process::id()));
            std::fs::rename(&sub, &old)?;
            let _ = std::fs::remove_dir_all(&old);
        }
        std::fs::rename(&tmp, &sub)?;
        Ok(())
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e.context(format!("writing {}", sub.display())));
    }
    let tmp = dir.join(format!(".latest.{}", std::process::id()));
    std::fs::write(&tmp, name.as_bytes())?;
    std::fs::rename(&tmp, dir.join(LATEST))
        .with_context(|| format!("updating {}", dir.join(LATEST).display()))?;
    Ok(sub)
}

/// An error naming `what` when `t` holds a NaN or an infinity.
fn finite(what: &str, t: &Tensor) -> Result<()> {
    if let Some(x) = t.to_vec()?.into_iter().find(|x| !x.is_finite()) {
        bail!("{what} is {x}: the run has diverged, no checkpoint written");
    }
    Ok(())
}

/// The newest checkpoint of `dir` (its `latest`), or `dir` itself when it is one.
pub fn newest(dir: &Path) -> Result<PathBuf> {
    if dir.join(STATE).is_file() {
        return Ok(dir.to_path_buf());
    }
    let name = std::fs::read_to_string(dir.join(LATEST))
        .with_context(|| format!("{} holds no checkpoint (no {LATEST} file)", dir.display()))?;
    let name = name.trim();
    ensure!(
        !name.is_empty() && !name.contains(['/', '\\']) && name != "..",
        "{}: {LATEST} names {name:?}",
        dir.display()
    );
    Ok(dir.join(name))
}

/// Loads the newest checkpoint of `dir` into `model` and `opt` (in place) after checking it
/// was written by a run of the same shape (`expect`: seed, global batch, context, parameter
/// count); returns its state. A checkpoint that fails any check (or to read) changes nothing.
pub fn load(dir: &Path, model: &Gpt, opt: &mut AdamW, expect: &TrainState) -> Result<TrainState> {
    let sub = newest(dir)?;
    let text = std::fs::read_to_string(sub.join(STATE))
        .with_context(|| format!("reading {}", sub.join(STATE).display()))?;
    let st: TrainState = serde_json::from_str(&text)
        .with_context(|| format!("parsing {}", sub.join(STATE).display()))?;
    for (what, got, want) in [
        ("--seed", st.seed, expect.seed),
        ("--batch (global)", st.batch as u64, expect.batch as u64),
        ("--block", st.block as u64, expect.block as u64),
        ("parameter count", st.params as u64, expect.params as u64),
    ] {
        if got != want {
            bail!(
                "{} was written by a run with {what} {got}, this run has {want}",
                sub.display()
            );
        }
    }
    let host = read_tensors(&sub.join(OPTIM)).map_err(ck)?;
    let device = model.device();
    let mut m = Vec::new();
    let mut v = Vec::new();
    for (name, p, _) in model.parameters() {
        for (prefix, out) in [("m", &mut m), ("v", &mut v)] {
            let key = format!("{prefix}.{name}");
            let Some((shape, vals)) = host.get(&key) else {
                bail!("{}: no tensor {key}", sub.join(OPTIM).display());
            };
            ensure!(
                shape.as_slice() == p.shape(),
                "{}: {key} has shape {shape:?}, the parameter {:?}",
                sub.join(OPTIM).display(),
                p.shape()
            );
            out.push(Tensor::from_vec(vals.clone(), shape, device)?);
        }
    }
    // Everything is read and checked before anything is written: the weights load all or
    // nothing, and the moments, built above with the parameters' shapes, cannot fail after.
    model
        .store()
        .load(&sub.join(MODEL_FILE))
        .with_context(|| format!("loading the weights of {}", sub.display()))?;
    opt.load_state(&AdamWState {
        m,
        v,
        step: st.opt_step,
    })?;
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensor_ops::gpt::{GptConfig, Variant};
    use tensor_ops::optim::AdamWParams;
    use tensor_ops::Device;

    fn model(seed: u64) -> (Gpt, AdamW) {
        let cfg = GptConfig {
            variant: Variant::Gpt2,
            vocab_size: 7,
            block_size: 4,
            n_layer: 1,
            n_head: 2,
            n_embd: 8,
            dropout: 0.0,
            bias: false,
        };
        let m = Gpt::new(cfg, seed, Device::Cpu).unwrap();
        let opt = m.store().adamw(AdamWParams::default()).unwrap();
        (m, opt)
    }

    /// The state of a run of `m` with seed 1, batch 4 and block 4.
    fn state_of(m: &Gpt, iter: u32, opt_step: u32, ranks: usize) -> TrainState {
        TrainState {
            iter,
            opt_step,
            seed: 1,
            batch: 4,
            block: 4,
            params: m.num_params(),
            ranks,
        }
    }

    fn values(m: &Gpt) -> Vec<Vec<f32>> {
        m.parameters()
            .iter()
            .map(|p| p.1.to_vec().unwrap())
            .collect()
    }

    /// A round trip restores weights, moments and step; a checkpoint that is damaged (a moment
    /// missing, `latest` pointing outside the directory, another run's shape) is an error that
    /// leaves the model and the optimiser as they were.
    #[test]
    fn a_bad_checkpoint_changes_nothing() {
        let dir = std::env::temp_dir().join(format!("train-ckpt-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (a, opt_a) = model(1);
        let state = state_of(&a, 7, 3, 2);
        let sub = save(&dir, &a, &opt_a, &state).unwrap();
        let (b, mut opt_b) = model(2);
        assert_ne!(values(&a), values(&b));
        assert_eq!(load(&dir, &b, &mut opt_b, &state).unwrap(), state);
        assert_eq!(values(&a), values(&b));
        assert_eq!(opt_b.steps(), 3);

        let (c, mut opt_c) = model(3);
        let before = values(&c);
        // Another run's global batch.
        let other = TrainState {
            batch: 8,
            ..state.clone()
        };
        let e = load(&dir, &c, &mut opt_c, &other).unwrap_err();
        assert!(e.to_string().contains("--batch (global) 4"), "{e}");
        // A moment missing (the weights themselves are fine).
        let host = read_tensors(&sub.join(OPTIM)).unwrap();
        let kept: Vec<(String, Tensor)> = host
            .into_iter()
            .filter(|(n, _)| !n.starts_with("v.transformer.h.0"))
            .map(|(n, (shape, v))| (n, Tensor::from_vec(v, &shape, Device::Cpu).unwrap()))
            .collect();
        write_tensors(&sub.join(OPTIM), &kept).unwrap();
        let e = load(&dir, &c, &mut opt_c, &state).unwrap_err();
        assert!(e.to_string().contains("no tensor v."), "{e}");
        // `latest` naming a path outside the directory.
        std::fs::write(dir.join(LATEST), "../elsewhere").unwrap();
        assert!(load(&dir, &c, &mut opt_c, &state).is_err());
        assert_eq!(values(&c), before, "a failed load changed the weights");
        assert_eq!(opt_c.steps(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn leftovers(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect()
    }

    /// A diverged model (a NaN or infinite weight) is refused and leaves the directory
    /// as it was; a checkpoint of the same iteration written again (a new run in an old
    /// directory) replaces the old one whole, with no scratch files left.
    #[test]
    fn diverged_models_are_refused_and_rewrites_are_whole() {
        let dir = std::env::temp_dir().join(format!("train-ckpt-nan-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (a, opt_a) = model(1);
        let state = state_of(&a, 5, 0, 1);
        save(&dir, &a, &opt_a, &state).unwrap();
        let latest = std::fs::read_to_string(dir.join(LATEST)).unwrap();

        let (bad, opt_bad) = model(2);
        let (name, w, _) = bad.parameters().swap_remove(0);
        let mut vals = w.to_vec().unwrap();
        for x in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            vals[0] = x;
            w.write_from_host(&vals).unwrap();
            let later = TrainState {
                iter: 6,
                ..state.clone()
            };
            let e = save(&dir, &bad, &opt_bad, &later).unwrap_err();
            assert!(e.to_string().contains(&name), "{e}");
            assert!(!dir.join("iter-0000006").exists());
            assert_eq!(std::fs::read_to_string(dir.join(LATEST)).unwrap(), latest);
        }

        // The same iteration again, from another model: loads as that model.
        let (b, opt_b) = model(3);
        save(&dir, &b, &opt_b, &state).unwrap();
        let (c, mut opt_c) = model(4);
        load(&dir, &c, &mut opt_c, &state).unwrap();
        assert_eq!(values(&c), values(&b));
        assert!(leftovers(&dir).is_empty(), "{:?}", leftovers(&dir));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
