//! Checkpoints of `train-gpt` (`--checkpoint DIR`, `--resume DIR`): the model's weights, the
//! optimizer's state (any [`Optimizer`]: AdamW, Schedule-Free AdamW, Prodigy) and the iteration
//! reached, in `DIR/iter-NNNNNNN/` (`model.safetensors` under the parameters' names,
//! `optimizer.safetensors` as [`OptimizerState::save`] writes it, `state.json`), with
//! `DIR/latest` naming the newest one (replaced atomically, so a crash while writing leaves the
//! previous checkpoint). Checkpoints of earlier builds (AdamW's moments in `optim.safetensors`
//! under `m.`/`v.` and the parameters' names) still load into AdamW.
//!
//! Nothing in a checkpoint depends on the number of ranks: every rank draws the same global
//! batches from the run's seed (the draws of the iterations before are replayed on resume), so
//! a run resumes on any number of GPUs — or on the CPU — and a single-device resume continues
//! bit for bit. Dropout masks depend on the iteration and the rank (rank 0's are a single
//! device's), so with `--dropout > 0` a resume on another number of GPUs draws other masks for
//! the rows that move to another rank.

use crate::tensor_file::{read_tensors, TensorFileError, MODEL_FILE};
use anyhow::{bail, ensure, Context, Result};
use models::gpt::Gpt;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use tensor_ops::optim::{Optimizer, OptimizerState};
use tensor_ops::Tensor;

/// The optimizer's state ([`OptimizerState`]).
const OPTIMIZER: &str = "optimizer.safetensors";
/// Earlier builds' AdamW moments (read only).
const LEGACY_ADAMW: &str = "optim.safetensors";
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

fn ck(e: TensorFileError) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

/// Writes a checkpoint of `model` and `opt` at `state.iter` into `dir` and points `latest` at it.
/// The files go into a scratch directory that is renamed into place when complete (replacing
/// an older `iter-N` of the same number, left by an earlier run in the same directory), so a
/// crash never leaves a mix of two runs' files. A weight or optimizer state that is not finite
/// (a diverged run) is an error, and nothing is written.
pub fn save(dir: &Path, model: &Gpt, opt: &dyn Optimizer, state: &TrainState) -> Result<PathBuf> {
    save_with(dir, model, opt, state, &mut |_| Ok(()))
}

