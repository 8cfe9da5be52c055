//! The per-element error bounds of bf16 attention (the parent module's docs derive them): the
//! rounding bounds and, apart, the terms that flushing subnormals to zero can add.

use super::*;

/// Head `h` of block `blk` of batch `bi` of a `[b, t, w·c]` buffer as f64 `[t, d]`.
pub(super) fn gather(x: &[bf16], p: Packed, w: usize, blk: usize, bi: usize, h: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(p.t * p.d);
    for i in 0..p.t {
        let at = (bi * p.t + i) * w * p.c() + blk * p.c() + h * p.d;
        out.extend(x[at..at + p.d].iter().map(|v| v.to_f64()));
    }
    out
}

/// F = 2^-126, the smallest normal f32 and bf16: what one flushed subnormal can lose (module
/// docs).
pub(super) const F: f64 = f32::MIN_POSITIVE as f64;

/// Per-element bounds of `(out, lse, [b, t, 3c] gradient)`.
pub(super) struct Tol {
    pub out: Vec<f64>,
    pub lse: Vec<f64>,
    pub grad: Vec<f64>,
}

/// The bounds of the module docs from the inputs and the GPU's `out` and `lse` (as the
/// backward reference takes them): the rounding bounds, and apart the flush-to-zero terms.
pub(super) fn bounds(
    qkv: &[bf16],
    out: &[bf16],
    lse: &[f32],
    dout: &[bf16],
    p: Packed,
    scale: f64,
) -> (Tol, Tol) {
    let (t, d, c) = (p.t, p.d, p.c());
    let mut to = vec![0.0; out.len()];
    let mut tl = vec![0.0; lse.len()];
    let mut tg = vec![0.0; qkv.len()];
    let (mut fo, mut fl, mut fg) = (to.clone(), tl.clone(), tg.clone());
    for bi in 0..p.b {
        for h in 0..p.heads {
            let [q, k, v] = [0, 1, 2].map(|blk| gather(qkv, p, 3, blk, bi, h));
            let (o, g) = (gather(out, p, 1, 0, bi, h), gather(dout, p, 1, 0, bi, h));
            let zeros = || vec![0.0; t * d];
            let (mut eo, mut eq, mut ek, mut ev) = (zeros(), zeros(), zeros(), zeros());
            let (mut zo, mut zq, mut zk, mut zv) = (zeros(), zeros(), zeros(), zeros());
            for i in 0..t {
                let li = lse[(bi * p.heads + h) * t + i] as f64;
                let (mut dl, mut dlabs) = (0.0, 0.0);
                for x in 0..d {
                    dl += g[i * d + x] * o[i * d + x];
                    dlabs += (g[i * d + x] * o[i * d + x]).abs();
                }
                let mut smax = 0.0f64;
                for j in 0..=i {
                    let (mut s, mut sig, mut dp, mut dpabs) = (0.0, 0.0, 0.0, 0.0);
                    for x in 0..d {
                        let qk = q[i * d + x] * k[j * d + x];
                        let gv = g[i * d + x] * v[j * d + x];
                        s += qk;
                        sig += qk.abs();
                        dp += gv;
                        dpabs += gv.abs();
                    }
                    let (s, sig) = (scale * s, scale.abs() * sig);
                    smax = smax.max(sig);
                    let pij = (s - li).exp();
                    let kap = 1.0 + sig + li.abs();
                    let ds = pij * (dp - dl);
                    let e = 2.0 * U * ds.abs() + EPS * pij * (dpabs + dlabs) * kap;
                    let ep = (2.0 * U + EPS * kap) * pij;
                    // Flushes: dS as an operand (P inside it, then dS itself).
                    let fds = 2.0 * F * (dpabs + dlabs) + F;
                    for x in 0..d {
                        eo[i * d + x] += ep * v[j * d + x].abs();
                        eq[i * d + x] += scale.abs() * e * k[j * d + x].abs();
                        ek[j * d + x] += scale.abs() * e * q[i * d + x].abs();
                        ev[j * d + x] += ep * g[i * d + x].abs();
                        // Per term: the operand, then 3F (forward) or 2F (backward) for the
                        // product, the partial sum (and the forward's rescale).
                        zo[i * d + x] += 2.0 * F * v[j * d + x].abs() + 3.0 * F;
                        zq[i * d + x] += scale.abs() * (fds * k[j * d + x].abs() + 2.0 * F);
                        zk[j * d + x] += scale.abs() * (fds * q[i * d + x].abs() + 2.0 * F);
                        zv[j * d + x] += 2.0 * F * g[i * d + x].abs() + 2.0 * F;
                    }
                }
                let keys = (i + 1) as f64;
                tl[(bi * p.heads + h) * t + i] = EPS * (1.0 + li.abs() + smax);
                fl[(bi * p.heads + h) * t + i] = 4.0 * F * keys;
                for x in 0..d {
                    let at = (bi * t + i) * c + h * d + x;
                    to[at] = eo[i * d + x] + 2.0 * U * o[i * d + x].abs();
                    // The store, and the normaliser's loss.
                    fo[at] = zo[i * d + x] + 2.0 * F + 4.0 * F * keys * o[i * d + x].abs();
                }
            }
            for i in 0..t {
                let blocks = [(&eq, &zq), (&ek, &zk), (&ev, &zv)];
                for (blk, (e, z)) in blocks.into_iter().enumerate() {
                    let at = (bi * t + i) * 3 * c + blk * c + h * d;
                    for x in 0..d {
                        tg[at + x] = 1.25 * e[i * d + x];
                        // The store.
                        fg[at + x] = z[i * d + x] + 2.0 * F;
                    }
                }
            }
        }
    }
    let tol = |out, lse, grad| Tol { out, lse, grad };
    (tol(to, tl, tg), tol(fo, fl, fg))
}
