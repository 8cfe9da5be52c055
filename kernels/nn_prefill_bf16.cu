// The prefill's attention over a key/value cache in bf16 on tensor cores, head dimension 64
// (prefill_attn_d64_bf16) or 128 (prefill_attn_d128_bf16, at the end of the file): the
// forward of nn_attention_bf16.cu (FlashAttention-2 style, the same tiles, products, softmax and
// rounding points) with the layouts of the decode family (gpu_core::nn::decode) and two more
// masks. It computes DecodeOps::prefill_attention: cache_attention for a fresh prefill, where row
// r's t new queries sit at slots 0..t-1 of the cache (the call's keys and values, written there
// by rope_append) and query i attends to slots start[r] ..= i (start[r]: the row's first slot
// after left padding); a query before start[r] attends to nothing and gets zeros.
//   q    [b, t, heads, D]        (rows heads·D elements apart; D = 64 or 128)
//   kc   [b, kvh, cap, D], vc    (rows D apart; query head h reads key/value head h/(heads/kvh))
//   out  [b, t, heads, D]
// Arithmetic (as attn_fwd_d64_bf16): S = q·kᵀ with f32 accumulation, the online softmax in base
// 2 (ex2.approx.ftz: terms below 2^-126 of the row's largest are 0), P rounded to bf16 for P·V,
// out = O/l rounded once to bf16.
// Masks: slots before start[r] are loaded as zeros and their probabilities are exact zeros (a
// select), so a non-finite value there reaches nothing; slots at or past t are zero-filled; the
// diagonal tile is masked per element with the exact path for non-finite operands of
// nn_attention_bf16.cu (mma_diag). A row that sees no slot keeps m = -inf, l = 0 and gets 0.
// Sliding window (window > 0): query i also sees only slots > i - window. Slots before the query
// tile's first visible one (max(start[r], q0 + 1 - window)) are loaded as zeros and key tiles
// wholly before it are skipped; inside a tile each row's bound is a select, as for start[r]
// (a value there that is visible to a later row of the tile enters P·V as 0·v: non-finite
// values there give NaN, which a model's cache does not hold).
// Tiles: one block of 4 warps per (row·head, 64-query tile), heaviest first; query tiles wholly
// before start[r] only write zeros; key tiles from the one holding the tile's first visible slot
// to the diagonal.
// CPU reference: gpu_core::cpu::decode (cache_attention in f64 with slot = 0).
#include "nn_attention_bf16.cuh"

// Rows row0 .. row0+63 of a [*, 64] matrix (rows 64 elements apart) into tile s, asynchronously;
// rows outside lo .. hi-1 are zero-filled.
static __device__ __forceinline__ void tile_range(u32 s, const bf16* __restrict__ g, int row0, int lo,
                                                  int hi) {
#pragma unroll
    for (int it = 0; it < TR * 8 / NT; ++it) {
        const int f = it * NT + threadIdx.x, row = f >> 3, ch = f & 7, grow = row0 + row;
        const bool valid = grow >= lo && grow < hi;
        cp_async16(s + swz(row, ch), g + (size_t)(valid ? grow : lo) * 64 + ch * 8, valid);
    }
}

// The online softmax of one key tile for a warp's 16 rows (fwd_tile of nn_attention_bf16.cu): s
// holds the raw products S and becomes the probabilities P; alpha gets the rescale of the rows'
// earlier sums (the caller applies it to its accumulators). W = -1 below the diagonal, W = 0..3
// the diagonal tile of warp W. LO: keys of local index below lo (before the row's start) or
// below wq + the row's index in the warp (before its sliding window) are masked as well. A row
// none of whose keys so far were visible keeps m = -inf.
template <int W, bool LO>
static __device__ __forceinline__ void softmax_tile(float (&s)[8][4], float (&m)[2], float (&l)[2],
                                                    float (&alpha)[2], int lane, float sl2, int lo,
                                                    int wq) {
    constexpr bool diag = W >= 0;
    constexpr int jhi = diag ? W : 3;
    const int g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int rl = 16 * jhi + g + 8 * h, lo_h = max(lo, wq + g + 8 * h);
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int key = 8 * j + 2 * c + e;
                const bool masked = (diag && key > rl) || (LO && key < lo_h);
                mx = fmaxf(mx, masked ? -INFINITY : s[j][2 * h + e]);
            }
        const float qm = quad_max(mx);
        // -inf: no visible key yet (kept apart from the product, which is NaN for scale 0).
        const float mnew = fmaxf(m[h], qm == -INFINITY ? -INFINITY : qm * sl2);
        const float mref = mnew == -INFINITY ? 0.f : mnew;
        alpha[h] = ex2_ftz(m[h] - mref);
        m[h] = mnew;
        float ls = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int key = 8 * j + 2 * c + e;
                const bool masked = (diag && key > rl) || (LO && key < lo_h);
                const float p = masked ? 0.f : ex2_ftz(fmaf(s[j][2 * h + e], sl2, -mref));
                ls += p;
                s[j][2 * h + e] = p;
            }
        l[h] = l[h] * alpha[h] + ls;
    }
}

