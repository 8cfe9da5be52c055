//! The world model's forward pass on the host in f64 with `nalgebra`: an independent
//! implementation of [`Rssm::encode`](crate::Rssm::encode) (evaluation mode) and
//! [`Rssm::predict`](crate::Rssm::predict), and the CPU path of the accelerator's `encode_state`
//! and `predict_batch`. Rows of a matrix are batch entries.

use crate::config::RssmConfig;
use crate::error::{Result, RssmError};
use crate::layers::{Encoder, Head, Member};
use crate::model::Rssm;
use nalgebra::{DMatrix, DVector};
use ndarray::{Array2, Array3, Array4, ArrayView2, ArrayView3};
use tensor_ops::nn::{GruCell, LayerNorm, Linear};
use tensor_ops::Tensor;

/// A host copy of a tensor as an `rows × cols` f64 matrix (row-major source).
fn matrix(t: &Tensor, rows: usize, cols: usize) -> Result<DMatrix<f64>> {
    let v = t.to_vec()?;
    Ok(DMatrix::from_row_iterator(
        rows,
        cols,
        v.into_iter().map(f64::from),
    ))
}

fn vector(t: &Tensor) -> Result<DVector<f64>> {
    Ok(DVector::from_iterator(
        t.numel(),
        t.to_vec()?.into_iter().map(f64::from),
    ))
}

fn missing(what: &str) -> RssmError {
    RssmError::InvalidArgument {
        what: "reference model",
        reason: format!("{what} has no bias"),
    }
}

/// `y = x·Wᵀ + b`, with `Wᵀ` kept (`in × out`).
#[derive(Debug, Clone)]
struct HostLinear {
    wt: DMatrix<f64>,
    b: DVector<f64>,
}

impl HostLinear {
    fn new(l: &Linear) -> Result<HostLinear> {
        let (o, i) = (l.out_dim(), l.in_dim());
        Ok(HostLinear {
            wt: matrix(l.weight(), o, i)?.transpose(),
            b: vector(l.bias().ok_or_else(|| missing("a linear layer"))?)?,
        })
    }

    fn apply(&self, x: &DMatrix<f64>) -> DMatrix<f64> {
        let mut y = x * &self.wt;
        for (j, mut col) in y.column_iter_mut().enumerate() {
            col.add_scalar_mut(self.b[j]);
        }
        y
    }
}

/// LayerNorm over each row (biased variance, `eps` inside the square root).
#[derive(Debug, Clone)]
struct HostNorm {
    w: DVector<f64>,
    b: DVector<f64>,
    eps: f64,
}

impl HostNorm {
    fn new(n: &LayerNorm, eps: f32) -> Result<HostNorm> {
        Ok(HostNorm {
            w: vector(n.weight())?,
            b: vector(n.bias().ok_or_else(|| missing("a layer norm"))?)?,
            eps: f64::from(eps),
        })
    }

    fn apply(&self, x: &DMatrix<f64>) -> DMatrix<f64> {
        let mut y = x.clone();
        let cols = x.ncols() as f64;
        for mut row in y.row_iter_mut() {
            let mean = row.sum() / cols;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / cols;
            let rstd = 1.0 / (var + self.eps).sqrt();
            for (j, v) in row.iter_mut().enumerate() {
                *v = (*v - mean) * rstd * self.w[j] + self.b[j];
            }
        }
        y
    }
}

/// Errors unless the rows (the last of `shape`) are `width` wide, there is a row and every value
/// is `finite`, in that order: the input checks of this engine and the fast one.
pub(crate) fn check_input(
    what: &'static str,
    shape: &[usize],
    width: usize,
    finite: bool,
) -> Result<()> {
    let got = shape.last().copied().unwrap_or(0);
    if got != width {
        return Err(RssmError::FeatureWidth {
            what,
            expected: width,
            got,
        });
    }
    if shape.contains(&0) {
        return Err(RssmError::Empty { what });
    }
    if !finite {
        return Err(RssmError::NonFinite { what });
    }
    Ok(())
}

/// [`check_input`] for a rollout's `context`, then an error for `steps == 0`.
pub(crate) fn check_rollout(
    shape: &[usize],
    width: usize,
    finite: bool,
    steps: usize,
) -> Result<()> {
    check_input("context", shape, width, finite)?;
    if steps == 0 {
        return Err(RssmError::Empty {
            what: "the rollout (steps = 0)",
        });
    }
    Ok(())
}

