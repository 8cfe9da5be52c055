// Causal scaled-dot-product attention in bf16 on tensor cores (FlashAttention-2 style), head
// dimension d = 64 (checked on the host). The layout and arguments are those of the f32 kernels
// of nn_attention.cu: sequence s = b·heads + h of q, k, v, dq, dk, dv starts at
// (b·t·ld_in + h·d) with rows ld_in elements apart; of out and dout at (b·t·ld_out + h·d), rows
// ld_out apart; lse and delta are f32 [n, t]. Every row base is 16-byte aligned (d = 64, pool
// buffers 256-byte aligned, strides multiples of 64), so rows move as 16-byte chunks.
//
// Arithmetic: bf16 operands, f32 accumulation (mma.sync m16n8k16 bf16), softmax in f32 (base 2).
//   forward   S = q·kᵀ; online softmax in base 2 (each term 2^(S·scale·log2 e − m) as one FFMA
//             and one ex2.approx.ftz: terms below 2^-126 of the row's largest are 0) with
//             running max m and per-thread partial sums l of the unrounded f32 probabilities; P
//             rounded to bf16 for P·V; out = O/l rounded once to bf16; lse = ln Σ exp(scale·q·k)
//             in f32.
//   backward  P = exp(scale·q·k − lse) in f32 (base 2, one FFMA and one ex2.approx.ftz), dP = dout·vᵀ, dS = P∘(dP − delta) in f32 with
//             delta_i = Σ_c dout_ic·out_ic (f32); P and dS rounded to bf16 as the operands of
//             dq = scale·dS·k, dk = scale·dSᵀ·q, dv = Pᵀ·dout, each rounded once at the store.
// Masked entries never influence a result, as in the f32 kernels: in every sequence out_i, lse_i
// and dq_i depend only on positions j <= i (and dq_i on lse_i, delta_i), dk_j and dv_j only on
// k_j, v_j and the q, dout, lse, delta of rows i >= j, and nothing crosses sequences; a NaN or
// ±inf at position p reaches only the rows that legitimately depend on p. Masked scores, probabilities and dS are exact zeros
// (selects, never products), padding rows past t are loaded as zeros (cp.async zero-fill, also
// for lse and delta), and tiles above the diagonal are skipped. The one place a masked zero meets
// a later position's operand is the warp's diagonal 16 x 16 block of the second product (P·V in
// the forward, dS·K for dq, Pᵀ·dO and dSᵀ·Q for dk/dv), where the tensor core would form 0·inf:
// there a warp vote on those 16 operand rows (a NaN/inf test on the bf16 bits: of the shared tile
// before the products in the forward and dk/dv, of the loaded fragments in dq) sends a warp that
// holds any non-finite element to a slow exact path (mma_diag): the non-finite elements enter the
// product as 0 and are added back with per-element FMAs for the visible pairs only (fix_diag).
// Finite inputs take the original products, so their results are bit-identical; rows that do
// not see the non-finite position keep their bits too.
//
// Each key (query) tile step is compiled once for the tiles off the diagonal and once per warp
// for the diagonal tile (fwd_tile, dq_tile, dkdv_tile with a compile-time warp), so that no
// 16-column block test or mask test runs where every entry is visible.
// Tiling: blocks of 128 threads = 4 warps; a block owns a tile of 64 rows (queries in the forward
// and the dq pass, keys in the dk/dv pass) and each warp 16 of them; the other side is walked in
// tiles of 64. Tiles live in shared memory as 64 rows of eight 16-byte chunks, chunk ch of row r at
// r·128 + ((ch ^ (r & 7)) << 4), so ldmatrix of 8 rows at one chunk hits 8 distinct bank groups.
// The next tiles are fetched with cp.async (zero-filled past t) while the current ones are used.
// On the diagonal tile each warp skips the 16-column blocks that are masked for all its rows.
// Kernels (grid n·ceil(t/64) blocks of 128 threads, static shared memory <= 48 KiB):
//   attn_fwd_d64_bf16       heaviest query tiles first
//   attn_bwd_dq_d64_bf16    writes delta (read by the next kernel) and dq
//   attn_bwd_dkdv_d64_bf16  dk and dv; lowest key tiles (most work) first
// No atomics: every output element is written by exactly one thread, deterministically.
// CPU reference: gpu_core::cpu::attention_bf16 (f64, the same rounding points).
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

