// Elementwise f32 kernels: seed B's vector add, binary add/mul, and relu/sigmoid/tanh.
// Each has a CPU reference in gpu-core (cpu.rs) and a parity test in gpu-cuda/tests.
//
// The binary and unary kernels are grid-stride loops over float4 (16-byte loads and stores,
// the buffers are 256-byte aligned), with a scalar tail for n % 4 elements.

// Seed B's vector add: one thread per element, the simplest kernel there is.
extern "C" __global__ void vector_add_f32(const float* a, const float* b, float* c,
                                          unsigned long long n) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

#define BINARY_KERNEL(NAME, EXPR)                                                              \
    extern "C" __global__ void NAME(const float* __restrict__ a, const float* __restrict__ b,  \
                                    float* __restrict__ out, unsigned long long n) {           \
        const unsigned long long n4 = n / 4;                                                   \
        const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;          \
        const float4* a4 = reinterpret_cast<const float4*>(a);                                 \
        const float4* b4 = reinterpret_cast<const float4*>(b);                                 \
        float4* o4 = reinterpret_cast<float4*>(out);                                           \
        for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; \
             i < n4; i += stride) {                                                            \
            float4 x = a4[i], y = b4[i], r;                                                    \
            { float p = x.x, q = y.x; r.x = (EXPR); }                                          \
            { float p = x.y, q = y.y; r.y = (EXPR); }                                          \
            { float p = x.z, q = y.z; r.z = (EXPR); }                                          \
            { float p = x.w, q = y.w; r.w = (EXPR); }                                          \
            o4[i] = r;                                                                         \
        }                                                                                      \
        const unsigned long long t = n4 * 4 + (unsigned long long)blockIdx.x * blockDim.x +    \
                                     threadIdx.x;                                              \
        if (t < n) { float p = a[t], q = b[t]; out[t] = (EXPR); }                             \
    }

#define UNARY_KERNEL(NAME, EXPR)                                                               \
    extern "C" __global__ void NAME(const float* __restrict__ x, float* __restrict__ out,      \
                                    unsigned long long n) {                                    \
        const unsigned long long n4 = n / 4;                                                   \
        const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;          \
        const float4* x4 = reinterpret_cast<const float4*>(x);                                 \
        float4* o4 = reinterpret_cast<float4*>(out);                                           \
        for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; \
             i < n4; i += stride) {                                                            \
            float4 v = x4[i], r;                                                               \
            { float p = v.x; r.x = (EXPR); }                                                   \
            { float p = v.y; r.y = (EXPR); }                                                   \
            { float p = v.z; r.z = (EXPR); }                                                   \
            { float p = v.w; r.w = (EXPR); }                                                   \
            o4[i] = r;                                                                         \
        }                                                                                      \
        const unsigned long long t = n4 * 4 + (unsigned long long)blockIdx.x * blockDim.x +    \
                                     threadIdx.x;                                              \
        if (t < n) { float p = x[t]; out[t] = (EXPR); }                                       \
    }

BINARY_KERNEL(add_f32, p + q)
BINARY_KERNEL(mul_f32, p * q)

// relu keeps NaN (p < 0 is false for NaN), as PyTorch does.
UNARY_KERNEL(relu_f32, p < 0.0f ? 0.0f : p)
UNARY_KERNEL(sigmoid_f32, 1.0f / (1.0f + expf(-p)))
UNARY_KERNEL(tanh_f32, tanhf(p))
