// Inference over a preallocated key/value cache (gpu_core::nn::decode): rotary positions and
// cache writes from a fused q/k/v projection, attention of new queries against the cache (split
// over the slots, then combined), and the argmax of each row. Buffers are f32 or bf16 (the
// suffix names the storage: _f/_b per argument), computed in f32, rounded once where stored.
// Row positions (`start`, `slot`) are read from the device, so a CUDA graph replays these
// launches step after step. CPU reference: crates/gpu-core/src/cpu/decode.rs (f64 sums).

#include "common.cuh"
#include "nn_elem_io.cuh"

static __device__ __forceinline__ float ldf(const float* p) { return *p; }
static __device__ __forceinline__ float ldf(const bf16* p) { return bf16_bits_to_float(p->bits); }
static __device__ __forceinline__ void stf(float* p, float v) { *p = v; }
static __device__ __forceinline__ void stf(bf16* p, float v) { p->bits = float_to_bf16_bits(v); }

// ---- rope_append --------------------------------------------------------------------------------
// One block per new token (r, i) of b·t and head h of q then of k (grid.y = heads + kvh). The
// token sits at slot s = slot[r] + i, rotary position p = s − start[r] (0 before start). Pairs
// (j < d/2) are rotated by θ = p·inv_freq[j] (an f32 product, as transformers), sincosf (full
// range reduction, no fast math); q goes to q_out [b, t, heads, d], k and v (the k head's block
// copies its v head) to slot s of the caches [b, kvh, cap, d] (skipped when s >= cap: the host
// checks bounds, a graph cannot report them). (One block per token, looping over the heads,
// took 10 us of a Llama-3.2-1B decode step on an H200.)
template <typename TI, typename TQ, typename TC>
static __device__ void rope_append_body(const TI* __restrict__ qkv, const float* __restrict__ inv_freq,
                                        u32 rope, const u32* __restrict__ start,
                                        const u32* __restrict__ slot, TQ* __restrict__ q_out,
                                        TC* __restrict__ kc, TC* __restrict__ vc, u32 t, u32 heads,
                                        u32 kvh, u32 d, u32 cap) {
    const u32 tok = blockIdx.x, h = blockIdx.y, r = tok / t, i = tok % t;
    const u32 s = slot[r] + i, st = start[r];
    const u32 pos = s >= st ? s - st : 0u;
    const u32 half = d >> 1, cols = (heads + 2 * kvh) * d;
    const TI* row = qkv + (u64)tok * cols;
    const bool keep = s < cap;
    if (h >= heads && !keep) return;
    for (u32 j = threadIdx.x; j < half; j += blockDim.x) {
        float sn = 0.0f, cs = 1.0f;
        if (rope) sincosf((float)pos * inv_freq[j], &sn, &cs);
        const float x0 = ldf(row + h * d + j), x1 = ldf(row + h * d + j + half);
        const float a = x0 * cs - x1 * sn, c = x1 * cs + x0 * sn;
        if (h < heads) {
            TQ* o = q_out + ((u64)tok * heads + h) * d;
            stf(o + j, a);
            stf(o + j + half, c);
        } else {
            TC* o = kc + (((u64)r * kvh + (h - heads)) * cap + s) * d;
            stf(o + j, a);
            stf(o + j + half, c);
        }
    }
    if (h < heads) return;
    const u32 g = h - heads;
    for (u32 e = threadIdx.x; e < d; e += blockDim.x)
        stf(vc + (((u64)r * kvh + g) * cap + s) * d + e, ldf(row + (heads + kvh + g) * d + e));
}

#define ROPE_APPEND(NAME, TI, TQ, TC)                                                              \
    extern "C" __global__ void NAME(const TI* qkv, const float* inv_freq, u32 rope,               \
                                    const u32* start, const u32* slot, TQ* q_out, TC* kc, TC* vc, \
                                    u32 t, u32 heads, u32 kvh, u32 d, u32 cap) {                  \
        rope_append_body<TI, TQ, TC>(qkv, inv_freq, rope, start, slot, q_out, kc, vc, t, heads,  \
                                     kvh, d, cap);                                                \
    }
