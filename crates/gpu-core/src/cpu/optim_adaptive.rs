//! Schedule-Free AdamW, Prodigy and the parameter lerp on the CPU: the references. Each element
//! is evaluated in f64 from the stored f32 values, in the reference package's order, and
//! rounded once per stored value; Prodigy's sums are accumulated in f64 in parameter order,
//! its scalars kept in f64. The same code runs in the fast CPU mode (these optimisers have no
//! f32 SIMD path).

use super::CpuStorage;
use crate::error::Result;
use crate::nn::optim_adaptive::{
    check_lerp_params, lerp_f64, shared, ProdigyBuffers, ProdigyConfig, ProdigyScalars,
    ScheduleFreeBuffers, ScheduleFreeConfig, StepScalars,
};

/// The values of a step's scalars (a device schedule is a host buffer here).
fn scalar_values<'a>(s: &StepScalars<'a, CpuStorage>) -> Result<&'a [f32]> {
    match *s {
        StepScalars::Host(v) => Ok(v),
        StepScalars::Device(b) => b.as_f32(),
    }
}

/// The clip coefficient `grad_scale[1]`, or 1.
fn coef_of(grad_scale: Option<&CpuStorage>) -> Result<f64> {
    Ok(match grad_scale {
        Some(s) => s.as_f32()?[1] as f64,
        None => 1.0,
    })
}

/// [`crate::nn::OptimOps::schedule_free_step`] on the CPU.
pub(super) fn schedule_free_step(
    bufs: ScheduleFreeBuffers<'_, '_, CpuStorage>,
    cfg: ScheduleFreeConfig,
    scalars: StepScalars<'_, CpuStorage>,
) -> Result<()> {
    bufs.check(cfg, &scalars)?;
    let ScheduleFreeBuffers {
        params,
        grads,
        z,
        v,
        weight_decay,
        grad_scale,
    } = bufs;
    let coef = coef_of(grad_scale)?;
    let sc: Vec<f64> = scalar_values(&scalars)?.iter().map(|&x| x as f64).collect();
    let (lr, ckp1, y_lr, bc2) = (sc[0], sc[1], sc[2], sc[3]);
    let (b2, eps) = (cfg.beta2 as f64, cfg.eps as f64);
    for i in 0..params.len() {
        let wd = weight_decay[i] as f64;
        let g = grads[i].as_f32()?;
        let (y, zi, vi) = (
            params[i].as_f32_mut()?,
            z[i].as_f32_mut()?,
            v[i].as_f32_mut()?,
        );
        for e in 0..y.len() {
            let g = g[e] as f64 * coef;
            let ve = b2 * vi[e] as f64 + (1.0 - b2) * g * g;
            let mut u = g / ((ve / bc2).sqrt() + eps);
            let (ye, ze) = (y[e] as f64, zi[e] as f64);
            if wd != 0.0 {
                u += wd * ye;
            }
            y[e] = (lerp_f64(ye, ze, ckp1) + y_lr * u) as f32;
            zi[e] = (ze - lr * u) as f32;
            vi[e] = ve as f32;
        }
    }
    Ok(())
}

/// [`crate::nn::OptimOps::lerp_params`] on the CPU.
pub(super) fn lerp_params(
    params: &mut [&mut CpuStorage],
    ends: &[&CpuStorage],
    weight: f32,
) -> Result<()> {
    check_lerp_params(&shared(params), ends, weight)?;
    for (p, end) in params.iter_mut().zip(ends) {
        let end = end.as_f32()?;
        for (x, &e) in p.as_f32_mut()?.iter_mut().zip(end) {
            *x = lerp_f64(*x as f64, e as f64, weight as f64) as f32;
        }
    }
    Ok(())
}

/// Python's `max(a, b)` (keeps `a` unless `b > a`) and `min(a, b)` (keeps `a` unless `b < a`):
/// the package's NaN behaviour.
pub(crate) fn py_max(a: f64, b: f64) -> f64 {
    if b > a {
        b
    } else {
        a
    }
}

/// See [`py_max`].
pub(crate) fn py_min(a: f64, b: f64) -> f64 {
    if b < a {
        b
    } else {
        a
    }
}

/// Prodigy's `dlr = d·lr·bias_correction` before a step.
pub(crate) fn prodigy_dlr(cfg: &ProdigyConfig, sc: &ProdigyScalars, lr: f64) -> f64 {
    let bc = if cfg.use_bias_correction {
        let k1 = sc.k + 1.0;
        (1.0 - (cfg.beta2 as f64).powf(k1)).sqrt() / (1.0 - (cfg.beta1 as f64).powf(k1))
    } else {
        1.0
    };
    sc.d * lr * bc
}