static __device__ __forceinline__ void rescale(float (&o)[8][4], const float (&alpha)[2]) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        o[j][0] *= alpha[0];
        o[j][1] *= alpha[0];
        o[j][2] *= alpha[1];
        o[j][3] *= alpha[1];
    }
}

// o += P·V over one value tile tv (64 keys x 64 columns); on the diagonal tile of warp W only
// the k16 steps up to W, the last through the exact path for non-finite values (mma_diag).
template <int W>
static __device__ __forceinline__ void values_tile(float (&o)[8][4], const u32 (&pf)[4][4], u32 tv,
                                                   int lane) {
    constexpr bool diag = W >= 0;
    constexpr int jhi = diag ? W : 3;
    const bool bad = diag && chunk_nonfinite(tv, jhi, lane);
    if (!bad) {
        mma_ax(o, pf, tv, lane, 0, jhi);
    } else {
        mma_ax(o, pf, tv, lane, 0, jhi - 1);
        mma_diag<true>(o, pf, tv, lane, jhi);
    }
}

// One key tile of the 64-wide kernel: S, the softmax, P·V.
template <int W, bool LO>
static __device__ __forceinline__ void prefill_tile(float (&o)[8][4], float (&m)[2], float (&l)[2],
                                                    const u32 (&qf)[4][4], u32 tk, u32 tv, int lane,
                                                    float sl2, int lo, int wq) {
    constexpr int jhi = W >= 0 ? W : 3;
    float s[8][4], alpha[2];
    zero(s);
    mma_abt(s, qf, tk, lane, 0, jhi);
    softmax_tile<W, LO>(s, m, l, alpha, lane, sl2, lo, wq);
    rescale(o, alpha);
    u32 pf[4][4];
    c_to_a(pf, s);
    values_tile<W>(o, pf, tv, lane);
}

template <bool LO>
static __device__ __forceinline__ void prefill_step(float (&o)[8][4], float (&m)[2], float (&l)[2],
                                                    const u32 (&qf)[4][4], u32 tk, u32 tv, int lane,
                                                    float sl2, int lo, int wq, bool diag, int w) {
    if (!diag) {
        prefill_tile<-1, LO>(o, m, l, qf, tk, tv, lane, sl2, lo, wq);
        return;
    }
    switch (w) {  // the diagonal tile, one compiled case a warp
    case 0: prefill_tile<0, LO>(o, m, l, qf, tk, tv, lane, sl2, lo, wq); break;
    case 1: prefill_tile<1, LO>(o, m, l, qf, tk, tv, lane, sl2, lo, wq); break;
    case 2: prefill_tile<2, LO>(o, m, l, qf, tk, tv, lane, sl2, lo, wq); break;
    default: prefill_tile<3, LO>(o, m, l, qf, tk, tv, lane, sl2, lo, wq); break;
    }
}

