// Causal scaled-dot-product attention, f32 SIMT, flash-attention style.
// Layout: sequence s = b·heads + h of q, k, v, dq, dk, dv starts at (b·t·ld_in + h·d) and its
// rows are ld_in floats apart; of out and dout at (b·t·ld_out + h·d), rows ld_out apart; lse and
// delta are [n, t]. heads = 1, ld = d is the plain [n, t, d] layout; heads = H, ld_in = 3·H·d,
// ld_out = H·d reads q, k and v straight out of a GPT's fused [b, t, 3·H·d] projection (q, k, v
// pointing at its three column blocks) and writes [b, t, H·d] without any permute.
// d must be a multiple of 4 in 4..=128 (checked on the host); d <= 64 runs the D = 64 kernels,
// 64 < d <= 128 the D = 128 kernels, padding the head dimension with zeros in shared memory.
// Global rows are read and written with 16-byte accesses (d % 4 == 0, 256-byte aligned bases).
//
// Forward (attn_fwd_d{64,128}_f32): one block per (sequence, tile of BQ query rows), heaviest
// tiles first; K and V tiles staged in shared memory (the next pair prefetched into registers
// while the current one is used); scores live in registers, probabilities in a BQ x BK shared
// tile; online softmax in base 2 (running max and per-thread partial sums); key tiles above
// the diagonal are skipped, and on the diagonal each warp skips the key columns past its own
// last row. lse = ln Σ_j exp(scale·q_i·k_j) is saved per row. Static shared memory stays
// within 48 KiB (43 KiB for d <= 64).
// Backward: attn_bwd_dq_* (per query tile, loop over key tiles; also writes
// delta_i = Σ dout_i ∘ out_i, which it needs first) then attn_bwd_dkdv_* (per key tile, loop
// over query tiles, reading delta). Both recompute P = exp(scale·q·k − lse) from q, k and lse.
// No O(t²) buffer, no atomics.
//
// Thread tiling: NT threads as TY = NT/16 rows of 16 lanes (tx = tid & 15, ty = tid >> 4). A
// thread owns rows ty*4 + i (i < 4) of the row-side tile and columns tx + 16*j (j < SC) of a
// score tile, and output columns h*64 + tx*4 + e (h < D/64, e < 4) of a D-wide accumulator.
// Attention dropout (the *_drop kernels, DROP = true; dropout_hash.cuh): the forward stores
// P·f in the P tile (f = 1/(1 − p) where entry (seq, i, j) is kept, else 0) while the row sums
// l take the undropped P, so lse is the undropped softmax's; the backward uses dP = f·dout·vᵀ
// in dS = P∘(dP − delta) and P·f as the factor of dout in dv. delta = Σ dout∘out of the dropped
// out is still Σ_j P_ij dP_ij (Σ_j P_ij f_ij dout_i·v_j = dout_i·out_i). The plain kernels
// (DROP = false) compile to the code they had before dropout.
// CPU reference: gpu_core::cpu::attention (f64).
#include "common.cuh"
#include "dropout_hash.cuh"

#define ATT_LOG2E 1.4426950408889634f
#define ATT_LN2 0.6931471805599453f

// Shared-memory tiles are row-major with every row padded by 4 floats (16 bytes): float4
// reads of 8 consecutive rows at one column then hit 8 different bank groups, two rows 4 apart
// (the two row groups of a warp) hit different groups, and every address is a per-thread base
// plus a compile-time offset.
template <int W>
struct Ld {
    static constexpr int v = W + 4;
};

// Rows row0 .. row0+ROWS-1 of a [t, d] matrix, as float4 registers (zero outside t x d).
template <int ROWS, int D, int NT>
struct RowTile {
    static constexpr int C4 = D / 4;
    static constexpr int ITERS = ROWS * C4 / NT;
    static_assert(ROWS * C4 % NT == 0, "tile must split evenly over the block");
    float4 r[ITERS];

