// The two ends of a model: embedding gather (layer id 0) and the greedy pick of the LM head.

// x[t] = f32(table[tokens[t]]) * scale: table [vocab, hidden] in the weight dtype, x [T, hidden]
// f32; scale is Gemma's sqrt(hidden), 1 (no bit changed) for the other models.
// Token ids are range-checked on the host before the launch (BatchPlan), never here.
// Launch: grid (T), block (256).
template <typename W>
__device__ void embed_t(const unsigned int* tokens, const W* table, float* x, int hidden,
                        float scale) {
    const size_t t = blockIdx.x;
    const W* src = table + (size_t)tokens[t] * hidden;
    float* dst = x + t * hidden;
    for (int j = threadIdx.x; j < hidden; j += blockDim.x)
        dst[j] = __fmul_rn(to_f32(src[j]), scale);
}
extern "C" __global__ void embed_f32(const unsigned int* tokens, const float* table, float* x,
                                     int hidden, float scale) {
    embed_t<float>(tokens, table, x, hidden, scale);
}
extern "C" __global__ void embed_bf16(const unsigned int* tokens, const bf16_t* table, float* x,
                                      int hidden, float scale) {
    embed_t<bf16_t>(tokens, table, x, hidden, scale);
}
extern "C" __global__ void embed_f16(const unsigned int* tokens, const f16_t* table, float* x,
                                     int hidden, float scale) {
    embed_t<f16_t>(tokens, table, x, hidden, scale);
}

// out[i] = x[rows[i]] for [*, hidden] f32 rows (the last token of each sampled chunk).
// Launch: grid (n), block (256).
extern "C" __global__ void gather_rows(const float* x, const unsigned int* rows, float* out,
                                       int hidden) {
    const float* src = x + (size_t)rows[blockIdx.x] * hidden;
    float* dst = out + (size_t)blockIdx.x * hidden;
    for (int j = threadIdx.x; j < hidden; j += blockDim.x) dst[j] = src[j];
}

// Greedy token of each logits row: the first index of the largest value; NaNs never win (as
// src/kernels/cpu/ops.rs::argmax). Launch: grid (rows), block (256).
extern "C" __global__ void argmax_rows(const float* logits, int vocab, unsigned int* out) {
    __shared__ float best_v[256];
    __shared__ int best_i[256];
    const float* row = logits + (size_t)blockIdx.x * vocab;
    float bv = -HSX_INF;
    int bi = 0x7fffffff;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
        const float v = row[j];
        if (v > bv) { bv = v; bi = j; }  // strict: first index on ties; NaN compares false
    }
    best_v[threadIdx.x] = bv;
    best_i[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            const float ov = best_v[threadIdx.x + s];
            const int oi = best_i[threadIdx.x + s];
            const float mv = best_v[threadIdx.x];
            const int mi = best_i[threadIdx.x];
            if (ov > mv || (ov == mv && oi < mi)) {
                best_v[threadIdx.x] = ov;
                best_i[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = best_i[0] == 0x7fffffff ? 0u : (unsigned int)best_i[0];
}
