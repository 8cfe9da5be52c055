// The small step of Cholesky QR (crates/gpu-cuda/src/cholqr.rs): from the f32 Gram matrix
// G = YᵀY of a tall-skinny Y (l <= 64 columns), given as `nparts` partial sums over row blocks
// (added here in f64), the inverse of its Cholesky factor R (G = RᵀR, R upper triangular), so
// that Q = Y·R⁻¹ is one GEMM. CPU reference: `chol_rinv_reference` in
// crates/gpu-cuda/src/cholqr.rs (the same steps in f64).
//
// One block of 1024 threads. All of them add up the parts (every part's loads in flight
// before the sums, which go in part order, as the reference's) into a shared f64 tile and the
// distance ‖G − I‖_F. Then only CW·CH threads go on (CW = 32 for l <= 32, else 64; CH = 4):
// thread (c, h) owns column c and the rows i ≡ h (mod 4), at most CW/4 of them, in registers,
// and the steps synchronise those threads alone (a named barrier), not the block.
//
// One sweep of symmetric elimination on [G | I], kept in one array: in row i, a(i, c) for
// c >= i is the trailing part of G and a(i, c) for c < i is L⁻¹(i, c), where G = L·D·Lᵀ (L unit
// lower triangular). Step j takes f_i = a(j, i)/d_j (d_j = a(j, j), the pivot) for every row
// i > j and subtracts f_i·(row j) from row i: from the trailing part (c >= i) and from L⁻¹'s
// part (c < j), and sets L⁻¹(i, j) = −f_i. Row j, final after step j − 1, reaches everyone
// through a double-buffered row in shared memory, so one barrier a step. Then R = D^½·Lᵀ, so
// R⁻¹(i, c) = L⁻¹(c, i)/√d_c (i < c) and 1/√d_i: thread (c, h) writes R⁻¹(c, i) for its rows
// i, coalesced over c.
//
// flag (one u32, OR-ed): bit 0 = a pivot that is not > 0 (NaN included): G is not positive
// definite to working precision; the factor is finished with pivot 1 so that nothing
// overflows, and the caller discards it. Bit 1 (when `check`) = ‖G − I‖_F > 1/2 or NaN: the
// Y it came from is not close enough to orthonormal for Cholesky QR2's second pass to finish
// the job (Yamamoto, Nakatsukasa, Yanagisawa and Fukaya 2015).
#include "common.cuh"

#define CHOL_MAX 64
#define CT 1024   // the block
#define CH 4      // row groups of the elimination
#define CPF 16    // part loads in flight a thread

// The elimination and R⁻¹ for column widths up to CW (32 or 64), by the CW·CH threads t < CW·CH.
template <int CW>
__device__ __forceinline__ void chol_eliminate(const double* __restrict__ sg, double* piv,
                                               double (*row)[CHOL_MAX], float* __restrict__ rinv,
                                               unsigned l, unsigned& bad) {
    constexpr int R = CW / CH;  // rows a thread
    const unsigned t = threadIdx.x, c = t % CW, h = t / CW;
    const bool col = c < l;
    double v[R];
#pragma unroll
    for (int q = 0; q < R; ++q) {
        const unsigned i = h + CH * q;
        v[q] = col && i < l && i <= c ? sg[i * l + c] : 0.0;
    }
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
            for (int q = 0; q < R; ++q) {
                const unsigned i = h + CH * q;
                if (i > j && i < l) {
                    const double f = rj[i] * inv;
                    if (c <= j || c >= i) v[q] = c == j ? -f : v[q] - f * rjc;
                    // Row j + 1 is final now: its owners hand it on.
                    if (i == j + 1) row[(j + 1) & 1][c] = v[q];
                }
            }
        }
        // The CW·CH threads alone (a multiple of 32).
        asm volatile("bar.sync 1, %0;" ::"r"(CW * CH) : "memory");
    }
    // R⁻¹(c, i) (column-major: c + i·l) from a(i, c) = L⁻¹(i, c) for c < i, column-major,
    // zeros below the diagonal.
    if (col) {
#pragma unroll
        for (int q = 0; q < R; ++q) {
            const unsigned i = h + CH * q;
            if (i < l) {
                double x = 0.0;
                if (i == c) x = 1.0 / sqrt(piv[c]);
                else if (c < i) x = v[q] / sqrt(piv[i]);
                rinv[(size_t)c + (size_t)i * l] = (float)x;
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(CT) chol_rinv_f32(const float* __restrict__ g,
                                                               unsigned nparts,
                                                               float* __restrict__ rinv,
                                                               unsigned* __restrict__ flag,
                                                               unsigned l, unsigned check) {
    __shared__ double sg[CHOL_MAX * CHOL_MAX];
    __shared__ double piv[CHOL_MAX], row[2][CHOL_MAX], red[CT / 32];
    const unsigned t = threadIdx.x, ll = l * l;
    // G(e) = Σ_p part_p(e), e = i·l + c: a(i, c) for i <= c (G's lower triangle, read as the
    // upper: coalesced); the squared distance to the identity over every element.
    double off = 0.0;
    for (unsigned e = t; e < ll; e += CT) {
        double x = 0.0;
        for (unsigned p0 = 0; p0 < nparts; p0 += CPF) {
            float part[CPF];
#pragma unroll
            for (int p = 0; p < CPF; ++p)
                part[p] = p0 + p < nparts ? g[(size_t)(p0 + p) * ll + e] : 0.0f;
#pragma unroll
            for (int p = 0; p < CPF; ++p)
                if (p0 + p < nparts) x += (double)part[p];
        }
        const unsigned i = e / l, c = e - i * l;
        const double dx = x - (i == c ? 1.0 : 0.0);
        off = fma(dx, dx, off);
        sg[e] = x;
        if (i == 0) row[0][c] = x;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) off += __shfl_xor_sync(0xffffffffu, off, o);
    if ((t & 31) == 0) red[t >> 5] = off;
    __syncthreads();
    const unsigned workers = (l <= 32 ? 32u : 64u) * CH;
    if (t >= workers) return;
    unsigned bad = 0;
    if (check) {
        double s = 0.0;
        for (unsigned k = 0; k < CT / 32; ++k) s += red[k];
        if (!(sqrt(s) <= 0.5)) bad = 2u;
    }
    if (l <= 32) chol_eliminate<32>(sg, piv, row, rinv, l, bad);
    else chol_eliminate<64>(sg, piv, row, rinv, l, bad);
    // Every worker saw the same pivots, so `bad` is uniform.
    if (t == 0 && bad) *flag |= bad;
}