ROPE_APPEND(rope_append_fff, float, float, float)
ROPE_APPEND(rope_append_ffb, float, float, bf16)
ROPE_APPEND(rope_append_fbf, float, bf16, float)
ROPE_APPEND(rope_append_fbb, float, bf16, bf16)
ROPE_APPEND(rope_append_bff, bf16, float, float)
ROPE_APPEND(rope_append_bfb, bf16, float, bf16)
ROPE_APPEND(rope_append_bbf, bf16, bf16, float)
ROPE_APPEND(rope_append_bbb, bf16, bf16, bf16)

// ---- cache attention ----------------------------------------------------------------------------
// Pass 1, one block of ATT_THREADS per (query head row, chunk of CHUNK slots): row = (r·t + i)·heads
// + h in grid.x, the chunk in grid.y. The query at slot s attends to slots [lo, s] ∩ chunk, lo =
// start[r], or max(start[r], s + 1 − window) under a sliding window (window > 0; chunks wholly
// before lo exit at once, writing the empty partial):
// scores scale·(q·k) (a warp per slot, lanes over d), m = their max, w = exp(score − m), and the
// chunk's partial (m, l = Σ w, acc = Σ w·v) goes to the workspace; an empty chunk writes m = −inf,
// l = 0, acc = 0. Pass 2, one block per row: M = max m, out = Σ acc·e^{m−M} / Σ l·e^{m−M} (0
// when every chunk is empty).
#define CHUNK 256
#define ATT_THREADS 128

// The first slot the query at slot s sees (window 0: no sliding window).
static __device__ __forceinline__ u32 first_visible(u32 st, u32 s, u32 window) {
    return window != 0 && s + 1 > window ? max(st, s + 1 - window) : st;
}

template <typename TQ, typename TC>
static __device__ void attn_chunk_body(const TQ* __restrict__ q, const TC* __restrict__ kc,
                                       const TC* __restrict__ vc, const u32* __restrict__ start,
                                       const u32* __restrict__ slot, float* __restrict__ part,
                                       u32 t, u32 heads, u32 kvh, u32 d, u32 cap, float scale,
                                       u32 window) {
    __shared__ float qs[256];
    __shared__ float w[CHUNK];
    __shared__ float acc[ATT_THREADS];
    __shared__ float scratch[32];
    const u32 row = blockIdx.x, chunk = blockIdx.y, nchunks = gridDim.y;
    const u32 h = row % heads, tok = row / heads, r = tok / t, i = tok % t;
    const u32 s = slot[r] + i;
    const u32 lo = max(first_visible(start[r], s, window), chunk * CHUNK);
    const u32 hi = min(min(s + 1, cap), (chunk + 1) * CHUNK);
    // Partial layout: per (row, chunk), [m, l, acc_0 .. acc_{d-1}].
    float* out = part + ((u64)row * nchunks + chunk) * (d + 2);
    if (lo >= hi) {
        for (u32 e = threadIdx.x; e < d + 2; e += blockDim.x) out[e] = e == 0 ? -INFINITY : 0.0f;
        return;
    }
    for (u32 e = threadIdx.x; e < d; e += blockDim.x) qs[e] = ldf(q + (u64)row * d + e);
    __syncthreads();
    const u64 base = ((u64)r * kvh + h / (heads / kvh)) * cap;
    const TC* kb = kc + base * d;
    const TC* vb = vc + base * d;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const u32 n = hi - lo;
    for (u32 j = warp; j < n; j += nw) {
        const TC* k = kb + (u64)(lo + j) * d;
        float a = 0.0f;
        for (u32 e = lane; e < d; e += 32) a = fmaf(qs[e], ldf(k + e), a);
        a = warp_sum(a);
        if (lane == 0) w[j] = a * scale;
    }
    __syncthreads();
    float m = -INFINITY;
    for (u32 j = threadIdx.x; j < n; j += blockDim.x) m = nan_max(m, w[j]);
    m = block_max(m, scratch);
    float l = 0.0f;
    for (u32 j = threadIdx.x; j < n; j += blockDim.x) {
        const float x = expf(w[j] - m);
        w[j] = x;
        l += x;
    }
    l = block_sum(l, scratch);  // its barriers also publish w
    // P·V: with d <= blockDim, `groups` groups of d threads each take every groups-th slot (one
    // dimension per thread) and their sums are added in group order; wider heads loop over d.
    if (d <= blockDim.x) {
        const u32 groups = blockDim.x / d, g = threadIdx.x / d, e = threadIdx.x % d;
        float a = 0.0f;
        if (g < groups) {
#pragma unroll 4
            for (u32 j = g; j < n; j += groups) a = fmaf(w[j], ldf(vb + (u64)(lo + j) * d + e), a);
        }
        if (groups == 1) {
            if (threadIdx.x < d) out[2 + e] = a;
        } else {
            if (g < groups) acc[threadIdx.x] = a;
            __syncthreads();
            if (threadIdx.x < d) {
                float sum = 0.0f;
                for (u32 k = 0; k < groups; ++k) sum += acc[k * d + threadIdx.x];
                out[2 + threadIdx.x] = sum;
            }
        }
    } else {
        for (u32 e = threadIdx.x; e < d; e += blockDim.x) {
            float a = 0.0f;
#pragma unroll 4
            for (u32 j = 0; j < n; ++j) a = fmaf(w[j], ldf(vb + (u64)(lo + j) * d + e), a);
            out[2 + e] = a;
        }
    }
    if (threadIdx.x == 0) out[0] = m, out[1] = l;
}

