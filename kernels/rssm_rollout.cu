// The world model's ensemble rollout in one persistent, cooperative launch: every member
// filters the embedded context along its posterior mean, then rolls N steps along its prior
// mean and decodes each step; then the ensemble mean and disagreement are formed. No host
// round trip. CPU reference: rssm::reference::HostRssm::predict (f64); parity tests:
// crates/rssm/tests/gpu_rollout.rs.
//
// Per member and step (rows are batch entries; W·x means x·Wᵀ with PyTorch's [out, in] W):
//   h ← GRU(z, h):  r, u = σ(W_i{r,u}·z + b + W_h{r,u}·h + b), n = tanh(W_in·z + b_in +
//                   r ⊙ (W_hn·h + b_hn)), h' = n + u ⊙ (h − n)
//   observe:  z ← first S of head_post([h, e_t]);  imagine: z ← first S of head_prior(h),
//             y ← head_dec([h, z])
//   head(x) = W_out·relu(LayerNorm(W_fc·x + b_fc)) + b_out
//
// Weight-stationary: each member owns BPM = max(⌈H/16⌉, ⌈P/16⌉) consecutive blocks; block s
// of a member keeps in shared memory, for the whole rollout, GRU units [16s, 16s + 16) (all
// three gates), the heads' fc units [16s, 16s + 16), the prior and posterior output layers'
// mean halves, its slice of the decoder's output layer, and the LayerNorms. Per step the
// blocks exchange only activations (h and the fc outputs, through L2, read with __ldcg after a
// barrier) in two phases separated by per-member barriers (members never wait for each other
// until the final statistics):
//   1: z_{t−1} = head output of the previous fc (every block computes all of it, for itself);
//      h_t = GRU(z_{t−1}, h_{t−1}) ‖ decoder fc of step t − 1
//   2: head fc of step t ‖ each block's slice of the decoder outputs of step t − 1

#include "rssm_rollout.cuh"

// The float4 form of gather for a rows × w block (w a multiple of 4, rows 16-byte aligned at
// src + r·src_stride) into dst rows at stride ld (a multiple of 4).
static __device__ __forceinline__ void gather4(u32 rows, u32 w, const float* src, u64 src_stride,
                                               float* dst, u32 ld) {
    const u32 w4 = w / 4, n = rows * w4;
    for (u32 i0 = threadIdx.x; i0 < n; i0 += blockDim.x * UNR) {
        float4 v[UNR];
#pragma unroll
        for (int q = 0; q < UNR; q++) {
            const u32 i = i0 + q * blockDim.x;
            if (i < n) v[q] = __ldcg(reinterpret_cast<const float4*>(src + (i / w4) * src_stride) + i % w4);
        }
#pragma unroll
        for (int q = 0; q < UNR; q++) {
            const u32 i = i0 + q * blockDim.x;
            if (i < n) reinterpret_cast<float4*>(dst + (i / w4) * ld)[i % w4] = v[q];
        }
    }
}

// Stages rows [r0, r0 + nr) of [a (width wa, rows contiguous) | b (width wb, rows
// b_row_stride apart)] into st (row stride pad(wa + wb)).
static __device__ void stage(float* st, const float* a, u32 wa, const float* b, u32 wb,
                             u64 b_row_stride, u32 nr) {
    const u32 ld = pad(wa + wb);
    __syncthreads();
    if (((wa | wb | b_row_stride) & 3) == 0) {
        gather4(nr, wa, a, wa, st, ld);
        if (wb) gather4(nr, wb, b, b_row_stride, st + wa, ld);
    } else {
        gather(nr * wa, [&](u32 i) { return __ldcg(a + i); },
               [&](u32 i, float v) { st[(i / wa) * ld + i % wa] = v; });
        if (wb)
            gather(nr * wb, [&](u32 i) { return __ldcg(b + (i / wb) * b_row_stride + i % wb); },
                   [&](u32 i, float v) { st[(i / wb) * ld + wa + i % wb] = v; });
    }
    __syncthreads();
}

