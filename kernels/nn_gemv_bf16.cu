// Skinny bf16 GEMM for decoding: out[i, j] = Σ_k x[i, k]·w[j, k] for m <= 4 rows of x (the
// tokens of one decode step) against a [n, k] weight (PyTorch's Linear layout), f32
// accumulation, out f32 or bf16 (rounded once). Each warp streams NR weight rows with 16-byte
// loads that bypass L1 (read once), keeps x's rows in L1, and sums its lanes' partial dot
// products with shuffles (a Llama-3.2-1B decode step at batch 1 on an H200: 2.47 ms with these
// kernels against 2.81 ms with cuBLAS, whose kernels for this shape were not profiled). k must be a multiple of 8 (16-byte rows). Reference:
// gpu_cuda::blas_bf16::matmul_bf16_reference (the same products, summed in another order).

#include "common.cuh"
#include "nn_elem_io.cuh"

#define GEMV_WARPS 8

static __device__ __forceinline__ uint4 ld_stream(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

static __device__ __forceinline__ void unpack8(uint4 v, float* f) {
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

static __device__ __forceinline__ void store(float* o, float v) { *o = v; }
static __device__ __forceinline__ void store(bf16* o, float v) { o->bits = float_to_bf16_bits(v); }

// acc[i][r] += x[i, 8c .. 8c+8] · w[j0 + r, 8c .. 8c+8] for rows i < m and j0 + r < n: one 16-byte
// chunk of R weight rows (streamed past L1) against the same chunk of x's rows (read-only cache).
template <int M, int R>
static __device__ __forceinline__ void chunk_step(float (&acc)[M][R], const bf16* __restrict__ x,
                                                  const bf16* __restrict__ w, u32 m, u32 n, u32 k,
                                                  u32 j0, u32 c) {
    float wf[R][8];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if (j0 + r < n)
            unpack8(ld_stream(w + (u64)(j0 + r) * k + (u64)c * 8), wf[r]);
        else
#pragma unroll
            for (int e = 0; e < 8; ++e) wf[r][e] = 0.0f;
    }
#pragma unroll
    for (int i = 0; i < M; ++i) {
        if (i < (int)m) {
            float xf[8];
            unpack8(__ldg(reinterpret_cast<const uint4*>(x + (u64)i * k + (u64)c * 8)), xf);
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[i][r] = fmaf(xf[e], wf[r][e], acc[i][r]);
        }
    }
}

// acc[i][r] = the partial dot products of x's rows i < m with weight rows j0 + r < n over the
// chunks c = first, first + stride, ... < k/8 (a thread's share of k in both forms below).
template <int M, int R>
static __device__ __forceinline__ void chunk_sum(float (&acc)[M][R], const bf16* __restrict__ x,
                                                 const bf16* __restrict__ w, u32 m, u32 n, u32 k,
                                                 u32 j0, u32 first, u32 stride) {
#pragma unroll
    for (int i = 0; i < M; ++i)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[i][r] = 0.0f;
    const u32 chunks = k >> 3;
#pragma unroll 2
    for (u32 c = first; c < chunks; c += stride) chunk_step<M, R>(acc, x, w, m, n, k, j0, c);
}

template <int M, int NR, typename TO>
static __device__ void gemv_body(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                 TO* __restrict__ out, u32 m, u32 n, u32 k) {
    const u32 lane = threadIdx.x & 31;
    const u32 j0 = (blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) * NR;
    if (j0 >= n) return;
    float acc[M][NR];
    chunk_sum<M, NR>(acc, x, w, m, n, k, j0, lane, 32);
#pragma unroll
    for (int i = 0; i < M; ++i)
#pragma unroll
        for (int r = 0; r < NR; ++r) {
            const float v = warp_sum(acc[i][r]);
            if (lane == 0 && i < (int)m && j0 + r < n) store(out + (u64)i * n + j0 + r, v);
        }
}

#define GEMV(M, NR)                                                                                \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                  \
        gemv_bf16_m##M##_f(const bf16* x, const bf16* w, float* out, u32 m, u32 n, u32 k) {       \
        gemv_body<M, NR, float>(x, w, out, m, n, k);                                               \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                  \
        gemv_bf16_m##M##_b(const bf16* x, const bf16* w, bf16* out, u32 m, u32 n, u32 k) {        \
        gemv_body<M, NR, bf16>(x, w, out, m, n, k);                                                \
    }
GEMV(1, 2)
GEMV(2, 2)
GEMV(4, 2)

// Split-k form: a block of GEMV_WARPS warps owns R weight rows and its threads split k into
// 16-byte chunks (chunk c to thread c mod 256), so that every thread has R·(unrolled steps)
// loads in flight however few rows n has (n = 2048 gives 128 blocks of the warp form above,
// fewer than an H200's 132 SMs, and n/R blocks here); the block then sums its partials (warp
// shuffles, then the warps' sums through shared memory in warp order).
template <int M, int R, typename TO>
static __device__ void gemv_sk_body(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                    TO* __restrict__ out, u32 m, u32 n, u32 k) {
    __shared__ float part[GEMV_WARPS][M * R];
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const u32 j0 = blockIdx.x * R;
    float acc[M][R];
    chunk_sum<M, R>(acc, x, w, m, n, k, j0, tid, GEMV_WARPS * 32);
#pragma unroll
    for (int i = 0; i < M; ++i)
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float v = warp_sum(acc[i][r]);
            if (lane == 0) part[warp][i * R + r] = v;
        }
    __syncthreads();
    if (tid < (u32)(M * R)) {
        const u32 i = tid / R, r = tid % R;
        float s = part[0][tid];
#pragma unroll
        for (int q = 1; q < GEMV_WARPS; ++q) s += part[q][tid];
        if (i < m && j0 + r < n) store(out + (u64)i * n + j0 + r, s);
    }
}

#define GEMV_SK(M, R)                                                                              \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                  \
        gemv_bf16_sk##R##_m##M##_f(const bf16* x, const bf16* w, float* out, u32 m, u32 n, u32 k) { \
        gemv_sk_body<M, R, float>(x, w, out, m, n, k);                                             \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                  \
        gemv_bf16_sk##R##_m##M##_b(const bf16* x, const bf16* w, bf16* out, u32 m, u32 n, u32 k) { \
        gemv_sk_body<M, R, bf16>(x, w, out, m, n, k);                                              \
    }
GEMV_SK(1, 4)
GEMV_SK(2, 4)
GEMV_SK(4, 4)
GEMV_SK(1, 8)
GEMV_SK(2, 8)
GEMV_SK(4, 8)
