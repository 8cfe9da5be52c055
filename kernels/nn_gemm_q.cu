// The fused dequantize-GEMM of quantized prefill (gpu_core::nn::quant, the formats of
// nn_gemv_q.cu: int8, 4 values a u32 word, one f32 scale a weight row, w = q·s; int4, 8 nibbles a
// word low nibble first, groups of 128 inputs with a scale and a minimum, w = q·s + m) for bf16 x
// on tensor cores:
//
// gemm_q{8,4}_v{V}_b{o}: out[i, j] = Σ_t x[i, t]·w̃[j, t], x bf16 [m, k], the weight [n, k]
// packed, out [m, n] f32 or bf16 (rounded once). w̃ is dequant_q{8,4}_b's value to the bit: q·s
// rounded by __fmul_rn, then + m by __fadd_rn (never contracted into an fma), bf16 rounded once
// from that f32. The products x·w̃ are summed by mma.sync m16n8k16 (bf16 in, f32 accumulation):
// the same bf16 operands as dequantize-then-cuBLAS, f32 sums of k products in another order.
//
// Tiles: a block of 128 threads (4 warps as 2 × 2) owns 64 rows of x × 128 weight rows; each
// warp 32 × 64 (acc[2][8][4]). Per k step of 64 inputs (which divides int4's group of 128, so a
// step reads one scale and minimum a weight row): the x tile [64 × 64] bf16 and the packed weight
// tile (128 rows × 64 bytes int8, × 32 bytes int4) arrive by cp.async, double-buffered (step s+1
// is in flight while step s is dequantized and multiplied; int4's scales and minimums are read
// at their step, int8's once); every thread then dequantizes its
// share of the packed tile into one swizzled bf16 tile [128 × 64] (the layout of
// nn_attention_bf16.cuh: 128-byte rows, 16-byte chunk c of row r at c ^ (r & 7)), and each warp
// multiplies: A = x by ldmatrix, B = weight rows by ldmatrix without transpose (as mma_abt).
// V = 4: packed rows a multiple of 16 bytes (int8 k % 16 == 0, int4 k % 32 == 0): 16-byte copies
// of x and of the weight. V = 1 (any other k): 8-byte copies of x (k % 4 == 0 keeps them aligned)
// and 4-byte copies of the weight.
//
// Tails: rows of x at or past m, weight rows at or past n and inputs at or past k are zero-filled
// by cp.async with source size 0 (nothing outside a buffer is read); their weights dequantize to
// exact zeros (scale and minimum 0 past n, a select past k), so the padding adds 0·0. A NaN or an
// infinity of x reaches the rows of out that hold it alone (the weights are finite). Stores are
// bounds-checked. Error bound: crates/gpu-cuda/src/nn/quant.rs. Reference: gpu_core's CPU
// QuantOps.
#include "nn_attention_bf16.cuh"

#define QG_BM 64        // rows of x a block
#define QG_BN 128       // weight rows a block
#define QG_BK 64        // inputs a k step
#define QG_THREADS 128  // 4 warps, 2 (rows of x) × 2 (weight rows)

static __device__ __forceinline__ void cp_async8(u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 8 : 0)
                 : "memory");
}
static __device__ __forceinline__ void sts128(u32 addr, u32 a, u32 b, u32 c, u32 d) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a), "r"(b), "r"(c),
                 "r"(d)
                 : "memory");
}

// Byte e of b placed under the exponent of 2^23: the float 2^23 + byte (exact).
static __device__ __forceinline__ float qg_magic(u32 b, int e) {
    return __uint_as_float(__byte_perm(b, 0x4B000000u, 0x7650 + e));
}

// The x tile of step k0: rows m0 .. m0+63, inputs k0 .. k0+63, into the swizzled tile s.
template <int V>
static __device__ __forceinline__ void load_x_tile(u32 s, const bf16* __restrict__ x, u32 m0,
                                                   u32 k0, u32 m, u32 k) {
    constexpr int E = V == 4 ? 8 : 4;   // elements a copy (16 or 8 bytes)
    constexpr int PER_ROW = QG_BK / E;  // copies a row
#pragma unroll
    for (int it = 0; it < QG_BM * PER_ROW / QG_THREADS; ++it) {
        const int f = it * QG_THREADS + threadIdx.x, row = f / PER_ROW, h = f % PER_ROW;
        const u32 col = k0 + h * E;
        const bool valid = m0 + row < m && col < k;  // k % E == 0: a copy is in or out
        const bf16* src = valid ? x + (u64)(m0 + row) * k + col : x;
        if (V == 4)
            cp_async16(s + swz(row, h), src, valid);
        else
            cp_async8(s + swz(row, h >> 1) + (h & 1) * 8, src, valid);
    }
}

