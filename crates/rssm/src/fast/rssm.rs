//! [`FastRssm`]: the world model's evaluation-mode forward on the host in f32, the default CPU
//! engine of `encode_state` and `predict_batch` ([`crate::Engine::Fast`]).
//!
//! The same computation as [`crate::reference::HostRssm`] (its f64 twin, which the tests check
//! it against), arranged for speed:
//!
//! - every weight matrix is packed once ([`Packed`]), biases folded into the GEMM's
//!   accumulators and ReLU into its store;
//! - a member's state lives in one row buffer `[z | h | e]`, so the GRU cell is a single GEMM
//!   `[z | h]·W` (its `r`, `z` gates summed in the product, the two halves of the `n` gate
//!   kept apart by per-panel `k` ranges), the posterior reads `[h | e]`, the prior `h`, and
//!   the decoder `[z | h]` (its weight's rows permuted when packing); the latent means are
//!   written straight back into the `z` slot (only the `S` mean columns of a head's output
//!   layer are computed), the decoder's output straight into the result;
//! - LayerNorm statistics are accumulated in f64; sigmoid and tanh are branch-free f32
//!   (about 1 ulp; module `simd`) so that the gate loop vectorizes;
//! - the rollout is split into (member, block of rows) units run in parallel (rayon), each
//!   with its buffers allocated once for all its steps.

use super::simd::{self, simd_fn, Real};
use crate::config::RssmConfig;
use crate::error::{Result, RssmError};
use crate::layers::{Encoder, Head, Member};
use crate::model::Rssm;
use crate::reference::{check_input, check_rollout};
use gpu_core::cpu::fast::packed::{nn, Epi, Packed, Region};
use ndarray::{Array2, Array3, Array4, ArrayView2, ArrayView3};
use rayon::prelude::*;
use tensor_ops::nn::{LayerNorm, Linear};
use tensor_ops::Tensor;

fn missing(what: &str) -> RssmError {
    RssmError::InvalidArgument {
        what: "fast model",
        reason: format!("{what} has no bias"),
    }
}

/// A linear layer's weight (`out × in`, row-major) and bias on the host.
fn linear_parts(l: &Linear) -> Result<(Vec<f32>, Vec<f32>)> {
    let b = l.bias().ok_or_else(|| missing("a linear layer"))?;
    Ok((l.weight().to_vec()?, b.to_vec()?))
}

/// Packs `y = x·Wᵀ + b` for inputs taken in the order `perm(p)` of the layer's own inputs,
/// keeping the first `outs` outputs.
fn pack_linear(l: &Linear, outs: usize, perm: impl Fn(usize) -> usize) -> Result<Packed<f32>> {
    let (w, b) = linear_parts(l)?;
    let k = l.in_dim();
    let region = Region {
        cols: outs,
        k: 0..k,
    };
    Ok(Packed::new(
        k,
        &[region],
        |p, j| w[j * k + perm(p)],
        |j| b[j],
    ))
}

/// LayerNorm's affine parameters.
#[derive(Debug, Clone)]
struct Norm {
    w: Vec<f32>,
    b: Vec<f32>,
    eps: f64,
}

impl Norm {
    fn new(n: &LayerNorm, eps: f32) -> Result<Norm> {
        Ok(Norm {
            w: n.weight().to_vec()?,
            b: n.bias().ok_or_else(|| missing("a layer norm"))?.to_vec()?,
            eps: f64::from(eps),
        })
    }
}

/// `out(relu(norm(fc(x))))` with `out` cut to the columns used.
#[derive(Debug, Clone)]
struct FastHead {
    fc: Packed<f32>,
    norm: Norm,
    out: Packed<f32>,
}

impl FastHead {
    fn new(h: &Head, eps: f32, outs: usize, perm: impl Fn(usize) -> usize) -> Result<FastHead> {
        Ok(FastHead {
            fc: pack_linear(&h.fc, h.fc.out_dim(), perm)?,
            norm: Norm::new(&h.norm, eps)?,
            out: pack_linear(&h.out, outs, |p| p)?,
        })
    }

    /// `relu(norm(fc(x)))` into `hid` (`rows × head`) for `x` rows `ldx` apart.
    fn hidden(&self, x: &[f32], ldx: usize, rows: usize, hid: &mut [f32]) {
        nn(x, ldx, rows, &self.fc, hid, self.fc.n(), Epi::Bias);
        layer_norm_relu(hid, rows, &self.norm.w, &self.norm.b, self.norm.eps);
    }

