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
#include "nn_attention_bf16.cuh"
#include "dropout_hash.cuh"

// Attention dropout (the *_drop kernels, DROP = true; see nn_attention.cu and
// dropout_hash.cuh): the forward's P·V operand is bf16(P·f) while l sums the undropped P; the
// backward's dS = P∘(f·dP − delta) and dv's operand bf16(P·f). Where a tile step needs the
// mask: the sequence, the rows' and columns' first global index, t.
struct DropAt {
    AttDrop dr;
    u32 seq;
    int r0, c0, t;
    __device__ __forceinline__ float at(int r, int c) const {
        return att_drop_factor(dr, seq, r0 + r, c0 + c, t);
    }
};

// One key tile of the forward for a warp's 16 rows: S = Q·Kᵀ, the online softmax update of m, l
// and o, and o += P·V. W = -1: a tile below the diagonal (every key visible); W = 0..3: the
// diagonal tile of warp W, whose rows see its 16-key blocks 0 ..= W (the later ones are skipped,
// the diagonal block masked per element). A compile-time W keeps each case free of branches.
template <int W, bool DROP = false>
static __device__ __forceinline__ void fwd_tile(float (&o)[8][4], float (&m)[2], float (&l)[2],
                                                const u32 (&qf)[4][4], u32 tk, u32 tv, int lane,
                                                float sl2, const DropAt& da = DropAt{}) {
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
                if constexpr (DROP)
                    s[j][2 * h + e] = p * da.at(g + 8 * h, 8 * j + 2 * c + e);
                else
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

// The double-buffered key/value tiles of the forward and dq loops (key tiles kt = 0 ..= qt):
// starts loading tile kt + 1 into the other buffers when there is one, then waits for tile kt and
// syncs the block. Returns tile kt's buffer offset.
static __device__ __forceinline__ u32 kv_tile_ready(u32 sK, u32 sV, const bf16* __restrict__ k,
                                                    const bf16* __restrict__ v, int kt, int qt,
                                                    int t, int li) {
    const u32 buf = (u32)(kt & 1) * TILE_BYTES;
    if (kt < qt) {
        tile_async(sK + (TILE_BYTES - buf), k, (kt + 1) * TR, t, li);
        tile_async(sV + (TILE_BYTES - buf), v, (kt + 1) * TR, t, li);
        cp_commit();
        cp_wait<1>();
    } else {
        cp_wait<0>();
    }
    __syncthreads();
    return buf;
}

// ---------------------------------------------------------------------------------------------
// Forward: one block per (sequence, 64-row query tile); key tiles 0 ..= the diagonal one.
template <bool DROP>
static __device__ __forceinline__ void attn_fwd_d64_bf16_body(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                      bf16* __restrict__ out, float* __restrict__ lse, u32 n, u32 t_, u32 d_, u32 heads,
                      u32 ld_in, u32 ld_out, float scale, AttDrop dr) {
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
        const u32 buf = kv_tile_ready(sK, sV, k + base, v + base, kt, qt, t, li);
        if (kt == 0) {
            load_a(qf, sQ, 16 * w, lane);
            negate_if(qf, scale);
        }
        const u32 tk = sK + buf, tv = sV + buf;
        const DropAt da{dr, seq, q0 + 16 * w, kt * TR, t};
        if (kt < qt) {
            fwd_tile<-1, DROP>(o, m, l, qf, tk, tv, lane, sl2, da);
        } else {
            switch (w) {  // the diagonal tile, one compiled case a warp
            case 0: fwd_tile<0, DROP>(o, m, l, qf, tk, tv, lane, sl2, da); break;
            case 1: fwd_tile<1, DROP>(o, m, l, qf, tk, tv, lane, sl2, da); break;
            case 2: fwd_tile<2, DROP>(o, m, l, qf, tk, tv, lane, sl2, da); break;
            default: fwd_tile<3, DROP>(o, m, l, qf, tk, tv, lane, sl2, da); break;
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
extern "C" __global__ void __launch_bounds__(NT)
    attn_fwd_d64_bf16(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                      bf16* __restrict__ out, float* __restrict__ lse, u32 n, u32 t_, u32 d_, u32 heads,
                      u32 ld_in, u32 ld_out, float scale) {
    attn_fwd_d64_bf16_body<false>(q, k, v, out, lse, n, t_, d_, heads, ld_in, ld_out, scale, AttDrop{});
}
// attn_fwd_d64_bf16 with attention dropout p > 0 (seed + *offset when offset is non-null).
extern "C" __global__ void __launch_bounds__(NT)
    attn_fwd_d64_bf16_drop(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                      bf16* __restrict__ out, float* __restrict__ lse, u32 n, u32 t_, u32 d_, u32 heads,
                      u32 ld_in, u32 ld_out, float scale, float p, u64 seed, const u64* __restrict__ offset) {
    attn_fwd_d64_bf16_body<true>(q, k, v, out, lse, n, t_, d_, heads, ld_in, ld_out, scale, att_drop(p, seed, offset));
}

// One key tile of dq for a warp's 16 rows (W as in fwd_tile): P = 2^(S·scale·log2 e − lse·log2 e),
// dS = P∘(dP − delta) (exact zeros where masked or past the sequence's end), acc += dS·K; the
// diagonal k16 step on its own, last, as in the order of mma_ax.
template <int W, bool DROP = false>
static __device__ __forceinline__ void dq_tile(float (&acc)[8][4], const u32 (&qf)[4][4],
                                               const u32 (&of)[4][4], u32 tk, u32 tv, int lane,
                                               float sl2, const float (&lse2)[2],
                                               const float (&dlt)[2], int rows_left,
                                               const DropAt& da = DropAt{}) {
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
            if constexpr (DROP)
                s[j][x] = vis ? p * (dp[j][x] * da.at(rw, cl) - dlt[h]) : 0.f;
            else
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
template <bool DROP>
static __device__ __forceinline__ void attn_bwd_dq_d64_bf16_body(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                         const bf16* __restrict__ out, const float* __restrict__ lse,
                         const bf16* __restrict__ dout, bf16* __restrict__ dq, float* __restrict__ delta,
                         u32 n, u32 t_, u32 d_, u32 heads, u32 ld_in, u32 ld_out, float scale, AttDrop dr) {
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
        const u32 buf = kv_tile_ready(sK, sV, k + base, v + base, kt, qt, t, li);
        if (kt == 0) {
            load_a(qf, sQ, 16 * w, lane);
            load_a(of, sdO, 16 * w, lane);
        }
        const u32 tk = sK + buf, tv = sV + buf;
        const DropAt da{dr, seq, q0 + 16 * w, kt * TR, t};
        const int rows_left = t - q0 - 16 * w;  // rows of the warp inside the sequence: > g + 8h
        if (kt < qt) {
            dq_tile<-1, DROP>(acc, qf, of, tk, tv, lane, sl2, lse2, dlt, rows_left, da);
        } else {
            switch (w) {  // the diagonal tile, one compiled case a warp
            case 0: dq_tile<0, DROP>(acc, qf, of, tk, tv, lane, sl2, lse2, dlt, rows_left, da); break;
            case 1: dq_tile<1, DROP>(acc, qf, of, tk, tv, lane, sl2, lse2, dlt, rows_left, da); break;
            case 2: dq_tile<2, DROP>(acc, qf, of, tk, tv, lane, sl2, lse2, dlt, rows_left, da); break;
            default: dq_tile<3, DROP>(acc, qf, of, tk, tv, lane, sl2, lse2, dlt, rows_left, da); break;
            }
        }
        __syncthreads();
    }
    store_rows(dq + base, acc, scale, scale, sQ, 16 * w, q0, t, li, lane);
}
extern "C" __global__ void __launch_bounds__(NT)
    attn_bwd_dq_d64_bf16(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                         const bf16* __restrict__ out, const float* __restrict__ lse,
                         const bf16* __restrict__ dout, bf16* __restrict__ dq, float* __restrict__ delta,
                         u32 n, u32 t_, u32 d_, u32 heads, u32 ld_in, u32 ld_out, float scale) {
    attn_bwd_dq_d64_bf16_body<false>(q, k, v, out, lse, dout, dq, delta, n, t_, d_, heads, ld_in, ld_out, scale, AttDrop{});
}
// attn_bwd_dq_d64_bf16 with attention dropout p > 0 (seed + *offset when offset is non-null).
extern "C" __global__ void __launch_bounds__(NT)
    attn_bwd_dq_d64_bf16_drop(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                         const bf16* __restrict__ out, const float* __restrict__ lse,
                         const bf16* __restrict__ dout, bf16* __restrict__ dq, float* __restrict__ delta,
                         u32 n, u32 t_, u32 d_, u32 heads, u32 ld_in, u32 ld_out, float scale, float p, u64 seed, const u64* __restrict__ offset) {
    attn_bwd_dq_d64_bf16_body<true>(q, k, v, out, lse, dout, dq, delta, n, t_, d_, heads, ld_in, ld_out, scale, att_drop(p, seed, offset));
}

// One query tile of dk and dv for a warp's 16 key rows (W = -1: a tile after the diagonal, every
// query sees every key; W = 0..3: the diagonal tile of warp W, whose keys are seen by its 16-query
// blocks W ..= 3). ld: the tile's lse (natural log) then delta, TR floats each. Non-finite dO or Q
// on the warp's diagonal block: that k16 step on its own, first, as in the order of mma_ax (the
// same bits for every row that does not see the non-finite queries).
template <int W, bool DROP = false>
static __device__ __forceinline__ void dkdv_tile(float (&gk)[8][4], float (&gv)[8][4],
                                                 const u32 (&kf)[4][4], const u32 (&vf)[4][4],
                                                 u32 tq, u32 tdo, const float* ld, int lane,
                                                 float sl2, int cols_left,
                                                 const DropAt& da = DropAt{}) {
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
            if constexpr (DROP) {
                // Rows are keys, columns queries: the mask's entry (query, key).
                const float f = da.at(ql, kl);
                s[j][x] = p * f;
                dp[j][x] = vis ? p * (dp[j][x] * f - ld[TR + ql]) : 0.f;
            } else {
                s[j][x] = p;
                dp[j][x] = vis ? p * (dp[j][x] - ld[TR + ql]) : 0.f;
            }
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
template <bool DROP>
static __device__ __forceinline__ void attn_bwd_dkdv_d64_bf16_body(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                           const float* __restrict__ lse, const bf16* __restrict__ dout,
                           const float* __restrict__ delta, bf16* __restrict__ dk, bf16* __restrict__ dv,
                           u32 n, u32 t_, u32 d_, u32 heads, u32 ld_in, u32 ld_out, float scale, AttDrop dr) {
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
        const DropAt da{dr, seq, qt * TR, k0 + 16 * w, t};
        const int cols_left = t - qt * TR;  // queries of the tile inside the sequence: > ql
        if (qt > kt0) {
            dkdv_tile<-1, DROP>(gk, gv, kf, vf, sQ + buf, sdO + buf, ld, lane, sl2, cols_left, da);
        } else {
            switch (w) {  // the diagonal tile, one compiled case a warp
            case 0: dkdv_tile<0, DROP>(gk, gv, kf, vf, sQ + buf, sdO + buf, ld, lane, sl2, cols_left, da); break;
            case 1: dkdv_tile<1, DROP>(gk, gv, kf, vf, sQ + buf, sdO + buf, ld, lane, sl2, cols_left, da); break;
            case 2: dkdv_tile<2, DROP>(gk, gv, kf, vf, sQ + buf, sdO + buf, ld, lane, sl2, cols_left, da); break;
            default: dkdv_tile<3, DROP>(gk, gv, kf, vf, sQ + buf, sdO + buf, ld, lane, sl2, cols_left, da); break;
            }
        }
        __syncthreads();
    }
    store_rows(dk + base, gk, scale, scale, sQ, 16 * w, k0, t, li, lane);
    store_rows(dv + base, gv, 1.f, 1.f, sdO, 16 * w, k0, t, li, lane);
}
extern "C" __global__ void __launch_bounds__(NT, 2)
    attn_bwd_dkdv_d64_bf16(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                           const float* __restrict__ lse, const bf16* __restrict__ dout,
                           const float* __restrict__ delta, bf16* __restrict__ dk, bf16* __restrict__ dv,
                           u32 n, u32 t_, u32 d_, u32 heads, u32 ld_in, u32 ld_out, float scale) {
    attn_bwd_dkdv_d64_bf16_body<false>(q, k, v, lse, dout, delta, dk, dv, n, t_, d_, heads, ld_in, ld_out, scale, AttDrop{});
}
// attn_bwd_dkdv_d64_bf16 with attention dropout p > 0 (seed + *offset when offset is non-null).
extern "C" __global__ void __launch_bounds__(NT, 2)
    attn_bwd_dkdv_d64_bf16_drop(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                           const float* __restrict__ lse, const bf16* __restrict__ dout,
                           const float* __restrict__ delta, bf16* __restrict__ dk, bf16* __restrict__ dv,
                           u32 n, u32 t_, u32 d_, u32 heads, u32 ld_in, u32 ld_out, float scale, float p, u64 seed, const u64* __restrict__ offset) {
    attn_bwd_dkdv_d64_bf16_body<true>(q, k, v, lse, dout, delta, dk, dv, n, t_, d_, heads, ld_in, ld_out, scale, att_drop(p, seed, offset));
}
