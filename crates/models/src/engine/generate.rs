//! Generation on the fast engine: a prefill, then decode steps until every row has stopped.

use tensor_ops::no_grad;

use super::{choice, Engine};
use crate::error::ModelError;
use crate::sample::Sampling;

impl Engine {
    /// Greedy generation: [`Engine::generate`] choosing the argmax.
    pub fn generate_greedy(
        &mut self,
        prompts: &[Vec<u32>],
        max_new: usize,
        stop: &[u32],
        on_step: impl FnMut(&[u32]),
    ) -> Result<Vec<Vec<u32>>, ModelError> {
        self.generate(prompts, max_new, stop, &Sampling::default(), on_step)
    }

    /// Generation: prefill, then up to `max_new` tokens per row chosen as `sampling` says
    /// ([`Engine::decode`]; a row that produced one of `stop` stops growing, the batch stops
    /// when every row has). `on_step` sees each step's tokens as they come. Returns each row's
    /// new tokens.
    pub fn generate(
        &mut self,
        prompts: &[Vec<u32>],
        max_new: usize,
        stop: &[u32],
        sampling: &Sampling,
        mut on_step: impl FnMut(&[u32]),
    ) -> Result<Vec<Vec<u32>>, ModelError> {
        let choice = choice(sampling)?;
        let b = self.opts.batch;
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
        if longest + max_new > self.opts.capacity + 1 {
            return Err(ModelError::ContextFull {
                have: longest,
                more: max_new,
                context: self.opts.capacity,
            });
        }
        let mut out = vec![Vec::with_capacity(max_new); b];
        if max_new == 0 {
            return Ok(out);
        }
        let logits = self.prefill(prompts, false)?;
        // The draw after the prompt's last slot, t − 1 (the device slots still read 0).
        let offset = longest.saturating_sub(1) as u32;
        let first = |c| Ok(no_grad(|| self.choose(&logits, c, offset))?.to_vec_u32()?);
        let mut next = first(choice)?;
        if let Some(row) = self.refused_row(&next) {
            let e = self.refusal(row, 0, choice, || first(None));
            self.seen.write_from_host(&self.host_seen)?;
            return Err(e);
        }
        self.mark_seen(&next);
        let mut done = vec![false; b];
        for step in 0..max_new {
            on_step(&next);
            for (r, &tok) in next.iter().enumerate() {
                if !done[r] {
                    out[r].push(tok);
                    done[r] = stop.contains(&tok);
                }
            }
            if step + 1 == max_new || done.iter().all(|&d| d) {
                break;
            }
            next = self.decode(&next, sampling)?;
        }
        Ok(out)
    }
}