    __device__ __forceinline__ void fetch(const float* __restrict__ g, int row0, int t, int d,
                                          int ld) {
#pragma unroll
        for (int it = 0; it < ITERS; ++it) {
            const int f = it * NT + threadIdx.x;
            const int row = f / C4, col = (f % C4) * 4;
            const int grow = row0 + row;
            r[it] = (grow < t && col < d)
                        ? __ldg(reinterpret_cast<const float4*>(g + (size_t)grow * ld + col))
                        : make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }

    __device__ __forceinline__ void store(float* s) const {
#pragma unroll
        for (int it = 0; it < ITERS; ++it) {
            const int f = it * NT + threadIdx.x;
            const int row = f / C4, col = (f % C4) * 4;
            *reinterpret_cast<float4*>(s + row * Ld<D>::v + col) = r[it];
        }
    }
};

template <int ROWS, int D, int NT>
static __device__ __forceinline__ void load_tile(float* s, const float* __restrict__ g, int row0,
                                                 int t, int d, int ld) {
    RowTile<ROWS, D, NT> tile;
    tile.fetch(g, row0, t, d, ld);
    tile.store(s);
}

// load_tile that also says whether this thread loaded a NaN or an infinity.
template <int ROWS, int D, int NT>
static __device__ __forceinline__ bool load_tile_nonfinite(float* s, const float* __restrict__ g,
                                                           int row0, int t, int d, int ld) {
    RowTile<ROWS, D, NT> tile;
    tile.fetch(g, row0, t, d, ld);
    tile.store(s);
    bool bad = false;
#pragma unroll
    for (int it = 0; it < RowTile<ROWS, D, NT>::ITERS; ++it) {
        const float4 v = tile.r[it];
        bad |= !(fabsf(v.x) <= 3.40282347e38f && fabsf(v.y) <= 3.40282347e38f &&
                 fabsf(v.z) <= 3.40282347e38f && fabsf(v.w) <= 3.40282347e38f);
    }
    return bad;
}

// acc[i][j] += A[ty*4+i] · B[tx+16j] over D columns, for j < JN (A, B padded D-wide tiles).
template <int D, int SC, int JN>
static __device__ __forceinline__ void mma_abt(float (&acc)[4][SC], const float* A, const float* B,
                                               int ty, int tx) {
#pragma unroll
    for (int kk = 0; kk < D; kk += 4) {
        float4 a[4], b[JN];
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i] = *reinterpret_cast<const float4*>(A + (ty * 4 + i) * Ld<D>::v + kk);
#pragma unroll
        for (int j = 0; j < JN; ++j)
            b[j] = *reinterpret_cast<const float4*>(B + (tx + 16 * j) * Ld<D>::v + kk);
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < JN; ++j) {
                float s = acc[i][j];
                s = fmaf(a[i].x, b[j].x, s);
                s = fmaf(a[i].y, b[j].y, s);
                s = fmaf(a[i].z, b[j].z, s);
                s = fmaf(a[i].w, b[j].w, s);
                acc[i][j] = s;
            }
    }
}

// mma_abt over the first jn (warp-uniform) column groups; none when jn <= 0.
template <int D, int SC, int JN = SC>
static __device__ __forceinline__ void mma_abt_n(float (&acc)[4][SC], const float* A, const float* B,
                                                 int ty, int tx, int jn) {
    if (jn >= JN) {
        mma_abt<D, SC, JN>(acc, A, B, ty, tx);
    } else if constexpr (JN > 1) {
        mma_abt_n<D, SC, JN - 1>(acc, A, B, ty, tx, jn);
    }
}

// acc[i][h*4+e] += P[ty*4+i][j] · X[j][h*64 + tx*4 + e] over the 4 columns jj <= j < jj + 4: P a
// W-wide score tile, X a padded D-wide tile with at least W rows. MASKED: only where
// lo <= j − (ty*4+i) <= hi (see mma_px_causal).
template <int D, int W, bool MASKED = false>
static __device__ __forceinline__ void px_quad(float (&acc)[4][D / 16], const float* P, const float* X,
                                               int ty, int tx, int jj, int lo = 0, int hi = 0) {
    float4 p[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) p[i] = *reinterpret_cast<const float4*>(P + (ty * 4 + i) * Ld<W>::v + jj);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const int j = jj + e;
#pragma unroll
        for (int h = 0; h < D / 64; ++h) {
            const float4 x = *reinterpret_cast<const float4*>(X + j * Ld<D>::v + h * 64 + tx * 4);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                if (MASKED) {
                    const int dj = j - (ty * 4 + i);
                    if (dj < lo || dj > hi) continue;
                }
                const float pi = e == 0 ? p[i].x : e == 1 ? p[i].y : e == 2 ? p[i].z : p[i].w;
                acc[i][h * 4 + 0] = fmaf(pi, x.x, acc[i][h * 4 + 0]);
                acc[i][h * 4 + 1] = fmaf(pi, x.y, acc[i][h * 4 + 1]);
                acc[i][h * 4 + 2] = fmaf(pi, x.z, acc[i][h * 4 + 2]);
                acc[i][h * 4 + 3] = fmaf(pi, x.w, acc[i][h * 4 + 3]);
            }
        }
    }
}

