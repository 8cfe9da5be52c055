// The small step of Cholesky QR (crates/gpu-cuda/src/cholqr.rs): from the f32 Gram matrix
// G = YᵀY of a tall-skinny Y (l <= 64 columns), given as `nparts` partial sums over row blocks
// (added here in f64), the inverse of its Cholesky factor R (G = RᵀR, R upper triangular), so
// that Q = Y·R⁻¹ is one GEMM. CPU reference: `chol_rinv_reference` in
// crates/gpu-cuda/src/cholqr.rs (the same steps in f64).
//
// One block (256 threads for l <= 32, else 1024), the matrix in shared memory in f64, row-major
// with a padded row (ld = l + 1). Thread t owns column c = t mod W (W = 32 for l <= 32, else
// 64) and the rows i ≡ t / W (mod blockDim / W), at most 4.
//
// One sweep of symmetric elimination on [G | I], kept in one array: in row i, a(i, c) for
// c >= i is the trailing part of G and a(i, c) for c < i is L⁻¹(i, c), where G = L·D·Lᵀ (L unit
// lower triangular). Step j takes f_i = a(j, i)/d_j (d_j = a(j, j), the pivot) for every row
// i > j and subtracts f_i·(row j) from row i: from the trailing part (c >= i) and from L⁻¹'s
// part (c < j), and sets L⁻¹(i, j) = −f_i. Each thread keeps its elements in registers; row j,
// final after step j − 1, reaches everyone through a double-buffered row in shared memory, so
// one block barrier a step. Then R = D^½·Lᵀ, so R⁻¹(i, c) = L⁻¹(c, i)/√d_c (i < c) and 1/√d_i.
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
    __shared__ double piv[CHOL_MAX], row[2][CHOL_MAX], red[CT / 32];
    const unsigned t = threadIdx.x, ld = l + 1;
    const unsigned w = l <= 32 ? 32u : 64u, c = t & (w - 1), grp = t / w, ng = blockDim.x / w;
    const bool col = c < l;
    // v[q] = a(i_q, c), i_q = grp + ng·q: G(c, i) = Σ_p part_p(c, i) (G's lower triangle read as
    // the upper: coalesced), L⁻¹'s part zero; the squared distance to the identity on the way.
    // Row 0 goes to the row buffer.
    double v[CQ], off = 0.0;
#pragma unroll
    for (int q = 0; q < CQ; ++q) {
        const unsigned i = grp + ng * q;
        v[q] = 0.0;
        if (col && i < l) {
            // Unrolled so that eight loads are in flight (added in order, as the reference).
            double x = 0.0;
#pragma unroll 8
            for (unsigned p = 0; p < nparts; ++p) x += (double)g[((size_t)p * l + i) * l + c];
            const double e = x - (i == c ? 1.0 : 0.0);
            off = fma(e, e, off);
            v[q] = i <= c ? x : 0.0;
            if (i == 0) row[0][c] = v[q];
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

    // The elimination, each thread's elements in registers; row j (final after step j − 1)
    // comes through the double-buffered row buffer. Every thread reads the same pivot, so
    // `bad` is uniform.
    for (unsigned j = 0; j < l; ++j) {
        const double* rj = row[j & 1];
        const double d = rj[j];
        if (!(d > 0.0)) bad |= 1u;
        const double dd = d > 0.0 ? d : 1.0;
        if (t == 0) piv[j] = dd;
        const double inv = __drcp_rn(dd);
        if (col) {
            const double rjc = rj[c];
#pragma unroll
            for (int q = 0; q < CQ; ++q) {
                const unsigned i = grp + ng * q;
                if (i > j && i < l && (c <= j || c >= i)) {
                    const double f = rj[i] * inv;
                    v[q] = c == j ? -f : v[q] - f * rjc;
                }
                // Row j + 1 is final now: its owners hand it on.
                if (i == j + 1 && i < l) row[(j + 1) & 1][c] = v[q];
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int q = 0; q < CQ; ++q) {
        const unsigned i = grp + ng * q;
        if (col && i < l) a[i * ld + c] = v[q];
    }
    __syncthreads();

    // R⁻¹, column-major, zeros below the diagonal.
#pragma unroll
    for (int q = 0; q < CQ; ++q) {
        const unsigned i = grp + ng * q;
        if (col && i < l) {
            double x = 0.0;
            if (i == c) x = 1.0 / sqrt(piv[i]);
            else if (i < c) x = a[c * ld + i] / sqrt(piv[c]);
            rinv[(size_t)i + (size_t)c * l] = (float)x;
        }
    }
    if (t == 0 && bad) *flag |= bad;
}
