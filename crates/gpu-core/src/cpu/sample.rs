//! Token sampling on the CPU: the reference of `kernels/nn_sample.cu`, written from the
//! definition in [`SampleOps::sample_rows`] (sorting where the kernel bisects digits). Both
//! give the same token bit for bit (the weights are fixed-point, `exp` a fixed sequence of
//! IEEE operations: `nn::sample`).

use super::CpuStorage;
use crate::error::{GpuError, Result};
use crate::nn::sample::{
    check_sample, draw, draw_target, order_key, seen_words, top_p_cut, weight, SampleOps,
    SampleParams, SampleRows,
};
use crate::CpuBackend;

impl SampleOps for CpuBackend {
    fn sample_rows(&self, x: SampleRows<'_, CpuStorage>, params: SampleParams) -> Result<()> {
        const OP: &str = "sample_rows";
        check_sample(&x, &params)?;
        let vocab = x.vocab;
        let rows: Vec<f32> = match x.logits {
            CpuStorage::F32(v) => v.clone(),
            CpuStorage::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
            _ => return Err(GpuError::invalid(OP, "logits must be f32 or bf16")),
        };
        let (CpuStorage::U32(seen), CpuStorage::U32(counter), CpuStorage::U32(out)) =
            (x.seen, x.counter, x.out)
        else {
            return Err(GpuError::invalid(OP, "seen, counter and out must be u32"));
        };
        let words = seen_words(vocab);
        for (r, l) in rows.chunks_exact(vocab).enumerate() {
            let seen = &mut seen[r * words..(r + 1) * words];
            let n = counter[r].wrapping_add(params.offset);
            out[r] = match sample_row(l, seen, n, r as u32, &params) {
                Some(tok) => {
                    seen[tok as usize / 32] |= 1 << (tok % 32);
                    tok
                }
                None => vocab as u32,
            };
        }
        Ok(())
    }
}