// px_quad over the column groups jbeg <= j < jend (warp-uniform multiples of 4).
template <int D, int W>
static __device__ __forceinline__ void mma_px(float (&acc)[4][D / 16], const float* P, const float* X,
                                              int ty, int tx, int jbeg, int jend) {
#pragma unroll
    for (int jj = 0; jj < W; jj += 4) {
        if (jj < jbeg) continue;
        if (jj >= jend) break;
        px_quad<D, W>(acc, P, X, ty, tx, jj);
    }
}

// The causal mask at the P·X products. A warp owns the 8 tile rows r = 8w .. 8w+7, so in a tile
// on the diagonal the warp's columns split into three warp-uniform ranges: seen by all 8 rows,
// seen by none, and at most 8 columns seen by some. The first goes through mma_px, the second is
// skipped, and the third through mma_px_causal, which adds column j into row r only where
// lo <= j − r <= hi: a select, never a product with a zero probability, so a NaN or inf in a
// masked row of X (a later key's v or k, an earlier query's q or dout) cannot reach the result.
// Columns [jbeg, jend), jend − jbeg <= 8, both multiples of 4.
template <int D, int W>
static __device__ __forceinline__ void mma_px_causal(float (&acc)[4][D / 16], const float* P,
                                                     const float* X, int ty, int tx, int jbeg,
                                                     int jend, int lo, int hi) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
        const int jj = jbeg + 4 * u;
        if (jj >= jend) break;
        px_quad<D, W, true>(acc, P, X, ty, tx, jj, lo, hi);
    }
}

// P·X over the columns a query-row warp may see in a tile whose column c' = kofs + j is masked
// for row r when c' > r (forward P·V, backward dS·K): columns below the warp's first row plainly,
// the next (at most) 8 with the mask, nothing past the warp's last row.
template <int D, int W>
static __device__ __forceinline__ void mma_px_rows_causal(float (&acc)[4][D / 16], const float* P,
                                                          const float* X, int ty, int tx, int kofs) {
    const int wfirst = (ty >> 1) * 8;
    const int jlim = max(0, min(W, wfirst + 8 - kofs));
    const int jm = max(0, min(jlim, wfirst - kofs));
    mma_px<D, W>(acc, P, X, ty, tx, 0, jm);
    mma_px_causal<D, W>(acc, P, X, ty, tx, jm, jlim, -(1 << 30), -kofs);
}

// The backward's rare path: P·X with the causal selects of mma_px_causal (column j into row r
// only where lo <= j − r <= hi) over the whole W-wide tile, for a diagonal tile whose X holds a
// NaN or an infinity. The column loop stays rolled: unrolled, it costs the common path
// registers (about 1.5% of the backward's time on an H200).
template <int D, int W>
static __device__ __forceinline__ void mma_px_select_rolled(float (&acc)[4][D / 16], const float* P,
                                                            const float* X, int ty, int tx, int lo,
                                                            int hi) {
#pragma unroll 1
    for (int j = 0; j < W; ++j) {
#pragma unroll
        for (int h = 0; h < D / 64; ++h) {
            const float4 x = *reinterpret_cast<const float4*>(X + j * Ld<D>::v + h * 64 + tx * 4);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int dj = j - (ty * 4 + i);
                if (dj < lo || dj > hi) continue;
                const float pi = P[(ty * 4 + i) * Ld<W>::v + j];
                acc[i][h * 4 + 0] = fmaf(pi, x.x, acc[i][h * 4 + 0]);
                acc[i][h * 4 + 1] = fmaf(pi, x.y, acc[i][h * 4 + 1]);
                acc[i][h * 4 + 2] = fmaf(pi, x.z, acc[i][h * 4 + 2]);
                acc[i][h * 4 + 3] = fmaf(pi, x.w, acc[i][h * 4 + 3]);
            }
        }
    }
}

