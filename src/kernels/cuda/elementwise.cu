// Element-wise kernels: SwiGLU / GeGLU on stacked gate/up rows, bias add, residual add, casts.
// Launch (all): grid (ceil(total / 256)), block (256) unless noted; `total` is a long long.

// Gated activations on stacked [gate | up] rows: out[t, i] = f(gu[t, i], gu[t, inter + i])
// for gu of shape [T, 2 * inter]. Launch: grid (T, ceil(inter / (256 * GLU_COLS))), block
// (256): a thread takes GLU_COLS columns of one row, 256 apart (each load of a warp is 32
// consecutive floats). The row is the block's, so no element needs a 64-bit division.
#define GLU_COLS 4
template <typename OUT, typename F>
__device__ __forceinline__ void glu_rows(const float* gu, OUT* out, int inter, F f) {
    const size_t t = blockIdx.x;
    const float* g = gu + t * 2 * inter;
    const float* u = g + inter;
    OUT* o = out + t * inter;
    const int i0 = blockIdx.y * blockDim.x * GLU_COLS + threadIdx.x;
#pragma unroll
    for (int e = 0; e < GLU_COLS; ++e) {
        const int i = i0 + e * blockDim.x;
        if (i < inter) o[i] = from_f32<OUT>(f(g[i], u[i]));
    }
}

// silu(g) * u.
template <typename OUT>
__device__ void silu_mul_t(const float* gu, OUT* out, int inter) {
    glu_rows<OUT>(gu, out, inter, [](float g, float u) { return sigmoid_gate(g, g, u); });
}
extern "C" __global__ void silu_mul_f32(const float* gu, float* out, int inter) {
    silu_mul_t<float>(gu, out, inter);
}
extern "C" __global__ void silu_mul_bf16(const float* gu, bf16_t* out, int inter) {
    silu_mul_t<bf16_t>(gu, out, inter);
}
extern "C" __global__ void silu_mul_f16(const float* gu, f16_t* out, int inter) {
    silu_mul_t<f16_t>(gu, out, inter);
}

// Gemma's GeGLU: gelu_tanh(g) * u (common.cuh's gelu_tanh_times).
template <typename OUT>
__device__ void gelu_tanh_mul_t(const float* gu, OUT* out, int inter) {
    glu_rows<OUT>(gu, out, inter, [](float g, float u) { return gelu_tanh_times(g, u); });
}
extern "C" __global__ void gelu_tanh_mul_f32(const float* gu, float* out, int inter) {
    gelu_tanh_mul_t<float>(gu, out, inter);
}
extern "C" __global__ void gelu_tanh_mul_bf16(const float* gu, bf16_t* out, int inter) {
    gelu_tanh_mul_t<bf16_t>(gu, out, inter);
}
extern "C" __global__ void gelu_tanh_mul_f16(const float* gu, f16_t* out, int inter) {
    gelu_tanh_mul_t<f16_t>(gu, out, inter);
}

// StarCoder2's ungated MLP activation: gelu_tanh(x) = gelu_tanh_times(x, 1) (times 1: exact,
// so the GeGLU's bits). Launch: grid (ceil(n / 256)), block (256).
template <typename OUT>
__device__ void gelu_tanh_t(const float* x, OUT* out, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = from_f32<OUT>(gelu_tanh_times(x[i], 1.0f));
}
extern "C" __global__ void gelu_tanh_f32(const float* x, float* out, long long n) {
    gelu_tanh_t<float>(x, out, n);
}
extern "C" __global__ void gelu_tanh_bf16(const float* x, bf16_t* out, long long n) {
    gelu_tanh_t<bf16_t>(x, out, n);
}
extern "C" __global__ void gelu_tanh_f16(const float* x, f16_t* out, long long n) {
    gelu_tanh_t<f16_t>(x, out, n);
}

// GPT-NeoX's exact GELU in torch's order: x * 0.5 * (1 + erf(x * (1/sqrt 2))) (erff: within
// 2 ulp of erf; the CPU's libm erff rounds otherwise, within the f32 tolerance).
// Launch: grid (ceil(n / 256)), block (256).
template <typename OUT>
__device__ void gelu_erf_t(const float* x, OUT* out, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = from_f32<OUT>(x[i] * 0.5f * (1.0f + erff(x[i] * 0.70710678118654752f)));
}
extern "C" __global__ void gelu_erf_f32(const float* x, float* out, long long n) {
    gelu_erf_t<float>(x, out, n);
}
extern "C" __global__ void gelu_erf_bf16(const float* x, bf16_t* out, long long n) {
    gelu_erf_t<bf16_t>(x, out, n);
}
extern "C" __global__ void gelu_erf_f16(const float* x, f16_t* out, long long n) {
    gelu_erf_t<f16_t>(x, out, n);
}

