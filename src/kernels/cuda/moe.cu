// Qwen3-Next sparse MoE pieces (Device::moe_*): the router's softmax + top-k, row
// gather into expert order, the shared-expert gate and the weighted combine. The expert
// GEMMs go through cuBLAS on contiguous per-expert row ranges.
//
// The host builds the permutation from the routing (top-k ids copied back once per MoE
// layer): expert e's rows are the tokens that chose e, in ascending token order, at
// perm rows off[e] .. off[e + 1]; tok_pos[t, i] is the perm row of token t's i-th expert in
// ASCENDING EXPERT order, with its weight tok_w[t, i], so the combine adds expert outputs in
// the CPU's order (ascending expert, from a zero row), then the gated shared expert.

#define MOE_MAX_PER_LANE 32  // experts <= 32 * 32 = 1024

// One warp per token (launch: grid (ceil(T / 4)), block (128)). logits [T, E] -> ids [T, top_k] (descending probability, lower index
// first on ties) and weights [T, top_k] (softmax probabilities, renormalised over the k when
// norm_topk != 0).
extern "C" __global__ void moe_route_f32(
    const float* __restrict__ logits,
    int* __restrict__ ids,
    float* __restrict__ weights,
    int num_tokens, int num_experts, int top_k, int norm_topk)
{
    const int lane = threadIdx.x & 31;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (warp >= num_tokens) {
        return;
    }
    const int t = (int)warp;
    const float* l = logits + (size_t)t * num_experts;
    float p[MOE_MAX_PER_LANE];
    warp_softmax(l, num_experts, lane, p);
    unsigned taken = 0u;  // bit r: entry lane + 32 r already chosen
    float chosen_sum = 0.0f;
    for (int i = 0; i < top_k; ++i) {
        // lane-local best: highest probability, lowest expert index on ties
        float bv = -1.0f;
        int be = 0x7fffffff;
#pragma unroll
        for (int r = 0; r < MOE_MAX_PER_LANE; ++r) {
            const int e = lane + 32 * r;
            if (e < num_experts && !(taken & (1u << r)) && p[r] > bv) {
                bv = p[r];
                be = e;
            }
        }
        float unused = 0.0f;
        warp_argmax(bv, be, unused);
        if ((be & 31) == lane) {
            taken |= 1u << (be >> 5);
        }
        chosen_sum = __fadd_rn(chosen_sum, bv);
        if (lane == 0) {
            ids[(size_t)t * top_k + i] = be;
            weights[(size_t)t * top_k + i] = bv;
        }
    }
    if (norm_topk != 0 && lane == 0) {
        for (int i = 0; i < top_k; ++i) {
            weights[(size_t)t * top_k + i] = weights[(size_t)t * top_k + i] / chosen_sum;
        }
    }
}

// out[i, :] = x[rows[i], :] for i < n (rows of width h): the normed rows (GEMM input dtype;
// bf16 and f16 are moved as raw 16-bit values). Launch: grid (n, ceil(h / 256)), block (256).
template <typename T>
__device__ void moe_gather_rows_t(const T* x, const int* rows, T* out, int n, int h) {
    const int i = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (i < n && c < h) {
        out[(size_t)i * h + c] = x[(size_t)rows[i] * h + c];
    }
}
extern "C" __global__ void moe_gather_rows_f32(const float* x, const int* rows, float* out,
                                               int n, int h) {
    moe_gather_rows_t<float>(x, rows, out, n, h);
}
extern "C" __global__ void moe_gather_rows_u16(const unsigned short* x, const int* rows,
                                               unsigned short* out, int n, int h) {
    moe_gather_rows_t<unsigned short>(x, rows, out, n, h);
}

// out[i, :] = x[rows[i], :] · scale[i], rounded to x's dtype once: Llama-4 scales each expert's
// input rows by their routing weights. Launch as moe_gather_rows.
template <typename T>
__device__ void moe_gather_scaled_t(const T* x, const int* rows, const float* scale, T* out,
                                    int n, int h) {
    const int i = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (i < n && c < h) {
        const float v = to_f32(x[(size_t)rows[i] * h + c]);
        out[(size_t)i * h + c] = from_f32<T>(__fmul_rn(v, scale[i]));
    }
}
#define HSX_GATHER_SCALED(NAME, T)                                                          \
    extern "C" __global__ void NAME(const T* x, const int* rows, const float* scale, T* out, \
                                    int n, int h) {                                          \
        moe_gather_scaled_t<T>(x, rows, scale, out, n, h);                                   \
    }
HSX_GATHER_SCALED(moe_gather_scaled_f32, float)
HSX_GATHER_SCALED(moe_gather_scaled_bf16, bf16_t)
HSX_GATHER_SCALED(moe_gather_scaled_f16, f16_t)

// gate[t] = sigmoid(x[t, :] . w) for the shared expert, x the normed rows in the GEMM input
// dtype, w f32 (one warp per token: a fixed-order dot, independent of the batch, where a GEMM
// with N = 1 need not be). Launch: grid (ceil(T / 4)), block (128).
template <typename IN>
__device__ void moe_shared_gate_t(const IN* x, const float* w, float* gate, int num_tokens,
                                  int h) {
    const int lane = threadIdx.x & 31;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (warp >= num_tokens) {
        return;
    }
    const IN* xr = x + (size_t)warp * h;
    float acc = 0.0f;
    for (int i = lane; i < h; i += 32) {
        acc = __fadd_rn(acc, __fmul_rn(to_f32(xr[i]), w[i]));
    }
    for (int off = 16; off > 0; off >>= 1) {
        acc = __fadd_rn(acc, __shfl_xor_sync(HSX_FULL_MASK, acc, off));
    }
    if (lane == 0) {
        gate[warp] = 1.0f / (1.0f + expf(-acc));
    }
}
extern "C" __global__ void moe_shared_gate_f32(const float* x, const float* w, float* gate,
                                               int num_tokens, int h) {
    moe_shared_gate_t<float>(x, w, gate, num_tokens, h);
}
extern "C" __global__ void moe_shared_gate_bf16(const bf16_t* x, const float* w, float* gate,
                                                int num_tokens, int h) {
    moe_shared_gate_t<bf16_t>(x, w, gate, num_tokens, h);
}
extern "C" __global__ void moe_shared_gate_f16(const f16_t* x, const float* w, float* gate,
                                               int num_tokens, int h) {
    moe_shared_gate_t<f16_t>(x, w, gate, num_tokens, h);
}

// out[t, c] = sum_i tok_w[t, i] * y[tok_pos[t, i], c]  (i ascending = expert ascending, from 0)
//             + gate[t] * shared[t, c]   (only when has_shared; else shared / gate are unread)
// Launch: grid (T, ceil(h / 256)), block (256).
extern "C" __global__ void moe_combine_f32(
    const float* __restrict__ y,
    const int* __restrict__ tok_pos,
    const float* __restrict__ tok_w,
    const float* __restrict__ shared,
    const float* __restrict__ gate,
    float* __restrict__ out,
    int num_tokens, int top_k, int h, int has_shared)
{
    const int t = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (t < num_tokens && c < h) {
        const size_t idx = (size_t)t * h + c;
        float acc = 0.0f;
        for (int i = 0; i < top_k; ++i) {
            const size_t k = (size_t)t * top_k + i;
            acc = __fadd_rn(acc, __fmul_rn(y[(size_t)tok_pos[k] * h + c], tok_w[k]));
        }
        out[idx] = has_shared != 0 ? __fadd_rn(acc, __fmul_rn(gate[t], shared[idx])) : acc;
    }
}