// Max / sum over the 16 lanes that share a row (lanes differ in their low 4 bits).
static __device__ __forceinline__ float row16_max(float v) {
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
static __device__ __forceinline__ float row16_sum(float v) {
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Writes acc[i][*]·mul into rows row0 + ty*4 + i (< t), columns < d, of a matrix whose rows are
// ld floats apart.
template <int D>
static __device__ __forceinline__ void store_rows(float* __restrict__ g, const float (&acc)[4][D / 16],
                                                  const float (&mul)[4], int row0, int t, int d,
                                                  int ld, int ty, int tx) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int row = row0 + ty * 4 + i;
        if (row >= t) continue;
#pragma unroll
        for (int h = 0; h < D / 64; ++h) {
            const int col = h * 64 + tx * 4;
            if (col < d)
                *reinterpret_cast<float4*>(g + (size_t)row * ld + col) =
                    make_float4(acc[i][h * 4 + 0] * mul[i], acc[i][h * 4 + 1] * mul[i],
                                acc[i][h * 4 + 2] * mul[i], acc[i][h * 4 + 3] * mul[i]);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Forward: one block per (sequence, tile of BQ = 4·NT/16 query rows), key tiles of BK rows.
template <int D, int BK, int NT, bool DROP = false>
static __device__ __forceinline__ void attn_fwd(const float* __restrict__ q, const float* __restrict__ k,
                                                const float* __restrict__ v, float* __restrict__ out,
                                                float* __restrict__ lse, unsigned int n, unsigned int t_,
                                                unsigned int d_, unsigned int heads, unsigned int ld_in,
                                                unsigned int ld_out, float scale, AttDrop dr = AttDrop{}) {
    constexpr int BQ = NT / 4, SC = BK / 16, OC = D / 16;
    static_assert(BQ % BK == 0 && BK % 16 == 0, "query tiles must be whole key tiles");
    __shared__ __align__(16) float sQ[BQ * Ld<D>::v];
    __shared__ __align__(16) float sK[BK * Ld<D>::v];
    __shared__ __align__(16) float sV[BK * Ld<D>::v];
    __shared__ __align__(16) float sP[BQ * Ld<BK>::v];

    const int t = (int)t_, d = (int)d_;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int nqt = (int)((t_ + BQ - 1u) / BQ);
    const unsigned int seq = blockIdx.x % n;
    const int q0 = (nqt - 1 - (int)(blockIdx.x / n)) * BQ;  // heaviest query tiles first
    const int kend = min(q0 + BQ, t);                       // keys 0 .. kend-1 are visible
    const size_t base = (size_t)(seq / heads) * t * ld_in + (size_t)(seq % heads) * d;
    const size_t obase = (size_t)(seq / heads) * t * ld_out + (size_t)(seq % heads) * d;
    const int li = (int)ld_in, lo = (int)ld_out;
    const float sl2 = scale * ATT_LOG2E;
    // This warp's local rows are 8w .. 8w+7 (ty = 2w, 2w+1).
    const int wlast = (threadIdx.x >> 5) * 8 + 7;

    RowTile<BK, D, NT> pk, pv;
    pk.fetch(k + base, 0, t, d, li);
    pv.fetch(v + base, 0, t, d, li);
    load_tile<BQ, D, NT>(sQ, q + base, q0, t, d, li);

    float o[4][OC], m[4], l[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        m[i] = -INFINITY;
        l[i] = 0.f;
#pragma unroll
        for (int c = 0; c < OC; ++c) o[i][c] = 0.f;
    }

    for (int k0 = 0; k0 < kend; k0 += BK) {
        pk.store(sK);
        pv.store(sV);
        __syncthreads();
        if (k0 + BK < kend) {  // the next tiles, in flight during this one
            pk.fetch(k + base, k0 + BK, t, d, li);
            pv.fetch(v + base, k0 + BK, t, d, li);
        }
        // Key columns are local to the query tile: c' = kofs + tx + 16j, masked when c' > r.
        const int kofs = k0 - q0;
        const bool masked = kofs + BK - 1 > 0;
        // Column groups (and P·V columns) past this warp's last row are fully masked.
        const int jn = !masked ? SC : wlast < kofs ? 0 : min(SC, (wlast - kofs) / 16 + 1);

        float s[4][SC];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < SC; ++j) s[i][j] = 0.f;
        mma_abt_n<D, SC>(s, sQ, sK, ty, tx, jn);

#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int r = ty * 4 + i;
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < SC; ++j) {
                float x = s[i][j] * sl2;
                if (masked && kofs + tx + 16 * j > r) x = -INFINITY;
                s[i][j] = x;
                mx = fmaxf(mx, x);
            }
            mx = row16_max(mx);
            // Finite: key 0 is visible to every row in the first tile, and m carries over.
            const float mnew = fmaxf(m[i], mx);
            const float alpha = exp2f(m[i] - mnew);
            m[i] = mnew;
            float ls = 0.f;
#pragma unroll
            for (int j = 0; j < SC; ++j) {
                const float p = exp2f(s[i][j] - mnew);
                ls += p;
                if constexpr (DROP)
                    sP[r * Ld<BK>::v + tx + 16 * j] =
                        p * att_drop_factor(dr, seq, q0 + r, k0 + tx + 16 * j, t);
                else
                    sP[r * Ld<BK>::v + tx + 16 * j] = p;
            }
            l[i] = l[i] * alpha + ls;
#pragma unroll
            for (int c = 0; c < OC; ++c) o[i][c] *= alpha;
        }
        __syncthreads();  // P published
        if (masked)
            mma_px_rows_causal<D, BK>(o, sP, sV, ty, tx, kofs);
        else
            mma_px<D, BK>(o, sP, sV, ty, tx, 0, BK);
        __syncthreads();  // before sK, sV and sP are overwritten
    }

    float inv[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float lt = row16_sum(l[i]);
        inv[i] = 1.0f / lt;
        const int row = q0 + ty * 4 + i;
        if (tx == 0 && row < t) lse[(size_t)seq * t + row] = (m[i] + log2f(lt)) * ATT_LN2;
    }
    store_rows<D>(out + obase, o, inv, q0, t, d, lo, ty, tx);
}

