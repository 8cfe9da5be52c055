// The prefill's attention over a key/value cache in bf16 on tensor cores, head dimension 64: the
// forward of nn_attention_bf16.cu (FlashAttention-2 style, the same tiles, products, softmax and
// rounding points) with the layouts of the decode family (gpu_core::nn::decode) and two more
// masks. It computes DecodeOps::prefill_attention: cache_attention for a fresh prefill, where row
// r's t new queries sit at slots 0..t-1 of the cache (the call's keys and values, written there
// by rope_append) and query i attends to slots start[r] ..= i (start[r]: the row's first slot
// after left padding); a query before start[r] attends to nothing and gets zeros.
//   q    [b, t, heads, 64]        (rows heads·64 elements apart)
//   kc   [b, kvh, cap, 64], vc    (rows 64 apart; query head h reads key/value head h/(heads/kvh))
//   out  [b, t, heads, 64]
// Arithmetic (as attn_fwd_d64_bf16): S = q·kᵀ with f32 accumulation, the online softmax in base
// 2 (ex2.approx.ftz: terms below 2^-126 of the row's largest are 0), P rounded to bf16 for P·V,
// out = O/l rounded once to bf16.
// Masks: slots before start[r] are loaded as zeros and their probabilities are exact zeros (a
// select), so a non-finite value there reaches nothing; slots at or past t are zero-filled; the
// diagonal tile is masked per element with the exact path for non-finite operands of
// nn_attention_bf16.cu (mma_diag). A row that sees no slot keeps m = -inf, l = 0 and gets 0.
// Tiles: one block of 4 warps per (row·head, 64-query tile), heaviest first; query tiles wholly
// before start[r] only write zeros; key tiles from the one holding start[r] to the diagonal.
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

// One key tile for a warp's 16 rows (fwd_tile of nn_attention_bf16.cu): W = -1 below the
// diagonal, W = 0..3 the diagonal tile of warp W. LO: keys of local index below lo (before the
// row's start) are masked as well. A row none of whose keys so far were visible keeps m = -inf.
template <int W, bool LO>
static __device__ __forceinline__ void prefill_tile(float (&o)[8][4], float (&m)[2], float (&l)[2],
                                                    const u32 (&qf)[4][4], u32 tk, u32 tv, int lane,
                                                    float sl2, int lo) {
    constexpr bool diag = W >= 0;
    constexpr int jhi = diag ? W : 3;
    const int g = lane >> 2, c = lane & 3;
    const bool bad = diag && chunk_nonfinite(tv, jhi, lane);

    float s[8][4];
    zero(s);
    mma_abt(s, qf, tk, lane, 0, jhi);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int rl = 16 * jhi + g + 8 * h;
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int key = 8 * j + 2 * c + e;
                const bool masked = (diag && key > rl) || (LO && key < lo);
                mx = fmaxf(mx, masked ? -INFINITY : s[j][2 * h + e]);
            }
        const float qm = quad_max(mx);
        // -inf: no visible key yet (kept apart from the product, which is NaN for scale 0).
        const float mnew = fmaxf(m[h], qm == -INFINITY ? -INFINITY : qm * sl2);
        const float mref = mnew == -INFINITY ? 0.f : mnew;
        const float alpha = ex2_ftz(m[h] - mref);
        m[h] = mnew;
        float ls = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int key = 8 * j + 2 * c + e;
                const bool masked = (diag && key > rl) || (LO && key < lo);
                const float p = masked ? 0.f : ex2_ftz(fmaf(s[j][2 * h + e], sl2, -mref));
                ls += p;
                s[j][2 * h + e] = p;
            }
        l[h] = l[h] * alpha + ls;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            o[j][2 * h] *= alpha;
            o[j][2 * h + 1] *= alpha;
        }
    }
    u32 pf[4][4];
    c_to_a(pf, s);
    if (!bad) {
        mma_ax(o, pf, tv, lane, 0, jhi);
    } else {
        mma_ax(o, pf, tv, lane, 0, jhi - 1);
        mma_diag<true>(o, pf, tv, lane, jhi);
    }
}

