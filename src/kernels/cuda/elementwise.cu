// Element-wise kernels: SwiGLU on stacked gate/up rows, bias add, residual add, casts.
// Launch (all): grid (ceil(total / 256)), block (256) unless noted; `total` is a long long.

// out[t, i] = silu(gu[t, i]) * gu[t, inter + i] for gu of shape [T, 2 * inter].
template <typename OUT>
__device__ void silu_mul_t(const float* gu, OUT* out, int inter, long long total) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    const long long t = idx / inter, i = idx % inter;
    const float g = gu[t * 2 * inter + i];
    const float u = gu[t * 2 * inter + inter + i];
    out[idx] = from_f32<OUT>(__fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u));
}
extern "C" __global__ void silu_mul_f32(const float* gu, float* out, int inter, long long total) {
    silu_mul_t<float>(gu, out, inter, total);
}
extern "C" __global__ void silu_mul_bf16(const float* gu, bf16_t* out, int inter,
                                         long long total) {
    silu_mul_t<bf16_t>(gu, out, inter, total);
}
extern "C" __global__ void silu_mul_f16(const float* gu, f16_t* out, int inter, long long total) {
    silu_mul_t<f16_t>(gu, out, inter, total);
}

// gpt-oss's experts (transformers GptOssExperts._apply_gate) on [gate | up] rows:
// g = min(gate, limit), u = clamp(up, -limit, limit), out = (u + 1) * g * sigmoid(alpha * g).
template <typename OUT>
__device__ void swiglu_clamped_t(const float* gu, OUT* out, int inter, float alpha, float limit,
                                 long long total) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    const long long t = idx / inter, i = idx % inter;
    const float g = fminf(gu[t * 2 * inter + i], limit);
    const float u = fminf(fmaxf(gu[t * 2 * inter + inter + i], -limit), limit);
    const float sig = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-__fmul_rn(g, alpha))));
    out[idx] = from_f32<OUT>(__fmul_rn(__fadd_rn(u, 1.0f), __fmul_rn(g, sig)));
}
extern "C" __global__ void swiglu_clamped_f32(const float* gu, float* out, int inter, float alpha,
                                            float limit, long long total) {
    swiglu_clamped_t<float>(gu, out, inter, alpha, limit, total);
}
extern "C" __global__ void swiglu_clamped_bf16(const float* gu, bf16_t* out, int inter, float alpha,
                                            float limit, long long total) {
    swiglu_clamped_t<bf16_t>(gu, out, inter, alpha, limit, total);
}
extern "C" __global__ void swiglu_clamped_f16(const float* gu, f16_t* out, int inter, float alpha,
                                            float limit, long long total) {
    swiglu_clamped_t<f16_t>(gu, out, inter, alpha, limit, total);
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
