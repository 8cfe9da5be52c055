// NN elementwise kernels, f32: broadcasting binary ops, activations forward and backward,
// affine, dropout, normal samples, block copies and permutes. CPU reference:
// gpu_core::cpu::elementwise. The templates live in nn_elementwise.cuh (shared with the bf16
// kernels of nn_bf16.cu); this file instantiates them for float.

#include "nn_elementwise.cuh"

// Binary operations with broadcasting: binary_{same,2d,nd}_{add,sub,mul,div}_f32.
BINARY_KERNELS(add, OpAdd, float, f32)
BINARY_KERNELS(sub, OpSub, float, f32)
BINARY_KERNELS(mul, OpMul, float, f32)
BINARY_KERNELS(div, OpDiv, float, f32)

// Activations: act_{fwd,bwd}_<name>_f32.
#define ACTIVATION_KERNELS_F32(NAME, A) ACTIVATION_KERNELS(NAME, A, float, f32, 1)
FOR_EACH_ACTIVATION(ACTIVATION_KERNELS_F32)

// affine_f32, dropout_f32.
AFFINE_DROPOUT_KERNELS(float, f32)

// Standard normal samples, gpu_core::nn::elementwise::randn_at: Box–Muller on the two halves
// of SplitMix64(seed ^ (i·golden)): u1 = (top 24 bits + 1)/2^24 in (0, 1], u2 = (low 24
// bits)/2^24; out[i] = sqrt(−2·ln u1)·cos(2π·u2) (accurate logf/cospif: a few ulps from the
// CPU's f64 value).
extern "C" __global__ void randn_f32(float* __restrict__ out, u64 n, u64 seed) {
    const u64 stride = grid_threads();
    for (u64 i = global_tid(); i < n; i += stride) {
        const u64 z = splitmix_at(seed, i);
        const float u1 = ((float)(u32)(z >> 40) + 1.0f) * (1.0f / 16777216.0f);
        const float u2 = (float)(u32)(z & 0xFFFFFFull) * (1.0f / 16777216.0f);
        out[i] = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
    }
}

// Block copies and permutes: copy_blocks{,4}_f32, permute{,4}_f32 (4: float4 units) and
// permute_tile_f32.
MOVE_KERNELS(float, float4, float, f32)
