// Templates of the NN elementwise kernels, on the element storage type T (float or bf16, see
// nn_elem_io.cuh): broadcasting binary ops, activations forward and backward, affine, dropout,
// dtype conversion, block copies and permutes. CPU reference: gpu_core::cpu::elementwise; every
// value is computed in f32 by the f32 formula and stored with one rounding to T.
// nn_elementwise.cu instantiates the f32 kernels, nn_bf16.cu the bf16 ones.
//
// Streaming kernels are grid-stride loops over 4 elements (16-byte float4 for f32, 8 bytes for
// bf16; pool buffers are 256-byte aligned) with a scalar tail. The unary bf16 kernels (casts
// from bf16, activations, affine, dropout) run `stream2`: two vectors a step, with the next
// step's loads issued before this step's arithmetic. Index math uses 32-bit
// magic-number division when the element count is below 2^31 and plain 64-bit division
// otherwise.
#pragma once

#include "nn_elem_io.cuh"
#include "dropout_hash.cuh"

// ---------------------------------------------------------------------------------------------
// Helpers

static __device__ __forceinline__ u64 global_tid() {
    return (u64)blockIdx.x * blockDim.x + threadIdx.x;
}
static __device__ __forceinline__ u64 grid_threads() { return (u64)gridDim.x * blockDim.x; }

// Division by a fixed d in [1, 2^31) of numerators below 2^31 (Granlund-Montgomery, as
// PyTorch's IntDivider): q = (umulhi(n, m) + n) >> s.
struct FastDiv {
    u32 d, m, s;
};

static __device__ __forceinline__ FastDiv fastdiv_make(u32 d) {
    u32 s = 0;
    while (s < 32 && (1ull << s) < d) ++s;
    const u64 m = ((1ull << 32) * ((1ull << s) - d)) / d + 1;
    FastDiv f;
    f.d = d;
    f.m = (u32)m;
    f.s = s;
    return f;
}

static __device__ __forceinline__ u32 fastdiv(const FastDiv& f, u32 n) {
    return (__umulhi(n, f.m) + n) >> f.s;
}

// The grid-stride loop of a 2-byte stream over n4 vectors: `load(i)` reads vector i's inputs,
// `run(i, v)` computes and stores it. Each thread takes vectors i and i + stride a step and
// issues the next step's loads before this step's arithmetic, so an 8-byte bf16 vector's
// arithmetic (GELU's exponentials, dropout's hashes) overlaps the next loads. Ends with i at
// the first vector it left to the caller's plain loop (at most one).
template <class Load, class Run>
static __device__ __forceinline__ u64 stream2(u64 n4, Load load, Run run) {
    const u64 stride = grid_threads();
    u64 i = global_tid();
    if (i + stride >= n4) return i;
    auto a = load(i), b = load(i + stride);
    for (;;) {
        const u64 j = i + 2 * stride;
        const bool more = j + stride < n4;
        decltype(a) na = a, nb = b;
        if (more) {
            na = load(j);
            nb = load(j + stride);
        }
        run(i, a);
        run(i + stride, b);
        i = j;
        if (!more) return i;
        a = na;
        b = nb;
    }
}

// out[k] = f(x[k]) for k < n (f4: four elements in a float4, f1: one), in f32 between the loads
// and the stores: the grid-stride loop over float4 vectors (2-byte inputs through stream2), then
// the last n % 4 elements. Conversion, activations' forwards and affine.
template <class TI, class TO, class F4, class F1>
static __device__ __forceinline__ void map_impl(const TI* __restrict__ x, TO* __restrict__ out,
                                                u64 n, F4 f4, F1 f1) {
    const u64 n4 = n / 4, stride = grid_threads();
    u64 i = global_tid();
    if constexpr (sizeof(TI) == 2)
        i = stream2(n4, [&](u64 k) { return load4(x, k); },
                    [&](u64 k, float4 v) { store4(out, k, f4(v)); });
    for (; i < n4; i += stride) store4(out, i, f4(load4(x, i)));
    const u64 t = n4 * 4 + global_tid();
    if (t < n) store(out, t, f1(load(x, t)));
}

// ---------------------------------------------------------------------------------------------
// Conversion: out[k] = x[k], widened exactly or rounded once to nearest even.

template <class TI, class TO>
static __device__ void convert_impl(const TI* __restrict__ x, TO* __restrict__ out, u64 n) {
    map_impl(x, out, n, [](float4 v) { return v; }, [](float v) { return v; });
}

// ---------------------------------------------------------------------------------------------
// Binary operations with broadcasting

struct OpAdd {
    static __device__ __forceinline__ float f(float a, float b) { return a + b; }
};
struct OpSub {
    static __device__ __forceinline__ float f(float a, float b) { return a - b; }
};
struct OpMul {
    static __device__ __forceinline__ float f(float a, float b) { return a * b; }
};
// IEEE division (nvcc's default -prec-div=true): x/0 = ±inf, 0/0 = NaN, as on the CPU.
struct OpDiv {
    static __device__ __forceinline__ float f(float a, float b) { return a / b; }
};

template <class Op>
static __device__ __forceinline__ float4 op4(float4 a, float4 b) {
    return make_float4(Op::f(a.x, b.x), Op::f(a.y, b.y), Op::f(a.z, b.z), Op::f(a.w, b.w));
}