// Each entry point below comes in two: NAME, and NAME_drop with attention dropout (the same
// arguments, then float p in (0, 1), u64 seed and const u64* offset: seed + *offset when offset
// is non-null).
// PARAMS declares the arguments, ARGS names them for KERNEL<template arguments...>.
#define ATT_DROP_PARAMS float p, u64 seed, const u64* __restrict__ offset
#define ATT_ENTRIES(NAME, NT, MIN_BLOCKS, PARAMS, KERNEL, ARGS, ...)                               \
    extern "C" __global__ void __launch_bounds__(NT, MIN_BLOCKS) NAME(PARAMS) {                      \
        KERNEL<__VA_ARGS__>(ARGS);                                                                 \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(NT, MIN_BLOCKS)                                   \
        NAME##_drop(PARAMS, ATT_DROP_PARAMS) {                                                     \
        KERNEL<__VA_ARGS__, true>(ARGS, att_drop(p, seed, offset));                                \
    }

#define ATT_FWD_PARAMS                                                                               \
    const float *__restrict__ q, const float *__restrict__ k, const float *__restrict__ v,          \
        float *__restrict__ out, float *__restrict__ lse, unsigned int n, unsigned int t,           \
        unsigned int d, unsigned int heads, unsigned int ld_in, unsigned int ld_out, float scale
#define ATT_FWD_ARGS q, k, v, out, lse, n, t, d, heads, ld_in, ld_out, scale

// q, k, v, out: [n, t, d]; lse: [n, t]; grid n·ceil(t/64) blocks of 256 threads; d <= 64.
ATT_ENTRIES(attn_fwd_d64_f32, 256, 2, ATT_FWD_PARAMS, attn_fwd, ATT_FWD_ARGS, 64, 32, 256)
// As attn_fwd_d64_f32 for 64 < d <= 128: grid n·ceil(t/32) blocks of 128 threads.
ATT_ENTRIES(attn_fwd_d128_f32, 128, 3, ATT_FWD_PARAMS, attn_fwd, ATT_FWD_ARGS, 128, 16, 128)