    /// `out(hid)` into `out` (rows `ldo` apart).
    fn output(&self, hid: &[f32], rows: usize, out: &mut [f32], ldo: usize) {
        nn(hid, self.fc.n(), rows, &self.out, out, ldo, Epi::Bias);
    }
}

#[derive(Debug, Clone)]
struct FastMember {
    /// `[z | h]` (`S + H`) → `[r + r', u + u', n_x, n_h]` (`4H`).
    gru: Packed<f32>,
    prior: FastHead,
    posterior: FastHead,
    decoder: FastHead,
}

/// A host copy of an [`Rssm`]'s weights in f32, packed, that runs its evaluation-mode forward
/// (see the module doc).
#[derive(Debug, Clone)]
pub struct FastRssm {
    cfg: RssmConfig,
    enc: Packed<f32>,
    enc_norm: Norm,
    members: Vec<FastMember>,
}

/// The GRU cell's fused weight: inputs `[z | h]`, outputs `[r, u, n_x, n_h]` (PyTorch's
/// `r, z, n` order; `u` is its update gate): `r`, `u` sum both products and biases, `n_x`
/// reads only `z`, `n_h` only `h`.
fn pack_gru(m: &Member) -> Result<Packed<f32>> {
    let g = &m.gru;
    let (s, h) = (g.input_size(), g.hidden_size());
    let bias = |b: Option<&Tensor>| -> Result<Vec<f32>> {
        Ok(b.ok_or_else(|| missing("a GRU cell"))?.to_vec()?)
    };
    let (wi, wh) = (g.weight_ih().to_vec()?, g.weight_hh().to_vec()?);
    let (bi, bh) = (bias(g.bias_ih())?, bias(g.bias_hh())?);
    let regions = [
        Region {
            cols: 2 * h,
            k: 0..s + h,
        },
        Region { cols: h, k: 0..s },
        Region {
            cols: h,
            k: s..s + h,
        },
    ];
    let w = |p: usize, j: usize| {
        // Output j of [r, u, n_x, n_h] reads row `o` of W_ih (p < S) or W_hh (p >= S).
        let o = if j < 3 * h { j } else { j - h };
        if p < s {
            wi[o * s + p]
        } else {
            wh[o * h + p - s]
        }
    };
    let b = |j: usize| match j / h {
        0 | 1 => bi[j] + bh[j],
        2 => bi[j],
        _ => bh[j - h],
    };
    Ok(Packed::new(s + h, &regions, w, b))
}

simd_fn! {
    /// `h ← n + u∘(h − n)`, `r = σ(g_r)`, `u = σ(g_u)`, `n = tanh(g_nx + r∘g_nh)` for each row
    /// of `gates` (`4H` wide) and the `H` values at `state[i·lds + off ..]`.
    fn gru_update(gates: &[f32], rows: usize, state: &mut [f32], lds: usize, off: usize, h: usize) {
        avx512: gru_update_impl::<true>(gates, rows, state, lds, off, h),
        avx2: gru_update_impl::<true>(gates, rows, state, lds, off, h),
        base: gru_update_impl::<false>(gates, rows, state, lds, off, h),
    }
}

#[inline(always)]
fn gru_update_impl<const FMA: bool>(
    gates: &[f32],
    rows: usize,
    state: &mut [f32],
    lds: usize,
    off: usize,
    h: usize,
) {
    for i in 0..rows {
        let g = &gates[i * 4 * h..(i + 1) * 4 * h];
        let (gr, rest) = g.split_at(h);
        let (gu, rest) = rest.split_at(h);
        let (gx, gh) = rest.split_at(h);
        let st = &mut state[i * lds + off..i * lds + off + h];
        for ((((s, &r), &u), &x), &hh) in st.iter_mut().zip(gr).zip(gu).zip(gx).zip(gh) {
            let r = simd::sigmoid::<FMA>(r);
            let u = simd::sigmoid::<FMA>(u);
            let n = simd::tanh::<FMA>(x + r * hh);
            *s = n + u * (*s - n);
        }
    }
}

simd_fn! {
    /// LayerNorm (statistics in f64, biased variance, `eps` inside the root) and ReLU, in
    /// place, on `rows` contiguous rows of `w.len()` values.
    fn layer_norm_relu(x: &mut [f32], rows: usize, w: &[f32], b: &[f32], eps: f64) {
        avx512: layer_norm_relu_impl::<true>(x, rows, w, b, eps),
        avx2: layer_norm_relu_impl::<true>(x, rows, w, b, eps),
        base: layer_norm_relu_impl::<false>(x, rows, w, b, eps),
    }
}

