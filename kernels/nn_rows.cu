// Row kernels of gpu_core::nn::RowOps, f32: softmax and log-softmax forward and backward,
// fused cross-entropy, LayerNorm and RMSNorm with saved statistics, and their backward.
// CPU reference: crates/gpu-core/src/cpu/rows.rs (f64).
//
// Row groups. One row is handled by a *group* of threads, threadIdx.x over blockDim.x:
//  - warp mode (the host picks it for cols <= 1024): blockDim = (32, R), a warp per row and R rows
//    per block; reductions are warp shuffles only, and there is no block-wide barrier, so the
//    warps of a block may retire independently;
//  - block mode (wider rows): blockDim = (T, 1), T a multiple of 32 (<= 1024), a block per row;
//    reductions add a pass through shared memory.
// The code is the same for both: `blockDim.x == 32` selects the warp-only reductions.
// Columns go in chunks of V = 4 (16-byte loads and stores) when cols % 4 == 0 (rows then start
// 16-byte aligned; pool buffers are 256-byte aligned), else V = 1. Every thread visits the same
// chunks i = threadIdx.x + j·blockDim.x in every pass over a row, so the shared-memory row cache
// (`cached`: the host gives each group narrays·cols floats of dynamic shared memory when they fit
// in 47 KiB, the static scratch included) is private to the thread that wrote it: no barrier.
// The LayerNorm and RMSNorm forwards hold rows of up to 16 values per thread in registers instead.
#include "common.cuh"

template <int V>
struct Vf {
    float v[V];
};

template <int V>
static __device__ __forceinline__ Vf<V> ld(const float* p, unsigned i) {
    Vf<V> r;
    if constexpr (V == 4) {
        const float4 q = reinterpret_cast<const float4*>(p)[i];
        r.v[0] = q.x, r.v[1] = q.y, r.v[2] = q.z, r.v[3] = q.w;
    } else {
        r.v[0] = p[i];
    }
    return r;
}

template <int V>
static __device__ __forceinline__ void st(float* p, unsigned i, const Vf<V>& r) {
    if constexpr (V == 4)
        reinterpret_cast<float4*>(p)[i] = make_float4(r.v[0], r.v[1], r.v[2], r.v[3]);
    else
        p[i] = r.v[0];
}

static __device__ __forceinline__ float qnan() { return __int_as_float(0x7fc00000); }

// ---- group reductions: every thread of the group gets the result -------------------------------

static __device__ __forceinline__ float2 warp_sum2(float2 v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        v.x += __shfl_xor_sync(0xffffffffu, v.x, o);
        v.y += __shfl_xor_sync(0xffffffffu, v.y, o);
    }
    return v;
}

// Online log-sum-exp state (m, s): running max m and s = Σ exp(x − m). -inf entries add nothing
// (a row of only -inf ends with s = 0, so its log-sum-exp is -inf and outputs are NaN, as on the
// CPU); a NaN entry makes s NaN.
static __device__ __forceinline__ float2 lse_push(float2 a, float v) {
    if (v > a.x) {
        a.y = a.y * expf(a.x - v) + 1.0f;
        a.x = v;
    } else if (v != -INFINITY) {
        a.y += expf(v - a.x);
    }
    return a;
}

// Merges two states; commutative bit for bit, so all lanes of a butterfly agree.
static __device__ __forceinline__ float2 lse_merge(float2 a, float2 b) {
    const float m = fmaxf(a.x, b.x);
    if (m == -INFINITY) return make_float2(m, a.y + b.y);
    return make_float2(m, a.y * expf(a.x - m) + b.y * expf(b.x - m));
}

static __device__ __forceinline__ float2 warp_lse(float2 v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float2 u = make_float2(__shfl_xor_sync(0xffffffffu, v.x, o),
                                     __shfl_xor_sync(0xffffffffu, v.y, o));
        v = lse_merge(v, u);
    }
    return v;
}

// Block step of a group reduction (block mode only): combines the warps' results through `red`.
// The leading barrier keeps `red` from being overwritten while a previous reduction reads it.
template <bool LSE>
static __device__ __forceinline__ float2 block_step(float2 v, float2* red) {
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    const float2 id = LSE ? make_float2(-INFINITY, 0.0f) : make_float2(0.0f, 0.0f);
    v = lane < nw ? red[lane] : id;
    return LSE ? warp_lse(v) : warp_sum2(v);
}

static __device__ __forceinline__ float2 grp_sum2(float2 v, float2* red) {
    v = warp_sum2(v);
    return blockDim.x == 32 ? v : block_step<false>(v, red);
}

static __device__ __forceinline__ float grp_sum(float v, float2* red) {
    return grp_sum2(make_float2(v, 0.0f), red).x;
}

static __device__ __forceinline__ float2 grp_lse(float2 v, float2* red) {
    v = warp_lse(v);
    return blockDim.x == 32 ? v : block_step<true>(v, red);
}