// gpt-oss's experts (transformers GptOssExperts._apply_gate):
// g = min(gate, limit), u = clamp(up, -limit, limit), out = (u + 1) * g * sigmoid(alpha * g).
template <typename OUT>
__device__ void swiglu_clamped_t(const float* gu, OUT* out, int inter, float alpha, float limit) {
    glu_rows<OUT>(gu, out, inter, [alpha, limit](float gate, float up) {
        const float g = fminf(gate, limit);
        const float u = fminf(fmaxf(up, -limit), limit);
        const float sig = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-__fmul_rn(g, alpha))));
        return __fmul_rn(__fadd_rn(u, 1.0f), __fmul_rn(g, sig));
    });
}
extern "C" __global__ void swiglu_clamped_f32(const float* gu, float* out, int inter, float alpha,
                                              float limit) {
    swiglu_clamped_t<float>(gu, out, inter, alpha, limit);
}
extern "C" __global__ void swiglu_clamped_bf16(const float* gu, bf16_t* out, int inter,
                                               float alpha, float limit) {
    swiglu_clamped_t<bf16_t>(gu, out, inter, alpha, limit);
}
extern "C" __global__ void swiglu_clamped_f16(const float* gu, f16_t* out, int inter, float alpha,
                                              float limit) {
    swiglu_clamped_t<f16_t>(gu, out, inter, alpha, limit);
}

// y[r, i] += b[i] for y of shape [rows, n] (total = rows * n).
extern "C" __global__ void bias_add(float* y, const float* b, int n, long long total) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < total) y[idx] = __fadd_rn(y[idx], b[idx % n]);
}

// x += y.
extern "C" __global__ void add_f32(float* x, const float* y, long long total) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < total) x[idx] = __fadd_rn(x[idx], y[idx]);
}

// x *= s (Granite's residual multiplier on a sublayer's output; MiMo-V2-Flash's value scale on an
// attention output, in the GEMM input dtype on a bf16 / f16 device: the f32 product rounded once).
template <typename T> __device__ __forceinline__ void scale_t(T* x, float s, long long total) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < total) x[idx] = from_f32<T>(__fmul_rn(to_f32(x[idx]), s));
}
extern "C" __global__ void scale_f32(float* x, float s, long long total) { scale_t(x, s, total); }
extern "C" __global__ void scale_bf16(bf16_t* x, float s, long long total) { scale_t(x, s, total); }
extern "C" __global__ void scale_f16(f16_t* x, float s, long long total) { scale_t(x, s, total); }

// x = clamp(x, -c, c) (OLMo's clip_qkv); NaN kept, as torch's clamp (both comparisons false).
template <typename T> __device__ __forceinline__ void clamp_t(T* x, float c, long long total) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < total) {
        const float v = to_f32(x[idx]);
        x[idx] = from_f32<T>(v < -c ? -c : (v > c ? c : v));
    }
}
extern "C" __global__ void clamp_f32(float* x, float c, long long total) { clamp_t(x, c, total); }
extern "C" __global__ void clamp_bf16(bf16_t* x, float c, long long total) { clamp_t(x, c, total); }
extern "C" __global__ void clamp_f16(f16_t* x, float c, long long total) { clamp_t(x, c, total); }

// out = a + b (capture of a split residual: hidden + residual).
extern "C" __global__ void add_into_f32(const float* a, const float* b, float* out,
                                        long long total) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < total) out[idx] = __fadd_rn(a[idx], b[idx]);
}

// f32 -> GEMM input dtype.
extern "C" __global__ void cast_f32_bf16(const float* x, bf16_t* out, long long total) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < total) out[idx] = from_f32<bf16_t>(x[idx]);
}
extern "C" __global__ void cast_f32_f16(const float* x, f16_t* out, long long total) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < total) out[idx] = from_f32<f16_t>(x[idx]);
}