template <typename TO>
static __device__ void attn_combine_body(const float* __restrict__ part, TO* __restrict__ o,
                                         u32 d, u32 nchunks) {
    const u32 row = blockIdx.x;
    const float* p = part + (u64)row * nchunks * (d + 2);
    float m = -INFINITY;
    for (u32 c = 0; c < nchunks; ++c) m = nan_max(m, p[c * (d + 2)]);
    float l = 0.0f;
    if (m != -INFINITY)
        for (u32 c = 0; c < nchunks; ++c) l += p[c * (d + 2) + 1] * expf(p[c * (d + 2)] - m);
    for (u32 e = threadIdx.x; e < d; e += blockDim.x) {
        float a = 0.0f;
        // l == 0: no visible slot (zeros); a NaN l (a NaN score or value) stays NaN.
        if (l != 0.0f) {
            for (u32 c = 0; c < nchunks; ++c) {
                const float mc = p[c * (d + 2)];
                if (mc != -INFINITY) a += p[c * (d + 2) + 2 + e] * expf(mc - m);
            }
            a /= l;
        }
        stf(o + (u64)row * d + e, a);
    }
}

// An attention entry point (the chunk and group forms share the signature): BODY<TQ, TC> with
// THREADS as the launch bound.
#define ATTN_ENTRY(NAME, THREADS, BODY, TQ, TC)                                                    \
    extern "C" __global__ void __launch_bounds__(THREADS)                                         \
        NAME(const TQ* q, const TC* kc, const TC* vc, const u32* start, const u32* slot,          \
             float* part, u32 t, u32 heads, u32 kvh, u32 d, u32 cap, float scale, u32 window) {   \
        BODY<TQ, TC>(q, kc, vc, start, slot, part, t, heads, kvh, d, cap, scale, window);        \
    }
#define ATTN_CHUNK(NAME, TQ, TC) ATTN_ENTRY(NAME, ATT_THREADS, attn_chunk_body, TQ, TC)
ATTN_CHUNK(cache_attn_chunk_ff, float, float)
ATTN_CHUNK(cache_attn_chunk_fb, float, bf16)
ATTN_CHUNK(cache_attn_chunk_bf, bf16, float)
ATTN_CHUNK(cache_attn_chunk_bb, bf16, bf16)

extern "C" __global__ void cache_attn_combine_f(const float* part, float* o, u32 d, u32 nchunks) {
    attn_combine_body<float>(part, o, d, nchunks);
}
extern "C" __global__ void cache_attn_combine_b(const float* part, bf16* o, u32 d, u32 nchunks) {
    attn_combine_body<bf16>(part, o, d, nchunks);
}

