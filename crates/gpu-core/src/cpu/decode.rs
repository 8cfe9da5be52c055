//! The decode family on the CPU: the reference of `kernels/nn_decode.cu`. Rotation angles are
//! f32 products (as on CUDA and in `transformers`); their sines and cosines, the scores, the
//! softmax and the weighted sums are f64, rounded once where a value is stored.

use super::widen::bf16_rne;
use super::CpuStorage;
use crate::error::{GpuError, Result};
use crate::nn::decode::{
    check_add_rms_norm, check_argmax, check_cache_attention, check_prefill_attention,
    check_rope_append, check_swiglu_packed, CacheAttnIn, DecodeDims, DecodeOps, PrefillIn,
    RopeAppendIn, RopeAppendOut,
};
use crate::nn::Activation;
use crate::CpuBackend;
use half::bf16;
use rayon::prelude::*;

/// Read access to an f32 or bf16 buffer.
#[derive(Clone, Copy)]
enum Floats<'a> {
    F32(&'a [f32]),
    Bf16(&'a [bf16]),
}

impl<'a> Floats<'a> {
    fn of(op: &'static str, s: &'a CpuStorage) -> Result<Self> {
        match s {
            CpuStorage::F32(v) => Ok(Floats::F32(v)),
            CpuStorage::BF16(v) => Ok(Floats::Bf16(v)),
            other => Err(unsupported(op, other)),
        }
    }

    fn get(&self, i: usize) -> f64 {
        match self {
            Floats::F32(v) => v[i] as f64,
            Floats::Bf16(v) => v[i].to_f64(),
        }
    }
}

/// Write access to an f32 or bf16 buffer: a stored value is rounded once.
enum FloatsMut<'a> {
    F32(&'a mut [f32]),
    Bf16(&'a mut [bf16]),
}

impl<'a> FloatsMut<'a> {
    fn of(op: &'static str, s: &'a mut CpuStorage) -> Result<Self> {
        match s {
            CpuStorage::F32(v) => Ok(FloatsMut::F32(v)),
            CpuStorage::BF16(v) => Ok(FloatsMut::Bf16(v)),
            other => Err(unsupported(op, other)),
        }
    }

    fn set(&mut self, i: usize, x: f64) {
        match self {
            FloatsMut::F32(v) => v[i] = x as f32, // rounds to nearest even
            FloatsMut::Bf16(v) => v[i] = bf16_rne(x),
        }
    }
}

fn unsupported(op: &'static str, s: &CpuStorage) -> GpuError {
    GpuError::UnsupportedDType {
        op,
        dtype: crate::backend::BufferInfo::dtype(s),
        backend: "cpu (f32 and bf16 only)",
    }
}

/// Checks that every new token's slot lies in the cache (CUDA skips such writes silently; the
/// CPU, which can report it, refuses the call before touching anything).
fn check_slots(op: &'static str, slot: &[u32], dims: DecodeDims) -> Result<()> {
    match slot.iter().find(|&&s| s as usize + dims.t > dims.cap) {
        Some(s) => Err(GpuError::invalid(
            op,
            format!(
                "{} new tokens from slot {s} do not fit a cache of {} slots",
                dims.t, dims.cap
            ),
        )),
        None => Ok(()),
    }
}

impl DecodeOps for CpuBackend {
    fn rope_append(
        &self,
        x: RopeAppendIn<'_, CpuStorage>,
        out: RopeAppendOut<'_, CpuStorage>,
    ) -> Result<()> {
        const OP: &str = "rope_append";
        check_rope_append(x, &out)?;
        let dims = x.dims;
        let (start, slot, freq) = (x.start.as_u32()?, x.slot.as_u32()?, x.inv_freq.as_f32()?);
        check_slots(OP, slot, dims)?;
        let qkv = Floats::of(OP, x.qkv)?;
        let (mut q_out, mut kc, mut vc) = (
            FloatsMut::of(OP, out.q_out)?,
            FloatsMut::of(OP, out.k_cache)?,
            FloatsMut::of(OP, out.v_cache)?,
        );
        let DecodeDims {
            t,
            heads,
            kv_heads,
            d,
            cap,
            ..
        } = dims;
        let half = d / 2;
        for r in 0..dims.b {
            for i in 0..t {
                let s = slot[r] as usize + i;
                let pos = s.saturating_sub(start[r] as usize);
                // The angles as f32 products (as on CUDA and in transformers), then f64.
                let (sin, cos): (Vec<f64>, Vec<f64>) = (0..half)
                    .map(|j| match freq.get(j) {
                        Some(&f) => ((pos as f32) * f) as f64,
                        None => 0.0,
                    })
                    .map(|a| a.sin_cos())
                    .unzip();
                let row = (r * t + i) * dims.qkv_cols();
                let rotate = |base: usize, j: usize| {
                    let (x0, x1) = (qkv.get(base + j), qkv.get(base + j + half));
                    (x0 * cos[j] - x1 * sin[j], x1 * cos[j] + x0 * sin[j])
                };
                for h in 0..heads {
                    let (src, dst) = (row + h * d, ((r * t + i) * heads + h) * d);
                    for j in 0..half {
                        let (a, b) = rotate(src, j);
                        q_out.set(dst + j, a);
                        q_out.set(dst + j + half, b);
                    }
                }
                for g in 0..kv_heads {
                    let k_src = row + (heads + g) * d;
                    let v_src = row + (heads + kv_heads + g) * d;
                    let dst = ((r * kv_heads + g) * cap + s) * d;
                    for j in 0..half {
                        let (a, b) = rotate(k_src, j);
                        kc.set(dst + j, a);
                        kc.set(dst + j + half, b);
                    }
                    for j in 0..d {
                        vc.set(dst + j, qkv.get(v_src + j));
                    }
                }
            }
        }
        Ok(())
    }

    fn cache_attention(&self, x: CacheAttnIn<'_, CpuStorage>, out: &mut CpuStorage) -> Result<()> {
        const OP: &str = "cache_attention";
        check_cache_attention(x, out)?;
        let (dims, max_end) = (x.dims, x.max_end);
        let (start, slot) = (x.start.as_u32()?, x.slot.as_u32()?);
        if let Some(&s) = slot.iter().find(|&&s| s as usize + dims.t > max_end) {
            return Err(GpuError::invalid(
                OP,
                format!("slot {s} + {} new tokens is past max_end {max_end}", dims.t),
            ));
        }
        let kv = (x.q, x.k_cache, x.v_cache);
        attend(OP, kv, (start, slot), out, dims, x.scale)
    }

    fn prefill_attention(&self, x: PrefillIn<'_, CpuStorage>, out: &mut CpuStorage) -> Result<()> {
        const OP: &str = "prefill_attention";
        check_prefill_attention(x, out)?;
        let slot = vec![0u32; x.dims.b];
        let kv = (x.q, x.k_cache, x.v_cache);
        attend(OP, kv, (x.start.as_u32()?, &slot), out, x.dims, x.scale)
    }

    fn add_rms_norm(
        &self,
        (x, y, w): (&CpuStorage, Option<&CpuStorage>, &CpuStorage),
        (sum, normed): (&mut CpuStorage, &mut CpuStorage),
        cols: usize,
        eps: f32,
    ) -> Result<()> {
        const OP: &str = "add_rms_norm";
        check_add_rms_norm(x, y, w, sum, normed, cols, eps)?;
        let (x, w) = (x.as_f32()?, w.as_f32()?);
        let y = y.map(|y| Floats::of(OP, y)).transpose()?;
        // The f32 sums, then the norm of each row in f64, rounded once.
        let s: Vec<f32> = (0..x.len())
            .map(|e| y.map_or(x[e], |y| (x[e] as f64 + y.get(e)) as f32))
            .collect();
        let mut out = FloatsMut::of(OP, normed)?;
        for (r, row) in s.chunks_exact(cols).enumerate() {
            let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / cols as f64;
            let rstd = 1.0 / (ms + eps as f64).sqrt();
            for (c, &v) in row.iter().enumerate() {
                out.set(r * cols + c, v as f64 * rstd * w[c] as f64);
            }
        }
        let CpuStorage::F32(sum) = sum else {
            return Err(unsupported(OP, sum));
        };
        sum.copy_from_slice(&s);
        Ok(())
    }

    fn swiglu_packed(&self, gu: &CpuStorage, out: &mut CpuStorage, i: usize) -> Result<()> {
        const OP: &str = "swiglu_packed";
        let rows = check_swiglu_packed(gu, out, i)?;
        let gu = Floats::of(OP, gu)?;
        let mut out = FloatsMut::of(OP, out)?;
        for r in 0..rows {
            for j in 0..i {
                let (g, u) = (gu.get(r * 2 * i + j), gu.get(r * 2 * i + i + j));
                out.set(r * i + j, Activation::Silu.eval(g) * u);
            }
        }
        Ok(())
    }
}

impl CpuBackend {
    pub(crate) fn argmax_rows_impl(
        &self,
        x: &CpuStorage,
        out: &mut CpuStorage,
        cols: usize,
    ) -> Result<()> {
        const OP: &str = "argmax_rows";
        check_argmax(x, out, cols)?;
        let x = Floats::of(OP, x)?;
        let CpuStorage::U32(out) = out else {
            return Err(unsupported(OP, out));
        };
        for (r, o) in out.iter_mut().enumerate() {
            let mut best = r * cols;
            for i in r * cols + 1..(r + 1) * cols {
                let (v, b) = (x.get(i), x.get(best));
                if !b.is_nan() && (v > b || v.is_nan()) {
                    best = i;
                }
            }
            *o = (best - r * cols) as u32;
        }
        Ok(())
    }
}

/// Causal attention of the queries against the cache (`DecodeOps::cache_attention`, checked),
/// in f64, with the rows' positions on the host; a sliding window's hidden slots are not read.
fn attend(
    op: &'static str,
    (q, k_cache, v_cache): (&CpuStorage, &CpuStorage, &CpuStorage),
    (start, slot): (&[u32], &[u32]),
    out: &mut CpuStorage,
    dims: DecodeDims,
    scale: f32,
) -> Result<()> {
    let (q, kc, vc) = (
        Floats::of(op, q)?,
        Floats::of(op, k_cache)?,
        Floats::of(op, v_cache)?,
    );
    let DecodeDims {
        t,
        heads,
        kv_heads,
        d,
        cap,
        ..
    } = dims;
    let group = heads / kv_heads;
    // One output row (a query head) per task, each computed as the sequential loop would.
    let rows: Vec<Vec<f64>> = (0..dims.b * t * heads)
        .into_par_iter()
        .map(|idx| {
            let (r, i, h) = (idx / (t * heads), idx / heads % t, idx % heads);
            let s = slot[r] as usize + i;
            let base = (r * kv_heads + h / group) * cap;
            let qrow = idx * d;
            let keys = dims.first_visible(start[r] as usize, s)..s + 1;
            let scores: Vec<f64> = keys
                .clone()
                .map(|j| {
                    let k = (base + j) * d;
                    (0..d).map(|e| q.get(qrow + e) * kc.get(k + e)).sum::<f64>() * scale as f64
                })
                .collect();
            let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|&x| (x - m).exp()).collect();
            let l: f64 = w.iter().sum();
            let mut acc = vec![0f64; d];
            for (j, wj) in keys.zip(&w) {
                let v = (base + j) * d;
                for (e, a) in acc.iter_mut().enumerate() {
                    *a += wj * vc.get(v + e);
                }
            }
            if l > 0.0 {
                acc.iter_mut().for_each(|a| *a /= l);
            }
            acc
        })
        .collect();
    let mut out = FloatsMut::of(op, out)?;
    for (idx, row) in rows.iter().enumerate() {
        for (e, &x) in row.iter().enumerate() {
            out.set(idx * d + e, x);
        }
    }
    Ok(())
}
