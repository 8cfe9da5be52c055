// Multi-tensor optimiser kernels, f32: one launch covers up to 64 tensors, described by a
// parameter struct passed by value (MultiTensor, 2824 bytes, under the 4 KiB parameter limit).
// Block b works on elements [(b − block_start[i])·MT_CHUNK, +MT_CHUNK) of tensor i, where i is
// the last entry with block_start[i] <= b (binary search over the struct). Tensor bases are
// 256-byte aligned (separate pool blocks) and chunks start at multiples of MT_CHUNK, so the bulk
// of each chunk uses float4 accesses; a tail of fewer than 4 elements is done one by one.
// CPU reference: gpu_core::cpu::optim (f64).
#include "common.cuh"

#include <cstddef>

#define MT_MAX 64
#define MT_THREADS 256
#define MT_CHUNK 4096  // elements per block: 4 float4 per thread

// Must match crates/gpu-cuda/src/nn/optim.rs (offsets checked below).
struct MultiTensor {
    unsigned long long p[MT_MAX], g[MT_MAX], m[MT_MAX], v[MT_MAX];
    unsigned int n[MT_MAX];
    float decay[MT_MAX];  // 1 − lr·wd, per tensor (AdamW only)
    unsigned int block_start[MT_MAX + 1];
    unsigned int count;
};
static_assert(offsetof(MultiTensor, g) == 512 && offsetof(MultiTensor, m) == 1024 &&
                  offsetof(MultiTensor, v) == 1536 && offsetof(MultiTensor, n) == 2048 &&
                  offsetof(MultiTensor, decay) == 2304 && offsetof(MultiTensor, block_start) == 2560 &&
                  offsetof(MultiTensor, count) == 2820 && sizeof(MultiTensor) == 2824,
              "MultiTensor layout changed: update the Rust side");