// ---------------------------------------------------------------------------------------------
// Backward, dq: one block per (sequence, tile of BQ = 4·NT/16 query rows), key tiles of BK rows.
// Writes delta for its rows first (the dk/dv kernel reads it).
template <int D, int BK, int NT, bool DROP = false>
static __device__ __forceinline__ void attn_bwd_dq(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ out, const float* __restrict__ lse, const float* __restrict__ dout,
    float* __restrict__ dq, float* __restrict__ delta, unsigned int n, unsigned int t_,
    unsigned int d_, unsigned int heads, unsigned int ld_in, unsigned int ld_out, float scale,
    AttDrop dr = AttDrop{}) {
    constexpr int BQ = NT / 4, SC = BK / 16, OC = D / 16;
    static_assert(BQ % BK == 0 && BK % 16 == 0, "query tiles must be whole key tiles");
    __shared__ __align__(16) float sQ[BQ * Ld<D>::v];
    __shared__ __align__(16) float sdO[BQ * Ld<D>::v];
    __shared__ __align__(16) float sK[BK * Ld<D>::v];
    __shared__ __align__(16) float sV[BK * Ld<D>::v];
    __shared__ __align__(16) float sdS[BQ * Ld<BK>::v];

    const int t = (int)t_, d = (int)d_;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int nqt = (int)((t_ + BQ - 1u) / BQ);
    const unsigned int seq = blockIdx.x % n;
    const int q0 = (nqt - 1 - (int)(blockIdx.x / n)) * BQ;
    const int kend = min(q0 + BQ, t);
    const size_t base = (size_t)(seq / heads) * t * ld_in + (size_t)(seq % heads) * d;
    const size_t obase = (size_t)(seq / heads) * t * ld_out + (size_t)(seq % heads) * d;
    const int li = (int)ld_in, lo = (int)ld_out;
    const float sl2 = scale * ATT_LOG2E;

    load_tile<BQ, D, NT>(sQ, q + base, q0, t, d, li);
    load_tile<BQ, D, NT>(sdO, dout + obase, q0, t, d, lo);
    __syncthreads();

    // delta_i = dout_i · out_i (out read straight from global memory, dout from the tile).
    float dlt[4], lse2[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = ty * 4 + i, row = q0 + r;
        float acc = 0.f;
        if (row < t) {
#pragma unroll
            for (int h = 0; h < D / 64; ++h) {
                const int col = h * 64 + tx * 4;
                if (col < d) {
                    const float4 a = __ldg(reinterpret_cast<const float4*>(out + obase + (size_t)row * lo + col));
                    const float4 b = *reinterpret_cast<const float4*>(sdO + r * Ld<D>::v + col);
                    acc = fmaf(a.x, b.x, fmaf(a.y, b.y, fmaf(a.z, b.z, fmaf(a.w, b.w, acc))));
                }
            }
        }
        dlt[i] = row16_sum(acc);
        lse2[i] = row < t ? lse[(size_t)seq * t + row] * ATT_LOG2E : 0.f;
        if (tx == 0 && row < t) delta[(size_t)seq * t + row] = dlt[i];
    }

    float acc[4][OC];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int c = 0; c < OC; ++c) acc[i][c] = 0.f;

    for (int k0 = 0; k0 < kend; k0 += BK) {
        const bool kbad = load_tile_nonfinite<BK, D, NT>(sK, k + base, k0, t, d, li);
        load_tile<BK, D, NT>(sV, v + base, k0, t, d, li);
        // Masked dS entries are exact zeros (selects below), so dS·K needs the causal selects
        // only when the K tile holds a NaN or an infinity (0·NaN); the common case keeps the
        // plain product.
        const bool k_nonfinite = __syncthreads_or(kbad);
        float s[4][SC], dp[4][SC];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < SC; ++j) s[i][j] = dp[i][j] = 0.f;
        mma_abt<D, SC, SC>(s, sQ, sK, ty, tx);
        mma_abt<D, SC, SC>(dp, sdO, sV, ty, tx);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int r = ty * 4 + i, row = q0 + r;
#pragma unroll
            for (int j = 0; j < SC; ++j) {
                const int col = k0 + tx + 16 * j;
                // Selects, as masked dp may be NaN. (This form compiles to a faster loop than
                // vis ? p·(dp − delta) : 0.)
                const bool vis = col <= row && row < t;
                const float p = vis ? exp2f(s[i][j] * sl2 - lse2[i]) : 0.f;
                if constexpr (DROP) {
                    const float f = att_drop_factor(dr, seq, row, col, t);
                    sdS[r * Ld<BK>::v + tx + 16 * j] = p * (vis ? dp[i][j] * f - dlt[i] : 0.f);
                } else {
                    sdS[r * Ld<BK>::v + tx + 16 * j] = p * (vis ? dp[i][j] - dlt[i] : 0.f);
                }
            }
        }
        __syncthreads();
        const int kofs = k0 - q0;
        if (k_nonfinite && kofs + BK - 1 > 0)  // key k0 + j reaches row q0 + r when j − r <= −kofs
            mma_px_select_rolled<D, BK>(acc, sdS, sK, ty, tx, -(1 << 30), -kofs);
        else
            mma_px<D, BK>(acc, sdS, sK, ty, tx, 0, BK);
        __syncthreads();
    }
    const float mul[4] = {scale, scale, scale, scale};
    store_rows<D>(dq + base, acc, mul, q0, t, d, li, ty, tx);
}

