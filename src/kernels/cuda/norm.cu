// Row norms as transformers computes them (and src/kernels/cpu/norm.rs): RMSNorm — the mean of
// squares in f64, rounded to f32, then `w * (x * r)` with r = f32(1 / sqrt(var + eps)) —,
// LayerNorm without a bias (Cohere's, CENTERED) — the mean in f64 rounded to f32, the variance
// of `x - mean` likewise, then `w * ((x - mean) * r)` — and with one (`nn.LayerNorm`, BIASED:
// then `+ b`, b stored after w).
// One block per row (or one warp per head), so a row's result never depends on the other rows.

// The norm of the n values x[lane + k * lanes] into out (may be x: each lane reads only the
// values it writes after the sums), `sum` adding one value from every lane of the group.
template <typename OUT, bool CENTERED, bool BIASED, typename SUM>
__device__ void norm_body(const float* x, const float* w, OUT* out, int n, double eps, int lane,
                          int lanes, SUM sum) {
    float mean = 0.0f;
    if (CENTERED) {
        double acc = 0.0;
        for (int i = lane; i < n; i += lanes) acc += (double)x[i];
        mean = (float)(sum(acc) / (double)n);
    }
    double acc = 0.0;
    for (int i = lane; i < n; i += lanes) {
        double v = (double)__fsub_rn(x[i], mean);
        acc += v * v;
    }
    const float var = (float)(sum(acc) / (double)n);
    const float r = (float)(1.0 / sqrt((double)var + eps));
    for (int i = lane; i < n; i += lanes) {
        float y = __fmul_rn(w[i], __fmul_rn(__fsub_rn(x[i], mean), r));
        if (BIASED) y = __fadd_rn(y, w[n + i]);
        out[i] = from_f32<OUT>(y);
    }
}

// norm_body over a whole block's threads. Launch: grid (rows), block (256), no dynamic shared
// memory.
template <typename OUT, bool CENTERED, bool BIASED>
__device__ void block_norm(const float* x, const float* w, OUT* out, int n, double eps) {
    __shared__ double scratch[32];
    norm_body<OUT, CENTERED, BIASED>(x, w, out, n, eps, threadIdx.x, blockDim.x,
                                     [&](double v) { return block_sum_f64(v, scratch); });
}

template <typename OUT, bool CENTERED, bool BIASED>
__device__ void norm_t(const float* x, const float* w, OUT* out, int n, double eps) {
    const size_t row = blockIdx.x;
    block_norm<OUT, CENTERED, BIASED>(x + row * n, w, out + row * n, n, eps);
}

// x += y (the residual add, kept exact in f32), then out = norm(x): one pass fewer than
// an add kernel followed by a norm. Each thread re-reads only the elements it wrote itself.
template <typename OUT, bool CENTERED, bool BIASED>
__device__ void add_norm_t(float* x, const float* y, const float* w, OUT* out, int n,
                           double eps) {
    const size_t row = blockIdx.x;
    float* xr = x + row * n;
    const float* yr = y + row * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) xr[i] = __fadd_rn(xr[i], yr[i]);
    block_norm<OUT, CENTERED, BIASED>(xr, w, out + row * n, n, eps);
}

// Entry points per kind (rms_norm, layer_norm: CENTERED, layer_norm_bias: also BIASED) and
// output dtype, each named by its first argument (what the loader finds them by):
// `{kind}_{dtype}`, `add_{kind}_{dtype}`.
#define HSX_NORM(NAME, OUT, CENTERED, BIASED)                                                     \
    extern "C" __global__ void NAME(const float* x, const float* w, OUT* out, int n, double eps) { \
        norm_t<OUT, CENTERED, BIASED>(x, w, out, n, eps);                                         \
    }
#define HSX_ADD_NORM(NAME, OUT, CENTERED, BIASED)                                                 \
    extern "C" __global__ void NAME(float* x, const float* y, const float* w, OUT* out, int n,    \
                                    double eps) {                                                 \
        add_norm_t<OUT, CENTERED, BIASED>(x, y, w, out, n, eps);                                  \
    }
HSX_NORM(rms_norm_f32, float, false, false)
HSX_NORM(rms_norm_bf16, bf16_t, false, false)
HSX_NORM(rms_norm_f16, f16_t, false, false)
HSX_ADD_NORM(add_rms_norm_f32, float, false, false)
HSX_ADD_NORM(add_rms_norm_bf16, bf16_t, false, false)
HSX_ADD_NORM(add_rms_norm_f16, f16_t, false, false)
HSX_NORM(layer_norm_f32, float, true, false)
HSX_NORM(layer_norm_bf16, bf16_t, true, false)
HSX_NORM(layer_norm_f16, f16_t, true, false)
HSX_ADD_NORM(add_layer_norm_f32, float, true, false)
HSX_ADD_NORM(add_layer_norm_bf16, bf16_t, true, false)
HSX_ADD_NORM(add_layer_norm_f16, f16_t, true, false)
HSX_NORM(layer_norm_bias_f32, float, true, true)
HSX_NORM(layer_norm_bias_bf16, bf16_t, true, true)
HSX_NORM(layer_norm_bias_f16, f16_t, true, true)
HSX_ADD_NORM(add_layer_norm_bias_f32, float, true, true)
HSX_ADD_NORM(add_layer_norm_bias_bf16, bf16_t, true, true)
HSX_ADD_NORM(add_layer_norm_bias_f16, f16_t, true, true)

// Per-head norm in place: RMSNorm (Qwen3 q_norm / k_norm; MiniMax-M2's over a whole projection
// is one head of all its values) or, `centred`, LayerNorm without a bias (Cohere's use_qk_norm),
// norm_body over one warp. Heads of `hd` values start at column `col` of rows `stride` apart;
// head h's weights start at w + h * w_stride (0: one weight vector for every head).
// Launch: grid (rows, heads), block (32), one warp per head.
extern "C" __global__ void head_norm(float* x, long long stride, int col, int hd, const float* w,
                                     long long w_stride, int centred, double eps) {
    float* h = x + (size_t)blockIdx.x * stride + col + (size_t)blockIdx.y * hd;
    const float* wh = w + (size_t)blockIdx.y * w_stride;
    const auto sum = [](double v) { return warp_sum_f64(v); };
    if (centred) {
        norm_body<float, true, false>(h, wh, h, hd, eps, threadIdx.x, 32, sum);
    } else {
        norm_body<float, false, false>(h, wh, h, hd, eps, threadIdx.x, 32, sum);
    }
}

// Hyper-connections' norm (Qwen4-Exp's `hc_norm`): rows of `groups · n` values, each group of
// `n` normed alone with its own `n` values of `w`. Launch: grid (rows · groups), block (256).
extern "C" __global__ void group_rms_norm_f32(const float* x, const float* w, float* out, int n,
                                              int groups, double eps) {
    const size_t piece = blockIdx.x;
    const float* wp = w + (piece % groups) * n;
    block_norm<float, false, false>(x + piece * n, wp, out + piece * n, n, eps);
}
