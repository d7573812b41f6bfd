// Gated outputs, per element, written in the next GEMM's input dtype (Device::gate):
//   kind 0: Qwen3.5 / Qwen3-Next gated attention, out = x * sigmoid(g);
//   kind 1: Gemma 4's per-layer input gate, out = gelu_tanh(x) * g;
//   kind 2: LFM2's short-conv gates, out = x * g.
//   x: column i of rows x_stride apart, g: column i of rows g_stride apart (both f32; the
//   caller passes column 0 of each range), out [T, w].
// Launch: grid (T, ceil(w / 256)), block (256): a block's row is blockIdx.x.
template <typename OUT>
__device__ void gate_t(const float* x, long long x_stride, const float* g, long long g_stride,
                       OUT* out, int w, int kind) {
    const size_t t = blockIdx.x;
    const int i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i < w) {
        const float b = g[t * g_stride + i];
        const float a = x[t * x_stride + i];
        float o;
        if (kind == 0) {
            o = __fmul_rn(a, 1.0f / (1.0f + expf(-b)));
        } else if (kind == 1) {
            o = gelu_tanh_times(a, b);
        } else {
            o = __fmul_rn(a, b);
        }
        out[t * w + i] = from_f32<OUT>(o);
    }
}
#define HSX_GATE(name, OUT)                                                                \
    extern "C" __global__ void name(const float* x, long long x_stride, const float* g, \
                                    long long g_stride, OUT* out, int w, int kind) {      \
        gate_t<OUT>(x, x_stride, g, g_stride, out, w, kind);                              \
    }
HSX_GATE(gate_f32, float)
HSX_GATE(gate_bf16, bf16_t)
HSX_GATE(gate_f16, f16_t)