// Row index of this group; rows past the end (warp mode's last block) return early, which is safe
// because warp mode has no block-wide barrier (block mode launches exactly `rows` blocks).
#define ROW_SETUP(NARRAYS)                                                                   \
    extern __shared__ float4 smem4_[];                                                       \
    __shared__ float2 red[32];                                                               \
    const unsigned row = blockIdx.x * blockDim.y + threadIdx.y;                              \
    if (row >= rows) return;                                                                 \
    const size_t off = (size_t)row * cols;                                                   \
    float* cache = reinterpret_cast<float*>(smem4_) + (size_t)threadIdx.y * (NARRAYS) * cols; \
    (void)cache;

#define FOR_CHUNKS(i) for (unsigned i = threadIdx.x; i < cols / V; i += blockDim.x)

// FN<4> (float4 chunks) when cols is a multiple of 4, else FN<1>, with the same arguments.
#define BY_WIDTH(FN, ...)                         \
    do {                                          \
        if ((cols & 3u) == 0) FN<4>(__VA_ARGS__); \
        else FN<1>(__VA_ARGS__);                  \
    } while (0)

// ---- softmax backward: dx = y ∘ (dy − Σ dy∘y) -------------------------------------------------

// The two passes of a backward row (softmax's and log-softmax's): s = Σ_k term(y_k, dy_k, ·)
// over the row (y and dy kept in shared memory when cached), then dx_k = out(y_k, dy_k, s).
template <int V, typename Term, typename Out>
static __device__ __forceinline__ void bwd_row(const float* y, const float* dy, float* dx,
                                               unsigned cols, bool cached, float* cache,
                                               float2* red, Term term, Out out) {
    float* cy = cache;
    float* cd = cache + cols;
    float s = 0.0f;
    FOR_CHUNKS(i) {
        const Vf<V> a = ld<V>(y, i), b = ld<V>(dy, i);
        if (cached) {
            st<V>(cy, i, a);
            st<V>(cd, i, b);
        }
#pragma unroll
        for (int k = 0; k < V; ++k) s = term(a.v[k], b.v[k], s);
    }
    s = grp_sum(s, red);
    const float* sy = cached ? cy : y;
    const float* sd = cached ? cd : dy;
    FOR_CHUNKS(i) {
        const Vf<V> a = ld<V>(sy, i), b = ld<V>(sd, i);
        Vf<V> r;
#pragma unroll
        for (int k = 0; k < V; ++k) r.v[k] = out(a.v[k], b.v[k], s);
        st<V>(dx, i, r);
    }
}

template <int V>
static __device__ __forceinline__ void softmax_bwd_row(const float* y, const float* dy, float* dx,
                                                       unsigned cols, bool cached, float* cache,
                                                       float2* red) {
    // dot = Σ dy∘y; dx = y ∘ (dy − dot).
    bwd_row<V>(
        y, dy, dx, cols, cached, cache, red,
        [](float a, float b, float dot) { return fmaf(a, b, dot); },
        [](float a, float b, float dot) { return a * (b - dot); });
}

extern "C" __global__ void softmax_bwd_f32(const float* __restrict__ y,
                                           const float* __restrict__ dy, float* __restrict__ dx,
                                           unsigned cols, unsigned rows, unsigned cached) {
    ROW_SETUP(2)
    BY_WIDTH(softmax_bwd_row, y + off, dy + off, dx + off, cols, cached, cache, red);
}

// ---- log-softmax forward: out = (x − max) − log Σ exp(x − max) ---------------------------------

template <int V>
static __device__ __forceinline__ void log_softmax_fwd_row(const float* x, float* out,
                                                           unsigned cols, bool cached,
                                                           float* cache, float2* red) {
    float2 a = make_float2(-INFINITY, 0.0f);
    FOR_CHUNKS(i) {
        const Vf<V> v = ld<V>(x, i);
        if (cached) st<V>(cache, i, v);
#pragma unroll
        for (int k = 0; k < V; ++k) a = lse_push(a, v.v[k]);
    }
    a = grp_lse(a, red);
    const float ls = logf(a.y);
    const float* src = cached ? cache : x;
    FOR_CHUNKS(i) {
        Vf<V> v = ld<V>(src, i);
#pragma unroll
        for (int k = 0; k < V; ++k) v.v[k] = (v.v[k] - a.x) - ls;
        st<V>(out, i, v);
    }
}

extern "C" __global__ void log_softmax_fwd_f32(const float* __restrict__ x,
                                               float* __restrict__ out, unsigned cols,
                                               unsigned rows, unsigned cached) {
    ROW_SETUP(1)
    BY_WIDTH(log_softmax_fwd_row, x + off, out + off, cols, cached, cache, red);
}

// ---- softmax forward: out = exp(x − max) / Σ exp(x − max) --------------------------------------

