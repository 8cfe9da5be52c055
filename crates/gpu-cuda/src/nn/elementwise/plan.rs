//! Host-side planning for the elementwise kernels: collapsing broadcast and permute shapes to
//! the fewest dims, choosing the kernel path, and the thread layout of the reductions.

/// Threads per block of the reduction kernels (`THREADS` in `nn_reduce.cu`).
pub(super) const REDUCE_THREADS: usize = 256;
/// The fewest elements a block reduces when the axis is split: enough that the partials and
/// the second pass cost little, few enough that a split fills the GPU.
const MIN_BLOCK_ELEMS: usize = 4096;

/// Which broadcast kernel runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum BinaryPath {
    /// No broadcasting: `out[k] = a[k] ∘ b[k]`.
    Same,
    /// `out` as `[rows, cols]`, one operand full and the other one value per column (`mode` 0)
    /// or per row (`mode` 1); `small_is_a` when the small one is `a`.
    TwoD {
        cols: usize,
        mode: u32,
        small_is_a: bool,
    },
    /// General: dims innermost first, bit k of a mask set where that operand varies along dim k.
    Nd {
        dims_rev: Vec<usize>,
        amask: u32,
        bmask: u32,
    },
}

/// Collapses a broadcast (shapes already checked, `out` non-empty) and picks its kernel path.
/// Size-1 output dims are dropped and neighbouring dims along which both operands vary (or stay
/// fixed) alike are merged, so `[B, T, C] + [C]` becomes the bias case `[B·T, C] + [C]`.
pub(super) fn binary_path(a_shape: &[usize], b_shape: &[usize], out: &[usize]) -> BinaryPath {
    let r = out.len();
    let dim = |s: &[usize], k: usize| {
        if k + s.len() >= r {
            s[k + s.len() - r]
        } else {
            1
        }
    };
    // (size, a varies, b varies), outermost first.
    let mut dims: Vec<(usize, bool, bool)> = Vec::new();
    for (k, &d) in out.iter().enumerate() {
        if d == 1 {
            continue;
        }
        let (va, vb) = (dim(a_shape, k) != 1, dim(b_shape, k) != 1);
        match dims.last_mut() {
            Some(last) if last.1 == va && last.2 == vb => last.0 *= d,
            _ => dims.push((d, va, vb)),
        }
    }
    match dims.as_slice() {
        [] | [(_, true, true)] => BinaryPath::Same,
        [(n, va, _)] => BinaryPath::TwoD {
            cols: *n,
            mode: 1,
            small_is_a: !va,
        },
        [(_, true, true), (c, va, _)] => BinaryPath::TwoD {
            cols: *c,
            mode: 1,
            small_is_a: !va,
        },
        [(_, va, _), (c, true, true)] => BinaryPath::TwoD {
            cols: *c,
            mode: 0,
            small_is_a: !va,
        },
        _ => {
            let (mut amask, mut bmask) = (0, 0);
            let dims_rev = dims
                .iter()
                .rev()
                .enumerate()
                .map(|(t, &(d, va, vb))| {
                    amask |= (va as u32) << t;
                    bmask |= (vb as u32) << t;
                    d
                })
                .collect();
            BinaryPath::Nd {
                dims_rev,
                amask,
                bmask,
            }
        }
    }
}

