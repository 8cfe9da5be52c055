// Templates of the axis reductions: Sum / Mean / Max over the middle axis of x viewed as
// [outer, n, inner], and the backward of Max, on element storage types (float or bf16, see
// nn_elem_io.cuh). CPU reference: gpu_core::cpu::elementwise (f64 accumulation). Values are
// accumulated and finished in f32 whatever the types, and rounded once when stored to bf16.
// nn_reduce.cu instantiates the f32 kernels, nn_reduce_bf16.cu the bf16 ones.
//
// One layout serves rows (inner == 1) and columns (inner > 1): a block of 256 threads is split
// into G groups of TY × TX threads (tx fastest, TX and TY powers of two). A group reduces one
// item, TX adjacent column units of one o (a unit: one column, or W adjacent columns), its TY
// threads striding over the axis, so a warp reads contiguous memory: TX units × 32/TX
// consecutive rows. The host picks TX = min(32, units of inner) and TY = min(256/TX, rows to
// read) (rounded to powers of two), at most a warp per item when there are items enough to fill
// the GPU that way; a group within one warp adds its threads' values by shuffles, a wider one
// through shared memory. Short rows pack many items into a block and long rows get up to the
// whole block. When there are too few items to fill the GPU, the axis is split into S chunks
// (grid.y): the first pass writes partials [outer, S, inner] and a second pass reduces them;
// both passes are deterministic. On sm_90, 16-byte column loads split 8 ways use a cluster
// instead (reduce_cluster_*, below): one launch, no partials in global memory.
//
// Loads (MODE): 0 one element at a time; 1 rows (inner == 1) read 16 bytes at a time (V16<TI>::N
// elements, n and chunk multiples of it); 2 columns read 16 bytes at a time, each thread owning
// W = V16<TI>::N adjacent columns (inner a multiple of W).
#pragma once

#include "nn_elem_io.cuh"

#define THREADS 256

struct SumOp {
    static __device__ __forceinline__ float init() { return 0.0f; }
    static __device__ __forceinline__ float combine(float a, float b) { return a + b; }
    static __device__ __forceinline__ float finish(float a, float divisor) { return a / divisor; }
};

// NaN propagates (as PyTorch's max); +0 counts above −0 (IEEE 754-2019 maximum); other ties
// keep the left value. So the result does not depend on the combining order (the CPU's
// max_combine is the same rule).
struct MaxOp {
    static __device__ __forceinline__ float init() { return -INFINITY; }
    static __device__ __forceinline__ float combine(float a, float b) {
        const bool zero_up = b == 0.0f && a == 0.0f && signbit(a) && !signbit(b);
        return (b > a || b != b || zero_up) ? b : a;
    }
    static __device__ __forceinline__ float finish(float a, float) { return a; }
};

// The columns each thread owns.
template <int MODE, class TI>
struct ReduceCols {
    static constexpr int W = MODE == 2 ? V16<TI>::N : 1;
};

// out[(o·S + s)·inner + j] = finish(reduce of x[o, i, j] over i in chunk s), S = gridDim.y.
// Columns j .. j + W − 1 of item o (16-byte units: column j, a multiple of W, of row i is unit
// (o·n·inner + i·inner + j) / W), rows i, i + TY, ... below i1, combined into acc: four rows'
// loads in flight, added as ((a + b) + (c + d)) into acc, then the rest one at a time.
template <class Op, class TI, int W>
static __device__ __forceinline__ void cols16_accumulate(const TI* __restrict__ x, float (&acc)[W],
                                                         u64 n, u64 inner, u64 o, u64 j, u64 i,
                                                         u64 i1, u32 TY) {
    const u64 stride = inner / W, at = (o * n * inner + j) / W;
    for (; i + 3 * TY < i1; i += 4 * TY) {
        float a[W], b[W], c[W], d[W];
        load16(x, at + i * stride, a);
        load16(x, at + (i + TY) * stride, b);
        load16(x, at + (i + 2 * TY) * stride, c);
        load16(x, at + (i + 3 * TY) * stride, d);
#pragma unroll
        for (int k = 0; k < W; ++k)
            acc[k] = Op::combine(acc[k],
                                 Op::combine(Op::combine(a[k], b[k]), Op::combine(c[k], d[k])));
    }
    for (; i < i1; i += TY) {
        float a[W];
        load16(x, at + i * stride, a);
#pragma unroll
        for (int k = 0; k < W; ++k) acc[k] = Op::combine(acc[k], a[k]);
    }
}

