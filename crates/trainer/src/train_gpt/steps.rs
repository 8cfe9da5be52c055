//! The driver's parts of an iteration: the step, its log line, a checkpoint, an evaluation
//! (rank 0's), and the end of the run (the curve, the summary, the saved model, a sample).

use super::hook::Hook;
use super::{Progress, TrainSummary, Trainer};
use crate::train_args::learning_rate;
use crate::train_ckpt;
use crate::train_curve::{DriverState, EmaRecord, EvalPoint, RunCurve, DRIVER_FILE};
use crate::train_step::{batch_context, evaluate, poison_first_weight};
use anyhow::{Context, Result};
use std::ops::ControlFlow;
use std::path::Path;
use std::time::Instant;
use tensor_ops::Tensor;

impl Trainer<'_> {
    /// Queues step `it` at the schedule's rate times the range test's scale and the hook's
    /// `multiplier`; returns its loss, not read.
    pub(super) fn step(&mut self, it: u32, p: &mut Progress, multiplier: f32) -> Result<Tensor> {
        let a = self.a;
        p.lr = learning_rate(a, it) * p.rate_scale * multiplier;
        // Each rank its own dropout masks (rank 0's are a single-device run's).
        let drop_seed = a.seed.wrapping_add(it as u64) ^ ((self.rank as u64) << 40);
        // Every rank draws the same global batch and keeps its rows.
        let (x, y) = (self.ds)
            .batch_ids(false, self.batch, self.block, &mut self.rng)
            .with_context(|| batch_context(a))?;
        let (x, y) = (&x[self.rows.clone()], &y[self.rows.clone()]);
        let loss = (self.stepper).step(&self.model, self.opt.get(), (x, y), drop_seed, p.lr)?;
        if let Some(ema) = &mut self.ema {
            ema.update(&self.params)?;
        }
        p.spent.backward += 1;
        p.spent.forward += 1;
        if a.inject_nan_at == Some(it) && !p.injected {
            poison_first_weight(&self.model)?;
            p.injected = true;
        }
        Ok(loss)
    }

    /// After step `it`: every `--log-interval` steps rank 0 reads the loss (a non-finite one
    /// stops the run when `stops` says so) and prints it with the speed.
    pub(super) fn log(
        &self,
        it: u32,
        loss: Tensor,
        p: &mut Progress,
        stops: bool,
    ) -> Result<ControlFlow<()>> {
        p.steps_since += 1;
        if !(self.main && it.is_multiple_of(self.a.log_interval)) {
            p.last_loss = Some(loss);
            return Ok(ControlFlow::Continue(()));
        }
        let l = loss.item()?; // synchronises: the steps so far are done
        if !l.is_finite() && stops {
            p.diverged = Some(format!("loss became {l} at iteration {it}"));
            return Ok(ControlFlow::Break(()));
        }
        let per = p.since.elapsed().as_secs_f64() / p.steps_since as f64;
        let tokens_per_iter = self.a.batch as f64 * self.a.block as f64;
        say!(
            self.main,
            "iter {it}: loss {l:.4}, lr {:.2e}, {:.1} ms/iter, {:.0} tok/s",
            p.lr,
            per * 1e3,
            tokens_per_iter / per
        );
        p.last_loss = None;
        Ok(ControlFlow::Continue(()))
    }

    /// Whether rank 0 writes a checkpoint before step `it` (not at the iteration it started
    /// from).
    pub(super) fn checkpoint_due(&self, it: u32, p: &Progress) -> bool {
        let a = self.a;
        a.checkpoint.is_some()
            && self.main
            && it > p.start
            && (it.is_multiple_of(a.checkpoint_interval) || it == a.iters)
    }

    /// Writes the checkpoint of iteration `it`: the model, the optimizer, the driver's state
    /// and the hook's.
    pub(super) fn checkpoint(&self, it: u32, p: &Progress, hook: &mut dyn Hook) -> Result<()> {
        let Some(dir) = &self.a.checkpoint else {
            return Ok(());
        };
        let st = self.state(it);
        let driver = DriverState {
            curve: p.curve.clone(),
            backward: p.spent.backward,
            forward: p.spent.forward,
            train_seconds: p.train_secs,
            rate_scale: p.rate_scale,
        };
        let mut extra = |tmp: &Path| -> Result<()> {
            std::fs::write(tmp.join(DRIVER_FILE), serde_json::to_string(&driver)?)?;
            if let Some(ema) = &self.ema {
                ema.save(tmp, &self.names)?;
            }
            hook.save(tmp)
        };
        let sub = train_ckpt::save_with(dir, &self.model, self.opt.get_ref(), &st, &mut extra)
            .with_context(|| format!("writing a checkpoint into {}", dir.display()))?;
        say!(self.main, "checkpoint {}", sub.display());
        Ok(())
    }

    /// Whether the run evaluates before step `it` (every `--eval-interval` and at the end,
    /// once an iteration: a rollback does not evaluate an iteration again).
    pub(super) fn eval_due(&self, it: u32, p: &Progress) -> bool {
        let a = self.a;
        (it.is_multiple_of(a.eval_interval) || it == a.iters) && p.evaluated.is_none_or(|e| it > e)
    }

    /// The evaluation before step `it`: the last loss read (a non-finite one stops the run
    /// unless the hook rolls back), the ranks' parameters compared, and rank 0's evaluation.
    pub(super) fn evaluate(
        &mut self,
        it: u32,
        p: &mut Progress,
        hook: &dyn Hook,
    ) -> Result<ControlFlow<()>> {
        if let Some(l) = p.last_loss.take() {
            let l = l.item()?; // synchronises: the steps so far are done
            if !l.is_finite() && hook.stops_on_non_finite() {
                p.diverged = Some(format!("loss became {l} before iteration {it}"));
                return Ok(ControlFlow::Break(()));
            }
        }
        p.train_secs += p.since.elapsed().as_secs_f64();
        if self.world > 1 {
            let refs: Vec<&Tensor> = self.params.iter().collect();
            let sum = (self.pg.check_identical(&refs))
                .with_context(|| format!("checking the ranks' parameters at iteration {it}"))?;
            say!(
                self.main,
                "parameters identical on all {} ranks (checksum {sum:016x})",
                self.world
            );
        }
        if self.main {
            self.eval_point(it, p, hook.extra_forwards())?;
        }
        p.evaluated = Some(it);
        (p.since, p.steps_since) = (Instant::now(), 0);
        Ok(ControlFlow::Continue(()))
    }

    /// Rank 0's evaluation at `it`, added to the curve and printed.
    fn eval_point(&mut self, it: u32, p: &mut Progress, extra_forwards: u64) -> Result<()> {
        let a = self.a;
        let t = Instant::now();
        let eval_seed = if a.eval_fixed {
            a.seed ^ 0xE7A1
        } else {
            a.seed ^ 0xE7A1 ^ it as u64
        };
        // Schedule-Free AdamW is evaluated at its average x.
        self.opt.get().eval_params()?;
        let evaluated = evaluate(&self.model, &self.ds, a, eval_seed);
        self.opt.get().train_params()?;
        let (tr, va) = evaluated?;
        // The moving average on the same batches (the weights go back bit for bit).
        let ema_val = match &self.ema {
            Some(ema) => {
                let (model, ds) = (&self.model, &self.ds);
                ema.swapped_in(&self.params, || evaluate(model, ds, a, eval_seed))?
                    .1
            }
            None => f32::NAN,
        };
        p.curve.eval_seconds += t.elapsed().as_secs_f64();
        (p.last_train, p.last_val) = (tr, va);
        if va < p.best {
            (p.best, p.best_iter) = (va, it);
        }
        p.curve.evals.push(EvalPoint {
            iter: it,
            backward: p.spent.backward,
            forward: p.spent.forward + extra_forwards,
            seconds: p.train_secs,
            train: tr,
            val: va,
            lr: p.lr,
            ema_val,
        });
        let train = if tr.is_nan() {
            String::new()
        } else {
            format!("train {tr:.4}, ")
        };
        let ema = if self.ema.is_some() {
            format!(", EMA val {ema_val:.4}")
        } else {
            String::new()
        };
        say!(
            self.main,
            "eval iter {it}: {train}val {va:.4}{ema} (after {:.1} s of training, {} backward passes)",
            p.train_secs,
            p.spent.backward
        );
        Ok(())
    }

    /// The end of the run: the hook's part of the curve, the curve written (`--curve`), a
    /// divergence returned as the error; then, on rank 0, the summary, the saved model
    /// (`--save`) and a sample. The other ranks return an empty curve.
    pub(super) fn finish(
        mut self,
        mut p: Progress,
        hook: &dyn Hook,
    ) -> Result<(TrainSummary, RunCurve)> {
        let a = self.a;
        p.curve.total_seconds = p.t_run.elapsed().as_secs_f64();
        hook.finish(&mut p.curve, self.main);
        p.curve.diverged = p.diverged.clone();
        p.curve.ema = self
            .ema
            .as_ref()
            .zip(a.ema_decay)
            .map(|(e, decay)| EmaRecord {
                decay,
                updates: e.updates(),
                seconds: e.seconds,
            });
        if let (Some(path), true) = (&a.curve, self.main) {
            let json = serde_json::to_string_pretty(&p.curve)?;
            tensor_ops::fsio::write(path, "curve", json.as_bytes())?;
        }
        if let Some(why) = p.diverged {
            anyhow::bail!("{why}");
        }
        // NCCL's communicator outlives nothing that holds its collectives: the captured step
        // goes first (destroying the communicator waits for the graphs that use it).
        drop(self.stepper.graphed.take());
        let summary = self.summary(&p);
        if !self.main {
            // The other ranks are done once their last step is: they leave, and rank 0 finishes.
            return Ok((summary, RunCurve::default()));
        }
        if let Some(path) = &a.save {
            self.model.save(path)?;
            println!("saved {}", path.display());
        }
        if a.sample > 0 {
            let ds = &self.ds;
            let prompt = ds.tokenizer.encode("\n").unwrap_or_else(|_| vec![0]);
            let out = self
                .model
                .generate(&prompt, a.sample, 0.8, Some(20), a.seed)?;
            println!(
                "--- sample ---\n{}\n--------------",
                ds.tokenizer.decode(&out)?
            );
        }
        println!("summary {}", serde_json::to_string(&summary)?);
        Ok((summary, p.curve))
    }

    /// What the run reached; the other ranks' summary has no losses.
    fn summary(&self, p: &Progress) -> TrainSummary {
        let a = self.a;
        let tokens_per_iter = a.batch as f64 * a.block as f64;
        let (losses, tokens_per_second) = if self.main {
            let per_second = tokens_per_iter * a.iters as f64 / p.train_secs.max(1e-9);
            ((p.last_train, p.last_val, p.best, p.best_iter), per_second)
        } else {
            ((f32::NAN, f32::NAN, f32::NAN, 0), 0.0)
        };
        TrainSummary {
            device: self.device.to_string(),
            ranks: self.world,
            params: self.model.num_params(),
            iters: a.iters,
            final_train_loss: losses.0,
            final_val_loss: losses.1,
            best_val_loss: losses.2,
            best_val_iter: losses.3,
            train_seconds: p.train_secs,
            tokens_per_second,
        }
    }
}
