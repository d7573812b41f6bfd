// Hyper-connection steps (Qwen4-Exp's residual streams), element by element in the order of
// src/kernels/cpu/device_hyper.rs. Rows hold `streams` pieces of `h` values side by side.
// Launch (all): grid (ceil(total / 256)), block (256), grid-stride over `total` elements.

__device__ __forceinline__ float hyper_sigmoid(float v) {
    return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-v)));
}

// out[t, k·h + j] = x[t, j]; total = rows · streams · h.
extern "C" __global__ void hyper_repeat(const float* x, float* out, int h, int streams,
                                        long long total) {
    HSX_GRID_STRIDE(i, total) {
        const long long t = i / ((long long)streams * h);
        out[i] = x[t * h + i % h];
    }
}

// out = silu(x / divisor); total = rows · width.
template <typename OUT>
__device__ void silu_div_t(const float* x, OUT* out, float divisor, long long total) {
    HSX_GRID_STRIDE(i, total) {
        const float v = __fdiv_rn(x[i], divisor);
        out[i] = from_f32<OUT>(sigmoid_gate(v, v, 1.0f));
    }
}
extern "C" __global__ void silu_div_f32(const float* x, float* out, float divisor,
                                        long long total) {
    silu_div_t<float>(x, out, divisor, total);
}
extern "C" __global__ void silu_div_bf16(const float* x, bf16_t* out, float divisor,
                                         long long total) {
    silu_div_t<bf16_t>(x, out, divisor, total);
}
extern "C" __global__ void silu_div_f16(const float* x, f16_t* out, float divisor,
                                        long long total) {
    silu_div_t<f16_t>(x, out, divisor, total);
}

// out[t, j] = (sum over k in order of sigmoid(g[t, k·h + j]) · n[t, k·h + j]) · (1 / streams);
// total = rows · h.
template <typename OUT>
__device__ void hyper_mix_t(const float* n, const float* g, OUT* out, int h, int streams,
                            long long total) {
    const float inv = __fdiv_rn(1.0f, (float)streams);
    HSX_GRID_STRIDE(i, total) {
        const size_t base = (size_t)(i / h) * streams * h + (size_t)(i % h);
        float acc = 0.0f;
        for (int k = 0; k < streams; ++k) {
            const size_t e = base + (size_t)k * h;
            acc = __fadd_rn(acc, __fmul_rn(hyper_sigmoid(g[e]), n[e]));
        }
        out[i] = from_f32<OUT>(__fmul_rn(acc, inv));
    }
}
extern "C" __global__ void hyper_mix_f32(const float* n, const float* g, float* out, int h,
                                         int streams, long long total) {
    hyper_mix_t<float>(n, g, out, h, streams, total);
}
extern "C" __global__ void hyper_mix_bf16(const float* n, const float* g, bf16_t* out, int h,
                                          int streams, long long total) {
    hyper_mix_t<bf16_t>(n, g, out, h, streams, total);
}
extern "C" __global__ void hyper_mix_f16(const float* n, const float* g, f16_t* out, int h,
                                         int streams, long long total) {
    hyper_mix_t<f16_t>(n, g, out, h, streams, total);
}

// x[t, k·h + j] += y[t, j] · (2 · sigmoid(l[t, k] / streams)); total = rows · streams · h.
extern "C" __global__ void hyper_inject(float* x, const float* l, const float* y, int h,
                                        int streams, long long total) {
    HSX_GRID_STRIDE(i, total) {
        const long long t = i / ((long long)streams * h);
        const long long k = (i / h) % streams;
        const float s = hyper_sigmoid(__fdiv_rn(l[t * streams + k], (float)streams));
        x[i] = __fadd_rn(x[i], __fmul_rn(y[t * h + i % h], __fmul_rn(2.0f, s)));
    }
}

// Qwen4-Exp's n-gram gate, per row t and stream k: g = (key_k . query_k) / sqrt(h) (each lane
// sums its columns in order, then the warp's butterfly), g' = sign(g) sqrt(max(|g|, 1e-6))
// (NaN stays NaN), out_k = sigmoid(g') value. key, query, out [T, streams * h]; value [T, h].
// Launch: grid (T, streams), block (32).
extern "C" __global__ void ngram_gate(const float* key, const float* query, const float* value,
                                      float* out, int h, int streams) {
    const size_t t = blockIdx.x, k = blockIdx.y;
    const size_t base = (t * streams + k) * h;
    float acc = 0.0f;
    for (int j = threadIdx.x; j < h; j += 32)
        acc = __fadd_rn(acc, __fmul_rn(key[base + j], query[base + j]));
    const float dot = __fdiv_rn(warp_sum(acc), sqrtf((float)h));
    const float mag = isnan(dot) ? dot : sqrtf(fmaxf(fabsf(dot), 1e-6f));
    const float sgn = dot > 0.0f ? 1.0f : (dot < 0.0f ? -1.0f : 0.0f);
    const float g = hyper_sigmoid(__fmul_rn(mag, sgn));
    for (int j = threadIdx.x; j < h; j += 32) out[base + j] = __fmul_rn(g, value[t * h + j]);
}