#define ATT_DQ_PARAMS                                                                                \
    const float *__restrict__ q, const float *__restrict__ k, const float *__restrict__ v,          \
        const float *__restrict__ out, const float *__restrict__ lse,                               \
        const float *__restrict__ dout, float *__restrict__ dq, float *__restrict__ delta,           \
        unsigned int n, unsigned int t, unsigned int d, unsigned int heads, unsigned int ld_in,     \
        unsigned int ld_out, float scale
#define ATT_DQ_ARGS q, k, v, out, lse, dout, dq, delta, n, t, d, heads, ld_in, ld_out, scale

// q, k, v, out, dout, dq: [n, t, d]; lse, delta: [n, t]; grid n·ceil(t/32) blocks of 128
// threads; d <= 64. delta is written, not read.
ATT_ENTRIES(attn_bwd_dq_d64_f32, 128, 4, ATT_DQ_PARAMS, attn_bwd_dq, ATT_DQ_ARGS, 64, 32, 128)
// As attn_bwd_dq_d64_f32 for 64 < d <= 128: grid n·ceil(t/16) blocks of 64 threads. Five
// blocks per SM (at most 204 registers; it takes 168 and spills 16 bytes) beat four at 255
// registers by 7% on an H200: the kernel is latency-bound at so few warps.
ATT_ENTRIES(attn_bwd_dq_d128_f32, 64, 5, ATT_DQ_PARAMS, attn_bwd_dq, ATT_DQ_ARGS, 128, 16, 64)

// ---------------------------------------------------------------------------------------------
// Backward, dk and dv: one block per (sequence, tile of BKR = 4·NT/16 key rows), looping over
// the query tiles (BQC columns) that reach the tile. Rows of this kernel's tiles are keys and
// score columns are queries: S^T = K·Q^T, dP^T = V·dO^T.
template <int D, int BQC, int NT, bool DROP = false>
static __device__ __forceinline__ void attn_bwd_dkdv(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ lse, const float* __restrict__ dout, const float* __restrict__ delta,
    float* __restrict__ dk, float* __restrict__ dv, unsigned int n, unsigned int t_, unsigned int d_,
    unsigned int heads, unsigned int ld_in, unsigned int ld_out, float scale, AttDrop dr = AttDrop{}) {
    constexpr int BKR = NT / 4, SC = BQC / 16, OC = D / 16;
    static_assert(BQC % 16 == 0, "query tiles are whole column groups");
    __shared__ __align__(16) float sK[BKR * Ld<D>::v];
    __shared__ __align__(16) float sV[BKR * Ld<D>::v];
    __shared__ __align__(16) float sQ[BQC * Ld<D>::v];
    __shared__ __align__(16) float sdO[BQC * Ld<D>::v];
    __shared__ __align__(16) float sP[BKR * Ld<BQC>::v];
    __shared__ __align__(16) float sdS[BKR * Ld<BQC>::v];

    const int t = (int)t_, d = (int)d_;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const unsigned int seq = blockIdx.x % n;
    const int k0 = (int)(blockIdx.x / n) * BKR;  // low key tiles see the most queries: first
    const size_t base = (size_t)(seq / heads) * t * ld_in + (size_t)(seq % heads) * d;
    const size_t obase = (size_t)(seq / heads) * t * ld_out + (size_t)(seq % heads) * d;
    const int li = (int)ld_in, lo = (int)ld_out;
    const float sl2 = scale * ATT_LOG2E;

    load_tile<BKR, D, NT>(sK, k + base, k0, t, d, li);
    load_tile<BKR, D, NT>(sV, v + base, k0, t, d, li);

    float gk[4][OC], gv[4][OC];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int c = 0; c < OC; ++c) gk[i][c] = gv[i][c] = 0.f;

    // The first query tile holding a row >= k0.
    for (int q0 = k0 / BQC * BQC; q0 < t; q0 += BQC) {
        bool qbad = load_tile_nonfinite<BQC, D, NT>(sQ, q + base, q0, t, d, li);
        qbad |= load_tile_nonfinite<BQC, D, NT>(sdO, dout + obase, q0, t, d, lo);
        float lse2[SC], dlt[SC];
#pragma unroll
        for (int j = 0; j < SC; ++j) {
            const int row = q0 + tx + 16 * j;
            lse2[j] = row < t ? lse[(size_t)seq * t + row] * ATT_LOG2E : 0.f;
            dlt[j] = row < t ? delta[(size_t)seq * t + row] : 0.f;
        }
        // As in dq: the causal selects only when the Q or dO tile holds a NaN or an infinity.
        const bool q_nonfinite = __syncthreads_or(qbad);
        float s[4][SC], dp[4][SC];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < SC; ++j) s[i][j] = dp[i][j] = 0.f;
        mma_abt<D, SC, SC>(s, sK, sQ, ty, tx);
        mma_abt<D, SC, SC>(dp, sV, sdO, ty, tx);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int r = ty * 4 + i, key = k0 + r;
