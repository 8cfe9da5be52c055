//! Choosing the next token from a row of logits, in `transformers`' order: repetition
//! penalty, temperature, top-k, top-p; greedy (the first maximum, as `argmax`) at temperature 0.
//! Seeded: the same settings and seed give the same tokens.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::{LogitsAt, ModelError};

/// Sampling settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// 0 for greedy decoding.
    pub temperature: f32,
    /// Keep the `k` most likely tokens (`None`: all).
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose probability reaches `p` (1: all).
    pub top_p: f32,
    /// `transformers`' repetition penalty (1: none): a seen token's logit is divided by it when
    /// positive, multiplied when negative.
    pub repetition_penalty: f32,
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 0.0,
            top_k: None,
            top_p: 1.0,
            repetition_penalty: 1.0,
            seed: 0,
        }
    }
}

/// A seeded sampler.
pub struct Sampler {
    s: Sampling,
    rng: StdRng,
}

impl Sampler {
    /// Checks the settings: a finite temperature ≥ 0, top-k ≥ 1, top-p in (0, 1], a finite
    /// penalty > 0.
    pub fn new(s: Sampling) -> Result<Self, ModelError> {
        let bad = |m: String| Err(ModelError::BadSampling(m));
        if !(s.temperature.is_finite() && s.temperature >= 0.0) {
            return bad(format!(
                "temperature {} (needs a finite value >= 0)",
                s.temperature
            ));
        }
        if s.top_k == Some(0) {
            return bad("top-k 0 (needs at least 1)".into());
        }
        if !(s.top_p > 0.0 && s.top_p <= 1.0) {
            return bad(format!("top-p {} (needs 0 < p <= 1)", s.top_p));
        }
        if !(s.repetition_penalty.is_finite() && s.repetition_penalty > 0.0) {
            return bad(format!(
                "repetition penalty {} (needs a finite value > 0)",
                s.repetition_penalty
            ));
        }
        Ok(Sampler {
            s,
            rng: StdRng::seed_from_u64(s.seed),
        })
    }

    /// The next token of `logits` (one row of the vocabulary), after `history`. A row with no
    /// token to choose ([`usable`]) is [`ModelError::NonFiniteLogits`].
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> Result<u32, ModelError> {
        if logits.is_empty() {
            return Err(ModelError::BadSampling("no logits".into()));
        }
        if !usable(logits) {
            return Err(ModelError::NonFiniteLogits(LogitsAt::Row));
        }
        let mut l = logits.to_vec();
        if self.s.repetition_penalty != 1.0 {
            let mut seen = history.to_vec();
            seen.sort_unstable();
            seen.dedup();
            let n = l.len();
            for &t in seen.iter().filter(|&&t| (t as usize) < n) {
                let v = &mut l[t as usize];
                *v = if *v < 0.0 {
                    *v * self.s.repetition_penalty
                } else {
                    *v / self.s.repetition_penalty
                };
            }
        }
        if self.s.temperature == 0.0 {
            return Ok(argmax(&l));
        }
        // Candidates by decreasing logit (ties: lower id first), cut by top-k.
        let mut order: Vec<usize> = (0..l.len()).collect();
        order.sort_by(|&a, &b| l[b].total_cmp(&l[a]).then(a.cmp(&b)));
        if let Some(k) = self.s.top_k {
            order.truncate(k);
        }
        let max = l[order[0]] as f64;
        let weights: Vec<f64> = order
            .iter()
            .map(|&i| ((l[i] as f64 - max) / self.s.temperature as f64).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        // Top-p: the smallest prefix whose probability reaches p (at least one token).
        let mut keep = order.len();
        if self.s.top_p < 1.0 {
            let mut acc = 0.0;
            for (n, w) in weights.iter().enumerate() {
                acc += w / total;
                if acc >= self.s.top_p as f64 {
                    keep = n + 1;
                    break;
                }
            }
        }
        let kept: f64 = weights[..keep].iter().sum();
        let mut u = self.rng.random::<f64>() * kept;
        for (n, w) in weights[..keep].iter().enumerate() {
            if u < *w {
                return Ok(order[n] as u32);
            }
            u -= w;
        }
        Ok(order[keep - 1] as u32)
    }
}

/// Whether a row of logits has a token to choose: no NaN, no +∞ and a finite value (NaN and
/// +∞ have no probability to sample by, a row of −∞ leaves nothing; a −∞ among finite logits
/// masks its token). [`ModelError::NonFiniteLogits`] is the refusal of a row that has not.
pub fn usable(logits: &[f32]) -> bool {
    !logits.iter().any(|v| v.is_nan() || *v == f32::INFINITY)
        && logits.iter().any(|v| *v != f32::NEG_INFINITY)
}

/// The index of the first maximum.
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(s: Sampling) -> Sampler {
        Sampler::new(s).unwrap()
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = sampler(Sampling::default());
        assert_eq!(s.sample(&[1.0, 3.0, 3.0, -1.0], &[]).unwrap(), 1);
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
    }

