// Qwen3.5 / Qwen3-Next gated attention output: out = attn * sigmoid(gate), per element
// (Device::sigmoid_gate: `a * sigmoid(g)`), written in the o_proj GEMM's input dtype.
//   attn [T, qd] f32 (the attention output), gate: column gate_col + i of rows gate_stride
//   apart (the gate half of the q projection), out [T, qd].
// Launch: grid (ceil(T * qd / 256)), block (256).
template <typename OUT>
__device__ void attn_gate_t(const float* attn, const float* gate, long long gate_stride,
                            int gate_col, OUT* out, int qd, long long total) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < total) {
        const long long t = idx / qd;
        const long long i = idx - t * qd;
        const float g = gate[t * gate_stride + gate_col + i];
        out[idx] = from_f32<OUT>(__fmul_rn(attn[idx], 1.0f / (1.0f + expf(-g))));
    }
}
extern "C" __global__ void attn_gate_f32(const float* attn, const float* gate,
                                         long long gate_stride, int gate_col, float* out, int qd,
                                         long long total) {
    attn_gate_t<float>(attn, gate, gate_stride, gate_col, out, qd, total);
}
extern "C" __global__ void attn_gate_bf16(const float* attn, const float* gate,
                                          long long gate_stride, int gate_col, bf16_t* out,
                                          int qd, long long total) {
    attn_gate_t<bf16_t>(attn, gate, gate_stride, gate_col, out, qd, total);
}
extern "C" __global__ void attn_gate_f16(const float* attn, const float* gate,
                                         long long gate_stride, int gate_col, f16_t* out, int qd,
                                         long long total) {
    attn_gate_t<f16_t>(attn, gate, gate_stride, gate_col, out, qd, total);
}
