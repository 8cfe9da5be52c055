//! The hybrid trainer as one rank of a data-parallel job (`tensor_ops::dist`): full steps
//! average their gradients across the ranks (`HybridTrainer::adamw_step`), and every step
//! checks that all ranks took the same phase with the same outcome.

use super::run::{HybridTrainer, StepReport};
use super::{HybridError, Phase};
use std::sync::Arc;
use tensor_ops::dist::{DistError, ProcessGroup, ReduceOp};
use tensor_ops::Tensor;

fn dist(e: DistError) -> HybridError {
    HybridError::Distributed(e.to_string())
}

impl HybridTrainer {
    /// Makes this trainer one rank of a data-parallel job: full steps average their gradients
    /// (and loss) across the ranks before AdamW ([`GradSync`]), and every step checks that all
    /// ranks took the same phase (they must: every input of the decision is averaged or
    /// identical on all ranks). The objective gives each rank its own share of the batch.
    pub fn set_process_group(&mut self, pg: Arc<ProcessGroup>) {
        self.pg = Some(pg).filter(|pg| pg.world_size() > 1);
    }

    /// Fails unless every rank ran step `step` in the same phase with the same outcome.
    pub(crate) fn check_agreement(&self, r: &StepReport) -> Result<(), HybridError> {
        let Some(pg) = &self.pg else { return Ok(()) };
        let code = match r.phase {
            Phase::Warmup => 0u32,
            Phase::Full => 1,
            Phase::Predict => 2,
            Phase::Correct => 3,
        };
        let mine = [r.step as u32, code, u32::from(r.rollback.is_some())];
        let lo = Tensor::from_vec(mine.to_vec(), &[3], self.device)?;
        let hi = Tensor::from_vec(mine.to_vec(), &[3], self.device)?;
        pg.all_reduce(&[&lo], ReduceOp::Min).map_err(dist)?;
        pg.all_reduce(&[&hi], ReduceOp::Max).map_err(dist)?;
        let (lo, hi) = (lo.to_vec_u32()?, hi.to_vec_u32()?);
        if lo != hi {
            return Err(HybridError::Distributed(format!(
                "the ranks disagree at step {}: (step, phase, rolled back) ranges {lo:?}..{hi:?}, \
                 rank {} had {mine:?}",
                r.step,
                pg.rank()
            )));
        }
        Ok(())
    }
}