// ---- cache attention, grouped (head width a multiple of 8) --------------------------------------
// Pass 1 for d % 8 == 0: one block of G_THREADS per (token, key/value head, chunk of G_CHUNK
// slots, group of at most G_MAX query heads sharing that key/value head), so each key and value
// row is read once for the whole group, 8 elements (16 or 32 bytes) per load:
// - scores: thread t takes slot t % G_CHUNK for the heads g ≡ t / G_CHUNK (mod 2), q from
//   shared memory;
// - softmax of each head's chunk (a warp per head): m, w = exp(s − m), l = Σ w;
// - P·V: thread t takes 8 dimensions (t % (d/8)) over every KG-th slot (KG = G_THREADS/(d/8)
//   slot groups), then the slot groups' sums are added in shared memory, one head at a time.
// It writes the same partials (m, l, acc per query-head row and chunk) as attn_chunk_body, for
// cache_attn_combine_*. Chunks are G_CHUNK slots here; grid.y counts them.
#define G_CHUNK 64
#define G_THREADS 128
#define G_MAX 8

static __device__ __forceinline__ void load8(const float* p, float* f) {
    const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}
static __device__ __forceinline__ void load8(const bf16* p, float* f) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

template <typename TQ, typename TC>
static __device__ void attn_group_body(const TQ* __restrict__ q, const TC* __restrict__ kc,
                                       const TC* __restrict__ vc, const u32* __restrict__ start,
                                       const u32* __restrict__ slot, float* __restrict__ part,
                                       u32 t, u32 heads, u32 kvh, u32 d, u32 cap, float scale,
                                       u32 window) {
    __shared__ float qs[G_MAX * 256];
    __shared__ float p[G_MAX][G_CHUNK];
    __shared__ float red[G_THREADS * 8];
    __shared__ float ml[G_MAX][2];
    const u32 tok = blockIdx.x / kvh, kv = blockIdx.x % kvh;
    const u32 chunk = blockIdx.y, nchunks = gridDim.y;
    const u32 group = heads / kvh, g0 = blockIdx.z * G_MAX;
    const u32 G = min(group - g0, (u32)G_MAX);
    const u32 r = tok / t, i = tok % t;
    const u32 s = slot[r] + i;
    const u32 lo = max(first_visible(start[r], s, window), chunk * G_CHUNK);
    const u32 hi = min(min(s + 1, cap), (chunk + 1) * G_CHUNK);
    const u32 h0 = kv * group + g0;  // first query head of this block
    const u32 tid = threadIdx.x;
    if (lo >= hi) {
        for (u32 g = 0; g < G; ++g) {
            float* out = part + ((u64)(tok * heads + h0 + g) * nchunks + chunk) * (d + 2);
            for (u32 e = tid; e < d + 2; e += blockDim.x) out[e] = e == 0 ? -INFINITY : 0.0f;
        }
        return;
    }
    const u32 n = hi - lo;
    for (u32 x = tid; x < G * d; x += blockDim.x)
        qs[x] = ldf(q + ((u64)tok * heads + h0) * d + x);
    __syncthreads();
    const u64 base = ((u64)r * kvh + kv) * cap;
    const TC* kb = kc + (base + lo) * d;
    const TC* vb = vc + (base + lo) * d;
    // Scores.
    {
        const u32 j = tid % G_CHUNK, half = tid / G_CHUNK;
        float acc[G_MAX / 2];
#pragma unroll
        for (int a = 0; a < G_MAX / 2; ++a) acc[a] = 0.0f;
        if (j < n) {
            for (u32 c = 0; c < d; c += 8) {
                float kf[8];
                load8(kb + (u64)j * d + c, kf);
#pragma unroll
                for (int a = 0; a < G_MAX / 2; ++a) {
                    const u32 g = half + 2 * a;
                    if (g < G)
#pragma unroll
                        for (int e = 0; e < 8; ++e) acc[a] = fmaf(qs[g * d + c + e], kf[e], acc[a]);
                }
            }
        }
#pragma unroll
        for (int a = 0; a < G_MAX / 2; ++a) {
            const u32 g = half + 2 * a;
            if (g < G) p[g][j] = j < n ? acc[a] * scale : -INFINITY;
        }
    }
    __syncthreads();
    // Softmax per head: warp w takes heads w, w + 4.
    {
        const u32 lane = tid & 31, warp = tid >> 5;
        for (u32 g = warp; g < G; g += G_THREADS / 32) {
            float m = nan_max(p[g][lane], p[g][lane + 32]);
            m = warp_max(m);
            const float a = lane < n ? expf(p[g][lane] - m) : 0.0f;
            const float b = lane + 32 < n ? expf(p[g][lane + 32] - m) : 0.0f;
            p[g][lane] = a;
            p[g][lane + 32] = b;
            const float l = warp_sum(a + b);
            if (lane == 0) ml[g][0] = m, ml[g][1] = l;
        }
    }
    __syncthreads();
    // P·V.
    const u32 dc = d / 8, kg_n = G_THREADS / dc;
    const u32 c = tid % dc, kg = tid / dc;
    float acc[G_MAX][8];
#pragma unroll
    for (int g = 0; g < G_MAX; ++g)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] = 0.0f;
    if (kg < kg_n) {
        for (u32 j = kg; j < n; j += kg_n) {
            float vf[8];
            load8(vb + (u64)j * d + c * 8, vf);
#pragma unroll
            for (int g = 0; g < G_MAX; ++g)
                if (g < (int)G) {
                    const float w = p[g][j];
#pragma unroll
                    for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(w, vf[e], acc[g][e]);
                }
        }
    }
