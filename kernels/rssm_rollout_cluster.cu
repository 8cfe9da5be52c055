// The world model's ensemble rollout with one thread-block cluster per member (sm_90 and later).
// Same computation, step order and weight slices as rssm_rollout.cu (read its header), but every
// block keeps the member's whole activations in its own shared memory — h (twice), z, the head
// fc outputs and the decoder fc outputs — and the blocks exchange their slices by writing them
// into every peer's shared memory (distributed shared memory), between hardware cluster
// barriers: nothing is staged through L2 and no barrier spins on memory. The head fc units are
// spread over all BPM blocks (FC = ⌈P/BPM⌉ each). Needs B <= 32 rows and BPM <= 16 (one cluster
// per member); the host falls back to rssm_rollout_f32 otherwise. The GRU's gate products run
// and the decoder fc's run on tensor cores in 3×TF32 (gate_mma, dec_mma) when S and H are
// multiples of 8; the other products, and these for other sizes, are f32 FMA dot products. CPU reference:
// rssm::reference::HostRssm::predict; parity tests: crates/rssm/tests/gpu_rollout.rs.
#include "rssm_rollout.cuh"

#if __CUDA_ARCH__ >= 900
// w·x over n values in shared memory; float4 steps when v4 (both 16-byte aligned, n % 4 == 0).
static __device__ __forceinline__ float dot(const float* w, const float* x, u32 n, bool v4) {
    float a0 = 0.0f, a1 = 0.0f;
    if (v4) {
        u32 k = 0;
        for (; k + 8 <= n; k += 8) {
            const float4 p = *reinterpret_cast<const float4*>(w + k);
            const float4 q = *reinterpret_cast<const float4*>(x + k);
            const float4 p2 = *reinterpret_cast<const float4*>(w + k + 4);
            const float4 q2 = *reinterpret_cast<const float4*>(x + k + 4);
            a0 = fmaf(p.x, q.x, fmaf(p.y, q.y, fmaf(p.z, q.z, fmaf(p.w, q.w, a0))));
            a1 = fmaf(p2.x, q2.x, fmaf(p2.y, q2.y, fmaf(p2.z, q2.z, fmaf(p2.w, q2.w, a1))));
        }
        if (k < n) {
            const float4 p = *reinterpret_cast<const float4*>(w + k);
            const float4 q = *reinterpret_cast<const float4*>(x + k);
            a0 = fmaf(p.x, q.x, fmaf(p.y, q.y, fmaf(p.z, q.z, fmaf(p.w, q.w, a0))));
        }
    } else {
        for (u32 k = 0; k < n; k++) a0 = fmaf(w[k], x[k], a0);
    }
    return a0 + a1;
}

