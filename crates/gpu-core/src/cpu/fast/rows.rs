//! LayerNorm forward and backward in f32 (the fast mode's kernels; the formulas are the f64
//! reference's in `cpu/rows.rs`). Row sums run over 16 lanes in a fixed order (the lanes, then
//! the lane totals, then the tail), so every level computes the same bits.

use super::multiversion;

const LANES: usize = 16;

/// `Σ f(a[i], b[i])` over 16 lanes in a fixed order (see the module doc).
#[inline(always)]
pub(crate) fn sum2(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (xa, xb) in ca.zip(cb) {
        for l in 0..LANES {
            acc[l] += f(xa[l], xb[l]);
        }
    }
    let mut s = 0.0f32;
    for a in acc {
        s += a;
    }
    for (&xa, &xb) in ra.iter().zip(rb) {
        s += f(xa, xb);
    }
    s
}

multiversion!(
    /// LayerNorm forward of whole rows: `x`, `y` hold the same number of `cols`-wide rows, `mean`
    /// and `rstd` one value per row; `w` and `b` the weight and bias.
    pub(crate) fn layernorm_fwd(
        xwb: (&[f32], &[f32], &[f32]),
        y: &mut [f32],
        stats: (&mut [f32], &mut [f32]),
        cols: usize,
        eps: f32,
    ) {
        let (x, w, b) = xwb;
        let n = cols as f32;
        let rows = x.chunks_exact(cols).zip(y.chunks_exact_mut(cols));
        for ((xr, yr), (mean, rstd)) in rows.zip(stats.0.iter_mut().zip(stats.1.iter_mut())) {
            let mu = sum2(xr, xr, |v, _| v) / n;
            let var = sum2(xr, xr, |v, _| (v - mu) * (v - mu)) / n;
            let rs = 1.0 / (var + eps).sqrt();
            for (((o, &v), &wi), &bi) in yr.iter_mut().zip(xr).zip(w).zip(b) {
                *o = (v - mu) * rs * wi + bi;
            }
            (*mean, *rstd) = (mu, rs);
        }
    }
);

multiversion!(
    /// LayerNorm backward of whole rows: `dx` from `x`, `w`, the saved `mean`/`rstd` and `dy`.
    pub(crate) fn layernorm_dx(
        x: &[f32],
        w: &[f32],
        stats: (&[f32], &[f32]),
        dy: &[f32],
        dx: &mut [f32],
        cols: usize,
    ) {
        let n = cols as f32;
        let w = &w[..cols];
        let rows = x.chunks_exact(cols).zip(dy.chunks_exact(cols));
        let rows = rows.zip(dx.chunks_exact_mut(cols));
        for (((xr, dyr), dxr), (&mu, &rs)) in rows.zip(stats.0.iter().zip(stats.1)) {
            let sg = sum2(dyr, w, |g, wi| g * wi);
            // Σ g·x̂ with x̂ = (x − μ)·rs; the products are formed as in the loop below.
            let mut acc = [0.0f32; LANES];
            let (xc, gc, wc) = (
                xr.chunks_exact(LANES),
                dyr.chunks_exact(LANES),
                w.chunks_exact(LANES),
            );
            let tail = (xc.remainder(), gc.remainder(), wc.remainder());
            for ((xc, gc), wc) in xc.zip(gc).zip(wc) {
                for l in 0..LANES {
                    acc[l] += gc[l] * wc[l] * ((xc[l] - mu) * rs);
                }
            }
            let mut sgx = 0.0f32;
            for a in acc {
                sgx += a;
            }
            for ((&xv, &g), &wi) in tail.0.iter().zip(tail.1).zip(tail.2) {
                sgx += g * wi * ((xv - mu) * rs);
            }
            for (((o, &xv), &g), &wi) in dxr.iter_mut().zip(xr).zip(dyr).zip(w) {
                let xhat = (xv - mu) * rs;
                *o = rs * (g * wi - (sg + xhat * sgx) / n);
            }
        }
    }
);

multiversion!(
    /// `dw[c] = Σ_r dy[r, c0 + c]·x̂[r, c0 + c]` and `db[c] = Σ_r dy[r, c0 + c]` for the columns
    /// `c0..c0 + dw.len()`, each summed over the rows in order.
    pub(crate) fn layernorm_dwdb(
        x: &[f32],
        stats: (&[f32], &[f32]),
        dy: &[f32],
        grads: (&mut [f32], &mut [f32]),
        cols: usize,
        c0: usize,
    ) {
        let (dw, db) = grads;
        // Columns in groups of `LANES` whose sums stay in registers over all rows, then the rest.
        let groups = dw.len() / LANES;
        for gi in 0..groups {
            let (mut aw, mut ab) = ([0.0f32; LANES], [0.0f32; LANES]);
            let c = c0 + gi * LANES;
            let rows = x[c..].chunks(cols).zip(dy[c..].chunks(cols));
            for ((xr, dyr), (&mu, &rs)) in rows.zip(stats.0.iter().zip(stats.1)) {
                let (xr, dyr) = (&xr[..LANES], &dyr[..LANES]);
                for l in 0..LANES {
                    aw[l] += dyr[l] * ((xr[l] - mu) * rs);
                    ab[l] += dyr[l];
                }
            }
            dw[gi * LANES..(gi + 1) * LANES].copy_from_slice(&aw);
            db[gi * LANES..(gi + 1) * LANES].copy_from_slice(&ab);
        }
        let done = groups * LANES;
        let width = dw.len() - done;
        let (dw, db) = (&mut dw[done..], &mut db[done..]);
        dw.fill(0.0);
        db.fill(0.0);
        for (r, (&mu, &rs)) in stats.0.iter().zip(stats.1).enumerate() {
            let xr = &x[r * cols + c0 + done..][..width];
            let dyr = &dy[r * cols + c0 + done..][..width];
            for (((w, b), &xv), &g) in dw.iter_mut().zip(db.iter_mut()).zip(xr).zip(dyr) {
                *w += g * ((xv - mu) * rs);
                *b += g;
            }
        }
    }
);