#pragma unroll
    for (int g = 0; g < G_MAX; ++g) {
        if (g < (int)G) {
            if (kg < kg_n)
#pragma unroll
                for (int e = 0; e < 8; ++e) red[kg * d + c * 8 + e] = acc[g][e];
            __syncthreads();
            float* out = part + ((u64)(tok * heads + h0 + g) * nchunks + chunk) * (d + 2);
            for (u32 e = tid; e < d; e += blockDim.x) {
                float sum = 0.0f;
                for (u32 k = 0; k < kg_n; ++k) sum += red[k * d + e];
                out[2 + e] = sum;
            }
            if (tid == 0) out[0] = ml[g][0], out[1] = ml[g][1];
            __syncthreads();
        }
    }
}

#define ATTN_GROUP(NAME, TQ, TC) ATTN_ENTRY(NAME, G_THREADS, attn_group_body, TQ, TC)
ATTN_GROUP(cache_attn_group_ff, float, float)
ATTN_GROUP(cache_attn_group_fb, float, bf16)
ATTN_GROUP(cache_attn_group_bf, bf16, float)
ATTN_GROUP(cache_attn_group_bb, bf16, bf16)

// ---- argmax -------------------------------------------------------------------------------------
// One block of 1024 threads per row. A candidate (v, i) beats (w, j) when v is NaN and w is not,
// or both are numbers and v > w, or they tie (both NaN, or equal) and i < j: the first index of
// the largest element, NaN largest (torch.argmax).
static __device__ __forceinline__ bool beats(float v, u32 i, float w, u32 j) {
    const bool vn = v != v, wn = w != w;
    if (vn != wn) return vn;
    if (!vn && v != w) return v > w;
    return i < j;
}

template <typename T>
static __device__ void argmax_body(const T* __restrict__ x, u32* __restrict__ out, u32 cols) {
    __shared__ float sv[32];
    __shared__ u32 si[32];
    const T* row = x + (u64)blockIdx.x * cols;
    float best = -INFINITY;
    u32 bi = 0xffffffffu;
    for (u32 c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = ldf(row + c);
        if (bi == 0xffffffffu || beats(v, c, best, bi)) best = v, bi = c;
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(0xffffffffu, best, o);
        const u32 i = __shfl_xor_sync(0xffffffffu, bi, o);
        if (i != 0xffffffffu && (bi == 0xffffffffu || beats(v, i, best, bi))) best = v, bi = i;
    }
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) sv[warp] = best, si[warp] = bi;
    __syncthreads();
    if (warp == 0) {
        const u32 nw = blockDim.x >> 5;
        best = lane < nw ? sv[lane] : -INFINITY;
        bi = lane < nw ? si[lane] : 0xffffffffu;
        for (int o = 16; o > 0; o >>= 1) {
            const float v = __shfl_xor_sync(0xffffffffu, best, o);
            const u32 i = __shfl_xor_sync(0xffffffffu, bi, o);
            if (i != 0xffffffffu && (bi == 0xffffffffu || beats(v, i, best, bi))) best = v, bi = i;
        }
        if (lane == 0) out[blockIdx.x] = bi;
    }
}

extern "C" __global__ void __launch_bounds__(1024) argmax_rows_f(const float* x, u32* out, u32 cols) {
    argmax_body<float>(x, out, cols);
}
extern "C" __global__ void __launch_bounds__(1024) argmax_rows_b(const bf16* x, u32* out, u32 cols) {
    argmax_body<bf16>(x, out, cols);
}