template <int V>
static __device__ __forceinline__ void softmax_fwd_row(const float* x, float* out, unsigned cols,
                                                       bool cached, float* cache, float2* red) {
    // Max first (independent fmaxf, no exp), then Σ exp(x − max), then the output. fmaxf skips
    // NaN, but a NaN entry makes the sum NaN, so the row comes out NaN, as on the CPU.
    float m = -INFINITY;
    FOR_CHUNKS(i) {
        const Vf<V> v = ld<V>(x, i);
        if (cached) st<V>(cache, i, v);
#pragma unroll
        for (int k = 0; k < V; ++k) m = fmaxf(m, v.v[k]);
    }
    m = grp_lse(make_float2(m, 0.0f), red).x;  // the group max (the sums are all 0)
    const float* src = cached ? cache : x;
    float sum = 0.0f;
    FOR_CHUNKS(i) {
        const Vf<V> v = ld<V>(src, i);
#pragma unroll
        for (int k = 0; k < V; ++k) sum += expf(v.v[k] - m);
    }
    // A row of only -inf: exp(-inf − -inf) = NaN everywhere, as on the CPU.
    const float inv = 1.0f / grp_sum(sum, red);
    FOR_CHUNKS(i) {
        Vf<V> v = ld<V>(src, i);
#pragma unroll
        for (int k = 0; k < V; ++k) v.v[k] = expf(v.v[k] - m) * inv;
        st<V>(out, i, v);
    }
}

extern "C" __global__ void softmax_fwd_f32(const float* __restrict__ x, float* __restrict__ out,
                                           unsigned cols, unsigned rows, unsigned cached) {
    ROW_SETUP(1)
    BY_WIDTH(softmax_fwd_row, x + off, out + off, cols, cached, cache, red);
}

// ---- log-softmax backward: dx = dy − exp(y) · Σ dy --------------------------------------------

template <int V>
static __device__ __forceinline__ void log_softmax_bwd_row(const float* y, const float* dy,
                                                           float* dx, unsigned cols, bool cached,
                                                           float* cache, float2* red) {
    // s = Σ dy; dx = dy − exp(y)·s.
    bwd_row<V>(
        y, dy, dx, cols, cached, cache, red, [](float, float b, float s) { return s + b; },
        [](float a, float b, float s) { return fmaf(-expf(a), s, b); });
}

extern "C" __global__ void log_softmax_bwd_f32(const float* __restrict__ y,
                                               const float* __restrict__ dy,
                                               float* __restrict__ dx, unsigned cols,
                                               unsigned rows, unsigned cached) {
    ROW_SETUP(2)
    BY_WIDTH(log_softmax_bwd_row, y + off, dy + off, dx + off, cols, cached, cache, red);
}

// ---- fused cross-entropy ------------------------------------------------------------------------
// loss[r] = logsumexp(logits[r]) − logits[r, t], one streaming pass (online log-sum-exp).
// A target t >= cols has no logit: that row's loss is NaN (the CPU reports an error instead), and
// in the backward that row's dlogits are all NaN, so a bad target cannot pass unnoticed.

template <int V>
static __device__ __forceinline__ float2 lse_row(const float* x, unsigned cols, bool cached,
                                                 float* cache, float2* red) {
    float2 a = make_float2(-INFINITY, 0.0f);
    FOR_CHUNKS(i) {
        const Vf<V> v = ld<V>(x, i);
        if (cached) st<V>(cache, i, v);
#pragma unroll
        for (int k = 0; k < V; ++k) a = lse_push(a, v.v[k]);
    }
    return grp_lse(a, red);
}

extern "C" __global__ void cross_entropy_fwd_f32(const float* __restrict__ logits,
                                                 const unsigned* __restrict__ targets,
                                                 float* __restrict__ loss, unsigned cols,
                                                 unsigned rows) {
    ROW_SETUP(0)
    const float* xr = logits + off;
    const float2 a = (cols & 3u) == 0 ? lse_row<4>(xr, cols, false, cache, red)
                                      : lse_row<1>(xr, cols, false, cache, red);
    if (threadIdx.x == 0) {
        const unsigned t = targets[row];
        loss[row] = t < cols ? (a.x - xr[t]) + logf(a.y) : qnan();
    }
}

template <int V>
static __device__ __forceinline__ void cross_entropy_bwd_row(const float* x, unsigned t, float g,
                                                             float* dl, unsigned cols,
                                                             bool cached, float* cache,
                                                             float2* red) {
    const float2 a = lse_row<V>(x, cols, cached, cache, red);
    const float inv = 1.0f / a.y;
    const float* src = cached ? cache : x;
    const bool bad = t >= cols;  // uniform over the group
    FOR_CHUNKS(i) {
        Vf<V> v = ld<V>(src, i);
#pragma unroll
        for (int k = 0; k < V; ++k) {
            float p = expf(v.v[k] - a.x) * inv;
            if (i * V + k == t) p -= 1.0f;
            v.v[k] = bad ? qnan() : p * g;
        }
        st<V>(dl, i, v);
    }
}

