//! Sampling the next token on the device: one op that turns each row of logits into a token
//! id (repetition penalty, temperature, top-k, top-p, a seeded draw), so a decode step can stay
//! inside a CUDA graph and copy only the chosen ids to the host.
//!
//! The op's arithmetic is specified exactly here, so that the CPU reference and the kernel
//! (`kernels/nn_sample.cu`) give the same token, bit for bit:
//! - weights are fixed-point integers, `W = ⌊w·2^40⌋` for `w = exp(z − max z) ∈ [0, 1]`
//!   computed in f32 by [`weight`] (a fixed sequence of IEEE operations, the same bits on both),
//!   so every sum is an exact u64 and its order does not matter;
//! - the draw is Philox4x32-10 ([`philox4x32_10`]) keyed by the seed, at the counter
//!   `(counter[r] + offset, r, 0, 0)`, and picks the kept token whose cumulative interval (in
//!   index order) holds `⌊R·Z/2^64⌋`, `R` the draw's first 64 bits and `Z` the kept weight.

use crate::backend::BufferInfo;
use crate::error::{GpuError, Result};
use crate::nn::defaults::host as H;
use crate::nn::primitives::Primitives;
use crate::nn::rows::{check_len, require_u32};
use crate::ops::require_float;

/// One in the fixed-point weights: `W = ⌊w · 2^40⌋`.
pub const WEIGHT_ONE: u64 = 1 << 40;

/// The longest row [`SampleOps::sample_rows`] takes.
pub const MAX_VOCAB: usize = 1 << 23;

/// The settings of [`SampleOps::sample_rows`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleParams {
    /// 0: greedy (the first maximum of the penalized logits); else a finite value > 0.
    pub temperature: f32,
    /// Keep the tokens with fewer than `top_k` larger logits (ties at the k-th value all stay);
    /// 0 keeps all.
    pub top_k: u32,
    /// In `(0, 1]`: keep the tokens whose more likely tokens (among top-k's) hold less than
    /// `top_p` of the mass; 1 keeps all.
    pub top_p: f32,
    /// `transformers`' repetition penalty, finite and > 0 (1: none): a seen token's logit is
    /// divided by it when positive, multiplied by it when negative.
    pub penalty: f32,
    pub seed: u64,
    /// Added to each row's counter (the draw's position).
    pub offset: u32,
}

impl SampleParams {
    /// Checks the ranges above.
    pub fn check(&self) -> Result<()> {
        let bad = |reason: String| Err(GpuError::invalid("sample_rows", reason));
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad(format!(
                "temperature {} (needs a finite value >= 0)",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!("top-p {} (needs 0 < p <= 1)", self.top_p));
        }
        if !(self.penalty.is_finite() && self.penalty > 0.0) {
            return bad(format!(
                "repetition penalty {} (needs a finite value > 0)",
                self.penalty
            ));
        }
        if !(1.0 / self.penalty).is_finite()
            || (self.temperature > 0.0 && !(1.0 / self.temperature).is_finite())
        {
            return bad(format!(
                "temperature {} and penalty {} must have finite reciprocals",
                self.temperature, self.penalty
            ));
        }
        Ok(())
    }

    /// `1/temperature` (0 at temperature 0) and `1/penalty`, rounded to f32: the factors
    /// [`SampleParams::z`] multiplies by (the kernel gets them as arguments).
    pub fn reciprocals(&self) -> (f32, f32) {
        let t = if self.temperature > 0.0 {
            1.0 / self.temperature
        } else {
            0.0
        };
        (t, 1.0 / self.penalty)
    }

    /// The penalized, tempered logit `z` of a logit `l` (`seen`: the row has had the token):
    /// `l · (1/penalty)` when seen and `l > 0`, `l · penalty` when seen otherwise, then
    /// `· (1/temperature)` unless greedy; f32 products of the f32 [`SampleParams::reciprocals`].
    pub fn z(&self, l: f32, seen: bool) -> f32 {
        let (inv_t, inv_p) = self.reciprocals();
        let v = match (seen, l > 0.0) {
            (false, _) => l,
            (true, true) => l * inv_p,
            (true, false) => l * self.penalty,
        };
        if self.temperature > 0.0 {
            v * inv_t
        } else {
            v
        }
    }
}

/// The buffers and row width of [`SampleOps::sample_rows`].
#[derive(Debug)]
pub struct SampleRows<'a, Buf> {
    /// The logits `[rows, vocab]` (f32 or bf16).
    pub logits: &'a Buf,
    /// Each row's mask of the tokens it has produced or was prompted with (u32
    /// `[rows, ⌈vocab/32⌉]`), updated.
    pub seen: &'a mut Buf,
    /// Each row's draw counter (u32 `[rows]`).
    pub counter: &'a Buf,
    /// Each row's token (u32 `[rows]`), written.
    pub out: &'a mut Buf,
    /// The logits of a row.
    pub vocab: usize,
}

