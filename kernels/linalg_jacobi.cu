// The small SVD at the end of the randomized SVD (crates/gpu-cuda/src/small_svd.rs): the l × l
// f32 matrix R (l <= 64, column-major, given as `nparts` partial sums added here in f64) =
// Ũ·Σ·Ṽᵀ by one-sided Jacobi (Hestenes) in f64, in one block, so that nothing goes to the host.
// CPU reference: nalgebra's SVD (the host path it replaces, rssm::svd); parity tests:
// crates/gpu-cuda/tests/small_svd.rs.
//
// The columns of A (R, rotated) and V (I, rotated) live in dynamic shared memory, f64, column j
// contiguous. A sweep is n − 1 rounds of n/2 disjoint column pairs in round-robin order (n = l
// rounded up to even; a pair with the padding column is skipped); a half-warp takes pair m of
// the round, lane e holding rows i ≡ e (mod 16), so the column sums take four shuffle steps; one
// block barrier a round. A pair (p, q) is rotated when
// |a_p·a_q| > tol·‖a_p‖·‖a_q‖ (tol = 2^-26: the outputs are f32, whose rounding, 2^-24, is
// coarser; a stricter tol only buys a last sweep whose gain the rounding to f32 erases), by the
// rotation that makes the two columns orthogonal (Rutishauser's t; see `rotation`); the sweeps
// stop when a sweep rotates nothing, so the final columns are orthogonal to tol.
//
// What a round waits for is the chain load → column sums → rotation → update → barrier, so the
// rotation of V (which no later decision reads) is left off it: the lanes that rotated a pair's
// A columns in one round rotate the same V columns in the next, before that round's barrier, and
// nobody touches those V columns before (the next rotation of either column is another pair's,
// a round later, and its V rotation one round later still).
//
// Then σ_j = ‖a_j‖, u_j = a_j/σ_j, sorted descending; the first k go out (s scaled by
// `inv_scale`, a power of two: exact).
//
// flag (OR-ed): 4 = no convergence in 60 sweeps; 8 = one of the first k singular values is not
// > 2^-60·σ_max (zero: u_j undefined), or a column is not finite; 16 = a singular value overflows
// f32 once unscaled. The caller then takes its host path.
#include "common.cuh"
#include "linalg_parts.cuh"

#define JAC_MAX 64
#define JAC_SWEEPS 60
#define JAC_LANES 16   // lanes per column pair
#define JAC_THREADS 512  // the most: JAC_MAX / 2 pairs × JAC_LANES
#define JAC_CE 8       // elements a thread adds up at a time in the load phase
#define JAC_CP 4       // parts in flight per element

// t = tan θ of the rotation that makes columns with sums α = ‖a_p‖², β = ‖a_q‖², γ = a_p·a_q
// (γ ≠ 0) orthogonal: t = sign(ζ)/(|ζ| + √(1 + ζ²)), ζ = (β − α)/2γ, written as
// sign(d·g)·|g|/(|d| + √(d² + g²)) with d = β − α and g = 2γ, which never divides by a small g.
// d and g are first scaled by a power of two (exact) so that the larger is in [1, 2), then t is
// taken in f32 with the fast reciprocal and square root (~2^-21 relative). Whatever t is, the
// caller's c = 1/√(1 + t²) and s = c·t make a rotation orthogonal to f64 precision: an
// approximate t only leaves γ' ≈ 2^-21·γ for the next sweep. If g is below f32's range next to
// d, t ≈ g/2d (f64).
static __device__ __forceinline__ double rotation(double al, double be, double ga) {
    const double d = be - al, g = 2.0 * ga;
    // The larger magnitude's biased exponent E; 2^(1023 − E) scales it into [1, 2).
    const int e = (__double2hiint(fmax(fabs(d), fabs(g))) >> 20) & 0x7ff;
    const double sc = __hiloint2double((2046 - e) << 20, 0);
    const float df = (float)(d * sc), gf = (float)(g * sc);
    const float h = fmaf(df, df, gf * gf);  // in [1, 8): no special cases below
    const float tf = copysignf(__fdividef(fabsf(gf), fabsf(df) + h * rsqrtf(h)), df * gf);
    return tf != 0.0f ? (double)tf : 0.5 * g / d;
}