// fc slice: dst[r·P + p0 + u] = W[u]·x_r + bias[u] for the block's FU units, rows < nr; W
// and x (both stride pad(in)) in shared memory. Thread: unit t/32, row t%32.
static __device__ void fc_slice(const float* W, const float* bias, const float* st, u32 in,
                                u32 nr, u32 p0, u32 P, float* dst) {
    const u32 u = threadIdx.x / 32, r = threadIdx.x % 32, ld = pad(in);
    const float* wr = W + u * ld;
    const float* x0 = st + r * ld;
    float a0 = 0.0f, a1 = 0.0f;
    if ((in & 3) == 0) {
        for (u32 k = 0; k < in; k += 8) {
            const float4 w = *reinterpret_cast<const float4*>(wr + k);
            const float4 v = *reinterpret_cast<const float4*>(x0 + k);
            a0 = fmaf(w.x, v.x, fmaf(w.y, v.y, fmaf(w.z, v.z, fmaf(w.w, v.w, a0))));
            if (k + 4 < in) {
                const float4 w2 = *reinterpret_cast<const float4*>(wr + k + 4);
                const float4 v2 = *reinterpret_cast<const float4*>(x0 + k + 4);
                a1 = fmaf(w2.x, v2.x, fmaf(w2.y, v2.y, fmaf(w2.z, v2.z, fmaf(w2.w, v2.w, a1))));
            }
        }
    } else {
        for (u32 k = 0; k < in; k++) a0 = fmaf(wr[k], x0[k], a0);
    }
    if (p0 + u < P && u < FU && r < nr) dst[(u64)r * P + p0 + u] = (a0 + a1) + bias[u];
}

