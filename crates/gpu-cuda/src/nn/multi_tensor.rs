//! The multi-tensor launch description shared by the optimiser kernels of `kernels/nn_optim.cu`:
//! the by-value `MultiTensor` struct (up to 64 tensors a launch: pointers, lengths, decay
//! factors and the prefix sums of their block counts), its byte layout, and the chunking of a
//! tensor list into launches. `super::optim` (AdamW, Schedule-Free, lerp) and
//! `super::optim_adaptive` (Prodigy's six-pointer `MultiTensor6`) build on it.

use crate::launch::LaunchConfig;

/// Tensors per launch (`MT_MAX` in the kernel).
const MT_MAX: usize = 64;
/// Elements per block (`MT_CHUNK`).
pub(super) const MT_CHUNK: usize = 4096;
/// Threads per block (`MT_THREADS`).
pub(super) const MT_THREADS: u32 = 256;
/// Longest piece of a tensor in one entry: a multiple of `MT_CHUNK`, so pieces stay 16-byte
/// aligned, and small enough for the kernel's 32-bit lengths and block counts.
pub(super) const PIECE: usize = 1 << 30;

/// One tensor (or piece of one): the device addresses of its `K` buffers (p, g, m, v for
/// `MultiTensor`; 0 where unused), its length and its AdamW decay factor `1 − lr·wd`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Entry<const K: usize = 4> {
    pub(super) ptrs: [u64; K],
    pub(super) len: usize,
    pub(super) decay: f32,
}

impl<const K: usize> Entry<K> {
    /// The entry split into pieces of at most [`PIECE`] elements (none when empty).
    fn pieces(self) -> impl Iterator<Item = Entry<K>> {
        (0..self.len).step_by(PIECE).map(move |off| Entry {
            ptrs: self
                .ptrs
                .map(|p| if p == 0 { 0 } else { p + 4 * off as u64 }),
            len: PIECE.min(self.len - off),
            decay: self.decay,
        })
    }
}

/// One launch's multi-tensor struct bytes and its block count.
pub(super) struct Chunk {
    pub(super) bytes: Vec<u8>,
    pub(super) blocks: u32,
}

/// Where a multi-tensor struct keeps its fields: from byte 0 a row of `max` u64 pointers per
/// buffer of an entry (buffer k of tensor i at `8·(k·max + i)`), then the byte offsets of the
/// u32 lengths, the f32 decays, the `max + 1` u32 block starts and the u32 count; `size` bytes.
pub(super) struct Layout {
    pub(super) max: usize,
    pub(super) n: usize,
    pub(super) decay: usize,
    pub(super) block_start: usize,
    pub(super) count: usize,
    pub(super) size: usize,
}

impl Layout {
    /// The layout of a struct of `buffers` pointer rows of `max` u64 each from byte 0, then
    /// `u32 n[max]`, `float decay[max]`, `u32 block_start[max + 1]` and `u32 count`, its size
    /// rounded up to the pointers' 8-byte alignment (as the kernels declare and
    /// static_assert them).
    pub(super) const fn of(buffers: usize, max: usize) -> Layout {
        let n = 8 * buffers * max;
        let decay = n + 4 * max;
        let block_start = decay + 4 * max;
        let count = block_start + 4 * (max + 1);
        Layout {
            max,
            n,
            decay,
            block_start,
            count,
            size: (count + 4).next_multiple_of(8),
        }
    }
}

/// `struct MultiTensor`: [`MT_MAX`] tensors of four buffers (p, g, m, v).
const MULTI_TENSOR: Layout = Layout::of(4, MT_MAX);

fn put(bytes: &mut [u8], at: usize, v: &[u8]) {
    bytes[at..at + v.len()].copy_from_slice(v);
}

