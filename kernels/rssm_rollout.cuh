// Shared by the two fused rollout kernels: rssm_rollout.cu (activations exchanged through L2,
// any size) and rssm_rollout_cluster.cu (one thread-block cluster per member, activations in
// distributed shared memory). The math is in rssm_rollout.cu's header comment.
#pragma once

// Timing builds (-DPROF=BLOCK, scripts/rollout_ab.py): block BLOCK's clock at the phase ends of
// step t < T + N, into the kernel's `prof` (10 slots a step).
#ifdef PROF
#define STAMP(i) \
    if (blockIdx.x == PROF && threadIdx.x == 0 && t < T + N) prof[t * 10 + (i)] = clock64();
#else
#define STAMP(i)
#endif

typedef unsigned int u32;
typedef unsigned long long u64;

#define THREADS 512
#define GU 16   // GRU units per block
#define FU 16   // head fc units per block
#define RB 32   // rows staged at a time

// Offsets (in floats) of one member's packed weights, in gpu_cuda::rollout::member_layout's
// order.
struct Layout {
    u64 wih, whh, bih, bhh;
    u64 fc[3], fcb[3], g[3], b[3], out[3], outb[3];  // heads: 0 prior, 1 posterior, 2 decoder
    u64 size;
};

static __device__ Layout layout(u32 H, u32 S, u32 E, u32 P, u32 D) {
    Layout l;
    u64 o = 0;
    l.wih = o; o += (u64)3 * H * S;
    l.whh = o; o += (u64)3 * H * H;
    l.bih = o; o += 3 * H;
    l.bhh = o; o += 3 * H;
    const u32 in[3] = {H, H + E, H + S}, outs[3] = {2 * S, 2 * S, D};
    for (int h = 0; h < 3; h++) {
        l.fc[h] = o; o += (u64)P * in[h];
        l.fcb[h] = o; o += P;
        l.g[h] = o; o += P;
        l.b[h] = o; o += P;
        l.out[h] = o; o += (u64)outs[h] * P;
        l.outb[h] = o; o += outs[h];
    }
    l.size = o;
    return l;
}

// Barrier over `count` blocks sharing counter pair `b` (the launch is cooperative: all blocks
// are resident). The last to arrive resets the count and bumps the generation.
static __device__ __forceinline__ void barrier(u32* b, u32 count, u32& gen) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const u32 g = gen;
        __threadfence();
        if (atomicAdd(&b[0], 1u) == count - 1) {
            atomicExch(&b[0], 0u);
            __threadfence();
            atomicExch(&b[1], g + 1);
        } else {
            while (*(volatile u32*)&b[1] == g) {
            }
        }
        __threadfence();
    }
    gen++;
    __syncthreads();
}

// The member's blocks as one thread-block cluster (the host's choice on sm_90 and later, when
// they fit one): the hardware cluster barrier, release/acquire at cluster scope, which orders
// the blocks' global writes before their peers' reads. A build for an older GPU never takes it.
static __device__ __forceinline__ void cluster_barrier() {
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;"
                 ::: "memory");
#else
    __trap();
#endif
}

static __device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

static __device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// dst(i, src(i)) for i < n, with UNR loads in flight per thread (a plain loop keeps one
// L2 round trip in flight and is latency-bound).
#define UNR 8
template <typename Src, typename Dst>
static __device__ __forceinline__ void gather(u32 n, Src src, Dst dst) {
    for (u32 i0 = threadIdx.x; i0 < n; i0 += blockDim.x * UNR) {
        float v[UNR];
#pragma unroll
        for (int q = 0; q < UNR; q++) {
            const u32 i = i0 + q * blockDim.x;
            v[q] = i < n ? src(i) : 0.0f;
        }
#pragma unroll
        for (int q = 0; q < UNR; q++) {
            const u32 i = i0 + q * blockDim.x;
            if (i < n) dst(i, v[q]);
        }
    }
}

// Row stride in shared memory of rows of width w: w + 4 when w is a multiple of 4 (rows stay
// 16-byte aligned for float4 access; a stride of 4 mod 32 spreads 8 rows over all banks), else
// w + 1 (odd: rows on distinct banks).
static __device__ __forceinline__ u32 pad(u32 w) { return (w & 3) == 0 ? w + 4 : w + 1; }

// One block's weight slices in shared memory (each kernel's carve-up says where).
struct Slices {
    float *gw, *gb, *fw[3], *fb, *om[2], *omb, *od, *odb, *lg;
};

