//! Char-level tokenizer, the train/val split, and random batches.

use rand::{Rng, SeedableRng};
use tensor_ops::Tensor;
use tensor_ops::{Device, GpuError, Result};

/// The most pieces [`Dataset::hold_out`] spreads the held-out tokens over.
pub const HOLDOUT_PIECES: usize = 20;
/// The fewest windows (`block + 1` tokens) one held-out piece holds: fewer pieces rather than
/// pieces so short that most probe windows would straddle two of them.
pub const HOLDOUT_PIECE_WINDOWS: usize = 16;

/// Maps each distinct character of a text to an id (sorted by code point, as nanoGPT).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CharTokenizer {
    chars: Vec<char>,
}

impl CharTokenizer {
    /// The vocabulary of `text`.
    pub fn fit(text: &str) -> Result<CharTokenizer> {
        let mut chars: Vec<char> = text.chars().collect();
        chars.sort_unstable();
        chars.dedup();
        if chars.is_empty() {
            return Err(GpuError::invalid("CharTokenizer", "the text is empty"));
        }
        Ok(CharTokenizer { chars })
    }

    /// Number of distinct characters.
    pub fn vocab_size(&self) -> usize {
        self.chars.len()
    }

    /// Ids of `text`; a character outside the vocabulary is an error.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        text.chars()
            .map(|c| {
                self.chars.binary_search(&c).map(|i| i as u32).map_err(|_| {
                    GpuError::invalid(
                        "encode",
                        format!("character {c:?} is not in the vocabulary"),
                    )
                })
            })
            .collect()
    }

    /// The text of `ids`; an id outside the vocabulary is an error.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        ids.iter()
            .map(|&i| {
                self.chars.get(i as usize).copied().ok_or_else(|| {
                    GpuError::invalid("decode", format!("id {i} >= vocab {}", self.chars.len()))
                })
            })
            .collect()
    }
}

/// A tokenised corpus split into train (first 90%) and validation (last 10%); optionally a
/// part of the training split held out of training ([`Dataset::hold_out`]).
pub struct Dataset {
    pub tokenizer: CharTokenizer,
    pub train: Vec<u32>,
    pub val: Vec<u32>,
    /// Tokens carved from the training split (pieces spread over it), never in a training batch (empty
    /// unless [`Dataset::hold_out`] carved them): what probes of generalisation are drawn
    /// from without touching the validation split.
    pub holdout: Vec<u32>,
}

impl Dataset {
    /// Tokenises `text` and splits it at `train_fraction` (nanoGPT: 0.9).
    pub fn from_text(text: &str, train_fraction: f64) -> Result<Dataset> {
        if !(0.0..1.0).contains(&train_fraction) || train_fraction == 0.0 {
            return Err(GpuError::invalid(
                "Dataset",
                "train_fraction must be in (0, 1)",
            ));
        }
        let tokenizer = CharTokenizer::fit(text)?;
        let ids = tokenizer.encode(text)?;
        let n = (ids.len() as f64 * train_fraction) as usize;
        Ok(Dataset {
            tokenizer,
            train: ids[..n].to_vec(),
            val: ids[n..].to_vec(),
            holdout: Vec::new(),
        })
    }