/// Collapses a permute: drops size-1 axes and merges runs of input axes that stay adjacent and
/// in order in the output. Returns x's collapsed dims (outermost first) and the permutation of
/// them; a rank of 0 or 1 means the permute is a plain copy.
pub(super) fn collapse_permute(shape: &[usize], perm: &[usize]) -> (Vec<usize>, Vec<usize>) {
    // x's axes without the size-1 ones, renumbered, and the output order in those numbers.
    let keep: Vec<usize> = (0..shape.len()).filter(|&k| shape[k] != 1).collect();
    let axes = perm
        .iter()
        .filter(|&&k| shape[k] != 1)
        .map(|k| keep.binary_search(k).expect("kept axis"));
    // Runs of consecutive x axes, in output order: (first axis, last axis, size).
    let mut groups: Vec<(usize, usize, usize)> = Vec::new();
    for k in axes {
        let size = shape[keep[k]];
        match groups.last_mut() {
            Some(g) if g.1 + 1 == k => {
                g.1 = k;
                g.2 *= size;
            }
            _ => groups.push((k, k, size)),
        }
    }
    let mut by_input: Vec<usize> = (0..groups.len()).collect();
    by_input.sort_by_key(|&g| groups[g].0);
    let dims = by_input.iter().map(|&g| groups[g].2).collect();
    let mut perm = vec![0; groups.len()];
    for (pos, &g) in by_input.iter().enumerate() {
        perm[g] = pos;
    }
    (dims, perm)
}

/// Arguments of `permute_tile_f32` for a collapsed permute whose last axis moves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct TilePlan {
    /// x's last axis: length, and its stride in the output.
    pub p: usize,
    pub sp: usize,
    /// The output's last axis: length, and its stride in x.
    pub q: usize,
    pub sq: usize,
    /// Up to 4 batch axes, innermost first: (dim, x stride, output stride).
    pub batch: Vec<(usize, usize, usize)>,
}

/// Plans the tiled transpose of a collapsed permute (`perm[last] != last`, rank 2..=6).
pub(super) fn tile_plan(dims: &[usize], perm: &[usize]) -> TilePlan {
    let r = dims.len();
    let mut in_stride = vec![1; r];
    for k in (0..r - 1).rev() {
        in_stride[k] = in_stride[k + 1] * dims[k + 1];
    }
    let od: Vec<usize> = perm.iter().map(|&k| dims[k]).collect();
    let mut out_stride = vec![1; r];
    for j in (0..r - 1).rev() {
        out_stride[j] = out_stride[j + 1] * od[j + 1];
    }
    let jp = perm
        .iter()
        .position(|&k| k == r - 1)
        .expect("a permutation");
    let batch = (0..r - 1)
        .rev()
        .filter(|&j| j != jp)
        .map(|j| (od[j], in_stride[perm[j]], out_stride[j]))
        .collect();
    TilePlan {
        p: dims[r - 1],
        sp: out_stride[jp],
        q: dims[perm[r - 1]],
        sq: in_stride[perm[r - 1]],
        batch,
    }
}

/// How a reduction pass reads (`MODE` in `kernels/nn_reduce.cuh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReduceLoads {
    /// One element at a time.
    Scalar,
    /// Rows (`inner == 1`) read 16 bytes at a time (`n` and the chunk multiples of that).
    Rows,
    /// 16 bytes across adjacent columns, each thread owning that many columns (`inner` a
    /// multiple of it).
    Cols,
}

/// Thread layout and grid of one reduction pass (see `nn_reduce.cuh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ReducePlan {
    pub loads: ReduceLoads,
    pub tx_log2: u32,
    pub ty_log2: u32,
    /// Chunks the axis is split into (grid.y), each `chunk` long (a multiple of 8).
    pub splits: usize,
    pub chunk: usize,
    pub grid_x: u32,
}

