// The tensor-core building blocks of the bf16 attention kernels (nn_attention_bf16.cu: training;
// nn_prefill_bf16.cu: the inference prefill over a key/value cache): 64-row tiles of 64 bf16 in
// swizzled shared memory, cp.async loads, ldmatrix fragments, m16n8k16 products, the exact path
// for non-finite operands on a diagonal block, and the stores. The layout and the arithmetic are
// described at the top of nn_attention_bf16.cu.
#pragma once
#include "nn_elem_io.cuh"

#define ATB_LOG2E 1.4426950408889634f
#define ATB_LN2 0.6931471805599453f

static constexpr int TR = 64;               // rows of a tile
static constexpr int NT = 128;              // threads of a block: 4 warps of 16 rows
static constexpr int TILE_BYTES = TR * 128; // 64 rows of 64 bf16

static __device__ __forceinline__ u32 swz(int row, int ch) {
    return (u32)(row * 128 + ((ch ^ (row & 7)) << 4));
}
static __device__ __forceinline__ u32 smem_addr(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}

static __device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}
static __device__ __forceinline__ void cp_async4(u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 4 : 0)
                 : "memory");
}
static __device__ __forceinline__ void cp_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
static __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

static __device__ __forceinline__ void ldsm_x4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
static __device__ __forceinline__ void ldsm_x4_t(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
static __device__ __forceinline__ void sts32(u32 addr, u32 v) {
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
static __device__ __forceinline__ uint4 lds128(u32 addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(addr)
                 : "memory");
    return v;
}

// c += a·b, one m16n8k16 bf16 product with f32 accumulation.
static __device__ __forceinline__ void mma16816(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Rows row0 .. row0+63 of a [t, 64] matrix (rows ld elements apart) into tile s, asynchronously;
// rows at or past t are zero-filled.
static __device__ __forceinline__ void tile_async(u32 s, const bf16* __restrict__ g, int row0, int t,
                                                  int ld) {
#pragma unroll
    for (int it = 0; it < TR * 8 / NT; ++it) {
        const int f = it * NT + threadIdx.x, row = f >> 3, ch = f & 7, grow = row0 + row;
        const bool valid = grow < t;
        cp_async16(s + swz(row, ch), g + (size_t)(valid ? grow : 0) * ld + ch * 8, valid);
    }
}

// A fragments (16 x 64, four k16 steps) of rows row0 .. row0+15 of tile s.
static __device__ __forceinline__ void load_a(u32 (&a)[4][4], u32 s, int row0, int lane) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
        ldsm_x4(a[kk], s + swz(row0 + (lane & 7) + (((lane >> 3) & 1) << 3), kk * 2 + (lane >> 4)));
}

// A negative scale flips the sign of every bf16 of the Q fragments a (exact in bf16, and so in
// every product and sum), so that the scores can be scaled by |scale| alone.
static __device__ __forceinline__ void negate_if(u32 (&a)[4][4], float scale) {
    if (scale < 0.f) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
            for (int i = 0; i < 4; ++i) a[kk][i] ^= 0x80008000u;
    }
}

// acc (16 x 64, n-tiles of 8 columns) += A · Bᵀ, B the 64 rows of tile s (row = output column),
// over the 16-column blocks jlo ..= jhi only (warp-uniform).
static __device__ __forceinline__ void mma_abt(float (&acc)[8][4], const u32 (&a)[4][4], u32 s,
                                               int lane, int jlo, int jhi) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int jp = 0; jp < 4; ++jp) {
            if (jp < jlo || jp > jhi) continue;
            u32 b[4];
            ldsm_x4(b, s + swz(jp * 16 + (lane & 7) + ((lane >> 4) << 3), kk * 2 + ((lane >> 3) & 1)));
            mma16816(acc[2 * jp], a[kk], b[0], b[1]);
            mma16816(acc[2 * jp + 1], a[kk], b[2], b[3]);
        }
}

static __device__ __forceinline__ u32 lds32(u32 addr) {
    u32 v;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
    return v;
}

// The halves (0xffff each) of a bf16x2 word that hold a NaN or an infinity.
static __device__ __forceinline__ u32 nonfinite_halves(u32 x) {
    const u32 e = x & 0x7f807f80u;
    return ((e & 0xffffu) == 0x7f80u ? 0xffffu : 0u) |
           ((e & 0xffff0000u) == 0x7f800000u ? 0xffff0000u : 0u);
}