// One key tile of the forward for a warp's 16 rows: S = Q·Kᵀ, the online softmax update of m, l
// and o, and o += P·V. W = -1: a tile below the diagonal (every key visible); W = 0..3: the
// diagonal tile of warp W, whose rows see its 16-key blocks 0 ..= W (the later ones are skipped,
// the diagonal block masked per element). A compile-time W keeps each case free of branches.
template <int W>
static __device__ __forceinline__ void fwd_tile(float (&o)[8][4], float (&m)[2], float (&l)[2],
                                                const u32 (&qf)[4][4], u32 tk, u32 tv, int lane,
                                                float sl2) {
    constexpr bool diag = W >= 0;
    constexpr int jhi = diag ? W : 3;
    const int g = lane >> 2, c = lane & 3;
    const bool bad = diag && chunk_nonfinite(tv, jhi, lane);

    float s[8][4];
    zero(s);
    mma_abt(s, qf, tk, lane, 0, jhi);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int rl = 16 * jhi + g + 8 * h;
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e)
                mx = fmaxf(mx, diag && 8 * j + 2 * c + e > rl ? -INFINITY : s[j][2 * h + e]);
        // The row's largest scaled score (sl2 >= 0), finite for finite inputs: key 0 is
        // visible to every row in the first tile.
        const float mnew = fmaxf(m[h], quad_max(mx) * sl2);
        const float alpha = ex2_ftz(m[h] - mnew);
        m[h] = mnew;
        float ls = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                // Masked keys get an exact 0 (a select: with scale 0 their scores would
                // otherwise meet 0·inf).
                const float p = diag && 8 * j + 2 * c + e > rl
                                    ? 0.f
                                    : ex2_ftz(fmaf(s[j][2 * h + e], sl2, -mnew));
                ls += p;
                s[j][2 * h + e] = p;
            }
        l[h] = l[h] * alpha + ls;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            o[j][2 * h] *= alpha;
            o[j][2 * h + 1] *= alpha;
        }
    }
    u32 pf[4][4];
    c_to_a(pf, s);
    // Non-finite V on the warp's diagonal block: that k16 step on its own, last, as in the order
    // of mma_ax (the same bits for every row that does not see the non-finite keys).
    if (!bad) {
        mma_ax(o, pf, tv, lane, 0, jhi);
    } else {
        mma_ax(o, pf, tv, lane, 0, jhi - 1);
        mma_diag<true>(o, pf, tv, lane, jhi);
    }
}

