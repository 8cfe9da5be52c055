// Token sampling: repetition penalty, temperature, top-k, top-p and a seeded Philox draw, as
// gpu_core::nn::sample::SampleOps::sample_rows defines them (CPU reference:
// gpu-core/src/cpu/sample.rs). The two give the same token bit for bit: the weights are
// fixed-point u64, exp is the fixed sequence of IEEE operations of gpu_core::nn::sample::weight,
// and every rounding below is spelled out (__f*_rn) so that nvcc cannot contract it.
//
// A row is served by NB blocks of 1024 threads, each owning a contiguous slice of the
// vocabulary: on sm_90 and later NB = 8, one thread-block cluster whose blocks combine their
// partial results through distributed shared memory (every block reads all NB partials in rank
// order, so every block holds the same combined value); elsewhere NB = 1. The logits stay in
// global memory (L2) and each pass re-reads the slice:
// 1. any NaN/+inf, and the first maximum of z (the penalized, tempered logits);
// 2. top-k: the k-th largest key (order_key(z)) by a radix select, 4 passes of 8-bit digits,
//    counting with warp-aggregated shared atomics;
// 3. the survivors' weight Z_S, then top-p: the smallest kept key by the same radix walk over
//    the survivors' weight (4 passes);
// 4. each thread sums the kept weight of a contiguous chunk of its block's slice, block and
//    cluster scans place the draw's target, and the thread whose chunk holds it walks it.

#include "common.cuh"
#include "nn_elem_io.cuh"

#define SAMPLE_THREADS 1024
#define NO_BIN 256u
#define NONE 0xffffffffu

static __device__ __forceinline__ float ldf(const float* p) { return *p; }
static __device__ __forceinline__ float ldf(const bf16* p) { return bf16_bits_to_float(p->bits); }

// ---- the cluster (sm_90 and later; NB = 1 elsewhere) -------------------------------------------

// Every thread of every block of the row's blocks waits for all the others, shared memory
// released and acquired (a block barrier alone when NB = 1).
static __device__ __forceinline__ void row_sync(u32 nb) {
    __syncthreads();
#if __CUDA_ARCH__ >= 900
    if (nb > 1) asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
#endif
}

static __device__ __forceinline__ u32 row_rank(u32 nb) {
#if __CUDA_ARCH__ >= 900
    if (nb > 1) {
        u32 r;
        asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
        return r;
    }
#else
    if (nb > 1) __trap(); // the host asks for clusters only where this image has them
#endif
    return 0;
}

// The u64 at `local` (a shared address) in block q of the cluster.
static __device__ __forceinline__ u64 peer_u64(const u64* local, u32 q, u32 nb) {
#if __CUDA_ARCH__ >= 900
    if (nb > 1) {
        const u32 a = (u32)__cvta_generic_to_shared(local);
        u32 ra;
        u64 v;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(a), "r"(q));
        asm volatile("ld.shared::cluster.u64 %0, [%1];" : "=l"(v) : "r"(ra) : "memory");
        return v;
    }
#endif
    return *local;
}

// ---- the arithmetic of gpu_core::nn::sample ------------------------------------------------------

static __device__ __forceinline__ u32 order_key(float v) {
    const u32 b = __float_as_uint(v);
    return (b >> 31) ? ~b : (b | 0x80000000u);
}

// weight: floor(exp(x) * 2^40) for x <= 0.
static __device__ __forceinline__ u64 weight(float x) {
    const float y = __fmul_rn(x, __int_as_float(0x3fb8aa3b));
    if (!(y >= -41.0f)) return 0;
    const float n = rintf(y);
    const float f = __fsub_rn(y, n);
    float p = __int_as_float(0x377fe5fe);
    p = __fmaf_rn(p, f, __int_as_float(0x39218489));
    p = __fmaf_rn(p, f, __int_as_float(0x3aaec3ff));
    p = __fmaf_rn(p, f, __int_as_float(0x3c1d955b));
    p = __fmaf_rn(p, f, __int_as_float(0x3d635847));
    p = __fmaf_rn(p, f, __int_as_float(0x3e75fdf0));
    p = __fmaf_rn(p, f, __int_as_float(0x3f317218));
    p = __fmaf_rn(p, f, 1.0f);
    const u32 b = __float_as_uint(p);
    const u64 m = (b & 0x7fffffu) | 0x800000u;
    const int shift = (int)((b >> 23) & 0xffu) - 127 - 23 + (int)n + 40;
    return shift >= 0 ? m << shift : (shift > -64 ? m >> -shift : 0);
}

