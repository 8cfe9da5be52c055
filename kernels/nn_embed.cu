// Rotary position embedding and token embeddings (gather / scatter-add), f32.
// CPU reference: crates/gpu-core/src/cpu/rows.rs (f64).
// Chunks of V = 4 floats (16-byte loads and stores) when the row halves (RoPE) or rows
// (embeddings) are multiples of 4 floats, so every chunk is 16-byte aligned; else V = 1.

template <int V>
struct Vf {
    float v[V];
};

template <int V>
static __device__ __forceinline__ Vf<V> ld(const float* p) {
    Vf<V> r;
    if constexpr (V == 4) {
        const float4 q = *reinterpret_cast<const float4*>(p);
        r.v[0] = q.x, r.v[1] = q.y, r.v[2] = q.z, r.v[3] = q.w;
    } else {
        r.v[0] = *p;
    }
    return r;
}

template <int V>
static __device__ __forceinline__ void st(float* p, const Vf<V>& r) {
    if constexpr (V == 4)
        *reinterpret_cast<float4*>(p) = make_float4(r.v[0], r.v[1], r.v[2], r.v[3]);
    else
        *p = r.v[0];
}

// ---- RoPE ---------------------------------------------------------------------------------------
// x and out are [n, t, d], h = d/2. For pair i < h at position pos (the t index):
// θ = pos·base^(−2i/d), out[i] = x[i]·cos θ − x[i+h]·sin θ, out[i+h] = x[i+h]·cos θ + x[i]·sin θ;
// `inverse` negates sin θ (the backward: the rotation's transpose).
// Thread p of grid.x owns V consecutive pairs (pos, i0..i0+V) and computes their angles once, in
// double (θ, then its remainder mod 2π by a two-constant Cody-Waite step, accurate for |θ| up to
// about 2^40), then sincosf of the remainder in [−π, π]; it then walks the n axis from
// blockIdx.y in steps of gridDim.y, so the angles are reused n/gridDim.y times.
template <int V>
static __device__ __forceinline__ void rope_body(const float* x, float* out, unsigned n,
                                                 unsigned t, unsigned d, float base,
                                                 bool inverse) {
    const unsigned h = d >> 1, hv = h / V;
    const unsigned long long p = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= (unsigned long long)t * hv) return;
    const unsigned pos = (unsigned)(p / hv), i0 = (unsigned)(p % hv) * V;
    const double l2b = log2((double)base);
    float cs[V], sn[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
        const double theta = (double)pos * exp2(-2.0 * (double)(i0 + k) / (double)d * l2b);
        const double q = rint(theta * 0.15915494309189535);  // 1/(2π)
        double r = fma(-q, 6.283185307179586, theta);         // 2π, high part
        r = fma(-q, 2.4492935982947064e-16, r);               // 2π, low part
        float s, c;
        sincosf((float)r, &s, &c);
        cs[k] = c;
        sn[k] = inverse ? -s : s;
    }
    for (unsigned b = blockIdx.y; b < n; b += gridDim.y) {
        const size_t o = ((size_t)b * t + pos) * d + i0;
        const Vf<V> a = ld<V>(x + o), e = ld<V>(x + o + h);
        Vf<V> ra, re;
#pragma unroll
        for (int k = 0; k < V; ++k) {
            ra.v[k] = fmaf(a.v[k], cs[k], -e.v[k] * sn[k]);
            re.v[k] = fmaf(e.v[k], cs[k], a.v[k] * sn[k]);
        }
        st<V>(out + o, ra);
        st<V>(out + o + h, re);
    }
}

extern "C" __global__ void rope_f32(const float* __restrict__ x, float* __restrict__ out,
                                    unsigned n, unsigned t, unsigned d, float base,
                                    unsigned inverse) {
    if (((d >> 1) & 3u) == 0)
        rope_body<4>(x, out, n, t, d, base, inverse != 0);
    else
        rope_body<1>(x, out, n, t, d, base, inverse != 0);
}

// ---- embeddings ---------------------------------------------------------------------------------
// A warp per row: blockDim = (32, 8), row = blockIdx.x·8 + threadIdx.y; lanes stride over the row.
// ids >= vocab: the forward writes a NaN row (the CPU reports an error instead); the backward
// skips the row.