template <bool LO>
static __device__ __forceinline__ void prefill_step(float (&o)[8][4], float (&m)[2], float (&l)[2],
                                                    const u32 (&qf)[4][4], u32 tk, u32 tv, int lane,
                                                    float sl2, int lo, bool diag, int w) {
    if (!diag) {
        prefill_tile<-1, LO>(o, m, l, qf, tk, tv, lane, sl2, lo);
        return;
    }
    switch (w) {  // the diagonal tile, one compiled case a warp
    case 0: prefill_tile<0, LO>(o, m, l, qf, tk, tv, lane, sl2, lo); break;
    case 1: prefill_tile<1, LO>(o, m, l, qf, tk, tv, lane, sl2, lo); break;
    case 2: prefill_tile<2, LO>(o, m, l, qf, tk, tv, lane, sl2, lo); break;
    default: prefill_tile<3, LO>(o, m, l, qf, tk, tv, lane, sl2, lo); break;
    }
}

// Grid: b·heads·ceil(t/64) blocks of 128 threads (static shared memory 40 KiB).
extern "C" __global__ void __launch_bounds__(NT)
    prefill_attn_d64_bf16(const bf16* __restrict__ q, const bf16* __restrict__ kc,
                          const bf16* __restrict__ vc, const u32* __restrict__ start,
                          bf16* __restrict__ out, u32 t_, u32 heads, u32 kvh, u32 cap, float scale) {
    __shared__ __align__(128) unsigned char smem[5 * TILE_BYTES];  // Q, K[2], V[2]
    const u32 sQ = smem_addr(smem), sK = sQ + TILE_BYTES, sV = sQ + 3 * TILE_BYTES;
    const int t = (int)t_, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int nqt = (t + TR - 1) / TR;
    const u32 n = gridDim.x / (u32)nqt;  // b·heads
    const u32 seq = blockIdx.x % n;
    const int qt = nqt - 1 - (int)(blockIdx.x / n);  // heaviest query tiles first
    const int q0 = qt * TR;
    const u32 r = seq / heads, h = seq % heads, kv = h / (heads / kvh);
    const int ldq = (int)(heads * 64);
    const size_t qbase = (size_t)r * t * ldq + (size_t)h * 64;
    const size_t cbase = ((size_t)r * kvh + kv) * cap * 64;
    const int st = (int)min(start[r], t_);

    if (q0 + TR <= st) {  // every query of the tile is padding: zeros
        for (int f = threadIdx.x; f < TR * 8; f += NT) {
            const int row = q0 + (f >> 3);
            if (row < t)
                *reinterpret_cast<uint4*>(out + qbase + (size_t)row * ldq + (f & 7) * 8) =
                    make_uint4(0, 0, 0, 0);
        }
        return;
    }
    const float sl2 = fabsf(scale) * ATB_LOG2E;
    const int kt0 = st / TR;

    // Q rows q0 .. q0+63 (rows ldq apart): the training loader with ld = ldq.
    tile_async(sQ, q + qbase, q0, t, ldq);
    tile_range(sK, kc + cbase, kt0 * TR, st, t);
    tile_range(sV, vc + cbase, kt0 * TR, st, t);
    cp_commit();

    u32 qf[4][4];
    float o[8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    zero(o);
    for (int kt = kt0; kt <= qt; ++kt) {
        const u32 buf = (u32)((kt - kt0) & 1) * TILE_BYTES;
        if (kt < qt) {
            tile_range(sK + (TILE_BYTES - buf), kc + cbase, (kt + 1) * TR, st, t);
            tile_range(sV + (TILE_BYTES - buf), vc + cbase, (kt + 1) * TR, st, t);
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        if (kt == kt0) {
            load_a(qf, sQ, 16 * w, lane);
            if (scale < 0.f) {
#pragma unroll
                for (int kk = 0; kk < 4; ++kk)
#pragma unroll
                    for (int i = 0; i < 4; ++i) qf[kk][i] ^= 0x80008000u;
            }
        }
        const u32 tk = sK + buf, tv = sV + buf;
        const int lo = kt == kt0 ? st - kt0 * TR : 0;
        if (lo > 0)
            prefill_step<true>(o, m, l, qf, tk, tv, lane, sl2, lo, kt == qt, w);
        else
            prefill_step<false>(o, m, l, qf, tk, tv, lane, sl2, 0, kt == qt, w);
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