// ---------------------------------------------------------------------------------------------
// Forward: one block per (sequence, 64-row query tile); key tiles 0 ..= the diagonal one.
extern "C" __global__ void __launch_bounds__(NT)
    attn_fwd_d64_bf16(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                      bf16* __restrict__ out, float* __restrict__ lse, u32 n, u32 t_, u32 d_, u32 heads,
                      u32 ld_in, u32 ld_out, float scale) {
    __shared__ __align__(128) unsigned char smem[5 * TILE_BYTES];  // Q, K[2], V[2]
    (void)d_;
    const u32 sQ = smem_addr(smem), sK = sQ + TILE_BYTES, sV = sQ + 3 * TILE_BYTES;
    const int t = (int)t_, lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const int nqt = (t + TR - 1) / TR;
    const u32 seq = blockIdx.x % n;
    const int qt = nqt - 1 - (int)(blockIdx.x / n);  // heaviest query tiles first
    const int q0 = qt * TR;
    const size_t base = (size_t)(seq / heads) * t * ld_in + (size_t)(seq % heads) * 64;
    const size_t obase = (size_t)(seq / heads) * t * ld_out + (size_t)(seq % heads) * 64;
    const int li = (int)ld_in;
    // Scores are kept unscaled and scaled by |scale| inside each exponent (one FFMA); a negative
    // scale flips the sign of Q instead (exact in bf16, and so in every product and sum).
    const float sl2 = fabsf(scale) * ATB_LOG2E;

    tile_async(sQ, q + base, q0, t, li);
    tile_async(sK, k + base, 0, t, li);
    tile_async(sV, v + base, 0, t, li);
    cp_commit();

    u32 qf[4][4];
    float o[8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    zero(o);
    for (int kt = 0; kt <= qt; ++kt) {
        const u32 buf = (u32)(kt & 1) * TILE_BYTES;
        if (kt < qt) {
            tile_async(sK + (TILE_BYTES - buf), k + base, (kt + 1) * TR, t, li);
            tile_async(sV + (TILE_BYTES - buf), v + base, (kt + 1) * TR, t, li);
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        if (kt == 0) {
            load_a(qf, sQ, 16 * w, lane);
            if (scale < 0.f) {
#pragma unroll
                for (int kk = 0; kk < 4; ++kk)
#pragma unroll
                    for (int i = 0; i < 4; ++i) qf[kk][i] ^= 0x80008000u;
            }
        }
        const u32 tk = sK + buf, tv = sV + buf;
        if (kt < qt) {
            fwd_tile<-1>(o, m, l, qf, tk, tv, lane, sl2);
        } else {
            switch (w) {  // the diagonal tile, one compiled case a warp
            case 0: fwd_tile<0>(o, m, l, qf, tk, tv, lane, sl2); break;
            case 1: fwd_tile<1>(o, m, l, qf, tk, tv, lane, sl2); break;
            case 2: fwd_tile<2>(o, m, l, qf, tk, tv, lane, sl2); break;
            default: fwd_tile<3>(o, m, l, qf, tk, tv, lane, sl2); break;
            }
        }
        __syncthreads();  // before the buffers are refilled
    }

    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float lt = quad_sum(l[h]);
        inv[h] = 1.0f / lt;
        const int row = q0 + 16 * w + g + 8 * h;
        if (c == 0 && row < t) lse[(size_t)seq * t + row] = (m[h] + log2f(lt)) * ATB_LN2;
    }
    store_rows(out + obase, o, inv[0], inv[1], sQ, 16 * w, q0, t, (int)ld_out, lane);
}

// One key tile of dq for a warp's 16 rows (W as in fwd_tile): P = 2^(S·scale·log2 e − lse·log2 e),
// dS = P∘(dP − delta) (exact zeros where masked or past the sequence's end), acc += dS·K; the
// diagonal k16 step on its own, last, as in the order of mma_ax.
template <int W>
static __device__ __forceinline__ void dq_tile(float (&acc)[8][4], const u32 (&qf)[4][4],
                                               const u32 (&of)[4][4], u32 tk, u32 tv, int lane,
                                               float sl2, const float (&lse2)[2],
                                               const float (&dlt)[2], int rows_left) {
    constexpr bool diag = W >= 0;
    constexpr int jhi = diag ? W : 3;
    const int g = lane >> 2, c = lane & 3;
    float s[8][4], dp[8][4];
    zero(s);
    zero(dp);
    mma_abt(s, qf, tk, lane, 0, jhi);
    mma_abt(dp, of, tv, lane, 0, jhi);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int x = 0; x < 4; ++x) {
            const int h = x >> 1, rw = g + 8 * h, cl = 8 * j + 2 * c + (x & 1);
            const bool vis = (!diag || cl <= 16 * jhi + rw) && rw < rows_left;
            const float p = vis ? ex2_ftz(fmaf(s[j][x], sl2, -lse2[h])) : 0.f;
            s[j][x] = vis ? p * (dp[j][x] - dlt[h]) : 0.f;
        }
    u32 dsf[4][4];
    c_to_a(dsf, s);
    mma_ax(acc, dsf, tk, lane, 0, jhi - (diag ? 1 : 0));
    if (diag) mma_diag<true>(acc, dsf, tk, lane, jhi);
}