    #[test]
    fn repetition_penalty_follows_transformers() {
        // Token 1 (logit 3) seen: 3 / 4 = 0.75 < 2 (token 0); token 2 (−1) seen: −4.
        let mut s = sampler(Sampling {
            repetition_penalty: 4.0,
            ..Sampling::default()
        });
        assert_eq!(s.sample(&[2.0, 3.0, -1.0], &[1, 2, 1]).unwrap(), 0);
    }

    #[test]
    fn top_k_1_and_tiny_top_p_are_greedy() {
        for s in [
            Sampling {
                temperature: 5.0,
                top_k: Some(1),
                ..Sampling::default()
            },
            Sampling {
                temperature: 5.0,
                top_p: 1e-6,
                ..Sampling::default()
            },
        ] {
            let mut sm = sampler(s);
            for _ in 0..50 {
                assert_eq!(sm.sample(&[0.0, 0.5, 0.4], &[]).unwrap(), 1);
            }
        }
    }

    #[test]
    fn sampling_is_seeded_and_follows_the_probabilities() {
        let s = Sampling {
            temperature: 1.0,
            seed: 7,
            ..Sampling::default()
        };
        let logits = [0.0f32, (3.0f32).ln()]; // probabilities 1/4, 3/4
        let draw = |n| {
            let mut sm = sampler(s);
            (0..n)
                .map(|_| sm.sample(&logits, &[]).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(100), draw(100), "the same seed gives the same tokens");
        let ones = draw(20_000).iter().filter(|&&t| t == 1).count() as f64 / 20_000.0;
        // Binomial standard deviation √(pq/n) ≈ 0.0031: 5 of them.
        assert!((ones - 0.75).abs() < 0.016, "{ones}");
    }

    #[test]
    fn bad_settings_and_logits_are_typed_errors() {
        for s in [
            Sampling {
                temperature: -1.0,
                ..Sampling::default()
            },
            Sampling {
                temperature: f32::NAN,
                ..Sampling::default()
            },
            Sampling {
                top_k: Some(0),
                ..Sampling::default()
            },
            Sampling {
                top_p: 0.0,
                ..Sampling::default()
            },
            Sampling {
                top_p: 1.5,
                ..Sampling::default()
            },
            Sampling {
                repetition_penalty: 0.0,
                ..Sampling::default()
            },
            Sampling {
                repetition_penalty: f32::INFINITY,
                ..Sampling::default()
            },
        ] {
            assert!(
                matches!(Sampler::new(s), Err(ModelError::BadSampling(_))),
                "{s:?}"
            );
        }
        let hot = Sampling {
            temperature: 1.0,
            ..Sampling::default()
        };
        for settings in [Sampling::default(), hot] {
            let mut s = sampler(settings);
            assert!(s.sample(&[], &[]).is_err());
            for bad in [
                &[0.0, f32::NAN][..],
                &[0.0, f32::INFINITY],
                &[f32::NEG_INFINITY; 3],
            ] {
                let r = s.sample(bad, &[]);
                assert!(
                    matches!(r, Err(ModelError::NonFiniteLogits(LogitsAt::Row))),
                    "{bad:?}: {r:?}"
                );
            }
            // −∞ masks a token; ±1e30 are ordinary logits.
            for _ in 0..20 {
                let t = s.sample(&[f32::NEG_INFINITY, -1e30, 1e30], &[]).unwrap();
                assert_eq!(t, 2, "{settings:?}");
                let t = s.sample(&[f32::NEG_INFINITY, 0.0], &[]).unwrap();
                assert_eq!(t, 1, "{settings:?}");
            }
        }
        // History ids outside the row are ignored, not a panic.
        let mut s = sampler(Sampling {
            repetition_penalty: 2.0,
            ..Sampling::default()
        });
        assert_eq!(s.sample(&[0.0, 1.0], &[99]).unwrap(), 1);
    }
}
