//! Recycled host buffers for the outputs of CPU ops. A training step allocates and frees the
//! same few hundred activation and gradient buffers every step; a fresh allocation is zeroed
//! (about a tenth of the tiny GPT's CPU step). When a tensor's CPU storage is freed (its last
//! view dropped), its f32 buffer is kept here, per thread, by length; an op whose output has
//! that length takes it back instead of allocating. Only ops that overwrite every element of
//! their output take pooled buffers (the `compute!` ops of `ops/`), so an output never shows
//! what the buffer held before (`pooled_buffers_never_show_through` poisons them to check).
//!
//! Bounded: buffers below [`MIN_LEN`] elements are not kept (the allocator is fast for those),
//! and at most [`CAP_BYTES`] per thread.

use std::cell::RefCell;
use std::collections::HashMap;

/// Shorter buffers go back to the allocator.
pub(crate) const MIN_LEN: usize = 1024;
/// The most bytes one thread keeps.
pub(crate) const CAP_BYTES: usize = 256 << 20;

#[derive(Default)]
struct Pool {
    by_len: HashMap<usize, Vec<Vec<f32>>>,
    bytes: usize,
}

thread_local! {
    static POOL: RefCell<Pool> = RefCell::new(Pool::default());
}

/// A kept buffer of exactly `len` elements (any contents), if there is one.
pub(crate) fn take(len: usize) -> Option<Vec<f32>> {
    if len < MIN_LEN {
        return None;
    }
    POOL.try_with(|p| {
        let mut p = p.borrow_mut();
        let v = p.by_len.get_mut(&len)?.pop()?;
        p.bytes -= len * 4;
        Some(v)
    })
    .ok()
    .flatten()
}

/// Keeps `v` for a later [`take`] (or frees it when too small, not exactly sized, or the pool
/// is full).
pub(crate) fn give(v: Vec<f32>) {
    let len = v.len();
    if len < MIN_LEN || v.capacity() != len {
        return;
    }
    // During thread teardown the pool may be gone: `v` is then simply freed.
    let _ = POOL.try_with(|p| {
        let mut p = p.borrow_mut();
        if p.bytes + len * 4 <= CAP_BYTES {
            p.bytes += len * 4;
            p.by_len.entry(len).or_default().push(v);
        }
    });
}

