// Gated outputs, per element, written in the next GEMM's input dtype:
//   gelu == 0: Qwen3.5 / Qwen3-Next gated attention, out = attn * sigmoid(gate)
//              (Device::sigmoid_gate: `a * sigmoid(g)`);
//   gelu == 1: Gemma 4's per-layer input gate, out = gelu_tanh(attn) * gate
//              (Device::gelu_tanh_gate).
//   attn [T, qd] f32, gate: column gate_col + i of rows gate_stride apart, out [T, qd].
// Launch: grid (T, ceil(qd / 256)), block (256): a block's row is blockIdx.x.
template <typename OUT>
__device__ void attn_gate_t(const float* attn, const float* gate, long long gate_stride,
                            int gate_col, OUT* out, int qd, int gelu) {
    const size_t t = blockIdx.x;
    const int i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i < qd) {
        const float g = gate[t * gate_stride + gate_col + i];
        const float a = attn[t * qd + i];
        const float o = gelu ? gelu_tanh_times(a, g) : __fmul_rn(a, 1.0f / (1.0f + expf(-g)));
        out[t * qd + i] = from_f32<OUT>(o);
    }
}
extern "C" __global__ void attn_gate_f32(const float* attn, const float* gate,
                                         long long gate_stride, int gate_col, float* out,
                                         int qd, int gelu) {
    attn_gate_t<float>(attn, gate, gate_stride, gate_col, out, qd, gelu);
}
extern "C" __global__ void attn_gate_bf16(const float* attn, const float* gate,
                                          long long gate_stride, int gate_col, bf16_t* out,
                                          int qd, int gelu) {
    attn_gate_t<bf16_t>(attn, gate, gate_stride, gate_col, out, qd, gelu);
}
extern "C" __global__ void attn_gate_f16(const float* attn, const float* gate,
                                         long long gate_stride, int gate_col, f16_t* out,
                                         int qd, int gelu) {
    attn_gate_t<f16_t>(attn, gate, gate_stride, gate_col, out, qd, gelu);
}