// Same shapes: out[k] = a[k] ∘ b[k].
template <class Op, class T>
static __device__ void binary_same(const T* __restrict__ a, const T* __restrict__ b,
                                   T* __restrict__ out, u64 n) {
    constexpr int N = V16<T>::N;
    const u64 nv = n / N, stride = grid_threads();
    for (u64 i = global_tid(); i < nv; i += stride) {
        float x[N], y[N];
        load16(a, i, x);
        load16(b, i, y);
#pragma unroll
        for (int k = 0; k < N; ++k) x[k] = Op::f(x[k], y[k]);
        store16(out, i, x);
    }
    const u64 t = nv * N + global_tid();
    if (t < n) store(out, t, Op::f(load(a, t), load(b, t)));
}

// out viewed as [n / cols, cols]; `big` has n elements, `small` one per column (mode 0: a bias
// over the trailing dims) or one per row (mode 1). small_is_a puts `small` on the left.
// The (row, col) of each thread's element is advanced incrementally: one division per thread.
template <class Op>
static __device__ __forceinline__ float apply2(float x, float s, u32 small_is_a) {
    return small_is_a ? Op::f(s, x) : Op::f(x, s);
}

template <class Op, class T>
static __device__ void binary_2d(const T* __restrict__ big, const T* __restrict__ small,
                                 T* __restrict__ out, u64 n, u64 cols, u32 mode,
                                 u32 small_is_a) {
    const u64 tid = global_tid(), stride = grid_threads();
    constexpr int N = V16<T>::N;
    if (cols % N == 0) {
        // 16-byte units (the 4-wide path below is this one for f32).
        const u64 cv = cols / N, nv = n / N;
        u64 r = tid / cv, c = tid - r * cv;
        const u64 dr = stride / cv, dc = stride - dr * cv;
        for (u64 k = tid; k < nv; k += stride) {
            float x[N], sm[N];
            load16(big, k, x);
            if (mode == 0) {
                load16(small, c, sm);
            } else {
                const float v = load(small, r);
#pragma unroll
                for (int e = 0; e < N; ++e) sm[e] = v;
            }
#pragma unroll
            for (int e = 0; e < N; ++e) x[e] = apply2<Op>(x[e], sm[e], small_is_a);
            store16(out, k, x);
            c += dc;
            r += dr;
            if (c >= cv) {
                c -= cv;
                ++r;
            }
        }
    } else if ((cols & 3) == 0) {
        const u64 c4 = cols / 4, n4 = n / 4;
        u64 r = tid / c4, c = tid - r * c4;
        const u64 dr = stride / c4, dc = stride - dr * c4;
        for (u64 k = tid; k < n4; k += stride) {
            const float4 x = load4(big, k);
            float4 s;
            if (mode == 0) {
                s = load4(small, c);
            } else {
                const float v = load(small, r);
                s = make_float4(v, v, v, v);
            }
            store4(out, k, small_is_a ? op4<Op>(s, x) : op4<Op>(x, s));
            c += dc;
            r += dr;
            if (c >= c4) {
                c -= c4;
                ++r;
            }
        }
    } else {
        u64 r = tid / cols, c = tid - r * cols;
        const u64 dr = stride / cols, dc = stride - dr * cols;
        for (u64 k = tid; k < n; k += stride) {
            const float s = mode == 0 ? load(small, c) : load(small, r);
            store(out, k, apply2<Op>(load(big, k), s, small_is_a));
            c += dc;
            r += dr;
            if (c >= cols) {
                c -= cols;
                ++r;
            }
        }
    }
}

// General broadcasting over up to 6 dims. dims are given innermost first (d0 is the last dim);
// bit k of amask / bmask is set when a / b varies along dim k (else it is broadcast there).
template <class Op, class T>
static __device__ void binary_nd(const T* __restrict__ a, const T* __restrict__ b,
                                 T* __restrict__ out, u64 n, u32 rank, u64 d0, u64 d1, u64 d2,
                                 u64 d3, u64 d4, u64 d5, u32 amask, u32 bmask) {
    const u64 d[6] = {d0, d1, d2, d3, d4, d5};
    u64 sa[6], sb[6];
    u64 pa = 1, pb = 1;
#pragma unroll
    for (int k = 0; k < 6; ++k) {
        const bool va = k < (int)rank && ((amask >> k) & 1u);
        const bool vb = k < (int)rank && ((bmask >> k) & 1u);
        sa[k] = va ? pa : 0;
        sb[k] = vb ? pb : 0;
        if (va) pa *= d[k];
        if (vb) pb *= d[k];
    }
    const u64 stride = grid_threads();
    if (n < (1ull << 31)) {
        FastDiv fd[6];
        u32 sa32[6], sb32[6];
#pragma unroll
        for (int k = 0; k < 6; ++k) {
            fd[k] = fastdiv_make(k < (int)rank ? (u32)d[k] : 1u);
            sa32[k] = (u32)sa[k];
            sb32[k] = (u32)sb[k];
        }
        for (u32 i = (u32)global_tid(); i < (u32)n; i += (u32)stride) {
            u32 rem = i, ia = 0, ib = 0;
#pragma unroll
            for (int k = 0; k < 6; ++k) {
                if (k < (int)rank) {
                    const u32 q = fastdiv(fd[k], rem);
                    const u32 c = rem - q * fd[k].d;
                    ia += c * sa32[k];
                    ib += c * sb32[k];
                    rem = q;
                }
            }
            store(out, i, Op::f(load(a, ia), load(b, ib)));
        }
    } else {
        for (u64 i = global_tid(); i < n; i += stride) {
            u64 rem = i, ia = 0, ib = 0;
#pragma unroll
            for (int k = 0; k < 6; ++k) {
                if (k < (int)rank) {
                    const u64 q = rem / d[k];
                    const u64 c = rem - q * d[k];
                    ia += c * sa[k];
                    ib += c * sb[k];
                    rem = q;
                }
            }
            store(out, i, Op::f(load(a, ia), load(b, ib)));
        }
    }
}

