// Weight-only quantized matmuls (gpu_core::nn::quant, the formats of models::quant): a fused
// dequantize-GEMV for m <= 4 rows of x (a decode step) and a dequantize kernel (what prefill
// hands to cuBLAS). The weight is [n, k] (PyTorch's Linear layout) packed into u32 words,
// little-endian: int8 (4 values a word, one f32 scale a row, w = q·s) or int4 (8 values a word,
// low nibble first, groups of 128 inputs with a scale and a minimum, w = q·s + m).
//
// gemv_q{8,4}_m{M}_v{V}_{x}{o} (and gemv_qs…, the split-k form below): out[i, j] = Σ_t x[i, t]·w[j, t], f32 accumulation, out f32 or
// bf16 (rounded once). The design of nn_gemv_bf16.cu: each warp streams NR weight rows with
// loads of V words (V = 4: 16 bytes, when a packed row is a multiple of 16 bytes; else V = 1)
// that bypass L1 (read once), reads x's rows through the read-only cache, and sums its lanes'
// partial dot products with shuffles. Values are converted in registers with integer tricks
// (a byte placed under the exponent of 2^23 by prmt, then 2^23 subtracted: exact). The scales
// are applied after summing x·q: int8 once per row (s·Σ_t x·q), int4 once per chunk of V·8
// inputs (inside one group, as 8 divides 128): s·Σ x·q + m·Σ x. That reassociation is why the
// kernel is not the reference's Σ x·(q·s + m) to the bit; the bound is in
// crates/gpu-cuda/src/nn/quant.rs. Reference: gpu_core's CPU QuantOps.
//
// dequant_q{8,4}_{o}: deq(W) [n, k] as f32 or bf16, with the reference's roundings exactly
// (__fmul_rn then __fadd_rn: no contraction into an fma), bf16 rounded once from that f32.

#include "common.cuh"
#include "nn_elem_io.cuh"

#define QWARPS 4
#define QNR 2
#define QGROUP 128

static __device__ __forceinline__ void ld_stream(const u32* p, u32 (&w)[4]) {
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
                 : "l"(p));
}
static __device__ __forceinline__ void ld_stream(const u32* p, u32 (&w)[1]) {
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(w[0]) : "l"(p));
}

// N consecutive elements of x (N = 4 or 8), widened to f32; p is N-element aligned.
static __device__ __forceinline__ void load_x(const float* p, float (&f)[4]) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(p));
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w;
}
static __device__ __forceinline__ void load_x(const bf16* p, float (&f)[4]) {
    const uint2 u = __ldg(reinterpret_cast<const uint2*>(p));
    const float2 lo = bf16x2_to_float2(u.x), hi = bf16x2_to_float2(u.y);
    f[0] = lo.x, f[1] = lo.y, f[2] = hi.x, f[3] = hi.y;
}
static __device__ __forceinline__ void load_x(const float* p, float (&f)[8]) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(p));
    const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w;
    f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}
static __device__ __forceinline__ void load_x(const bf16* p, float (&f)[8]) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
    const u32 w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const float2 v = bf16x2_to_float2(w[e]);
        f[2 * e] = v.x, f[2 * e + 1] = v.y;
    }
}

// Byte e of b placed under the exponent of 2^23: the float 2^23 + byte (exact).
static __device__ __forceinline__ float magic(u32 b, int e) {
    return __uint_as_float(__byte_perm(b, 0x4B000000u, 0x7650 + e));
}

// sq += Σ_e x[e]·q_e over the 4 signed bytes of w: byte ^ 0x80 = q + 128.
static __device__ __forceinline__ void dot_word(u32 w, const float (&x)[4], float& sq) {
    const u32 b = w ^ 0x80808080u;
#pragma unroll
    for (int e = 0; e < 4; ++e) sq = fmaf(x[e], magic(b, e) - 8388736.0f, sq);  // 2^23 + 128
}

// sq += Σ_e x[e]·q_e over the 8 nibbles of w (value 2b: low nibble of byte b, 2b+1: high).
static __device__ __forceinline__ void dot_word(u32 w, const float (&x)[8], float& sq) {
    const u32 lo = w & 0x0f0f0f0fu, hi = (w >> 4) & 0x0f0f0f0fu;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
        sq = fmaf(x[2 * b], magic(lo, b) - 8388608.0f, sq);  // 2^23
        sq = fmaf(x[2 * b + 1], magic(hi, b) - 8388608.0f, sq);
    }
}