// The GRU's gate pre-activations on tensor cores, in 3×TF32: each operand x is split exactly
// as x = hi + lo, hi = x with its 13 low mantissa bits cleared (a tf32 value) and lo = x − hi
// (exact in f32); the tensor cores read lo's top 19 bits, which keep it to 2^-11 of itself. A
// product sum is taken as hi·hi + hi·lo + lo·hi in f32 accumulators (lo·lo is ~2^-20 of the
// product): relative error ~2^-20 of Σ|w·x|, about f32's (the FMA path's K·2^-24), at
// mma.sync's rate. Two instructions a value: cvt.rna.tf32.f32 takes six on sm_90.
static __device__ __forceinline__ void split_tf32(float x, u32& hi, u32& lo) {
    hi = __float_as_uint(x) & 0xFFFFE000u;
    lo = __float_as_uint(x - __uint_as_float(hi));
}
static __device__ __forceinline__ void mma_tf32(float (&d)[4], const u32 (&a)[4],
                                                const u32 (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// One k-step of 3×TF32: big, s1, s2 += hi·hi, hi·lo, lo·hi of the fragments' f32 values av (A)
// and bv (B).
static __device__ __forceinline__ void mma_3xtf32(float (&big)[4], float (&s1)[4],
                                                  float (&s2)[4], const float (&av)[4],
                                                  const float (&bv)[2]) {
    u32 ah[4], al[4], bh[2], bl[2];
#pragma unroll
    for (int i = 0; i < 4; i++) split_tf32(av[i], ah[i], al[i]);
#pragma unroll
    for (int i = 0; i < 2; i++) split_tf32(bv[i], bh[i], bl[i]);
    mma_tf32(big, ah, bh);
    mma_tf32(s1, ah, bl);
    mma_tf32(s2, al, bh);
}

// The scratch row stride of the gate pre-activations (3·GU + 1: odd, so the nonlinearity's
// reads of 32 rows at one column fall on 32 banks).
#define GATE_LD (3 * GU + 1)

// dst[r·GATE_LD + c] = Σ_k W[c][woff + k]·x[r·ld + k] for rows r < B and the block's 3·GU gate
// rows c (gw, row stride XL), k < K (K % 8 == 0). Warps 0–11 each take one 16 × 8 tile: rows
// 16·(w / 6) on, gate rows 8·(w % 6) on; m16n8k8 fragments (PTX ISA): A a0 (g, t), a1 (g + 8,
// t), a2 (g, t + 4), a3 (g + 8, t + 4); B b0 (k t, n g), b1 (k t + 4, n g); C c0 (g, 2t),
// c1 (g, 2t + 1), c2 (g + 8, 2t), c3 (g + 8, 2t + 1), with g = lane / 4, t = lane % 4.
static __device__ __forceinline__ void gate_mma(const float* gw, u32 XL, u32 woff,
                                                const float* x, u32 ld, u32 K, u32 B,
                                                float* dst) {
    const u32 w = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (w >= 12) return;
    const u32 g = lane / 4, t = lane % 4, r0 = 16 * (w / 6) + g, r1 = r0 + 8, n0 = 8 * (w % 6);
    const float* wr = gw + (n0 + g) * XL + woff + t;
    const float* x0 = x + r0 * ld + t;
    const float* x1 = x + r1 * ld + t;
    const bool in0 = r0 < B, in1 = r1 < B;
    // Two k-steps a trip into separate accumulators (K % 16 == 0, else the last step alone):
    // twice the independent mma chains.
    float big[2][4] = {}, s1[2][4] = {}, s2[2][4] = {};
    auto step = [&](u32 k, int q) {
        const float av[4] = {in0 ? x0[k] : 0.0f, in1 ? x1[k] : 0.0f, in0 ? x0[k + 4] : 0.0f,
                             in1 ? x1[k + 4] : 0.0f};
        const float bv[2] = {wr[k], wr[k + 4]};
        mma_3xtf32(big[q], s1[q], s2[q], av, bv);
    };
    u32 k = 0;
#pragma unroll 2
    for (; k + 16 <= K; k += 16) {
        step(k, 0);
        step(k + 8, 1);
    }
    if (k < K) step(k, 0);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        big[0][i] += big[1][i];
        s1[0][i] += s1[1][i];
        s2[0][i] += s2[1][i];
    }
    const u32 c = n0 + 2 * t;
    if (in0) {
        dst[r0 * GATE_LD + c] = big[0][0] + (s1[0][0] + s2[0][0]);
        dst[r0 * GATE_LD + c + 1] = big[0][1] + (s1[0][1] + s2[0][1]);
    }
    if (in1) {
        dst[r1 * GATE_LD + c] = big[0][2] + (s1[0][2] + s2[0][2]);
        dst[r1 * GATE_LD + c + 1] = big[0][3] + (s1[0][3] + s2[0][3]);
    }
}

// A head fc of the block's nf <= 8 units (rows of W, stride WL: [h (H) | z (S)] weights; S = 0
// for the prior's, on h alone)
// on tensor cores, as gate_mma: warp w takes rows 16·(w & 1) on and the k-steps s ≡ w / 2
// (mod 8) of [h | z] ((H + S) / 8 of them), and writes its 16 × 8 partial sums to part
// (chunk w / 2 at part + (w / 2)·8·B, [B][8]); the caller adds the 8 chunks in order.
static __device__ __forceinline__ void dec_mma(const float* W, u32 WL, u32 nf, const float* h,
                                               u32 HL, u32 H, const float* z, u32 ZL, u32 S,
                                               u32 B, float* part) {
    const u32 w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const u32 g = lane / 4, t = lane % 4, r0 = 16 * (w & 1) + g, r1 = r0 + 8, c = w / 2;
    const bool in0 = r0 < B, in1 = r1 < B, wn = g < nf;
    const float* wr = W + g * WL + t;
    float big[4] = {}, s1[4] = {}, s2[4] = {};
    for (u32 st = c; st < (H + S) / 8; st += 8) {
        const u32 k = 8 * st;
        const bool hz = k < H;
        const float* x = hz ? h : z;
        const u32 ld = hz ? HL : ZL, kk = (hz ? k : k - H) + t;
        const float av[4] = {in0 ? x[r0 * ld + kk] : 0.0f, in1 ? x[r1 * ld + kk] : 0.0f,
                             in0 ? x[r0 * ld + kk + 4] : 0.0f, in1 ? x[r1 * ld + kk + 4] : 0.0f};
        const float bv[2] = {wn ? wr[k] : 0.0f, wn ? wr[k + 4] : 0.0f};
        mma_3xtf32(big, s1, s2, av, bv);
    }
    float* p = part + c * 8 * B + 2 * t;
    if (in0) {
        p[r0 * 8] = big[0] + (s1[0] + s2[0]);
        p[r0 * 8 + 1] = big[1] + (s1[1] + s2[1]);
    }
    if (in1) {
        p[r1 * 8] = big[2] + (s1[2] + s2[2]);
        p[r1 * 8 + 1] = big[3] + (s1[3] + s2[3]);
    }
}

// dst[r·ds + o] = Wo[o]·y_r + bo[o] for rows r < B <= 32 and outputs o < O <= 64 on tensor
// cores (3×TF32): y and Wo rows of stride ld (≡ 4 mod 32: conflict-free fragments), K = P
// (P % 8 == 0). The 16 × 8 tiles, 2·⌈O/8⌉ of them (a divisor of 16), go to warps w % tiles,
// each taking the k-steps ≡ w / tiles (mod kp). kp = 1 (scratch null): the first `tiles` warps
// write dst; kp = 16 / tiles: every warp writes its partial sums to scratch ([kp][B][8·⌈O/8⌉])
// and, after a block barrier, they are added in order.
static __device__ __forceinline__ void out_mma(const float* y, u32 ld, u32 P, const float* Wo,
                                               const float* bo, u32 O, u32 B, float* dst,
                                               u64 ds, float* scratch) {
    const u32 w = threadIdx.x / 32, lane = threadIdx.x % 32, nt = (O + 7) / 8, tiles = 2 * nt;
    const u32 kp = scratch ? 16 / tiles : 1, OW = 8 * nt;
    const u32 g = lane / 4, t = lane % 4, tile = w % tiles, c = w / tiles;
    if (c < kp) {
        const u32 r0 = 16 * (tile & 1) + g, r1 = r0 + 8, n0 = 8 * (tile >> 1);
        const bool in0 = r0 < B, in1 = r1 < B, wn = n0 + g < O;
        const float* wr = Wo + (n0 + g) * ld + t;
        const float* x0 = y + r0 * ld + t;
        const float* x1 = y + r1 * ld + t;
        float big[4] = {}, s1[4] = {}, s2[4] = {};
        for (u32 k = 8 * c; k < P; k += 8 * kp) {
            const float av[4] = {in0 ? x0[k] : 0.0f, in1 ? x1[k] : 0.0f, in0 ? x0[k + 4] : 0.0f,
                                 in1 ? x1[k + 4] : 0.0f};
            const float bv[2] = {wn ? wr[k] : 0.0f, wn ? wr[k + 4] : 0.0f};
            mma_3xtf32(big, s1, s2, av, bv);
        }
        const u32 o = n0 + 2 * t;
        const float v[4] = {big[0] + (s1[0] + s2[0]), big[1] + (s1[1] + s2[1]),
                            big[2] + (s1[2] + s2[2]), big[3] + (s1[3] + s2[3])};
        if (scratch) {
            float* p = scratch + c * B * OW + o;
            if (in0) {
                p[r0 * OW] = v[0];
                p[r0 * OW + 1] = v[1];
            }
            if (in1) {
                p[r1 * OW] = v[2];
                p[r1 * OW + 1] = v[3];
            }
        } else {
            if (in0 && o < O) dst[r0 * ds + o] = v[0] + bo[o];
            if (in0 && o + 1 < O) dst[r0 * ds + o + 1] = v[1] + bo[o + 1];
            if (in1 && o < O) dst[r1 * ds + o] = v[2] + bo[o];
            if (in1 && o + 1 < O) dst[r1 * ds + o + 1] = v[3] + bo[o + 1];
        }
    }
    if (!scratch) return;
    __syncthreads();
    for (u32 i = threadIdx.x; i < B * O; i += blockDim.x) {
        const u32 r = i / O, o = i % O;
        float a = 0.0f;
        for (u32 q = 0; q < kp; q++) a += scratch[q * B * OW + r * OW + o];
        dst[r * ds + o] = a + bo[o];
    }
}

// The cluster primitives (PTX; sm_90 and later).
static __device__ __forceinline__ u32 cluster_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

// Writes v at `local` (a shared address of this block) in every block of the cluster, itself
// included: the same offset in each block's shared memory.
static __device__ __forceinline__ void broadcast(float* local, float v, u32 blocks) {
    const u32 a = (u32)__cvta_generic_to_shared(local);
    for (u32 q = 0; q < blocks; q++) {
        u32 ra;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(a), "r"(q));
        asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(ra), "f"(v) : "memory");
    }
}