// The three binary kernels of one op on element type T, named <kind>_<NAME>_<SUFFIX>.
#define BINARY_KERNELS(NAME, OP, T, SUFFIX)                                                      \
    extern "C" __global__ void binary_same_##NAME##_##SUFFIX(                                    \
        const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, u64 n) {          \
        binary_same<OP, T>(a, b, out, n);                                                        \
    }                                                                                            \
    extern "C" __global__ void binary_2d_##NAME##_##SUFFIX(                                      \
        const T* __restrict__ big, const T* __restrict__ small, T* __restrict__ out, u64 n,      \
        u64 cols, u32 mode, u32 small_is_a) {                                                    \
        binary_2d<OP, T>(big, small, out, n, cols, mode, small_is_a);                            \
    }                                                                                            \
    extern "C" __global__ void binary_nd_##NAME##_##SUFFIX(                                      \
        const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, u64 n, u32 rank,  \
        u64 d0, u64 d1, u64 d2, u64 d3, u64 d4, u64 d5, u32 amask, u32 bmask) {                  \
        binary_nd<OP, T>(a, b, out, n, rank, d0, d1, d2, d3, d4, d5, amask, bmask);              \
    }

// ---------------------------------------------------------------------------------------------
// Activations

// The activations (constants ACT_*, ActSaves, FOR_EACH_ACTIVATION) come from the op vocabulary,
// gpu_core::nn::Activation, through the generated header; the f32 formulas live here. An
// activation without a formula below fails to compile.
#include "nn_activations.cuh"

template <int A>
inline constexpr bool no_formula = false;

static __device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

// Φ(x) = erfc(−x/√2)/2: the exact GELU's CDF, accurate in both tails (1 + erf(x/√2) would
// cancel for negative x). The rounding error e of z = −x/√2 in f32 would cost a relative
// 2z²·2^-24 in the tail (4e-6 at x = −8), so it is computed exactly (fma, plus the low part
// of 1/√2) and corrected for to first order: erfc(z + e) ≈ erfc(z) − e·(2/√π)·exp(−z²).
static __device__ __forceinline__ float normcdf_(float x) {
    const float c_hi = 0.70710676908493042f, c_lo = 1.2101617104478970e-08f;
    const float z = -x * c_hi;
    const float e = fabsf(x) < 1e30f ? fmaf(-x, c_hi, -z) - x * c_lo : 0.0f;
    return 0.5f * fmaf(-1.1283791670955126f * e, expf(-z * z), erfcf(z));
}

// GELU for the bf16 kernels. Their results keep 8 significant bits, so Φ needs a relative
// error far below 2^-9 rather than the f32 kernel's few ulps, and the exact erfcf (with its
// tail correction) made GELU the one bf16 stream bound by arithmetic. Here, for a = |x|/√2,
//   Φ(−|x|) = erfc(a)/2 = t·exp(P(t) − a²)/2,  t = 1/(1 + a/2),
// Numerical Recipes' erfcc form with P a degree-5 polynomial fitted (iteratively reweighted
// least squares, f32 coefficients) to ln(erfc(a)·exp(a²)/t) over a in [0, 11]: with f32 t and
// f32 Horner steps, |P(t) − ln(erfc(a)·exp(a²)/t)| < 7.9e-6 there (checked at 400,001 points;
// a > 10.6 is x < −15, where GELU is 0 in bf16). t from rcp.approx and the exponential from
// ex2.approx (both within ~2^-22 relative) add ~1e-6, and the exponent's rounding a relative
// ~2^-24·log2(e)·a²·ln 2 per unit of a² (below 1e-6·a²), so the formula's relative error is
// below 1e-5 + 1e-6·a² before the rounding to bf16 (tested over every bf16 input against the
// exact f32 reference). For x < −1 the exponential is taken times 2^64 and the product scaled
// back last, so results in f32's subnormal range are one rounding of the formula's value
// (ex2.approx flushes subnormals). −inf gives −0 (the leading x clamped to −FLT_MAX), +inf
// gives +inf, NaN gives NaN.
static __device__ __forceinline__ float ex2_approx(float v) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
    return r;
}
static __device__ __forceinline__ float rcp_approx(float v) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
    return r;
}
// P(t)·log2(e) − 1, and the same + 64 (the far case's 2^64): the exponent's polynomial part in
// base 2, with Φ's 1/2 folded in (each coefficient the f32 rounding of the fit's times log2 e).
static __device__ __forceinline__ float erfcc_poly2(float t, float c0) {
    float p = 0.33007732033729553f;
    p = fmaf(p, t, -1.0231536626815796f);
    p = fmaf(p, t, 0.6845570802688599f);
    p = fmaf(p, t, 0.3670799136161804f);
    p = fmaf(p, t, 1.4686840772628784f);
    return fmaf(p, t, c0);
}
#define GELU_C0 -2.8272335529327393f      // c0·log2(e) − 1
#define GELU_C0_FAR 61.172767639160156f   // c0·log2(e) − 1 + 64
#define GELU_M_HALF_LOG2E -0.7213475108146667f
#define GELU_TWO_M64 5.421010862427522e-20f  // 2^-64

