//! The driver's set-up: the flags every rank would refuse alike, the data and the model, the
//! optimizer, the training step (a captured CUDA graph on a GPU) and a resume from a checkpoint
//! (the weights, the optimizer, the data stream and the driver's counters).

use super::ema::Ema;
use super::{Progress, Trainer};
use crate::control::cli::TrainMode;
use crate::train_args::TrainArgs;
use crate::train_ckpt::{self, TrainState};
use crate::train_curve::{DriverState, RunCurve, DRIVER_FILE};
use crate::train_step::{OptimizerKind, RunOptimizer, Stepper};
use anyhow::{ensure, Context, Result};
use gpu_core::Device;
use models::gpt::{Dataset, Gpt, GptConfig, GraphedStep};
use std::path::PathBuf;
use tensor_ops::dist::{GradSync, ProcessGroup};
use tensor_ops::optim::Optimizer;
use tensor_ops::{Precision, Tensor};

/// Checks the flags and reads the corpus: what every rank would refuse alike is refused before
/// the job is joined (a rank that fails after it leaves as a crash, and the others would report
/// it lost).
pub(super) fn prepare(a: &TrainArgs) -> Result<(Dataset, GptConfig)> {
    ensure!(
        a.dropout >= 0.0 && a.dropout < 1.0,
        "--dropout must be in [0, 1)"
    );
    ensure!(
        a.lr > 0.0 && a.min_lr >= 0.0 && a.decay_iters() >= a.warmup,
        "bad learning-rate schedule (--lr, --min-lr, or --lr-decay-iters below --warmup)"
    );
    ensure!(
        (0.0..=1.0).contains(&a.decay_fraction),
        "--decay-fraction {} must be in [0, 1]",
        a.decay_fraction
    );
    if a.ema_decay.is_some() {
        ensure!(
            a.mode != TrainMode::Hybrid,
            "--ema-decay is for --mode adamw and range-test: the hybrid's rollbacks would leave \
             steps in the average that the run undid"
        );
        ensure!(
            a.optimizer != OptimizerKind::ScheduleFree,
            "--ema-decay: Schedule-Free AdamW is evaluated at its own average of the weights"
        );
    }
    if let Some(curve) = &a.curve {
        // Refused now, not after the run: the curve is written when training ends.
        tensor_ops::fsio::check_destination(curve, "curve")?;
    }
    let text = tensor_ops::fsio::read_to_string(&a.data, "corpus", tensor_ops::fsio::TEXT_MAX)?;
    let mut ds = Dataset::from_text(&text, 0.9)?;
    // Before building the model: a context longer than the corpus would otherwise size the
    // position table (and every batch) from the flag alone.
    ds.check_block(a.block as usize).with_context(|| {
        format!(
            "--block {} is longer than the corpus {} allows",
            a.block,
            a.data.display()
        )
    })?;
    let holdout = a.control.probe_holdout;
    if a.mode == TrainMode::Hybrid && holdout > 0.0 {
        ensure!(holdout < 0.5, "--probe-holdout {holdout} must be below 0.5");
        ds.hold_out(holdout as f64, a.block as usize)
            .context("carving the held-out slice for the hybrid's probes (--probe-holdout)")?;
    }
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
    Ok((ds, cfg))
}