// Copies this block's slice — rows [0, rows), columns [c0, c0 + width) of the shared array
// `buf` (row stride ld) — to the same place in every other block of the cluster: 16-byte
// stores when ld, c0 and width are multiples of 4. The caller synchronises the block before
// (the slice is complete) and the cluster after (the copies have landed).
static __device__ __forceinline__ void push_slice(float* buf, u32 ld, u32 c0, u32 width,
                                                  u32 rows, u32 blocks, u32 self) {
    if (((ld | c0 | width) & 3) == 0) {
        const u32 w4 = width / 4, n = rows * w4;
        for (u32 i = threadIdx.x; i < n * blocks; i += blockDim.x) {
            const u32 q = i / n, e = i % n;
            if (q == self) continue;
            float* p = buf + (e / w4) * ld + c0 + 4 * (e % w4);
            const float4 v = *reinterpret_cast<const float4*>(p);
            const u32 a = (u32)__cvta_generic_to_shared(p);
            u32 ra;
            asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(a), "r"(q));
            asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(ra), "f"(v.x),
                         "f"(v.y), "f"(v.z), "f"(v.w)
                         : "memory");
        }
    } else {
        const u32 n = rows * width;
        for (u32 i = threadIdx.x; i < n; i += blockDim.x) {
            float* p = buf + (i / width) * ld + c0 + i % width;
            broadcast(p, *p, blocks);
        }
    }
}
#endif