// The packed weight tile of step k0: rows n0 .. n0+127, words k0/VPW .. + 64/VPW of each, into
// the staging buffer s (rows 64/VPW words apart, unswizzled).
template <int Q, int V>
static __device__ __forceinline__ void load_w_tile(u32 s, const u32* __restrict__ data, u32 n0,
                                                   u32 k0, u32 n, u32 wpr) {
    constexpr int VPW = Q == 8 ? 4 : 8;  // values a word
    constexpr int WPS = QG_BK / VPW;     // words a row in a step: 16 or 8
    constexpr int PER_ROW = WPS / V;     // copies a row
    const u32 c0 = k0 / VPW;
    // Not unrolled for V = 1 (8 or 16 copies): the hoisted addresses cost ~70 registers.
#pragma unroll(V == 4 ? 4 : 1)
    for (int it = 0; it < QG_BN * PER_ROW / QG_THREADS; ++it) {
        const int f = it * QG_THREADS + threadIdx.x, row = f / PER_ROW, h = f % PER_ROW;
        const u32 c = c0 + h * V;
        const bool valid = n0 + row < n && c < wpr;  // V = 4 only when wpr % 4 == 0
        const u32* src = valid ? data + (u64)(n0 + row) * wpr + c : data;
        const u32 dst = s + (row * WPS + h * V) * 4;
        if (V == 4)
            cp_async16(dst, src, valid);
        else
            cp_async4(dst, src, valid);
    }
}

// The dequantizer's share: thread tid converts the 16-byte chunks f = it·128 + tid (it < R) of
// the staged tile, chunk f holding words 4·(f % R) .. +3 of weight row f / R; R = 4 (int8: 16
// words a row) or 2 (int4: 8 words a row).
template <int Q>
struct Share {
    static constexpr int R = Q == 8 ? 4 : 2;
};

// The scale (and minimum) of each weight row of this thread's share at step k0: int8, one a row
// (the same every step); int4, group k0/128's. Rows at or past n get 0 (their words are zeros).
template <int Q>
static __device__ __forceinline__ void load_scales(float (&sc)[Share<Q>::R],
                                                   float (&mn)[Share<Q>::R],
                                                   const float* __restrict__ scales,
                                                   const float* __restrict__ mins, u32 n0, u32 k0,
                                                   u32 n, u32 groups) {
    constexpr int R = Share<Q>::R;
#pragma unroll
    for (int it = 0; it < R; ++it) {
        const u32 row = n0 + (it * QG_THREADS + threadIdx.x) / R;
        const bool live = row < n;
        const u64 g = Q == 8 ? (u64)row : (u64)row * groups + k0 / 128;
        sc[it] = live ? __ldg(scales + g) : 0.0f;
        mn[it] = Q == 4 && live ? __ldg(mins + g) : 0.0f;
    }
}

// This thread's share of the staged packed tile st dequantized into the swizzled bf16 tile ws,
// with dequant_q{8,4}_b's roundings; words at or past the row's end (word c0 + ... >= wpr) give
// zeros.
template <int Q>
static __device__ __forceinline__ void dequant_share(u32 ws, u32 st, const float (&sc)[Share<Q>::R],
                                                     const float (&mn)[Share<Q>::R], u32 c0,
                                                     u32 wpr) {
    constexpr int R = Share<Q>::R;
#pragma unroll
    for (int it = 0; it < R; ++it) {
        const int f = it * QG_THREADS + threadIdx.x, row = f / R, h = f % R;
        const uint4 v = lds128(st + f * 16);  // row·R·16 + h·16
        const u32 w[4] = {v.x, v.y, v.z, v.w};
        u32 o[8];  // bf16 pairs
        if (Q == 8) {
            // Words 4h .. 4h+3: values 16h .. 16h+15, chunks 2h and 2h+1 of the bf16 row.
#pragma unroll
            for (int p = 0; p < 4; ++p) {
                const u32 b = w[p] ^ 0x80808080u;  // byte ^ 0x80 = q + 128
                float q[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) q[e] = qg_magic(b, e) - 8388736.0f;  // 2^23 + 128
                o[2 * p] = float2_to_bf16x2(__fmul_rn(q[0], sc[it]), __fmul_rn(q[1], sc[it]));
                o[2 * p + 1] = float2_to_bf16x2(__fmul_rn(q[2], sc[it]), __fmul_rn(q[3], sc[it]));
            }
            sts128(ws + swz(row, 2 * h), o[0], o[1], o[2], o[3]);
            sts128(ws + swz(row, 2 * h + 1), o[4], o[5], o[6], o[7]);
        } else {
            // Words 4h .. 4h+3: values 32h .. 32h+31, chunks 4h .. 4h+3 of the bf16 row.
#pragma unroll
            for (int p = 0; p < 4; ++p) {
                const bool ok = c0 + 4 * h + p < wpr;
                const u32 lo = w[p] & 0x0f0f0f0fu, hi = (w[p] >> 4) & 0x0f0f0f0fu;
#pragma unroll
                for (int b = 0; b < 4; ++b) {
                    const float q0 = qg_magic(lo, b) - 8388608.0f, q1 = qg_magic(hi, b) - 8388608.0f;
                    const float v0 = __fadd_rn(__fmul_rn(q0, sc[it]), mn[it]);
                    const float v1 = __fadd_rn(__fmul_rn(q1, sc[it]), mn[it]);
                    o[b] = ok ? float2_to_bf16x2(v0, v1) : 0u;
                }
                sts128(ws + swz(row, 4 * h + p), o[0], o[1], o[2], o[3]);
            }
        }
    }
}