/// `Σ f(x_i)` in f64 over 8 interleaved partial sums (so that it vectorizes).
#[inline(always)]
fn sum8(x: &[f32], f: impl Fn(f64) -> f64) -> f64 {
    let mut acc = [0.0f64; 8];
    let chunks = x.chunks_exact(8);
    let tail: f64 = chunks.remainder().iter().map(|&v| f(f64::from(v))).sum();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f(f64::from(v));
        }
    }
    acc.iter().sum::<f64>() + tail
}

#[inline(always)]
fn layer_norm_relu_impl<const FMA: bool>(
    x: &mut [f32],
    rows: usize,
    w: &[f32],
    b: &[f32],
    eps: f64,
) {
    let n = w.len();
    for row in x[..rows * n].chunks_exact_mut(n) {
        let mean = sum8(row, |v| v) / n as f64;
        let var = sum8(row, |v| (v - mean) * (v - mean)) / n as f64;
        let rstd = (1.0 / (var + eps).sqrt()) as f32;
        let mean = mean as f32;
        for ((v, &g), &c) in row.iter_mut().zip(w).zip(b) {
            let y = f32::madd::<FMA>((*v - mean) * rstd, g, c);
            *v = if y > 0.0 { y } else { 0.0 };
        }
    }
}

impl FastRssm {
    /// Copies and packs `model`'s weights (one device-to-host copy per tensor).
    pub fn from_model(model: &Rssm) -> Result<FastRssm> {
        let cfg = *model.config();
        let (eps, s, h) = (cfg.layer_norm_eps, cfg.latent_dim, cfg.hidden_dim);
        let Encoder { fc, norm, .. } = &model.encoder;
        let member = |m: &Member| -> Result<FastMember> {
            Ok(FastMember {
                gru: pack_gru(m)?,
                prior: FastHead::new(&m.prior, eps, s, |p| p)?,
                posterior: FastHead::new(&m.posterior, eps, s, |p| p)?,
                // The decoder reads [h | z]; the state holds [z | h].
                decoder: FastHead::new(&m.decoder, eps, cfg.output_dim, |p| {
                    if p < s {
                        h + p
                    } else {
                        p - s
                    }
                })?,
            })
        };
        Ok(FastRssm {
            cfg,
            enc: pack_linear(fc, fc.out_dim(), |p| p)?,
            enc_norm: Norm::new(norm, eps)?,
            members: model.members.iter().map(member).collect::<Result<_>>()?,
        })
    }

    /// The encoder on `rows` feature rows: `[rows, E]`.
    fn encode_rows(&self, x: &[f32], rows: usize) -> Vec<f32> {
        let e = self.cfg.embed_dim;
        let mut out = vec![0.0f32; rows * e];
        nn(
            x,
            self.cfg.feature_dim,
            rows,
            &self.enc,
            &mut out,
            e,
            Epi::Bias,
        );
        let n = &self.enc_norm;
        layer_norm_relu(&mut out, rows, &n.w, &n.b, n.eps);
        out
    }

    /// The encoder in evaluation mode: `relu(norm(x·Wᵀ + b))` for `features` `[B, F]`, in f32.
    /// Errors: another width, no row, NaN or Inf.
    pub fn encode(&self, features: ArrayView2<'_, f32>) -> Result<Array2<f32>> {
        let x: Vec<f32> = features.iter().copied().collect();
        let finite = x.iter().all(|v| v.is_finite());
        check_input("features", features.shape(), self.cfg.feature_dim, finite)?;
        let rows = features.nrows();
        let y = self.encode_rows(&x, rows);
        Array2::from_shape_vec((rows, self.cfg.embed_dim), y).map_err(shape_err)
    }

    /// [`FastRssm::encode`] on `rows` rows of `x` (row-major `[rows, F]`) that the caller
    /// checked (width, at least one row, finite): `[rows, E]`, row-major.
    pub(crate) fn encode_checked(&self, x: &[f32], rows: usize) -> Vec<f32> {
        self.encode_rows(x, rows)
    }

