// The counter-based dropout hash shared by the elementwise dropout (nn_elementwise.cuh) and the
// attention-probability dropout (nn_attention.cu, nn_attention_bf16.cu):
// gpu_core::nn::elementwise::dropout_keep, bit for bit. Element i is kept when a 24-bit uniform
// u_i >= t = ⌈p·2^24⌉. u_i's top 8 bits are byte i mod 8 of SplitMix64(seed, i / 8), so one
// hash decides eight elements; its low 16 bits, the top 16 of SplitMix64(seed ^ DROPOUT_LOW_KEY,
// i), are drawn only where that byte ties with t's top byte (one element in 256).
#pragma once
#include "nn_elem_io.cuh"

#define DROPOUT_LOW_KEY 0xD1B54A32D192ED03ull

// SplitMix64 of seed ^ (i·golden): the CPU's gpu_core::nn::elementwise::splitmix.
static __device__ __forceinline__ u64 splitmix_at(u64 seed, u64 i) {
    u64 z = seed ^ (i * 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// The tie of element i: its low 16 bits against t's.
static __device__ __noinline__ bool dropout_low_keep(u64 seed, u64 i, u32 t) {
    return (u32)(splitmix_at(seed ^ DROPOUT_LOW_KEY, i) >> 48) >= (t & 0xFFFFu);
}

// The keep decision of element i alone (one hash).
static __device__ __forceinline__ bool dropout_keep1(u64 seed, u64 i, u32 t) {
    const u32 b = (u32)(splitmix_at(seed, i >> 3) >> (8 * (i & 7))) & 0xFFu, tb = t >> 16;
    return b != tb ? b > tb : dropout_low_keep(seed, i, t);
}

// Attention-probability dropout (gpu_core::nn::attention::AttnDropout): entry (s, i, j) of
// sequences of length t is element (s·t + i)·t + j of the hash's stream (64-bit, wrapping), so
// the mask is a pure function of (seed, s, i, j) whatever the tiling. mul = 1/(1 − p) rounded
// to f32 once, the factor of a kept probability.
struct AttDrop {
    u64 seed;
    u32 thr;
    float mul;
};

// With offset non-null the seed is seed + *offset (wrapping), read on the device: a CUDA
// graph's replays draw new masks from values written before each replay.
static __device__ __forceinline__ AttDrop att_drop(float p, u64 seed, const u64* __restrict__ offset) {
    if (offset != nullptr) seed += *offset;
    return AttDrop{seed, (u32)ceilf(p * 16777216.0f), 1.0f / (1.0f - p)};
}

// The factor of entry (s, i, j): mul where kept, else 0.
static __device__ __forceinline__ float att_drop_factor(const AttDrop& d, u32 s, int i, int j, int t) {
    const u64 e = ((u64)s * (u64)t + (u64)i) * (u64)t + (u64)j;
    return dropout_keep1(d.seed, e, d.thr) ? d.mul : 0.f;
}
