// Nemotron 3 MoE pieces (Device::moe_route_grouped, Device::moe_weighted_sum): the
// group-limited sigmoid router (transformers' NemotronHTopkRouter) and the weighted sum of the
// routed experts' outputs. Same choice and order as the CPU (src/kernels/cpu/moe_grouped.rs):
// lower group / expert index on ties, the renormalising sum in choice order from zero.

#define MOEG_MAX_PER_LANE 32  // experts <= 32 * 32 = 1024
#define MOEG_MAX_GROUPS 32

// The top two of (a >= b) and (oa >= ob), into a >= b.
__device__ __forceinline__ void moeg_top2_merge(float& a, float& b, float oa, float ob) {
    const float hi = fmaxf(a, oa);
    b = fmaxf(fminf(a, oa), fmaxf(b, ob));
    a = hi;
}

// One warp per token (launch: grid (ceil(T / 4)), block (128)). logits [T, E], bias [E] ->
// ids [T, top_k] (choice order) and weights [T, top_k]: s = sigmoid(logit) (score 0, 1) or the
// softmax of the token's logits (score 2: Mistral 4), choice = s + bias (logit + bias for
// score 1: Llama-4);
// groups of E / n_group experts ranked by the sum of their two best choice values (by the best
// one where group_best != 0: DeepSeek-V2's group_limited_greedy), the best topk_group kept; top_k experts by choice inside them; weights s, divided by their sum
// (+ renorm_eps) when renorm != 0, times scale.
extern "C" __global__ void moe_route_grouped_f32(
    const float* __restrict__ logits,
    const float* __restrict__ bias,
    int* __restrict__ ids,
    float* __restrict__ weights,
    int num_tokens, int num_experts, int top_k, int n_group, int topk_group, int renorm,
    float renorm_eps, float scale, int score, int group_best)
{
    const int lane = threadIdx.x & 31;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (warp >= num_tokens) {
        return;
    }
    const int t = (int)warp;
    const int gs = num_experts / n_group;
    const float* l = logits + (size_t)t * num_experts;
    float s[MOEG_MAX_PER_LANE];
    float c[MOEG_MAX_PER_LANE];
    if (score == 2) {
        warp_softmax(l, num_experts, lane, s);
    } else {
#pragma unroll
        for (int r = 0; r < MOEG_MAX_PER_LANE; ++r) {
            const int e = lane + 32 * r;
            s[r] = e < num_experts ? 1.0f / (1.0f + expf(-l[e])) : 0.0f;
        }
    }
#pragma unroll
    for (int r = 0; r < MOEG_MAX_PER_LANE; ++r) {
        const int e = lane + 32 * r;
        c[r] = e < num_experts ? __fadd_rn(score == 1 ? l[e] : s[r], bias[e]) : -HSX_INF;
    }
    // every lane ends with every group's score (butterfly reductions)
    float gsc[MOEG_MAX_GROUPS];
    for (int g = 0; g < n_group; ++g) {
        float a = -HSX_INF, b = -HSX_INF;
#pragma unroll
        for (int r = 0; r < MOEG_MAX_PER_LANE; ++r) {
            const int e = lane + 32 * r;
            if (e < num_experts && e / gs == g) {
                moeg_top2_merge(a, b, c[r], -HSX_INF);
            }
        }
        for (int off = 16; off > 0; off >>= 1) {
            const float oa = __shfl_xor_sync(HSX_FULL_MASK, a, off);
            const float ob = __shfl_xor_sync(HSX_FULL_MASK, b, off);
            moeg_top2_merge(a, b, oa, ob);
        }
        gsc[g] = group_best ? a : __fadd_rn(a, b);
    }
    unsigned kept = 0u;  // bit g: group g kept
    for (int i = 0; i < topk_group; ++i) {
        int bg = -1;
        for (int g = 0; g < n_group; ++g) {
            if (!(kept & (1u << g)) && (bg < 0 || gsc[g] > gsc[bg])) {
                bg = g;
            }
        }
        kept |= 1u << bg;
    }
    unsigned taken = 0u;  // bit r: entry lane + 32 r already chosen
    float chosen_sum = 0.0f;
    for (int i = 0; i < top_k; ++i) {
        // lane-local best: highest choice value, lowest expert index on ties
        float bv = -HSX_INF, bs = 0.0f;
        int be = 0x7fffffff;
#pragma unroll
        for (int r = 0; r < MOEG_MAX_PER_LANE; ++r) {
            const int e = lane + 32 * r;
            const bool ok = e < num_experts && !(taken & (1u << r)) && (kept & (1u << (e / gs)));
            if (ok && (be == 0x7fffffff || c[r] > bv)) {
                bv = c[r];
                bs = s[r];
                be = e;
            }
        }
        warp_argmax(bv, be, bs);
        if ((be & 31) == lane) {
            taken |= 1u << (be >> 5);
        }
        chosen_sum = __fadd_rn(chosen_sum, bs);
        if (lane == 0) {
            ids[(size_t)t * top_k + i] = be;
            weights[(size_t)t * top_k + i] = bs;
        }
    }
    if (lane == 0) {
        const float denom = __fadd_rn(chosen_sum, renorm_eps);
        for (int i = 0; i < top_k; ++i) {
            float w = weights[(size_t)t * top_k + i];
            if (renorm != 0) {
                w = w / denom;
            }
            weights[(size_t)t * top_k + i] = __fmul_rn(w, scale);
        }
    }
}

// out[t, c] = sum_i tok_w[t, i] * y[tok_pos[t, i], c]  (i ascending = expert ascending, from 0),
// written in OUT (the next GEMM's input dtype, or f32). Launch: grid (T, ceil(h / 256)),
// block (256).
template <typename OUT>
__device__ void moe_weighted_sum_t(const float* y, const int* tok_pos, const float* tok_w,
                                   OUT* out, int num_tokens, int top_k, int h) {
    const int t = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (t < num_tokens && c < h) {
        float acc = 0.0f;
        for (int i = 0; i < top_k; ++i) {
            const size_t k = (size_t)t * top_k + i;
            acc = __fadd_rn(acc, __fmul_rn(y[(size_t)tok_pos[k] * h + c], tok_w[k]));
        }
        out[(size_t)t * h + c] = from_f32<OUT>(acc);
    }
}
extern "C" __global__ void moe_weighted_sum_f32(const float* y, const int* tok_pos,
                                                const float* tok_w, float* out, int num_tokens,
                                                int top_k, int h) {
    moe_weighted_sum_t<float>(y, tok_pos, tok_w, out, num_tokens, top_k, h);
}
extern "C" __global__ void moe_weighted_sum_bf16(const float* y, const int* tok_pos,
                                                 const float* tok_w, bf16_t* out,
                                                 int num_tokens, int top_k, int h) {
    moe_weighted_sum_t<bf16_t>(y, tok_pos, tok_w, out, num_tokens, top_k, h);
}
extern "C" __global__ void moe_weighted_sum_f16(const float* y, const int* tok_pos,
                                                const float* tok_w, f16_t* out, int num_tokens,
                                                int top_k, int h) {
    moe_weighted_sum_t<f16_t>(y, tok_pos, tok_w, out, num_tokens, top_k, h);
}
