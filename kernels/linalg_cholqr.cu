// The small step of Cholesky QR (crates/gpu-cuda/src/cholqr.rs): from the f32 Gram matrix
// G = YᵀY of a tall-skinny Y (l <= 64 columns), given as `nparts` partial sums over row blocks
// (added here in f64), the inverse of its Cholesky factor R (G = RᵀR, R upper triangular), so
// that Q = Y·R⁻¹ is one GEMM. CPU reference: `chol_rinv_reference` in
// crates/gpu-cuda/src/cholqr.rs (the same steps in f64).
//
// One block of 1024 threads. Thread t owns column c = t mod W (W = 32 for l <= 32, else 64)
// of the array and its rows i ≡ t / W (mod 1024 / W): one row for l <= 32, at most four else,
// in registers; the rows a warp holds are the same for all its threads, so only the column
// tests diverge. The parts are first added in f64 (eight loads in flight a row), with the
// distance of G to the identity on the way.
//
// One sweep of symmetric elimination on [G | I], kept in one array: in row i, a(i, c) for
// c >= i is the trailing part of G and a(i, c) for c < i is L⁻¹(i, c), where G = L·D·Lᵀ (L unit
// lower triangular). Step j takes f_i = a(j, i)/d_j (d_j = a(j, j), the pivot) for every row
// i > j and subtracts f_i·(row j) from row i: from the trailing part (c >= i) and from L⁻¹'s
// part (c < j), and sets L⁻¹(i, j) = −f_i. Row j, final after step j − 1, reaches every thread
// through a double-buffered row in shared memory, with 1/d_j beside it: the thread that
// finishes the pivot d_j takes its reciprocal once, for everyone. One barrier a step. Then
// R = D^½·Lᵀ, so R⁻¹(c, i) = L⁻¹(i, c)/√d_i (c < i) and 1/√d_i, each thread writing its own.
//
// flag (one u32, OR-ed): bit 0 = a pivot that is not > 0 (NaN included): G is not positive
// definite to working precision; the factor is finished with pivot 1 so that nothing
// overflows, and the caller discards it. Bit 1 (when `check`) = ‖G − I‖_F > 1/2 or NaN: the
// Y it came from is not close enough to orthonormal for Cholesky QR2's second pass to finish
// the job (Yamamoto, Nakatsukasa, Yanagisawa and Fukaya 2015).
#include "common.cuh"
#include "linalg_parts.cuh"

#define CHOL_MAX 64
#define CT 1024  // threads of the block (the host launches this many)
#define CQ 4     // rows a thread at most: CHOL_MAX rows over CT / CHOL_MAX row groups
#define CP 8     // parts in flight per row in the load phase

// The kernel's body for NQ rows a thread (1 for l <= 32, CQ else), so that the one-row case
// carries no dead rows.
template <int NQ>
static __device__ __forceinline__ void chol_body(const float* __restrict__ g, unsigned nparts,
                                                 float* __restrict__ rinv,
                                                 unsigned* __restrict__ flag, unsigned l,
                                                 unsigned check) {
    __shared__ double row[2][CHOL_MAX], inv[2], piv[CHOL_MAX], red[CT / 32];
    __shared__ unsigned pivot_bad;
    const unsigned t = threadIdx.x, ll = l * l;
    const unsigned w = l <= 32 ? 32u : 64u, c = t & (w - 1), grp = t / w, ng = blockDim.x / w;
    const bool col = c < l;
    // v[q] = a(i_q, c), i_q = grp + ng·q: G(c, i) = Σ_p part_p(c, i) (G's lower triangle read as
    // the upper: coalesced), L⁻¹'s part zero; the squared distance to the identity on the way.
    double v[NQ], off = 0.0;
    sum_parts<NQ, CP>(g, nparts, ll,
                      [&](int q) -> long long {
                          const unsigned i = grp + ng * q;
                          return col && i < l ? (long long)(i * l + c) : -1;
                      },
                      v);
#pragma unroll
    for (int q = 0; q < NQ; ++q) {
        const unsigned i = grp + ng * q;
        if (col && i < l) {
            const double e = v[q] - (i == c ? 1.0 : 0.0);
            off = fma(e, e, off);
            if (i > c) v[q] = 0.0;  // L⁻¹'s part starts at zero
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) off += __shfl_xor_sync(0xffffffffu, off, o);
    if ((t & 31) == 0) red[t >> 5] = off;
    if (t == 0) pivot_bad = 0;
    __syncthreads();
    unsigned bad = 0;
    if (check && t == 0) {
        double s = 0.0;
        for (unsigned k = 0; k < CT / 32; ++k) s += red[k];
        if (!(sqrt(s) <= 0.5)) bad = 2u;
    }
    // The pivot d_i, final in the thread that owns a(i, i): kept (1 in place of one that is not
    // > 0, NaN included, and flagged, so that nothing overflows), its reciprocal handed on.
    auto take_pivot = [&](unsigned i, double d) {
        if (!(d > 0.0)) pivot_bad = 1u;
        const double dd = d > 0.0 ? d : 1.0;
        piv[i] = dd;
        inv[i & 1] = __drcp_rn(dd);
    };
    if (grp == 0 && col) {
        row[0][c] = v[0];
        if (c == 0) take_pivot(0, v[0]);
    }
    for (unsigned j = 0; j < l; ++j) {
        __syncthreads();
        const double* rj = row[j & 1];
        const double ij = inv[j & 1], rjc = rj[c];
#pragma unroll
        for (int q = 0; q < NQ; ++q) {
            const unsigned i = grp + ng * q;  // the same for the whole warp
            if (col && i < l && i > j) {
                const double f = rj[i] * ij;
                const double upd = c == j ? -f : fma(-f, rjc, v[q]);
                v[q] = (c <= j || c >= i) ? upd : v[q];
                if (i == j + 1) {  // row j + 1 is final now: its owners hand it on
                    row[(j + 1) & 1][c] = v[q];
                    if (c == i) take_pivot(i, v[q]);
                }
            }
        }
    }
    __syncthreads();
    // R⁻¹ (column-major, zeros below the diagonal): the owner of a(i, c) writes R⁻¹(c, i).
#pragma unroll
    for (int q = 0; q < NQ; ++q) {
        const unsigned i = grp + ng * q;
        if (col && i < l) {
            double x = 0.0;
            if (c == i) x = 1.0 / sqrt(piv[i]);
            else if (c < i) x = v[q] / sqrt(piv[i]);
            rinv[(size_t)c + (size_t)i * l] = (float)x;
        }
    }
    if (t == 0 && (bad | pivot_bad)) *flag |= bad | pivot_bad;
}

extern "C" __global__ void __launch_bounds__(CT) chol_rinv_f32(const float* __restrict__ g,
                                                               unsigned nparts,
                                                               float* __restrict__ rinv,
                                                               unsigned* __restrict__ flag,
                                                               unsigned l, unsigned check) {
    if (l <= 32)
        chol_body<1>(g, nparts, rinv, flag, l, check);
    else
        chol_body<CQ>(g, nparts, rinv, flag, l, check);
}