/// Drops every kept buffer of this thread.
#[cfg(test)]
pub(crate) fn clear() {
    POOL.with(|p| *p.borrow_mut() = Pool::default());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::{Embedding, Init, LayerNorm, Linear, Module, ParamStore};
    use crate::{Device, Tensor};

    #[test]
    fn buffers_come_back_by_length_within_the_cap() {
        clear();
        give(vec![1.0; MIN_LEN - 1]);
        assert!(take(MIN_LEN - 1).is_none(), "small buffers are not kept");
        give(vec![2.0; 4096]);
        assert!(take(4095).is_none());
        assert_eq!(take(4096).unwrap(), vec![2.0; 4096]);
        assert!(take(4096).is_none());
        let big = CAP_BYTES / 4 / 2 + 1;
        give(vec![0.0; big]);
        give(vec![0.0; big]);
        assert!(take(big).is_some());
        assert!(take(big).is_none(), "the second exceeded the cap");
        clear();
    }

    /// A tiny GPT on the module layer: the op sequence of `models::gpt::Gpt` (GPT-2 style:
    /// token and position embeddings, pre-norm blocks of fused causal attention and a GELU
    /// MLP, a final LayerNorm, the head tied to the token embedding, cross-entropy), width 32,
    /// 4 layers of 4 heads, context 16.
    struct TinyGpt {
        store: ParamStore,
        wte: Embedding,
        wpe: Embedding,
        blocks: Vec<[Box<dyn Module>; 6]>,
        ln_f: LayerNorm,
    }

    const VOCAB: usize = 19;
    const WIDTH: usize = 32;
    const CTX: usize = 16;
    const HEADS: usize = 4;

    impl TinyGpt {
        fn new(seed: u64) -> TinyGpt {
            let store = ParamStore::new(Device::Cpu, seed);
            let std = Init::Normal { std: 0.02 };
            let (wte, wpe, blocks, ln_f) = {
                let tr = store.pp("transformer");
                let wte = Embedding::with_init(tr.pp("wte"), VOCAB, WIDTH, std).unwrap();
                let wpe = Embedding::with_init(tr.pp("wpe"), CTX, WIDTH, std).unwrap();
                let blocks = (0..4)
                    .map(|l| {
                        let vb = tr.pp("h").pp(l);
                        let lin = |name: &str, i: usize, o: usize| -> Box<dyn Module> {
                            Box::new(Linear::with_init(vb.pp(name), i, o, std, None).unwrap())
                        };
                        let ln = |name: &str| -> Box<dyn Module> {
                            Box::new(LayerNorm::new(vb.pp(name), WIDTH, 1e-5, false).unwrap())
                        };
                        [
                            ln("ln_1"),
                            lin("c_attn", WIDTH, 3 * WIDTH),
                            lin("attn_proj", WIDTH, WIDTH),
                            ln("ln_2"),
                            lin("c_fc", WIDTH, 4 * WIDTH),
                            lin("mlp_proj", 4 * WIDTH, WIDTH),
                        ]
                    })
                    .collect();
                let ln_f = LayerNorm::new(tr.pp("ln_f"), WIDTH, 1e-5, false).unwrap();
                (wte, wpe, blocks, ln_f)
            };
            TinyGpt {
                store,
                wte,
                wpe,
                blocks,
                ln_f,
            }
        }

        /// Mean cross-entropy of the next-token predictions for `x` against `y` (`[b, t]`).
        fn loss(&self, x: &Tensor, y: &Tensor) -> crate::Result<Tensor> {
            let (b, t) = (x.shape()[0], x.shape()[1]);
            let mut h = self
                .wte
                .forward(x)?
                .add(&self.wpe.weight().narrow(0, 0, t)?)?;
            for [ln_1, c_attn, attn_proj, ln_2, c_fc, mlp_proj] in &self.blocks {
                let a = c_attn.forward(&ln_1.forward(&h)?)?;
                h = h.add(&attn_proj.forward(&a.causal_attention_packed(HEADS)?)?)?;
                let m = c_fc.forward(&ln_2.forward(&h)?)?.gelu()?;
                h = h.add(&mlp_proj.forward(&m)?)?;
            }
            self.ln_f
                .forward(&h)?
                .linear(self.wte.weight(), None)?
                .reshape(&[b * t, VOCAB])?
                .cross_entropy(&y.reshape(&[b * t])?)
        }
    }

    /// Loss and gradients of the tiny GPT.
    fn run(model: &TinyGpt, x: &Tensor, y: &Tensor) -> Vec<Vec<f32>> {
        let loss = model.loss(x, y).unwrap();
        let g = loss.backward().unwrap();
        let mut out = vec![vec![loss.item().unwrap()]];
        for p in model.store.params() {
            out.push(g.get(p.tensor()).unwrap().to_vec().unwrap());
        }
        out
    }

    /// A GPT step computes the same bits with NaN-filled buffers in the pool (of every length
    /// its ops allocate) as with an empty pool: no pooled op leaves an element unwritten.
    #[test]
    fn pooled_buffers_never_show_through() {
        // Four windows of 16 tokens of a 19-letter text and their next tokens.
        let ids: Vec<u32> = (0..3000).map(|i| (i * 7 % 19) as u32).collect();
        let window = |off: usize| -> Vec<u32> {
            [11, 503, 1207, 2410]
                .iter()
                .flat_map(|&s: &usize| ids[s + off..s + off + CTX].to_vec())
                .collect()
        };
        let x = Tensor::from_vec(window(0), &[4, CTX], Device::Cpu).unwrap();
        let y = Tensor::from_vec(window(1), &[4, CTX], Device::Cpu).unwrap();
        let model = TinyGpt::new(3);
        clear();
        let clean = {
            let r = run(&model, &x, &y);
            clear();
            r
        };
        // Poison: NaN buffers of every length the step's outputs have, several of each.
        let mut lens: Vec<usize> = clean.iter().map(|v| v.len()).collect();
        lens.extend([4 * 16 * 32, 4 * 16 * 96, 4 * 16 * 128, 4 * 16 * VOCAB]);
        for &len in &lens {
            for _ in 0..8 {
                give(vec![f32::NAN; len]);
            }
        }
        let poisoned = run(&model, &x, &y);
        clear();
        for (a, b) in clean.iter().zip(&poisoned) {
            let same = a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits());
            assert!(same, "a pooled buffer showed through");
        }
    }
}