fn relu(x: DMatrix<f64>) -> DMatrix<f64> {
    x.map(|v| v.max(0.0))
}

fn sigmoid(v: f64) -> f64 {
    1.0 / (1.0 + (-v).exp())
}

/// `[a | b]` column-wise.
fn hcat(a: &DMatrix<f64>, b: &DMatrix<f64>) -> DMatrix<f64> {
    let (ca, cb) = (a.ncols(), b.ncols());
    DMatrix::from_fn(a.nrows(), ca + cb, |i, j| {
        if j < ca {
            a[(i, j)]
        } else {
            b[(i, j - ca)]
        }
    })
}

#[derive(Debug, Clone)]
struct HostHead {
    fc: HostLinear,
    norm: HostNorm,
    out: HostLinear,
}

impl HostHead {
    fn new(h: &Head, eps: f32) -> Result<HostHead> {
        Ok(HostHead {
            fc: HostLinear::new(&h.fc)?,
            norm: HostNorm::new(&h.norm, eps)?,
            out: HostLinear::new(&h.out)?,
        })
    }

    fn apply(&self, x: &DMatrix<f64>) -> DMatrix<f64> {
        self.out.apply(&relu(self.norm.apply(&self.fc.apply(x))))
    }
}

/// PyTorch's GRU cell (r, z, n blocks; `h' = n + z∘(h − n)`).
#[derive(Debug, Clone)]
struct HostGru {
    ih: HostLinear,
    hh: HostLinear,
    hidden: usize,
}

impl HostGru {
    fn new(g: &GruCell) -> Result<HostGru> {
        let (h, i) = (g.hidden_size(), g.input_size());
        let bias = |b: Option<&Tensor>| b.ok_or_else(|| missing("a GRU cell")).and_then(vector);
        Ok(HostGru {
            ih: HostLinear {
                wt: matrix(g.weight_ih(), 3 * h, i)?.transpose(),
                b: bias(g.bias_ih())?,
            },
            hh: HostLinear {
                wt: matrix(g.weight_hh(), 3 * h, h)?.transpose(),
                b: bias(g.bias_hh())?,
            },
            hidden: h,
        })
    }

    fn step(&self, x: &DMatrix<f64>, h: &DMatrix<f64>) -> DMatrix<f64> {
        let hd = self.hidden;
        let (gi, gh) = (self.ih.apply(x), self.hh.apply(h));
        DMatrix::from_fn(h.nrows(), hd, |i, j| {
            let r = sigmoid(gi[(i, j)] + gh[(i, j)]);
            let z = sigmoid(gi[(i, hd + j)] + gh[(i, hd + j)]);
            let n = (gi[(i, 2 * hd + j)] + r * gh[(i, 2 * hd + j)]).tanh();
            n + z * (h[(i, j)] - n)
        })
    }
}

#[derive(Debug, Clone)]
struct HostMember {
    gru: HostGru,
    prior: HostHead,
    posterior: HostHead,
    decoder: HostHead,
}

/// A host copy of an [`Rssm`]'s weights in f64 that runs its evaluation-mode forward.
#[derive(Debug, Clone)]
pub struct HostRssm {
    cfg: RssmConfig,
    enc_fc: HostLinear,
    enc_norm: HostNorm,
    members: Vec<HostMember>,
}

impl HostRssm {
    /// Copies `model`'s weights to the host (one device-to-host copy per tensor).
    pub fn from_model(model: &Rssm) -> Result<HostRssm> {
        let cfg = *model.config();
        let eps = cfg.layer_norm_eps;
        let Encoder { fc, norm, .. } = &model.encoder;
        let member = |m: &Member| -> Result<HostMember> {
            Ok(HostMember {
                gru: HostGru::new(&m.gru)?,
                prior: HostHead::new(&m.prior, eps)?,
                posterior: HostHead::new(&m.posterior, eps)?,
                decoder: HostHead::new(&m.decoder, eps)?,
            })
        };
        Ok(HostRssm {
            cfg,
            enc_fc: HostLinear::new(fc)?,
            enc_norm: HostNorm::new(norm, eps)?,
            members: model.members.iter().map(member).collect::<Result<_>>()?,
        })
    }