// The chunk loop of gemv_q_body and gemv_qs_body: declares acc[M][R] and sums into acc[i][r]
// x row i times weight row j0 + r over the chunks C0, C0 + STRIDE, ... of the packed rows (R rows
// a thread, each chunk V words a row; int4 applies each chunk's scale and minimum). A macro, not a
// function: moved into a shared function, the compiler unrolls the split-k form's loop
// differently (other machine code than the images measured on the H200), which nn_gemv_bf16.cu's
// shared chunk_step does not do; expanded in place, both kernels compile to the same code as
// when each spelled the loop out. Uses the enclosing body's Q, M, V, VPW, VPC, x, data, scales,
// mins, m, n, k, j0, wpr, chunks and groups.
#define Q_CHUNK_SUMS(R, C0, STRIDE)                                                                \
    float acc[M][R];                                                                               \
    _Pragma("unroll")                                                                              \
    for (int i = 0; i < M; ++i)                                                                    \
        _Pragma("unroll")                                                                          \
        for (int r = 0; r < R; ++r) acc[i][r] = 0.0f;                                              \
    _Pragma("unroll 2")                                                                            \
    for (u32 c = C0; c < chunks; c += STRIDE) {                                                    \
        u32 wq[R][V];                                                                              \
        float s[R], mn[R];                                                                         \
        _Pragma("unroll")                                                                          \
        for (int r = 0; r < R; ++r) {                                                              \
            const bool live = j0 + r < n;                                                          \
            if (live)                                                                              \
                ld_stream(data + (u64)(j0 + r) * wpr + (u64)c * V, wq[r]);                         \
            else                                                                                   \
                _Pragma("unroll")                                                                  \
                for (int p = 0; p < V; ++p) wq[r][p] = 0;                                          \
            if (Q == 4) {                                                                          \
                const u64 g = (u64)(j0 + r) * groups + (u64)c * VPC / QGROUP;                      \
                s[r] = live ? __ldg(scales + g) : 0.0f;                                            \
                mn[r] = live ? __ldg(mins + g) : 0.0f;                                             \
            }                                                                                      \
        }                                                                                          \
        _Pragma("unroll")                                                                          \
        for (int i = 0; i < M; ++i) {                                                              \
            if (i < (int)m) {                                                                      \
                float sq[R], sx = 0.0f;                                                            \
                _Pragma("unroll")                                                                  \
                for (int r = 0; r < R; ++r) sq[r] = 0.0f;                                          \
                _Pragma("unroll")                                                                  \
                for (int p = 0; p < V; ++p) {                                                      \
                    float xf[VPW];                                                                 \
                    load_x(x + (u64)i * k + (u64)c * VPC + p * VPW, xf);                           \
                    if (Q == 4)                                                                    \
                        _Pragma("unroll")                                                          \
                        for (int e = 0; e < VPW; ++e) sx += xf[e];                                 \
                    _Pragma("unroll")                                                              \
                    for (int r = 0; r < R; ++r) dot_word(wq[r][p], xf, sq[r]);                     \
                }                                                                                  \
                _Pragma("unroll")                                                                  \
                for (int r = 0; r < R; ++r)                                                        \
                    acc[i][r] = Q == 4 ? fmaf(s[r], sq[r], fmaf(mn[r], sx, acc[i][r]))             \
                                       : acc[i][r] + sq[r];                                        \
            }                                                                                      \
        }                                                                                          \
    }

// Q: 8 or 4 bits; V: words per load (4 or 1); M: the most rows of x (m <= M).
template <int Q, int M, int V, typename TX, typename TO>
static __device__ void gemv_q_body(const TX* __restrict__ x, const u32* __restrict__ data,
                                   const float* __restrict__ scales,
                                   const float* __restrict__ mins, TO* __restrict__ out, u32 m,
                                   u32 n, u32 k) {
    constexpr int VPW = Q == 8 ? 4 : 8;  // values a word
    constexpr int VPC = VPW * V;         // values a chunk (one load a row)
    const u32 lane = threadIdx.x & 31;
    const u32 j0 = (blockIdx.x * QWARPS + (threadIdx.x >> 5)) * QNR;
    if (j0 >= n) return;
    const u32 wpr = k / VPW, chunks = wpr / V, groups = (k + QGROUP - 1) / QGROUP;
    Q_CHUNK_SUMS(QNR, lane, 32);
#pragma unroll
    for (int r = 0; r < QNR; ++r) {
        const bool live = lane == 0 && j0 + r < n;
        const float s8 = Q == 8 && live ? __ldg(scales + j0 + r) : 1.0f;
#pragma unroll
        for (int i = 0; i < M; ++i) {
            const float v = warp_sum(acc[i][r]);
            if (live && i < (int)m) store(out, (u64)i * n + j0 + r, Q == 8 ? v * s8 : v);
        }
    }
}

// The kernels NAME{8,4}_m{M}_v{V}_{x}{o} of a body template: int8 then int4, V = 4 then 1, M = 1,
// 2, 4, and x, o f32 or bf16 (the GEMV_Q_ALL(NAME, BODY) at the end of each form).
#define GEMV_Q(NAME, BODY, Q, M, V, TX, X, TO, O)                                                 \
    extern "C" __global__ void __launch_bounds__(QWARPS * 32)                                     \
        NAME##Q##_m##M##_v##V##_##X##O(const TX* x, const u32* data, const float* scales,        \
                                       const float* mins, TO* out, u32 m, u32 n, u32 k) {        \
        BODY<Q, M, V, TX, TO>(x, data, scales, mins, out, m, n, k);                               \
    }
