// The world model's correction W += U·diag(S)·Vᵀ for ranks k <= 64, checked before it is
// written (crates/gpu-cuda/src/lowrank.rs; CPU reference: `lowrank_add_reference` there).
// W is row-major m × n, U m × k, V n × k (row-major), S k.
//
// One 64 × 64 tile of W a block (256 threads, 16 entries a thread: rows ty + 16a, columns
// tx + 16b, so a half-warp's loads and stores of W are contiguous). The block stages its rows
// of U·diag(S) and its rows of V in shared memory (transposed: rank index first) and forms the
// tile's product in registers; nothing of W's size is allocated, one tile at a time lives on
// chip. y = w + Σ_r (u_ir·s_r)·v_jr, the sum over r in order, then w added.
//
// Two launches make a call that leaves no trace when it fails: `write = 0` only checks (flag
// bit 1: an entry of W is NaN or ±inf; bit 2: an entry of the sum is not finite, the f32
// range overflowed or a factor holds NaN/inf), `write = 1` recomputes the same sums and
// stores them, unless the flag is set (read from device memory: the check launch before it
// on the same stream has finished). The host reads the flag once, after both.
#include "common.cuh"

#define LR_T 64
#define LR_K 64

extern "C" __global__ void __launch_bounds__(256) lowrank_add_f32(
    float* __restrict__ w, const float* __restrict__ u, const float* __restrict__ s,
    const float* __restrict__ v, unsigned* __restrict__ flag, unsigned m, unsigned n,
    unsigned k, unsigned write) {
    __shared__ float us[LR_K][LR_T + 1];
    __shared__ float vs[LR_K][LR_T + 1];
    if (write && *(volatile unsigned*)flag != 0) return;
    const unsigned tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const unsigned r0 = blockIdx.y * LR_T, c0 = blockIdx.x * LR_T;
    // Stage U·diag(S) (rows r0..) and V (rows c0..), rank index first; zeros outside.
    for (unsigned e = threadIdx.x; e < LR_T * k; e += blockDim.x) {
        const unsigned i = e / k, r = e - i * k;
        us[r][i] = r0 + i < m ? u[(size_t)(r0 + i) * k + r] * s[r] : 0.0f;
        vs[r][i] = c0 + i < n ? v[(size_t)(c0 + i) * k + r] : 0.0f;
    }
    __syncthreads();
    float acc[4][4] = {};
    for (unsigned r = 0; r < k; ++r) {
        float a[4], b[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            a[q] = us[r][ty + 16 * q];
            b[q] = vs[r][tx + 16 * q];
        }
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
            for (int p = 0; p < 4; ++p) acc[q][p] = fmaf(a[q], b[p], acc[q][p]);
    }
    unsigned bits = 0;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const unsigned i = r0 + ty + 16 * q;
        if (i >= m) continue;
#pragma unroll
        for (int p = 0; p < 4; ++p) {
            const unsigned j = c0 + tx + 16 * p;
            if (j >= n) continue;
            const size_t at = (size_t)i * n + j;
            const float x = w[at], y = x + acc[q][p];
            if (write) {
                w[at] = y;
            } else {
                if (!isfinite(x)) bits |= 1u;
                if (!isfinite(y)) bits |= 2u;
            }
        }
    }
    if (!write) {
        const unsigned any = __syncthreads_or(bits);
        if (any) {
            // Each thread ORs its own bits (a few atomics, only on failure).
            if (bits) atomicOr(flag, bits);
        }
    }
}