// The slow part of a diagonal k16 step kk (see mma_ax): acc += A(:, jj)·X(16kk + jj, :) for the
// elements of X that are NaN or ±inf (the tensor-core product took them as 0), over the visible
// pairs only: local key jj <= local row r (LOWER: rows are queries, k is keys) or r <= jj (rows
// are keys, k is queries). Per-element f32 FMAs; every row they reach is non-finite anyway.
template <bool LOWER>
static __device__ __forceinline__ void fix_diag(float (&acc)[8][4], const u32 (&a)[4], u32 s, int kk,
                                                int lane) {
    const int g = lane >> 2, c = lane & 3;
#pragma unroll 1
    for (int jj = 0; jj < 16; ++jj) {
        // A(r, jj) of rows g and g+8: lane 4g + (jj & 7)/2 holds it, in a[0]/a[1] (jj < 8) or
        // a[2]/a[3], the low half for even jj.
        const int src = (lane & ~3) | ((jj >> 1) & 3);
        const u32 w0 = __shfl_sync(0xffffffffu, jj < 8 ? a[0] : a[2], src);
        const u32 w1 = __shfl_sync(0xffffffffu, jj < 8 ? a[1] : a[3], src);
        const float a0 = __uint_as_float((jj & 1) ? (w0 & 0xffff0000u) : (w0 << 16));
        const float a1 = __uint_as_float((jj & 1) ? (w1 & 0xffff0000u) : (w1 << 16));
        const bool v0 = LOWER ? jj <= g : g <= jj, v1 = LOWER ? jj <= g + 8 : g + 8 <= jj;
#pragma unroll
        for (int dt = 0; dt < 8; ++dt) {
            const u32 x = lds32(s + swz(16 * kk + jj, dt) + 4 * c);
            const u32 bad = nonfinite_halves(x);
            if (bad == 0u) continue;
            const float2 xf = bf16x2_to_float2(x);
            if (bad & 0xffffu) {
                if (v0) acc[dt][0] = fmaf(a0, xf.x, acc[dt][0]);
                if (v1) acc[dt][2] = fmaf(a1, xf.x, acc[dt][2]);
            }
            if (bad & 0xffff0000u) {
                if (v0) acc[dt][1] = fmaf(a0, xf.y, acc[dt][1]);
                if (v1) acc[dt][3] = fmaf(a1, xf.y, acc[dt][3]);
            }
        }
    }
}

// acc (16 x 64) += A · X, X the tile s (64 rows = the k dimension, 64 columns), over the k16
// steps klo ..= khi only (warp-uniform).
static __device__ __forceinline__ void mma_ax(float (&acc)[8][4], const u32 (&a)[4][4], u32 s,
                                              int lane, int klo, int khi) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        if (kk < klo || kk > khi) continue;
#pragma unroll
        for (int dp = 0; dp < 4; ++dp) {
            u32 b[4];
            ldsm_x4_t(b, s + swz(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), dp * 2 + (lane >> 4)));
            mma16816(acc[2 * dp], a[kk], b[0], b[1]);
            mma16816(acc[2 * dp + 1], a[kk], b[2], b[3]);
        }
    }
}

// The k16 step kd (warp-uniform) of mma_ax on its own: the diagonal 16 x 16 block, where A has
// masked entries (exact zeros). If the 16 rows of X it reads hold a NaN or an infinity (one warp
// vote), those elements enter the tensor-core product as 0 (finite elements are untouched, so
// every other bit is as in mma_ax) and fix_diag adds them back over the visible pairs alone:
// no 0·inf reaches a masked row. Finite X takes the plain product (the same bits as mma_ax).
// Whether rows 16kd .. 16kd+15 of tile s hold a NaN or an infinity (warp vote; kd warp-uniform).
static __device__ __forceinline__ bool chunk_nonfinite(u32 s, int kd, int lane) {
    u32 any = 0u;
#pragma unroll
    for (int it = 0; it < 4; ++it) {
        const int idx = it * 32 + lane;
        const uint4 x = lds128(s + swz(kd * 16 + (idx >> 3), idx & 7));
        any |= ((x.x & 0x7f807f80u) + 0x00800080u) | ((x.y & 0x7f807f80u) + 0x00800080u) |
               ((x.z & 0x7f807f80u) + 0x00800080u) | ((x.w & 0x7f807f80u) + 0x00800080u);
    }
    return __any_sync(0xffffffffu, (any & 0x80008000u) != 0u);
}

