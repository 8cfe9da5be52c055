// Row softmax, f32: one block per row, rows of any width (threads stride over the row).
// Pass 1 reduces the row max, pass 2 the sum of exp(x - max), pass 3 writes; the re-reads
// of a row hit L2. CPU reference: gpu_core::cpu::softmax_row (f64).
#include "common.cuh"

extern "C" __global__ void softmax_f32(const float* __restrict__ x, float* __restrict__ y,
                                       unsigned int cols) {
    __shared__ float scratch[32];
    const float* xr = x + (size_t)blockIdx.x * cols;
    float* yr = y + (size_t)blockIdx.x * cols;

    float m = -INFINITY;
    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
    m = block_max(m, scratch);

    float s = 0.0f;
    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) s += expf(xr[c] - m);
    s = block_sum(s, scratch);

    const float inv = 1.0f / s;
    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = expf(xr[c] - m) * inv;
}