// w: M packed members; emb: [B, T, E] encoder output; scratch: h [2][M][B][H], every
// block's own copy of z [grid][B][S], the head fc outputs [M][B][P] and the decoder's
// [M][B][P] (each part rounded up to 4 floats); out: [M, B, N, D]; mean: [B, N, D];
// dis: [B, N]; bar: 2 + 2M zeroed u32 (grid barrier, then one per member). Grid: M·BPM
// blocks, BPM = max(⌈H/16⌉, ⌈P/16⌉); dynamic shared memory as
// gpu_cuda::rollout::RolloutDims::smem_bytes. clustered: the launch groups each member's
// blocks into one cluster (cluster barriers replace the per-member ones).
extern "C" __global__ void __launch_bounds__(THREADS, 1)
rssm_rollout_f32(const float* __restrict__ w, const float* __restrict__ emb, float* scratch,
                 float* out, float* mean, float* dis, u32* bar, u32 M, u32 B, u32 T, u32 N,
                 u32 H, u32 S, u32 E, u32 P, u32 D, float eps, u32 clustered) {
    extern __shared__ float sm[];
    const Layout L = layout(H, S, E, P, D);
    const u32 GS = (H + GU - 1) / GU, FS = (P + FU - 1) / FU;
    const u32 BPM = max(GS, FS), DO = (D + BPM - 1) / BPM;
    const u32 m = blockIdx.x / BPM, s = blockIdx.x % BPM;
    const bool has_gru = s < GS, has_fc = s < FS;
    const u32 X = S + H, XL = pad(X), j0 = s * GU, p0 = s * FU;
    // This block's slice of the decoder's outputs: [o0, o0 + nd).
    const u32 o0 = min(s * DO, D), nd = min(DO, D - o0);
    const u32 in[3] = {H, H + E, H + S};
    const float* wm = w + (u64)m * L.size;
    // Shared memory (every region a multiple of 4 floats, so float4 rows stay aligned): the
    // GRU slice, the fc slices, the output layers, the stage. The host's size is
    // gpu_cuda::rollout::RolloutDims::smem_bytes, the same sums.
    const u32 PL = pad(P), S4 = (S + 3) & ~3u, DO4 = (DO + 3) & ~3u;
    float* gw = sm;                          // [3·GU][XL]: row g·GU + u = [W_ih row | W_hh row]
    float* gb = gw + 3 * GU * XL;            // [2][3·GU]: b_ih, b_hh
    float* fw[3];                            // [FU][pad(in_h)]
    fw[0] = gb + 6 * GU;
    fw[1] = fw[0] + FU * pad(in[0]);
    fw[2] = fw[1] + FU * pad(in[1]);
    float* fb = fw[2] + FU * pad(in[2]);     // [3][FU] (then 4 floats of padding)
    const u32 SPL4 = (S * PL + 3) & ~3u, DPL4 = (DO * PL + 3) & ~3u;
    float* om[2];                            // prior and posterior mean outputs [S][PL]
    om[0] = fb + 3 * FU + 4;
    om[1] = om[0] + SPL4;
    float* omb = om[1] + SPL4;               // [2][S4]
    float* od = omb + 2 * S4;                // the decoder's output slice [DO][PL]
    float* odb = od + DPL4;                  // [DO4]
    float* lg = odb + DO4;                   // [3][2][P]: γ, β per head
    float* st = lg + ((6 * P + 3) & ~3u);

    // Load this block's weights once.
    const Slices sl = {gw, gb, {fw[0], fw[1], fw[2]}, fb, {om[0], om[1]}, omb, od, odb, lg};
    load_slices(wm, L, H, S, E, P, j0, p0, FU, o0, nd, has_gru, has_fc, sl);

    // Scratch parts start at multiples of 4 floats (16 bytes: float4 rows stay aligned).
    const u64 MBH4 = ((u64)M * B * H + 3) & ~3ull, MBP4 = ((u64)M * B * P + 3) & ~3ull;
    const u64 BS4 = ((u64)B * S + 3) & ~3ull;
    float* hb[2] = {scratch, scratch + MBH4};
    float* z = scratch + 2 * MBH4 + (u64)blockIdx.x * BS4;   // this block's z [B][S]
    float* fcp = scratch + 2 * MBH4 + (u64)gridDim.x * BS4;  // the step's head fc [M][B][P]
    float* fcd = fcp + MBP4;                                 // the decoder's fc [M][B][P]
    u32* mbar = bar + 2 + 2 * m;
    u32 gg = 0, gm = 0;
    // The barrier among the member's blocks: the cluster's when launched as one, else through L2.
    auto member_barrier = [&]() {
        if (clustered)
            cluster_barrier();
        else
            barrier(mbar, BPM, gm);
    };
    // h₀ = 0 (this member's rows, split over its blocks), z₀ = 0 (this block's copy).
    const u64 mB = (u64)m * B;
    for (u64 i = (u64)s * blockDim.x + threadIdx.x; i < (u64)B * H; i += (u64)BPM * blockDim.x)
        hb[0][mB * H + i] = 0.0f;
    for (u32 i = threadIdx.x; i < B * S; i += blockDim.x) z[i] = 0.0f;
    member_barrier();

    int cur = 0;
    // z ← the mean output of head hd (LN + ReLU + output) of the fc outputs in fcp: every
    // block computes all of it for itself, so no barrier separates it from its users.
    auto z_from_fc = [&](int hd) {
        for (u32 r0 = 0; r0 < B; r0 += RB) {
            const u32 nr = min((u32)RB, B - r0);
            stage(st, fcp + (mB + r0) * P, P, nullptr, 0, 0, nr);
            norm_out(st, nr, P, lg + 2 * hd * P, lg + (2 * hd + 1) * P, eps, om[hd],
                     omb + hd * S4, S, z + (u64)r0 * S, S);
        }
        __syncthreads();
    };
    // The decoder of imagined step n: fc slices (from h in hb[c] and z), then, after a
    // barrier, every block's slice of the outputs.
    auto dec_fc = [&](int c) {
        if (!has_fc) return;
        for (u32 r0 = 0; r0 < B; r0 += RB) {
            const u32 nr = min((u32)RB, B - r0);
            stage(st, hb[c] + (mB + r0) * H, H, z + (u64)r0 * S, S, S, nr);
            fc_slice(fw[2], fb + 2 * FU, st, in[2], nr, p0, P, fcd + (mB + r0) * P);
        }
    };
    auto dec_out = [&](u32 n) {
        if (nd == 0) return;
        for (u32 r0 = 0; r0 < B; r0 += RB) {
            const u32 nr = min((u32)RB, B - r0);
            stage(st, fcd + (mB + r0) * P, P, nullptr, 0, 0, nr);
            norm_out(st, nr, P, lg + 4 * P, lg + 5 * P, eps, od, odb, nd,
                     out + ((mB + r0) * N + n) * D + o0, (u64)N * D);
        }
    };
#ifdef PROF  // the phase clocks (STAMP) go past the scratch this kernel uses
    long long* prof = reinterpret_cast<long long*>(fcd + MBP4 + 4);
#endif
    for (u32 t = 0; t < T + N; t++) {
        // Phase 1: z_{t−1} (locally); h_t = GRU(z_{t−1}, h_{t−1}); the decoder fc of imagined
        // step t − 1 − T.
        STAMP(0)
        if (t > 0) z_from_fc(t - 1 < T ? 1 : 0);
        STAMP(1)
        if (has_gru) {
            for (u32 r0 = 0; r0 < B; r0 += RB) {
                const u32 nr = min((u32)RB, B - r0);
                stage(st, z + (u64)r0 * S, S, hb[cur] + (mB + r0) * H, H, H, nr);
                STAMP(8)
                const u32 u = threadIdx.x / 32, r = threadIdx.x % 32, j = j0 + u;
                float ai[3] = {}, ah[3] = {};
                const float* x = st + r * XL;
                const float* wu = gw + u * XL;
                gru_dots(wu, GU * XL, x, 0, S, ai);
                gru_dots(wu, GU * XL, x, S, X, ah);
                if (j < H && u < GU && r < nr) {
                    const float rg = sigmoidf(ai[0] + gb[u] + ah[0] + gb[3 * GU + u]);
                    const float ug = sigmoidf(ai[1] + gb[GU + u] + ah[1] + gb[4 * GU + u]);
                    const float ng = tanhf(ai[2] + gb[2 * GU + u] + rg * (ah[2] + gb[5 * GU + u]));
                    hb[cur ^ 1][(mB + r0 + r) * H + j] = fmaf(ug, x[S + j] - ng, ng);
                }
            }
        }
        STAMP(2)
        if (t > T) dec_fc(cur);
        STAMP(3)
        member_barrier();
        STAMP(4)
        const int nxt = cur ^ 1;
        // Phase 2: the head fc of step t (posterior on [h, e_t] or prior on h); every block's
        // slice of the decoder outputs of imagined step t − 1 − T.
        const int hd = t < T ? 1 : 0;
        if (has_fc) {
            for (u32 r0 = 0; r0 < B; r0 += RB) {
                const u32 nr = min((u32)RB, B - r0);
                if (hd == 1)
                    stage(st, hb[nxt] + (mB + r0) * H, H, emb + ((u64)r0 * T + t) * E, E,
                          (u64)T * E, nr);
                else
                    stage(st, hb[nxt] + (mB + r0) * H, H, nullptr, 0, 0, nr);
                fc_slice(fw[hd], fb + hd * FU, st, in[hd], nr, p0, P, fcp + (mB + r0) * P);
            }
        }
        STAMP(5)
        if (t > T) dec_out(t - 1 - T);
        STAMP(6)
        member_barrier();
        STAMP(7)
        cur = nxt;
    }
    // The last imagined step: its z, decoder fc, decoder outputs; then the ensemble statistics.
    z_from_fc(0);
    dec_fc(cur);
    member_barrier();
    dec_out(N - 1);
    barrier(bar, gridDim.x, gg);
    ensemble_stats(out, mean, dis, M, B, N, D);
}