// The Jacobi sweeps, RPL rows a lane (l <= 16·RPL).
template <int RPL>
static __device__ __forceinline__ unsigned sweeps(double* a, double* w, unsigned l,
                                                  int* rotated) {
    const unsigned lane = threadIdx.x & 31, el = lane & (JAC_LANES - 1);
    const unsigned m = threadIdx.x / JAC_LANES;  // this group's pair of each round
    const unsigned n = l + (l & 1u), nm1 = n - 1;
    const double tol2 = 2.220446049250313e-16;  // tol² = 2^-52 (compared without a sqrt)
    // The V rotation this group owes from its previous round: columns (vp, vq), (c, s).
    bool owe = false;
    unsigned vp = 0, vq = 0;
    double vc = 1.0, vs = 0.0;
    auto rotate_v = [&]() {
        if (!owe) return;
#pragma unroll
        for (int r = 0; r < RPL; ++r) {
            const unsigned i = el + JAC_LANES * r;
            if (i < l) {
                const double x = w[vp * l + i], y = w[vq * l + i];
                w[vp * l + i] = vc * x - vs * y;
                w[vq * l + i] = vs * x + vc * y;
            }
        }
        owe = false;
    };
    for (int sweep = 0; sweep < JAC_SWEEPS; ++sweep) {
        if (threadIdx.x == 0) *rotated = 0;
        __syncthreads();
        for (unsigned round = 0; round < nm1; ++round) {
            // Round-robin: pair 0 is (round, n − 1), pair m is (round + m, round − m) mod n − 1.
            unsigned p = round, q = nm1;
            if (m > 0) {
                p = round + m;
                q = round + nm1 - m;
                if (p >= nm1) p -= nm1;
                if (q >= nm1) q -= nm1;
            }
            const bool active = m < n / 2 && p < l && q < l;
            double x[RPL], y[RPL], al = 0.0, be = 0.0, ga = 0.0;
#pragma unroll
            for (int r = 0; r < RPL; ++r) {
                const unsigned i = el + JAC_LANES * r;
                const bool in = active && i < l;
                x[r] = in ? a[p * l + i] : 0.0;
                y[r] = in ? a[q * l + i] : 0.0;
            }
            rotate_v();  // last round's V rotation, while the loads are in flight
#pragma unroll
            for (int r = 0; r < RPL; ++r) {
                al = fma(x[r], x[r], al);
                be = fma(y[r], y[r], be);
                ga = fma(x[r], y[r], ga);
            }
            // Sums over the half-warp (xor offsets below 16 stay inside it).
#pragma unroll
            for (int o = JAC_LANES / 2; o > 0; o >>= 1) {
                al += __shfl_xor_sync(0xffffffffu, al, o);
                be += __shfl_xor_sync(0xffffffffu, be, o);
                ga += __shfl_xor_sync(0xffffffffu, ga, o);
            }
            if (active && ga * ga > tol2 * al * be) {
                const double t = rotation(al, be, ga);
                const double c = rsqrt(fma(t, t, 1.0)), sn = c * t;
#pragma unroll
                for (int r = 0; r < RPL; ++r) {
                    const unsigned i = el + JAC_LANES * r;
                    if (i < l) {
                        a[p * l + i] = c * x[r] - sn * y[r];
                        a[q * l + i] = sn * x[r] + c * y[r];
                    }
                }
                owe = true;
                vp = p;
                vq = q;
                vc = c;
                vs = sn;
                if (el == 0) *rotated = 1;
            }
            __syncthreads();
        }
        const bool done = !*rotated;
        __syncthreads();  // every thread has read `rotated` before thread 0 clears it
        if (done) {
            rotate_v();
            __syncthreads();
            return 0u;
        }
    }
    rotate_v();
    __syncthreads();
    return 4u;
}

extern "C" __global__ void __launch_bounds__(JAC_THREADS) jacobi_svd_f32(
    const float* __restrict__ r, unsigned nparts, float* __restrict__ u, float* __restrict__ s,
    float* __restrict__ v, unsigned* __restrict__ flag, unsigned l, unsigned k, float inv_scale) {
    extern __shared__ double jac_smem[];
    double* a = jac_smem;              // l × l, column j at a + j·l
    double* w = jac_smem + l * l;      // V, likewise
    __shared__ double sig[JAC_MAX];
    __shared__ unsigned ord[JAC_MAX];
    __shared__ int rotated;
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5, ll = l * l;
    // R, its parts added in order (as in the reference), JAC_CE elements a thread at a time.
    for (unsigned e0 = 0; e0 < ll; e0 += JAC_CE * blockDim.x) {
        double acc[JAC_CE];
        sum_parts<JAC_CE, JAC_CP>(r, nparts, ll,
                                  [&](int s) -> long long {
                                      const unsigned e = e0 + threadIdx.x + blockDim.x * s;
                                      return e < ll ? (long long)e : -1;
                                  },
                                  acc);
#pragma unroll
        for (int s = 0; s < JAC_CE; ++s) {
            const unsigned e = e0 + threadIdx.x + blockDim.x * s;
            if (e < ll) {
                a[e] = acc[s];
                w[e] = (e % l) == (e / l) ? 1.0 : 0.0;
            }
        }
    }
    __syncthreads();
    unsigned bad = l <= 32 ? sweeps<2>(a, w, l, &rotated) : sweeps<4>(a, w, l, &rotated);

    // σ_j = ‖a_j‖ (a warp a column), then each σ's rank (ties by index) gives the order.
    for (unsigned j = warp; j < l; j += blockDim.x >> 5) {
        double x = 0.0;
        for (unsigned i = lane; i < l; i += 32) x = fma(a[j * l + i], a[j * l + i], x);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
        if (lane == 0) sig[j] = x <= 1.79e308 ? sqrt(x) : -1.0;  // NaN or inf: -1, flagged
    }
    __syncthreads();
    if (threadIdx.x < l) {
        const unsigned j = threadIdx.x;
        unsigned rank = 0;
        for (unsigned i = 0; i < l; ++i)
            rank += (sig[i] > sig[j] || (sig[i] == sig[j] && i < j)) ? 1u : 0u;
        ord[rank] = j;
    }
    __syncthreads();
    const double smax = sig[ord[0]];
    if (!(smax > 0.0) || !(sig[ord[k - 1]] > smax * 8.673617379884035e-19) || sig[ord[l - 1]] < 0.0)
        bad |= 8u;
    for (unsigned e = threadIdx.x; e < l * k; e += blockDim.x) {
        const unsigned i = e % l, rr = e / l, j = ord[rr];
        const double sj = sig[j];
        u[e] = (float)(sj > 0.0 ? a[j * l + i] / sj : 0.0);
        v[e] = (float)w[j * l + i];
    }
    if (threadIdx.x < k) {
        const float sf = (float)(sig[ord[threadIdx.x]] * (double)inv_scale);
        s[threadIdx.x] = sf;
        if (!isfinite(sf)) atomicOr(flag, 16u);
    }
    if (threadIdx.x == 0 && bad) *flag |= bad;
}