template <bool LOWER>
static __device__ __forceinline__ void mma_diag(float (&acc)[8][4], const u32 (&a)[4][4], u32 s,
                                                int lane, int kd) {
    u32 ad[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
        ad[i] = kd == 0 ? a[0][i] : kd == 1 ? a[1][i] : kd == 2 ? a[2][i] : a[3][i];
    u32 b[4][4], any = 0u;
#pragma unroll
    for (int dp = 0; dp < 4; ++dp) {
        ldsm_x4_t(b[dp], s + swz(kd * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), dp * 2 + (lane >> 4)));
#pragma unroll
        for (int i = 0; i < 4; ++i) any |= (b[dp][i] & 0x7f807f80u) + 0x00800080u;  // bit 15/31: exp all ones
    }
    const bool bad = __any_sync(0xffffffffu, (any & 0x80008000u) != 0u);
    if (bad) {
#pragma unroll
        for (int dp = 0; dp < 4; ++dp)
#pragma unroll
            for (int i = 0; i < 4; ++i) b[dp][i] &= ~nonfinite_halves(b[dp][i]);
    }
#pragma unroll
    for (int dp = 0; dp < 4; ++dp) {
        mma16816(acc[2 * dp], ad, b[dp][0], b[dp][1]);
        mma16816(acc[2 * dp + 1], ad, b[dp][2], b[dp][3]);
    }
    if (bad) fix_diag<LOWER>(acc, ad, s, kd, lane);
}

// An f32 accumulator (16 x 64) rounded to bf16 A fragments (16 x 64 as four k16 steps).
static __device__ __forceinline__ void c_to_a(u32 (&a)[4][4], const float (&x)[8][4]) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        a[kk][0] = float2_to_bf16x2(x[2 * kk][0], x[2 * kk][1]);
        a[kk][1] = float2_to_bf16x2(x[2 * kk][2], x[2 * kk][3]);
        a[kk][2] = float2_to_bf16x2(x[2 * kk + 1][0], x[2 * kk + 1][1]);
        a[kk][3] = float2_to_bf16x2(x[2 * kk + 1][2], x[2 * kk + 1][3]);
    }
}

// Writes this warp's rows r0 .. r0+15 of acc (row g scaled by mul0, row g+8 by mul1), rounded to
// bf16, to global rows grow0 + r (< t) of gp (ld elements apart), staged through the warp's own
// rows of tile s (nobody else reads them) for 16-byte stores.
static __device__ __forceinline__ void store_rows(bf16* __restrict__ gp, const float (&acc)[8][4],
                                                  float mul0, float mul1, u32 s, int r0, int grow0,
                                                  int t, int ld, int lane) {
    const int g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int dt = 0; dt < 8; ++dt) {
        sts32(s + swz(r0 + g, dt) + 4 * c, float2_to_bf16x2(acc[dt][0] * mul0, acc[dt][1] * mul0));
        sts32(s + swz(r0 + g + 8, dt) + 4 * c, float2_to_bf16x2(acc[dt][2] * mul1, acc[dt][3] * mul1));
    }
    __syncwarp();
#pragma unroll
    for (int it = 0; it < 4; ++it) {
        const int idx = it * 32 + lane, row = r0 + (idx >> 3), ch = idx & 7;
        const uint4 val = lds128(s + swz(row, ch));
        if (grow0 + row < t)
            *reinterpret_cast<uint4*>(gp + (size_t)(grow0 + row) * ld + ch * 8) = val;
    }
}

static __device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
static __device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

static __device__ __forceinline__ void zero(float (&x)[8][4]) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) x[j][e] = 0.f;
}

// 2^x on the special-function unit alone (ex2.approx.ftz, ~2 ulp): exp2f is the same instruction
// with a rescale around it for results in the subnormal range; here those come out as 0 (below
// 2^-126 next to the row's largest term, 1).
static __device__ __forceinline__ float ex2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