impl<'a> Trainer<'a> {
    /// Builds the model (every rank from rank 0's parameters), its optimizer and the training
    /// step for this rank's rows of each global batch.
    pub(super) fn new(
        device: Device,
        a: &'a TrainArgs,
        pg: &'a ProcessGroup,
        (ds, cfg): (Dataset, GptConfig),
    ) -> Result<Trainer<'a>> {
        let (main, world, rank) = (pg.is_main(), pg.world_size(), pg.rank());
        let precision = if a.tf32 { Precision::Tf32 } else { a.precision };
        let mut model = Gpt::new(cfg, a.seed, device)?;
        model.set_precision(precision)?;
        let (names, params): (Vec<String>, Vec<Tensor>) =
            model.parameters().into_iter().map(|p| (p.0, p.1)).unzip();
        pg.broadcast(&params.iter().collect::<Vec<_>>(), 0)?;
        let ema = a.ema_decay.map(|d| Ema::new(&params, d)).transpose()?;
        say!(
            main,
            "model: {:?}, {} parameters, on {device}, {precision}",
            cfg.variant,
            model.num_params()
        );
        say!(
            main,
            "data: {} train / {} val tokens, vocab {}{}",
            ds.train.len(),
            ds.val.len(),
            cfg.vocab_size,
            match ds.holdout.len() {
                0 => String::new(),
                n =>
                    format!(", {n} held out for the probes (pieces spread over the training split)"),
            }
        );
        let mut opt = RunOptimizer::new(a.optimizer, &model, a.weight_decay, a.grad_clip)?;
        let (batch, block) = (a.batch as usize, a.block as usize);
        let local = batch / world;
        let graphed = match device {
            Device::Cuda(_) if !a.eager => Some(capture(a, pg, &model, opt.get(), local)?),
            _ => None,
        };
        Ok(Trainer {
            a,
            device,
            pg,
            stepper: Stepper {
                graphed,
                pg,
                local,
                block,
            },
            rng: Dataset::rng(a.seed),
            ds,
            model,
            names,
            params,
            ema,
            opt,
            batch,
            block,
            rows: rank * local * block..(rank + 1) * local * block,
            main,
            world,
            rank,
        })
    }

    /// What a checkpoint at `iter` records of the run's shape.
    pub(super) fn state(&self, iter: u32) -> TrainState {
        let a = self.a;
        TrainState {
            iter,
            opt_step: self.opt.get_ref().steps(),
            seed: a.seed,
            batch: a.batch,
            block: a.block,
            params: self.model.num_params(),
            ranks: self.world,
        }
    }

    /// The run's progress from its first iteration, or from `--resume`'s checkpoint (its
    /// weights, optimizer state and driver counters loaded, its batches drawn again); with the
    /// checkpoint's folder.
    pub(super) fn resume(&mut self) -> Result<(Progress, Option<PathBuf>)> {
        let a = self.a;
        let mut start = 0;
        let mut resumed = None;
        if let Some(dir) = &a.resume {
            let expect = self.state(0);
            let st = train_ckpt::load(dir, &self.model, self.opt.get(), &expect)?;
            ensure!(
                st.iter <= a.iters,
                "{} is at iteration {}, past --iters {}",
                dir.display(),
                st.iter,
                a.iters
            );
            // The batches of the iterations done, drawn again: the data stream goes on.
            let (batch, block) = (self.batch, self.block);
            (self.ds).skip_batches(false, batch, block, st.iter as usize, &mut self.rng)?;
            start = st.iter;
            let sub = train_ckpt::newest(dir)?;
            self.ema = Ema::load(&sub, a.ema_decay, (&self.names, &self.params))?;
            resumed = Some(sub);
            say!(
                self.main,
                "resumed from {} at iteration {start} (written by {} rank(s), now {})",
                dir.display(),
                st.ranks,
                self.world
            );
        }
        let mut p = Progress::new(start, first_curve(a));
        if let Some(sub) = &resumed {
            let path = sub.join(DRIVER_FILE);
            if path.exists() {
                let d: DriverState = serde_json::from_str(&tensor_ops::fsio::read_to_string(
                    &path,
                    "driver state",
                    tensor_ops::fsio::JSON_MAX,
                )?)
                .with_context(|| format!("reading {}", path.display()))?;
                (p.curve, p.train_secs, p.rate_scale) = (d.curve, d.train_seconds, d.rate_scale);
                (p.spent.backward, p.spent.forward) = (d.backward, d.forward);
            } else {
                ensure!(
                    a.mode == TrainMode::Adamw,
                    "{} holds no {DRIVER_FILE}: only an AdamW run resumes from it",
                    sub.display()
                );
            }
        }
        Ok((p, resumed))
    }
}

/// The curve of a run that starts now.
fn first_curve(a: &TrainArgs) -> RunCurve {
    RunCurve {
        mode: a.mode.name().into(),
        optimizer: a.optimizer.name().into(),
        given_lr: a.lr,
        peak_lr: a.lr,
        seed: a.seed,
        iters: a.iters,
        ..RunCurve::default()
    }
}

/// The whole step (forward, backward, all-reduce, clipping, the optimizer) captured as one CUDA
/// graph, the gradients (and the loss) averaged over the ranks, overlapped with the backward
/// pass.
fn capture(
    a: &TrainArgs,
    pg: &ProcessGroup,
    model: &Gpt,
    opt: &mut dyn Optimizer,
    local: usize,
) -> Result<GraphedStep> {
    let main = pg.is_main();
    let mut sync = GradSync::new(pg);
    let g = GraphedStep::capture_synced(model, opt, local, a.block as usize, &mut sync)
        .context("capturing the training step as a CUDA graph (--eager runs without)")?;
    say!(
        main,
        "training step captured as a CUDA graph ({:.1} MiB kept for its replays)",
        g.memory_stats().bytes_cached as f64 / (1 << 20) as f64
    );
    if pg.world_size() > 1 {
        let st = sync.stats();
        let mib = |b: usize| b as f64 / (1 << 20) as f64;
        say!(
            main,
            "averaged a step: {} tensors (the gradients and the loss), {:.1} MiB in {} bucket(s); {} gradient(s) copied first ({:.1} MiB)",
            st.tensors,
            mib(st.bytes),
            st.buckets,
            st.copied,
            mib(st.copied_bytes)
        );
    }
    Ok(g)
}
