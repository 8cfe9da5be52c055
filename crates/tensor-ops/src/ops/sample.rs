//! Token sampling on the tensor's device (`gpu_core::nn::sample`): the next token of each row of
//! logits, with the row's history kept as a bitmask on the device. Inference only.

use crate::backend::on_device;
use crate::ops::{buf, buf_mut};
use crate::tensor::{same_device, Tensor};
use gpu_core::nn::sample::{seen_words, SampleRows};
use gpu_core::nn::SampleOps;
pub use gpu_core::nn::SampleParams;
use gpu_core::{Backend, DType, GpuError, Result};

impl Tensor {
    /// The next token of each row of `self` `[.., vocab]` (f32 or bf16) as u32 of shape
    /// `self.shape()[..rank-1]`: repetition penalty from `seen` (u32 `[rows, ⌈vocab/32⌉]`, the
    /// chosen token is marked in it), temperature, top-k, top-p and a Philox draw at
    /// `counter[r] + params.offset` (u32 `[rows]`), as `SampleOps::sample_rows` defines them.
    /// A row with no distribution (a NaN or +∞ logit, or a non-finite largest one) gets
    /// `vocab`.
    pub fn sample_last(
        &self,
        seen: &Tensor,
        counter: &Tensor,
        params: SampleParams,
    ) -> Result<Tensor> {
        const OP: &str = "sample_last";
        let dev = same_device(OP, &[self, seen, counter])?;
        let Some((&vocab, lead)) = self.shape().split_last() else {
            return Err(GpuError::shape(OP, "logits of rank >= 1", "a scalar"));
        };
        let rows: usize = lead.iter().product();
        if seen.shape() != [rows, seen_words(vocab)] {
            return Err(GpuError::shape(
                OP,
                format!("seen of shape [{rows}, {}]", seen_words(vocab)),
                format!("{:?}", seen.shape()),
            ));
        }
        if seen.shares_storage(self) || seen.shares_storage(counter) {
            return Err(GpuError::invalid(
                OP,
                "seen must not share storage with the inputs",
            ));
        }
        let (x, c) = (self.read(), counter.read());
        let mut s = seen.write();
        let out = on_device!(dev, |be| {
            let mut out = be.allocate(DType::U32, rows)?;
            let rows = SampleRows::new(
                buf(be, &x)?,
                buf_mut(be, &mut s)?,
                buf(be, &c)?,
                &mut out,
                vocab,
            );
            be.sample_rows(rows, params)?;
            crate::ops::wrap(be, out)
        });
        Ok(Tensor::from_storage(out, lead.to_vec(), dev))
    }
}
