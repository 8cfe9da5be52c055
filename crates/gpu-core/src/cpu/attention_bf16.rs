//! bf16 packed causal attention on the CPU: the reference of the CUDA kernels of
//! `kernels/nn_attention_bf16.cu` (`CudaBackend::causal_attention_packed_bf16_*`), computed in
//! f64 with the kernels' rounding points and plain loops (one sequence at a time).
//!
//! Layout (as the f32 packed ops): `qkv` `[b, t, 3c]` holds q, k, v as its three column blocks
//! (head `h` at columns `h·d..(h+1)·d` of each, `c = heads·d`), `out` and `dout` are
//! `[b, t, c]`, `lse` is f32 `[b·heads, t]` (natural log) and the gradient has `qkv`'s layout.
//!
//! Rounding points (everything else exact in f64):
//! - forward: `P_ij = bf16(exp(s_ij − m_i))` (m_i the row max of the scaled scores
//!   `s = scale·q·k`) is the operand of `P·V`; `l_i = Σ_j exp(s_ij − m_i)` is unrounded;
//!   `out_i = bf16(Σ_j P_ij v_j / l_i)`; `lse_i = f32(m_i + ln l_i)`.
//! - backward, from the given `out` and `lse`: `P_ij = exp(s_ij − lse_i)`,
//!   `dS_ij = P_ij·(dout_i·v_j − Σ_c dout_ic·out_ic)`; `dq_i = bf16(scale·Σ_j bf16(dS_ij)·k_j)`,
//!   `dk_j = bf16(scale·Σ_i bf16(dS_ij)·q_i)`, `dv_j = bf16(Σ_i bf16(P_ij)·dout_i)`.
//!
//! With attention dropout ([`AttnDropout`], factor `f_ij` = `1/(1 − p)` in f32 where kept,
//! else 0): the forward's operand is `bf16(exp(s_ij − m_i)·f_ij)` (l_i stays undropped); the
//! backward's `dS_ij = P_ij·(f_ij·dout_i·v_j − delta_i)` and `dv_j = bf16(Σ_i bf16(P_ij·f_ij)·dout_i)`.
//!
//! The kernels round P against their running row max rather than the final one and accumulate
//! in f32, so a P or dS entry may differ from this reference by one bf16 ulp; and they take P
//! from `ex2.approx.ftz`, which flushes a P below 2^-126 to 0 where this reference keeps the
//! subnormal. The tests bound both differences (`crates/gpu-cuda/tests/nn_attention_bf16.rs`).

use super::widen::bf16_rne;
use super::{CpuBackend, CpuStorage};
use crate::error::{GpuError, Result};
use crate::nn::attention::{check_dims, packed_lens, AttnDropout, Packed, PackedSaved};
use crate::ops::check_count as check_len;
use half::bf16;

/// The one head dimension the bf16 attention kernels support.
pub const HEAD_DIM_BF16: usize = 64;

/// The lengths of a bf16 packed call's buffers, `(qkv, out, lse)` = `(b·t·3c, b·t·c, b·heads·t)`,
/// after checking `p` and `scale`: `d` = [`HEAD_DIM_BF16`], `heads >= 1`, `t` and the sizes as
/// [`check_dims`], `scale` finite, and every size and row stride below 2^31 (the kernels'
/// 32-bit arithmetic). `qkv`, `out`, `dout` and the gradient are bf16, `lse` f32.
pub fn packed_bf16_lens(op: &'static str, p: Packed, scale: f32) -> Result<(usize, usize, usize)> {
    if p.d != HEAD_DIM_BF16 {
        return Err(GpuError::InvalidShape {
            op,
            reason: format!(
                "bf16 attention supports head dimension d = {HEAD_DIM_BF16} only, got d = {}",
                p.d
            ),
        });
    }
    if p.heads == 0 {
        return Err(GpuError::InvalidShape {
            op,
            reason: "at least one head".into(),
        });
    }
    check_dims(op, p.b.saturating_mul(p.heads), p.t, p.d)?;
    if !scale.is_finite() {
        return Err(GpuError::invalid(
            op,
            format!("scale must be finite, got {scale}"),
        ));
    }
    packed_lens(op, p)
}