// The tree over ty through shared memory (sm: THREADS·W floats): level h combines ty with
// ty + h (left first); acc of the ty = 0 threads ends as their group's result. Only thread t
// reads sm[c·THREADS + t] after the last barrier, and sm is written again only after every
// thread has passed it, so no further barrier is needed before the next use.
template <class Op, int W>
static __device__ __forceinline__ void smem_tree(float* sm, float (&acc)[W], u32 t, u32 ty,
                                                 u32 TY, u32 tx_log2) {
#pragma unroll
    for (int c = 0; c < W; ++c) sm[c * THREADS + t] = acc[c];
    __syncthreads();
    for (u32 h = TY >> 1; h > 0; h >>= 1) {
        if (ty < h) {
#pragma unroll
            for (int c = 0; c < W; ++c)
                sm[c * THREADS + t] =
                    Op::combine(sm[c * THREADS + t], sm[c * THREADS + t + (h << tx_log2)]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int c = 0; c < W; ++c) acc[c] = sm[c * THREADS + t];
}

// A group's item of the grid-stride loops below (items = outer · tiles, tiles of TX = 2^tx_log2
// units of W columns): its outer index o and the first column j of this thread's unit (tx);
// valid when the item exists and j < inner (o = j = 0 otherwise).
template <int W>
static __device__ __forceinline__ bool group_item(u64 item, u64 items, u64 tiles, u32 tx_log2,
                                                  u32 tx, u64 inner, u64& o, u64& j) {
    o = 0;
    j = 0;
    bool valid = false;
    if (item < items) {
        o = item / tiles;
        j = (((item - o * tiles) << tx_log2) + tx) * W;
        valid = j < inner;
    }
    return valid;
}

// sm is the kernel's shared array of THREADS·W floats (unused when a group fits in a warp).
template <class Op, int MODE, class TI, class TO>
static __device__ __forceinline__ void reduce_impl(float* sm, const TI* __restrict__ x,
                                                   TO* __restrict__ out, u64 outer, u64 n,
                                                   u64 inner, u64 chunk, u32 tx_log2,
                                                   u32 ty_log2, float divisor) {
    constexpr int V = V16<TI>::N, W = ReduceCols<MODE, TI>::W;
    const u32 TX = 1u << tx_log2, TY = 1u << ty_log2, t = threadIdx.x;
    const u32 tx = t & (TX - 1), ty = (t >> tx_log2) & (TY - 1), g = t >> (tx_log2 + ty_log2);
    const u64 G = THREADS >> (tx_log2 + ty_log2);
    const u64 units = (inner + W - 1) / W, tiles = (units + TX - 1) >> tx_log2;
    const u64 items = outer * tiles;
    const u64 S = gridDim.y, s = blockIdx.y;
    const u64 i0 = s * chunk, i1 = min(n, i0 + chunk);
    const bool in_warp = (TX << ty_log2) <= 32u;
    for (u64 base = (u64)blockIdx.x * G; base < items; base += (u64)gridDim.x * G) {
        u64 o, j;
        const bool valid = group_item<W>(base + g, items, tiles, tx_log2, tx, inner, o, j);
        float acc[W];
#pragma unroll
        for (int c = 0; c < W; ++c) acc[c] = Op::init();
        if (valid) {
            if constexpr (MODE == 1) {
                const TI* row = x + o * n;
                const u64 e = i1 / V;
                u64 i = i0 / V + ty;
                for (; i + 3 * TY < e; i += 4 * TY) {
                    float a[V], b[V], c[V], d[V];
                    load16(row, i, a);
                    load16(row, i + TY, b);
                    load16(row, i + 2 * TY, c);
                    load16(row, i + 3 * TY, d);
#pragma unroll
                    for (int k = 0; k < V; ++k)
                        a[k] = Op::combine(Op::combine(a[k], b[k]), Op::combine(c[k], d[k]));
#pragma unroll
                    for (int k = 0; k < V; ++k) acc[0] = Op::combine(acc[0], a[k]);
                }
                for (; i < e; i += TY) {
                    float a[V];
                    load16(row, i, a);
#pragma unroll
                    for (int k = 0; k < V; ++k) acc[0] = Op::combine(acc[0], a[k]);
                }
            } else if constexpr (MODE == 2) {
                cols16_accumulate<Op>(x, acc, n, inner, o, j, i0 + ty, i1, TY);
            } else {
                const TI* col = x + o * n * inner + j;
                u64 i = i0 + ty;
                for (; i + 3 * TY < i1; i += 4 * TY) {
                    const float a = load(col, i * inner), b = load(col, (i + TY) * inner),
                                c = load(col, (i + 2 * TY) * inner),
                                d = load(col, (i + 3 * TY) * inner);
                    acc[0] = Op::combine(acc[0], Op::combine(Op::combine(a, b), Op::combine(c, d)));
                }
                for (; i < i1; i += TY) acc[0] = Op::combine(acc[0], load(col, i * inner));
            }
        }
        // Tree over ty within each (g, tx): level h combines ty with ty + h (left first), the
        // same order by shuffles inside a warp as through sm[c·THREADS + t] across warps.
        if (in_warp) {
            for (u32 h = TY >> 1; h > 0; h >>= 1) {
#pragma unroll
                for (int c = 0; c < W; ++c)
                    acc[c] = Op::combine(acc[c], __shfl_down_sync(0xffffffffu, acc[c], h << tx_log2));
            }
        } else {
            smem_tree<Op>(sm, acc, t, ty, TY, tx_log2);
        }
        if (ty == 0 && valid) {
#pragma unroll
            for (int c = 0; c < W; ++c)
                store(out, (o * S + s) * inner + j + c, Op::finish(acc[c], divisor));
        }
    }
}

// One reduction kernel: PREFIX<NAME>_<SUFFIX> on loads MODE, reading TI and writing TO.
#define REDUCE_KERNEL(PREFIX, MODE, NAME, OP, TI, TO, SUFFIX)                                    \
    extern "C" __global__ void __launch_bounds__(THREADS)                                       \
        PREFIX##NAME##_##SUFFIX(const TI* __restrict__ x, TO* __restrict__ out, u64 outer,      \
                                u64 n, u64 inner, u64 chunk, u32 tx_log2, u32 ty_log2,           \
                                float divisor) {                                                 \
        __shared__ float sm[THREADS * ReduceCols<MODE, TI>::W];                                  \
        reduce_impl<OP, MODE, TI, TO>(sm, x, out, outer, n, inner, chunk, tx_log2, ty_log2,      \
                                      divisor);                                                  \
    }

// Column reductions split across a thread-block cluster (sm_90 and later): the 16-byte column
// loads of MODE 2 with the axis cut into CLUSTER_SPLITS chunks, one a block of a cluster, and
// the chunks' sums added through distributed shared memory instead of f32 partials in global
// memory and a second pass. Block b of the grid reduces item b / CLUSTER_SPLITS (o and a tile of
// TX·W columns) over chunk r = its rank in the cluster: TX × TY threads (TX·TY = THREADS), each
// summing W columns down its rows, then a tree over ty in shared memory (the order of
// reduce_impl). After a cluster barrier, rank r adds the CLUSTER_SPLITS blocks' sums of its
// share of the tile's columns in rank order, finishes and writes them; a second barrier keeps
// every block's shared memory alive until its peers have read it. Deterministic.
#define CLUSTER_SPLITS 8

// Every thread of every block of the cluster waits here for all the others, with release and
// acquire of memory (shared memory included). The block barrier first converges the block's
// threads, whatever branches they took, and the barrier.cluster forms without .aligned do not
// need converged warps either.
static __device__ __forceinline__ void cluster_sync_all() {
#if __CUDA_ARCH__ >= 900
    __syncthreads();
    asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
#endif
}

template <class Op, class TI, class TO>
static __device__ __forceinline__ void reduce_cluster_impl(float* sm, float* sums,
                                                           const TI* __restrict__ x,
                                                           TO* __restrict__ out, u64 n, u64 inner,
                                                           u64 chunk, u32 tx_log2,
                                                           float divisor) {
#if __CUDA_ARCH__ >= 900
    constexpr int W = V16<TI>::N;
    const u32 TX = 1u << tx_log2, TY = THREADS >> tx_log2, t = threadIdx.x;
    const u32 tx = t & (TX - 1), ty = t >> tx_log2;
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    const u64 tiles = (inner / W + TX - 1) >> tx_log2, item = blockIdx.x / CLUSTER_SPLITS;
    const u64 o = item / tiles, j = (((item - o * tiles) << tx_log2) + tx) * W;
    const bool valid = j < inner;
    const u64 i0 = r * chunk, i1 = min(n, i0 + chunk);
    float acc[W];
#pragma unroll
    for (int c = 0; c < W; ++c) acc[c] = Op::init();
    if (valid) {
        cols16_accumulate<Op>(x, acc, n, inner, o, j, i0 + ty, i1, TY);
    }
    smem_tree<Op>(sm, acc, t, ty, TY, tx_log2);
    // This block's sums of the tile's TX·W columns, column tx·W + c at sums[tx·W + c].
    if (ty == 0) {
#pragma unroll
        for (int c = 0; c < W; ++c) sums[tx * W + c] = acc[c];
    }
    cluster_sync_all();
    const u32 cols = TX * W, share = (cols + CLUSTER_SPLITS - 1) / CLUSTER_SPLITS;
    if (t < share) {
        const u32 c = r * share + t;
        const u64 jc = ((item - o * tiles) << tx_log2) * W + c;
        if (c < cols && jc < inner) {
            const u32 a = (u32)__cvta_generic_to_shared(sums + c);
            float v = Op::init();
            for (u32 q = 0; q < CLUSTER_SPLITS; ++q) {
                u32 ra;
                float e;
                asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(a), "r"(q));
                asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(e) : "r"(ra) : "memory");
                v = Op::combine(v, e);
            }
            store(out, o * inner + jc, Op::finish(v, divisor));
        }
    }
    cluster_sync_all();