#pragma unroll
            for (int j = 0; j < SC; ++j) {
                const int row = q0 + tx + 16 * j;
                const bool vis = key <= row && row < t;  // selects: masked dp may be NaN
                const float p = vis ? exp2f(s[i][j] * sl2 - lse2[j]) : 0.f;
                if constexpr (DROP) {
                    const float f = att_drop_factor(dr, seq, row, key, t);
                    sP[r * Ld<BQC>::v + tx + 16 * j] = p * f;
                    sdS[r * Ld<BQC>::v + tx + 16 * j] = p * (vis ? dp[i][j] * f - dlt[j] : 0.f);
                } else {
                    sP[r * Ld<BQC>::v + tx + 16 * j] = p;
                    sdS[r * Ld<BQC>::v + tx + 16 * j] = p * (vis ? dp[i][j] - dlt[j] : 0.f);
                }
            }
        }
        __syncthreads();
        // Query column j reaches key row r when k0 + r <= q0 + j, i.e. j − r >= k0 − q0.
        if (q_nonfinite) {
            mma_px_select_rolled<D, BQC>(gv, sP, sdO, ty, tx, k0 - q0, 1 << 30);
            mma_px_select_rolled<D, BQC>(gk, sdS, sQ, ty, tx, k0 - q0, 1 << 30);
        } else {
            mma_px<D, BQC>(gv, sP, sdO, ty, tx, 0, BQC);
            mma_px<D, BQC>(gk, sdS, sQ, ty, tx, 0, BQC);
        }
        __syncthreads();
    }
    const float one[4] = {1.f, 1.f, 1.f, 1.f}, mul[4] = {scale, scale, scale, scale};
    store_rows<D>(dk + base, gk, mul, k0, t, d, li, ty, tx);
    store_rows<D>(dv + base, gv, one, k0, t, d, li, ty, tx);
}

#define ATT_DKDV_PARAMS                                                                              \
    const float *__restrict__ q, const float *__restrict__ k, const float *__restrict__ v,          \
        const float *__restrict__ lse, const float *__restrict__ dout,                              \
        const float *__restrict__ delta, float *__restrict__ dk, float *__restrict__ dv,             \
        unsigned int n, unsigned int t, unsigned int d, unsigned int heads, unsigned int ld_in,     \
        unsigned int ld_out, float scale
#define ATT_DKDV_ARGS q, k, v, lse, dout, delta, dk, dv, n, t, d, heads, ld_in, ld_out, scale

// q, k, v, dout, dk, dv: [n, t, d]; lse, delta: [n, t] (delta from attn_bwd_dq_d64_f32); grid
// n·ceil(t/32) blocks of 128 threads; d <= 64.
ATT_ENTRIES(attn_bwd_dkdv_d64_f32, 128, 4, ATT_DKDV_PARAMS, attn_bwd_dkdv, ATT_DKDV_ARGS, 64, 32, 128)
// As attn_bwd_dkdv_d64_f32 for 64 < d <= 128: grid n·ceil(t/16) blocks of 64 threads; five
// blocks per SM, as the dq kernel (7% faster than four on an H200).
ATT_ENTRIES(attn_bwd_dkdv_d128_f32, 64, 5, ATT_DKDV_PARAMS, attn_bwd_dkdv, ATT_DKDV_ARGS, 128, 16, 64)