    /// Moves `fraction` of the training split (rounded down, in tokens) into
    /// [`Dataset::holdout`], in pieces spread over the whole split: the split is cut into
    /// `p` equal stretches and each gives up its last `1/p` of the held-out tokens, `p` as
    /// many as [`HOLDOUT_PIECES`] allows with every piece at least [`HOLDOUT_PIECE_WINDOWS`]
    /// windows long (one piece, the split's end, when the slice is shorter). Training batches
    /// are then drawn from the rest (the stretches joined in order), the validation split is
    /// untouched. Spread, not one slice at the end: a corpus of concatenated works (tinyshakespeare
    /// ends with the play its validation split continues) would otherwise lose to the
    /// held-out slice the one part of the text the validation split shares. Both parts must
    /// still fit a window of `block` tokens; carving twice is an error; a refusal moves nothing.
    pub fn hold_out(&mut self, fraction: f64, block: usize) -> Result<()> {
        if !(fraction > 0.0 && fraction < 1.0) {
            return Err(GpuError::invalid(
                "Dataset::hold_out",
                format!("the held-out fraction {fraction} must be in (0, 1)"),
            ));
        }
        if !self.holdout.is_empty() {
            return Err(GpuError::invalid(
                "Dataset::hold_out",
                "a held-out slice was already carved",
            ));
        }
        let len = self.train.len();
        let n = (len as f64 * fraction) as usize;
        let window = block.checked_add(1);
        let fits = |len: usize| window.is_some_and(|w| len > w);
        if !(fits(n) && fits(len - n)) {
            return Err(GpuError::invalid(
                "Dataset::hold_out",
                format!(
                    "holding out {fraction} of {len} training tokens leaves {n} held out and {} \
                     to train on; each needs more than {block} + 1",
                    len - n
                ),
            ));
        }
        let piece_min = window.map_or(usize::MAX, |w| w.saturating_mul(HOLDOUT_PIECE_WINDOWS));
        let pieces = (n / piece_min).clamp(1, HOLDOUT_PIECES);
        let mut train = gpu_core::cpu::try_vec_with_capacity(len - n)?;
        let mut holdout = gpu_core::cpu::try_vec_with_capacity(n)?;
        for i in 0..pieces {
            // Stretch i is [len·i/p, len·(i+1)/p); its held-out piece the last n·(i+1)/p −
            // n·i/p tokens of it (n < len, so a piece never exceeds its stretch).
            let at = |k: usize, total: usize| (total as u128 * k as u128 / pieces as u128) as usize;
            let (start, end) = (at(i, len), at(i + 1, len));
            let cut = end - (at(i + 1, n) - at(i, n));
            train.extend_from_slice(&self.train[start..cut]);
            holdout.extend_from_slice(&self.train[cut..end]);
        }
        self.train = train;
        self.holdout = holdout;
        Ok(())
    }

    /// [`Dataset::batch`] from the held-out slice.
    pub fn holdout_batch(
        &self,
        batch: usize,
        block: usize,
        rng: &mut rand::rngs::StdRng,
        device: Device,
    ) -> Result<(Tensor, Tensor)> {
        let (x, y) = windows(&self.holdout, "held-out", (batch, block), rng)?;
        Ok((
            Tensor::from_vec(x, &[batch, block], device)?,
            Tensor::from_vec(y, &[batch, block], device)?,
        ))
    }

    /// Checks that windows of `block` tokens (and their targets, one token further) fit in both
    /// splits: each must hold more than `block + 1` tokens.
    pub fn check_block(&self, block: usize) -> Result<()> {
        for val in [false, true] {
            self.check_split(val, block)?;
        }
        Ok(())
    }

    fn check_split(&self, val: bool, block: usize) -> Result<()> {
        let (name, data) = if val {
            ("validation", &self.val)
        } else {
            ("training", &self.train)
        };
        if block.checked_add(1).is_none_or(|b| data.len() <= b) {
            return Err(GpuError::invalid(
                "Dataset",
                format!(
                    "a context of {block} tokens does not fit in the {name} split of {} tokens \
                     (it needs more than block + 1)",
                    data.len()
                ),
            ));
        }
        Ok(())
    }

    /// `batch` random windows of `block` tokens from the train (or val) split: inputs `x` and
    /// next-token targets `y`, both u32 `[batch, block]` on `device` (two host-to-device copies).
    /// A block too long for the split is an error, and so is a batch the host cannot hold
    /// ([`GpuError::OutOfMemory`], not an abort).
    pub fn batch(
        &self,
        val: bool,
        batch: usize,
        block: usize,
        rng: &mut rand::rngs::StdRng,
        device: Device,
    ) -> Result<(Tensor, Tensor)> {
        let (x, y) = self.batch_ids(val, batch, block, rng)?;
        Ok((
            Tensor::from_vec(x, &[batch, block], device)?,
            Tensor::from_vec(y, &[batch, block], device)?,
        ))
    }

    /// [`Dataset::batch`]'s token ids on the host (the same draws from `rng`), row-major
    /// `[batch, block]`: for feeding a captured step ([`crate::gpt::GraphedStep`]).
    pub fn batch_ids(
        &self,
        val: bool,
        batch: usize,
        block: usize,
        rng: &mut rand::rngs::StdRng,
    ) -> Result<(Vec<u32>, Vec<u32>)> {
        self.check_split(val, block)?;
        let (name, data) = if val {
            ("validation", &self.val)
        } else {
            ("training", &self.train)
        };
        windows(data, name, (batch, block), rng)
    }

