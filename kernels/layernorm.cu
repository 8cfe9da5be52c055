// LayerNorm forward, f32: one block per row, rows of any width, biased variance (PyTorch's).
// Two reductions (mean, then the centred sum of squares, which avoids the cancellation of
// E[x^2] - E[x]^2), then the write; re-reads of a row hit L2.
// CPU reference: gpu_core::cpu::layernorm_row (f64).
#include "common.cuh"

extern "C" __global__ void layernorm_f32(const float* __restrict__ x,
                                         const float* __restrict__ gamma,
                                         const float* __restrict__ beta,
                                         float* __restrict__ y, unsigned int cols, float eps) {
    __shared__ float scratch[32];
    const float* xr = x + (size_t)blockIdx.x * cols;
    float* yr = y + (size_t)blockIdx.x * cols;

    float s = 0.0f;
    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) s += xr[c];
    const float mean = block_sum(s, scratch) / (float)cols;

    float q = 0.0f;
    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float d = xr[c] - mean;
        q += d * d;
    }
    const float rstd = rsqrtf(block_sum(q, scratch) / (float)cols + eps);

    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x)
        yr[c] = (xr[c] - mean) * rstd * gamma[c] + beta[c];
}
