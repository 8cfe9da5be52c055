// The partial sums that the small linear-algebra kernels take (linalg_cholqr.cu, linalg_jacobi.cu):
// a matrix given as `nparts` f32 parts `stride` apart (the row-block products of
// `gemm_tn_parts_cm`), added in f64 in part order, as their CPU references add them.
#pragma once

// acc[s] = Σ_p parts[p·stride + at(s)] for the NE elements s a thread owns (at(s) < 0: none, its
// sum stays 0), with NE × NP loads in flight (a loop that adds as it loads keeps one global round
// trip in flight).
template <int NE, int NP, typename At>
static __device__ __forceinline__ void sum_parts(const float* __restrict__ parts, unsigned nparts,
                                                 unsigned long long stride, At at,
                                                 double (&acc)[NE]) {
#pragma unroll
    for (int s = 0; s < NE; ++s) acc[s] = 0.0;
    for (unsigned p0 = 0; p0 < nparts; p0 += NP) {
        float y[NE][NP];
#pragma unroll
        for (int s = 0; s < NE; ++s) {
            const long long e = at(s);
#pragma unroll
            for (int k = 0; k < NP; ++k)
                y[s][k] = (e >= 0 && p0 + k < nparts) ? parts[(p0 + k) * stride + e] : 0.0f;
        }
#pragma unroll
        for (int s = 0; s < NE; ++s)
#pragma unroll
            for (int k = 0; k < NP; ++k)
                if (p0 + k < nparts) acc[s] += (double)y[s][k];
    }
}