// The setup of both kernels for head width D: the block's query tile qt (queries q0 .. q0+63;
// heaviest tiles first) of sequence r, query head h and its key/value head kv; q's and out's row
// stride ldq and the tile's base qbase, the caches' base cbase, st = the row's first real query;
// sl2 = |scale|·log2(e). A tile whose queries are all padding writes zeros and returns.
// The sliding window (0: none) as a width wn of at most t; klo: the tile's first visible slot
// (its first query's). Key tiles wholly before klo are skipped: the loop starts at kt0.
#define PREFILL_SETUP(D)                                                                           \
    const int t = (int)t_, lane = threadIdx.x & 31, w = threadIdx.x >> 5;                         \
    const int nqt = (t + TR - 1) / TR;                                                             \
    const u32 n = gridDim.x / (u32)nqt; /* b·heads */                                              \
    const u32 seq = blockIdx.x % n;                                                                \
    const int qt = nqt - 1 - (int)(blockIdx.x / n);                                                \
    const int q0 = qt * TR;                                                                        \
    const u32 r = seq / heads, h = seq % heads, kv = h / (heads / kvh);                            \
    const int ldq = (int)(heads * (D));                                                            \
    const size_t qbase = (size_t)r * t * ldq + (size_t)h * (D);                                    \
    const size_t cbase = ((size_t)r * kvh + kv) * cap * (D);                                       \
    const int st = (int)min(start[r], t_);                                                         \
    if (q0 + TR <= st) {                                                                           \
        constexpr int CL = (D) == 64 ? 3 : 4, C = 1 << CL; /* D/8 = 2^CL 16-byte chunks a row */   \
        for (int f = threadIdx.x; f < TR * C; f += NT) {                                           \
            const int row = q0 + (f >> CL);                                                        \
            if (row < t)                                                                           \
                *reinterpret_cast<uint4*>(out + qbase + (size_t)row * ldq + (f & (C - 1)) * 8) =   \
                    make_uint4(0, 0, 0, 0);                                                        \
        }                                                                                          \
        return;                                                                                    \
    }                                                                                              \
    const float sl2 = fabsf(scale) * ATB_LOG2E;                                                    \
    const int wn = window == 0 || window > t_ ? t : (int)window;                                   \
    const int klo = max(st, q0 + 1 - wn), kt0 = klo / TR;