extern "C" __global__ void cross_entropy_bwd_f32(const float* __restrict__ logits,
                                                 const unsigned* __restrict__ targets,
                                                 const float* __restrict__ dloss,
                                                 float* __restrict__ dlogits, unsigned cols,
                                                 unsigned rows, unsigned cached) {
    ROW_SETUP(1)
    const unsigned t = targets[row];
    const float g = dloss[row];
    BY_WIDTH(cross_entropy_bwd_row, logits + off, t, g, dlogits + off, cols, cached, cache, red);
}

// ---- LayerNorm / RMSNorm forward with saved statistics ------------------------------------------
// Scale-safe for every finite f32 input. LayerNorm takes its statistics in f32 where they are
// trustworthy (finite, spread above the rounding level of the mean) and recomputes them in f64
// for the rest of the rows (constant or near-constant rows, sums beyond f32, NaN/inf), where a
// constant row of 1e20 gets mean exactly 1e20 and x − mean exactly 0; RMSNorm's Σx² is f64
// throughout (no overflow). x̂ = (x − mean)·rstd in f32, through xhat below where it can overflow.
// LayerNorm: y = x̂·w + b, mean[r] and rstd[r] = 1/sqrt(var + eps) saved; RMSNorm:
// rstd = 1/sqrt(mean(x²) + eps), y = x·rstd·w. The square root and reciprocal are taken in f64.

// (x − mean)·rstd. x − mean is exact for close values (denormals included) and overflows only
// when x and mean lie near ±FLT_MAX with opposite signs; it is then taken halved (exact scaling).
// The forward passes the f64 mean as mu + lo (lo = the part below f32 precision), so x̂ is as
// accurate as the f64 reference even where |x| ≫ std (x − mu is exact for close values, then lo
// is subtracted); the backward uses the saved f32 mean, as the CPU reference does (lo = 0).
static __device__ __forceinline__ float xhat(float x, float mu, float lo, float rs) {
    const float d = x - mu;
    return fabsf(d) <= 3.40282347e38f ? (d - lo) * rs : (0.5f * x - 0.5f * mu) * (2.0f * rs);
}

static __device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Group sum in f64 (see grp_sum); `red` is reused as 32 doubles.
static __device__ __forceinline__ double grp_sum_d(double v, float2* red) {
    v = warp_sum_d(v);
    if (blockDim.x == 32) return v;
    double* rd = reinterpret_cast<double*>(red);
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) rd[warp] = v;
    __syncthreads();
    return warp_sum_d(lane < nw ? rd[lane] : 0.0);
}

// The rows the f32 statistics cannot be trusted for (see layernorm_fwd_row): both statistics in
// one f64 pass, shifted by K = x[0]: d = x − K, mean = K + Σd/n, var = (Σd² − (Σd)²/n)/n. K is
// one of the row's values, so (K − mean)² <= n·var and the subtraction loses at most a factor n
// (relative error <= ~n·2^-53 in var). A constant row gives d = 0: mean exactly K, var exactly
// 0. Nothing overflows. The mean is kept as hi + lo, so x̂ is as accurate as the f64 reference.
// Not inlined: typical rows never come here, and its f64 registers stay out of the fast path.
template <int V>
static __device__ __noinline__ void layernorm_fwd_row_exact(const float* x, const float* src,
                                                            const float* w, const float* b,
                                                            float* y, float* mean, float* rstd,
                                                            unsigned cols, float eps, float2* red) {
    const double k0 = (double)x[0];
    double s = 0.0, q = 0.0;
    FOR_CHUNKS(i) {
        const Vf<V> v = ld<V>(src, i);
#pragma unroll
        for (int k = 0; k < V; ++k) {
            const double d = (double)v.v[k] - k0;
            s += d;
            q = fma(d, d, q);
        }
    }
    s = grp_sum_d(s, red);
    q = grp_sum_d(q, red);
    const double n = (double)cols;
    const double mud = k0 + s / n;
    const float mu = (float)mud, lo = (float)(mud - (double)mu);
    // Clamp rounding below 0, but keep a NaN (fmax would drop it: a row holding +inf has
    // q = s = inf and an undefined variance, NaN as in the reference).
    const double var = (q - s * (s / n)) / n;
    const float rs = (float)(1.0 / sqrt((var < 0.0 ? 0.0 : var) + (double)eps));
    FOR_CHUNKS(i) {
        Vf<V> v = ld<V>(src, i);
        const Vf<V> g = ld<V>(w, i), c = ld<V>(b, i);
#pragma unroll
        for (int k = 0; k < V; ++k) v.v[k] = fmaf(xhat(v.v[k], mu, lo, rs), g.v[k], c.v[k]);
        st<V>(y, i, v);
    }
    if (threadIdx.x == 0) *mean = mu, *rstd = rs;
}

