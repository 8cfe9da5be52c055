// Element storage for the templated NN kernels (nn_elementwise.cuh, nn_reduce.cuh): f32 or bf16
// buffers, always computed in f32. Loads widen to f32 (exact); bf16 stores round once to nearest
// even (NaN stays NaN, ±inf stays ±inf). The 4-wide forms take an index in units of 4 elements:
// a float4 (16 bytes) for f32, a uint2 holding 4 bf16 (8 bytes) for bf16; pool buffers are
// 256-byte aligned.
//
// bf16 is declared here rather than taken from <cuda_bf16.h> (__nv_bfloat16): that header needs
// CCCL's <nv/target>, which the pinned pip toolchain of `cargo xtask build-ptx` does not ship.
// The layout is the same (the bf16 bits in 2 bytes), and the conversions are those that
// __float2bfloat16_rn / __floats2bfloat162_rn / __bfloat162float compile to on sm_80+.
#pragma once

typedef unsigned long long u64;
typedef unsigned int u32;

struct __align__(2) bf16 {
    unsigned short bits;
};

// f32 -> bf16, round to nearest even (cvt.rn.bf16.f32; a NaN gives the canonical NaN).
static __device__ __forceinline__ unsigned short float_to_bf16_bits(float v) {
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(v));
    return r;
}
// Two of them packed, a in the low half (the lower address): cvt.rn.bf16x2.f32 puts its first
// source in the upper half.
static __device__ __forceinline__ u32 float2_to_bf16x2(float a, float b) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
    return r;
}
// bf16 -> f32 is exact: the bits in the upper half of the word.
static __device__ __forceinline__ float bf16_bits_to_float(unsigned short b) {
    return __uint_as_float((u32)b << 16);
}
static __device__ __forceinline__ float2 bf16x2_to_float2(u32 w) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

// Element i of p (i of any integer type, as p[i]).
template <class I>
static __device__ __forceinline__ float load(const float* p, I i) {
    return p[i];
}
template <class I>
static __device__ __forceinline__ float load(const bf16* p, I i) {
    return bf16_bits_to_float(p[i].bits);
}
template <class I>
static __device__ __forceinline__ void store(float* p, I i, float v) {
    p[i] = v;
}
template <class I>
static __device__ __forceinline__ void store(bf16* p, I i, float v) {
    p[i].bits = float_to_bf16_bits(v);
}

static __device__ __forceinline__ float4 load4(const float* p, u64 i) {
    return reinterpret_cast<const float4*>(p)[i];
}
static __device__ __forceinline__ void store4(float* p, u64 i, float4 v) {
    reinterpret_cast<float4*>(p)[i] = v;
}

static __device__ __forceinline__ float4 load4(const bf16* p, u64 i) {
    const uint2 u = reinterpret_cast<const uint2*>(p)[i];
    const float2 lo = bf16x2_to_float2(u.x), hi = bf16x2_to_float2(u.y);
    return make_float4(lo.x, lo.y, hi.x, hi.y);
}
static __device__ __forceinline__ void store4(bf16* p, u64 i, float4 v) {
    reinterpret_cast<uint2*>(p)[i] =
        make_uint2(float2_to_bf16x2(v.x, v.y), float2_to_bf16x2(v.z, v.w));
}

// 16 bytes of elements T: N of them.
template <class T>
struct V16 {
    static constexpr int N = 16 / (int)sizeof(T);
};

static __device__ __forceinline__ void load16(const float* p, u64 i, float (&v)[4]) {
    const float4 a = reinterpret_cast<const float4*>(p)[i];
    v[0] = a.x;
    v[1] = a.y;
    v[2] = a.z;
    v[3] = a.w;
}
static __device__ __forceinline__ void load16(const bf16* p, u64 i, float (&v)[8]) {
    const uint4 u = reinterpret_cast<const uint4*>(p)[i];
    const u32 w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const float2 f = bf16x2_to_float2(w[k]);
        v[2 * k] = f.x;
        v[2 * k + 1] = f.y;
    }
}
static __device__ __forceinline__ void store16(float* p, u64 i, const float (&v)[4]) {
    reinterpret_cast<float4*>(p)[i] = make_float4(v[0], v[1], v[2], v[3]);
}
static __device__ __forceinline__ void store16(bf16* p, u64 i, const float (&v)[8]) {
    reinterpret_cast<uint4*>(p)[i] =
        make_uint4(float2_to_bf16x2(v[0], v[1]), float2_to_bf16x2(v[2], v[3]),
                   float2_to_bf16x2(v[4], v[5]), float2_to_bf16x2(v[6], v[7]));
}