/// Plans a pass over `[outer, n, inner]` (all non-zero) of elements `elem_bytes` wide on a GPU
/// with `sms` multiprocessors. With `allow_split`, an axis long enough is split into chunks
/// when there are too few items (`outer` × column tiles) to fill the GPU with blocks;
/// `vec_ok` allows 16-byte loads.
pub(super) fn reduce_plan(
    outer: usize,
    n: usize,
    inner: usize,
    elem_bytes: usize,
    sms: usize,
    allow_split: bool,
    vec_ok: bool,
) -> ReducePlan {
    let v = 16 / elem_bytes.clamp(1, 16);
    let loads = if !vec_ok || v < 2 {
        ReduceLoads::Scalar
    } else if inner == 1 && n.is_multiple_of(v) {
        ReduceLoads::Rows
    } else if inner > 1 && inner.is_multiple_of(v) {
        ReduceLoads::Cols
    } else {
        ReduceLoads::Scalar
    };
    // Columns a thread owns, and the units (of that many columns) across a row.
    let w = if loads == ReduceLoads::Cols { v } else { 1 };
    let units = inner / w;
    let tx = units.next_power_of_two().min(32);
    let items = outer * units.div_ceil(tx);
    // Split until there are about four blocks a multiprocessor: at 8192 × 8192 bf16 column
    // sums, 16 chunks (512 blocks on 132 SMs) ran 36.2 µs against 38.5 µs for 32 (1024 blocks;
    // H200, one process, docs/benchmarks.md): more chunks only add partials.
    let target = sms.max(1) * 4;
    // A block's chunk covers min(inner, 32·w) columns, so a narrower chunk of a wide column
    // reduction holds as many elements as a long one of a row reduction.
    let min_chunk = (MIN_BLOCK_ELEMS / inner.min(32 * w)).max(16);
    let (mut splits, mut chunk) = (1, n);
    if allow_split && items < target && n >= 2 * min_chunk {
        let s = target.div_ceil(items).min(n / min_chunk).min(65_535);
        chunk = n.div_ceil(s).next_multiple_of(8);
        splits = n.div_ceil(chunk);
    }
    let reads = chunk
        .div_ceil(if loads == ReduceLoads::Rows { v } else { 1 })
        .max(1);
    let mut ty = reads.next_power_of_two().min(REDUCE_THREADS / tx);
    // Items enough for two blocks of eight warps a multiprocessor: at most a warp an item,
    // whose threads add up by shuffles instead of block barriers.
    if items >= 16 * sms.max(1) {
        ty = ty.min((32 / tx).max(1));
    }
    let groups = REDUCE_THREADS / (tx * ty);
    let grid_x = items.div_ceil(groups).clamp(1, sms.max(1) * 32) as u32;
    ReducePlan {
        loads,
        tx_log2: tx.trailing_zeros(),
        ty_log2: ty.trailing_zeros(),
        splits,
        chunk,
        grid_x,
    }
}

/// Blocks a cluster of a split column reduction (`reduce_cluster_*`, `nn_reduce.cuh`): the
/// axis's chunks, one a block.
pub(super) const CLUSTER_SPLITS: usize = 8;

/// Layout of a column reduction split across thread-block clusters (sm_90 and later).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ClusterPlan {
    /// log2 of the 16-byte column units a block owns (TX; THREADS / TX threads down the axis).
    pub tx_log2: u32,
    /// Rows of a chunk (the axis split into `CLUSTER_SPLITS` of them).
    pub chunk: usize,
    /// Blocks: items × `CLUSTER_SPLITS`.
    pub grid_x: u32,
}