// As rssm_rollout_f32 (the same parameters less the L2 scratch): w: M packed members; emb:
// [B, T, E]; out: [M, B, N, D]; mean: [B, N, D]; dis: [B, N]; bar: 2 zeroed u32 (the grid
// barrier before the statistics; the launch is cooperative). Grid: M·BPM blocks in clusters of
// BPM; dynamic shared memory as gpu_cuda::rollout::RolloutDims::cluster_smem_bytes.
extern "C" __global__ void __launch_bounds__(THREADS, 1)
rssm_rollout_cluster_f32(const float* __restrict__ w, const float* __restrict__ emb, float* out,
                         float* mean, float* dis, u32* bar, u32 M, u32 B, u32 T, u32 N, u32 H,
                         u32 S, u32 E, u32 P, u32 D, float eps) {
#if __CUDA_ARCH__ >= 900
    extern __shared__ float4 sm4[];
    float* sm = reinterpret_cast<float*>(sm4);
    const Layout L = layout(H, S, E, P, D);
    const u32 GS = (H + GU - 1) / GU, BPM = max(GS, (P + FU - 1) / FU);
    const u32 FC = (P + BPM - 1) / BPM, DO = (D + BPM - 1) / BPM;
    const u32 m = blockIdx.x / BPM, s = cluster_rank();
    const u32 X = S + H, XL = pad(X), j0 = s * GU, p0 = min(s * FC, P), nf = min(FC, P - p0);
    const u32 o0 = min(s * DO, D), nd = min(DO, D - o0);
    const u32 in[3] = {H, H + E, H + S};
    const u32 PL = pad(P), HL = pad(H), ZL = pad(S), S4 = (S + 3) & ~3u, DO4 = (DO + 3) & ~3u;
    auto r4 = [](u32 v) { return (v + 3) & ~3u; };
    // Shared memory, every region a multiple of 4 floats (the host's cluster_smem_bytes sums
    // the same): the weight slices, then the activations.
    float* gw = sm;                                  // [3·GU][XL]
    float* gb = gw + 3 * GU * XL;                    // [2][3·GU]
    float* fw0 = gb + 6 * GU;                        // [FC][pad(in_h)] per head
    float* fw1 = fw0 + r4(FC * pad(in[0]));
    float* fw2 = fw1 + r4(FC * pad(in[1]));
    float* fb = fw2 + r4(FC * pad(in[2]));           // [3][FC]
    float* om0 = fb + r4(3 * FC);                    // prior and posterior mean outputs [S][PL]
    float* om1 = om0 + r4(S * PL);
    float* omb = om1 + r4(S * PL);                   // [2][S4]
    float* od = omb + 2 * S4;                        // the decoder's output slice [DO][PL]
    float* odb = od + r4(DO * PL);                   // [DO4]
    float* lg = odb + DO4;                           // [3][2][P]
    float* hb[2];                                    // h [B][HL], twice
    hb[0] = lg + r4(6 * P);
    hb[1] = hb[0] + r4(B * HL);
    float* zb = hb[1] + r4(B * HL);                  // z [B][ZL] (padded: rows on distinct banks)
    float* fcp = zb + r4(B * ZL);                    // the step's head fc [B][PL]
    float* fcd = fcp + r4(B * PL);                   // the decoder's fc [B][PL]
    const Slices sl = {gw, gb, {fw0, fw1, fw2}, fb, {om0, om1}, omb, od, odb, lg};
    load_slices(w + (u64)m * L.size, L, H, S, E, P, j0, p0, FC, o0, nd, s < GS, nf > 0, sl);
    for (u32 i = threadIdx.x; i < B * HL; i += blockDim.x) hb[0][i] = 0.0f;
    for (u32 i = threadIdx.x; i < B * ZL; i += blockDim.x) zb[i] = 0.0f;
    // Every block is running (its shared memory may be written) once this returns.
    cluster_barrier();

    const u64 mB = (u64)m * B;
    const bool v4 = ((S | H | E | P) & 3) == 0;
    // The GRU on tensor cores (gate_mma) when its K ranges are whole mma steps and the gate
    // scratch (2·B rows of GATE_LD) fits in fcp (B rows of PL); else FMA dot products.
    const bool mma = v4 && ((S | H) & 7) == 0 && 2 * GATE_LD <= PL;
    // The decoder fc and the prior's fc on tensor cores (dec_mma, 16 warps) when the block's
    // units fit one n-tile and the 8 chunks of partial sums fit in fcp (and in the dead h
    // buffer, B·HL floats, HL >= PL).
    const bool dmma = v4 && ((S | H) & 7) == 0 && FC <= 8 && PL >= 64 && THREADS == 512;
    // The prior/posterior mean outputs (S of them, into zb) and the block's decoder outputs on
    // tensor cores (out_mma) when P is whole mma steps and the tiles divide the 16 warps; the
    // decoder's partial sums ([16 / 2][B][8]) go to the dead h buffer (B·HL floats).
    const bool tiles_ok = (P & 7) == 0 && THREADS == 512;
    const bool omma = tiles_ok && S <= 64 && 16 % (2 * ((S + 7) / 8)) == 0;
    const bool domma = tiles_ok && DO <= 8 && 64 <= HL;
    // Thread roles: GRU unit u (of GU) and head fc unit u (of FC) for row r.
    const u32 u = threadIdx.x / 32, r = threadIdx.x % 32;
    // The head fc units of this block for step t's hidden state hx: posterior on [h, e_t]
    // (e from global memory) or prior on h; into every block's fcp.
    // The prior's (hd 0) on tensor cores as the decoder fc's (dec_mma on [h], partial sums in
    // `scratch`); the posterior's, which also reads e_t from global memory, on FMA.
    auto head_fc = [&](int hd, const float* hx, u32 t, float* scratch) {
        if (dmma && hd == 0 && HL >= 64) {
            dec_mma(fw0, pad(in[0]), nf, hx, HL, H, nullptr, 0, 0, B, scratch);
            __syncthreads();
            if (u >= nf || r >= B) return;
            float a = 0.0f;
            for (u32 c = 0; c < 8; c++) a += scratch[c * 8 * B + r * 8 + u];
            fcp[r * PL + p0 + u] = a + fb[u];
            return;
        }
        if (u >= nf || r >= B) return;
        const float* wr = (hd ? fw1 : fw0) + u * pad(in[hd]);
        float a = dot(wr, hx + r * HL, H, v4);
        if (hd) {
            const float* e = emb + ((u64)r * T + t) * E;
            for (u32 k = 0; k < E; k++) a = fmaf(wr[H + k], __ldg(e + k), a);
        }
        fcp[r * PL + p0 + u] = a + fb[hd * FC + u];
    };
    // The decoder fc units of this block on [h, z], into every block's fcd.
    auto dec_fc = [&](const float* hx) {
        if (dmma) {
            // Partial sums in fcp (free in phase 1 once the GRU's gate scratch is read).
            __syncthreads();
            dec_mma(fw2, pad(in[2]), nf, hx, HL, H, zb, ZL, S, B, fcp);
            __syncthreads();
            if (u >= nf || r >= B) return;
            float a = 0.0f;
            for (u32 c = 0; c < 8; c++) a += fcp[c * 8 * B + r * 8 + u];
            fcd[r * PL + p0 + u] = a + fb[2 * FC + u];
            return;
        }
        if (u >= nf || r >= B) return;
        const float* wr = fw2 + u * pad(in[2]);
        const float a = dot(wr, hx + r * HL, H, v4) + dot(wr + H, zb + r * ZL, S, v4);
        fcd[r * PL + p0 + u] = a + fb[2 * FC + u];
    };
#ifdef PROF  // the phase clocks (STAMP) go to dis + 8192 floats (rollout_ab.py gives room)
    long long* prof = reinterpret_cast<long long*>(dis) + 4096;
#endif
    // This block's slice of the decoder outputs of imagined step n (LayerNorm of fcd in place);
    // t: the loop's step, for the phase clocks of PROF builds.
    auto dec_out = [&](u32 n, u32 t, float* scratch) {
        if (nd == 0) return;
        norm_rows(fcd, B, P, lg + 4 * P, lg + 5 * P, eps);
        __syncthreads();
#ifdef PROF_SPLIT  // "dec out itself" is then the outputs only
        STAMP(9)
#endif
        if (domma)
            out_mma(fcd, PL, P, od, odb, nd, B, out + (mB * N + n) * D + o0, (u64)N * D, scratch);
        else
            out_rows(fcd, B, P, od, odb, nd, out + (mB * N + n) * D + o0, (u64)N * D);
    };

    int cur = 0;
    for (u32 t = 0; t < T + N; t++) {
        STAMP(0)
        // Phase 1: z_{t−1} from fcp (every block, for itself); h_t = GRU(z_{t−1}, h_{t−1})
        // into every block's hb[cur ^ 1]; the decoder fc of imagined step t − 1 − T.
        if (t > 0) {
            const int hd = t - 1 < T ? 1 : 0;
            norm_rows(fcp, B, P, lg + 2 * hd * P, lg + (2 * hd + 1) * P, eps);
            __syncthreads();
#ifdef PROF_SPLIT  // the LayerNorms' share: "z from fc" ends here, "GRU stage" has the outputs
            STAMP(1)
#endif
            if (omma)
                out_mma(fcp, PL, P, hd ? om1 : om0, omb + hd * S4, S, B, zb, ZL, nullptr);
            else
                out_rows(fcp, B, P, hd ? om1 : om0, omb + hd * S4, S, zb, ZL);
            __syncthreads();
        }
#ifndef PROF_SPLIT
        STAMP(1)
#endif
        STAMP(8)
        const u32 j = j0 + u;
        if (mma) {
            // Gate pre-activations into fcp (read above; peers write it only in phase 2).
            float* gi = fcp;
            float* gh = fcp + B * GATE_LD;
            gate_mma(gw, XL, 0, zb, ZL, S, B, gi);
            gate_mma(gw, XL, S, hb[cur], HL, H, B, gh);
            __syncthreads();
            if (j < H && r < B) {
                const float* ai = gi + r * GATE_LD + u;
                const float* ah = gh + r * GATE_LD + u;
                const float hj = hb[cur][r * HL + j];
                const float rg = sigmoidf(ai[0] + gb[u] + ah[0] + gb[3 * GU + u]);
                const float ug = sigmoidf(ai[GU] + gb[GU + u] + ah[GU] + gb[4 * GU + u]);
                const float ng =
                    tanhf(ai[2 * GU] + gb[2 * GU + u] + rg * (ah[2 * GU] + gb[5 * GU + u]));
                hb[cur ^ 1][r * HL + j] = fmaf(ug, hj - ng, ng);
            }
        } else if (j < H && r < B) {
            const float* wu = gw + u * XL;
            const float* hx = hb[cur] + r * HL;
            const float* zx = zb + r * ZL;
            float ai[3] = {}, ah[3] = {};
            if (v4) {  // rows of gw 16-byte aligned (XL % 4 == 0), and wu + S too
                gru_dots(wu, GU * XL, zx, 0, S, ai);
                gru_dots(wu + S, GU * XL, hx, 0, H, ah);
            } else {
                for (int g = 0; g < 3; g++) {
                    for (u32 k = 0; k < S; k++) ai[g] = fmaf(wu[g * GU * XL + k], zx[k], ai[g]);
                    for (u32 k = 0; k < H; k++) ah[g] = fmaf(wu[g * GU * XL + S + k], hx[k], ah[g]);
                }
            }
            const float rg = sigmoidf(ai[0] + gb[u] + ah[0] + gb[3 * GU + u]);
            const float ug = sigmoidf(ai[1] + gb[GU + u] + ah[1] + gb[4 * GU + u]);
            const float ng = tanhf(ai[2] + gb[2 * GU + u] + rg * (ah[2] + gb[5 * GU + u]));
            hb[cur ^ 1][r * HL + j] = fmaf(ug, hx[j] - ng, ng);
        }
        STAMP(2)
        if (t > T) dec_fc(hb[cur]);
        __syncthreads();
        push_slice(hb[cur ^ 1], HL, j0, j0 < H ? min(GU, H - j0) : 0, B, BPM, s);
        if (t > T) push_slice(fcd, PL, p0, nf, B, BPM, s);
        STAMP(3)
        cluster_barrier();
        STAMP(4)
        const int nxt = cur ^ 1;
        // Phase 2: the head fc of step t; this block's slice of the decoder outputs of imagined
        // step t − 1 − T.
        head_fc(t < T ? 1 : 0, hb[nxt], t, hb[cur]);  // h_{t−1}: dead until next phase 1
        STAMP(5)
        __syncthreads();
        push_slice(fcp, PL, p0, nf, B, BPM, s);
#ifndef PROF_SPLIT
        STAMP(9)
#endif
        if (t > T) dec_out(t - 1 - T, t, hb[cur]);  // h_{t−1}: dead until next phase 1
        STAMP(6)
        cluster_barrier();
        STAMP(7)
        cur = nxt;
    }
    // The last imagined step: its z, decoder fc, decoder outputs; then the statistics.
    norm_out(fcp, B, P, lg, lg + P, eps, om0, omb, S, zb, ZL);
    __syncthreads();
    dec_fc(hb[cur]);
    __syncthreads();
    push_slice(fcd, PL, p0, nf, B, BPM, s);
    cluster_barrier();
    dec_out(N - 1, T + N, hb[cur ^ 1]);  // the h before the last: dead
    u32 gg = 0;
    barrier(bar, gridDim.x, gg);
    ensemble_stats(out, mean, dis, M, B, N, D);
#else
    __trap();
#endif
}
