// NN elementwise kernels on bf16 buffers (bf16 mixed precision): dtype casts, broadcasting
// binary ops, activations forward and backward, affine, dropout, and the 2-byte block copies and
// permutes. CPU reference: gpu_core::cpu::elementwise, via f32 math and one rounding: every
// kernel widens its bf16 inputs to f32 (exact), computes exactly as the f32 kernel of
// nn_elementwise.cu (the same templates, nn_elementwise.cuh), and rounds the result once to bf16
// (round to nearest even; NaN stays NaN, ±inf stays ±inf). 4 bf16 move as one 8-byte uint2.
// The exception is GELU: its forward and backward evaluate Φ with a cheaper formula, relative
// error below 2e-6 + 1e-6·x²/2 before the rounding (nn_elementwise.cuh, gelu_fwd_bf16), so its
// results are the reference's or a neighbouring bf16 value (crates/gpu-cuda/tests/nn_gelu_bf16.rs
// checks every bf16 input).

#include "nn_elementwise.cuh"

// Casts: cast_f32_bf16 rounds to nearest even, cast_bf16_f32 widens exactly.
extern "C" __global__ void cast_f32_bf16(const float* __restrict__ x, bf16* __restrict__ out,
                                         u64 n) {
    convert_impl<float, bf16>(x, out, n);
}

extern "C" __global__ void cast_bf16_f32(const bf16* __restrict__ x, float* __restrict__ out,
                                         u64 n) {
    convert_impl<bf16, float>(x, out, n);
}

// Binary operations with broadcasting: binary_{same,2d,nd}_{add,sub,mul,div}_bf16 (binary_2d's
// vector path, for cols % 4 == 0, reads 4 bf16 at a time).
BINARY_KERNELS(add, OpAdd, bf16, bf16)
BINARY_KERNELS(sub, OpSub, bf16, bf16)
BINARY_KERNELS(mul, OpMul, bf16, bf16)
BINARY_KERNELS(div, OpDiv, bf16, bf16)

// Activations: act_{fwd,bwd}_<name>_bf16.
// GELU's backward at 6 blocks of 256 threads a multiprocessor (at most 40 registers, no
// spills): it ran 53.9 µs against 57.8 at its free 52 registers (H200, 8192 × 4096,
// same-process A/B, docs/benchmarks.md), the cap setting the loads in flight. The others keep
// their registers (log's and SiLU's backwards would spill under that cap).
#define ACTIVATION_KERNELS_BF16(NAME, A) \
    ACTIVATION_KERNELS(NAME, A, bf16, bf16, ((A) == ACT_GELU ? 6 : 1))
FOR_EACH_ACTIVATION(ACTIVATION_KERNELS_BF16)

// affine_bf16: out = round(fmaf(mul, x, add)). dropout_bf16: the mask of dropout_f32 (same seed,
// offset and index); kept values round(x·s), s = 1/(1 − p) in f32.
AFFINE_DROPOUT_KERNELS(bf16, bf16)

// Block copies and permutes of any 2-byte element, bit for bit: copy_blocks{,4}_b16,
// permute{,4}_b16 (4: offsets, strides, lengths and dims in units of 4 elements, one uint2) and
// permute_tile_b16 (the tile holds each element in a 4-byte word: one bank per element).
MOVE_KERNELS(unsigned short, uint2, u32, b16)

// permute8_b16: permute_b16 in units of 8 elements (16 bytes, one uint4), for a last axis that
// stays last and is a multiple of 8 long.
extern "C" __global__ void permute8_b16(const uint4* __restrict__ x, uint4* __restrict__ out,
                                        u64 n, u32 rank, u64 d0, u64 d1, u64 d2, u64 d3, u64 d4,
                                        u64 d5, u32 perm) {
    permute_impl<uint4>(x, out, n, rank, d0, d1, d2, d3, d4, d5, perm);
}

// permute8s_b16: the same move walking the input (permute_impl's SCATTER: d* are the output's
// dims and perm the inverse permutation).
extern "C" __global__ void permute8s_b16(const uint4* __restrict__ x, uint4* __restrict__ out,
                                         u64 n, u32 rank, u64 d0, u64 d1, u64 d2, u64 d3, u64 d4,
                                         u64 d5, u32 perm) {
    permute_impl<uint4, true>(x, out, n, rank, d0, d1, d2, d3, d4, d5, perm);
}