// acc (this warp's 32 × 64) += the x tile's rows 32·wm .. +31 · (the weight tile's rows
// 64·wn .. +63)ᵀ over the 64 inputs of a step.
static __device__ __forceinline__ void mma_step(float (&acc)[2][8][4], u32 xs, u32 ws, int wm,
                                                int wn, int lane) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        u32 a[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
            ldsm_x4(a[mt], xs + swz(32 * wm + 16 * mt + (lane & 7) + (((lane >> 3) & 1) << 3),
                                    kk * 2 + (lane >> 4)));
#pragma unroll
        for (int jp = 0; jp < 4; ++jp) {
            u32 b[4];
            ldsm_x4(b, ws + swz(64 * wn + 16 * jp + (lane & 7) + ((lane >> 4) << 3),
                                kk * 2 + ((lane >> 3) & 1)));
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                mma16816(acc[mt][2 * jp], a[mt], b[0], b[1]);
                mma16816(acc[mt][2 * jp + 1], a[mt], b[2], b[3]);
            }
        }
    }
}

// out[i, j], out[i, j+1] (j + 1 < n), one store when n is even (then i·n + j is even: aligned).
static __device__ __forceinline__ void store_pair(float* out, u64 idx, bool pair, float a, float b) {
    if (pair)
        *reinterpret_cast<float2*>(out + idx) = make_float2(a, b);
    else
        out[idx] = a, out[idx + 1] = b;
}
static __device__ __forceinline__ void store_pair(bf16* out, u64 idx, bool pair, float a, float b) {
    if (pair)
        *reinterpret_cast<u32*>(out + idx) = float2_to_bf16x2(a, b);
    else
        store(out, idx, a), store(out, idx + 1, b);
}

// This warp's accumulators to out, rounded once, rows < m and columns < n only.
template <typename TO>
static __device__ __forceinline__ void store_acc(TO* __restrict__ out, const float (&acc)[2][8][4],
                                                 u32 i0, u32 j0, u32 m, u32 n, int lane) {
    const u32 g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const u32 i = i0 + 16 * mt + g + 8 * h, j = j0 + 8 * nt + 2 * c;
                if (i >= m || j >= n) continue;
                const float a = acc[mt][nt][2 * h], b = acc[mt][nt][2 * h + 1];
                const u64 idx = (u64)i * n + j;
                if (j + 1 < n)
                    store_pair(out, idx, (n & 1) == 0, a, b);
                else
                    store(out, idx, a);
            }
}