/// [`save`], with `extra` writing more files into the checkpoint's folder before it is renamed
/// into place (the driver's counters, the hybrid's state): all of it lands, or none.
pub fn save_with(
    dir: &Path,
    model: &Gpt,
    opt: &dyn Optimizer,
    state: &TrainState,
    extra: &mut dyn FnMut(&Path) -> Result<()>,
) -> Result<PathBuf> {
    for (name, p, _) in model.parameters() {
        finite(&format!("the weight {name}"), &p)?;
    }
    let optimizer = opt.state()?;
    for (name, t) in &optimizer.tensors {
        finite(&format!("{}'s state {name}", opt.name()), t)?;
    }
    if let Some((name, x)) = optimizer.scalars.iter().find(|(_, x)| !x.is_finite()) {
        bail!(
            "{}'s {name} is {x}: the run has diverged, no checkpoint written",
            opt.name()
        );
    }
    let name = format!("iter-{:07}", state.iter);
    let sub = dir.join(&name);
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let written = (|| -> Result<()> {
        model.store().save(&tmp.join(MODEL_FILE))?;
        optimizer.save(&tmp.join(OPTIMIZER))?;
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
    let name = tensor_ops::fsio::read_to_string(
        &dir.join(LATEST),
        "checkpoint pointer",
        tensor_ops::fsio::JSON_MAX,
    )
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
/// count) and optimizer; returns its state. A checkpoint that fails any check (or to read)
/// changes nothing.
pub fn load(
    dir: &Path,
    model: &Gpt,
    opt: &mut dyn Optimizer,
    expect: &TrainState,
) -> Result<TrainState> {
    let sub = newest(dir)?;
    let text = tensor_ops::fsio::read_to_string(
        &sub.join(STATE),
        "training state",
        tensor_ops::fsio::JSON_MAX,
    )?;
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
    let saved = if sub.join(OPTIMIZER).is_file() {
        OptimizerState::load(&sub.join(OPTIMIZER))?
    } else {
        legacy_adamw(&sub, model, st.opt_step)?
    };
    ensure!(
        saved.optimizer == opt.name(),
        "{} holds {}'s state, this run's optimizer is {} (--optimizer)",
        sub.display(),
        saved.optimizer,
        opt.name()
    );
    // The optimizer's load checks everything before it writes; the weights load all or
    // nothing. Should the weights fail after the optimizer loaded, the optimizer's own state
    // goes back, so nothing changes.
    let before = opt.state()?;
    opt.load_state(&saved)
        .with_context(|| format!("loading the optimizer state of {}", sub.display()))?;
    if let Err(e) = model.store().load(&sub.join(MODEL_FILE)) {
        opt.load_state(&before)?;
        return Err(
            anyhow::Error::new(e).context(format!("loading the weights of {}", sub.display()))
        );
    }
    Ok(st)
}

/// An earlier build's AdamW checkpoint (`optim.safetensors`: `m.NAME` and `v.NAME` for each
/// parameter) as an [`OptimizerState`] of AdamW (`m.I`, `v.I`, `step`).
fn legacy_adamw(sub: &Path, model: &Gpt, step: u32) -> Result<OptimizerState> {
    let path = sub.join(LEGACY_ADAMW);
    let host = read_tensors(&path).map_err(ck)?;
    let device = model.device();
    let params = model.parameters();
    let mut tensors = Vec::with_capacity(2 * params.len());
    for prefix in ["m", "v"] {
        for (i, (name, p, _)) in params.iter().enumerate() {
            let key = format!("{prefix}.{name}");
            let Some((shape, vals)) = host.get(&key) else {
                bail!("{}: no tensor {key}", path.display());
            };
            ensure!(
                shape.as_slice() == p.shape(),
                "{}: {key} has shape {shape:?}, the parameter {:?}",
                path.display(),
                p.shape()
            );
            tensors.push((
                format!("{prefix}.{i}"),
                Tensor::from_vec(vals.clone(), shape, device)?,
            ));
        }
    }
    Ok(OptimizerState {
        optimizer: "adamw".into(),
        tensors,
        scalars: vec![("step".into(), f64::from(step))],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor_file::write_tensors;
    use models::gpt::{GptConfig, Variant};
    use tensor_ops::optim::{AdamW, AdamWParams, ProdigyParams, ScheduleFreeParams};
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

    /// An empty `train-ckpt-<tag>-<pid>` under the temporary directory (not created).
    fn scratch(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("train-ckpt-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
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
        let dir = scratch("unit");
        let (a, mut opt_a) = model(1);
        let x = Tensor::from_vec(vec![1u32, 2, 3, 4], &[1, 4], Device::Cpu).unwrap();
        let y = Tensor::from_vec(vec![2u32, 3, 4, 5], &[1, 4], Device::Cpu).unwrap();
        for _ in 0..3 {
            let grads = a.loss(&x, &y, None).unwrap().backward().unwrap();
            Optimizer::step(&mut opt_a, &grads, 0.01).unwrap();
        }
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
        let mut saved = OptimizerState::load(&sub.join(OPTIMIZER)).unwrap();
        saved.tensors.remove(3);
        saved.save(&sub.join(OPTIMIZER)).unwrap();
        let e = load(&dir, &c, &mut opt_c, &state).unwrap_err();
        assert!(format!("{e:#}").contains("optimizer state"), "{e:#}");
        assert_eq!(values(&c), before, "a failed load changed the weights");
        // Weights that fail after the optimizer's state loaded: the optimizer goes back.
        save(&dir, &a, &opt_a, &state).unwrap();
        let model_file = sub.join(MODEL_FILE);
        let bytes = std::fs::read(&model_file).unwrap();
        std::fs::write(&model_file, &bytes[..bytes.len() - 3]).unwrap();
        let e = load(&dir, &c, &mut opt_c, &state).unwrap_err();
        assert!(format!("{e:#}").contains("weights"), "{e:#}");
        assert_eq!(values(&c), before, "a failed load changed the weights");
        assert_eq!(opt_c.steps(), 0, "a failed load changed the optimizer");
        let fresh = Optimizer::state(&opt_c).unwrap();
        assert!(fresh
            .tensors
            .iter()
            .all(|(_, t)| t.to_vec().unwrap().iter().all(|&x| x == 0.0)));
        // A truncated state file.
        let bytes = std::fs::read(sub.join(OPTIMIZER)).unwrap();
        std::fs::write(sub.join(OPTIMIZER), &bytes[..bytes.len() / 2]).unwrap();
        assert!(load(&dir, &c, &mut opt_c, &state).is_err());
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
        let dir = scratch("nan");
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

    /// A checkpoint of an earlier build (AdamW's moments under `m.NAME`/`v.NAME` in
    /// `optim.safetensors`, no `optimizer.safetensors`) loads into AdamW, moments and step.
    #[test]
    fn an_earlier_builds_adamw_checkpoint_still_loads() {
        let dir = scratch("legacy");
        let (a, opt_a) = model(1);
        let state = state_of(&a, 4, 2, 1);
        let sub = save(&dir, &a, &opt_a, &state).unwrap();
        // Rewrite the optimizer's file the old way, with moments of known values.
        let mut legacy = Vec::new();
        for (prefix, fill) in [("m", 0.25f32), ("v", 0.5)] {
            for (name, p, _) in a.parameters() {
                let vals = vec![fill; p.numel()];
                legacy.push((
                    format!("{prefix}.{name}"),
                    Tensor::from_vec(vals, p.shape(), Device::Cpu).unwrap(),
                ));
            }
        }
        write_tensors(&sub.join(LEGACY_ADAMW), &legacy).unwrap();
        std::fs::remove_file(sub.join(OPTIMIZER)).unwrap();
        let (b, mut opt_b) = model(2);
        load(&dir, &b, &mut opt_b, &state).unwrap();
        assert_eq!(values(&a), values(&b));
        assert_eq!(opt_b.steps(), 2);
        let st = Optimizer::state(&opt_b).unwrap();
        for (name, t) in &st.tensors {
            let want = if name.starts_with("m.") { 0.25 } else { 0.5 };
            assert!(t.to_vec().unwrap().iter().all(|&x| x == want), "{name}");
        }
        // Into Prodigy: refused by name, nothing changed.
        let (c, mut prodigy) = other(3, "prodigy");
        let before = values(&c);
        let e = load(&dir, &c, prodigy.as_mut(), &state).unwrap_err();
        assert!(e.to_string().contains("adamw's state"), "{e}");
        assert_eq!(values(&c), before);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn other(seed: u64, kind: &str) -> (Gpt, Box<dyn Optimizer>) {
        let (m, _) = model(seed);
        let opt: Box<dyn Optimizer> = match kind {
            "prodigy" => Box::new(m.store().prodigy(ProdigyParams::default()).unwrap()),
            _ => Box::new(
                m.store()
                    .schedule_free_adamw(ScheduleFreeParams::default())
                    .unwrap(),
            ),
        };
        (m, opt)
    }

    /// Schedule-Free AdamW and Prodigy checkpoints round-trip their whole state (after a few
    /// steps, so that it is not the initial one), and a checkpoint of one is refused by the
    /// other with an error that leaves the weights and the state as they were.
    #[test]
    fn every_optimizer_round_trips_and_kinds_do_not_mix() {
        for kind in ["schedule_free_adamw", "prodigy"] {
            let dir = scratch(kind);
            let (a, mut opt_a) = other(1, kind);
            assert_eq!(opt_a.name(), kind);
            let x =
                Tensor::from_vec(vec![1u32, 2, 3, 4, 5, 6, 0, 1], &[2, 4], Device::Cpu).unwrap();
            let y =
                Tensor::from_vec(vec![2u32, 3, 4, 5, 6, 0, 1, 2], &[2, 4], Device::Cpu).unwrap();
            for _ in 0..3 {
                let grads = a.loss(&x, &y, None).unwrap().backward().unwrap();
                opt_a.step(&grads, 0.01).unwrap();
            }
            let state = state_of(&a, 3, opt_a.steps(), 1);
            save(&dir, &a, opt_a.as_ref(), &state).unwrap();
            let (b, mut opt_b) = other(2, kind);
            load(&dir, &b, opt_b.as_mut(), &state).unwrap();
            assert_eq!(values(&a), values(&b));
            let (sa, sb) = (opt_a.state().unwrap(), opt_b.state().unwrap());
            assert_eq!(sa.scalars, sb.scalars);
            for ((na, ta), (nb, tb)) in sa.tensors.iter().zip(&sb.tensors) {
                assert_eq!(na, nb);
                assert_eq!(ta.to_vec().unwrap(), tb.to_vec().unwrap(), "{kind} {na}");
            }
            // Into AdamW: refused, nothing changed.
            let (c, mut adamw): (Gpt, AdamW) = model(3);
            let before = values(&c);
            let e = load(&dir, &c, &mut adamw, &state).unwrap_err();
            assert!(
                e.to_string().contains("this run's optimizer is adamw"),
                "{e}"
            );
            assert_eq!(values(&c), before);
            assert_eq!(adamw.steps(), 0);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}
