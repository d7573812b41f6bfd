// Gated DeltaNet (Qwen3.5 / Qwen3-Next linear attention): the gated delta rule over a packed
// varlen batch, with the [nv, dk, dv] f32 state of each request in its slot.
//
// Launch: gdn_qk_l2norm_f32 grid (ceil(T * 2 * nk / 4)), block (128); gated_delta_rule_f32
// grid (ceil(dv / 16), nv, num_seqs), block (128).
//
// Algorithm: TOKEN-SERIAL (the same recurrence as kernels::cpu::gdn::gated_delta_rule;
// chunked.cu has the chunked WY form, the default; HSX_CUDA_RECURRENT=serial runs this one).
// Column j of a head's state (its dk entries) evolves on its own:
//   S[:, j] *= exp(g_t);  m_j = k_t . S[:, j];  d_j = (v_tj - m_j) * beta_t;
//   S[:, j] += k_t * d_j;  o_tj = q_t . S[:, j]
// so each warp owns 4 value columns of one (chunk, value head) and walks that chunk's tokens
// in order, the state held in registers: lane = col_sub + 4 * part (col_sub 0..3, part 0..7);
// a lane keeps rows part, part + 8, ... (dk / 8 of them, dk <= 256) of its column, dot
// products finish with a fixed 3-step xor-shuffle tree. Parallel over chunks x value heads x
// value columns; a token's arithmetic does not depend on the batch or on where its request
// was split, so results are identical across chunkings (DESIGN.md §7 c).
//
// Layout (f32, row-major), after conv1d_f32 (with SiLU):
//   qkv   [T, qkv_stride]: q [nk * dk] | k [nk * dk] | v [nv * dv] (q, k normalised in place by
//         gdn_qk_l2norm_f32 first)
//   b, a  [T, ba_stride] each (column h = value head h; the caller passes offset pointers)
//   neg_a [nv] = -exp(A_log), dt_bias [nv]
//   state [slots, nv, dk, dv]
//   out   [T, nv * dv]
// g = neg_a[h] * softplus(a + dt_bias[h]), beta = sigmoid(b) * beta_scale (1, or 2 where
// negative eigenvalues are allowed); key head h / (nv / nk) serves value head h (transformers
// repeat_interleave). Kimi Delta Attention (per_channel) decays row i of head h's state by
// channel h * dk + i: kda_decay_f32 computes those decays first, once per (token, channel), into
// a buffer the serial kernel then takes as `a` [T, a_stride] in place of the raw gate.

__device__ __forceinline__ float gdn_softplus(float v) {
    return v > 20.0f ? v : log1pf(expf(v));
}

// L2-normalises every q and k head of each row in place (eps 1e-6, as FLA / transformers
// l2norm), then scales q by `q_scale` (dk^-0.5). One warp per (token, head of the 2 * nk).
extern "C" __global__ void gdn_qk_l2norm_f32(
    float* __restrict__ qkv, int qkv_stride,
    int num_tokens, int nk, int dk, float q_scale)
{
    const int lane = threadIdx.x & 31;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long total = (long long)num_tokens * 2 * nk;
    if (warp >= total) {
        return;
    }
    const int t = (int)(warp / (2 * nk));
    const int head = (int)(warp - (long long)t * 2 * nk);  // 0..nk: q, nk..2nk: k
    float* x = qkv + (size_t)t * qkv_stride + (size_t)head * dk;
    float ss = 0.0f;
    for (int i = lane; i < dk; i += 32) {
        ss = __fadd_rn(ss, __fmul_rn(x[i], x[i]));
    }
    for (int off = 16; off > 0; off >>= 1) {
        ss = __fadd_rn(ss, __shfl_xor_sync(HSX_FULL_MASK, ss, off));
    }
    const float inv = 1.0f / sqrtf(ss + 1e-6f);
    const bool is_q = head < nk;
    for (int i = lane; i < dk; i += 32) {
        float v = __fmul_rn(x[i], inv);
        if (is_q) {
            v = __fmul_rn(v, q_scale);
        }
        x[i] = v;
    }
}

// Kimi Delta Attention's decays: decay[t, c] = exp(neg_a[c / dk] * softplus(a[t, c] +
// dt_bias[c])) for the nv * dk channels c, in the serial kernel's order of operations (each of
// a head's dv column threads would otherwise recompute its dk decays every token).
// Launch: grid-stride over T * nv * dk.
extern "C" __global__ void kda_decay_f32(
    const float* __restrict__ a, int a_stride,
    const float* __restrict__ neg_a,
    const float* __restrict__ dt_bias,
    float* __restrict__ decay,
    int num_tokens, int nv, int dk)
{
    const long long width = (long long)nv * dk;
    HSX_GRID_STRIDE(idx, (long long)num_tokens * width) {
        const long long t = idx / width;
        const int c = (int)(idx - t * width);
        const float g = gdn_softplus(__fadd_rn(a[t * a_stride + c], dt_bias[c]));
        decay[idx] = expf(__fmul_rn(neg_a[c / dk], g));
    }
}

