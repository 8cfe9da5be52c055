// The small step of Cholesky QR (crates/gpu-cuda/src/cholqr.rs): from the f32 Gram matrix
// G = YᵀY of a tall-skinny Y (l <= 64 columns), given as `nparts` partial sums over row blocks
// (added here in f64), the inverse of its Cholesky factor R (G = RᵀR,
// R upper triangular), so that Q = Y·R⁻¹ is one GEMM. CPU reference: `chol_rinv_reference` in
// crates/gpu-cuda/src/cholqr.rs (the same steps in f64).
//
// One block (256 threads for l <= 32, else 1024), the matrix in shared memory in f64, row-major
// with a padded row (ld = l + 1). Thread t owns column c = t mod W (W = 32 for l <= 32, else
// 64) and the rows i ≡ t / W (mod blockDim / W), at most 4: every step updates all of the
// trailing matrix in parallel, one block barrier a step, a few instructions a thread.
//  - Cholesky in LDLᵀ form: step j subtracts a(j, i)·a(j, c)/a(j, j) from a(i, c), j < i <= c
//    (row j is read, never written, during step j); then R(i, c) = a(i, c)/√a(i, i).
//  - R⁻¹ = T bottom-up: T(k, c) = (δ_kc − Σ_{m>k} R(k, m)·T(m, c))/R(k, k); each thread keeps
//    the sums of its elements in registers, adds R(i, k)·T(k, c) once row k is known (staged in
//    a double buffer, so one barrier a step), and writes T straight to global memory.
//
// flag (one u32, OR-ed): bit 0 = a pivot that is not > 0 (NaN included): G is not positive
// definite to working precision; the factor is finished with pivot 1 so that nothing
// overflows, and the caller discards it. Bit 1 (when `check`) = ‖G − I‖_F > 1/2 or NaN: the
// Y it came from is not close enough to orthonormal for Cholesky QR2's second pass to finish
// the job (Yamamoto, Nakatsukasa, Yanagisawa and Fukaya 2015).
#include "common.cuh"

#define CHOL_MAX 64
#define CT 1024  // the most threads; the host launches 256 for l <= 32, else 1024
#define CQ 4     // rows per thread at most: l rows over blockDim / W row groups

extern "C" __global__ void __launch_bounds__(CT) chol_rinv_f32(const float* __restrict__ g,
                                                               unsigned nparts,
                                                               float* __restrict__ rinv,
                                                               unsigned* __restrict__ flag,
                                                               unsigned l, unsigned check) {
    __shared__ double a[CHOL_MAX * (CHOL_MAX + 1)];
    __shared__ double piv[CHOL_MAX], pinv[CHOL_MAX], rdinv[CHOL_MAX], tk[2][CHOL_MAX], red[CT / 32];
    const unsigned t = threadIdx.x, ld = l + 1;
    const unsigned w = l <= 32 ? 32u : 64u, c = t & (w - 1), grp = t / w, ng = blockDim.x / w;
    const bool col = c < l;
    // a(i, c) = G(c, i) = Σ_p part_p(c, i) (G's lower triangle read as the upper: coalesced),
    // zero below the diagonal; R⁻¹'s zeros written now; the squared distance to the identity
    // on the way.
    double off = 0.0;
#pragma unroll
    for (int q = 0; q < CQ; ++q) {
        const unsigned i = grp + ng * q;
        if (col && i < l) {
            // Unrolled so that eight loads are in flight (added in order, as the reference).
            double v = 0.0;
#pragma unroll 8
            for (unsigned p = 0; p < nparts; ++p) v += (double)g[((size_t)p * l + i) * l + c];
            const double e = v - (i == c ? 1.0 : 0.0);
            off = fma(e, e, off);
            a[i * ld + c] = i <= c ? v : 0.0;
            if (i == 0 && c == 0) pinv[0] = __drcp_rn(v > 0.0 ? v : 1.0);
            if (i > c) rinv[(size_t)i + (size_t)c * l] = 0.0f;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) off += __shfl_xor_sync(0xffffffffu, off, o);
    if ((t & 31) == 0) red[t >> 5] = off;
    __syncthreads();
    unsigned bad = 0;
    if (check) {
        double s = 0.0;
        for (unsigned k = 0; k < blockDim.x / 32; ++k) s += red[k];
        if (!(sqrt(s) <= 0.5)) bad = 2u;
    }

    // Cholesky, LDLᵀ form (every thread reads the same pivot, so `bad` is uniform).
    for (unsigned j = 0; j < l; ++j) {
        double d = a[j * ld + j];
        if (!(d > 0.0)) {
            bad |= 1u;
            d = 1.0;
        }
        if (t == 0) piv[j] = d;
        if (col && c > j) {
            const double f = a[j * ld + c] * pinv[j];
#pragma unroll
            for (int q = 0; q < CQ; ++q) {
                const unsigned i = grp + ng * q;
                if (i > j && i <= c) {
                    const double nv = a[i * ld + c] - a[j * ld + i] * f;
                    a[i * ld + c] = nv;
                    // The next pivot's reciprocal, taken once by its owner (1 for a bad pivot).
                    if (i == j + 1 && c == i) pinv[i] = __drcp_rn(nv > 0.0 ? nv : 1.0);
                }
            }
        }
        __syncthreads();
    }
    // R(i, c) = a(i, c)/√d_i, R(i, i) = √d_i; 1/R(i, i) kept apart.
#pragma unroll
    for (int q = 0; q < CQ; ++q) {
        const unsigned i = grp + ng * q;
        if (col && i <= c) {
            const double s = sqrt(piv[i]);
            a[i * ld + c] = i == c ? s : a[i * ld + c] / s;
            if (i == c) rdinv[i] = 1.0 / s;
        }
    }
    __syncthreads();

    // T = R⁻¹, rows from the bottom.
    double acc[CQ];
#pragma unroll
    for (int q = 0; q < CQ; ++q) acc[q] = 0.0;
    for (int k = (int)l - 1; k >= 0; --k) {
        double* tb = tk[k & 1];
#pragma unroll
        for (int q = 0; q < CQ; ++q) {
            const unsigned i = grp + ng * q;
            if (col && i == (unsigned)k && c >= i) {
                const double v = ((i == c ? 1.0 : 0.0) - acc[q]) * rdinv[i];
                tb[c] = v;
                rinv[(size_t)i + (size_t)c * l] = (float)v;
            }
        }
        __syncthreads();
#pragma unroll
        for (int q = 0; q < CQ; ++q) {
            const unsigned i = grp + ng * q;
            if (col && i < (unsigned)k && c >= (unsigned)k)
                acc[q] = fma(a[i * ld + k], tb[c], acc[q]);
        }
    }
    if (t == 0 && bad) *flag |= bad;
}
