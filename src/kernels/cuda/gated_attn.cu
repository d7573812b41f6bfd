// Qwen3.5 / Qwen3-Next gated attention output: out = attn * sigmoid(gate), per element
// (Device::sigmoid_gate: `a * sigmoid(g)`), written in the o_proj GEMM's input dtype.
//   attn [T, qd] f32 (the attention output), gate: column gate_col + i of rows gate_stride
//   apart (the gate half of the q projection), out [T, qd].
// Launch: grid (T, ceil(qd / 256)), block (256): a block's row is blockIdx.x.
template <typename OUT>
__device__ void attn_gate_t(const float* attn, const float* gate, long long gate_stride,
                            int gate_col, OUT* out, int qd) {
    const size_t t = blockIdx.x;
    const int i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i < qd) {
        const float g = gate[t * gate_stride + gate_col + i];
        out[t * qd + i] = from_f32<OUT>(__fmul_rn(attn[t * qd + i], 1.0f / (1.0f + expf(-g))));
    }
}
extern "C" __global__ void attn_gate_f32(const float* attn, const float* gate,
                                         long long gate_stride, int gate_col, float* out,
                                         int qd) {
    attn_gate_t<float>(attn, gate, gate_stride, gate_col, out, qd);
}
extern "C" __global__ void attn_gate_bf16(const float* attn, const float* gate,
                                          long long gate_stride, int gate_col, bf16_t* out,
                                          int qd) {
    attn_gate_t<bf16_t>(attn, gate, gate_stride, gate_col, out, qd);
}
extern "C" __global__ void attn_gate_f16(const float* attn, const float* gate,
                                         long long gate_stride, int gate_col, f16_t* out,
                                         int qd) {
    attn_gate_t<f16_t>(attn, gate, gate_stride, gate_col, out, qd);
}