#else
    __trap();
#endif
}

// reduce_cluster_colsv_<NAME>_<SUFFIX>: grid.x = items·CLUSTER_SPLITS in clusters of
// CLUSTER_SPLITS along x, THREADS threads a block.
#define REDUCE_CLUSTER_KERNEL(NAME, OP, TI, TO, SUFFIX)                                          \
    extern "C" __global__ void __launch_bounds__(THREADS) reduce_cluster_colsv_##NAME##_##SUFFIX( \
        const TI* __restrict__ x, TO* __restrict__ out, u64 n, u64 inner, u64 chunk,            \
        u32 tx_log2, float divisor) {                                                            \
        __shared__ float sm[THREADS * V16<TI>::N];                                               \
        __shared__ float sums[32 * V16<TI>::N];                                                  \
        reduce_cluster_impl<OP, TI, TO>(sm, sums, x, out, n, inner, chunk, tx_log2, divisor);    \
    }

// reduce_<NAME>_<SUFFIX>, reduce_rowsv_<NAME>_<SUFFIX> and reduce_colsv_<NAME>_<SUFFIX> (MODE
// 0, 1, 2), and reduce_cluster_colsv_<NAME>_<SUFFIX>.
#define REDUCE_KERNELS(NAME, OP, TI, TO, SUFFIX)                 \
    REDUCE_KERNEL(reduce_, 0, NAME, OP, TI, TO, SUFFIX)          \
    REDUCE_KERNEL(reduce_rowsv_, 1, NAME, OP, TI, TO, SUFFIX)    \
    REDUCE_KERNEL(reduce_colsv_, 2, NAME, OP, TI, TO, SUFFIX)   \
    REDUCE_CLUSTER_KERNEL(NAME, OP, TI, TO, SUFFIX)