impl<'a, Buf> SampleRows<'a, Buf> {
    /// The arguments of a call, in the order of the fields.
    pub fn new(
        logits: &'a Buf,
        seen: &'a mut Buf,
        counter: &'a Buf,
        out: &'a mut Buf,
        vocab: usize,
    ) -> Self {
        Self {
            logits,
            seen,
            counter,
            out,
            vocab,
        }
    }
}

/// Token sampling.
pub trait SampleOps: Primitives {
    /// For each row `r` of `logits` `[rows, vocab]` (f32 or bf16), writes a token id to
    /// `out[r]` (u32) and marks it in `seen` (u32 `[rows, ⌈vocab/32⌉]`, bit `i % 32` of word
    /// `i / 32`: the tokens the row has produced or was prompted with). Row by row:
    /// 1. `z_i` = [`SampleParams::z`] of `l_i` (penalized if seen, then tempered);
    /// 2. a row with a NaN or +∞ logit, or whose largest `z` is not finite (only −∞ logits, or
    ///    an overflow of the penalty or temperature), gets `out[r] = vocab` (no token; the
    ///    caller reports it) and `seen` stays; at temperature 0 the token is the first maximum
    ///    of `z`;
    /// 3. `W_i = ⌊exp(z_i − max z)·2^40⌋` with the `exp` rounded to f32 (CUDA's `expf`, within
    ///    2 ulp; the CPU reference rounds the f64 `exp`);
    /// 4. top-k keeps `S`, the tokens with fewer than `top_k` strictly larger `z` (compared by
    ///    [`order_key`]: −0 below +0);
    /// 5. top-p keeps the tokens `i ∈ S` whose mass above, `A_i = Σ W_j` over `j ∈ S` with
    ///    `z_j > z_i`, is below `max(1, ⌊top_p · Z_S⌋)` (f64 product, `Z_S = Σ_S W`);
    /// 6. with `K = Σ W` over the kept tokens and `R` the first 64 bits of Philox
    ///    ([`draw`]), the token is the kept `i` with `C_i ≤ ⌊R·K/2^64⌋ < C_i + W_i`, `C_i` the
    ///    kept weight before `i` in index order.
    fn sample_rows(&self, x: SampleRows<'_, Self::Buffer>, params: SampleParams) -> Result<()> {
        let [logits, counter] = &H::downs_n(self, [x.logits, x.counter])?;
        let (mut s, mut o) = (H::down(self, x.seen)?, H::down(self, x.out)?);
        let host = SampleRows::new(logits, &mut s, counter, &mut o, x.vocab);
        crate::CpuBackend.sample_rows(host, params)?;
        H::up(self, &s, x.seen)?;
        H::up(self, &o, x.out)
    }
}

/// Words of a row of the `seen` bitmask.
pub fn seen_words(vocab: usize) -> usize {
    vocab.div_ceil(32)
}

/// Checks the arguments of [`SampleOps::sample_rows`]; returns the number of rows.
pub fn check_sample<B: BufferInfo>(x: &SampleRows<'_, B>, params: &SampleParams) -> Result<usize> {
    const OP: &str = "sample_rows";
    let (logits, seen, counter, out, vocab) = (x.logits, &*x.seen, x.counter, &*x.out, x.vocab);
    params.check()?;
    require_float(OP, logits.dtype())?;
    for b in [seen, counter, out] {
        require_u32(OP, b.dtype())?;
    }
    // Fixed-point sums of up to 2^23 weights of at most 2^40 stay below 2^63.
    if vocab == 0 || vocab > MAX_VOCAB {
        return Err(GpuError::invalid(
            OP,
            format!("a row must have 1..={MAX_VOCAB} logits, got {vocab}"),
        ));
    }
    let rows = crate::ops::whole_rows(OP, logits.len(), vocab, || {
        format!("rows of {vocab} logits")
    })?;
    check_len(OP, "seen", seen, rows * seen_words(vocab))?;
    check_len(OP, "counter", counter, rows)?;
    check_len(OP, "out", out, rows)?;
    Ok(rows)
}

/// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011):
/// ten rounds on a 128-bit counter under a 64-bit key, as cuRAND and PyTorch use it.
pub fn philox4x32_10(mut c: [u32; 4], mut k: [u32; 2]) -> [u32; 4] {
    const M0: u64 = 0xD251_1F53;
    const M1: u64 = 0xCD9E_8D57;
    for round in 0..10 {
        if round > 0 {
            k[0] = k[0].wrapping_add(0x9E37_79B9);
            k[1] = k[1].wrapping_add(0xBB67_AE85);
        }
        let p0 = M0 * c[0] as u64;
        let p1 = M1 * c[2] as u64;
        c = [
            (p1 >> 32) as u32 ^ c[1] ^ k[0],
            p1 as u32,
            (p0 >> 32) as u32 ^ c[3] ^ k[1],
            p0 as u32,
        ];
    }
    c
}

/// The 64 random bits of row `r` at counter `n`: Philox's first two words, high then low.
pub fn draw(seed: u64, n: u32, r: u32) -> u64 {
    let o = philox4x32_10([n, r, 0, 0], [seed as u32, (seed >> 32) as u32]);
    ((o[0] as u64) << 32) | o[1] as u64
}

