// The small SVD at the end of the randomized SVD (crates/gpu-cuda/src/small_svd.rs): the l × l
// f32 matrix R (l <= 64, column-major, given as `nparts` partial sums added here in f64) = Ũ·Σ·Ṽᵀ by one-sided Jacobi (Hestenes) in f64, in one
// block, so that nothing goes to the host. CPU reference: nalgebra's SVD (the host path it
// replaces, rssm::svd); parity tests: crates/gpu-cuda/tests/small_svd.rs.
//
// The columns of A (R, rotated) and V (I, rotated) live in dynamic shared memory, f64, column j
// contiguous. A sweep is n − 1 rounds of n/2 disjoint column pairs in round-robin order (n = l
// rounded up to even; a pair with the padding column is skipped); half-warp m of the block takes
// pair m of the round, its 16 lanes hold rows i ≡ lane (mod 16); one barrier a round. A pair
// (p, q) is rotated when |a_p·a_q| > tol·‖a_p‖·‖a_q‖ (tol = 2^-26: the outputs are f32, whose
// rounding, 2^-24, is coarser; a stricter tol only buys a last sweep whose gain the rounding to
// f32 erases), by the rotation that makes the two columns orthogonal
// (Rutishauser's formulas); the sweeps stop when a sweep rotates nothing, so the final columns
// are orthogonal to tol. Then σ_j = ‖a_j‖, u_j = a_j/σ_j,
// sorted descending; the first k go out (s scaled by `inv_scale`, a power of two: exact).
//
// flag (OR-ed): 4 = no convergence in 60 sweeps; 8 = one of the first k singular values is not
// > 2^-60·σ_max (zero: u_j undefined), or a column is not finite; 16 = a singular value overflows
// f32 once unscaled. The caller then takes its host path.
#include "common.cuh"

#define JAC_MAX 64
#define JAC_SWEEPS 60

extern "C" __global__ void __launch_bounds__(512) jacobi_svd_f32(
    const float* __restrict__ r, unsigned nparts, float* __restrict__ u, float* __restrict__ s,
    float* __restrict__ v, unsigned* __restrict__ flag, unsigned l, unsigned k, float inv_scale) {
    extern __shared__ double jac_smem[];
    double* a = jac_smem;              // l × l, column j at a + j·l
    double* w = jac_smem + l * l;      // V, likewise
    __shared__ double sig[JAC_MAX];
    __shared__ unsigned ord[JAC_MAX];
    __shared__ int rotated;
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5, hl = lane & 15;
    const unsigned n = l + (l & 1u), nm1 = n - 1;
    const unsigned m = 2 * warp + (lane >> 4);  // this half-warp's pair of each round
    for (unsigned e = threadIdx.x; e < l * l; e += blockDim.x) {
        double x = 0.0;  // eight loads in flight, added in order
#pragma unroll 8
        for (unsigned p = 0; p < nparts; ++p) x += (double)r[(size_t)p * l * l + e];
        a[e] = x;
        w[e] = (e % l) == (e / l) ? 1.0 : 0.0;
    }
    const double tol2 = 2.220446049250313e-16;  // tol² = 2^-52 (compared without a sqrt)
    unsigned bad = 4u;
    for (int sweep = 0; sweep < JAC_SWEEPS; ++sweep) {
        if (threadIdx.x == 0) rotated = 0;
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
            double x[4], y[4], al = 0.0, be = 0.0, ga = 0.0;
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const unsigned i = hl + 16u * r;
                const bool in = active && i < l;
                x[r] = in ? a[p * l + i] : 0.0;
                y[r] = in ? a[q * l + i] : 0.0;
                al = fma(x[r], x[r], al);
                be = fma(y[r], y[r], be);
                ga = fma(x[r], y[r], ga);
            }
            // Sums over the half-warp (xor offsets below 16 stay inside it).
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) {
                al += __shfl_xor_sync(0xffffffffu, al, o);
                be += __shfl_xor_sync(0xffffffffu, be, o);
                ga += __shfl_xor_sync(0xffffffffu, ga, o);
            }
            if (active && ga * ga > tol2 * al * be) {
                // t = sign(ζ)/(|ζ| + √(1 + ζ²)), ζ = (β − α)/2γ, taken in f32 on the
                // exponent-normalised d = β − α and 2γ: whatever t is, c = 1/√(1 + t²) and
                // s = c·t make a rotation orthogonal to f64 precision; an f32 angle only leaves
                // γ' ≈ 2^-24·γ for the next sweep. One f64 reciprocal square root.
                const double d = be - al, g2 = 2.0 * ga;
                int e;
                frexp(fmax(fabs(d), fabs(g2)), &e);
                const float df = (float)ldexp(d, -e), gf = (float)ldexp(g2, -e);
                const float tf =
                    copysignf(fabsf(gf) / (fabsf(df) + sqrtf(fmaf(df, df, gf * gf))), df * gf);
                // 2γ below f32's range next to β − α: t ≈ γ/(β − α).
                const double t = tf != 0.0f ? (double)tf : 0.5 * g2 / d;
                const double c = rsqrt(fma(t, t, 1.0)), sn = c * t;
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const unsigned i = hl + 16u * r;
                    if (i < l) {
                        a[p * l + i] = c * x[r] - sn * y[r];
                        a[q * l + i] = sn * x[r] + c * y[r];
                        const double vp = w[p * l + i], vq = w[q * l + i];
                        w[p * l + i] = c * vp - sn * vq;
                        w[q * l + i] = sn * vp + c * vq;
                    }
                }
                if (hl == 0) rotated = 1;
            }
            __syncthreads();
        }
        if (!rotated) {
            bad = 0;
            break;
        }
        __syncthreads();  // every thread has read `rotated` before thread 0 clears it
    }

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