    /// One member's filter and rollout for the batch rows `b0..b0 + rows`: `out` receives its
    /// predictions `[rows, steps, D]`.
    fn unit(
        &self,
        m: &FastMember,
        embeds: &[f32],
        t_len: usize,
        b0: usize,
        steps: usize,
        out: &mut [f32],
    ) {
        let c = &self.cfg;
        let (s, h, e, d) = (c.latent_dim, c.hidden_dim, c.embed_dim, c.output_dim);
        let ld = s + h + e;
        let rows = out.len() / (steps * d);
        let mut zhe = vec![0.0f32; rows * ld];
        let mut gates = vec![0.0f32; rows * 4 * h];
        let mut hid = vec![0.0f32; rows * c.head_dim];
        let gru = |zhe: &mut [f32], gates: &mut [f32]| {
            nn(zhe, ld, rows, &m.gru, gates, 4 * h, Epi::Bias);
            gru_update(gates, rows, zhe, ld, s, h);
        };
        for t in 0..t_len {
            for i in 0..rows {
                let src = ((b0 + i) * t_len + t) * e;
                zhe[i * ld + s + h..(i + 1) * ld].copy_from_slice(&embeds[src..src + e]);
            }
            gru(&mut zhe, &mut gates);
            m.posterior.hidden(&zhe[s..], ld, rows, &mut hid);
            m.posterior.output(&hid, rows, &mut zhe, ld);
        }
        for n in 0..steps {
            gru(&mut zhe, &mut gates);
            m.prior.hidden(&zhe[s..], ld, rows, &mut hid);
            m.prior.output(&hid, rows, &mut zhe, ld);
            m.decoder.hidden(&zhe, ld, rows, &mut hid);
            m.decoder.output(&hid, rows, &mut out[n * d..], steps * d);
        }
    }

    /// Filters `context` `[B, T, F]` from the zero state along the posterior means, then rolls
    /// `steps` ahead along the prior means; returns every member's predictions `[M, B, N, D]`,
    /// their mean `[B, N, D]` and their disagreement `[B, N]` (the variance across members,
    /// averaged over the outputs; both accumulated in f64). Errors: another width, an empty
    /// context, NaN or Inf, `steps == 0`.
    pub fn predict(
        &self,
        context: ArrayView3<'_, f32>,
        steps: usize,
    ) -> Result<(Array4<f32>, Array3<f32>, Array2<f32>)> {
        let x: Vec<f32> = context.iter().copied().collect();
        let finite = x.iter().all(|v| v.is_finite());
        check_rollout(context.shape(), self.cfg.feature_dim, finite, steps)?;
        let (b, t, _) = context.dim();
        let (m, d) = (self.members.len(), self.cfg.output_dim);
        let (members, mean, disagreement) = self.predict_checked(&x, b, t, steps);
        Ok((
            Array4::from_shape_vec((m, b, steps, d), members).map_err(shape_err)?,
            Array3::from_shape_vec((b, steps, d), mean).map_err(shape_err)?,
            Array2::from_shape_vec((b, steps), disagreement).map_err(shape_err)?,
        ))
    }

    /// [`FastRssm::predict`] on a context `x` (row-major `[b, t, F]`) that the caller checked
    /// (width, `b, t, steps > 0`, finite): the members' predictions, their mean and their
    /// disagreement, row-major.
    pub(crate) fn predict_checked(
        &self,
        x: &[f32],
        b: usize,
        t: usize,
        steps: usize,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let (m, d) = (self.members.len(), self.cfg.output_dim);
        let embeds = self.encode_rows(x, b * t);
        // Units of (member, block of rows): about two blocks per thread in all.
        let threads = rayon::current_num_threads().max(1);
        let blocks = (2 * threads).div_ceil(m).clamp(1, b);
        let per = b.div_ceil(blocks);
        let mut preds = vec![0.0f32; m * b * steps * d];
        let mut units = Vec::new();
        let mut rest = preds.as_mut_slice();
        for k in 0..m {
            for b0 in (0..b).step_by(per) {
                let rows = per.min(b - b0);
                let (mine, tail) = rest.split_at_mut(rows * steps * d);
                units.push((k, b0, mine));
                rest = tail;
            }
        }
        units
            .into_par_iter()
            .for_each(|(k, b0, out)| self.unit(&self.members[k], &embeds, t, b0, steps, out));
        let per_member = b * steps * d;
        let mut mean = vec![0.0f32; per_member];
        let mut disagreement = vec![0.0f32; b * steps];
        let at = |k: usize, i: usize| f64::from(preds[k * per_member + i]);
        for (i, (dis, mean)) in disagreement.iter_mut().zip(mean.chunks_mut(d)).enumerate() {
            let mut var = 0.0f64;
            for (j, mean) in (i * d..).zip(mean) {
                let mu = (0..m).map(|k| at(k, j)).sum::<f64>() / m as f64;
                var += (0..m).map(|k| (at(k, j) - mu).powi(2)).sum::<f64>() / m as f64;
                *mean = mu as f32;
            }
            *dis = (var / d as f64) as f32;
        }
        (preds, mean, disagreement)
    }
}

fn shape_err(e: ndarray::ShapeError) -> RssmError {
    RssmError::InvalidArgument {
        what: "fast model",
        reason: e.to_string(),
    }
}