/// A u32 whose unsigned order is the order of the (non-NaN) floats: the sign bit flipped for
/// positives, every bit for negatives (−0 sorts just below +0).
pub fn order_key(v: f32) -> u32 {
    let b = v.to_bits();
    if b >> 31 == 1 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// `W = ⌊exp(x)·2^40⌋` for `x ≤ 0` (a logit minus the row's maximum), as the kernel computes
/// it: `y = x·log2(e)` (f32), `n = round(y)`, `f = y − n` (exact), `2^f` by the degree-7 Taylor
/// polynomial of `e^{f·ln 2}` in Horner form with fused multiply-adds (truncation below 6e-9
/// for `|f| ≤ 1/2`), scaled by `2^(n+40)` and floored (a shift of its significand); 0 when
/// `y < −41` (then `W < 1`). Relative error
/// below 3e-6: `y`'s rounding (half an ulp of 41, 1.9e-6, times ln 2), `log2(e)`'s (1.3e-8
/// times 41 times ln 2) and the polynomial's few f32 roundings. The same bits on every IEEE
/// machine.
pub fn weight(x: f32) -> u64 {
    // ln(2)^k / k! rounded to f32, as bits (the kernel's constants).
    const C: [u32; 8] = [
        0x3f80_0000,
        0x3f31_7218,
        0x3e75_fdf0,
        0x3d63_5847,
        0x3c1d_955b,
        0x3aae_c3ff,
        0x3921_8489,
        0x377f_e5fe,
    ];
    let y = x * f32::from_bits(0x3fb8_aa3b); // log2(e)
    if y.is_nan() || y < -41.0 {
        return 0;
    }
    let n = y.round_ties_even();
    let f = y - n;
    let mut p = f32::from_bits(C[7]);
    for c in C[..7].iter().rev() {
        p = p.mul_add(f, f32::from_bits(*c));
    }
    // ⌊p·2^(n+40)⌋ from p's 24-bit significand m (p = m·2^(e−23), p in [0.7, 1]): a shift.
    let b = p.to_bits();
    let m = ((b & 0x7f_ffff) | 0x80_0000) as u64;
    let shift = ((b >> 23) & 0xff) as i32 - 127 - 23 + n as i32 + 40;
    match shift {
        0.. => m << shift,
        -63..0 => m >> -shift,
        _ => 0,
    }
}

/// `⌊R·K / 2^64⌋`: where in the kept weight `K` the draw `R` lands.
pub fn draw_target(r: u64, k: u64) -> u64 {
    ((r as u128 * k as u128) >> 64) as u64
}

/// The top-p cut of a kept weight `z`: `max(1, ⌊p·z⌋)` in f64.
pub fn top_p_cut(p: f32, z: u64) -> u64 {
    ((p as f64 * z as f64) as u64).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_matches_the_published_known_answers() {
        // Random123's kat_vectors for philox4x32_10.
        assert_eq!(
            philox4x32_10([0; 4], [0; 2]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0]
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    #[test]
    fn order_key_sorts_like_the_floats() {
        let v = [
            f32::NEG_INFINITY,
            -3.5,
            -1e-40,
            -0.0,
            0.0,
            1e-40,
            1.0,
            f32::MAX,
            f32::INFINITY,
        ];
        for w in v.windows(2) {
            assert!(order_key(w[0]) < order_key(w[1]), "{} {}", w[0], w[1]);
        }
    }

    #[test]
    fn draw_target_stays_below_the_weight() {
        assert_eq!(draw_target(u64::MAX, 7), 6);
        assert_eq!(draw_target(0, 7), 0);
        assert_eq!(draw_target(1 << 63, 10), 5);
        assert_eq!(top_p_cut(1e-30, 1 << 40), 1);
    }

    #[test]
    fn weight_is_exp_in_fixed_point() {
        assert_eq!(weight(0.0), WEIGHT_ONE);
        assert_eq!(weight(f32::NEG_INFINITY), 0);
        assert_eq!(weight(-40.0), 0);
        for i in 0..2000 {
            let x = -(i as f32) * 0.013_7;
            let want = (x as f64).exp() * WEIGHT_ONE as f64;
            let got = weight(x) as f64;
            // 3e-6 relative (`weight`'s doc) and the floor's 1.
            assert!(
                (got - want).abs() <= 3e-6 * want + 1.0,
                "{x}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn bad_settings_are_refused() {
        let ok = crate::testing::PLAIN_SAMPLING;
        assert!(ok.check().is_ok());
        for p in [
            SampleParams {
                temperature: f32::NAN,
                ..ok
            },
            SampleParams {
                temperature: -1.0,
                ..ok
            },
            SampleParams { top_p: 0.0, ..ok },
            SampleParams { top_p: 1.5, ..ok },
            SampleParams { penalty: 0.0, ..ok },
            SampleParams {
                penalty: f32::INFINITY,
                ..ok
            },
        ] {
            assert!(p.check().is_err(), "{p:?}");
        }
    }
}