extern "C" __global__ void embedding_fwd_f32(const unsigned* __restrict__ ids,
                                             const float* __restrict__ table,
                                             float* __restrict__ out, unsigned long long rows,
                                             unsigned dim, unsigned long long vocab) {
    const unsigned long long row = (unsigned long long)blockIdx.x * blockDim.y + threadIdx.y;
    if (row >= rows) return;
    const unsigned id = ids[row];
    float* o = out + row * dim;
    if (id >= vocab) {
        for (unsigned c = threadIdx.x; c < dim; c += 32) o[c] = __int_as_float(0x7fc00000);
        return;
    }
    const float* src = table + (size_t)id * dim;
    if ((dim & 3u) == 0) {
        for (unsigned c = threadIdx.x * 4; c < dim; c += 128) st<4>(o + c, ld<4>(src + c));
    } else {
        for (unsigned c = threadIdx.x; c < dim; c += 32) o[c] = src[c];
    }
}

// dtable must be zeroed first (the host does, with a memset); then dtable[ids[r]] += dout[r]
// with atomic adds (summation order is unspecified).
extern "C" __global__ void embedding_bwd_f32(const unsigned* __restrict__ ids,
                                             const float* __restrict__ dout,
                                             float* __restrict__ dtable, unsigned long long rows,
                                             unsigned dim, unsigned long long vocab) {
    const unsigned long long row = (unsigned long long)blockIdx.x * blockDim.y + threadIdx.y;
    if (row >= rows) return;
    const unsigned id = ids[row];
    if (id >= vocab) return;
    const float* g = dout + row * dim;
    float* dst = dtable + (size_t)id * dim;
    if ((dim & 3u) == 0) {
        for (unsigned c = threadIdx.x * 4; c < dim; c += 128) {
            const Vf<4> v = ld<4>(g + c);
#pragma unroll
            for (int k = 0; k < 4; ++k) atomicAdd(dst + c + k, v.v[k]);
        }
    } else {
        for (unsigned c = threadIdx.x; c < dim; c += 32) atomicAdd(dst + c, g[c]);
    }
}

// The same scatter-add for small vocabularies (many rows per id), in a fixed order, so that
// the result is the same bits on every run (the global-atomic kernel above is not). Two
// kernels. Part: block (bx, by) owns columns [bx·tile, bx·tile + tile) and rows
// [by·chunk, by·chunk + chunk); its thread c owns column c and adds the block's rows into a
// vocab × tile slice of shared memory in row order (no other thread touches that column, so
// no atomics), then writes the slice, zeros included, to part[by] (chunks × vocab × dim).
// Sum: dtable[e] = part[0][e] + part[1][e] + ... in chunk order.
extern "C" __global__ void embedding_bwd_part_f32(const unsigned* __restrict__ ids,
                                                  const float* __restrict__ dout,
                                                  float* __restrict__ part,
                                                  unsigned long long rows, unsigned dim,
                                                  unsigned vocab, unsigned tile,
                                                  unsigned long long chunk) {
    extern __shared__ float acc[];  // vocab · tile
    const unsigned c = threadIdx.x, c0 = blockIdx.x * tile;
    const unsigned tw = min(tile, dim - c0);
    const unsigned long long r0 = blockIdx.y * chunk;
    const unsigned long long r1 = min(rows, r0 + chunk);
    if (c >= tw) return;  // no barrier below: each thread only touches its own column
    for (unsigned v = 0; v < vocab; ++v) acc[v * tile + c] = 0.0f;
    const float* __restrict__ g = dout + c0 + c;
#pragma unroll 4
    for (unsigned long long r = r0; r < r1; ++r) {
        const unsigned id = __ldg(ids + r);
        const float x = __ldg(g + r * dim);
        if (id < vocab) acc[id * tile + c] += x;
    }
    float* __restrict__ out = part + (size_t)blockIdx.y * vocab * dim + c0 + c;
    for (unsigned v = 0; v < vocab; ++v) out[(size_t)v * dim] = acc[v * tile + c];
}

extern "C" __global__ void embedding_bwd_sum_f32(const float* __restrict__ part,
                                                 float* __restrict__ dtable,
                                                 unsigned long long n, unsigned chunks) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long e = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += stride) {
        float s = 0.0f;
        for (unsigned p = 0; p < chunks; ++p) s += __ldg(part + (size_t)p * n + e);
        dtable[e] = s;
    }
}