// Loads a block's slices once: GRU units [j0, j0 + GU), all three gates as [W_ih | W_hh] rows
// of stride pad(S + H), then their biases; head fc units [p0, p0 + fu) of each head (rows of
// stride pad(in)) and biases; the prior and posterior mean output layers (rows of stride
// pad(P)) and biases; decoder outputs [o0, o0 + nd); the heads' LayerNorm γ and β. Units past
// the end load as 0.
static __device__ void load_slices(const float* wm, const Layout& L, u32 H, u32 S, u32 E, u32 P,
                                   u32 j0, u32 p0, u32 fu, u32 o0, u32 nd, bool has_gru,
                                   bool has_fc, const Slices& w) {
    const u32 X = S + H, XL = pad(X), PL = pad(P), S4 = (S + 3) & ~3u;
    const u32 in[3] = {H, H + E, H + S};
    if (has_gru) {
        gather(3 * GU * X,
               [&](u32 i) {
                   const u32 row = i / X, k = i % X, g = row / GU, j = j0 + row % GU;
                   if (j >= H) return 0.0f;
                   return k < S ? wm[L.wih + (u64)(g * H + j) * S + k]
                                : wm[L.whh + (u64)(g * H + j) * H + k - S];
               },
               [&](u32 i, float v) { w.gw[(i / X) * XL + i % X] = v; });
        gather(6 * GU,
               [&](u32 i) {
                   const u32 part = i / (3 * GU), row = i % (3 * GU), j = j0 + row % GU;
                   return j < H ? wm[(part ? L.bhh : L.bih) + (row / GU) * H + j] : 0.0f;
               },
               [&](u32 i, float v) { w.gb[i] = v; });
    }
    if (has_fc) {
        for (int h = 0; h < 3; h++) {
            const u32 n = in[h];
            float* f = w.fw[h];
            gather(fu * n,
                   [&](u32 i) {
                       const u32 u = i / n;
                       return p0 + u < P ? wm[L.fc[h] + (u64)(p0 + u) * n + i % n] : 0.0f;
                   },
                   [&](u32 i, float v) { f[(i / n) * pad(n) + i % n] = v; });
            gather(fu, [&](u32 u) { return p0 + u < P ? wm[L.fcb[h] + p0 + u] : 0.0f; },
                   [&](u32 u, float v) { w.fb[h * fu + u] = v; });
        }
    }
    for (int h = 0; h < 2; h++) {
        float* o = w.om[h];
        gather(S * P, [&](u32 i) { return wm[L.out[h] + i]; },
               [&](u32 i, float v) { o[(i / P) * PL + i % P] = v; });
        gather(S, [&](u32 i) { return wm[L.outb[h] + i]; },
               [&](u32 i, float v) { w.omb[h * S4 + i] = v; });
    }
    gather(nd * P, [&](u32 i) { return wm[L.out[2] + (u64)o0 * P + i]; },
           [&](u32 i, float v) { w.od[(i / P) * PL + i % P] = v; });
    gather(nd, [&](u32 i) { return wm[L.outb[2] + o0 + i]; }, [&](u32 i, float v) { w.odb[i] = v; });
    for (int h = 0; h < 3; h++)
        gather(2 * P, [&](u32 i) { return wm[(i < P ? L.g[h] : L.b[h]) + i % P]; },
               [&](u32 i, float v) { w.lg[2 * h * P + i] = v; });
}

// LayerNorm (two-pass, f32) + ReLU of the staged rows (stride pad(P)) in place: a warp a row.
// PC: P as a compile-time constant (0: P as given), so that the loops unroll and their loads
// issue together (norm_out below picks it).
#define OPT 4
template <u32 PC>
static __device__ void norm_rows_p(float* st, u32 nr, u32 P_, const float* g, const float* be,
                                   float eps) {
    const u32 P = PC ? PC : P_;
    const u32 warp = threadIdx.x / 32, lane = threadIdx.x % 32, ld = pad(P);
    for (u32 r = warp; r < nr; r += blockDim.x / 32) {
        float* x = st + r * ld;
        float s = 0.0f;
#pragma unroll
        for (u32 k = lane; k < P; k += 32) s += x[k];
        const float mu = warp_sum(s) / (float)P;
        float v = 0.0f;
#pragma unroll
        for (u32 k = lane; k < P; k += 32) {
            const float d = x[k] - mu;
            v = fmaf(d, d, v);
        }
        const float rstd = rsqrtf(warp_sum(v) / (float)P + eps);
        __syncwarp();
#pragma unroll
        for (u32 k = lane; k < P; k += 32) x[k] = fmaxf(fmaf((x[k] - mu) * rstd, g[k], be[k]), 0.0f);
    }
}