// Shared memory: two x tiles (8 KiB each), the bf16 weight tile (16 KiB), two staging buffers
// (8 KiB each for int8, 4 KiB for int4): 48 KiB (int8) or 40 KiB (int4).
// Split-k (gridDim.y > 1, for grids of few tiles: decode at batch 5..64): block y sums the k
// steps y·sps .. min((y+1)·sps, steps) - 1 and writes its f32 partial sums to part[y] [m, n];
// gemm_q_reduce adds the partials in the order of y. gridDim.y == 1: out directly (part unused).
template <int Q, int V, typename TO>
static __device__ void gemm_q_body(const bf16* __restrict__ x, const u32* __restrict__ data,
                                   const float* __restrict__ scales,
                                   const float* __restrict__ mins, TO* __restrict__ out,
                                   float* __restrict__ part, u32 m, u32 n, u32 k, u32 sps) {
    constexpr int VPW = Q == 8 ? 4 : 8;
    constexpr int STAGE = QG_BN * QG_BK / VPW * 4;  // bytes of a packed tile
    constexpr int R = Share<Q>::R;
    __shared__ __align__(128) unsigned char smem[2 * QG_BM * 128 + QG_BN * 128 + 2 * STAGE];
    const u32 xs0 = smem_addr(smem), ws = xs0 + 2 * QG_BM * 128, st0 = ws + QG_BN * 128;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp & 1, wn = warp >> 1;
    const u32 mtiles = (m + QG_BM - 1) / QG_BM;
    const u32 m0 = blockIdx.x % mtiles * QG_BM, n0 = blockIdx.x / mtiles * QG_BN;
    const u32 wpr = k / VPW, groups = (k + 127) / 128, steps = (k + QG_BK - 1) / QG_BK;
    const u32 s0 = blockIdx.y * sps, s1 = min(steps, s0 + sps);  // s0 < steps (host: no empty split)
    float acc[2][8][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) zero(acc[mt]);
    float sc[R], mn[R];
    load_scales<Q>(sc, mn, scales, mins, n0, s0 * QG_BK, n, groups);
    load_x_tile<V>(xs0, x, m0, s0 * QG_BK, m, k);
    load_w_tile<Q, V>(st0, data, n0, s0 * QG_BK, n, wpr);
    cp_commit();
#pragma unroll 1
    for (u32 s = s0; s < s1; ++s) {
        const u32 cur = (s - s0) & 1, k0 = s * QG_BK;
        cp_wait<0>();
        __syncthreads();  // step s has landed; every warp is done with step s-1's tiles
        if (s + 1 < s1) {
            load_x_tile<V>(xs0 + (cur ^ 1) * QG_BM * 128, x, m0, k0 + QG_BK, m, k);
            load_w_tile<Q, V>(st0 + (cur ^ 1) * STAGE, data, n0, k0 + QG_BK, n, wpr);
        }
        cp_commit();
        if (Q == 4 && s > s0) load_scales<Q>(sc, mn, scales, mins, n0, k0, n, groups);
        dequant_share<Q>(ws, st0 + cur * STAGE, sc, mn, k0 / VPW, wpr);
        __syncthreads();  // the bf16 weight tile is complete
        mma_step(acc, xs0 + cur * QG_BM * 128, ws, wm, wn, lane);
    }
    if (gridDim.y == 1)
        store_acc(out, acc, m0 + 32 * wm, n0 + 64 * wn, m, n, lane);
    else
        store_acc(part + (u64)blockIdx.y * m * n, acc, m0 + 32 * wm, n0 + 64 * wn, m, n, lane);
}

#define GEMM_Q(Q, V, TO, O)                                                                       \
    extern "C" __global__ void __launch_bounds__(QG_THREADS)                                      \
        gemm_q##Q##_v##V##_b##O(const bf16* x, const u32* data, const float* scales,              \
                                const float* mins, TO* out, float* part, u32 m, u32 n, u32 k,     \
                                u32 sps) {                                                        \
        gemm_q_body<Q, V, TO>(x, data, scales, mins, out, part, m, n, k, sps);                    \
    }
#define GEMM_Q_O(Q, V)        \
    GEMM_Q(Q, V, float, f)    \
    GEMM_Q(Q, V, bf16, b)
GEMM_Q_O(8, 4)
GEMM_Q_O(8, 1)
GEMM_Q_O(4, 4)
GEMM_Q_O(4, 1)

// out[e] = Σ_y part[y][e] (y = 0 .. splits-1 in order: the same bits every run), rounded once
// to TO; a grid-stride loop over the mn elements.
template <typename TO>
static __device__ void gemm_q_reduce_body(const float* __restrict__ part, TO* __restrict__ out,
                                          u32 mn, u32 splits) {
    for (u32 e = blockIdx.x * blockDim.x + threadIdx.x; e < mn; e += gridDim.x * blockDim.x) {
        float a = part[e];
        for (u32 y = 1; y < splits; ++y) a += part[(u64)y * mn + e];
        store(out, e, a);
    }
}
extern "C" __global__ void gemm_q_reduce_f(const float* part, float* out, u32 mn, u32 splits) {
    gemm_q_reduce_body<float>(part, out, mn, splits);
}
extern "C" __global__ void gemm_q_reduce_b(const float* part, bf16* out, u32 mn, u32 splits) {
    gemm_q_reduce_body<bf16>(part, out, mn, splits);
}