// philox4x32_10 at counter (c0, c1, 0, 0), key (k0, k1): the first two words, (hi << 32) | lo.
static __device__ u64 philox_draw(u32 c0, u32 c1, u32 k0, u32 k1) {
    u32 c2 = 0, c3 = 0;
#pragma unroll
    for (int round = 0; round < 10; ++round) {
        if (round > 0) k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
        const u32 hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        const u32 hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        const u32 n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0, c1 = lo1, c2 = n2, c3 = lo0;
    }
    return ((u64)c0 << 32) | c1;
}

struct SampleArgs {
    u32 vocab, top_k, nb;
    float temperature, inv_t, penalty, inv_p, top_p;
    u32 seed_lo, seed_hi, offset;
};

// SampleParams::z.
template <typename T>
static __device__ __forceinline__ float zval(const T* row, const u32* seen, u32 i, const SampleArgs& a) {
    float v = ldf(row + i);
    if ((seen[i >> 5] >> (i & 31)) & 1u) v = __fmul_rn(v, v > 0.0f ? a.inv_p : a.penalty);
    return a.temperature > 0.0f ? __fmul_rn(v, a.inv_t) : v;
}

// ---- block and row reductions --------------------------------------------------------------------

// The sum of v over the block, in every thread. `sh` holds 32 u64.
static __device__ u64 block_sum_u64(u64 v, u64* sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    u64 t = 0;
    for (u32 w = 0; w < (blockDim.x >> 5); ++w) t += sh[w];
    return t;
}

// The sum over the row's blocks of each block's `mine` (in `slot`, a shared u64 of its own
// that no one else writes): (sum over blocks of lower rank, total).
static __device__ void row_scan(u64 mine, u64* slot, u32 rank, u32 nb, u64* before, u64* total) {
    if (threadIdx.x == 0) *slot = mine;
    row_sync(nb);
    u64 b = 0, t = 0;
    for (u32 q = 0; q < nb; ++q) {
        const u64 v = peer_u64(slot, q, nb);
        if (q < rank) b += v;
        t += v;
    }
    *before = b, *total = t;
}

// Adds `w` to hist[bin] for every lane with bin < NO_BIN, one shared atomic per distinct bin of
// the warp (the weights of a bin summed exactly in two 32-bit halves: < 2^40 each, 32 lanes).
static __device__ __forceinline__ void hist_add(u64* hist, u32 bin, u64 w) {
    if (!__any_sync(0xffffffffu, bin < NO_BIN)) return;
    const u32 mask = __match_any_sync(0xffffffffu, bin);
    const u32 lo = __reduce_add_sync(mask, (u32)(w & 0xfffffu));
    const u32 hi = __reduce_add_sync(mask, (u32)(w >> 20));
    if (bin < NO_BIN && (threadIdx.x & 31) == (u32)(__ffs(mask) - 1))
        atomicAdd(reinterpret_cast<unsigned long long*>(hist + bin), ((u64)hi << 20) + lo);
}

