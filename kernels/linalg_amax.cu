// The largest magnitude of an f32 array as a bit pattern, and with it whether the array is
// finite, in one pass (crates/gpu-cuda/src/amax.rs; CPU reference: `max_abs_bits_reference`
// there). |x|'s bits (x with the sign bit cleared) order as |x| does for finite and infinite x,
// and every NaN's are above +inf's (0x7f800000): the result is 0x7f800000 when the largest
// magnitude is an infinity, above it when some element is NaN, and |x|max's bits otherwise. A
// maximum is the same in any order, so the result does not depend on the schedule.
//
// Grid-stride float4 loads (the buffer is 16-byte aligned: the pool's allocations are), the
// tail by scalar loads; a warp maximum (redux.sync), a block maximum, one atomicMax a block into
// `out[0]`, which the host zeroes first.
typedef unsigned long long u64;

extern "C" __global__ void __launch_bounds__(256) max_abs_bits_f32(const float* __restrict__ x,
                                                                   u64 n,
                                                                   unsigned* __restrict__ out) {
    __shared__ unsigned part[8];
    const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x, stride = (u64)gridDim.x * blockDim.x;
    const u64 n4 = n / 4;
    unsigned m = 0;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    for (u64 i = tid; i < n4; i += stride) {
        const float4 v = __ldg(x4 + i);
        m = max(m, max(max(__float_as_uint(v.x) & 0x7fffffffu, __float_as_uint(v.y) & 0x7fffffffu),
                       max(__float_as_uint(v.z) & 0x7fffffffu, __float_as_uint(v.w) & 0x7fffffffu)));
    }
    for (u64 i = 4 * n4 + tid; i < n; i += stride) m = max(m, __float_as_uint(__ldg(x + i)) & 0x7fffffffu);
    m = __reduce_max_sync(0xffffffffu, m);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (unsigned w = 1; w < blockDim.x / 32; ++w) m = max(m, part[w]);
        if (m) atomicMax(out, m);
    }
}
