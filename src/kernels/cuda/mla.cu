// Multi-head latent attention's heads as a fused q / k / v projection for the attention
// kernels (Device::mla_heads): out [T, 3 * heads * D], D = nope + rope. A q or k head is its
// rotated dims (de-interleaved when `interleave`: x0, x2, ..., x1, x3, ...) then its nope dims;
// every k head's rotated dims are the shared k_rope row; a v head is its v dims then zeros.
//   q [T, heads * D] (per head nope | rope), kv [T, heads * (nope + v)] (per head nope | v),
//   k_rope [T, rope]; all f32.
// Launch: grid (T, ceil(3 * heads * D / 256)), block (256): a block's row is blockIdx.x.
__device__ __forceinline__ int mla_rope_source(int c, int rope, int interleave) {
    if (!interleave) return c;
    return c < rope / 2 ? 2 * c : 2 * (c - rope / 2) + 1;
}
extern "C" __global__ void mla_heads_f32(const float* q, const float* kv, const float* k_rope,
                                         float* out, int heads, int nope, int rope, int v,
                                         int interleave) {
    const size_t t = blockIdx.x;
    const int d = nope + rope;
    const int hd = heads * d;
    const int j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= 3 * hd) return;
    const int part = j / hd, h = (j % hd) / d, c = j % d;
    const float* qh = q + t * (size_t)hd + (size_t)h * d;
    const float* kvh = kv + t * (size_t)heads * (nope + v) + (size_t)h * (nope + v);
    float x = 0.0f;
    if (part == 0) {
        x = c < rope ? qh[nope + mla_rope_source(c, rope, interleave)] : qh[c - rope];
    } else if (part == 1) {
        x = c < rope ? k_rope[t * rope + mla_rope_source(c, rope, interleave)] : kvh[c - rope];
    } else if (c < v) {
        x = kvh[nope + c];
    }
    out[t * 3 * (size_t)hd + j] = x;
}