// max.NaN: the larger of a and b, NaN if either is.
static __device__ __forceinline__ float fmax_nan(float a, float b) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

// Φ(−|x|) = t·2^(P(t)·log2 e − 1 − x²·log2(e)/2), times 2^64 when far (x < −1).
static __device__ __forceinline__ float gelu_tail_bf16(float x, bool far) {
    const float t = rcp_approx(fmaf(0.35355339059327376f, fabsf(x), 1.0f));  // a/2 = |x|/(2√2)
    const float p = erfcc_poly2(t, far ? GELU_C0_FAR : GELU_C0);
    return t * ex2_approx(fmaf(x, x * GELU_M_HALF_LOG2E, p));
}

static __device__ __forceinline__ float gelu_fwd_bf16(float x) {
    const bool far = x < -1.0f;
    const float e = gelu_tail_bf16(x, far);
    // x·Φ(x): Φ = e for x <= 0 (x scaled by 2^-64 first when far: exact, and the product is one
    // rounding even into f32's subnormals), 1 − e above; x clamped to −FLT_MAX (−inf gives −0,
    // not −inf·0) with NaN kept.
    const float xm = fmax_nan(x, -3.40282347e38f) * (far ? GELU_TWO_M64 : 1.0f);
    return xm * (x > 0.0f ? 1.0f - e : e);
}

// gelu'(x)·g = (Φ(x) + x·φ(x))·g with both terms as multiples of G = exp(−x²/2) (times 2^64
// when far): Φ(−|x|) = G·q, q = t·exp(P(t))/2, and x·φ(x) = G·x/√(2π). The ±inf limits are 0
// and 1 (x clamped to ±FLT_MAX, so G = 0 meets a finite factor). Near gelu's minimum
// (x ≈ −0.752) the two terms cancel: the error there is relative to Φ(x) + |x|·φ(x).
static __device__ __forceinline__ float gelu_bwd_bf16(float x, float g) {
    const bool far = x < -1.0f;
    const float t = rcp_approx(fmaf(0.35355339059327376f, fabsf(x), 1.0f));
    const float G = ex2_approx(fmaf(x, x * GELU_M_HALF_LOG2E, far ? 64.0f : 0.0f));
    const float q = t * ex2_approx(erfcc_poly2(t, GELU_C0));
    const float cx = 0.3989422804014327f * fminf(fmaxf(x, -3.40282347e38f), 3.40282347e38f);
    const float d = x <= 0.0f ? (G * (q + cx)) * (far ? GELU_TWO_M64 : 1.0f) : fmaf(G, cx - q, 1.0f);
    return d * g;
}

template <int A>
static __device__ __forceinline__ float act_fwd(float x) {
    if constexpr (A == ACT_RELU) {
        return x < 0.0f ? 0.0f : x;  // keeps NaN
    } else if constexpr (A == ACT_GELU) {
        // The limits at −inf are 0: the leading factor x is clamped to −FLT_MAX (one max, no
        // branch), so −inf gives −FLT_MAX·0 = −0 where −inf·0 or −inf/inf would be NaN; a NaN x
        // still gives NaN through the other factor.
        return fmaxf(x, -3.40282347e38f) * normcdf_(x);
    } else if constexpr (A == ACT_SILU) {
        return fmaxf(x, -3.40282347e38f) / (1.0f + expf(-x));
    } else if constexpr (A == ACT_SIGMOID) {
        return sigmoidf_(x);
    } else if constexpr (A == ACT_TANH) {
        return tanhf(x);
    } else if constexpr (A == ACT_EXP) {
        return expf(x);
    } else if constexpr (A == ACT_LOG) {
        return logf(x);
    } else {
        static_assert(no_formula<A>, "activation without a CUDA forward formula");
    }
}

// dx = f'(x)·dy; relu is a select (dy = NaN with x <= 0 gives 0, as in PyTorch). gelu' and
// silu' tend to 1 at +inf and 0 at −inf; the x·pdf and x·s(−x) terms are 0 there, taken as such
// (x·0 would be NaN at ±inf).
template <int A>
static __device__ __forceinline__ float act_bwd(float x, float y, float g) {
    if constexpr (A == ACT_RELU) {
        return x > 0.0f ? g : 0.0f;
    } else if constexpr (A == ACT_GELU) {
        const float pdf = 0.3989422804014327f * expf(-0.5f * x * x);
        return (normcdf_(x) + (pdf > 0.0f ? x * pdf : 0.0f)) * g;
    } else if constexpr (A == ACT_SILU) {
        if (x == -INFINITY) return 0.0f * g;
        // 1 − s(x) as s(−x): accurate where s(x) ≈ 1 (1.0f − s would keep only a few bits).
        const float sm = sigmoidf_(-x);
        return sigmoidf_(x) * (1.0f + (sm > 0.0f ? x * sm : 0.0f)) * g;
    } else if constexpr (A == ACT_SIGMOID) {
        return y * (1.0f - y) * g;
    } else if constexpr (A == ACT_TANH) {
        return fmaf(-y, y, 1.0f) * g;  // one rounding: accurate where y² ≈ 1
    } else if constexpr (A == ACT_EXP) {
        return y * g;
    } else if constexpr (A == ACT_LOG) {
        return g / x;
    } else {
        static_assert(no_formula<A>, "activation without a CUDA backward formula");
    }
}

