//! `hybrid-trainer train-gpt`: trains the GPT of `models` on a text file, nanoGPT style
//! (AdamW, linear warm-up then cosine decay, global-norm clipping, periodic evaluation), on one
//! device or data-parallel over several GPUs, one process each (`hybrid-trainer launch`, or any
//! launcher that sets the `torch.distributed` environment: docs/multi-gpu.md).

use crate::control::cli::TrainMode;
use crate::control::hybrid::{At, ProbeShape, StepSizeHybrid};
use crate::control::world::ScalePredictor;
pub use crate::train_args::{learning_rate, parse_precision, parse_variant, Schedule, TrainArgs};
use crate::train_ckpt::{self, TrainState};
use crate::train_curve::{DriverState, EvalPoint, RunCurve, Spent, DRIVER_FILE};
use crate::train_step::{
    batch_context, evaluate, poison_first_weight, RangeTest, RunOptimizer, Stepper,
};
use anyhow::{ensure, Context, Result};
use gpu_core::Device;
use models::gpt::{Dataset, Gpt, GptConfig, GraphedStep};
use std::time::{Duration, Instant};
use tensor_ops::dist::{DistEnv, GradSync, ProcessGroup};
use tensor_ops::optim::Optimizer;
use tensor_ops::{Precision, Tensor};

/// What a run reached.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TrainSummary {
    pub device: String,
    /// Data-parallel ranks (1: a single device).
    pub ranks: usize,
    pub params: usize,
    pub iters: u32,
    pub final_train_loss: f32,
    pub final_val_loss: f32,
    pub best_val_loss: f32,
    pub best_val_iter: u32,
    pub train_seconds: f64,
    pub tokens_per_second: f64,
}

/// This process's place in the data-parallel job the environment describes (a group of one
/// when it describes none); the global `batch` must split evenly over the ranks. Rank 0 of
/// several says how the batch is split.
pub(crate) fn join_data_parallel(
    device: Device,
    timeout: Duration,
    batch: u32,
) -> Result<ProcessGroup> {
    // Checked before joining: every rank refuses it alike, none waits for another.
    let world = DistEnv::from_env()?.map_or(1, |e| e.world_size);
    ensure!(
        (batch as usize).is_multiple_of(world),
        "--batch {batch} (the global batch) must be a multiple of the {world} ranks"
    );
    let pg = ProcessGroup::from_env(device, timeout).context("joining the data-parallel job")?;
    if world > 1 && pg.is_main() {
        println!(
            "data parallel: {world} ranks, {} sequences each of the global batch {batch}",
            batch as usize / world
        );
    }
    Ok(pg)
}

/// The hybrid's folder in a checkpoint.
const HYBRID_DIR: &str = "hybrid";

/// Trains and reports; prints progress lines and a final JSON summary line.
pub fn run(device: Device, a: &TrainArgs) -> Result<TrainSummary> {
    run_with_curve(device, a).map(|r| r.0)
}

/// [`run`], also returning the run's curve (what `--curve` writes); the other ranks of a
/// data-parallel job return an empty one.
pub fn run_with_curve(device: Device, a: &TrainArgs) -> Result<(TrainSummary, RunCurve)> {
    run_inner(device, a, None)
}

/// [`run_with_curve`] with `--mode hybrid` and a given predictor in place of the world model
/// (tests give it one that lies).
pub fn run_with_predictor(
    device: Device,
    a: &TrainArgs,
    predictor: Box<dyn ScalePredictor>,
) -> Result<(TrainSummary, RunCurve)> {
    ensure!(
        a.mode == TrainMode::Hybrid,
        "a predictor is for --mode hybrid"
    );
    run_inner(device, a, Some(predictor))
}

