// Token sampling, one block of 1024 threads per row of logits: repetition penalty, temperature,
// top-k, top-p and a seeded Philox draw, as gpu_core::nn::sample::SampleOps::sample_rows
// defines them (CPU reference: gpu-core/src/cpu/sample.rs; the two give the same token bit for
// bit: the weights are fixed-point u64, exp is the fixed sequence of IEEE operations of
// gpu_core::nn::sample::weight, and the roundings below are spelled out with __f*_rn so that
// nvcc cannot contract them).
//
// The row stays in global memory (L2) and is re-read by each pass:
// 1. any NaN/+inf, the first maximum of z (the penalized, tempered logits);
// 2. top-k: the k-th largest key (order_key(z)) by a radix select, 4 passes of 8-bit digits,
//    counting with warp-aggregated shared atomics;
// 3. the survivors' weight Z_S, then top-p: the smallest kept key by the same radix walk over
//    the survivors' mass (4 passes);
// 4. each thread sums the kept weight of a contiguous chunk, a block scan places the draw's
//    target, and the thread whose chunk holds it walks it.

#include "common.cuh"
#include "nn_elem_io.cuh"

#define SAMPLE_THREADS 1024
#define NO_BIN 256u

static __device__ __forceinline__ float ldf(const float* p) { return *p; }
static __device__ __forceinline__ float ldf(const bf16* p) { return bf16_bits_to_float(p->bits); }

static __device__ __forceinline__ u32 order_key(float v) {
    const u32 b = __float_as_uint(v);
    return (b >> 31) ? ~b : (b | 0x80000000u);
}

// gpu_core::nn::sample::weight: floor(exp(x) * 2^40) for x <= 0.
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
    return __double2ull_rz(ldexp((double)p, (int)n + 40));
}

// gpu_core::nn::sample::philox4x32_10, returning the first two words as (hi << 32) | lo.
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
    u32 vocab, top_k;
    float temperature, top_p, penalty;
    u32 seed_lo, seed_hi, offset;
};

template <typename T>
static __device__ __forceinline__ float zval(const T* row, const u32* seen, u32 i, const SampleArgs& a) {
    float v = ldf(row + i);
    if ((seen[i >> 5] >> (i & 31)) & 1u) v = v > 0.0f ? __fdiv_rn(v, a.penalty) : __fmul_rn(v, a.penalty);
    return a.temperature > 0.0f ? __fdiv_rn(v, a.temperature) : v;
}

// Sum of a u64 over the block (every thread gets it). `sh` holds 32 u64.
static __device__ u64 block_sum_u64(u64 v, u64* sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    u64 t = 0;
    for (u32 w = 0; w < (blockDim.x >> 5); ++w) t += sh[w];
    return t;
}

// Adds `w` to hist[bin] for every lane with bin < NO_BIN, one shared atomic per distinct bin of
// the warp (the weights of a bin summed exactly in two 32-bit halves: < 2^40 each, 32 lanes).
static __device__ __forceinline__ void hist_add(u64* hist, u32 bin, u64 w) {
    const u32 mask = __match_any_sync(0xffffffffu, bin);
    const u32 lo = __reduce_add_sync(mask, (u32)(w & 0xfffffu));
    const u32 hi = __reduce_add_sync(mask, (u32)(w >> 20));
    if (bin < NO_BIN && (threadIdx.x & 31) == (u32)(__ffs(mask) - 1))
        atomicAdd(reinterpret_cast<unsigned long long*>(hist + bin), ((u64)hi << 20) + lo);
}