// The formulas a kernel on element type T uses: bf16's GELU has its own (gelu_fwd_bf16 and
// gelu_bwd_bf16), every other activation the f32 kernel's.
template <int A, class T>
static __device__ __forceinline__ float act_fwd_t(float x) {
    if constexpr (A == ACT_GELU && sizeof(T) == 2) {
        return gelu_fwd_bf16(x);
    } else {
        return act_fwd<A>(x);
    }
}
template <int A, class T>
static __device__ __forceinline__ float act_bwd_t(float x, float y, float g) {
    if constexpr (A == ACT_GELU && sizeof(T) == 2) {
        return gelu_bwd_bf16(x, g);
    } else {
        return act_bwd<A>(x, y, g);
    }
}
template <int A, class T>
static __device__ __forceinline__ float4 act_fwd4(float4 v) {
    return make_float4(act_fwd_t<A, T>(v.x), act_fwd_t<A, T>(v.y), act_fwd_t<A, T>(v.z),
                       act_fwd_t<A, T>(v.w));
}
template <int A, class T>
static __device__ __forceinline__ float4 act_bwd4(float4 x, float4 y, float4 g) {
    return make_float4(act_bwd_t<A, T>(x.x, y.x, g.x), act_bwd_t<A, T>(x.y, y.y, g.y),
                       act_bwd_t<A, T>(x.z, y.z, g.z), act_bwd_t<A, T>(x.w, y.w, g.w));
}

template <int A, class T>
static __device__ void activation_fwd(const T* __restrict__ x, T* __restrict__ out, u64 n) {
    map_impl(
        x, out, n, [](float4 v) { return act_fwd4<A, T>(v); },
        [](float v) { return act_fwd_t<A, T>(v); });
}

template <int A, class T>
static __device__ void activation_bwd(const T* __restrict__ x, const T* __restrict__ y,
                                      const T* __restrict__ dy, T* __restrict__ dx, u64 n) {
    const u64 n4 = n / 4, stride = grid_threads();
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    u64 i = global_tid();
    if constexpr (sizeof(T) == 2) {
        struct In {
            float4 x, y, g;
        };
        i = stream2(
            n4,
            [&](u64 k) {
                return In{ActSaves<A>::x ? load4(x, k) : zero, ActSaves<A>::y ? load4(y, k) : zero,
                          load4(dy, k)};
            },
            [&](u64 k, const In& v) { store4(dx, k, act_bwd4<A, T>(v.x, v.y, v.g)); });
    }
    for (; i < n4; i += stride) {
        const float4 xv = ActSaves<A>::x ? load4(x, i) : zero;
        const float4 yv = ActSaves<A>::y ? load4(y, i) : zero;
        store4(dx, i, act_bwd4<A, T>(xv, yv, load4(dy, i)));
    }
    const u64 t = n4 * 4 + global_tid();
    if (t < n) {
        const float xv = ActSaves<A>::x ? load(x, t) : 0.0f;
        const float yv = ActSaves<A>::y ? load(y, t) : 0.0f;
        store(dx, t, act_bwd_t<A, T>(xv, yv, load(dy, t)));
    }
}

// The forward and backward kernels of activation A on element type T, named _<NAME>_<SUFFIX>.
// The backward is compiled for at least BWD_MIN_BLOCKS blocks of 256 threads a multiprocessor
// (a register cap): it streams three tensors, and the loads in flight that occupancy buys can
// matter more than registers (the bf16 kernels take 6, see nn_bf16.cu).
#define ACTIVATION_KERNELS(NAME, A, T, SUFFIX, BWD_MIN_BLOCKS)                                   \
    extern "C" __global__ void act_fwd_##NAME##_##SUFFIX(const T* __restrict__ x,                \
                                                         T* __restrict__ out, u64 n) {           \
        activation_fwd<A, T>(x, out, n);                                                         \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(256, BWD_MIN_BLOCKS)                           \
        act_bwd_##NAME##_##SUFFIX(const T* __restrict__ x,                                       \
                                                         const T* __restrict__ y,                \
                                                         const T* __restrict__ dy,               \
                                                         T* __restrict__ dx, u64 n) {            \
        activation_bwd<A, T>(x, y, dy, dx, n);                                                   \
    }

// ---------------------------------------------------------------------------------------------
// Affine and dropout

// out = fmaf(mul, x, add): one rounding in f32, as the CPU's f32::mul_add.
template <class T>
static __device__ void affine_impl(const T* __restrict__ x, T* __restrict__ out, u64 n,
                                   float mul, float add) {
    map_impl(
        x, out, n,
        [&](float4 v) {
            return make_float4(fmaf(mul, v.x, add), fmaf(mul, v.y, add), fmaf(mul, v.z, add),
                               fmaf(mul, v.w, add));
        },
        [&](float v) { return fmaf(mul, v, add); });
}