// ---------------------------------------------------------------------------------------------
// Backward, dq: one block per (sequence, 64-row query tile), key tiles 0 ..= the diagonal one.
// Also writes delta for its rows (computed first, from out and dout in global memory).
extern "C" __global__ void __launch_bounds__(NT)
    attn_bwd_dq_d64_bf16(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                         const bf16* __restrict__ out, const float* __restrict__ lse,
                         const bf16* __restrict__ dout, bf16* __restrict__ dq, float* __restrict__ delta,
                         u32 n, u32 t_, u32 d_, u32 heads, u32 ld_in, u32 ld_out, float scale) {
    __shared__ __align__(128) unsigned char smem[6 * TILE_BYTES];  // Q, dO, K[2], V[2]
    (void)d_;
    const u32 sQ = smem_addr(smem), sdO = sQ + TILE_BYTES, sK = sQ + 2 * TILE_BYTES,
              sV = sQ + 4 * TILE_BYTES;
    const int t = (int)t_, lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2;
    const int nqt = (t + TR - 1) / TR;
    const u32 seq = blockIdx.x % n;
    const int qt = nqt - 1 - (int)(blockIdx.x / n);
    const int q0 = qt * TR;
    const size_t base = (size_t)(seq / heads) * t * ld_in + (size_t)(seq % heads) * 64;
    const size_t obase = (size_t)(seq / heads) * t * ld_out + (size_t)(seq % heads) * 64;
    const int li = (int)ld_in, lo = (int)ld_out;
    const float sl2 = scale * ATB_LOG2E;

    tile_async(sQ, q + base, q0, t, li);
    tile_async(sdO, dout + obase, q0, t, lo);
    tile_async(sK, k + base, 0, t, li);
    tile_async(sV, v + base, 0, t, li);
    cp_commit();

    // delta_i = Σ_c dout_ic·out_ic: lane pair (2r, 2r+1) takes row 16w + r, 32 columns each.
    float dsum = 0.f;
    {
        const int row = q0 + 16 * w + (lane >> 1);
        if (row < t) {
            const size_t at = obase + (size_t)row * lo + (lane & 1) * 32;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const uint4 a = __ldg(reinterpret_cast<const uint4*>(out + at + 8 * i));
                const uint4 b = __ldg(reinterpret_cast<const uint4*>(dout + at + 8 * i));
                const u32 aw[4] = {a.x, a.y, a.z, a.w}, bw[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float2 fa = bf16x2_to_float2(aw[e]), fb = bf16x2_to_float2(bw[e]);
                    dsum = fmaf(fa.x, fb.x, dsum);
                    dsum = fmaf(fa.y, fb.y, dsum);
                }
            }
        }
        dsum += __shfl_xor_sync(0xffffffffu, dsum, 1);
        if ((lane & 1) == 0 && row < t) delta[(size_t)seq * t + row] = dsum;
    }
    float dlt[2], lse2[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        dlt[h] = __shfl_sync(0xffffffffu, dsum, 2 * (g + 8 * h));
        const int row = q0 + 16 * w + g + 8 * h;
        lse2[h] = row < t ? lse[(size_t)seq * t + row] * ATB_LOG2E : 0.f;
    }

    u32 qf[4][4], of[4][4];
    float acc[8][4];
    zero(acc);
    for (int kt = 0; kt <= qt; ++kt) {
        const u32 buf = (u32)(kt & 1) * TILE_BYTES;
        if (kt < qt) {
            tile_async(sK + (TILE_BYTES - buf), k + base, (kt + 1) * TR, t, li);
            tile_async(sV + (TILE_BYTES - buf), v + base, (kt + 1) * TR, t, li);
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        if (kt == 0) {
            load_a(qf, sQ, 16 * w, lane);
            load_a(of, sdO, 16 * w, lane);
        }
        const u32 tk = sK + buf, tv = sV + buf;
        const int rows_left = t - q0 - 16 * w;  // rows of the warp inside the sequence: > g + 8h
        if (kt < qt) {
            dq_tile<-1>(acc, qf, of, tk, tv, lane, sl2, lse2, dlt, rows_left);
        } else {
            switch (w) {  // the diagonal tile, one compiled case a warp
            case 0: dq_tile<0>(acc, qf, of, tk, tv, lane, sl2, lse2, dlt, rows_left); break;
            case 1: dq_tile<1>(acc, qf, of, tk, tv, lane, sl2, lse2, dlt, rows_left); break;
            case 2: dq_tile<2>(acc, qf, of, tk, tv, lane, sl2, lse2, dlt, rows_left); break;
            default: dq_tile<3>(acc, qf, of, tk, tv, lane, sl2, lse2, dlt, rows_left); break;
            }
        }
        __syncthreads();
    }
    store_rows(dq + base, acc, scale, scale, sQ, 16 * w, q0, t, li, lane);
}