// ---- add_rms_norm -------------------------------------------------------------------------------
// One block per row: sum = x + y (f32; no y: a copy), then normed = sum · rsqrt(mean(sum²) + eps)
// · w, f32 arithmetic (the sum of squares by fmaf, block tree), one rounding at the store.
template <typename TY, typename TO>
static __device__ void add_rms_norm_body(const float* __restrict__ x, const TY* __restrict__ y,
                                         const float* __restrict__ w, float* __restrict__ sum,
                                         TO* __restrict__ normed, u32 cols, float eps) {
    // The first R·blockDim columns stay in registers (independent loads, no read-back: a row of
    // 2048 at 256 threads is 8 a thread); wider rows read their remaining sums back.
    constexpr int R = 8;
    __shared__ float red[32];
    const u64 base = (u64)blockIdx.x * cols;
    float v[R], ss = 0.0f;
#pragma unroll
    for (int q = 0; q < R; ++q) {
        const u32 c = threadIdx.x + q * blockDim.x;
        v[q] = 0.0f;
        if (c < cols) {
            float a = x[base + c];
            if (y != nullptr) a = __fadd_rn(a, ldf(y + base + c));
            v[q] = a;
            sum[base + c] = a;
            ss = fmaf(a, a, ss);
        }
    }
    for (u32 c = threadIdx.x + R * blockDim.x; c < cols; c += blockDim.x) {
        float a = x[base + c];
        if (y != nullptr) a = __fadd_rn(a, ldf(y + base + c));
        sum[base + c] = a;
        ss = fmaf(a, a, ss);
    }
    ss = block_sum(ss, red);
    const float rstd = rsqrtf(ss / (float)cols + eps);
#pragma unroll
    for (int q = 0; q < R; ++q) {
        const u32 c = threadIdx.x + q * blockDim.x;
        if (c < cols) stf(normed + base + c, v[q] * rstd * w[c]);
    }
    // Each thread reads back the sums it wrote.
    for (u32 c = threadIdx.x + R * blockDim.x; c < cols; c += blockDim.x)
        stf(normed + base + c, sum[base + c] * rstd * w[c]);
}

#define ADD_RMS_NORM(SUFFIX, TY, TO)                                                                \
    extern "C" __global__ void __launch_bounds__(256) add_rms_norm_##SUFFIX(                       \
        const float* x, const TY* y, const float* w, float* sum, TO* normed, u32 cols, float eps) { \
        add_rms_norm_body<TY, TO>(x, y, w, sum, normed, cols, eps);                                \
    }
ADD_RMS_NORM(ff, float, float)
ADD_RMS_NORM(fb, float, bf16)
ADD_RMS_NORM(bf, bf16, float)
ADD_RMS_NORM(bb, bf16, bf16)

// ---- swiglu_packed ------------------------------------------------------------------------------
// out[r, j] = silu(gu[r, j]) · gu[r, i + j], grid-stride over rows·i; silu as act_fwd<ACT_SILU>
// (nn_elementwise.cuh): max(g, −FLT_MAX) / (1 + expf(−g)).
template <typename TI, typename TO>
static __device__ void swiglu_packed_body(const TI* __restrict__ gu, TO* __restrict__ out, u32 rows, u32 i) {
    const u64 n = (u64)rows * i;
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (u64)gridDim.x * blockDim.x) {
        const u64 r = e / i, j = e % i;
        const float g = ldf(gu + r * 2 * i + j), u = ldf(gu + r * 2 * i + i + j);
        stf(out + e, fmaxf(g, -3.40282347e38f) / (1.0f + expf(-g)) * u);
    }
}

#define SWIGLU_PACKED(SUFFIX, TI, TO)                                                               \
    extern "C" __global__ void swiglu_packed_##SUFFIX(const TI* gu, TO* out, u32 rows, u32 i) {   \
        swiglu_packed_body<TI, TO>(gu, out, rows, i);                                              \
    }
SWIGLU_PACKED(ff, float, float)
SWIGLU_PACKED(fb, float, bf16)
SWIGLU_PACKED(bf, bf16, float)
SWIGLU_PACKED(bb, bf16, bf16)