    fn encode_rows(&self, x: &DMatrix<f64>) -> DMatrix<f64> {
        relu(self.enc_norm.apply(&self.enc_fc.apply(x)))
    }

    /// The latent mean of a head's raw output (the first `S` columns).
    fn mean(&self, raw: &DMatrix<f64>) -> DMatrix<f64> {
        raw.columns(0, self.cfg.latent_dim).into_owned()
    }

    /// The encoder in evaluation mode: `relu(norm(x·Wᵀ + b))` for `features` `[B, F]`.
    /// Errors: another width, no row, NaN or Inf.
    pub fn encode(&self, features: ArrayView2<'_, f32>) -> Result<Array2<f32>> {
        let finite = features.iter().all(|v| v.is_finite());
        check_input("features", features.shape(), self.cfg.feature_dim, finite)?;
        Ok(from_matrix(&self.encode_rows(&to_matrix(features))))
    }

    /// Filters `context` `[B, T, F]` from the zero state along the posterior means, then rolls
    /// `steps` ahead along the prior means; returns every member's predictions `[M, B, N, D]`,
    /// their mean `[B, N, D]` and their disagreement `[B, N]` (the variance across members,
    /// averaged over the outputs), all computed in f64. Errors: another width, an empty
    /// context, NaN or Inf, `steps == 0`.
    pub fn predict(
        &self,
        context: ArrayView3<'_, f32>,
        steps: usize,
    ) -> Result<(Array4<f32>, Array3<f32>, Array2<f32>)> {
        let finite = context.iter().all(|v| v.is_finite());
        check_rollout(context.shape(), self.cfg.feature_dim, finite, steps)?;
        let (b, t, _) = context.dim();
        let (m, d) = (self.members.len(), self.cfg.output_dim);
        let embeds: Vec<DMatrix<f64>> = (0..t)
            .map(|i| self.encode_rows(&to_matrix(context.index_axis(ndarray::Axis(1), i))))
            .collect();
        let mut preds = vec![DMatrix::<f64>::zeros(b, d); m * steps];
        for (k, mem) in self.members.iter().enumerate() {
            let mut h = DMatrix::zeros(b, self.cfg.hidden_dim);
            let mut z = DMatrix::zeros(b, self.cfg.latent_dim);
            for e in &embeds {
                h = mem.gru.step(&z, &h);
                z = self.mean(&mem.posterior.apply(&hcat(&h, e)));
            }
            for n in 0..steps {
                h = mem.gru.step(&z, &h);
                z = self.mean(&mem.prior.apply(&h));
                preds[k * steps + n] = mem.decoder.apply(&hcat(&h, &z));
            }
        }
        let members = Array4::from_shape_fn((m, b, steps, d), |(k, i, n, j)| {
            preds[k * steps + n][(i, j)] as f32
        });
        let mean_of = |i: usize, n: usize, j: usize| {
            (0..m).map(|k| preds[k * steps + n][(i, j)]).sum::<f64>() / m as f64
        };
        let mean = Array3::from_shape_fn((b, steps, d), |(i, n, j)| mean_of(i, n, j) as f32);
        let disagreement = Array2::from_shape_fn((b, steps), |(i, n)| {
            let var: f64 = (0..d)
                .map(|j| {
                    let mu = mean_of(i, n, j);
                    (0..m)
                        .map(|k| (preds[k * steps + n][(i, j)] - mu).powi(2))
                        .sum::<f64>()
                        / m as f64
                })
                .sum();
            (var / d as f64) as f32
        });
        Ok((members, mean, disagreement))
    }
}

/// An ndarray view as an f64 matrix.
pub(crate) fn to_matrix(a: ArrayView2<'_, f32>) -> DMatrix<f64> {
    let (r, c) = a.dim();
    DMatrix::from_fn(r, c, |i, j| f64::from(a[(i, j)]))
}

/// An f64 matrix rounded to an f32 array.
pub(crate) fn from_matrix(m: &DMatrix<f64>) -> Array2<f32> {
    Array2::from_shape_fn(m.shape(), |(i, j)| m[(i, j)] as f32)
}