// One query tile of dk and dv for a warp's 16 key rows (W = -1: a tile after the diagonal, every
// query sees every key; W = 0..3: the diagonal tile of warp W, whose keys are seen by its 16-query
// blocks W ..= 3). ld: the tile's lse (natural log) then delta, TR floats each. Non-finite dO or Q
// on the warp's diagonal block: that k16 step on its own, first, as in the order of mma_ax (the
// same bits for every row that does not see the non-finite queries).
template <int W>
static __device__ __forceinline__ void dkdv_tile(float (&gk)[8][4], float (&gv)[8][4],
                                                 const u32 (&kf)[4][4], const u32 (&vf)[4][4],
                                                 u32 tq, u32 tdo, const float* ld, int lane,
                                                 float sl2, int cols_left) {
    constexpr bool diag = W >= 0;
    constexpr int jlo = diag ? W : 0;  // 16-query blocks before the warp's first key are masked
    const int g = lane >> 2, c = lane & 3;
    const bool bad = diag && (chunk_nonfinite(tdo, jlo, lane) | chunk_nonfinite(tq, jlo, lane));

    float s[8][4], dp[8][4];
    zero(s);
    zero(dp);
    mma_abt(s, kf, tq, lane, jlo, 3);
    mma_abt(dp, vf, tdo, lane, jlo, 3);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int x = 0; x < 4; ++x) {
            const int kl = g + 8 * (x >> 1), ql = 8 * j + 2 * c + (x & 1);
            const bool vis = (!diag || 16 * jlo + kl <= ql) && ql < cols_left;
            const float p = vis ? ex2_ftz(fmaf(s[j][x], sl2, -ld[ql] * ATB_LOG2E)) : 0.f;
            s[j][x] = p;
            dp[j][x] = vis ? p * (dp[j][x] - ld[TR + ql]) : 0.f;
        }
    u32 pf[4][4], dsf[4][4];
    c_to_a(pf, s);
    c_to_a(dsf, dp);
    if (!bad) {
        mma_ax(gv, pf, tdo, lane, jlo, 3);
        mma_ax(gk, dsf, tq, lane, jlo, 3);
    } else {
        mma_diag<false>(gv, pf, tdo, lane, jlo);
        mma_diag<false>(gk, dsf, tq, lane, jlo);
        mma_ax(gv, pf, tdo, lane, jlo + 1, 3);
        mma_ax(gk, dsf, tq, lane, jlo + 1, 3);
    }
}