/// Head `h` of block `blk` of batch `bi` of a `[b, t, w·c]` buffer, widened to f64 `[t, d]`.
fn gather(x: &[bf16], p: Packed, w: usize, blk: usize, (bi, h): (usize, usize)) -> Vec<f64> {
    let mut out = Vec::with_capacity(p.t * p.d);
    for i in 0..p.t {
        let at = (bi * p.t + i) * w * p.c() + blk * p.c() + h * p.d;
        out.extend(x[at..at + p.d].iter().map(|v| v.to_f64()));
    }
    out
}

/// The inverse of [`gather`], rounding `src` `[t, d]` to bf16 once.
fn scatter(src: &[f64], p: Packed, w: usize, blk: usize, (bi, h): (usize, usize), x: &mut [bf16]) {
    for (i, row) in src.chunks_exact(p.d).enumerate() {
        let at = (bi * p.t + i) * w * p.c() + blk * p.c() + h * p.d;
        for (dst, &v) in x[at..at + p.d].iter_mut().zip(row) {
            *dst = bf16_rne(v);
        }
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    let mut s = 0.0;
    for (x, y) in a.iter().zip(b) {
        s += x * y;
    }
    s
}

fn round(x: f64) -> f64 {
    bf16_rne(x).to_f64()
}

/// The dropout factor of entry `(i, j)` of sequence `s` (1 without dropout: `x·1` is exact).
fn factor(drop: Option<AttnDropout>, s: usize, (i, j, t): (usize, usize, usize)) -> f64 {
    drop.map_or(1.0, |d| d.factor(s, i, j, t) as f64)
}

/// Forward: `out` `[b, t, c]` (bf16) and `lse` `[b·heads, t]` (f32) from `qkv` `[b, t, 3c]`,
/// with the kernels' rounding points (see the module docs).
///
/// A call that is not a valid bf16 packed call ([`packed_bf16_lens`], or a wrong length) is a
/// typed error.
pub fn causal_attention_packed_bf16_fwd(
    qkv: &[bf16],
    p: Packed,
    scale: f32,
    drop: Option<AttnDropout>,
) -> Result<(Vec<bf16>, Vec<f32>)> {
    const OP: &str = "causal_attention_packed_bf16_fwd";
    let (e_qkv, e_out, e_lse) = packed_bf16_lens(OP, p, scale)?;
    let drop = AttnDropout::active(drop, OP)?;
    check_len(OP, "qkv", qkv.len(), e_qkv)?;
    let (t, d) = (p.t, p.d);
    let mut out = vec![bf16::ZERO; e_out];
    let mut lse = vec![0.0f32; e_lse];
    let scale = scale as f64;
    for bi in 0..p.b {
        for h in 0..p.heads {
            let seq = (bi, h);
            let [q, k, v] = [0, 1, 2].map(|blk| gather(qkv, p, 3, blk, seq));
            let mut o = vec![0.0f64; t * d];
            for i in 0..t {
                let qi = &q[i * d..][..d];
                let s: Vec<f64> = (0..=i).map(|j| scale * dot(qi, &k[j * d..][..d])).collect();
                let m = s.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
                let mut l = 0.0;
                let oi = &mut o[i * d..][..d];
                for (j, &sj) in s.iter().enumerate() {
                    let e = (sj - m).exp();
                    l += e;
                    let f = factor(drop, bi * p.heads + h, (i, j, t));
                    let pr = round(e * f);
                    for (acc, &vx) in oi.iter_mut().zip(&v[j * d..][..d]) {
                        *acc += pr * vx;
                    }
                }
                oi.iter_mut().for_each(|x| *x /= l);
                lse[(bi * p.heads + h) * t + i] = (m + l.ln()) as f32;
            }
            scatter(&o, p, 1, 0, seq, &mut out);
        }
    }
    Ok((out, lse))
}

/// Backward: the gradient `[b, t, 3c]` (dq, dk, dv in `qkv`'s layout, bf16) from `qkv`, the
/// forward's `out` and `lse`, and `dout` `[b, t, c]`, with the kernels' rounding points (see the
/// module docs).
///
/// A call that is not a valid bf16 packed call ([`packed_bf16_lens`], or a wrong length) is a
/// typed error.
pub fn causal_attention_packed_bf16_bwd(
    qkv: &[bf16],
    out: &[bf16],
    lse: &[f32],
    dout: &[bf16],
    p: Packed,
    scale: f32,
    drop: Option<AttnDropout>,
) -> Result<Vec<bf16>> {
    const OP: &str = "causal_attention_packed_bf16_bwd";
    let (e_qkv, e_out, e_lse) = packed_bf16_lens(OP, p, scale)?;
    let drop = AttnDropout::active(drop, OP)?;
    check_len(OP, "qkv", qkv.len(), e_qkv)?;
    check_len(OP, "out", out.len(), e_out)?;
    check_len(OP, "dout", dout.len(), e_out)?;
    check_len(OP, "lse", lse.len(), e_lse)?;
    let (t, d) = (p.t, p.d);
    let scale = scale as f64;
    let mut grad = vec![bf16::ZERO; e_qkv];
    for bi in 0..p.b {
        for h in 0..p.heads {
            let seq = (bi, h);
            let [q, k, v] = [0, 1, 2].map(|blk| gather(qkv, p, 3, blk, seq));
            let (o, g) = (gather(out, p, 1, 0, seq), gather(dout, p, 1, 0, seq));
            let (mut gq, mut gk, mut gv) = (vec![0.0; t * d], vec![0.0; t * d], vec![0.0; t * d]);
            for i in 0..t {
                let (qi, gi) = (&q[i * d..][..d], &g[i * d..][..d]);
                let li = lse[(bi * p.heads + h) * t + i] as f64;
                let delta = dot(gi, &o[i * d..][..d]);
                for j in 0..=i {
                    let (kj, vj) = (&k[j * d..][..d], &v[j * d..][..d]);
                    let pij = (scale * dot(qi, kj) - li).exp();
                    let f = factor(drop, bi * p.heads + h, (i, j, t));
                    let ds = round(pij * (dot(gi, vj) * f - delta));
                    let pr = round(pij * f);
                    for x in 0..d {
                        gq[i * d + x] += ds * kj[x];
                        gk[j * d + x] += ds * qi[x];
                        gv[j * d + x] += pr * gi[x];
                    }
                }
            }
            gq.iter_mut().chain(gk.iter_mut()).for_each(|x| *x *= scale);
            for (blk, src) in [&gq, &gk, &gv].into_iter().enumerate() {
                scatter(src, p, 3, blk, seq, &mut grad);
            }
        }
    }
    Ok(grad)
}

/// The same entry points as `CudaBackend::causal_attention_packed_bf16_*` (the same checks,
/// the same errors), computed by this module's reference.
impl CpuBackend {
    /// [`causal_attention_packed_bf16_fwd`] on backend buffers: `qkv` and `out` bf16, `lse` f32.
    pub fn causal_attention_packed_bf16_fwd(
        &self,
        qkv: &CpuStorage,
        out: &mut CpuStorage,
        lse: &mut CpuStorage,
        p: Packed,
        scale: f32,
        drop: Option<AttnDropout>,
    ) -> Result<()> {
        const OP: &str = "causal_attention_packed_bf16_fwd";
        let (e_qkv, e_out, e_lse) = packed_bf16_lens(OP, p, scale)?;
        let qkv = bf16_slice(OP, "qkv", qkv, e_qkv)?;
        let (o, l) = causal_attention_packed_bf16_fwd(qkv, p, scale, drop)?;
        match (out, lse) {
            (CpuStorage::BF16(out), CpuStorage::F32(lse))
                if out.len() == e_out && lse.len() == e_lse =>
            {
                out.copy_from_slice(&o);
                lse.copy_from_slice(&l);
                Ok(())
            }
            _ => Err(GpuError::invalid(
                OP,
                format!("out must be bf16 of {e_out} and lse f32 of {e_lse} elements"),
            )),
        }
    }
    /// [`causal_attention_packed_bf16_bwd`] on backend buffers: `dqkv` bf16 of `qkv`'s length.
    pub fn causal_attention_packed_bf16_bwd(
        &self,
        qkv: &CpuStorage,
        saved: PackedSaved<'_, CpuStorage>,
        dqkv: &mut CpuStorage,
        p: Packed,
        scale: f32,
        drop: Option<AttnDropout>,
    ) -> Result<()> {
        let PackedSaved { out, lse, dout } = saved;
        const OP: &str = "causal_attention_packed_bf16_bwd";
        let (e_qkv, e_out, e_lse) = packed_bf16_lens(OP, p, scale)?;
        let qkv = bf16_slice(OP, "qkv", qkv, e_qkv)?;
        let out = bf16_slice(OP, "out", out, e_out)?;
        let dout = bf16_slice(OP, "dout", dout, e_out)?;
        let lse = match lse {
            CpuStorage::F32(l) if l.len() == e_lse => l,
            _ => {
                return Err(GpuError::invalid(
                    OP,
                    format!("lse must be f32 of {e_lse} elements"),
                ))
            }
        };
        match dqkv {
            CpuStorage::BF16(g) if g.len() == e_qkv => {
                let r = causal_attention_packed_bf16_bwd(qkv, out, lse, dout, p, scale, drop)?;
                g.copy_from_slice(&r);
                Ok(())
            }
            _ => Err(GpuError::invalid(
                OP,
                format!("dqkv must be bf16 of {e_qkv} elements"),
            )),
        }
    }
}

/// The bf16 elements of `s`, which must hold `len` of them.
fn bf16_slice<'a>(
    op: &'static str,
    name: &str,
    s: &'a CpuStorage,
    len: usize,
) -> Result<&'a [half::bf16]> {
    match s {
        CpuStorage::BF16(v) if v.len() == len => Ok(v),
        _ => Err(GpuError::invalid(
            op,
            format!("{name} must be bf16 of {len} elements"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_rounds_to_bf16_once() {
        // Just above a bf16 tie (1 + 2^-8 + 2^-23): the nearest bf16 is 0x3f81; half's
        // `from_f64`, which this reference used before, gives 0x3f80.
        let x = f32::from_bits(0x3f80_8001) as f64;
        assert_eq!(round(x), bf16::from_bits(0x3f81).to_f64());
        let mut out = vec![bf16::ZERO; 192];
        let p = Packed {
            b: 1,
            t: 1,
            heads: 1,
            d: 64,
        };
        scatter(&[x; 64], p, 3, 0, (0, 0), &mut out);
        assert!(out[..64].iter().all(|v| v.to_bits() == 0x3f81));
    }

    #[test]
    fn one_row_is_the_value_row() {
        // t = 1: the softmax of one score is 1, so out = v and lse = s.
        let p = Packed {
            b: 1,
            t: 1,
            heads: 1,
            d: 64,
        };
        let qkv: Vec<bf16> = (0..192)
            .map(|i| bf16::from_f32((i % 7) as f32 * 0.25 - 0.5))
            .collect();
        let (out, lse) = causal_attention_packed_bf16_fwd(&qkv, p, 0.125, None).unwrap();
        assert_eq!(out, qkv[128..].to_vec());
        let s: f64 = (0..64)
            .map(|x| qkv[x].to_f64() * qkv[64 + x].to_f64())
            .sum::<f64>()
            * 0.125;
        assert_eq!(lse[0], s as f32);
        // One key: P = 1, dP − delta = dout·v − dout·out = 0, so dq = dk = 0 and dv = dout.
        let dout: Vec<bf16> = (0..64)
            .map(|i| bf16::from_f32(i as f32 / 32.0 - 1.0))
            .collect();
        let g = causal_attention_packed_bf16_bwd(&qkv, &out, &lse, &dout, p, 0.125, None).unwrap();
        assert!(g[..128].iter().all(|x| x.to_f32() == 0.0));
        assert_eq!(g[128..].to_vec(), dout);
    }

    #[test]
    fn other_head_dims_are_typed_errors() {
        let p = Packed {
            b: 1,
            t: 4,
            heads: 2,
            d: 32,
        };
        assert!(matches!(
            packed_bf16_lens("op", p, 1.0),
            Err(GpuError::InvalidShape { .. })
        ));
        let p = Packed { d: 64, ..p };
        assert_eq!(
            packed_bf16_lens("op", p, 1.0).unwrap(),
            (4 * 384, 4 * 128, 8)
        );
        assert!(packed_bf16_lens("op", Packed { heads: 0, ..p }, 1.0).is_err());
        assert!(packed_bf16_lens("op", p, f32::NAN).is_err());
    }
}