    /// Draws from `rng` what `n` calls of [`Dataset::batch_ids`] would, without the tokens:
    /// a resumed run's data stream then goes on where the interrupted one stopped.
    pub fn skip_batches(
        &self,
        val: bool,
        batch: usize,
        block: usize,
        n: usize,
        rng: &mut rand::rngs::StdRng,
    ) -> Result<()> {
        self.check_split(val, block)?;
        let len = if val {
            self.val.len()
        } else {
            self.train.len()
        };
        let draws = n.checked_mul(batch).ok_or_else(|| {
            GpuError::invalid(
                "Dataset::skip_batches",
                format!("{n} batches of {batch} rows overflow"),
            )
        })?;
        for _ in 0..draws {
            let _: usize = rng.random_range(0..len - block);
        }
        Ok(())
    }

    /// A seeded generator for [`Dataset::batch`].
    pub fn rng(seed: u64) -> rand::rngs::StdRng {
        rand::rngs::StdRng::seed_from_u64(seed)
    }
}

/// `batch` random windows of `block` tokens of `data` and their next-token targets, row-major.
fn windows(
    data: &[u32],
    name: &str,
    (batch, block): (usize, usize),
    rng: &mut rand::rngs::StdRng,
) -> Result<(Vec<u32>, Vec<u32>)> {
    if block.checked_add(1).is_none_or(|b| data.len() <= b) {
        return Err(GpuError::invalid(
            "Dataset",
            format!(
                "a context of {block} tokens does not fit in the {name} tokens ({})",
                data.len()
            ),
        ));
    }
    let n = batch
        .checked_mul(block)
        .ok_or_else(|| GpuError::InvalidShape {
            op: "Dataset::batch",
            reason: format!("{batch} x {block} tokens overflow usize"),
        })?;
    let mut x = gpu_core::cpu::try_vec_with_capacity(n)?;
    let mut y = gpu_core::cpu::try_vec_with_capacity(n)?;
    for _ in 0..batch {
        let i = rng.random_range(0..data.len() - block);
        x.extend_from_slice(&data[i..i + block]);
        y.extend_from_slice(&data[i + 1..i + block + 1]);
    }
    Ok((x, y))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_round_trip_and_errors() {
        let tok = CharTokenizer::fit("hello, wörld").unwrap();
        assert_eq!(tok.vocab_size(), 10);
        let ids = tok.encode("world").unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), "world");
        assert!(tok.encode("xyz").is_err());
        assert!(tok.decode(&[99]).is_err());
        assert!(CharTokenizer::fit("").is_err());
    }

    #[test]
    fn split_and_batches() {
        let text = "abcdefghij".repeat(20);
        let ds = Dataset::from_text(&text, 0.9).unwrap();
        assert_eq!(ds.train.len(), 180);
        assert_eq!(ds.val.len(), 20);
        let mut rng = Dataset::rng(1);
        let (x, y) = ds.batch(false, 3, 8, &mut rng, Device::Cpu).unwrap();
        let (x, y) = (x.to_vec_u32().unwrap(), y.to_vec_u32().unwrap());
        for r in 0..3 {
            for i in 0..7 {
                assert_eq!(
                    x[r * 8 + i + 1],
                    y[r * 8 + i],
                    "targets are inputs shifted by one"
                );
            }
        }
        assert!(ds.batch(true, 1, 64, &mut rng, Device::Cpu).is_err());
    }

    /// A held-out slice shorter than one piece is the end of the training split: training batches, held-out
    /// batches and the validation split never share a token position. Each part gets its own
    /// letters, so a token's letter says where it came from.
    #[test]
    fn the_held_out_slice_overlaps_neither_training_batches_nor_validation() {
        let text = format!(
            "{}ab{}ij{}",
            "abcdefgh".repeat(101),
            "ijklmnop".repeat(11),
            "qrstuvwxyz".repeat(10)
        );
        let mut ds = Dataset::from_text(&text, 0.9).unwrap();
        ds.hold_out(0.1, 8).unwrap();
        assert_eq!(
            (ds.train.len(), ds.holdout.len(), ds.val.len()),
            (810, 90, 100)
        );
        assert!(ds.hold_out(0.1, 8).is_err(), "carved twice");
        let letters = |ids: &[u32]| ds.tokenizer.decode(ids).unwrap();
        let mut rng = Dataset::rng(5);
        for _ in 0..200 {
            let (x, y) = ds.batch_ids(false, 4, 8, &mut rng).unwrap();
            let t = letters(&[x, y].concat());
            assert!(t.chars().all(|c| ('a'..='h').contains(&c)), "{t}");
            let (x, y) = ds.holdout_batch(4, 8, &mut rng, Device::Cpu).unwrap();
            let ids = [x.to_vec_u32().unwrap(), y.to_vec_u32().unwrap()].concat();
            let t = letters(&ids);
            assert!(t.chars().all(|c| ('i'..='p').contains(&c)), "{t}");
        }
        // A slice (or a rest) too short for a window is refused and nothing moves.
        let mut ds = Dataset::from_text(&text, 0.9).unwrap();
        assert!(ds.hold_out(0.001, 8).is_err());
        assert!(ds.hold_out(0.0, 8).is_err() && ds.hold_out(1.0, 8).is_err());
        for bad in [f64::NAN, f64::INFINITY, -f64::INFINITY, 1e30, -1e30] {
            assert!(ds.hold_out(bad, 8).is_err(), "{bad}");
        }
        // A block whose window overflows, or that no part can hold, is refused.
        assert!(ds.hold_out(0.1, usize::MAX).is_err() && ds.hold_out(0.5, 500).is_err());
        assert_eq!((ds.train.len(), ds.holdout.len()), (900, 0));
    }

    /// The held-out tokens are pieces spread over the whole training split, each the end of
    /// one of `p` equal stretches, and training keeps the rest in order: every token is in
    /// exactly one part. Issue 41's W1 held out the split's last 5% in one slice, the start
    /// of the play the validation split continues, and the hybrid trained without it.
    #[test]
    fn the_held_out_pieces_are_spread_over_the_whole_training_split() {
        // (training tokens, fraction, block, pieces): W1's numbers, and a slice long enough
        // for the most pieces.
        for (len, fraction, block, pieces) in [
            (1_003_854, 0.05, 256, 12),
            (100_000, 0.05, 8, HOLDOUT_PIECES),
        ] {
            let mut ds = Dataset::from_text("ab", 0.5).unwrap();
            ds.train = (0..len as u32).collect();
            ds.hold_out(fraction, block).unwrap();
            let n = (len as f64 * fraction) as usize;
            assert_eq!((ds.holdout.len(), ds.train.len()), (n, len - n));
            // Both parts ascending and disjoint: together they are the split, in order.
            let mut all = [ds.train.clone(), ds.holdout.clone()].concat();
            assert!(ds.train.windows(2).all(|w| w[0] < w[1]));
            assert!(ds.holdout.windows(2).all(|w| w[0] < w[1]));
            all.sort_unstable();
            assert!(all.iter().enumerate().all(|(i, &t)| t as usize == i));
            // Runs of consecutive held-out tokens: one a stretch, each ending at its stretch's end.
            let ends: Vec<usize> = (0..ds.holdout.len())
                .filter(|&i| ds.holdout.get(i + 1) != Some(&(ds.holdout[i] + 1)))
                .map(|i| ds.holdout[i] as usize + 1)
                .collect();
            let want: Vec<usize> = (1..=pieces).map(|i| len * i / pieces).collect();
            assert_eq!(ends, want, "{len} tokens, {pieces} pieces");
            // Every tenth of the split gives tokens to both parts.
            for d in 0..10 {
                let tenth = |t: &u32| (*t as usize) * 10 / len == d;
                assert!(
                    ds.holdout.iter().any(tenth) && ds.train.iter().any(tenth),
                    "tenth {d}"
                );
            }
        }
    }

    /// A block of usize::MAX overflowed `block + 1`, and `batch · block` was multiplied
    /// unchecked and allocated with an aborting `Vec::with_capacity`.
    #[test]
    fn batches_with_overflowing_or_unholdable_sizes_are_typed_errors() {
        let ds = Dataset::from_text(&"abcdefghij".repeat(20), 0.9).unwrap();
        let mut rng = Dataset::rng(1);
        assert!(ds.check_block(usize::MAX).is_err());
        assert!(ds.check_block(18).is_ok() && ds.check_block(19).is_err());
        let r = ds.batch(false, usize::MAX, usize::MAX, &mut rng, Device::Cpu);
        assert!(matches!(r, Err(GpuError::InvalidArgument { .. })));
        let r = ds.batch(false, usize::MAX, 2, &mut rng, Device::Cpu);
        assert!(matches!(r, Err(GpuError::InvalidShape { .. })), "{r:?}");
        let r = ds.batch(false, 1 << 40, 8, &mut rng, Device::Cpu);
        assert!(matches!(r, Err(GpuError::OutOfMemory { .. })), "{r:?}");
        // Skipping more draws than a usize holds is an error at once, not an endless loop.
        let r = ds.skip_batches(false, usize::MAX, 8, 2, &mut rng);
        assert!(matches!(r, Err(GpuError::InvalidArgument { .. })), "{r:?}");
    }
}