/// The scalars after a step's sums (`dot = Σ⟨g, p0 − p⟩`, `den = Σ|s|`), as the package's
/// `step` leaves them; `apply` says whether the parameters are updated.
pub(crate) fn prodigy_finish(
    cfg: &ProdigyConfig,
    sc: &ProdigyScalars,
    lr: f64,
    dot: f64,
    den: f64,
) -> ProdigyScalars {
    let dlr = prodigy_dlr(cfg, sc, lr);
    let d0 = cfg.d0 as f64;
    let mut out = ProdigyScalars {
        dlr,
        apply: 0.0,
        ..*sc
    };
    if den == 0.0 || lr <= 0.0 {
        // `if d_denom == 0: return`: nothing else is stored (lr 0 gives den 0 there).
        return out;
    }
    let num = sc.d_numerator * cfg.beta3 as f64 + (sc.d / d0) * dlr * dot;
    let d_hat = cfg.d_coef as f64 * num / den;
    let mut d = sc.d;
    if d == d0 {
        d = py_max(d, d_hat);
    }
    let d_max = py_max(sc.d_max, d_hat);
    out.d = py_min(d_max, d * cfg.growth_rate as f64);
    out.d_max = d_max;
    out.d_numerator = num;
    out.d_denom = den;
    out.d_hat = d_hat;
    out.k = sc.k + 1.0;
    out.apply = 1.0;
    out
}

/// The gradient Prodigy uses: scaled by the clip coefficient, plus `wd·p` when coupled.
#[inline]
fn prodigy_grad(cfg: &ProdigyConfig, g: f32, coef: f64, wd: f64, p: f64) -> f64 {
    let g = g as f64 * coef;
    if !cfg.decouple && wd != 0.0 {
        g + wd * p
    } else {
        g
    }
}

/// [`crate::nn::OptimOps::prodigy_step`] on the CPU.
pub(super) fn prodigy_step(
    bufs: ProdigyBuffers<'_, '_, CpuStorage>,
    cfg: ProdigyConfig,
    lr: StepScalars<'_, CpuStorage>,
    scalars: &mut CpuStorage,
) -> Result<()> {
    bufs.check(cfg, &lr, scalars)?;
    let ProdigyBuffers {
        params,
        grads,
        p0,
        s,
        m,
        v,
        weight_decay,
        grad_scale,
    } = bufs;
    let lr = scalar_values(&lr)?[0] as f64;
    let coef = coef_of(grad_scale)?;
    let sc = ProdigyScalars::from_words(scalars.as_f32()?)?;
    let (d, dlr) = (sc.d, prodigy_dlr(&cfg, &sc, lr));
    let (b1, b2, b3) = (cfg.beta1 as f64, cfg.beta2 as f64, cfg.beta3 as f64);
    let s_coef = (d / cfg.d0 as f64) * if cfg.safeguard_warmup { d } else { dlr };
    let (mut dot, mut den) = (0.0f64, 0.0f64);
    if lr > 0.0 {
        for i in 0..params.len() {
            let wd = weight_decay[i] as f64;
            let (g, p0i, p) = (grads[i].as_f32()?, p0[i].as_f32()?, params[i].as_f32()?);
            let (si, mi, vi) = (s[i].as_f32_mut()?, m[i].as_f32_mut()?, v[i].as_f32_mut()?);
            for e in 0..p.len() {
                let g = prodigy_grad(&cfg, g[e], coef, wd, p[e] as f64);
                dot += g * (p0i[e] as f64 - p[e] as f64);
                mi[e] = (b1 * mi[e] as f64 + d * (1.0 - b1) * g) as f32;
                vi[e] = (b2 * vi[e] as f64 + d * d * (1.0 - b2) * g * g) as f32;
                si[e] = (b3 * si[e] as f64 + s_coef * g) as f32;
                den += (si[e] as f64).abs();
            }
        }
    }
    let next = prodigy_finish(&cfg, &sc, lr, dot, den);
    if next.apply != 0.0 {
        let read = (grads, &m[..], &v[..]);
        prodigy_update(params, read, weight_decay, coef, &cfg, &next)?;
    }
    scalars.as_f32_mut()?.copy_from_slice(&next.to_words());
    Ok(())
}

/// Prodigy's parameter update with the step's new scalars (`next.d`, `next.dlr`), reading
/// `(grads, m, v)`.
fn prodigy_update(
    params: &mut [&mut CpuStorage],
    (grads, m, v): (&[&CpuStorage], &[&mut CpuStorage], &[&mut CpuStorage]),
    weight_decay: &[f32],
    coef: f64,
    cfg: &ProdigyConfig,
    next: &ProdigyScalars,
) -> Result<()> {
    let (d, dlr, eps) = (next.d, next.dlr, cfg.eps as f64);
    for i in 0..params.len() {
        let wd = weight_decay[i] as f64;
        let (g, mi, vi) = (grads[i].as_f32()?, m[i].as_f32()?, v[i].as_f32()?);
        for (e, p) in params[i].as_f32_mut()?.iter_mut().enumerate() {
            let denom = (vi[e] as f64).sqrt() + d * eps;
            let mut pe = *p as f64;
            let g = prodigy_grad(cfg, g[e], coef, wd, pe);
            if cfg.decouple && wd != 0.0 {
                pe += -wd * dlr * pe;
            }
            pe += if cfg.beta1 > 0.0 {
                -dlr * (mi[e] as f64 / denom)
            } else {
                -dlr * d * (g / denom)
            };
            *p = pe as f32;
        }
    }
    Ok(())
}