template <int V>
static __device__ __forceinline__ void layernorm_fwd_row(const float* x, const float* w,
                                                         const float* b, float* y, float* mean,
                                                         float* rstd, unsigned cols, float eps,
                                                         bool cached, float* cache, float2* red) {
    // Fast path, f32: the mean, then the centred Σ(x − mean)², then y. Its error is that of any
    // f32 LayerNorm: relative to (|x| + |mean|)·rstd, the row's conditioning.
    float sf = 0.0f;
    FOR_CHUNKS(i) {
        const Vf<V> v = ld<V>(x, i);
        if (cached) st<V>(cache, i, v);
#pragma unroll
        for (int k = 0; k < V; ++k) sf += v.v[k];
    }
    const float mu = grp_sum(sf, red) / (float)cols;
    const float* src = cached ? cache : x;
    float qf = 0.0f;
    FOR_CHUNKS(i) {
        const Vf<V> v = ld<V>(src, i);
#pragma unroll
        for (int k = 0; k < V; ++k) qf = fmaf(v.v[k] - mu, v.v[k] - mu, qf);
    }
    const float var32 = grp_sum(qf, red) / (float)cols;
    // The f32 statistics are trusted when finite and when the spread is not at the rounding
    // level of the mean (std >= 2^-10·|mean|: a constant row of 1e20 has a rounded mean and a
    // variance made of rounding errors). Otherwise (near-constant rows, sums that overflow f32,
    // NaN or inf inputs) the row goes to the f64 path; the test is uniform over the group, and
    // typical rows never take it.
    if (!(var32 >= mu * mu * 9.5367431640625e-7f && var32 <= 1e37f)) {
        layernorm_fwd_row_exact<V>(x, src, w, b, y, mean, rstd, cols, eps, red);
        return;
    }
    const float rs = 1.0f / sqrtf(var32 + eps);
    // Finite var32 <= 1e37 bounds |x − mean|: the plain difference cannot overflow.
    FOR_CHUNKS(i) {
        Vf<V> v = ld<V>(src, i);
        const Vf<V> g = ld<V>(w, i), c = ld<V>(b, i);
#pragma unroll
        for (int k = 0; k < V; ++k) v.v[k] = fmaf((v.v[k] - mu) * rs, g.v[k], c.v[k]);
        st<V>(y, i, v);
    }
    if (threadIdx.x == 0) *mean = mu, *rstd = rs;
}

// The same forward with the row held in registers (NR 16-byte chunks per thread; taken when
// cols % 4 == 0 and cols <= 4·NR·blockDim.x, which with NR = 4 is every block-mode row up to
// 8192 columns and warp-mode rows up to 512): every load of the row is issued before the first
// reduction, and the row is never staged in shared memory (about 5% faster than the staged
// path at 8192 × 4096). Same arithmetic in the same order as layernorm_fwd_row<4>, so the two
// agree bit for bit.
template <int NR>
static __device__ __forceinline__ void layernorm_fwd_row_reg(const float* x, const float* w,
                                                             const float* b, float* y,
                                                             float* mean, float* rstd,
                                                             unsigned cols, float eps,
                                                             float2* red) {
    const unsigned n4 = cols / 4;
    Vf<4> v[NR];
    float sf = 0.0f;
#pragma unroll
    for (int j = 0; j < NR; ++j) {
        const unsigned i = threadIdx.x + j * blockDim.x;
        if (i < n4) {
            v[j] = ld<4>(x, i);
#pragma unroll
            for (int k = 0; k < 4; ++k) sf += v[j].v[k];
        }
    }
    const float mu = grp_sum(sf, red) / (float)cols;
    float qf = 0.0f;
#pragma unroll
    for (int j = 0; j < NR; ++j) {
        if (threadIdx.x + j * blockDim.x < n4) {
#pragma unroll
            for (int k = 0; k < 4; ++k) qf = fmaf(v[j].v[k] - mu, v[j].v[k] - mu, qf);
        }
    }
    const float var32 = grp_sum(qf, red) / (float)cols;
    // Same trust test as layernorm_fwd_row.
    if (!(var32 >= mu * mu * 9.5367431640625e-7f && var32 <= 1e37f)) {
        layernorm_fwd_row_exact<4>(x, x, w, b, y, mean, rstd, cols, eps, red);
        return;
    }
    const float rs = 1.0f / sqrtf(var32 + eps);
#pragma unroll
    for (int j = 0; j < NR; ++j) {
        const unsigned i = threadIdx.x + j * blockDim.x;
        if (i < n4) {
            const Vf<4> g = ld<4>(w, i), c = ld<4>(b, i);
            Vf<4> r;
#pragma unroll
            for (int k = 0; k < 4; ++k) r.v[k] = fmaf((v[j].v[k] - mu) * rs, g.v[k], c.v[k]);
            st<4>(y, i, r);
        }
    }
    if (threadIdx.x == 0) *mean = mu, *rstd = rs;
}

