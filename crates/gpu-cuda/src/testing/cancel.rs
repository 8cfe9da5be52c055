//! The size of the terms that cancel in a gradient, computed in f64 from the inputs: the scale
//! against which an f32 kernel's rounding error is bounded.
//!
//! An f32 sum of m terms has error at most m·u·Σ|terms| (u = 2^-24 ≈ 6e-8), and every product
//! or exp/log adds a few u relative to its own size. For each gradient element `T` below is
//! Σ|terms| along the whole computation (each cancelling difference replaced by the sum of the
//! magnitudes it subtracts). The longest accumulations here are head width + keys: ≤ ~100 terms
//! in the tensor-level proptest (6e-6·T), ≤ ~430 in the attention kernel tests (head width 128,
//! 300 keys: 2.6e-5·T). [`check`] allows 1e-4·T:
//! rounding passes with margin on any input, while a wrong index, mask or formula is O(T).

/// Asserts `|gpu − cpu| <= 1e-4·T + 1e-7·max T` elementwise (no NaN).
pub fn check(what: &str, gpu: &[f32], cpu: &[f32], terms: &[f64]) {
    assert_eq!(gpu.len(), cpu.len(), "{what}: length");
    assert_eq!(gpu.len(), terms.len(), "{what}: terms length");
    let tmax = terms.iter().fold(0.0f64, |m, &t| m.max(t));
    for (i, ((&g, &c), &t)) in gpu.iter().zip(cpu).zip(terms).enumerate() {
        let d = (g as f64 - c as f64).abs();
        assert!(
            d <= 1e-4 * t + 1e-7 * tmax,
            "{what}[{i}]: gpu {g}, cpu {c}, diff {d:e} > 1e-4·{t:e} (terms) + 1e-7·{tmax:e}"
        );
    }
}

/// Terms of causal attention's `[dq, dk, dv]` for q, k, v, dout of shape `[n, t, d]` and
/// score scale `scale`. With P = softmax(scale·q·kᵀ) (row i over keys j ≤ i, lse_i its log-sum-exp),
/// dS_ij = P_ij·(dP_ij − D_i), dP_ij = dout_i·v_j, D_i = dout_i·out_i: each |dS_ij| is bounded
/// by P_ij·(Σ|dout_i∘v_j| + Σ|dout_i∘out_i|)·(1 + |scale·s_ij| + |lse_i|) (the last factor is
/// P's own error from exp(scale·s − lse)), and dq_i = scale·Σ_j dS_ij k_j,
/// dk_j = scale·Σ_i dS_ij q_i, dv_j = Σ_i P_ij dout_i.
pub fn attention(
    (q, k, v, dout): (&[f32], &[f32], &[f32], &[f32]),
    [n, t, d]: [usize; 3],
    scale: f64,
) -> [Vec<f64>; 3] {
    let at = |x: &[f32], s: usize, i: usize, c: usize| x[(s * t + i) * d + c] as f64;
    let mut tq = vec![0.0; n * t * d];
    let mut tk = vec![0.0; n * t * d];
    let mut tv = vec![0.0; n * t * d];
    for s in 0..n {
        for i in 0..t {
            let sc: Vec<f64> = (0..=i)
                .map(|j| scale * (0..d).map(|c| at(q, s, i, c) * at(k, s, j, c)).sum::<f64>())
                .collect();
            let m = sc.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
            let lse = m + sc.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
            let p: Vec<f64> = sc.iter().map(|x| (x - lse).exp()).collect();
            let out: Vec<f64> = (0..d)
                .map(|c| (0..=i).map(|j| p[j] * at(v, s, j, c)).sum())
                .collect();
            let dabs: f64 = (0..d).map(|c| (at(dout, s, i, c) * out[c]).abs()).sum();
            for j in 0..=i {
                let dpabs: f64 = (0..d)
                    .map(|c| (at(dout, s, i, c) * at(v, s, j, c)).abs())
                    .sum();
                let pe = p[j] * (1.0 + sc[j].abs() + lse.abs());
                let ds = pe * (dpabs + dabs);
                for c in 0..d {
                    tq[(s * t + i) * d + c] += scale * ds * at(k, s, j, c).abs();
                    tk[(s * t + j) * d + c] += scale * ds * at(q, s, i, c).abs();
                    tv[(s * t + j) * d + c] += pe * at(dout, s, i, c).abs();
                }
            }
        }
    }
    [tq, tk, tv]
}

/// Terms of LayerNorm's (`bias`) or RMSNorm's `[dx, dw(, db)]` over rows of width `cols`, eps
/// 1e-5. With x̂ = (x − μ)·rstd (RMSNorm: μ = 0) and g = dy∘w, dx = rstd·(g − mean(g) −
/// x̂·mean(g∘x̂)) (RMSNorm without mean(g)); x̂'s own error is relative to (|x| + |μ|)·rstd, which
/// stands for |x̂| below. dw = Σ_rows dy∘x̂, db = Σ_rows dy.
pub fn norm(x: &[f32], w: &[f32], dy: &[f32], cols: usize, layer: bool) -> Vec<Vec<f64>> {
    let rows = x.len() / cols;
    let mut tdx = vec![0.0; x.len()];
    let (mut tdw, mut tdb) = (vec![0.0; cols], vec![0.0; cols]);
    for r in 0..rows {
        let xr: Vec<f64> = x[r * cols..][..cols].iter().map(|&v| v as f64).collect();
        let mu = if layer {
            xr.iter().sum::<f64>() / cols as f64
        } else {
            0.0
        };
        let var = xr.iter().map(|v| (v - mu).powi(2)).sum::<f64>() / cols as f64;
        let rstd = 1.0 / (var + 1e-5).sqrt();
        let xh: Vec<f64> = xr.iter().map(|v| (v.abs() + mu.abs()) * rstd).collect();
        let g: Vec<f64> = (0..cols)
            .map(|c| (dy[r * cols + c] * w[c]).abs() as f64)
            .collect();
        let mg = if layer {
            g.iter().sum::<f64>() / cols as f64
        } else {
            0.0
        };
        let mgx = (0..cols).map(|c| g[c] * xh[c]).sum::<f64>() / cols as f64;
        for c in 0..cols {
            tdx[r * cols + c] = rstd * (g[c] + mg + xh[c] * mgx);
            tdw[c] += (dy[r * cols + c] as f64).abs() * xh[c];
            tdb[c] += (dy[r * cols + c] as f64).abs();
        }
    }
    if layer {
        vec![tdx, tdw, tdb]
    } else {
        vec![tdx, tdw]
    }
}