// ---------------------------------------------------------------------------------------------
// Backward, dk and dv: one block per (sequence, 64-row key tile), query tiles from the diagonal
// one to the end. Rows are keys and score columns queries: Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ,
// dv = Pᵀ·dO, dk = scale·dSᵀ·Q. K and V fragments stay in registers. Two blocks per SM (244
// registers, no spills) ran 1% faster than three (168 registers, 136 bytes spilled) on an H200
// (B64 H6 T256), once each tile's case was compiled on its own (dkdv_tile).
extern "C" __global__ void __launch_bounds__(NT, 2)
    attn_bwd_dkdv_d64_bf16(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                           const float* __restrict__ lse, const bf16* __restrict__ dout,
                           const float* __restrict__ delta, bf16* __restrict__ dk, bf16* __restrict__ dv,
                           u32 n, u32 t_, u32 d_, u32 heads, u32 ld_in, u32 ld_out, float scale) {
    __shared__ __align__(128) unsigned char smem[4 * TILE_BYTES];  // Q[2], dO[2]
    __shared__ __align__(16) float sLD[2][2][TR];                  // [buffer][lse, delta][query]
    (void)d_;
    const u32 sQ = smem_addr(smem), sdO = sQ + 2 * TILE_BYTES;
    const int t = (int)t_, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int nt = (t + TR - 1) / TR;
    const u32 seq = blockIdx.x % n;
    const int kt0 = (int)(blockIdx.x / n);  // low key tiles see the most queries: first
    const int k0 = kt0 * TR;
    const size_t base = (size_t)(seq / heads) * t * ld_in + (size_t)(seq % heads) * 64;
    const size_t obase = (size_t)(seq / heads) * t * ld_out + (size_t)(seq % heads) * 64;
    const int li = (int)ld_in, lo = (int)ld_out;
    const float sl2 = scale * ATB_LOG2E;
    const float* lrow = lse + (size_t)seq * t;
    const float* drow = delta + (size_t)seq * t;

    // K and V go through the second buffers, then into registers.
    tile_async(sQ + TILE_BYTES, k + base, k0, t, li);
    tile_async(sdO + TILE_BYTES, v + base, k0, t, li);
    auto fetch = [&](int qt, int b) {
        const int q0 = qt * TR;
        tile_async(sQ + b * TILE_BYTES, q + base, q0, t, li);
        tile_async(sdO + b * TILE_BYTES, dout + obase, q0, t, lo);
        const int i = threadIdx.x & (TR - 1), which = threadIdx.x >> 6, row = q0 + i;
        const bool valid = row < t;
        cp_async4(smem_addr(&sLD[b][which][i]), (which ? drow : lrow) + (valid ? row : 0), valid);
        cp_commit();
    };
    fetch(kt0, 0);
    cp_wait<0>();
    __syncthreads();
    u32 kf[4][4], vf[4][4];
    load_a(kf, sQ + TILE_BYTES, 16 * w, lane);
    load_a(vf, sdO + TILE_BYTES, 16 * w, lane);
    __syncthreads();

    float gk[8][4], gv[8][4];
    zero(gk);
    zero(gv);
    for (int qt = kt0; qt < nt; ++qt) {
        const int b = (qt - kt0) & 1;
        const u32 buf = (u32)b * TILE_BYTES;
        if (qt + 1 < nt) {
            fetch(qt + 1, b ^ 1);
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        const float* ld = &sLD[b][0][0];
        const int cols_left = t - qt * TR;  // queries of the tile inside the sequence: > ql
        if (qt > kt0) {
            dkdv_tile<-1>(gk, gv, kf, vf, sQ + buf, sdO + buf, ld, lane, sl2, cols_left);
        } else {
            switch (w) {  // the diagonal tile, one compiled case a warp
            case 0: dkdv_tile<0>(gk, gv, kf, vf, sQ + buf, sdO + buf, ld, lane, sl2, cols_left); break;
            case 1: dkdv_tile<1>(gk, gv, kf, vf, sQ + buf, sdO + buf, ld, lane, sl2, cols_left); break;
            case 2: dkdv_tile<2>(gk, gv, kf, vf, sQ + buf, sdO + buf, ld, lane, sl2, cols_left); break;
            default: dkdv_tile<3>(gk, gv, kf, vf, sQ + buf, sdO + buf, ld, lane, sl2, cols_left); break;
            }
        }
        __syncthreads();
    }
    store_rows(dk + base, gk, scale, scale, sQ, 16 * w, k0, t, li, lane);
    store_rows(dv + base, gv, 1.f, 1.f, sdO, 16 * w, k0, t, li, lane);
}