// One radix level over the keys in [lo_key, ∞) whose bits above `shift + 8` equal `prefix`:
// hist[digit] gets their count (by_mass = false) or their weight (true).
template <typename T>
static __device__ void radix_hist(const T* row, const u32* seen, const SampleArgs& a, float m, u32 lo_key,
                                  u32 prefix, u32 shift, bool by_mass, u64* hist) {
    for (u32 b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    const u32 hi_mask = shift >= 24 ? 0u : ~0u << (shift + 8);
    const u32 end = (a.vocab + blockDim.x - 1) / blockDim.x * blockDim.x;
    for (u32 i = threadIdx.x; i < end; i += blockDim.x) {
        u32 bin = NO_BIN;
        u64 w = 0;
        if (i < a.vocab) {
            const float z = zval(row, seen, i, a);
            const u32 key = order_key(z);
            if (key >= lo_key && (key & hi_mask) == prefix) {
                bin = (key >> shift) & 255u;
                w = by_mass ? weight(__fsub_rn(z, m)) : 1;
            }
        }
        hist_add(hist, bin, w);
    }
    __syncthreads();
}

template <typename T>
static __device__ void sample_body(const T* __restrict__ logits, u32* __restrict__ seen_all,
                                   const u32* __restrict__ counter, u32* __restrict__ out, SampleArgs a) {
    __shared__ u64 hist[256];
    __shared__ u64 sh[32];
    __shared__ float sv[32];
    __shared__ u32 si[32];
    __shared__ u32 s_key;
    __shared__ u64 s_above;
    const u32 r = blockIdx.x, words = (a.vocab + 31) / 32;
    const T* row = logits + (u64)r * a.vocab;
    u32* seen = seen_all + (u64)r * words;

    // 1. Bad values and the first maximum of z.
    bool bad = false;
    float best = -INFINITY;
    u32 bi = 0xffffffffu;
    for (u32 i = threadIdx.x; i < a.vocab; i += blockDim.x) {
        const float v = ldf(row + i);
        bad |= (v != v) || v == INFINITY;
        const float z = zval(row, seen, i, a);
        if (bi == 0xffffffffu || z > best) best = z, bi = i;
    }
    bad = __syncthreads_or(bad);
    for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(0xffffffffu, best, o);
        const u32 i = __shfl_xor_sync(0xffffffffu, bi, o);
        if (i != 0xffffffffu && (bi == 0xffffffffu || v > best || (v == best && i < bi))) best = v, bi = i;
    }
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) sv[warp] = best, si[warp] = bi;
    __syncthreads();
    best = -INFINITY, bi = 0xffffffffu;
    for (u32 w = 0; w < (blockDim.x >> 5); ++w)
        if (si[w] != 0xffffffffu && (bi == 0xffffffffu || sv[w] > best || (sv[w] == best && si[w] < bi)))
            best = sv[w], bi = si[w];
    if (bad || !isfinite(best)) {
        if (threadIdx.x == 0) out[r] = a.vocab;
        return;
    }
    if (a.temperature == 0.0f) {
        if (threadIdx.x == 0) out[r] = bi, seen[bi >> 5] |= 1u << (bi & 31);
        return;
    }
    const float m = best;

    // 2. Top-k: the k-th largest key, digit by digit from the top.
    u32 vk = 0;
    if (a.top_k > 0 && a.top_k < a.vocab) {
        u32 prefix = 0, need = a.top_k;
        for (int shift = 24; shift >= 0; shift -= 8) {
            radix_hist(row, seen, a, m, 0u, prefix, (u32)shift, false, hist);
            if (threadIdx.x == 0) {
                u64 cum = 0;
                for (int b = 255; b >= 0; --b) {
                    if (cum + hist[b] >= need) {
                        prefix |= (u32)b << shift;
                        need -= (u32)cum;
                        break;
                    }
                    cum += hist[b];
                }
                s_key = prefix, s_above = need;
            }
            __syncthreads();
            prefix = s_key, need = (u32)s_above;
            __syncthreads();
        }
        vk = prefix;
    }

    // 3. Top-p: the smallest key whose survivors' mass above stays below the cut.
    u32 cut_key = vk;
    if (a.top_p < 1.0f) {
        u64 zs = 0;
        for (u32 i = threadIdx.x; i < a.vocab; i += blockDim.x) {
            const float z = zval(row, seen, i, a);
            if (order_key(z) >= vk) zs += weight(__fsub_rn(z, m));
        }
        zs = block_sum_u64(zs, sh);
        u64 cut = __double2ull_rz(__dmul_rn((double)a.top_p, __ull2double_rn(zs)));
        cut = cut < 1 ? 1 : cut;
        u32 prefix = 0;
        u64 above = 0;
        for (int shift = 24; shift >= 0; shift -= 8) {
            radix_hist(row, seen, a, m, vk, prefix, (u32)shift, true, hist);
            if (threadIdx.x == 0) {
                // The lowest non-empty digit whose mass above is below the cut.
                u64 run = above, at = above;
                int cand = -1;
                for (int b = 255; b >= 0 && run < cut; --b) {
                    if (hist[b] == 0) continue;
                    cand = b, at = run;
                    run += hist[b];
                }
                s_key = prefix | ((u32)cand << shift), s_above = at;
            }
            __syncthreads();
            prefix = s_key, above = s_above;
            __syncthreads();
        }
        cut_key = prefix;
    }

    // 4. The draw: contiguous chunks, a block scan of their kept weight, one walk.
    const u32 per = (a.vocab + blockDim.x - 1) / blockDim.x;
    const u32 lo = min(threadIdx.x * per, a.vocab), hi = min(lo + per, a.vocab);
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
    u64 before = 0, total = 0;
    for (u32 w = 0; w < (blockDim.x >> 5); ++w) {
        if (w < warp) before += sh[w];
        total += sh[w];
    }
    const u64 excl = before + incl - mine;
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
}

#define SAMPLE(SUFFIX, T)                                                                           \
    extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)                                   \
        sample_rows_##SUFFIX(const T* logits, u32* seen, const u32* counter, u32* out, u32 vocab,  \
                             u32 top_k, float temperature, float top_p, float penalty, u32 seed_lo, \
                             u32 seed_hi, u32 offset) {                                             \
        const SampleArgs a = {vocab, top_k, temperature, top_p, penalty, seed_lo, seed_hi, offset}; \
        sample_body<T>(logits, seen, counter, out, a);                                              \
    }
SAMPLE(f, float)
SAMPLE(b, bf16)