/// The cluster form of a split column reduction, when it applies: the device has clusters
/// (`clusters`), `split` (the plan [`reduce_plan`] made) splits 16-byte column loads, and tiles
/// of at least 8 units (128 bytes of a row) still give two blocks a multiprocessor. The tiles
/// narrow from 32 units until there are about `4·sms` blocks (8192 × 8192 bf16: 64 tiles of 16
/// units, 512 blocks), like the split target.
pub(super) fn cluster_plan(
    split: &ReducePlan,
    outer: usize,
    n: usize,
    inner: usize,
    elem_bytes: usize,
    sms: usize,
    clusters: bool,
) -> Option<ClusterPlan> {
    if !clusters || split.loads != ReduceLoads::Cols || split.splits <= 1 {
        return None;
    }
    let units = inner / (16 / elem_bytes.clamp(1, 16));
    let target = sms.max(1) * 4;
    let blocks = |tx: usize| {
        outer
            .saturating_mul(units.div_ceil(tx))
            .saturating_mul(CLUSTER_SPLITS)
    };
    let mut tx = units.next_power_of_two().min(32);
    while tx > 8 && blocks(tx) * 2 <= target {
        tx /= 2;
    }
    let grid_x = blocks(tx);
    if grid_x < 2 * sms.max(1) || grid_x > u32::MAX as usize {
        return None;
    }
    Some(ClusterPlan {
        tx_log2: tx.trailing_zeros(),
        chunk: n.div_ceil(CLUSTER_SPLITS),
        grid_x: grid_x as u32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_paths() {
        assert_eq!(binary_path(&[4, 5], &[4, 5], &[4, 5]), BinaryPath::Same);
        assert_eq!(binary_path(&[1, 7], &[7], &[1, 7]), BinaryPath::Same);
        assert_eq!(binary_path(&[], &[], &[]), BinaryPath::Same);
        let bias = BinaryPath::TwoD {
            cols: 8,
            mode: 0,
            small_is_a: false,
        };
        assert_eq!(binary_path(&[2, 3, 8], &[8], &[2, 3, 8]), bias);
        assert_eq!(binary_path(&[2, 3, 8], &[1, 1, 8], &[2, 3, 8]), bias);
        assert_eq!(
            binary_path(&[8], &[2, 3, 8], &[2, 3, 8]),
            BinaryPath::TwoD {
                cols: 8,
                mode: 0,
                small_is_a: true
            }
        );
        assert_eq!(
            binary_path(&[6, 5], &[6, 1], &[6, 5]),
            BinaryPath::TwoD {
                cols: 5,
                mode: 1,
                small_is_a: false
            }
        );
        assert_eq!(
            binary_path(&[6, 5], &[], &[6, 5]),
            BinaryPath::TwoD {
                cols: 30,
                mode: 1,
                small_is_a: false
            }
        );
        assert_eq!(
            binary_path(&[2, 1], &[1, 3], &[2, 3]),
            BinaryPath::Nd {
                dims_rev: vec![3, 2],
                amask: 0b10,
                bmask: 0b01
            }
        );
        // An attention mask [B, 1, T, T] over scores [B, H, T, T].
        assert_eq!(
            binary_path(&[2, 4, 3, 3], &[2, 1, 3, 3], &[2, 4, 3, 3]),
            BinaryPath::Nd {
                dims_rev: vec![9, 4, 2],
                amask: 0b111,
                bmask: 0b101
            }
        );
    }

    #[test]
    fn permute_collapse() {
        // [B, T, H, D] -> [B, H, T, D] keeps its 4 axes.
        assert_eq!(
            collapse_permute(&[2, 3, 4, 5], &[0, 2, 1, 3]),
            (vec![2, 3, 4, 5], vec![0, 2, 1, 3])
        );
        // Size-1 axes go, adjacent runs merge: [1, 2, 3, 4] by [3, 0, 1, 2] is [24/4, 4]ᵀ.
        assert_eq!(
            collapse_permute(&[1, 2, 3, 4], &[3, 0, 1, 2]),
            (vec![6, 4], vec![1, 0])
        );
        assert_eq!(
            collapse_permute(&[5, 1, 7], &[1, 0, 2]),
            (vec![35], vec![0])
        );
        assert_eq!(collapse_permute(&[1, 1], &[1, 0]), (vec![], vec![]));
    }

    #[test]
    fn tiles() {
        // [B, H, T, D] -> [B, H, D, T].
        let t = tile_plan(&[6, 7, 5], &[0, 2, 1]);
        assert_eq!((t.p, t.sp, t.q, t.sq), (5, 7, 7, 5));
        assert_eq!(t.batch, vec![(6, 35, 35)]);
        let t = tile_plan(&[3, 4], &[1, 0]);
        assert_eq!((t.p, t.sp, t.q, t.sq, t.batch.len()), (4, 3, 3, 4, 0));
    }

    #[test]
    fn reduce_layouts() {
        use ReduceLoads::*;
        // Long rows, few of them: split, whole block per row chunk, 16-byte loads.
        let p = reduce_plan(2, 1 << 20, 1, 4, 132, true, true);
        assert!(p.loads == Rows && p.splits > 1 && p.chunk.is_multiple_of(8));
        assert_eq!((p.tx_log2, p.ty_log2), (0, 8));
        assert!(p.splits * p.chunk >= 1 << 20 && (p.splits - 1) * p.chunk < 1 << 20);
        // Many short rows of 8: two threads (one float4 each) per row, 128 rows per block.
        let p = reduce_plan(10_000, 8, 1, 4, 132, true, true);
        assert_eq!((p.splits, p.tx_log2, p.ty_log2, p.loads), (1, 0, 1, Rows));
        // Many long bf16 rows: a warp a row (8 bf16 a load), no split.
        let p = reduce_plan(8192, 4096, 1, 2, 132, true, true);
        assert_eq!((p.splits, p.tx_log2, p.ty_log2, p.loads), (1, 0, 5, Rows));
        // A few long rows: a block a row.
        let p = reduce_plan(1024, 4096, 1, 2, 132, true, true);
        assert_eq!((p.splits, p.ty_log2), (1, 8));
        // A bias gradient [8192, 768] f32 summed over rows: 192 float4 units, 6 tiles of 32,
        // split 88 ways (chunks of 96 rows).
        let p = reduce_plan(1, 8192, 768, 4, 132, true, true);
        assert_eq!((p.loads, p.tx_log2, p.ty_log2), (Cols, 5, 3));
        assert_eq!((p.splits, p.chunk), (86, 96));
        // 8192 × 8192 bf16 columns: 32 tiles of 256 columns, 17 chunks.
        let p = reduce_plan(1, 8192, 8192, 2, 132, true, true);
        assert_eq!((p.loads, p.tx_log2, p.ty_log2, p.splits), (Cols, 5, 3, 17));
        // The same in bf16: 96 units of 8 columns, 3 tiles.
        let p = reduce_plan(1, 8192, 768, 2, 132, true, true);
        assert_eq!((p.loads, p.tx_log2, p.ty_log2), (Cols, 5, 3));
        // Columns, no split: 32 wide tiles, 8 threads down the axis; 100 columns are not a
        // multiple of 8 bf16, so one element a load.
        let p = reduce_plan(4, 1000, 100, 2, 132, false, true);
        assert_eq!((p.loads, p.tx_log2, p.ty_log2, p.splits), (Scalar, 5, 3, 1));
        // Narrow columns pack rows into a warp.
        let p = reduce_plan(1, 100, 3, 4, 132, true, true);
        assert_eq!((p.tx_log2, p.ty_log2, p.loads), (2, 6, Scalar));
        // Vectors off (the max backward).
        let p = reduce_plan(8192, 4096, 1, 2, 132, false, false);
        assert_eq!(p.loads, Scalar);
    }

    /// Which split column reductions run as clusters, and their layout.
    #[test]
    fn cluster_layouts() {
        let cluster = |outer, n, inner, bytes, clusters| {
            let p = reduce_plan(outer, n, inner, bytes, 132, true, true);
            cluster_plan(&p, outer, n, inner, bytes, 132, clusters)
        };
        // The bf16 bias gradient of 8192 columns: 64 tiles of 16 units (128 columns), 512
        // blocks, chunks of 1024 rows.
        let c = cluster(1, 8192, 8192, 2, true).unwrap();
        assert_eq!((c.tx_log2, c.chunk, c.grid_x), (4, 1024, 512));
        // f32 columns: 4096 of them, 1024 units: also 64 tiles.
        let c = cluster(1, 8192, 4096, 4, true).unwrap();
        assert_eq!((c.tx_log2, c.grid_x), (4, 512));
        // No clusters on the device, no split, scalar loads, or tiles too narrow to fill it
        // (768 f32 columns: 192 units): the other paths.
        assert_eq!(cluster(1, 8192, 8192, 2, false), None);
        assert_eq!(cluster(4096, 64, 8192, 2, true), None);
        assert_eq!(cluster(1, 8192, 8190, 2, true), None);
        assert_eq!(cluster(1, 8192, 768, 4, true), None);
    }
}