// Backward of Max over the axis, same layout without splits: each group finds the first i with
// x[o, i, j] == y[o, j] (or both NaN) as a min over its threads' first matches, then writes the
// whole column: dx[o, i, j] = i == first ? dy[o, j] : 0. Reads x once, writes dx once. first is
// the kernel's shared array of THREADS u64.
template <class T>
static __device__ __forceinline__ void max_axis_bwd_impl(u64* first, const T* __restrict__ x,
                                                         const T* __restrict__ y,
                                                         const T* __restrict__ dy,
                                                         T* __restrict__ dx, u64 outer, u64 n,
                                                         u64 inner, u32 tx_log2, u32 ty_log2) {
    const u32 TX = 1u << tx_log2, TY = 1u << ty_log2, t = threadIdx.x;
    const u32 tx = t & (TX - 1), ty = (t >> tx_log2) & (TY - 1), g = t >> (tx_log2 + ty_log2);
    const u64 G = THREADS >> (tx_log2 + ty_log2);
    const u64 tiles = (inner + TX - 1) >> tx_log2, items = outer * tiles;
    for (u64 base = (u64)blockIdx.x * G; base < items; base += (u64)gridDim.x * G) {
        u64 o, j;
        const bool valid = group_item<1>(base + g, items, tiles, tx_log2, tx, inner, o, j);
        u64 f = n;  // none found
        if (valid) {
            const float m = load(y, o * inner + j);
            const T* col = x + o * n * inner + j;
            for (u64 i = ty; i < n; i += TY) {
                const float v = load(col, i * inner);
                if (v == m || (v != v && m != m)) {
                    f = i;
                    break;
                }
            }
        }
        first[t] = f;
        __syncthreads();
        for (u32 h = TY >> 1; h > 0; h >>= 1) {
            if (ty < h) first[t] = min(first[t], first[t + (h << tx_log2)]);
            __syncthreads();
        }
        const u64 fi = first[t - (ty << tx_log2)];
        if (valid) {
            const float gv = load(dy, o * inner + j);
            T* dcol = dx + o * n * inner + j;
            for (u64 i = ty; i < n; i += TY) store(dcol, i * inner, i == fi ? gv : 0.0f);
        }
        __syncthreads();  // first[] is rewritten by the next item
    }
}

#define MAX_AXIS_BWD_KERNEL(T, SUFFIX)                                                           \
    extern "C" __global__ void __launch_bounds__(THREADS) max_axis_bwd_##SUFFIX(                \
        const T* __restrict__ x, const T* __restrict__ y, const T* __restrict__ dy,             \
        T* __restrict__ dx, u64 outer, u64 n, u64 inner, u32 tx_log2, u32 ty_log2) {            \
        __shared__ u64 first[THREADS];                                                           \
        max_axis_bwd_impl<T>(first, x, y, dy, dx, outer, n, inner, tx_log2, ty_log2);            \
    }