fn run_inner(
    device: Device,
    a: &TrainArgs,
    predictor: Option<Box<dyn ScalePredictor>>,
) -> Result<(TrainSummary, RunCurve)> {
    ensure!(
        a.dropout >= 0.0 && a.dropout < 1.0,
        "--dropout must be in [0, 1)"
    );
    ensure!(
        a.lr > 0.0 && a.min_lr >= 0.0 && a.decay_iters() >= a.warmup,
        "bad learning-rate schedule (--lr, --min-lr, or --lr-decay-iters below --warmup)"
    );
    // The settings every rank would refuse alike are checked before the job is joined: a rank
    // that fails after it leaves as a crash, and the others would report it lost.
    let text = tensor_ops::fsio::read_to_string(&a.data, "corpus", tensor_ops::fsio::TEXT_MAX)?;
    let ds = Dataset::from_text(&text, 0.9)?;
    // Before building the model: a context longer than the corpus would otherwise size the
    // position table (and every batch) from the flag alone.
    ds.check_block(a.block as usize).with_context(|| {
        format!(
            "--block {} is longer than the corpus {} allows",
            a.block,
            a.data.display()
        )
    })?;
    let cfg = GptConfig {
        variant: a.variant,
        vocab_size: ds.tokenizer.vocab_size(),
        block_size: a.block as usize,
        n_layer: a.layers as usize,
        n_head: a.heads as usize,
        n_embd: a.embd as usize,
        dropout: a.dropout,
        bias: false,
    };
    cfg.validate()?;
    let pg = join_data_parallel(device, Duration::from_secs(a.dist_timeout_secs), a.batch)?;
    let (main, world, rank) = (pg.is_main(), pg.world_size(), pg.rank());
    // Only rank 0 prints (and evaluates, samples and saves).
    macro_rules! say {
        ($($t:tt)*) => { if main { println!($($t)*); } };
    }
    let precision = if a.tf32 { Precision::Tf32 } else { a.precision };
    let mut model = Gpt::new(cfg, a.seed, device)?;
    model.set_precision(precision)?;
    let params: Vec<Tensor> = model.parameters().into_iter().map(|p| p.1).collect();
    let param_refs: Vec<&Tensor> = params.iter().collect();
    // Every rank starts from rank 0's parameters.
    pg.broadcast(&param_refs, 0)?;
    say!(
        "model: {:?}, {} parameters, on {device}, {precision}",
        cfg.variant,
        model.num_params()
    );
    say!(
        "data: {} train / {} val tokens, vocab {}",
        ds.train.len(),
        ds.val.len(),
        cfg.vocab_size
    );
    let mut opt = RunOptimizer::new(a.optimizer, &model, a.weight_decay, a.grad_clip)?;
    let (batch, block) = (a.batch as usize, a.block as usize);
    // This rank's rows of each global batch.
    let local = batch / world;
    let rows = rank * local * block..(rank + 1) * local * block;
    // On CUDA the whole step (forward, backward, all-reduce, clipping, AdamW) is one captured
    // graph.
    let graphed = match device {
        Device::Cuda(_) if !a.eager => {
            // Gradients (and the loss) averaged over the ranks, overlapped with the backward pass.
            let mut sync = GradSync::new(&pg);
            let g = GraphedStep::capture_synced(&model, opt.get(), local, block, &mut sync)
                .context("capturing the training step as a CUDA graph (--eager runs without)")?;
            say!(
                "training step captured as a CUDA graph ({:.1} MiB kept for its replays)",
                g.memory_stats().bytes_cached as f64 / (1 << 20) as f64
            );
            if world > 1 {
                let st = sync.stats();
                let mib = |b: usize| b as f64 / (1 << 20) as f64;
                say!(
                    "averaged a step: {} tensors (the gradients and the loss), {:.1} MiB in {} bucket(s); {} gradient(s) copied first ({:.1} MiB)",
                    st.tensors,
                    mib(st.bytes),
                    st.buckets,
                    st.copied,
                    mib(st.copied_bytes)
                );
            }
            Some(g)
        }
        _ => None,
    };
    let stepper = Stepper {
        graphed,
        pg: &pg,
        local,
        block,
    };
    let mut rng = Dataset::rng(a.seed);
    let ck_state = |iter: u32, opt: &dyn Optimizer| TrainState {
        iter,
        opt_step: opt.steps(),
        seed: a.seed,
        batch: a.batch,
        block: a.block,
        params: model.num_params(),
        ranks: world,
    };
    let mut start = 0;
    let mut resumed: Option<std::path::PathBuf> = None;
    if let Some(dir) = &a.resume {
        let expect = ck_state(0, opt.get_ref());
        let st = train_ckpt::load(dir, &model, opt.get(), &expect)?;
        ensure!(
            st.iter <= a.iters,
            "{} is at iteration {}, past --iters {}",
            dir.display(),
            st.iter,
            a.iters
        );
        // The batches of the iterations done, drawn again: the data stream goes on.
        ds.skip_batches(false, batch, block, st.iter as usize, &mut rng)?;
        start = st.iter;
        resumed = Some(train_ckpt::newest(dir)?);
        say!(
            "resumed from {} at iteration {start} (written by {} rank(s), now {world})",
            dir.display(),
            st.ranks
        );
    }
    let mut curve = RunCurve {
        mode: a.mode.name().into(),
        optimizer: a.optimizer.name().into(),
        given_lr: a.lr,
        peak_lr: a.lr,
        seed: a.seed,
        iters: a.iters,
        ..RunCurve::default()
    };
    let t_run = Instant::now();
    let mut spent = Spent::default();
    // The factor on the schedule's rate: the range test's pick over the given rate.
    let mut rate_scale = 1.0f32;
    let mut train_secs = 0.0;
    if let Some(sub) = &resumed {
        let path = sub.join(DRIVER_FILE);
        if path.exists() {
            let d: DriverState = serde_json::from_str(&tensor_ops::fsio::read_to_string(
                &path,
                "driver state",
                tensor_ops::fsio::JSON_MAX,
            )?)
            .with_context(|| format!("reading {}", path.display()))?;
            (curve, train_secs, rate_scale) = (d.curve, d.train_seconds, d.rate_scale);
            (spent.backward, spent.forward) = (d.backward, d.forward);
        } else {
            ensure!(
                a.mode == TrainMode::Adamw,
                "{} holds no {DRIVER_FILE}: only an AdamW run resumes from it",
                sub.display()
            );
        }
    }
    if a.mode == TrainMode::RangeTest && resumed.is_none() {
        let t = Instant::now();
        let pick = RangeTest::default().run(
            &stepper,
            (&model, opt.get()),
            (&ds, &mut rng, local),
            a.seed,
        )?;
        train_secs += t.elapsed().as_secs_f64();
        spent.backward += pick.steps as u64;
        spent.forward += pick.steps as u64;
        curve.range_test_steps = pick.steps;
        curve.peak_lr = pick.lr;
        rate_scale = pick.lr / a.lr;
        say!(
            "range test: {} steps, picked peak lr {:.3e}",
            pick.steps,
            pick.lr
        );
    }
    let mut hybrid = match a.mode {
        TrainMode::Hybrid => {
            ensure!(
                world == 1,
                "--mode hybrid runs on one device (data parallelism is for --mode adamw)"
            );
            let t = Instant::now();
            let shape = ProbeShape {
                batch,
                block,
                seed: a.seed,
                graphed: !a.eager,
            };
            let at = (&model, opt.get_ref(), &rng, start);
            let mut h = match predictor {
                None => StepSizeHybrid::new(a.control.config(), &ds, shape, at)?,
                Some(p) => {
                    StepSizeHybrid::with_predictor(a.control.config(), &ds, shape, at, Some(p))?
                }
            };
            if let Some(sub) = &resumed {
                let dir = sub.join(HYBRID_DIR);
                h = StepSizeHybrid::load(&dir, h, (&ds, &model, batch, block, a.seed))
                    .with_context(|| format!("resuming the hybrid from {}", dir.display()))?;
            }
            train_secs += t.elapsed().as_secs_f64();
            Some(h)
        }
        _ => None,
    };
    let tokens_per_iter = a.batch as f64 * a.block as f64;
    let (mut best, mut best_iter, mut last_val, mut last_train) =
        (f32::INFINITY, 0, f32::NAN, f32::NAN);
    // Training time runs from `since` (after an evaluation) to each evaluation.
    let (mut since, mut steps_since) = (Instant::now(), 0u32);
    let mut last_loss: Option<Tensor> = None;
    let mut evaluated: Option<u32> = None;
    let mut lr = 0.0f32;
    let mut diverged: Option<String> = None;
    let mut injected = false;
    let mut it = start;
    while it <= a.iters {
        if let Some(h) = hybrid.as_mut() {
            let at = At {
                step: it,
                iters: a.iters,
                warmup: a.warmup,
                schedule: learning_rate(a, it) / a.lr,
            };
            if it < a.iters && h.is_decision(&at) {
                last_loss = None;
                if let Some(back) = h.decide(&at, &model, opt.get(), &mut rng)? {
                    say!(
                        "iter {it}: rolled back to iteration {back}, lr multiplier now {:.3}",
                        h.ctl.multiplier()
                    );
                    it = back;
                    continue;
                }
            }
        }
        if let Some(dir) = a.checkpoint.as_ref().filter(|_| main && it > start) {
            if it % a.checkpoint_interval == 0 || it == a.iters {
                let st = ck_state(it, opt.get_ref());
                let driver = DriverState {
                    curve: curve.clone(),
                    backward: spent.backward,
                    forward: spent.forward,
                    train_seconds: train_secs,
                    rate_scale,
                };
                let mut extra = |tmp: &std::path::Path| -> Result<()> {
                    std::fs::write(tmp.join(DRIVER_FILE), serde_json::to_string(&driver)?)?;
                    if let Some(h) = hybrid.as_mut() {
                        h.save(&tmp.join(HYBRID_DIR))?;
                    }
                    Ok(())
                };
                let sub = train_ckpt::save_with(dir, &model, opt.get_ref(), &st, &mut extra)
                    .with_context(|| format!("writing a checkpoint into {}", dir.display()))?;
                say!("checkpoint {}", sub.display());
            }
        }
        if (it % a.eval_interval == 0 || it == a.iters) && evaluated.is_none_or(|e| it > e) {
            if let Some(l) = last_loss.take() {
                let l = l.item()?; // synchronises: the steps so far are done
                if !l.is_finite() && hybrid.is_none() {
                    diverged = Some(format!("loss became {l} before iteration {it}"));
                    break;
                }
            }
            train_secs += since.elapsed().as_secs_f64();
            if world > 1 {
                let sum = pg
                    .check_identical(&param_refs)
                    .with_context(|| format!("checking the ranks' parameters at iteration {it}"))?;
                say!("parameters identical on all {world} ranks (checksum {sum:016x})");
            }
            if main {
                let t = Instant::now();
                let eval_seed = if a.eval_fixed {
                    a.seed ^ 0xE7A1
                } else {
                    a.seed ^ 0xE7A1 ^ it as u64
                };
                // Schedule-Free AdamW is evaluated at its average x.
                opt.get().eval_params()?;
                let evaluated = evaluate(&model, &ds, a, eval_seed);
                opt.get().train_params()?;
                let (tr, va) = evaluated?;
                curve.eval_seconds += t.elapsed().as_secs_f64();
                (last_train, last_val) = (tr, va);
                if va < best {
                    (best, best_iter) = (va, it);
                }
                curve.evals.push(EvalPoint {
                    iter: it,
                    backward: spent.backward,
                    forward: spent.forward + hybrid.as_ref().map_or(0, |h| h.costs.probe_forwards),
                    seconds: train_secs,
                    train: tr,
                    val: va,
                    lr,
                });
                let train = if tr.is_nan() {
                    String::new()
                } else {
                    format!("train {tr:.4}, ")
                };
                say!(
                    "eval iter {it}: {train}val {va:.4} (after {train_secs:.1} s of training, {} backward passes)",
                    spent.backward
                );
            }
            evaluated = Some(it);
            (since, steps_since) = (Instant::now(), 0);
        }
        if it == a.iters {
            break;
        }
        let multiplier = hybrid.as_ref().map_or(1.0, |h| h.ctl.multiplier());
        lr = learning_rate(a, it) * rate_scale * multiplier;
        // Each rank its own dropout masks (rank 0's are a single-device run's).
        let drop_seed = a.seed.wrapping_add(it as u64) ^ ((rank as u64) << 40);
        // Every rank draws the same global batch and keeps its rows.
        let (x, y) = ds
            .batch_ids(false, batch, block, &mut rng)
            .with_context(|| batch_context(a))?;
        let (x, y) = (&x[rows.clone()], &y[rows.clone()]);
        let loss = stepper.step(&model, opt.get(), (x, y), drop_seed, lr)?;
        spent.backward += 1;
        spent.forward += 1;
        if a.inject_nan_at == Some(it) && !injected {
            poison_first_weight(&model)?;
            injected = true;
        }
        if let Some(h) = hybrid.as_mut() {
            let at = At {
                step: it,
                iters: a.iters,
                warmup: a.warmup,
                schedule: 0.0,
            };
            h.after_step(&at, &model)?;
        }
        pg.fence()?;
        steps_since += 1;
        if main && it % a.log_interval == 0 {
            let l = loss.item()?; // synchronises: the steps so far are done
            if !l.is_finite() && hybrid.is_none() {
                diverged = Some(format!("loss became {l} at iteration {it}"));
                break;
            }
            let per = since.elapsed().as_secs_f64() / steps_since as f64;
            say!(
                "iter {it}: loss {l:.4}, lr {lr:.2e}, {:.1} ms/iter, {:.0} tok/s",
                per * 1e3,
                tokens_per_iter / per
            );
            last_loss = None;
        } else {
            last_loss = Some(loss);
        }
        it += 1;
    }
    curve.total_seconds = t_run.elapsed().as_secs_f64();
    if let Some(h) = &hybrid {
        curve.decisions = h.ctl.history.clone();
        curve.costs = Some(h.costs.clone());
        curve.rollbacks = h.ctl.rollbacks;
        say!("{}", h.summary());
    }
    curve.diverged = diverged.clone();
    if let (Some(path), true) = (&a.curve, main) {
        std::fs::write(path, serde_json::to_string_pretty(&curve)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(why) = diverged {
        anyhow::bail!("{why}");
    }
    let graphed = stepper.graphed;
    // NCCL's communicator outlives nothing that holds its collectives: the captured step goes
    // first (destroying the communicator waits for the graphs that use it).
    drop(graphed);
    if !main {
        // The other ranks are done once their last step is: leave, and let rank 0 finish.
        pg.finish()?;
        return Ok((
            TrainSummary {
                device: device.to_string(),
                ranks: world,
                params: model.num_params(),
                iters: a.iters,
                final_train_loss: f32::NAN,
                final_val_loss: f32::NAN,
                best_val_loss: f32::NAN,
                best_val_iter: 0,
                train_seconds: train_secs,
                tokens_per_second: 0.0,
            },
            RunCurve::default(),
        ));
    }
    let summary = TrainSummary {
        device: device.to_string(),
        ranks: world,
        params: model.num_params(),
        iters: a.iters,
        final_train_loss: last_train,
        final_val_loss: last_val,
        best_val_loss: best,
        best_val_iter: best_iter,
        train_seconds: train_secs,
        tokens_per_second: tokens_per_iter * a.iters as f64 / train_secs.max(1e-9),
    };
    if let Some(path) = &a.save {
        model.save(path)?;
        println!("saved {}", path.display());
    }
    if a.sample > 0 {
        let prompt = ds.tokenizer.encode("\n").unwrap_or_else(|_| vec![0]);
        let out = model.generate(&prompt, a.sample, 0.8, Some(20), a.seed)?;
        println!(
            "--- sample ---\n{}\n--------------",
            ds.tokenizer.decode(&out)?
        );
    }
    println!("summary {}", serde_json::to_string(&summary)?);
    pg.finish()?;
    Ok((summary, curve))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: TrainArgs,
    }

    /// Without `--lr-decay-iters` the cosine ends at the run's last iteration; with it, where
    /// it says; and never before the warm-up ends.
    #[test]
    fn the_decay_length_defaults_to_the_run() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["t", "--data", "c.txt", "--iters", "1500"];
            argv.extend_from_slice(extra);
            Cli::try_parse_from(argv).unwrap().args
        };
        let a = parse(&[]);
        assert_eq!(a.decay_iters(), 1500);
        assert_eq!(learning_rate(&a, 1500), a.min_lr);
        assert!(learning_rate(&a, 1499) > a.min_lr);
        let a = parse(&["--lr-decay-iters", "5000"]);
        assert_eq!(a.decay_iters(), 5000);
        assert!(learning_rate(&a, 1500) > 0.8 * a.lr);
        let a = parse(&["--warmup", "2000"]);
        assert_eq!(a.decay_iters(), 2000);
    }

    /// `--warmup 4294967295` overflowed `warmup + 1` (a panic in a debug build).
    #[test]
    fn learning_rate_with_the_largest_warmup_does_not_overflow() {
        let max = u32::MAX.to_string();
        let cli = Cli::try_parse_from([
            "t",
            "--data",
            "corpus.txt",
            "--warmup",
            &max,
            "--lr-decay-iters",
            &max,
        ])
        .unwrap();
        for it in [0, u32::MAX - 1, u32::MAX] {
            let lr = learning_rate(&cli.args, it);
            assert!(
                lr.is_finite() && lr > 0.0 && lr <= cli.args.lr,
                "{it}: {lr}"
            );
        }
    }
}