// One radix level over the keys >= lo_key of the slice [i0, i1) whose bits above `shift + 8`
// equal `prefix`: the row's histogram of their next digit, counted (by_mass = false) or
// weighted, lands in `ghist` (every block the same). `hist` is this block's, read by its peers
// until the next row_sync after this call's.
template <typename T>
static __device__ void radix_level(const T* row, const u32* seen, const SampleArgs& a, float m, u32 i0,
                                   u32 i1, u32 lo_key, u32 prefix, u32 shift, bool by_mass, u64* hist,
                                   u64* ghist) {
    for (u32 b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    const u32 hi_mask = shift >= 24 ? 0u : ~0u << (shift + 8);
    for (u32 base = i0; base < i1; base += blockDim.x) {
        const u32 i = base + threadIdx.x;
        u32 bin = NO_BIN;
        u64 w = 0;
        if (i < i1) {
            const float z = zval(row, seen, i, a);
            const u32 key = order_key(z);
            if (key >= lo_key && (key & hi_mask) == prefix) {
                bin = (key >> shift) & 255u;
                w = by_mass ? weight(__fsub_rn(z, m)) : 1;
            }
        }
        hist_add(hist, bin, w);
    }
    row_sync(a.nb);
    for (u32 b = threadIdx.x; b < 256; b += blockDim.x) {
        u64 t = 0;
        for (u32 q = 0; q < a.nb; ++q) t += peer_u64(hist + b, q, a.nb);
        ghist[b] = t;
    }
    __syncthreads();
}

// ---- the op -------------------------------------------------------------------------------------

template <typename T>
static __device__ void sample_body(const T* __restrict__ logits, u32* __restrict__ seen_all,
                                   const u32* __restrict__ counter, u32* __restrict__ out, SampleArgs a) {
    __shared__ u64 hist[2][256];
    __shared__ u64 ghist[256];
    __shared__ u64 sh[32];
    __shared__ u64 slots[4];
    __shared__ float sv[32];
    __shared__ u32 si[32];
    __shared__ u32 s_key;
    __shared__ u64 s_val;
    const u32 nb = a.nb, rank = row_rank(nb), r = blockIdx.x / nb, words = (a.vocab + 31) / 32;
    const u32 per_block = (a.vocab + nb - 1) / nb;
    const u32 i0 = min(rank * per_block, a.vocab), i1 = min(i0 + per_block, a.vocab);
    const T* row = logits + (u64)r * a.vocab;
    u32* seen = seen_all + (u64)r * words;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    // 1. Bad values and the first maximum of z, over the block's slice, then the row's.
    bool bad = false;
    float best = -INFINITY;
    u32 bi = NONE;
    for (u32 i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
        const float v = ldf(row + i);
        bad |= (v != v) || v == INFINITY;
        const float z = zval(row, seen, i, a);
        if (bi == NONE || z > best) best = z, bi = i;
    }
    bad = __syncthreads_or(bad);
    for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(0xffffffffu, best, o);
        const u32 i = __shfl_xor_sync(0xffffffffu, bi, o);
        if (i != NONE && (bi == NONE || v > best || (v == best && i < bi))) best = v, bi = i;
    }
    if (lane == 0) sv[warp] = best, si[warp] = bi;
    __syncthreads();
    best = -INFINITY, bi = NONE;
    for (u32 w = 0; w < (blockDim.x >> 5); ++w)
        if (si[w] != NONE && (bi == NONE || sv[w] > best || (sv[w] == best && si[w] < bi))) best = sv[w], bi = si[w];
    // Pack (best, index, bad) for the peers: a block's best is its first maximum; lower ranks
    // hold lower indices, so the row's first maximum is the first block's at the largest value.
    if (threadIdx.x == 0) slots[0] = ((u64)__float_as_uint(best) << 32) | bi, slots[1] = bad;
    row_sync(nb);
    best = -INFINITY, bi = NONE;
    for (u32 q = 0; q < nb; ++q) {
        const u64 p = peer_u64(&slots[0], q, nb);
        const float v = __uint_as_float((u32)(p >> 32));
        const u32 i = (u32)p;
        bad |= peer_u64(&slots[1], q, nb) != 0;
        if (i != NONE && (bi == NONE || v > best)) best = v, bi = i;
    }
    if (bad || !isfinite(best)) {
        if (rank == 0 && threadIdx.x == 0) out[r] = a.vocab;
        row_sync(nb);
        return;
    }
    if (a.temperature == 0.0f) {
        if (rank == 0 && threadIdx.x == 0) out[r] = bi, seen[bi >> 5] |= 1u << (bi & 31);
        row_sync(nb);
        return;
    }
    const float m = best;
    int level = 0;

    // 2. Top-k: the k-th largest key, digit by digit from the top.
    u32 vk = 0;
    if (a.top_k > 0 && a.top_k < a.vocab) {
        u32 prefix = 0, need = a.top_k;
        for (int shift = 24; shift >= 0; shift -= 8, ++level) {
            radix_level(row, seen, a, m, i0, i1, 0u, prefix, (u32)shift, false, hist[level & 1], ghist);
            if (threadIdx.x == 0) {
                u64 cum = 0;
                for (int b = 255; b >= 0; --b) {
                    if (cum + ghist[b] >= need) {
                        prefix |= (u32)b << shift;
                        need -= (u32)cum;
                        break;
                    }
                    cum += ghist[b];
                }
                s_key = prefix, s_val = need;
            }
            __syncthreads();
            prefix = s_key, need = (u32)s_val;
            __syncthreads();
        }
        vk = prefix;
    }

    // 3. Top-p: the smallest key whose survivors' weight above stays below the cut.
    u32 cut_key = vk;
    if (a.top_p < 1.0f) {
        u64 zs = 0;
        for (u32 i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
            const float z = zval(row, seen, i, a);
            if (order_key(z) >= vk) zs += weight(__fsub_rn(z, m));
        }
        u64 before, total;
        row_scan(block_sum_u64(zs, sh), &slots[2], rank, nb, &before, &total);
        u64 cut = __double2ull_rz(__dmul_rn((double)a.top_p, __ull2double_rn(total)));
        cut = cut < 1 ? 1 : cut;
        u32 prefix = 0;
        u64 above = 0;
        for (int shift = 24; shift >= 0; shift -= 8, ++level) {
            radix_level(row, seen, a, m, i0, i1, vk, prefix, (u32)shift, true, hist[level & 1], ghist);
            if (threadIdx.x == 0) {
                // The lowest non-empty digit whose weight above is below the cut.
                u64 run = above, at = above;
                int cand = 0;
                for (int b = 255; b >= 0 && run < cut; --b) {
                    if (ghist[b] == 0) continue;
                    cand = b, at = run;
                    run += ghist[b];
                }
                s_key = prefix | ((u32)cand << shift), s_val = at;
            }
            __syncthreads();
            prefix = s_key, above = s_val;
            __syncthreads();
        }
        cut_key = prefix;
    }

    // 4. The draw: contiguous chunks of the slice, block and row scans, one walk.
    const u32 per = (i1 - i0 + blockDim.x - 1) / blockDim.x;
    const u32 lo = min(i0 + threadIdx.x * per, i1), hi = min(lo + per, i1);
    u64 mine = 0;
    for (u32 i = lo; i < hi; ++i) {
        const float z = zval(row, seen, i, a);
        if (order_key(z) >= cut_key) mine += weight(__fsub_rn(z, m));
    }
    u64 incl = mine;
    for (int o = 1; o < 32; o <<= 1) {
        const u64 v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= (u32)o) incl += v;
    }
    __syncthreads();
    if (lane == 31) sh[warp] = incl;
    __syncthreads();
    u64 in_block = 0, block_total = 0;
    for (u32 w = 0; w < (blockDim.x >> 5); ++w) {
        if (w < warp) in_block += sh[w];
        block_total += sh[w];
    }
    u64 before, total;
    row_scan(block_total, &slots[3], rank, nb, &before, &total);
    const u64 excl = before + in_block + incl - mine;
    const u64 rnd = philox_draw(counter[r] + a.offset, r, a.seed_lo, a.seed_hi);
    const u64 target = __umul64hi(rnd, total);
    if (mine > 0 && excl <= target && target < excl + mine) {
        u64 c = excl;
        for (u32 i = lo; i < hi; ++i) {
            const float z = zval(row, seen, i, a);
            if (order_key(z) < cut_key) continue;
            const u64 w = weight(__fsub_rn(z, m));
            if (target < c + w) {
                out[r] = i;
                seen[i >> 5] |= 1u << (i & 31);
                break;
            }
            c += w;
        }
    }
    // Peers may still read this block's slots and histograms.
    row_sync(nb);
}

// grid.x = rows · nb; nb = 1, or the cluster size (sm_90 and later; launched in clusters of nb).
#define SAMPLE(SUFFIX, T)                                                                           \
    extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)                                   \
        sample_rows_##SUFFIX(const T* logits, u32* seen, const u32* counter, u32* out, u32 vocab,  \
                             u32 nb, u32 top_k, float temperature, float inv_t, float penalty,      \
                             float inv_p, float top_p, u32 seed_lo, u32 seed_hi, u32 offset) {      \
        const SampleArgs a = {vocab, top_k, nb, temperature, inv_t, penalty, inv_p, top_p,        \
                              seed_lo, seed_hi, offset};                                            \
        sample_body<T>(logits, seen, counter, out, a);                                              \
    }
SAMPLE(f, float)
SAMPLE(b, bf16)