// The hash and its tie (dropout_hash.cuh): gpu_core::nn::elementwise::dropout_keep.
// Keep flags of elements 8·u .. 8·u + 7: byte e of the result is 0xFF when element 8·u + e is
// kept, else 0 (bytes 0..3 in .x). Byte-wise SIMD compares of the hash against t's top byte.
static __device__ __forceinline__ uint2 dropout_keep8(u64 seed, u64 u, u32 t) {
    const u64 z = splitmix_at(seed, u);
    const u32 tb = (t >> 16) * 0x01010101u;
    u32 k[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const u32 w = h == 0 ? (u32)z : (u32)(z >> 32);
        k[h] = __vcmpgtu4(w, tb);
        const u32 tie = __vcmpeq4(w, tb);
        if (tie != 0u) {
            for (int e = 0; e < 4; ++e)
                if (((tie >> (8 * e)) & 1u) && dropout_low_keep(seed, 8 * u + 4 * h + e, t))
                    k[h] |= 0xFFu << (8 * e);
        }
    }
    return make_uint2(k[0], k[1]);
}

// Eight elements as loaded: one 16-byte unit of bf16, two float4 of f32.
template <class T>
struct Pack8;
template <>
struct Pack8<bf16> {
    uint4 r;
    __device__ __forceinline__ float at(int k) const {
        const u32 w = k < 2 ? r.x : k < 4 ? r.y : k < 6 ? r.z : r.w;
        return (k & 1) ? __uint_as_float(w & 0xFFFF0000u) : __uint_as_float(w << 16);
    }
};
template <>
struct Pack8<float> {
    float4 a, b;
    __device__ __forceinline__ float at(int k) const {
        const float4& v = k < 4 ? a : b;
        const int j = k & 3;
        return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
    }
};
static __device__ __forceinline__ Pack8<bf16> load8(const bf16* p, u64 u) {
    return Pack8<bf16>{reinterpret_cast<const uint4*>(p)[u]};
}
static __device__ __forceinline__ Pack8<float> load8(const float* p, u64 u) {
    const float4* q = reinterpret_cast<const float4*>(p);
    return Pack8<float>{q[2 * u], q[2 * u + 1]};
}
static __device__ __forceinline__ void store8(bf16* p, u64 u, const float (&v)[8]) {
    reinterpret_cast<uint4*>(p)[u] =
        make_uint4(float2_to_bf16x2(v[0], v[1]), float2_to_bf16x2(v[2], v[3]),
                   float2_to_bf16x2(v[4], v[5]), float2_to_bf16x2(v[6], v[7]));
}
static __device__ __forceinline__ void store8(float* p, u64 u, const float (&v)[8]) {
    float4* q = reinterpret_cast<float4*>(p);
    q[2 * u] = make_float4(v[0], v[1], v[2], v[3]);
    q[2 * u + 1] = make_float4(v[4], v[5], v[6], v[7]);
}

// out[i] = keep(seed, i) ? x[i]·s : 0 with s = 1/(1 − p) rounded to f32 once (PyTorch's
// scale; a product per element instead of an IEEE division, as on the CPU). With
// `offset` non-null the seed is seed + *offset (wrapping): a CUDA graph's replays draw new masks
// from values written to the device before each replay. The mask does not depend on T. Units of
// eight elements (one hash each), two a step with the next step's loads in flight.
template <class T>
static __device__ void dropout_impl(const T* __restrict__ x, T* __restrict__ out, u64 n, float p,
                                    u64 seed, const u64* __restrict__ offset) {
    if (offset != nullptr) seed += *offset;
    const u32 t = (u32)ceilf(p * 16777216.0f);  // p in [0, 1) (checked by the host): t < 2^24
    const float s = 1.0f / (1.0f - p);
    const u64 n8 = n / 8, stride = grid_threads();
    auto run = [&](u64 u, const Pack8<T>& v) {
        const uint2 k = dropout_keep8(seed, u, t);
        float o[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const u32 w = e < 4 ? k.x : k.y;
            o[e] = ((w >> (8 * (e & 3))) & 1u) ? v.at(e) * s : 0.0f;
        }
        store8(out, u, o);
    };
    u64 u = stream2(n8, [&](u64 j) { return load8(x, j); }, run);
    for (; u < n8; u += stride) run(u, load8(x, u));
    const u64 i = n8 * 8 + global_tid();
    if (i < n) {
        store(out, i, dropout_keep1(seed, i, t) ? load(x, i) * s : 0.0f);
    }
}

// affine_<SUFFIX> and dropout_<SUFFIX> for elements T.
#define AFFINE_DROPOUT_KERNELS(T, SUFFIX)                                                        \
    extern "C" __global__ void affine_##SUFFIX(const T* __restrict__ x, T* __restrict__ out,     \
                                               u64 n, float mul, float add) {                    \
        affine_impl<T>(x, out, n, mul, add);                                                     \
    }                                                                                            \
    extern "C" __global__ void dropout_##SUFFIX(const T* __restrict__ x, T* __restrict__ out,    \
                                                u64 n, float p, u64 seed,                        \
                                                const u64* __restrict__ offset) {                \
        dropout_impl<T>(x, out, n, p, seed, offset);                                             \
    }

// ---------------------------------------------------------------------------------------------
// Block copies: dst[dst_off + o·dst_stride + k] = src[src_off + o·src_stride + k], k < len.
// Bit copies: T is the element (float, or unsigned short for 2-byte elements), or a vector of 4
// of them (float4, uint2) when every offset, stride and len is a multiple of 4 (then all of
// them are passed in units of 4 elements).

