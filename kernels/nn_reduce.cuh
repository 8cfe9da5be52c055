// Templates of the axis reductions: Sum / Mean / Max over the middle axis of x viewed as
// [outer, n, inner], and the backward of Max, on element storage types (float or bf16, see
// nn_elem_io.cuh). CPU reference: gpu_core::cpu::elementwise (f64 accumulation). Values are
// accumulated and finished in f32 whatever the types, and rounded once when stored to bf16.
// nn_reduce.cu instantiates the f32 kernels, nn_reduce_bf16.cu the bf16 ones.
//
// One layout serves rows (inner == 1) and columns (inner > 1): a block of 256 threads is split
// into G groups of TY × TX threads (tx fastest, TX and TY powers of two). A group reduces one
// item, TX adjacent columns j of one o, its TY threads striding over the axis, so a warp reads
// contiguous memory: TX columns × 32/TX consecutive rows. The host picks TX = min(32, inner)
// and TY = min(256/TX, rows to read) (rounded to powers of two), so short rows pack many items
// into a block and long rows get the whole block. When there are too few items to fill the GPU,
// the axis is split into S chunks (grid.y): the first pass writes partials [outer, S, inner]
// and a second pass reduces them; both passes are deterministic.
#pragma once

#include "nn_elem_io.cuh"

#define THREADS 256

struct SumOp {
    static __device__ __forceinline__ float init() { return 0.0f; }
    static __device__ __forceinline__ float combine(float a, float b) { return a + b; }
    static __device__ __forceinline__ float finish(float a, float divisor) { return a / divisor; }
};

// NaN propagates (as PyTorch's max); ties keep the left value.
struct MaxOp {
    static __device__ __forceinline__ float init() { return -INFINITY; }
    static __device__ __forceinline__ float combine(float a, float b) {
        return (b > a || b != b) ? b : a;
    }
    static __device__ __forceinline__ float finish(float a, float) { return a; }
};

// out[(o·S + s)·inner + j] = finish(reduce of x[o, i, j] over i in chunk s), S = gridDim.y.
// VEC == 4 reads 4 elements at a time (a float4, or 4 bf16 in 8 bytes; needs inner == 1,
// TX == 1, n and chunk multiples of 4). sm is the kernel's shared array of THREADS floats.
template <class Op, int VEC, class TI, class TO>
static __device__ __forceinline__ void reduce_impl(float* sm, const TI* __restrict__ x,
                                                   TO* __restrict__ out, u64 outer, u64 n,
                                                   u64 inner, u64 chunk, u32 tx_log2,
                                                   u32 ty_log2, float divisor) {
    const u32 TX = 1u << tx_log2, TY = 1u << ty_log2, t = threadIdx.x;
    const u32 tx = t & (TX - 1), ty = (t >> tx_log2) & (TY - 1), g = t >> (tx_log2 + ty_log2);
    const u64 G = THREADS >> (tx_log2 + ty_log2);
    const u64 tiles = (inner + TX - 1) >> tx_log2, items = outer * tiles;
    const u64 S = gridDim.y, s = blockIdx.y;
    const u64 i0 = s * chunk, i1 = min(n, i0 + chunk);
    for (u64 base = (u64)blockIdx.x * G; base < items; base += (u64)gridDim.x * G) {
        const u64 item = base + g;
        u64 o = 0, j = 0;
        bool valid = false;
        if (item < items) {
            o = item / tiles;
            j = ((item - o * tiles) << tx_log2) + tx;
            valid = j < inner;
        }
        float acc = Op::init();
        if (valid) {
            if (VEC == 4) {
                const TI* row = x + o * n;
                const u64 e = i1 / 4;
                u64 i = i0 / 4 + ty;
                for (; i + 3 * TY < e; i += 4 * TY) {
                    const float4 a = load4(row, i), b = load4(row, i + TY),
                                 c = load4(row, i + 2 * TY), d = load4(row, i + 3 * TY);
                    const float ra = Op::combine(Op::combine(a.x, a.y), Op::combine(a.z, a.w));
                    const float rb = Op::combine(Op::combine(b.x, b.y), Op::combine(b.z, b.w));
                    const float rc = Op::combine(Op::combine(c.x, c.y), Op::combine(c.z, c.w));
                    const float rd = Op::combine(Op::combine(d.x, d.y), Op::combine(d.z, d.w));
                    acc = Op::combine(acc, Op::combine(Op::combine(ra, rb), Op::combine(rc, rd)));
                }
                for (; i < e; i += TY) {
                    const float4 a = load4(row, i);
                    acc = Op::combine(acc,
                                      Op::combine(Op::combine(a.x, a.y), Op::combine(a.z, a.w)));
                }
            } else {
                const TI* col = x + o * n * inner + j;
                u64 i = i0 + ty;
                for (; i + 3 * TY < i1; i += 4 * TY) {
                    const float a = load(col, i * inner), b = load(col, (i + TY) * inner),
                                c = load(col, (i + 2 * TY) * inner),
                                d = load(col, (i + 3 * TY) * inner);
                    acc = Op::combine(acc, Op::combine(Op::combine(a, b), Op::combine(c, d)));
                }
                for (; i < i1; i += TY) acc = Op::combine(acc, load(col, i * inner));
            }
        }
        // Tree over ty within each (g, tx); sm[t] with t = (g·TY + ty)·TX + tx.
        sm[t] = acc;
        __syncthreads();
        for (u32 h = TY >> 1; h > 0; h >>= 1) {
            if (ty < h) sm[t] = Op::combine(sm[t], sm[t + (h << tx_log2)]);
            __syncthreads();
        }
        // Only thread t reads sm[t] from here on, and the next item writes sm only after every
        // thread has passed the last barrier above, so no further barrier is needed.
        if (ty == 0 && valid) {
            const float r = Op::finish(sm[t], divisor);
            store(out, (o * S + s) * inner + j, r);
        }
    }
}

// reduce_<NAME>_<SUFFIX> and reduce_rows4_<NAME>_<SUFFIX>, reading TI and writing TO.
#define REDUCE_KERNELS(NAME, OP, TI, TO, SUFFIX)                                                 \
    extern "C" __global__ void __launch_bounds__(THREADS)                                       \
        reduce_##NAME##_##SUFFIX(const TI* __restrict__ x, TO* __restrict__ out, u64 outer,     \
                                 u64 n, u64 inner, u64 chunk, u32 tx_log2, u32 ty_log2,          \
                                 float divisor) {                                                \
        __shared__ float sm[THREADS];                                                            \
        reduce_impl<OP, 1, TI, TO>(sm, x, out, outer, n, inner, chunk, tx_log2, ty_log2,         \
                                   divisor);                                                     \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(THREADS)                                       \
        reduce_rows4_##NAME##_##SUFFIX(const TI* __restrict__ x, TO* __restrict__ out,          \
                                       u64 outer, u64 n, u64 inner, u64 chunk, u32 tx_log2,      \
                                       u32 ty_log2, float divisor) {                             \
        __shared__ float sm[THREADS];                                                            \
        reduce_impl<OP, 4, TI, TO>(sm, x, out, outer, n, inner, chunk, tx_log2, ty_log2,         \
                                   divisor);                                                     \
    }

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
        const u64 item = base + g;
        u64 o = 0, j = 0;
        bool valid = false;
        if (item < items) {
            o = item / tiles;
            j = ((item - o * tiles) << tx_log2) + tx;
            valid = j < inner;
        }
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