// Grid: b·heads·ceil(t/64) blocks of 128 threads (static shared memory 40 KiB).
extern "C" __global__ void __launch_bounds__(NT)
    prefill_attn_d64_bf16(const bf16* __restrict__ q, const bf16* __restrict__ kc,
                          const bf16* __restrict__ vc, const u32* __restrict__ start,
                          bf16* __restrict__ out, u32 t_, u32 heads, u32 kvh, u32 cap, float scale,
                          u32 window) {
    __shared__ __align__(128) unsigned char smem[5 * TILE_BYTES];  // Q, K[2], V[2]
    const u32 sQ = smem_addr(smem), sK = sQ + TILE_BYTES, sV = sQ + 3 * TILE_BYTES;
    PREFILL_SETUP(64)

    // Q rows q0 .. q0+63 (rows ldq apart): the training loader with ld = ldq.
    tile_async(sQ, q + qbase, q0, t, ldq);
    tile_range(sK, kc + cbase, kt0 * TR, klo, t);
    tile_range(sV, vc + cbase, kt0 * TR, klo, t);
    cp_commit();

    u32 qf[4][4];
    float o[8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    zero(o);
    for (int kt = kt0; kt <= qt; ++kt) {
        const u32 buf = (u32)((kt - kt0) & 1) * TILE_BYTES;
        if (kt < qt) {
            tile_range(sK + (TILE_BYTES - buf), kc + cbase, (kt + 1) * TR, klo, t);
            tile_range(sV + (TILE_BYTES - buf), vc + cbase, (kt + 1) * TR, klo, t);
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        if (kt == kt0) {
            load_a(qf, sQ, 16 * w, lane);
            negate_if(qf, scale);
        }
        const u32 tk = sK + buf, tv = sV + buf;
        const int lo = kt == kt0 ? klo - kt0 * TR : 0;
        // The window's first key of the warp's first row, relative to this key tile.
        const int wq = q0 + 16 * w + 1 - wn - kt * TR;
        if (lo > 0 || (window != 0 && wq + 15 > 0))
            prefill_step<true>(o, m, l, qf, tk, tv, lane, sl2, lo, wq, kt == qt, w);
        else
            prefill_step<false>(o, m, l, qf, tk, tv, lane, sl2, 0, wq, kt == qt, w);
        __syncthreads();  // before the buffers are refilled
    }

    float inv[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const float lt = quad_sum(l[hh]);
        inv[hh] = lt == 0.f ? 0.f : 1.0f / lt;  // no visible slot: zeros (NaN stays NaN)
    }
    store_rows(out + qbase, o, inv[0], inv[1], sQ, 16 * w, q0, t, ldq, lane);
}

// ---- Head dimension 128 (Llama 3.2 3B, 8B, Mistral, Qwen2.5 ≥ 1.5B) ----
// The same arithmetic with each 128-wide row held as two 64-wide halves (two swizzled tiles, lo
// then hi): S = q_lo·k_loᵀ + q_hi·k_hiᵀ (one f32 accumulation continued over the halves),
// O_lo = P·V_lo, O_hi = P·V_hi (the exact path for non-finite values per half: the halves are
// independent columns). Shared memory is a ring of three 64 x 128 tiles (48 KiB, static) filled
// one tile ahead in the order K(kt0), V(kt0), K(kt0+1), V(kt0+1), ...; Q passes through the
// third buffer before the loop. Same grid and block as the 64-wide kernel.

static constexpr int TILE2 = 2 * TILE_BYTES;  // 64 rows of 128 bf16: the lo and hi halves

// Rows row0 .. row0+63 of a [*, 128] matrix (rows 128 elements apart) into the halves at s and
// s + TILE_BYTES, asynchronously; rows outside lo .. hi-1 are zero-filled.
static __device__ __forceinline__ void tile_range128(u32 s, const bf16* __restrict__ g, int row0,
                                                     int lo, int hi) {
#pragma unroll
    for (int it = 0; it < TR * 16 / NT; ++it) {
        const int f = it * NT + threadIdx.x, row = f >> 4, ch = f & 15, grow = row0 + row;
        const bool valid = grow >= lo && grow < hi;
        cp_async16(s + (u32)(ch >> 3) * TILE_BYTES + swz(row, ch & 7),
                   g + (size_t)(valid ? grow : lo) * 128 + ch * 8, valid);
    }
}

// S and the softmax of one key tile (two halves at tk), the accumulators rescaled; P as bf16
// A fragments in pf.
template <int W, bool LO>
static __device__ __forceinline__ void scores128(u32 (&pf)[4][4], float (&o0)[8][4],
                                                 float (&o1)[8][4], float (&m)[2], float (&l)[2],
                                                 const u32 (&qa)[4][4], const u32 (&qb)[4][4],
                                                 u32 tk, int lane, float sl2, int lo, int wq) {
    constexpr int jhi = W >= 0 ? W : 3;
    float s[8][4], alpha[2];
    zero(s);
    mma_abt(s, qa, tk, lane, 0, jhi);
    mma_abt(s, qb, tk + TILE_BYTES, lane, 0, jhi);
    softmax_tile<W, LO>(s, m, l, alpha, lane, sl2, lo, wq);
    rescale(o0, alpha);
    rescale(o1, alpha);
    c_to_a(pf, s);
}

template <bool LO>
static __device__ __forceinline__ void scores128_step(u32 (&pf)[4][4], float (&o0)[8][4],
                                                      float (&o1)[8][4], float (&m)[2],
                                                      float (&l)[2], const u32 (&qa)[4][4],
                                                      const u32 (&qb)[4][4], u32 tk, int lane,
                                                      float sl2, int lo, int wq, bool diag, int w) {
    if (!diag) {
        scores128<-1, LO>(pf, o0, o1, m, l, qa, qb, tk, lane, sl2, lo, wq);
        return;
    }
    switch (w) {  // the diagonal tile, one compiled case a warp
    case 0: scores128<0, LO>(pf, o0, o1, m, l, qa, qb, tk, lane, sl2, lo, wq); break;
    case 1: scores128<1, LO>(pf, o0, o1, m, l, qa, qb, tk, lane, sl2, lo, wq); break;
    case 2: scores128<2, LO>(pf, o0, o1, m, l, qa, qb, tk, lane, sl2, lo, wq); break;
    default: scores128<3, LO>(pf, o0, o1, m, l, qa, qb, tk, lane, sl2, lo, wq); break;
    }
}

template <int W>
static __device__ __forceinline__ void values128(float (&o0)[8][4], float (&o1)[8][4],
                                                 const u32 (&pf)[4][4], u32 tv, int lane) {
    values_tile<W>(o0, pf, tv, lane);
    values_tile<W>(o1, pf, tv + TILE_BYTES, lane);
}

static __device__ __forceinline__ void values128_step(float (&o0)[8][4], float (&o1)[8][4],
                                                      const u32 (&pf)[4][4], u32 tv, int lane,
                                                      bool diag, int w) {
    if (!diag) {
        values128<-1>(o0, o1, pf, tv, lane);
        return;
    }
    switch (w) {
    case 0: values128<0>(o0, o1, pf, tv, lane); break;
    case 1: values128<1>(o0, o1, pf, tv, lane); break;
    case 2: values128<2>(o0, o1, pf, tv, lane); break;
    default: values128<3>(o0, o1, pf, tv, lane); break;
    }
}

// Grid: b·heads·ceil(t/64) blocks of 128 threads (static shared memory 48 KiB).
extern "C" __global__ void __launch_bounds__(NT)
    prefill_attn_d128_bf16(const bf16* __restrict__ q, const bf16* __restrict__ kc,
                           const bf16* __restrict__ vc, const u32* __restrict__ start,
                           bf16* __restrict__ out, u32 t_, u32 heads, u32 kvh, u32 cap, float scale,
                          u32 window) {
    __shared__ __align__(128) unsigned char smem[3 * TILE2];  // the ring
    const u32 ring0 = smem_addr(smem);
    PREFILL_SETUP(128)
    auto ring = [&](int i) { return ring0 + (u32)i * TILE2; };

    tile_range128(ring(0), kc + cbase, kt0 * TR, klo, t);  // K(kt0) and Q: group 0
    tile_async(ring(2), q + qbase, q0, t, ldq);
    tile_async(ring(2) + TILE_BYTES, q + qbase + 64, q0, t, ldq);
    cp_commit();
    tile_range128(ring(1), vc + cbase, kt0 * TR, klo, t);  // V(kt0): group 1
    cp_commit();
    cp_wait<1>();
    __syncthreads();
    u32 qa[4][4], qb[4][4];
    load_a(qa, ring(2), 16 * w, lane);
    load_a(qb, ring(2) + TILE_BYTES, 16 * w, lane);
    if (scale < 0.f) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                qa[kk][i] ^= 0x80008000u;
                qb[kk][i] ^= 0x80008000u;
            }
    }
    __syncthreads();  // the third buffer is refilled next

    float o0[8][4], o1[8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    zero(o0);
    zero(o1);
    int bk = 0;  // the ring slot of K(kt); V(kt) is the next one, K(kt+1) the one after
    for (int kt = kt0; kt <= qt; ++kt) {
        const int bv = bk == 2 ? 0 : bk + 1, bn = bv == 2 ? 0 : bv + 1;
        const bool diag = kt == qt;
        if (!diag) tile_range128(ring(bn), kc + cbase, (kt + 1) * TR, klo, t);
        cp_commit();  // (empty on the last tile: the wait counts stay uniform)
        cp_wait<2>();  // K(kt) has landed
        __syncthreads();
        u32 pf[4][4];
        const int lo = kt == kt0 ? klo - kt0 * TR : 0;
        // The window's first key of the warp's first row, relative to this key tile.
        const int wq = q0 + 16 * w + 1 - wn - kt * TR;
        if (lo > 0 || (window != 0 && wq + 15 > 0))
            scores128_step<true>(pf, o0, o1, m, l, qa, qb, ring(bk), lane, sl2, lo, wq, diag, w);
        else
            scores128_step<false>(pf, o0, o1, m, l, qa, qb, ring(bk), lane, sl2, 0, wq, diag, w);
        __syncthreads();  // K(kt)'s slot is refilled next, with V(kt+1)
        if (!diag) tile_range128(ring(bk), vc + cbase, (kt + 1) * TR, klo, t);
        cp_commit();
        cp_wait<2>();  // V(kt) has landed
        __syncthreads();
        values128_step(o0, o1, pf, ring(bv), lane, diag, w);
        __syncthreads();  // V(kt)'s slot is refilled next, with K(kt+2)
        bk = bn;
    }

    float inv[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const float lt = quad_sum(l[hh]);
        inv[hh] = lt == 0.f ? 0.f : 1.0f / lt;  // no visible slot: zeros (NaN stays NaN)
    }
    store_rows(out + qbase, o0, inv[0], inv[1], ring(0), 16 * w, q0, t, ldq, lane);
    store_rows(out + qbase + 64, o1, inv[0], inv[1], ring(0) + TILE_BYTES, 16 * w, q0, t, ldq,
               lane);
}