// dst[r·dst_stride + o] = Wo[o]·y_r + bo[o] for rows r < nr, o < O (Wo and y stride pad(P)):
// thread t takes row t/16 and outputs t%16, t%16 + 16, ... (independent accumulators).
template <u32 PC>
static __device__ void out_rows_p(const float* st, u32 nr, u32 P_, const float* Wo, const float* bo,
                                  u32 O, float* dst, u64 dst_stride) {
    const u32 P = PC ? PC : P_, ld = pad(P);
    const u32 r = threadIdx.x / 16, og = threadIdx.x % 16;
    if (r < nr) {
        const float* x = st + r * ld;
        for (u32 o0 = og; o0 < O; o0 += 16 * OPT) {
            float a[OPT] = {};
            if ((P & 3) == 0) {
#pragma unroll 8
                for (u32 k = 0; k < P; k += 4) {
                    const float4 v = *reinterpret_cast<const float4*>(x + k);
#pragma unroll
                    for (int i = 0; i < OPT; i++) {
                        const u32 o = o0 + 16 * i;
                        if (o < O) {
                            const float4 w = *reinterpret_cast<const float4*>(Wo + o * ld + k);
                            a[i] = fmaf(w.x, v.x, fmaf(w.y, v.y, fmaf(w.z, v.z, fmaf(w.w, v.w, a[i]))));
                        }
                    }
                }
            } else {
                for (u32 k = 0; k < P; k++) {
#pragma unroll
                    for (int i = 0; i < OPT; i++) {
                        const u32 o = o0 + 16 * i;
                        if (o < O) a[i] = fmaf(Wo[o * ld + k], x[k], a[i]);
                    }
                }
            }
#pragma unroll
            for (int i = 0; i < OPT; i++) {
                const u32 o = o0 + 16 * i;
                if (o < O) dst[r * dst_stride + o] = a[i] + bo[o];
            }
        }
    }
}

// norm_rows_p, then out_rows_p.
template <u32 PC>
static __device__ void norm_out_p(float* st, u32 nr, u32 P_, const float* g, const float* be,
                                  float eps, const float* Wo, const float* bo, u32 O, float* dst,
                                  u64 dst_stride) {
    norm_rows_p<PC>(st, nr, P_, g, be, eps);
    __syncthreads();
    out_rows_p<PC>(st, nr, P_, Wo, bo, O, dst, dst_stride);
}

// The three with the model's default head width (128) compiled in.
static __device__ void norm_rows(float* st, u32 nr, u32 P, const float* g, const float* be,
                                 float eps) {
    if (P == 128)
        norm_rows_p<128>(st, nr, P, g, be, eps);
    else
        norm_rows_p<0>(st, nr, P, g, be, eps);
}
static __device__ void out_rows(const float* st, u32 nr, u32 P, const float* Wo, const float* bo,
                                u32 O, float* dst, u64 dst_stride) {
    if (P == 128)
        out_rows_p<128>(st, nr, P, Wo, bo, O, dst, dst_stride);
    else
        out_rows_p<0>(st, nr, P, Wo, bo, O, dst, dst_stride);
}
static __device__ void norm_out(float* st, u32 nr, u32 P, const float* g, const float* be,
                                float eps, const float* Wo, const float* bo, u32 O, float* dst,
                                u64 dst_stride) {
    if (P == 128)
        norm_out_p<128>(st, nr, P, g, be, eps, Wo, bo, O, dst, dst_stride);
    else
        norm_out_p<0>(st, nr, P, g, be, eps, Wo, bo, O, dst, dst_stride);
}

// acc[g] += Σ_{k0 <= k < k1} W[g·gs + k]·x[k] for the three gates g (rows gs apart); float4
// steps when k0 and k1 are multiples of 4 (rows 16-byte aligned).
static __device__ __forceinline__ void gru_dots(const float* W, u32 gs, const float* x, u32 k0,
                                                u32 k1, float (&acc)[3]) {
    if (((k0 | k1) & 3) == 0) {
        for (u32 k = k0; k < k1; k += 4) {
            const float4 v = *reinterpret_cast<const float4*>(x + k);
#pragma unroll
            for (int g = 0; g < 3; g++) {
                const float4 w = *reinterpret_cast<const float4*>(W + g * gs + k);
                acc[g] = fmaf(w.x, v.x, fmaf(w.y, v.y, fmaf(w.z, v.z, fmaf(w.w, v.w, acc[g]))));
            }
        }
    } else {
        for (u32 k = k0; k < k1; k++) {
            const float v = x[k];
#pragma unroll
            for (int g = 0; g < 3; g++) acc[g] = fmaf(W[g * gs + k], v, acc[g]);
        }
    }
}

// The ensemble statistics over the members' outputs out [M, B, N, D] (written by every block
// before a grid-wide barrier): mean [B, N, D] and the disagreement [B, N], the population
// variance over members averaged over outputs.
static __device__ void ensemble_stats(const float* out, float* mean, float* dis, u32 M, u32 B,
                                      u32 N, u32 D) {
    const u32 warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (u64 p = (u64)blockIdx.x * (blockDim.x / 32) + warp; p < (u64)B * N;
         p += (u64)gridDim.x * (blockDim.x / 32)) {
        float v = 0.0f;
        for (u32 d = lane; d < D; d += 32) {
            float sum = 0.0f;
            for (u32 k = 0; k < M; k++) sum += __ldcg(out + ((u64)k * B * N + p) * D + d);
            const float mu = sum / (float)M;
            float q = 0.0f;
            for (u32 k = 0; k < M; k++) {
                const float e = __ldcg(out + ((u64)k * B * N + p) * D + d) - mu;
                q = fmaf(e, e, q);
            }
            mean[p * D + d] = mu;
            v += q / (float)M;
        }
        v = warp_sum(v);
        if (lane == 0) dis[p] = v / (float)D;
    }
}