// Blocks hold at most 512 threads (warp mode: 32 × rows per block; block mode: up to 512). Three
// blocks of 512 per SM allow 40 registers, enough for the register path's 16 row values without
// spilling (at four, 32 registers, it spilled and ran 3% slower than the shared-memory path).
extern "C" __global__ void __launch_bounds__(512, 3) layernorm_fwd_f32(const float* __restrict__ x,
                                             const float* __restrict__ w,
                                             const float* __restrict__ b, float* __restrict__ y,
                                             float* __restrict__ mean, float* __restrict__ rstd,
                                             unsigned cols, unsigned rows, float eps,
                                             unsigned cached) {
    ROW_SETUP(1)
    if ((cols & 3u) == 0 && cols / 4 <= 4 * blockDim.x)
        layernorm_fwd_row_reg<4>(x + off, w, b, y + off, mean + row, rstd + row, cols, eps, red);
    else if ((cols & 3u) == 0)
        layernorm_fwd_row<4>(x + off, w, b, y + off, mean + row, rstd + row, cols, eps, cached,
                             cache, red);
    else
        layernorm_fwd_row<1>(x + off, w, b, y + off, mean + row, rstd + row, cols, eps, cached,
                             cache, red);
}

template <int V>
static __device__ __forceinline__ void rmsnorm_fwd_row(const float* x, const float* w, float* y,
                                                       float* rstd, unsigned cols, float eps,
                                                       bool cached, float* cache, float2* red) {
    double q[V];
#pragma unroll
    for (int k = 0; k < V; ++k) q[k] = 0.0;
    FOR_CHUNKS(i) {
        const Vf<V> v = ld<V>(x, i);
        if (cached) st<V>(cache, i, v);
#pragma unroll
        for (int k = 0; k < V; ++k) q[k] = fma((double)v.v[k], (double)v.v[k], q[k]);
    }
#pragma unroll
    for (int k = 1; k < V; ++k) q[0] += q[k];
    const float rs = (float)(1.0 / sqrt(grp_sum_d(q[0], red) / (double)cols + (double)eps));
    const float* src = cached ? cache : x;
    FOR_CHUNKS(i) {
        Vf<V> v = ld<V>(src, i);
        const Vf<V> g = ld<V>(w, i);
#pragma unroll
        for (int k = 0; k < V; ++k) v.v[k] = v.v[k] * rs * g.v[k];
        st<V>(y, i, v);
    }
    if (threadIdx.x == 0) *rstd = rs;
}

// The same with the row held in registers (as layernorm_fwd_row_reg; same arithmetic in the
// same order as rmsnorm_fwd_row<4>, so the two agree bit for bit).
template <int NR>
static __device__ __forceinline__ void rmsnorm_fwd_row_reg(const float* x, const float* w,
                                                           float* y, float* rstd, unsigned cols,
                                                           float eps, float2* red) {
    const unsigned n4 = cols / 4;
    Vf<4> v[NR];
    double q[4] = {0.0, 0.0, 0.0, 0.0};
#pragma unroll
    for (int j = 0; j < NR; ++j) {
        const unsigned i = threadIdx.x + j * blockDim.x;
        if (i < n4) {
            v[j] = ld<4>(x, i);
#pragma unroll
            for (int k = 0; k < 4; ++k) q[k] = fma((double)v[j].v[k], (double)v[j].v[k], q[k]);
        }
    }
#pragma unroll
    for (int k = 1; k < 4; ++k) q[0] += q[k];
    const float rs = (float)(1.0 / sqrt(grp_sum_d(q[0], red) / (double)cols + (double)eps));
#pragma unroll
    for (int j = 0; j < NR; ++j) {
        const unsigned i = threadIdx.x + j * blockDim.x;
        if (i < n4) {
            const Vf<4> g = ld<4>(w, i);
            Vf<4> r;
#pragma unroll
            for (int k = 0; k < 4; ++k) r.v[k] = v[j].v[k] * rs * g.v[k];
            st<4>(y, i, r);
        }
    }
    if (threadIdx.x == 0) *rstd = rs;
}

// 52 registers (two blocks of 512 per SM): the f64 sums take more than LayerNorm's; at three
// blocks (40 registers) it ran 1.5% slower. Both about 5% faster than the staged path.
extern "C" __global__ void __launch_bounds__(512, 2) rmsnorm_fwd_f32(const float* __restrict__ x,
                                           const float* __restrict__ w, float* __restrict__ y,
                                           float* __restrict__ rstd, unsigned cols,
                                           unsigned rows, float eps, unsigned cached) {
    ROW_SETUP(1)
    if ((cols & 3u) == 0 && cols / 4 <= 4 * blockDim.x)
        rmsnorm_fwd_row_reg<4>(x + off, w, y + off, rstd + row, cols, eps, red);
    else if ((cols & 3u) == 0)
        rmsnorm_fwd_row<4>(x + off, w, y + off, rstd + row, cols, eps, cached, cache, red);
    else
        rmsnorm_fwd_row<1>(x + off, w, y + off, rstd + row, cols, eps, cached, cache, red);
}