// grid: (ceil(dv / (ST_LANES * ST_WARPS)), nv, num_seqs); block: 32 * ST_WARPS threads.
extern "C" __global__ void gated_delta_rule_f32(
    const float* __restrict__ qkv, int qkv_stride,
    const float* __restrict__ b,
    const float* __restrict__ a, int ba_stride,
    const float* __restrict__ neg_a,
    const float* __restrict__ dt_bias,
    float* __restrict__ state,
    const int* __restrict__ seq_start,
    const int* __restrict__ seq_len,
    const int* __restrict__ seq_slot,
    float* __restrict__ out,
    int nk, int nv, int dk, int dv, float beta_scale, int a_stride, int per_channel)
{
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int col_sub = lane & (ST_LANES - 1);
    const int part = lane / ST_LANES;
    const int h = blockIdx.y;
    const int s = blockIdx.z;
    const int j = (blockIdx.x * ST_WARPS + warp) * ST_LANES + col_sub;
    // Lanes past dv still take part in the shuffles (full mask) but never load or store.
    const bool col_ok = j < dv;
    const int kh = h / (nv / nk);
    const int key_dim = nk * dk;
    const int r0 = seq_start[s];
    const int len = seq_len[s];
    float* st = state + ((size_t)seq_slot[s] * nv + h) * (size_t)dk * dv;

    float S[ST_MAX];
    state_load(S, st + j, dv, part, dk, col_ok);
    const float na = neg_a[h];
    float kreg[ST_MAX];
    for (int local = 0; local < len; ++local) {
        const size_t row = (size_t)(r0 + local);
        const float* x = qkv + row * qkv_stride;
        const float* ar = a + row * a_stride;
        // Gated DeltaNet: one decay for the head; Kimi Delta Attention: one per key channel,
        // already in `a` (kda_decay_f32).
        const float head_decay =
            per_channel ? 0.0f : expf(__fmul_rn(na, gdn_softplus(__fadd_rn(ar[h], dt_bias[h]))));
        const float beta = __fmul_rn(1.0f / (1.0f + expf(-b[row * ba_stride + h])), beta_scale);
        const float* kv = x + key_dim + (size_t)kh * dk;
        const float* qv = x + (size_t)kh * dk;
        float m = 0.0f;
#pragma unroll
        for (int r = 0; r < ST_MAX; ++r) {
            const int i = part + ST_PARTS * r;
            if (i < dk) {
                kreg[r] = kv[i];
                const float decay = per_channel ? ar[h * dk + i] : head_decay;
                S[r] = __fmul_rn(S[r], decay);
                m = __fadd_rn(m, __fmul_rn(S[r], kreg[r]));
            }
        }
        m = state_part_sum(m);
        const float vj = col_ok ? x[2 * key_dim + (size_t)h * dv + j] : 0.0f;
        const float delta = __fmul_rn(__fsub_rn(vj, m), beta);
        float o = 0.0f;
#pragma unroll
        for (int r = 0; r < ST_MAX; ++r) {
            const int i = part + ST_PARTS * r;
            if (i < dk) {
                S[r] = __fadd_rn(S[r], __fmul_rn(kreg[r], delta));
                o = __fadd_rn(o, __fmul_rn(S[r], qv[i]));
            }
        }
        o = state_part_sum(o);
        if (col_ok && part == 0) {
            out[row * ((size_t)nv * dv) + (size_t)h * dv + j] = o;
        }
    }
    state_store(S, st + j, dv, part, dk, col_ok);
}

// Qwen3.5 / Qwen3-Next gated norm per value head (kernels::cpu::recurrent::
// gated_rms_norm_then_gate):  out = w * (x * r) * silu(z),  r = f32(1 / sqrt(f32(mean(x^2)) +
// eps)) with the mean of squares accumulated in f64 (as the CPU). x [T, nv * dv] f32, z
// [T, z_stride] (column h * dv + i), out [T, nv * dv] in the out_proj GEMM's input dtype.
// Launch: grid (ceil(T * nv / 4)), block (128): one warp per (token, head).
template <typename OUT, bool SIGMOID>
__device__ void gdn_gated_norm_t(const float* x, const float* z, int z_stride, const float* w,
                                 OUT* out, int num_tokens, int nv, int dv, double eps) {
    const int lane = threadIdx.x & 31;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (warp >= (long long)num_tokens * nv) {
        return;
    }
    const int t = (int)(warp / nv);
    const int h = (int)(warp - (long long)t * nv);
    const size_t off = (size_t)t * nv * dv + (size_t)h * dv;
    const float* xr = x + off;
    const float* zr = z + (size_t)t * z_stride + (size_t)h * dv;
    double ss = 0.0;
    for (int i = lane; i < dv; i += 32) {
        const double v = (double)xr[i];
        ss += v * v;
    }
    ss = warp_sum_f64(ss);
    const float var = (float)(ss / (double)dv);
    const float r = (float)(1.0 / sqrt((double)var + eps));
    for (int i = lane; i < dv; i += 32) {
        const float zi = zr[i];
        const float denom = 1.0f + expf(-zi);
        const float gate = SIGMOID ? 1.0f / denom : zi / denom;
        out[off + i] = from_f32<OUT>(__fmul_rn(__fmul_rn(w[i], __fmul_rn(xr[i], r)), gate));
    }
}
#define HSX_GDN_NORM(NAME, OUT, SIGMOID)                                                      \
    extern "C" __global__ void NAME(const float* x, const float* z, int z_stride, const float* w, \
                                    OUT* out, int num_tokens, int nv, int dv, double eps) {       \
        gdn_gated_norm_t<OUT, SIGMOID>(x, z, z_stride, w, out, num_tokens, nv, dv, eps);          \
    }
HSX_GDN_NORM(gdn_gated_norm_f32, float, false)
HSX_GDN_NORM(gdn_gated_norm_bf16, bf16_t, false)
HSX_GDN_NORM(gdn_gated_norm_f16, f16_t, false)
// Kimi Delta Attention's: out = w * (x * r) * sigmoid(z).
HSX_GDN_NORM(gdn_sigmoid_norm_f32, float, true)
HSX_GDN_NORM(gdn_sigmoid_norm_bf16, bf16_t, true)
HSX_GDN_NORM(gdn_sigmoid_norm_f16, f16_t, true)
