// LayerNorm forward, f32: one block per row, rows of any width, biased variance (PyTorch's).
// Rows that fit in shared memory (`cached`) are read from global memory once, with 16-byte
// loads when cols % 4 == 0. Two reductions: the mean, then the centred sum of squares (which
// avoids the cancellation of E[x^2] - E[x]^2); then the write.
// CPU reference: gpu_core::cpu::layernorm_row (f64).
#include "common.cuh"

extern "C" __global__ void layernorm_f32(const float* __restrict__ x,
                                         const float* __restrict__ gamma,
                                         const float* __restrict__ beta,
                                         float* __restrict__ y, unsigned int cols, float eps,
                                         unsigned int cached) {
    extern __shared__ float4 buf4[];
    __shared__ float scratch[32];
    float* buf = reinterpret_cast<float*>(buf4);
    const float* xr = x + (size_t)blockIdx.x * cols;
    float* yr = y + (size_t)blockIdx.x * cols;
    const bool vec = (cols & 3u) == 0;
    const unsigned int c4n = cols >> 2;

    float s = 0.0f;
    if (vec) {
        for (unsigned int c = threadIdx.x; c < c4n; c += blockDim.x) {
            const float4 v = reinterpret_cast<const float4*>(xr)[c];
            if (cached) buf4[c] = v;
            s += (v.x + v.y) + (v.z + v.w);
        }
    } else {
        for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) {
            const float v = xr[c];
            if (cached) buf[c] = v;
            s += v;
        }
    }
    const float mean = block_sum(s, scratch) / (float)cols;  // its barriers also publish buf
    const float* src = cached ? buf : xr;

    float q = 0.0f;
    if (vec) {
        for (unsigned int c = threadIdx.x; c < c4n; c += blockDim.x) {
            const float4 v = reinterpret_cast<const float4*>(src)[c];
            const float a = v.x - mean, b = v.y - mean, d = v.z - mean, e = v.w - mean;
            q += (a * a + b * b) + (d * d + e * e);
        }
    } else {
        for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) {
            const float d = src[c] - mean;
            q += d * d;
        }
    }
    const float rstd = rsqrtf(block_sum(q, scratch) / (float)cols + eps);

    if (vec) {
        for (unsigned int c = threadIdx.x; c < c4n; c += blockDim.x) {
            const float4 v = reinterpret_cast<const float4*>(src)[c];
            const float4 g = reinterpret_cast<const float4*>(gamma)[c];
            const float4 b = reinterpret_cast<const float4*>(beta)[c];
            reinterpret_cast<float4*>(yr)[c] =
                make_float4((v.x - mean) * rstd * g.x + b.x, (v.y - mean) * rstd * g.y + b.y,
                            (v.z - mean) * rstd * g.z + b.z, (v.w - mean) * rstd * g.w + b.w);
        }
    } else {
        for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x)
            yr[c] = (src[c] - mean) * rstd * gamma[c] + beta[c];
    }
}
