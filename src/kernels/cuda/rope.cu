// Rotary embedding, rotate-half convention (transformers apply_rotary_pos_emb), in place on
// heads inside wider rows (q and k inside the fused qkv rows). Partial rotary: only the first
// `rot` dims of each head rotate, pairs (i, i + rot/2); the rest pass through.
// inv_freq (rot/2 values) comes from the host (src/kernels/cpu/ops.rs::Rope, llama3 scaling
// included). Angles as the CPU: f32(inv_freq * f32(pos)), cos/sin in f64 rounded to f32.
//
// The angles depend on the row and the pair index only, so a block computes each pair's cos
// and sin once (double-precision sin / cos are the costly part) and every head reuses them.
// Launch: grid (rows), block (256): threads loop over the rot/2 pairs, then over heads * rot/2.
#define ROPE_MAX_HALF 256  // rot <= limits::ATTN_MAX_HEAD_DIM (512), checked by the caller
extern "C" __global__ void rope(float* x, long long stride, int col, int heads, int hd, int rot,
                                const int* positions, const float* inv_freq, float scale) {
    __shared__ float cs[ROPE_MAX_HALF], sn[ROPE_MAX_HALF];
    const size_t row = blockIdx.x;
    const int half = rot / 2;
    const float pos = (float)positions[row];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        rope_cos_sin(inv_freq, i, pos, scale, cs, sn);
    }
    __syncthreads();
    float* base = x + row * stride + col;
    for (int p = threadIdx.x; p < heads * half; p += blockDim.x) {
        const int h = p / half, i = p % half;
        const float c = cs[i], s = sn[i];
        float* head = base + (size_t)h * hd;
        const float x1 = head[i], x2 = head[i + half];
        head[i] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(-x2, s));
        head[i + half] = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
    }
}