/// Packs the entries into launches of up to `at.max` tensors each, laid out as `at` says.
pub(super) fn pack<const K: usize>(
    at: &Layout,
    entries: impl IntoIterator<Item = Entry<K>>,
) -> Vec<Chunk> {
    let pieces: Vec<Entry<K>> = entries.into_iter().flat_map(Entry::pieces).collect();
    pieces
        .chunks(at.max)
        .map(|group| {
            let mut bytes = vec![0u8; at.size];
            let mut blocks = 0u32;
            for (i, e) in group.iter().enumerate() {
                for (k, ptr) in e.ptrs.iter().enumerate() {
                    put(&mut bytes, 8 * (k * at.max + i), &ptr.to_le_bytes());
                }
                put(&mut bytes, at.n + 4 * i, &(e.len as u32).to_le_bytes());
                put(&mut bytes, at.decay + 4 * i, &e.decay.to_le_bytes());
                put(&mut bytes, at.block_start + 4 * i, &blocks.to_le_bytes());
                // At most 64 (MT_MAX) pieces of 2^18 blocks: far below 2^31.
                blocks += e.len.div_ceil(MT_CHUNK) as u32;
            }
            let end = at.block_start + 4 * group.len();
            put(&mut bytes, end, &blocks.to_le_bytes());
            put(&mut bytes, at.count, &(group.len() as u32).to_le_bytes());
            Chunk { bytes, blocks }
        })
        .collect()
}

/// Packs the entries into `MultiTensor` launches of up to [`MT_MAX`] tensors each.
pub(super) fn chunks(entries: impl IntoIterator<Item = Entry>) -> Vec<Chunk> {
    pack(&MULTI_TENSOR, entries)
}

/// The blocks of all the chunks' launches.
pub(super) fn total_blocks(chunks: &[Chunk]) -> usize {
    chunks.iter().map(|c| c.blocks as usize).sum()
}

pub(super) fn blocks_config(blocks: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (MT_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// The little-endian u32 at byte `at` of a packed struct.
    pub(in crate::nn) fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }

    /// The offsets `Layout::of` computes are the ones `kernels/nn_optim.cu` static_asserts
    /// for `MultiTensor` and `MultiTensor6` (n, decay, block_start, count, size).
    #[test]
    fn layouts_match_the_kernels_structs() {
        let fields = |l: &Layout| [l.n, l.decay, l.block_start, l.count, l.size];
        assert_eq!(fields(&MULTI_TENSOR), [2048, 2304, 2560, 2820, 2824]);
        let six = Layout::of(6, 48);
        assert_eq!(fields(&six), [2304, 2496, 2688, 2884, 2888]);
    }

    #[test]
    fn chunks_pack_64_tensors_per_launch_and_skip_empty_ones() {
        let e = |len: usize| Entry {
            ptrs: [256, 512, 768, 1024],
            len,
            decay: 0.5,
        };
        let mut list = vec![e(0), e(1), e(4096), e(4097)];
        list.extend((0..70).map(|i| e(i + 1)));
        let c = chunks(list);
        assert_eq!(c.len(), 2, "73 non-empty tensors take two launches");
        let b = &c[0].bytes;
        assert_eq!(b.len(), MULTI_TENSOR.size);
        assert_eq!(u32_at(b, MULTI_TENSOR.count), 64);
        assert_eq!(u32_at(b, MULTI_TENSOR.n), 1);
        assert_eq!(u32_at(b, MULTI_TENSOR.n + 4), 4096);
        assert_eq!(u32_at(b, MULTI_TENSOR.n + 8), 4097);
        // Block starts: 0, 1, 2, then 4 (the 4097-element tensor takes two blocks).
        let starts: Vec<u32> = (0..5)
            .map(|i| u32_at(b, MULTI_TENSOR.block_start + 4 * i))
            .collect();
        assert_eq!(starts, vec![0, 1, 2, 4, 5]);
        assert_eq!(c[0].blocks, u32_at(b, MULTI_TENSOR.block_start + 4 * 64));
        assert_eq!(u32_at(&c[1].bytes, MULTI_TENSOR.count), 9);
        assert_eq!(c[1].blocks, 9);
    }

    #[test]
    fn long_tensors_split_into_aligned_pieces() {
        let e = Entry {
            ptrs: [1 << 20, 0, 0, 0],
            len: 2 * PIECE + 5,
            decay: 1.0,
        };
        let p: Vec<Entry> = e.pieces().collect();
        assert_eq!(p.len(), 3);
        assert_eq!(p[1].ptrs, [(1 << 20) + 4 * PIECE as u64, 0, 0, 0]);
        assert_eq!(p[2].len, 5);
        assert!(p.iter().all(|x| x.ptrs[0] % 16 == 0));
    }
}