#define GEMV_Q_XO(NAME, BODY, Q, M, V)                  \
    GEMV_Q(NAME, BODY, Q, M, V, float, f, float, f)     \
    GEMV_Q(NAME, BODY, Q, M, V, float, f, bf16, b)      \
    GEMV_Q(NAME, BODY, Q, M, V, bf16, b, float, f)      \
    GEMV_Q(NAME, BODY, Q, M, V, bf16, b, bf16, b)
#define GEMV_Q_M(NAME, BODY, Q, V)     \
    GEMV_Q_XO(NAME, BODY, Q, 1, V)     \
    GEMV_Q_XO(NAME, BODY, Q, 2, V)     \
    GEMV_Q_XO(NAME, BODY, Q, 4, V)
#define GEMV_Q_ALL(NAME, BODY)     \
    GEMV_Q_M(NAME, BODY, 8, 4)     \
    GEMV_Q_M(NAME, BODY, 8, 1)     \
    GEMV_Q_M(NAME, BODY, 4, 4)     \
    GEMV_Q_M(NAME, BODY, 4, 1)
GEMV_Q_ALL(gemv_q, gemv_q_body)

// The split-k form (as in nn_gemv_bf16.cu): a block of QWARPS warps owns QSR weight rows and its
// threads split a row's chunks (chunk c to thread c mod 128), each reading chunk c of all QSR
// rows, so that the loads of a long row are in flight at once rather than walked by one warp;
// the block then sums its partials (shuffles, then the warps' sums in warp order through shared
// memory) and applies int8's row scale. The same products and per-chunk scales as gemv_q.
#define QSR 4
template <int Q, int M, int V, typename TX, typename TO>
static __device__ void gemv_qs_body(const TX* __restrict__ x, const u32* __restrict__ data,
                                    const float* __restrict__ scales,
                                    const float* __restrict__ mins, TO* __restrict__ out, u32 m,
                                    u32 n, u32 k) {
    constexpr int VPW = Q == 8 ? 4 : 8;
    constexpr int VPC = VPW * V;
    __shared__ float part[QWARPS][M * QSR];
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const u32 j0 = blockIdx.x * QSR;
    const u32 wpr = k / VPW, chunks = wpr / V, groups = (k + QGROUP - 1) / QGROUP;
    Q_CHUNK_SUMS(QSR, tid, QWARPS * 32);
#pragma unroll
    for (int i = 0; i < M; ++i)
#pragma unroll
        for (int r = 0; r < QSR; ++r) {
            const float v = warp_sum(acc[i][r]);
            if (lane == 0) part[warp][i * QSR + r] = v;
        }
    __syncthreads();
    if (tid < (u32)(M * QSR)) {
        const u32 i = tid / QSR, r = tid % QSR;
        float v = part[0][tid];
#pragma unroll
        for (int w = 1; w < QWARPS; ++w) v += part[w][tid];
        if (i < m && j0 + r < n)
            store(out, (u64)i * n + j0 + r, Q == 8 ? v * __ldg(scales + j0 + r) : v);
    }
}

GEMV_Q_ALL(gemv_qs, gemv_qs_body)

// One thread per word of the packed weight (grid-stride): its 4 or 8 values of deq(W).
template <int Q, typename TO>
static __device__ void dequant_body(const u32* __restrict__ data,
                                    const float* __restrict__ scales,
                                    const float* __restrict__ mins, TO* __restrict__ out, u32 n,
                                    u32 k) {
    constexpr int VPW = Q == 8 ? 4 : 8;
    const u32 wpr = k / VPW, groups = (k + QGROUP - 1) / QGROUP;
    const u64 words = (u64)n * wpr;
    for (u64 wi = (u64)blockIdx.x * blockDim.x + threadIdx.x; wi < words;
         wi += (u64)gridDim.x * blockDim.x) {
        const u32 r = (u32)(wi / wpr), c = (u32)(wi % wpr);
        const u32 w = data[wi];
        float v[VPW];
        if (Q == 8) {
            const float s = scales[r];
#pragma unroll
            for (int e = 0; e < 4; ++e) v[e] = __fmul_rn((float)(signed char)(w >> (8 * e)), s);
        } else {
            const u64 g = (u64)r * groups + (u64)c * VPW / QGROUP;
            const float s = scales[g], mn = mins[g];
#pragma unroll
            for (int e = 0; e < 8; ++e)
                v[e] = __fadd_rn(__fmul_rn((float)((w >> (4 * e)) & 0xfu), s), mn);
        }
        const u64 base4 = ((u64)r * k + (u64)c * VPW) / 4;  // k % 4 == 0: 4-aligned
#pragma unroll
        for (int h = 0; h < VPW / 4; ++h)
            store4(out, base4 + h, make_float4(v[4 * h], v[4 * h + 1], v[4 * h + 2], v[4 * h + 3]));
    }
}

#define DEQUANT(Q, TO, O)                                                                         \
    extern "C" __global__ void dequant_q##Q##_##O(const u32* data, const float* scales,           \
                                                  const float* mins, TO* out, u32 n, u32 k) {     \
        dequant_body<Q, TO>(data, scales, mins, out, n, k);                                       \
    }
DEQUANT(8, float, f)
DEQUANT(8, bf16, b)
DEQUANT(4, float, f)
DEQUANT(4, bf16, b)
