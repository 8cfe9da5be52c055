//! [`GruCell`]: one step of a GRU, exactly as PyTorch's `nn.GRUCell`.

use super::builder::ParamBuilder;
use super::init::Init;
use super::layers::check_param;
use crate::tensor::same_device;
use crate::{GpuError, Result, Tensor};

/// One GRU step, as PyTorch's `nn.GRUCell` (same parameters, names, layout and init):
///
/// ```text
/// r  = σ(W_ir x + b_ir + W_hr h + b_hr)
/// z  = σ(W_iz x + b_iz + W_hz h + b_hz)
/// n  = tanh(W_in x + b_in + r ∘ (W_hn h + b_hn))
/// h' = (1 − z) ∘ n + z ∘ h            (computed as n + z ∘ (h − n), as PyTorch does)
/// ```
///
/// `weight_ih` is `[3H, in]` and `weight_hh` `[3H, H]`, their rows the r, z, n blocks in that
/// order; `bias_ih` and `bias_hh` are `[3H]`. Every parameter starts U(−1/√H, 1/√H). The
/// backward is the autograd of the ops above.
#[derive(Debug, Clone)]
pub struct GruCell {
    weight_ih: Tensor,
    weight_hh: Tensor,
    bias_ih: Option<Tensor>,
    bias_hh: Option<Tensor>,
}

impl GruCell {
    /// Registers `weight_ih`, `weight_hh` and, when `bias`, `bias_ih`, `bias_hh` (PyTorch's
    /// order), all U(−1/√hidden, 1/√hidden).
    pub fn new(vb: ParamBuilder<'_>, input: usize, hidden: usize, bias: bool) -> Result<GruCell> {
        if input == 0 || hidden == 0 {
            return Err(GpuError::invalid(
                "GruCell",
                format!("input ({input}) and hidden ({hidden}) sizes must be positive"),
            ));
        }
        let init = Init::pytorch_uniform(hidden)?;
        let weight_ih = vb.get("weight_ih", &[3 * hidden, input], init)?;
        let weight_hh = vb.get("weight_hh", &[3 * hidden, hidden], init)?;
        let (bias_ih, bias_hh) = if bias {
            (
                Some(vb.get("bias_ih", &[3 * hidden], init)?),
                Some(vb.get("bias_hh", &[3 * hidden], init)?),
            )
        } else {
            (None, None)
        };
        GruCell::from_tensors(weight_ih, weight_hh, bias_ih, bias_hh)
    }

    /// A cell over existing f32 tensors (shapes as in [`GruCell`]), all on one device.
    pub fn from_tensors(
        weight_ih: Tensor,
        weight_hh: Tensor,
        bias_ih: Option<Tensor>,
        bias_hh: Option<Tensor>,
    ) -> Result<GruCell> {
        let op = "GruCell";
        let (h3, input) = match weight_ih.shape() {
            [h3, i] if *h3 > 0 && h3 % 3 == 0 && *i > 0 => (*h3, *i),
            s => return Err(GpuError::shape(op, "weight_ih [3H, in]", format!("{s:?}"))),
        };
        check_param(op, "weight_ih", &weight_ih, &[h3, input])?;
        check_param(op, "weight_hh", &weight_hh, &[h3, h3 / 3])?;
        let mut all = vec![&weight_ih, &weight_hh];
        for (what, b) in [("bias_ih", &bias_ih), ("bias_hh", &bias_hh)] {
            if let Some(b) = b {
                check_param(op, what, b, &[h3])?;
                all.push(b);
            }
        }
        same_device(op, &all)?;
        Ok(GruCell {
            weight_ih,
            weight_hh,
            bias_ih,
            bias_hh,
        })
    }

    /// Input width.
    pub fn input_size(&self) -> usize {
        self.weight_ih.shape()[1]
    }

    /// Hidden width H.
    pub fn hidden_size(&self) -> usize {
        self.weight_hh.shape()[1]
    }

    /// `[3H, in]`.
    pub fn weight_ih(&self) -> &Tensor {
        &self.weight_ih
    }

    /// `[3H, H]`.
    pub fn weight_hh(&self) -> &Tensor {
        &self.weight_hh
    }

    /// `[3H]`, when the cell has biases.
    pub fn bias_ih(&self) -> Option<&Tensor> {
        self.bias_ih.as_ref()
    }

    /// `[3H]`, when the cell has biases.
    pub fn bias_hh(&self) -> Option<&Tensor> {
        self.bias_hh.as_ref()
    }

    /// The zero state `[batch, H]` on the parameters' device (PyTorch's default `h`).
    pub fn zero_state(&self, batch: usize) -> Result<Tensor> {
        Tensor::zeros(&[batch, self.hidden_size()], self.weight_hh.device())
    }

    /// One step: `x` `[.., in]` and `h` `[.., H]` with the same leading dims (none for a
    /// single sample) give `h'` `[.., H]`.
    pub fn forward(&self, x: &Tensor, h: &Tensor) -> Result<Tensor> {
        let (inp, hid) = (self.input_size(), self.hidden_size());
        let lead_ok = x.rank() >= 1
            && x.rank() == h.rank()
            && x.shape()[..x.rank() - 1] == h.shape()[..h.rank() - 1];
        if !lead_ok || x.shape().last() != Some(&inp) || h.shape().last() != Some(&hid) {
            return Err(GpuError::shape(
                "GruCell::forward",
                format!("x [.., {inp}] and h [.., {hid}] with the same leading dims"),
                format!("x {:?}, h {:?}", x.shape(), h.shape()),
            ));
        }
        if x.rank() == 1 {
            let out = self.step(&x.reshape(&[1, inp])?, &h.reshape(&[1, hid])?)?;
            return out.reshape(&[hid]);
        }
        self.step(x, h)
    }

    fn step(&self, x: &Tensor, h: &Tensor) -> Result<Tensor> {
        let hid = self.hidden_size();
        let gi = x.linear(&self.weight_ih, self.bias_ih.as_ref())?; // [.., 3H]: r, z, n
        let gh = h.linear(&self.weight_hh, self.bias_hh.as_ref())?;
        let rz = gi
            .narrow(-1, 0, 2 * hid)?
            .add(&gh.narrow(-1, 0, 2 * hid)?)?
            .sigmoid()?;
        let (r, z) = (rz.narrow(-1, 0, hid)?, rz.narrow(-1, hid, hid)?);
        let n = gi
            .narrow(-1, 2 * hid, hid)?
            .add(&r.mul(&gh.narrow(-1, 2 * hid, hid)?)?)?
            .tanh()?;
        n.add(&z.mul(&h.sub(&n)?)?)
    }
}

impl<'a> ParamBuilder<'a> {
    /// [`GruCell::new`] with biases under this prefix (`prefix.weight_ih`, ...).
    pub fn gru_cell(&self, input: usize, hidden: usize) -> Result<GruCell> {
        GruCell::new(self.clone(), input, hidden, true)
    }
}
