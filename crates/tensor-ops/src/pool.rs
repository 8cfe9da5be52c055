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
    use crate::gpt::{Dataset, Gpt, GptConfig};
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

    /// Loss and gradients of the tiny GPT.
    fn run(model: &Gpt, x: &Tensor, y: &Tensor) -> Vec<Vec<f32>> {
        let loss = model.loss(x, y, None).unwrap();
        let g = loss.backward().unwrap();
        let mut out = vec![vec![loss.item().unwrap()]];
        for (_, p, _) in model.parameters() {
            out.push(g.get(&p).unwrap().to_vec().unwrap());
        }
        out
    }

    /// A GPT step computes the same bits with NaN-filled buffers in the pool (of every length
    /// its ops allocate) as with an empty pool: no pooled op leaves an element unwritten.
    #[test]
    fn pooled_buffers_never_show_through() {
        let text: String = (0..3000)
            .map(|i| (b'a' + (i * 7 % 19) as u8) as char)
            .collect();
        let ds = Dataset::from_text(&text, 0.9).unwrap();
        let mut cfg = GptConfig::tiny(ds.tokenizer.vocab_size());
        (cfg.n_embd, cfg.block_size) = (32, 16);
        let model = Gpt::new(cfg, 3, Device::Cpu).unwrap();
        let (x, y) = ds
            .batch(false, 4, 16, &mut Dataset::rng(5), Device::Cpu)
            .unwrap();
        clear();
        let clean = {
            let r = run(&model, &x, &y);
            clear();
            r
        };
        // Poison: NaN buffers of every length the step's outputs have, several of each.
        let mut lens: Vec<usize> = clean.iter().map(|v| v.len()).collect();
        lens.extend([
            4 * 16 * 32,
            4 * 16 * 96,
            4 * 16 * 128,
            4 * 16 * cfg.vocab_size,
        ]);
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
