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

// The tensor of block b: the last i < count with block_start[i] <= b.
static __device__ __forceinline__ int mt_tensor(const MultiTensor& a, unsigned int b) {
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
