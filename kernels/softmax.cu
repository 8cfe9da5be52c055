// Row softmax, f32: one block per row, rows of any width.
// Rows that fit in shared memory (`cached`) are read from global memory once, with 16-byte
// loads when cols % 4 == 0; the max, the sum of exp(x - max) and the output are then computed
// from shared memory. Wider rows stream from global memory three times (re-reads hit L2).
// CPU reference: gpu_core::cpu::softmax_row (f64).
#include "common.cuh"

extern "C" __global__ void softmax_f32(const float* __restrict__ x, float* __restrict__ y,
                                       unsigned int cols, unsigned int cached) {
    extern __shared__ float4 buf4[];
    __shared__ float scratch[32];
    float* buf = reinterpret_cast<float*>(buf4);
    const float* xr = x + (size_t)blockIdx.x * cols;
    float* yr = y + (size_t)blockIdx.x * cols;
    const bool vec = (cols & 3u) == 0;
    const unsigned int c4n = cols >> 2;

    float m = -INFINITY;
    if (vec) {
        for (unsigned int c = threadIdx.x; c < c4n; c += blockDim.x) {
            const float4 v = reinterpret_cast<const float4*>(xr)[c];
            if (cached) buf4[c] = v;
            m = fmaxf(m, fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)));
        }
    } else {
        for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) {
            const float v = xr[c];
            if (cached) buf[c] = v;
            m = fmaxf(m, v);
        }
    }
    m = block_max(m, scratch);  // its barriers also publish buf
    const float* src = cached ? buf : xr;

    float s = 0.0f;
    if (vec) {
        for (unsigned int c = threadIdx.x; c < c4n; c += blockDim.x) {
            const float4 v = reinterpret_cast<const float4*>(src)[c];
            s += expf(v.x - m) + expf(v.y - m) + expf(v.z - m) + expf(v.w - m);
        }
    } else {
        for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) s += expf(src[c] - m);
    }
    const float inv = 1.0f / block_sum(s, scratch);

    if (vec) {
        for (unsigned int c = threadIdx.x; c < c4n; c += blockDim.x) {
            const float4 v = reinterpret_cast<const float4*>(src)[c];
            reinterpret_cast<float4*>(yr)[c] = make_float4(
                expf(v.x - m) * inv, expf(v.y - m) * inv, expf(v.z - m) * inv, expf(v.w - m) * inv);
        }
    } else {
        for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = expf(src[c] - m) * inv;
    }
}