template <class T>
static __device__ void copy_blocks_impl(const T* __restrict__ src, T* __restrict__ dst,
                                        u64 src_off, u64 src_stride, u64 dst_off, u64 dst_stride,
                                        u64 outer, u64 len) {
    const u64 total = outer * len, stride = grid_threads();
    if (total < (1ull << 31) && len < (1ull << 31)) {
        const FastDiv fd = fastdiv_make((u32)len);
        for (u32 i = (u32)global_tid(); i < (u32)total; i += (u32)stride) {
            const u32 o = fastdiv(fd, i), k = i - o * (u32)len;
            dst[dst_off + o * dst_stride + k] = src[src_off + o * src_stride + k];
        }
    } else {
        for (u64 i = global_tid(); i < total; i += stride) {
            const u64 o = i / len, k = i - o * len;
            dst[dst_off + o * dst_stride + k] = src[src_off + o * src_stride + k];
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Permutes. The host collapses the shape first (drops size-1 dims, merges dims that stay
// adjacent), so `rank` is 2..6; dims d0..d5 are x's dims outermost first and perm is packed 3
// bits per output axis (axis j in bits 3j..3j+2).

struct PermMeta {
    u64 od[6];  // output dims, innermost first (od[t] is output axis rank-1-t)
    u64 is[6];  // x's stride along each of those axes
};

static __device__ __forceinline__ PermMeta perm_meta(u32 rank, u64 d0, u64 d1, u64 d2, u64 d3,
                                                     u64 d4, u64 d5, u32 perm) {
    const u64 d[6] = {d0, d1, d2, d3, d4, d5};
    u64 st[6];
    u64 acc = 1;
#pragma unroll
    for (int k = 5; k >= 0; --k) {
        st[k] = k < (int)rank ? acc : 0;
        if (k < (int)rank) acc *= d[k];
    }
    PermMeta m;
#pragma unroll
    for (int t = 0; t < 6; ++t) {
        m.od[t] = 1;
        m.is[t] = 0;
        const int j = (int)rank - 1 - t;
        if (j >= 0) {
            const u32 p = (perm >> (3 * j)) & 7u;
#pragma unroll
            for (int k = 0; k < 6; ++k) {
                if ((u32)k == p) {
                    m.od[t] = d[k];
                    m.is[t] = st[k];
                }
            }
        }
    }
    return m;
}

// One thread per output unit (coalesced writes; reads are coalesced too when the last dim stays
// last, and then the host passes units of 16 bytes, or of 4 elements, when its length allows). The
// host uses it for moves of the last axis too when that axis or the output's last one is short.
// A bit copy, T as for copy_blocks_impl.
// SCATTER walks the input instead: out[map(i)] = x[i], the host passing the output's dims and
// the inverse permutation, so that map (the same index math) takes an input index to its output
// index. Warps then read contiguous memory and write whole units wherever they go.
template <class T, bool SCATTER = false>
static __device__ void permute_impl(const T* __restrict__ x, T* __restrict__ out, u64 n, u32 rank,
                                    u64 d0, u64 d1, u64 d2, u64 d3, u64 d4, u64 d5, u32 perm) {
    const PermMeta m = perm_meta(rank, d0, d1, d2, d3, d4, d5, perm);
    const u64 stride = grid_threads();
    if (n < (1ull << 31)) {
        FastDiv fd[6];
        u32 is32[6];
#pragma unroll
        for (int t = 0; t < 6; ++t) {
            fd[t] = fastdiv_make((u32)m.od[t]);
            is32[t] = (u32)m.is[t];
        }
        auto src_of = [&](u32 i) {
            u32 rem = i, src = 0;
#pragma unroll
            for (int t = 0; t < 6; ++t) {
                if (t < (int)rank) {
                    const u32 q = fastdiv(fd[t], rem);
                    src += (rem - q * fd[t].d) * is32[t];
                    rem = q;
                }
            }
            return src;
        };
        // PERMUTE_UNITS units a step, all loads in flight before any store (i < n < 2^31, so
        // the u64 sums below never wrap and their u32 casts are exact). Same-process A/B on an
        // H200 (bf16 [1024, 256, 4, 64] → [1024, 4, 256, 64], 16-byte units): 4 units on 32
        // blocks per SM 75.3 µs; 2 on 16, 77.3 µs; 8 on 16, 78.6 µs; 4 on 128, 137.9 µs.
#ifndef PERMUTE_UNITS
#define PERMUTE_UNITS 4
#endif
        u64 i = global_tid();
        for (; i + (PERMUTE_UNITS - 1) * stride < n; i += PERMUTE_UNITS * stride) {
            T v[PERMUTE_UNITS];
#pragma unroll
            for (int k = 0; k < PERMUTE_UNITS; ++k)
                v[k] = SCATTER ? x[i + k * stride] : x[src_of((u32)(i + k * stride))];
#pragma unroll
            for (int k = 0; k < PERMUTE_UNITS; ++k) {
                if constexpr (SCATTER)
                    out[src_of((u32)(i + k * stride))] = v[k];
                else
                    out[i + k * stride] = v[k];
            }
        }
        for (; i < n; i += stride) {
            if constexpr (SCATTER)
                out[src_of((u32)i)] = x[i];
            else
                out[i] = x[src_of((u32)i)];
        }
    } else {
        for (u64 i = global_tid(); i < n; i += stride) {
            u64 rem = i, src = 0;
#pragma unroll
            for (int t = 0; t < 6; ++t) {
                if (t < (int)rank) {
                    const u64 q = rem / m.od[t];
                    src += (rem - q * m.od[t]) * m.is[t];
                    rem = q;
                }
            }
            if constexpr (SCATTER)
                out[src] = x[i];
            else
                out[i] = x[src];
        }
    }
}

// Permutes that move x's last axis: 32×32 tiles through shared memory, read along x's last
// axis (length P, stride 1 in x, stride sp in out) and written along the output's last axis
// (x's axis of length Q and stride sq, stride 1 in out), so both sides are coalesced. The other
// axes (at most 4) are batch axes, given innermost first as dims b*, x strides bi* and output
// strides bo* (unused ones: dim 1, strides 0); `batch` is their product. Block (32, 8);
// grid-stride over tiles. The host precomputes all of it, so it lives in the constant bank.
// A bit copy of elements T through the kernel's shared tile, of S (4 bytes wide: one bank per
// element). The tile is declared in the kernel, so its symbol stays _ZZ<kernel>E4tile.
template <class T, class S>
static __device__ __forceinline__ void permute_tile_impl(
    S (*tile)[33], const T* __restrict__ x, T* __restrict__ out, u64 P, u64 Q, u64 sq, u64 sp,
    u64 batch, u64 b0, u64 b1, u64 b2, u64 b3, u64 bi0, u64 bi1, u64 bi2, u64 bi3, u64 bo0,
    u64 bo1, u64 bo2, u64 bo3) {
    const u64 tiles_p = (P + 31) / 32, tiles_q = (Q + 31) / 32;
    const u64 per_batch = tiles_p * tiles_q, items = batch * per_batch;
    const u32 tx = threadIdx.x, ty = threadIdx.y;
    for (u64 item = blockIdx.x; item < items; item += gridDim.x) {
        u64 b = item / per_batch;
        const u64 r = item - b * per_batch, tpi = r / tiles_q, tqi = r - tpi * tiles_q;
        u64 in_base = 0, out_base = 0;
#define BATCH_AXIS(D, SI, SO)                  \
    {                                          \
        const u64 q_ = b / D, c_ = b - q_ * D; \
        in_base += c_ * SI;                    \
        out_base += c_ * SO;                   \
        b = q_;                                \
    }
        BATCH_AXIS(b0, bi0, bo0)
        BATCH_AXIS(b1, bi1, bo1)
        BATCH_AXIS(b2, bi2, bo2)
        BATCH_AXIS(b3, bi3, bo3)
#undef BATCH_AXIS
        const u64 p0 = tpi * 32, q0 = tqi * 32;
        for (u32 yy = ty; yy < 32; yy += 8) {
            const u64 p = p0 + tx, q = q0 + yy;
            if (p < P && q < Q) tile[yy][tx] = x[in_base + q * sq + p];
        }
        __syncthreads();
        for (u32 yy = ty; yy < 32; yy += 8) {
            const u64 p = p0 + yy, q = q0 + tx;
            if (p < P && q < Q) out[out_base + p * sp + q] = (T)tile[tx][yy];
        }
        __syncthreads();  // the tile is rewritten by the next item
    }
}

// copy_blocks and permute over elements E (an element or a vector of 4), as kernel NAME.
#define COPY_BLOCKS_KERNEL(NAME, E)                                                              \
    extern "C" __global__ void NAME(const E* __restrict__ src, E* __restrict__ dst, u64 src_off, \
                                    u64 src_stride, u64 dst_off, u64 dst_stride, u64 outer,      \
                                    u64 len) {                                                   \
        copy_blocks_impl<E>(src, dst, src_off, src_stride, dst_off, dst_stride, outer, len);     \
    }
#define PERMUTE_KERNEL(NAME, E)                                                                  \
    extern "C" __global__ void NAME(const E* __restrict__ x, E* __restrict__ out, u64 n,         \
                                    u32 rank, u64 d0, u64 d1, u64 d2, u64 d3, u64 d4, u64 d5,    \
                                    u32 perm) {                                                  \
        permute_impl<E>(x, out, n, rank, d0, d1, d2, d3, d4, d5, perm);                          \
    }

// The data-movement kernels for elements T (vector of 4: T4, tile storage S), named _<SUFFIX>.
#define MOVE_KERNELS(T, T4, S, SUFFIX)                                                           \
    COPY_BLOCKS_KERNEL(copy_blocks_##SUFFIX, T)                                                  \
    COPY_BLOCKS_KERNEL(copy_blocks4_##SUFFIX, T4)                                                \
    PERMUTE_KERNEL(permute_##SUFFIX, T)                                                          \
    PERMUTE_KERNEL(permute4_##SUFFIX, T4)                                                        \
    extern "C" __global__ void __launch_bounds__(256) permute_tile_##SUFFIX(                     \
        const T* __restrict__ x, T* __restrict__ out, u64 P, u64 Q, u64 sq, u64 sp, u64 batch,   \
        u64 b0, u64 b1, u64 b2, u64 b3, u64 bi0, u64 bi1, u64 bi2, u64 bi3, u64 bo0, u64 bo1,    \
        u64 bo2, u64 bo3) {                                                                      \
        __shared__ S tile[32][33];                                                               \
        permute_tile_impl<T, S>(tile, x, out, P, Q, sq, sp, batch, b0, b1, b2, b3, bi0, bi1,     \
                                bi2, bi3, bo0, bo1, bo2, bo3);                                   \
    }
