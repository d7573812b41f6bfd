// RMSNorm as transformers computes it (and src/kernels/cpu/ops.rs::rms_norm_row): the mean of
// squares in f64, rounded to f32, then `w * (x * r)` with r = f32(1 / sqrt(var + eps)).
// One block per row, so a row's result never depends on the other rows of the batch.

// Launch: grid (rows), block (256), no dynamic shared memory.
template <typename OUT>
__device__ void rms_norm_body(const float* x, const float* w, OUT* out, int n, double eps) {
    __shared__ double scratch[32];
    double acc = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        double v = (double)x[i];
        acc += v * v;
    }
    const double sum = block_sum_f64(acc, scratch);
    const float var = (float)(sum / (double)n);
    const float r = (float)(1.0 / sqrt((double)var + eps));
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        out[i] = from_f32<OUT>(__fmul_rn(w[i], __fmul_rn(x[i], r)));
    }
}

template <typename OUT>
__device__ void rms_norm_t(const float* x, const float* w, OUT* out, int n, double eps) {
    const size_t row = blockIdx.x;
    rms_norm_body<OUT>(x + row * n, w, out + row * n, n, eps);
}

// x += y (the residual add, kept exact in f32), then out = rms_norm(x): one pass fewer than
// an add kernel followed by a norm. Each thread re-reads only the elements it wrote itself.
template <typename OUT>
__device__ void add_rms_norm_t(float* x, const float* y, const float* w, OUT* out, int n,
                               double eps) {
    const size_t row = blockIdx.x;
    float* xr = x + row * n;
    const float* yr = y + row * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) xr[i] = __fadd_rn(xr[i], yr[i]);
    rms_norm_body<OUT>(xr, w, out + row * n, n, eps);
}

extern "C" __global__ void rms_norm_f32(const float* x, const float* w, float* out, int n,
                                        double eps) {
    rms_norm_t<float>(x, w, out, n, eps);
}
extern "C" __global__ void rms_norm_bf16(const float* x, const float* w, bf16_t* out, int n,
                                         double eps) {
    rms_norm_t<bf16_t>(x, w, out, n, eps);
}
extern "C" __global__ void rms_norm_f16(const float* x, const float* w, f16_t* out, int n,
                                        double eps) {
    rms_norm_t<f16_t>(x, w, out, n, eps);
}
extern "C" __global__ void add_rms_norm_f32(float* x, const float* y, const float* w, float* out,
                                            int n, double eps) {
    add_rms_norm_t<float>(x, y, w, out, n, eps);
}
extern "C" __global__ void add_rms_norm_bf16(float* x, const float* y, const float* w,
                                             bf16_t* out, int n, double eps) {
    add_rms_norm_t<bf16_t>(x, y, w, out, n, eps);
}
extern "C" __global__ void add_rms_norm_f16(float* x, const float* y, const float* w, f16_t* out,
                                            int n, double eps) {
    add_rms_norm_t<f16_t>(x, y, w, out, n, eps);
}

// Per-head RMSNorm in place (Qwen3 q_norm / k_norm; MiniMax-M2's over a whole projection is one
// head of all its values): heads of `hd` values starting at column `col` of rows `stride` apart.
// Launch: grid (rows, heads), block (32), one warp per head.
extern "C" __global__ void head_rms_norm(float* x, long long stride, int col, int hd,
                                         const float* w, double eps) {
    float* h = x + (size_t)blockIdx.x * stride + col + (size_t)blockIdx.y * hd;
    double acc = 0.0;
    for (int i = threadIdx.x; i < hd; i += 32) {
        double v = (double)h[i];
        acc += v * v;
    }
    const double sum = warp_sum_f64(acc);
    const float var = (float)(sum / (double)hd);
    const float r = (float)(1.0 / sqrt((double)var + eps));
    for (int i = threadIdx.x; i < hd; i += 32) h[i] = __fmul_rn(w[i], __fmul_rn(h[i], r));
}

// Hyper-connections' norm (Qwen4-Exp's `hc_norm`): rows of `groups · n` values, each group of
// `n` normed alone with its own `n` values of `w`. Launch: grid (rows · groups), block (256).
extern "C" __global__ void group_rms_norm_f32(const float* x, const float* w, float* out, int n,
                                              int groups, double eps) {
    const size_t piece = blockIdx.x;
    rms_norm_body<float>(x + piece * n, w + (piece % groups) * n, out + piece * n, n, eps);
}