// ---- LayerNorm / RMSNorm backward ---------------------------------------------------------------
// Persistent groups: group g = blockIdx.x·R + threadIdx.y of G = gridDim.x·R handles rows g, g+G,
// ... and writes dx. dw (and db) are sums over rows, computed without atomics in two stages:
// each group accumulates its rows' dy·x̂ (and dy) for its own columns, in row order, either in its
// slice of shared memory (`cached`, then the R slices of a block are added in order of
// threadIdx.y) or, in block mode only (R = 1), straight in the block's slice of `partial`.
// `partial` holds gridDim.x slices of `cols` for dw, then gridDim.x for db; norm_colsum_f32
// adds them up in a fixed order. The result is deterministic (for a given grid).
// LayerNorm: x̂ = (x − mean)·rstd (through xhat: no overflow), g = dy·w,
// dx = rstd·(g − mean(g) − x̂·mean(g·x̂)).
// RMSNorm: x̂ = x·rstd, g = dy·w, dx = rstd·(g − x̂·mean(g·x̂)), dw = Σ dy·x̂. Every product is
// of bounded terms (|x̂| <= sqrt(cols)), so rows of any finite scale give finite gradients.

template <int V, int NACC>
static __device__ __forceinline__ void acc_zero(float* acc, unsigned cols) {
    Vf<V> z;
#pragma unroll
    for (int k = 0; k < V; ++k) z.v[k] = 0.0f;
    FOR_CHUNKS(i) {
#pragma unroll
        for (int a = 0; a < NACC; ++a) st<V>(acc + (size_t)a * cols, i, z);
    }
}

// Writes the block's accumulators to its slices of `partial` (cached case).
template <int NACC>
static __device__ __forceinline__ void acc_flush(const float* sm, float* partial, unsigned cols) {
    __syncthreads();  // every group of the block has finished its rows
    const unsigned nt = blockDim.x * blockDim.y;
    for (unsigned c = threadIdx.y * blockDim.x + threadIdx.x; c < cols; c += nt) {
#pragma unroll
        for (int a = 0; a < NACC; ++a) {
            float s = 0.0f;
            for (unsigned j = 0; j < blockDim.y; ++j) s += sm[((size_t)j * NACC + a) * cols + c];
            partial[((size_t)a * gridDim.x + blockIdx.x) * cols + c] = s;
        }
    }
}

template <int V>
static __device__ __forceinline__ void layernorm_bwd_rows(
    const float* x, const float* w, const float* mean, const float* rstd, const float* dy,
    float* dx, float* aw, float* ab, unsigned cols, unsigned rows, float2* red) {
    acc_zero<V, 1>(aw, cols);
    acc_zero<V, 1>(ab, cols);
    const unsigned groups = gridDim.x * blockDim.y;
    for (unsigned r = blockIdx.x * blockDim.y + threadIdx.y; r < rows; r += groups) {
        const float mu = mean[r], rs = rstd[r];
        const float* xr = x + (size_t)r * cols;
        const float* dyr = dy + (size_t)r * cols;
        float2 s = make_float2(0.0f, 0.0f);
        FOR_CHUNKS(i) {
            const Vf<V> xv = ld<V>(xr, i), dv = ld<V>(dyr, i), wv = ld<V>(w, i);
            Vf<V> sw = ld<V>(aw, i), sb = ld<V>(ab, i);
#pragma unroll
            for (int k = 0; k < V; ++k) {
                const float xh = xhat(xv.v[k], mu, 0.0f, rs), g = dv.v[k] * wv.v[k];
                s.x += g;
                s.y = fmaf(g, xh, s.y);
                sw.v[k] = fmaf(dv.v[k], xh, sw.v[k]);
                sb.v[k] += dv.v[k];
            }
            st<V>(aw, i, sw);
            st<V>(ab, i, sb);
        }
        s = grp_sum2(s, red);
        const float m1 = s.x / (float)cols, m2 = s.y / (float)cols;
        float* dxr = dx + (size_t)r * cols;
        FOR_CHUNKS(i) {
            const Vf<V> xv = ld<V>(xr, i), dv = ld<V>(dyr, i), wv = ld<V>(w, i);
            Vf<V> o;
#pragma unroll
            for (int k = 0; k < V; ++k) {
                // g rounded as in the first pass, so that Σ(g − m1) cancels as it should.
                const float xh = xhat(xv.v[k], mu, 0.0f, rs), g = dv.v[k] * wv.v[k];
                o.v[k] = rs * ((g - m1) - xh * m2);
            }
            st<V>(dxr, i, o);
        }
    }
}