// The tensor of block b: the last i < count with block_start[i] <= b (MultiTensor and
// MultiTensor6 alike).
template <typename MT>
static __device__ __forceinline__ int mt_tensor(const MT& a, unsigned int b) {
    int lo = 0, hi = (int)a.count - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (a.block_start[mid] <= b) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

static __device__ __forceinline__ double warp_sum_f64(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the block in f64; the result is valid in thread 0. blockDim.x: a multiple of 32.
static __device__ __forceinline__ double block_sum_f64(double v) {
    __shared__ double scratch[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_sum_f64(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : 0.0;
    return warp_sum_f64(v);
}

// partials[part0 + b] = Σ g² over block b's chunk (f32 per thread, f64 across the block).
extern "C" __global__ void __launch_bounds__(MT_THREADS)
    sumsq_f32(const MultiTensor a, double* __restrict__ partials, unsigned int part0) {
    const int ti = mt_tensor(a, blockIdx.x);
    const float* __restrict__ g = reinterpret_cast<const float*>(a.g[ti]);
    const unsigned int base = (blockIdx.x - a.block_start[ti]) * MT_CHUNK;
    const unsigned int cnt = min((unsigned int)MT_CHUNK, a.n[ti] - base), cnt4 = cnt >> 2;
    float s = 0.f;
#pragma unroll 4
    for (unsigned int i = threadIdx.x; i < cnt4; i += MT_THREADS) {
        const float4 x = __ldg(reinterpret_cast<const float4*>(g + base) + i);
        s = fmaf(x.x, x.x, fmaf(x.y, x.y, fmaf(x.z, x.z, fmaf(x.w, x.w, s))));
    }
    for (unsigned int i = (cnt4 << 2) + threadIdx.x; i < cnt; i += MT_THREADS) {
        const float x = g[base + i];
        s = fmaf(x, x, s);
    }
    const double total = block_sum_f64((double)s);
    if (threadIdx.x == 0) partials[part0 + blockIdx.x] = total;
}

// out[0] = sqrt(Σ partials), out[1] = min(1, max_norm / (out[0] + 1e-6)) (NaN kept), in f64.
// One block of MT_THREADS threads.
extern "C" __global__ void __launch_bounds__(MT_THREADS)
    clip_finalize_f32(const double* __restrict__ partials, unsigned int nparts, float max_norm,
                      float* __restrict__ out) {
    double s = 0.0;
    for (unsigned int i = threadIdx.x; i < nparts; i += MT_THREADS) s += partials[i];
    s = block_sum_f64(s);
    if (threadIdx.x == 0) {
        const double norm = sqrt(s);
        double c = (double)max_norm / (norm + 1e-6);
        if (c > 1.0) c = 1.0;
        out[0] = (float)norm;
        out[1] = (float)c;
    }
}

struct AdamW {
    float beta1, beta2, omb1, omb2, eps, step_size, bc2_sqrt, coef, decay;
    __device__ __forceinline__ void operator()(float& p, float g, float& m, float& v) const {
        g *= coef;
        m = beta1 * m + omb1 * g;
        v = beta2 * v + omb2 * g * g;
        p *= decay;
        p -= step_size * (m / (sqrtf(v) / bc2_sqrt + eps));
    }
};

// One AdamW step (torch.optim.AdamW): g = grad·coef (coef = grad_scale[1], or 1 when
// grad_scale is null); m = β1·m + (1−β1)·g; v = β2·v + (1−β2)·g²; p *= decay[i];
// p −= step_size · m / (sqrt(v)/bc2_sqrt + eps), with step_size = lr/(1−β1^step) and
// bc2_sqrt = sqrt(1−β2^step) computed on the host in f64.
// With `schedule` non-null (a step replayed from a CUDA graph, whose kernel arguments are
// frozen), the step's scalars come from the device instead: schedule = [lr, step_size,
// bc2_sqrt], the `step_size` and `bc2_sqrt` arguments are ignored, and a.decay[i] holds the
// weight decay wd[i], turned into 1 − lr·wd[i] here in f64 as the host does (same bits).
extern "C" __global__ void __launch_bounds__(MT_THREADS)
    adamw_f32(const MultiTensor a, const float* __restrict__ grad_scale, float beta1, float beta2,
              float eps, float step_size, float bc2_sqrt, const float* __restrict__ schedule) {
    const int ti = mt_tensor(a, blockIdx.x);
    float* __restrict__ p = reinterpret_cast<float*>(a.p[ti]);
    const float* __restrict__ g = reinterpret_cast<const float*>(a.g[ti]);
    float* __restrict__ m = reinterpret_cast<float*>(a.m[ti]);
    float* __restrict__ v = reinterpret_cast<float*>(a.v[ti]);
    const unsigned int base = (blockIdx.x - a.block_start[ti]) * MT_CHUNK;
    const unsigned int cnt = min((unsigned int)MT_CHUNK, a.n[ti] - base), cnt4 = cnt >> 2;
    float decay = a.decay[ti];
    if (schedule != nullptr) {
        decay = (float)(1.0 - (double)schedule[0] * (double)decay);
        step_size = schedule[1];
        bc2_sqrt = schedule[2];
    }
    const AdamW op{beta1,     beta2,    1.0f - beta1,
                   1.0f - beta2, eps,   step_size,
                   bc2_sqrt,  grad_scale != nullptr ? grad_scale[1] : 1.0f, decay};
    p += base;
    g += base;
    m += base;
    v += base;
#pragma unroll 4
    for (unsigned int i = threadIdx.x; i < cnt4; i += MT_THREADS) {
        float4 pp = reinterpret_cast<const float4*>(p)[i];
        const float4 gg = __ldg(reinterpret_cast<const float4*>(g) + i);
        float4 mm = reinterpret_cast<const float4*>(m)[i];
        float4 vv = reinterpret_cast<const float4*>(v)[i];
        op(pp.x, gg.x, mm.x, vv.x);
        op(pp.y, gg.y, mm.y, vv.y);
        op(pp.z, gg.z, mm.z, vv.z);
        op(pp.w, gg.w, mm.w, vv.w);
        reinterpret_cast<float4*>(p)[i] = pp;
        reinterpret_cast<float4*>(m)[i] = mm;
        reinterpret_cast<float4*>(v)[i] = vv;
    }
    for (unsigned int i = (cnt4 << 2) + threadIdx.x; i < cnt; i += MT_THREADS) {
        float pp = p[i], mm = m[i], vv = v[i];
        op(pp, g[i], mm, vv);
        p[i] = pp;
        m[i] = mm;
        v[i] = vv;
    }
}

// ---- Schedule-Free AdamW, the parameter lerp, Prodigy (CPU references:
// gpu_core::cpu::optim_adaptive, f64) ----

// torch.lerp(a, b, w) in f32: a + w·(b − a) when |w| < 0.5, else b − (b − a)·(1 − w).
static __device__ __forceinline__ float lerp_torch(float a, float b, float w) {
    return fabsf(w) < 0.5f ? a + w * (b - a) : b - (b - a) * (1.0f - w);
}

// One Schedule-Free AdamW step (schedulefree.AdamWScheduleFree): a.p = y (the parameters),
// a.g = grads, a.m = z, a.v = v, a.decay[i] = wd[i]. With g = grad·coef:
// v = β2·v + (1−β2)·g²; u = g/(sqrt(v/bc2) + eps) (+ wd·y when wd ≠ 0);
// y = lerp(y, z, ckp1) + y_lr·u; z −= lr·u. `schedule` non-null (a replayed graph): the step's
// [lr, ckp1, y_lr, bc2] are read from it and the four scalar arguments ignored.
extern "C" __global__ void __launch_bounds__(MT_THREADS)
    sf_adamw_f32(const MultiTensor a, const float* __restrict__ grad_scale, float beta2, float eps,
                 float lr, float ckp1, float y_lr, float bc2, const float* __restrict__ schedule) {
    const int ti = mt_tensor(a, blockIdx.x);
    float* __restrict__ y = reinterpret_cast<float*>(a.p[ti]);
    const float* __restrict__ g = reinterpret_cast<const float*>(a.g[ti]);
    float* __restrict__ z = reinterpret_cast<float*>(a.m[ti]);
    float* __restrict__ v = reinterpret_cast<float*>(a.v[ti]);
    const unsigned int base = (blockIdx.x - a.block_start[ti]) * MT_CHUNK;
    const unsigned int cnt = min((unsigned int)MT_CHUNK, a.n[ti] - base);
    if (schedule != nullptr) {
        lr = schedule[0];
        ckp1 = schedule[1];
        y_lr = schedule[2];
        bc2 = schedule[3];
    }
    const float coef = grad_scale != nullptr ? grad_scale[1] : 1.0f, wd = a.decay[ti];
    const float omb2 = 1.0f - beta2;
    for (unsigned int i = base + threadIdx.x; i < base + cnt; i += MT_THREADS) {
        const float gi = g[i] * coef;
        const float vi = beta2 * v[i] + omb2 * gi * gi;
        float u = gi / (sqrtf(vi / bc2) + eps);
        const float yi = y[i], zi = z[i];
        if (wd != 0.0f) u += wd * yi;
        y[i] = lerp_torch(yi, zi, ckp1) + y_lr * u;
        z[i] = zi - lr * u;
        v[i] = vi;
    }
}

// p = lerp(p, end, w) per element: a.p = the parameters, a.g = the ends.
extern "C" __global__ void __launch_bounds__(MT_THREADS) lerp_f32(const MultiTensor a, float w) {
    const int ti = mt_tensor(a, blockIdx.x);
    float* __restrict__ p = reinterpret_cast<float*>(a.p[ti]);
    const float* __restrict__ e = reinterpret_cast<const float*>(a.g[ti]);
    const unsigned int base = (blockIdx.x - a.block_start[ti]) * MT_CHUNK;
    const unsigned int cnt = min((unsigned int)MT_CHUNK, a.n[ti] - base);
    for (unsigned int i = base + threadIdx.x; i < base + cnt; i += MT_THREADS)
        p[i] = lerp_torch(p[i], e[i], w);
}

#define MT6_MAX 48

// Prodigy's tensors: p, g, p0, s, m, v (must match crates/gpu-cuda/src/nn/optim_adaptive.rs).
struct MultiTensor6 {
    unsigned long long ptr[6][MT6_MAX];
    unsigned int n[MT6_MAX];
    float decay[MT6_MAX];  // weight decay wd[i]
    unsigned int block_start[MT6_MAX + 1];
    unsigned int count;
};
static_assert(offsetof(MultiTensor6, n) == 2304 && offsetof(MultiTensor6, decay) == 2496 &&
                  offsetof(MultiTensor6, block_start) == 2688 &&
                  offsetof(MultiTensor6, count) == 2884 && sizeof(MultiTensor6) == 2888,
              "MultiTensor6 layout changed: update the Rust side");

// Prodigy's hyper-parameters (gpu_core::nn::ProdigyConfig; flags: 1 decouple,
// 2 use_bias_correction, 4 safeguard_warmup). 32 bytes.
struct ProdigyArgs {
    float beta1, beta2, beta3, eps, d0, d_coef, growth_rate;
    unsigned int flags;
};
static_assert(sizeof(ProdigyArgs) == 32, "ProdigyArgs layout changed: update the Rust side");

// Slots of the f64 scalars (gpu_core::nn::ProdigyScalars).
enum { PD_D = 0, PD_DMAX, PD_NUM, PD_K, PD_DHAT, PD_DEN, PD_DLR, PD_APPLY };

// dlr = d·lr·bias_correction, in f64 as the host reference.
static __device__ __forceinline__ double prodigy_dlr(const ProdigyArgs& c, const double* sc, double lr) {
    double bc = 1.0;
    if (c.flags & 2u) {
        const double k1 = sc[PD_K] + 1.0;
        bc = sqrt(1.0 - pow((double)c.beta2, k1)) / (1.0 - pow((double)c.beta1, k1));
    }
    return sc[PD_D] * lr * bc;
}

// The gradient Prodigy uses: grad·coef, plus wd·p when the decay is coupled.
static __device__ __forceinline__ float prodigy_grad(const ProdigyArgs& c, float g, float coef, float wd,
                                                     float p) {
    g *= coef;
    if (!(c.flags & 1u) && wd != 0.0f) g += wd * p;
    return g;
}

// Prodigy pass 1: when lr > 0, m = β1·m + d(1−β1)·g, v = β2·v + d²(1−β2)·g², s = β3·s + c·g
// (c = (d/d0)·dlr, or (d/d0)·d with safeguard_warmup), and per block the f64 sums
// partials[2(part0 + b)] = Σ g·(p0 − p), partials[2(part0 + b) + 1] = Σ |s| (0 when lr <= 0).
// lr: `lr_ptr[0]` when non-null (a replayed graph), else the argument.
extern "C" __global__ void __launch_bounds__(MT_THREADS)
    prodigy_accum_f32(const MultiTensor6 a, const float* __restrict__ grad_scale, const ProdigyArgs c,
                      float lr, const float* __restrict__ lr_ptr, const double* __restrict__ sc,
                      double* __restrict__ partials, unsigned int part0) {
    if (lr_ptr != nullptr) lr = lr_ptr[0];
    double dot = 0.0, den = 0.0;
    if (lr > 0.0f) {
        const int ti = mt_tensor(a, blockIdx.x);
        float* __restrict__ p = reinterpret_cast<float*>(a.ptr[0][ti]);
        const float* __restrict__ g = reinterpret_cast<const float*>(a.ptr[1][ti]);
        const float* __restrict__ p0 = reinterpret_cast<const float*>(a.ptr[2][ti]);
        float* __restrict__ s = reinterpret_cast<float*>(a.ptr[3][ti]);
        float* __restrict__ m = reinterpret_cast<float*>(a.ptr[4][ti]);
        float* __restrict__ v = reinterpret_cast<float*>(a.ptr[5][ti]);
        const unsigned int base = (blockIdx.x - a.block_start[ti]) * MT_CHUNK;
        const unsigned int cnt = min((unsigned int)MT_CHUNK, a.n[ti] - base);
        const double d = sc[PD_D], dlr = prodigy_dlr(c, sc, (double)lr);
        const float s_coef = (float)((d / (double)c.d0) * ((c.flags & 4u) ? d : dlr));
        const float m_coef = (float)(d * (1.0 - (double)c.beta1));
        const float v_coef = (float)(d * d * (1.0 - (double)c.beta2));
        const float coef = grad_scale != nullptr ? grad_scale[1] : 1.0f, wd = a.decay[ti];
        for (unsigned int i = base + threadIdx.x; i < base + cnt; i += MT_THREADS) {
            const float pi = p[i];
            const float gi = prodigy_grad(c, g[i], coef, wd, pi);
            dot += (double)gi * ((double)p0[i] - (double)pi);
            m[i] = c.beta1 * m[i] + m_coef * gi;
            v[i] = c.beta2 * v[i] + v_coef * gi * gi;
            const float si = c.beta3 * s[i] + s_coef * gi;
            s[i] = si;
            den += fabs((double)si);
        }
    }
    dot = block_sum_f64(dot);
    __syncthreads();  // block_sum_f64's scratch is reused
    den = block_sum_f64(den);
    if (threadIdx.x == 0) {
        partials[2 * (part0 + blockIdx.x)] = dot;
        partials[2 * (part0 + blockIdx.x) + 1] = den;
    }
}

// Python's max(a, b) / min(a, b): keep a unless b is greater / smaller (NaN never replaces).
static __device__ __forceinline__ double py_max(double a, double b) { return b > a ? b : a; }
static __device__ __forceinline__ double py_min(double a, double b) { return b < a ? b : a; }

// Prodigy pass 2, one block of MT_THREADS: sums the partials in f64 and updates the scalars
// as prodigyopt's step does (nothing but dlr and apply = 0 when Σ|s| = 0 or lr <= 0).
extern "C" __global__ void __launch_bounds__(MT_THREADS)
    prodigy_finalize(const double* __restrict__ partials, unsigned int nparts, const ProdigyArgs c,
                     float lr, const float* __restrict__ lr_ptr, double* __restrict__ sc) {
    if (lr_ptr != nullptr) lr = lr_ptr[0];
    double dot = 0.0, den = 0.0;
    for (unsigned int i = threadIdx.x; i < nparts; i += MT_THREADS) {
        dot += partials[2 * i];
        den += partials[2 * i + 1];
    }
    dot = block_sum_f64(dot);
    __syncthreads();
    den = block_sum_f64(den);
    if (threadIdx.x != 0) return;
    const double dlr = prodigy_dlr(c, sc, (double)lr), d0 = (double)c.d0, d_old = sc[PD_D];
    sc[PD_DLR] = dlr;
    sc[PD_APPLY] = 0.0;
    if (den == 0.0 || !(lr > 0.0f)) return;
    const double num = sc[PD_NUM] * (double)c.beta3 + (d_old / d0) * dlr * dot;
    const double d_hat = (double)c.d_coef * num / den;
    double d = d_old;
    if (d == d0) d = py_max(d, d_hat);
    const double d_max = py_max(sc[PD_DMAX], d_hat);
    sc[PD_D] = py_min(d_max, d * (double)c.growth_rate);
    sc[PD_DMAX] = d_max;
    sc[PD_NUM] = num;
    sc[PD_DEN] = den;
    sc[PD_DHAT] = d_hat;
    sc[PD_K] += 1.0;
    sc[PD_APPLY] = 1.0;
}

// Prodigy pass 3, when sc[apply] ≠ 0: p −= wd·dlr·p (decoupled), then
// p −= dlr·m/(sqrt(v) + d·eps) (β1 = 0: p −= dlr·d·g/(sqrt(v) + d·eps)) with the new d.
extern "C" __global__ void __launch_bounds__(MT_THREADS)
    prodigy_update_f32(const MultiTensor6 a, const float* __restrict__ grad_scale, const ProdigyArgs c,
                       const double* __restrict__ sc) {
    if (sc[PD_APPLY] == 0.0) return;
    const int ti = mt_tensor(a, blockIdx.x);
    float* __restrict__ p = reinterpret_cast<float*>(a.ptr[0][ti]);
    const float* __restrict__ g = reinterpret_cast<const float*>(a.ptr[1][ti]);
    const float* __restrict__ m = reinterpret_cast<const float*>(a.ptr[4][ti]);
    const float* __restrict__ v = reinterpret_cast<const float*>(a.ptr[5][ti]);
    const unsigned int base = (blockIdx.x - a.block_start[ti]) * MT_CHUNK;
    const unsigned int cnt = min((unsigned int)MT_CHUNK, a.n[ti] - base);
    const double d = sc[PD_D], dlr = sc[PD_DLR];
    const float coef = grad_scale != nullptr ? grad_scale[1] : 1.0f, wd = a.decay[ti];
    const float d_eps = (float)(d * (double)c.eps), neg_dlr = (float)(-dlr);
    const float neg_dlr_d = (float)(-dlr * d), decay = (float)(-(double)wd * dlr);
    const bool decoupled = (c.flags & 1u) && wd != 0.0f;
    for (unsigned int i = base + threadIdx.x; i < base + cnt; i += MT_THREADS) {
        float pi = p[i];
        const float gi = prodigy_grad(c, g[i], coef, wd, pi);
        const float denom = sqrtf(v[i]) + d_eps;
        if (decoupled) pi += decay * pi;
        pi += c.beta1 > 0.0f ? neg_dlr * (m[i] / denom) : neg_dlr_d * (gi / denom);
        p[i] = pi;
    }
}
