//! AdamW and the gradient norm in the fast mode: the AdamW update in f32 per element, in
//! `torch.optim.AdamW`'s order (decoupled decay, moments, bias-corrected step); the squared
//! norm accumulated in f64 over 8 lanes in a fixed order.

use super::multiversion;

/// The scalars of one AdamW step, in f32.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AdamWScalars {
    /// Gradient scale (the clip coefficient, or 1).
    pub coef: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// `1 − lr·weight_decay`.
    pub decay: f32,
    /// `lr / (1 − beta1^t)`.
    pub step_size: f32,
    /// `sqrt(1 − beta2^t)`.
    pub bc2_sqrt: f32,
}

#[inline(always)]
fn adamw_body(p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32], s: AdamWScalars) {
    let (b1, b2) = (s.beta1, s.beta2);
    let (c1, c2) = (1.0 - b1, 1.0 - b2);
    let it = p.iter_mut().zip(m.iter_mut()).zip(v.iter_mut()).zip(g);
    for (((p, m), v), &g) in it {
        let g = g * s.coef;
        let me = b1 * *m + c1 * g;
        let ve = b2 * *v + c2 * (g * g);
        *p = *p * s.decay - s.step_size * me / (ve.sqrt() / s.bc2_sqrt + s.eps);
        *m = me;
        *v = ve;
    }
}

/// `Σ x²` in f64 over 8 lanes in a fixed order.
#[inline(always)]
pub(crate) fn sum_squares_f64(x: &[f32]) -> f64 {
    const L: usize = 8;
    let mut acc = [0.0f64; L];
    let chunks = x.chunks_exact(L);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..L {
            acc[l] += c[l] as f64 * c[l] as f64;
        }
    }
    let mut s = 0.0f64;
    for a in acc {
        s += a;
    }
    for &v in rest {
        s += v as f64 * v as f64;
    }
    s
}

#[inline(always)]
fn sum_squares_body(x: &[f32], out: &mut f64) {
    *out = sum_squares_f64(x);
}

multiversion!(
    /// One AdamW step over a chunk of parameters (see [`adamw_body`]).
    pub(crate) fn adamw(
        p: &mut [f32],
        m: &mut [f32],
        v: &mut [f32],
        g: &[f32],
        s: AdamWScalars,
    ) => adamw_body
);

multiversion!(
    /// `*out = Σ x²` in f64 (see [`sum_squares_f64`]).
    pub(crate) fn sum_squares(x: &[f32], out: &mut f64) => sum_squares_body
);