extern "C" __global__ void layernorm_bwd_f32(const float* __restrict__ x,
                                             const float* __restrict__ w,
                                             const float* __restrict__ mean,
                                             const float* __restrict__ rstd,
                                             const float* __restrict__ dy, float* __restrict__ dx,
                                             float* __restrict__ partial, unsigned cols,
                                             unsigned rows, unsigned cached) {
    extern __shared__ float4 smem4_[];
    __shared__ float2 red[32];
    float* sm = reinterpret_cast<float*>(smem4_);
    float* aw = cached ? sm + (size_t)threadIdx.y * 2 * cols : partial + (size_t)blockIdx.x * cols;
    float* ab = cached ? aw + cols : partial + (size_t)(gridDim.x + blockIdx.x) * cols;
    BY_WIDTH(layernorm_bwd_rows, x, w, mean, rstd, dy, dx, aw, ab, cols, rows, red);
    if (cached) acc_flush<2>(sm, partial, cols);
}

template <int V>
static __device__ __forceinline__ void rmsnorm_bwd_rows(const float* x, const float* w,
                                                        const float* rstd, const float* dy,
                                                        float* dx, float* aw, unsigned cols,
                                                        unsigned rows, float2* red) {
    acc_zero<V, 1>(aw, cols);
    const unsigned groups = gridDim.x * blockDim.y;
    for (unsigned r = blockIdx.x * blockDim.y + threadIdx.y; r < rows; r += groups) {
        const float rs = rstd[r];
        const float* xr = x + (size_t)r * cols;
        const float* dyr = dy + (size_t)r * cols;
        float s = 0.0f;
        FOR_CHUNKS(i) {
            const Vf<V> xv = ld<V>(xr, i), dv = ld<V>(dyr, i), wv = ld<V>(w, i);
            Vf<V> sw = ld<V>(aw, i);
#pragma unroll
            for (int k = 0; k < V; ++k) {
                const float xh = xv.v[k] * rs;
                s = fmaf(dv.v[k] * wv.v[k], xh, s);
                sw.v[k] = fmaf(dv.v[k], xh, sw.v[k]);
            }
            st<V>(aw, i, sw);
        }
        const float coef = grp_sum(s, red) / (float)cols;
        float* dxr = dx + (size_t)r * cols;
        FOR_CHUNKS(i) {
            const Vf<V> xv = ld<V>(xr, i), dv = ld<V>(dyr, i), wv = ld<V>(w, i);
            Vf<V> o;
#pragma unroll
            for (int k = 0; k < V; ++k)
                o.v[k] = rs * fmaf(-(xv.v[k] * rs), coef, dv.v[k] * wv.v[k]);
            st<V>(dxr, i, o);
        }
    }
}

extern "C" __global__ void rmsnorm_bwd_f32(const float* __restrict__ x,
                                           const float* __restrict__ w,
                                           const float* __restrict__ rstd,
                                           const float* __restrict__ dy, float* __restrict__ dx,
                                           float* __restrict__ partial, unsigned cols,
                                           unsigned rows, unsigned cached) {
    extern __shared__ float4 smem4_[];
    __shared__ float2 red[32];
    float* sm = reinterpret_cast<float*>(smem4_);
    float* aw = cached ? sm + (size_t)threadIdx.y * cols : partial + (size_t)blockIdx.x * cols;
    BY_WIDTH(rmsnorm_bwd_rows, x, w, rstd, dy, dx, aw, cols, rows, red);
    if (cached) acc_flush<1>(sm, partial, cols);
}

// Second stage of the norm backward: out_j[c] = Σ_p partial[(j·nparts + p)·cols + c] for
// j = blockIdx.y (out0, or out1 when gridDim.y == 2). blockDim = (32, 32): thread (tx, ty) adds
// parts ty, ty + 32, ... of column blockIdx.x·32 + tx, then row ty = 0 adds the 32 sums in order.
extern "C" __global__ void norm_colsum_f32(const float* __restrict__ partial,
                                           float* __restrict__ out0, float* __restrict__ out1,
                                           unsigned nparts, unsigned cols) {
    __shared__ float sh[32][33];
    const unsigned c = blockIdx.x * 32 + threadIdx.x;
    const float* p = partial + (size_t)blockIdx.y * nparts * cols;
    float s = 0.0f;
    if (c < cols) {
#pragma unroll 4
        for (unsigned k = threadIdx.y; k < nparts; k += 32) s += p[(size_t)k * cols + c];
    }
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float t = 0.0f;
#pragma unroll
        for (int j = 0; j < 32; ++j) t += sh[j][threadIdx.x];
        (blockIdx.y ? out1 : out0)[c] = t;
    }
}