/// The token of one row (`None`: a NaN or +∞ logit, or a largest `z` that is not finite).
fn sample_row(l: &[f32], seen: &[u32], n: u32, r: u32, p: &SampleParams) -> Option<u32> {
    if l.iter().any(|v| v.is_nan() || *v == f32::INFINITY) {
        return None;
    }
    let z: Vec<f32> = l
        .iter()
        .enumerate()
        .map(|(i, &v)| p.z(v, seen[i / 32] >> (i % 32) & 1 == 1))
        .collect();
    let first_max = (0..z.len()).fold(0, |b, i| if z[i] > z[b] { i } else { b });
    if !z[first_max].is_finite() {
        return None;
    }
    if p.temperature == 0.0 {
        return Some(first_max as u32);
    }
    let m = z[first_max];
    let w: Vec<u64> = z.iter().map(|&v| weight(v - m)).collect();
    let key: Vec<u32> = z.iter().map(|&v| order_key(v)).collect();
    // Indices by decreasing key.
    let mut order: Vec<usize> = (0..z.len()).collect();
    order.sort_by(|&a, &b| key[b].cmp(&key[a]));
    // Top-k: keys at or above the k-th largest (counting repeats).
    let k = p.top_k as usize;
    let vk = if k > 0 && k < z.len() {
        key[order[k - 1]]
    } else {
        0
    };
    let survivors: Vec<usize> = order.into_iter().take_while(|&i| key[i] >= vk).collect();
    // Top-p: whole groups of equal keys, from the top, while the mass above them is below the cut.
    let mut cut_key = vk;
    if p.top_p < 1.0 {
        let z_s: u64 = survivors.iter().map(|&i| w[i]).sum();
        let cut = top_p_cut(p.top_p, z_s);
        let mut above = 0u64;
        let mut g = 0;
        while g < survivors.len() && above < cut {
            let kg = key[survivors[g]];
            cut_key = kg;
            while g < survivors.len() && key[survivors[g]] == kg {
                above += w[survivors[g]];
                g += 1;
            }
        }
    }
    let kept = |i: usize| key[i] >= cut_key;
    let total: u64 = (0..z.len()).filter(|&i| kept(i)).map(|i| w[i]).sum();
    let target = draw_target(draw(p.seed, n, r), total);
    // The maximum is always kept with weight 2^40, so `total > target` and the walk ends
    // inside the loop; the fallback is the maximum.
    let mut c = 0u64;
    for i in (0..z.len()).filter(|&i| kept(i)) {
        if target < c + w[i] {
            return Some(i as u32);
        }
        c += w[i];
    }
    Some(first_max as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend;
    use crate::dtype::DType;

    const P: SampleParams = SampleParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        penalty: 1.0,
        seed: 7,
        offset: 0,
    };

    /// Samples each row of `logits` at the counters `n`; returns the tokens and the bitmask.
    fn run(
        logits: &[f32],
        vocab: usize,
        seen: Vec<u32>,
        n: &[u32],
        p: SampleParams,
    ) -> (Vec<u32>, Vec<u32>) {
        let cpu = CpuBackend;
        let l = cpu.upload(logits).unwrap();
        let mut s = cpu.upload(&seen).unwrap();
        let c = cpu.upload(n).unwrap();
        let mut o = cpu.allocate(DType::U32, n.len()).unwrap();
        cpu.sample_rows(SampleRows::new(&l, &mut s, &c, &mut o, vocab), p)
            .unwrap();
        (cpu.download(&o).unwrap(), cpu.download(&s).unwrap())
    }

    /// The frequency of each token over `draws` counters of one row.
    fn frequencies(logits: &[f32], draws: u32, p: SampleParams) -> Vec<f64> {
        let mut count = vec![0u32; logits.len()];
        for n in 0..draws {
            let (t, _) = run(logits, logits.len(), vec![0], &[n], p);
            count[t[0] as usize] += 1;
        }
        count.iter().map(|&c| c as f64 / draws as f64).collect()
    }

    /// `|f − q| ≤ 5σ` with `σ = √(q(1−q)/draws)` for every token (q = 0 must never be drawn).
    fn assert_close(f: &[f64], q: &[f64], draws: u32) {
        for (i, (&f, &q)) in f.iter().zip(q).enumerate() {
            let bound = 5.0 * (q * (1.0 - q) / draws as f64).sqrt();
            assert!(
                (f - q).abs() <= bound,
                "token {i}: {f} vs {q} (bound {bound})"
            );
        }
    }

    fn softmax(z: &[f64]) -> Vec<f64> {
        let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = z.iter().map(|v| (v - m).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|v| v / s).collect()
    }

    #[test]
    fn draws_follow_the_tempered_softmax() {
        let l = [1.0f32, 2.0, 0.5, -1.0, 2.0];
        let draws = 20_000;
        for t in [0.5f32, 1.0, 3.0] {
            let z: Vec<f64> = l.iter().map(|&v| (v / t) as f64).collect();
            let f = frequencies(
                &l,
                draws,
                SampleParams {
                    temperature: t,
                    ..P
                },
            );
            assert_close(&f, &softmax(&z), draws);
        }
    }

    #[test]
    fn top_k_and_top_p_cut_the_tail_and_renormalize() {
        // Probabilities 0.5, 0.3, 0.15, 0.05.
        let q = [0.5f64, 0.3, 0.15, 0.05];
        let l: Vec<f32> = q.iter().map(|v| v.ln() as f32).collect();
        let draws = 20_000;
        let k2 = frequencies(&l, draws, SampleParams { top_k: 2, ..P });
        assert_close(&k2, &[0.625, 0.375, 0.0, 0.0], draws);
        // Mass above token 1 is 0.5 < 0.7, above token 2 is 0.8: tokens 0 and 1 stay.
        let p7 = frequencies(&l, draws, SampleParams { top_p: 0.7, ..P });
        assert_close(&p7, &[0.625, 0.375, 0.0, 0.0], draws);
        let p85 = frequencies(&l, draws, SampleParams { top_p: 0.85, ..P });
        assert_close(&p85, &[0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0], draws);
        // Top-p after top-k renormalizes over the top 3: above token 2 is 0.8/0.95 < 0.9.
        let both = frequencies(
            &l,
            draws,
            SampleParams {
                top_k: 3,
                top_p: 0.9,
                ..P
            },
        );
        assert_close(&both, &[0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0], draws);
        for p in [
            SampleParams { top_k: 1, ..P },
            SampleParams { top_p: 1e-6, ..P },
        ] {
            assert_eq!(frequencies(&l, 200, p)[0], 1.0, "{p:?}");
        }
    }

    #[test]
    fn ties_at_the_kth_value_all_stay() {
        let l = [3.0f32, 1.0, 1.0, 1.0, -2.0];
        let f = frequencies(
            &l,
            4000,
            SampleParams {
                top_k: 2,
                temperature: 1e-3,
                ..P
            },
        );
        assert_eq!(f[0], 1.0);
        let f = frequencies(&l[1..], 4000, SampleParams { top_k: 1, ..P });
        assert_close(&f, &[1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0, 0.0], 4000);
    }

    #[test]
    fn greedy_takes_the_first_maximum_of_the_penalized_logits() {
        let g = SampleParams {
            temperature: 0.0,
            ..P
        };
        assert_eq!(run(&[1.0, 3.0, 3.0, -1.0], 4, vec![0], &[0], g).0, [1]);
        // Token 1 seen: 3 / 4 = 0.75 < 2 (token 0); token 2 (−1) seen: −4.
        let pen = SampleParams { penalty: 4.0, ..g };
        let (t, seen) = run(&[2.0, 3.0, -1.0], 3, vec![0b110], &[0], pen);
        assert_eq!((t[0], seen[0]), (0, 0b111));
    }

    #[test]
    fn the_sampled_token_is_marked_seen() {
        let vocab = 70;
        let l: Vec<f32> = (0..2 * vocab).map(|i| (i % 7) as f32).collect();
        let (t, seen) = run(&l, vocab, vec![0; 6], &[3, 3], P);
        for (r, &tok) in t.iter().enumerate() {
            let tok = tok as usize;
            let words = &seen[r * 3..r * 3 + 3];
            assert_eq!(words.iter().map(|w| w.count_ones()).sum::<u32>(), 1);
            assert_eq!(words[tok / 32] >> (tok % 32) & 1, 1);
        }
    }

    #[test]
    fn the_draw_is_seeded_by_seed_counter_offset_and_row() {
        let l = vec![0.0f32; 1000];
        let t = |seed, n: u32, offset| {
            run(
                &l,
                1000,
                vec![0; 32],
                &[n],
                SampleParams { seed, offset, ..P },
            )
            .0[0]
        };
        assert_eq!(t(1, 5, 0), t(1, 5, 0));
        assert_eq!(t(1, 5, 0), t(1, 2, 3));
        let distinct: std::collections::BTreeSet<u32> = (0..20).map(|n| t(1, n, 0)).collect();
        assert!(distinct.len() > 15, "{distinct:?}");
        assert_ne!(
            (0..8).map(|n| t(1, n, 0)).collect::<Vec<_>>(),
            (0..8).map(|n| t(2, n, 0)).collect::<Vec<_>>()
        );
        // Two rows with the same logits and counter draw differently.
        let both = [l.clone(), l.clone()].concat();
        let differ = (0..8).any(|n| {
            let t = run(&both, 1000, vec![0; 64], &[n, n], P).0;
            t[0] != t[1]
        });
        assert!(differ);
    }

    #[test]
    fn rows_without_a_distribution_get_vocab_and_stay_unseen() {
        let cases: [(&[f32], SampleParams); 5] = [
            (&[0.0, f32::NAN, 1.0], P),
            (&[0.0, f32::INFINITY, 1.0], P),
            (&[f32::NEG_INFINITY; 3], P),
            (
                &[f32::NEG_INFINITY; 3],
                SampleParams {
                    temperature: 0.0,
                    ..P
                },
            ),
            (
                &[1e38, 0.0, -1.0],
                SampleParams {
                    temperature: 1e-3,
                    ..P
                },
            ),
        ];
        for (l, p) in cases {
            assert_eq!(
                run(l, 3, vec![0], &[0], p),
                (vec![3], vec![0]),
                "{l:?} {p:?}"
            );
        }
        // −∞ masks a token: it is never drawn.
        let f = frequencies(&[0.0, f32::NEG_INFINITY, 0.0], 400, P);
        assert_eq!(f[1], 0.0);
    }

    #[test]
    fn bf16_logits_sample_as_their_f32_values() {
        let cpu = CpuBackend;
        let v: Vec<f32> = (0..300)
            .map(|i| ((i * 37 % 101) as f32 / 13.0).sin())
            .collect();
        let b: Vec<half::bf16> = v.iter().map(|&x| half::bf16::from_f32(x)).collect();
        let w: Vec<f32> = b.iter().map(|x| x.to_f32()).collect();
        let lb = cpu.upload(&b).unwrap();
        for n in 0..20 {
            let mut s = cpu.upload(&[0u32; 10]).unwrap();
            let c = cpu.upload(&[n]).unwrap();
            let mut o = cpu.allocate(DType::U32, 1).unwrap();
            cpu.sample_rows(SampleRows::new(&lb, &mut s, &c, &mut o, 300), P)
                .unwrap();
            assert_eq!(
                cpu.download::<u32>(&o).unwrap(),
                run(&w, 300, vec![0; 10], &[n], P).0
            );
        }
    }

    #[test]
    fn bad_buffers_are_typed_errors_and_change_nothing() {
        crate::testing::check_sample_rows_refusals(&CpuBackend);
    }
}
