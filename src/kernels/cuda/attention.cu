// The paged KV cache and causal GQA attention over it (prefill of a packed varlen batch).
//
// Cache layout, per layer: K and V each [num_blocks * block_size, kv_heads * hd] in the cache
// dtype; position p of a sequence lives in slot table[p / block_size] * block_size + p % bs.
//
// Fixed arithmetic per (token, head), whatever the batch or the chunking (DESIGN.md §7b): the
// keys of positions 0..len are read from the cache only (the batch's K/V are written first),
// in blocks of KB keys counted from position 0; a score is an fma chain over d = 0..hd from 0,
// times `scale` (exactly the CPU's dot product); softmax is online per key block (block max,
// rescale by exp(m_old - m_new)); values accumulate in key order. Rows of a tile never
// interact: a key block past a row's length is skipped for that row, keys past it inside a
// block get p = 0 and are never added.
//
// gpt-oss: with a sliding window (`window` > 0) row r sees keys lo_r = max(0, len_r - window)
// .. len_r only: blocks (still counted from position 0) wholly before lo_r are skipped for the
// row, keys before lo_r inside a block get p = 0 and are never added; the tile starts at the
// block of its first row's lo. With sinks (`sinks` non-null) the head's sink logit joins the
// max and the denominator once, after the last key block.

// K/V rows of one token from the fused qkv rows into the cache.
// Launch: grid (T), block (256).
template <typename C>
__device__ void kv_write_t(const float* qkv, long long stride, int k_col, int v_col, int kv_dim,
                           const long long* slots, C* kc, C* vc) {
    const size_t t = blockIdx.x;
    const size_t slot = (size_t)slots[t];
    const float* row = qkv + t * stride;
    for (int j = threadIdx.x; j < kv_dim; j += blockDim.x) {
        kc[slot * kv_dim + j] = from_f32<C>(row[k_col + j]);
        vc[slot * kv_dim + j] = from_f32<C>(row[v_col + j]);
    }
}
extern "C" __global__ void kv_write_f32(const float* qkv, long long stride, int k_col, int v_col,
                                        int kv_dim, const long long* slots, float* kc,
                                        float* vc) {
    kv_write_t<float>(qkv, stride, k_col, v_col, kv_dim, slots, kc, vc);
}
extern "C" __global__ void kv_write_bf16(const float* qkv, long long stride, int k_col,
                                         int v_col, int kv_dim, const long long* slots,
                                         bf16_t* kc, bf16_t* vc) {
    kv_write_t<bf16_t>(qkv, stride, k_col, v_col, kv_dim, slots, kc, vc);
}
extern "C" __global__ void kv_write_f16(const float* qkv, long long stride, int k_col, int v_col,
                                        int kv_dim, const long long* slots, f16_t* kc,
                                        f16_t* vc) {
    kv_write_t<f16_t>(qkv, stride, k_col, v_col, kv_dim, slots, kc, vc);
}

#define ATTN_WARPS 4
#define ATTN_TILE 16                         // query tokens per tile (one sequence run)
#define ATTN_ROWS (ATTN_TILE / ATTN_WARPS)   // rows per warp
#define ATTN_MAX_HD 256
#define ATTN_DIMS (ATTN_MAX_HD / 32)         // dims per lane

struct AttnArgs {
    const float* q;          // [T, *] f32, head h at column q_col + h * hd, rows q_stride apart
    long long q_stride;
    int q_col;
    const int* tiles;        // [num_tiles, 3]: first token, tokens (<= ATTN_TILE), seq index
    const int* positions;    // [T]
    const int* tables;       // block tables of all seqs, flattened
    const int* table_start;  // [num_seqs] offset of each seq's table in `tables`
    int heads, kv_heads, hd, block_size, kb;
    float scale;
    const float* sinks;      // [heads] sink logits, or null
    int window;              // sliding window in keys, or 0 for none
};

// Launch: grid (num_tiles, heads), block (32 * ATTN_WARPS), dynamic shared memory
// (ATTN_TILE * hd + kb * (hd + 1) + kb * hd) floats; kb <= 32, hd <= 256, hd % 32 == 0 not
// required (lanes past hd idle).
template <typename C, typename OUT>
__device__ void attention_t(const AttnArgs a, const C* kc, const C* vc, OUT* out) {
    extern __shared__ float smem[];
    const int hd = a.hd, kb_n = a.kb;
    float* qs = smem;                         // [ATTN_TILE][hd]
    float* ks = qs + ATTN_TILE * hd;          // [kb][hd + 1] (padded: no bank conflicts)
    float* vs = ks + kb_n * (hd + 1);         // [kb][hd]
    const int h = blockIdx.y, g = h / (a.heads / a.kv_heads);
    const int t0 = a.tiles[blockIdx.x * 3], n = a.tiles[blockIdx.x * 3 + 1];
    const int* table = a.tables + a.table_start[a.tiles[blockIdx.x * 3 + 2]];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kv_dim = a.kv_heads * hd;
    const int max_len = a.positions[t0 + n - 1] + 1;

    for (int i = threadIdx.x; i < ATTN_TILE * hd; i += blockDim.x) {
        const int r = i / hd, d = i % hd;
        qs[i] = r < n ? a.q[(size_t)(t0 + r) * a.q_stride + a.q_col + (size_t)h * hd + d] : 0.f;
    }
    float m[ATTN_ROWS], l[ATTN_ROWS], acc[ATTN_ROWS][ATTN_DIMS];
    int len[ATTN_ROWS], lo[ATTN_ROWS];
#pragma unroll
    for (int ri = 0; ri < ATTN_ROWS; ++ri) {
        const int r = warp + ri * ATTN_WARPS;
        len[ri] = r < n ? a.positions[t0 + r] + 1 : 0;
        lo[ri] = a.window > 0 ? max(0, len[ri] - a.window) : 0;
        m[ri] = -HSX_INF;
        l[ri] = 0.f;
#pragma unroll
        for (int c = 0; c < ATTN_DIMS; ++c) acc[ri][c] = 0.f;
    }
    const int first = a.window > 0 ? max(0, a.positions[t0] + 1 - a.window) : 0;
    for (int kb = first / kb_n * kb_n; kb < max_len; kb += kb_n) {
        __syncthreads();  // the previous block's keys are no longer read (and qs is written)
        for (int i = threadIdx.x; i < kb_n * hd; i += blockDim.x) {
            const int j = i / hd, d = i % hd, p = kb + j;
            float kv = 0.f, vv = 0.f;
            if (p < max_len) {
                const size_t slot =
                    (size_t)table[p / a.block_size] * a.block_size + p % a.block_size;
                const size_t off = slot * kv_dim + (size_t)g * hd + d;
                kv = to_f32(kc[off]);
                vv = to_f32(vc[off]);
            }
            ks[j * (hd + 1) + d] = kv;
            vs[j * hd + d] = vv;
        }
        __syncthreads();
#pragma unroll
        for (int ri = 0; ri < ATTN_ROWS; ++ri) {
            // warp-uniform: every lane has the same row
            if (kb >= len[ri] || kb + kb_n <= lo[ri]) continue;
            const float* qr = qs + (warp + ri * ATTN_WARPS) * hd;
            const bool valid = lane < kb_n && kb + lane < len[ri] && kb + lane >= lo[ri];
            float s = -HSX_INF;
            if (valid) {
                float dot = 0.f;
                const float* kr = ks + lane * (hd + 1);
                for (int d = 0; d < hd; ++d) dot = fmaf(kr[d], qr[d], dot);
                s = __fmul_rn(dot, a.scale);
            }
            const float m_new = fmaxf(m[ri], warp_max(s));
            const float alpha = expf(m[ri] - m_new);  // exp(-inf) = 0 on the first block
            const float p = valid ? expf(s - m_new) : 0.f;
            l[ri] = fmaf(l[ri], alpha, warp_sum(p));
#pragma unroll
            for (int c = 0; c < ATTN_DIMS; ++c) acc[ri][c] *= alpha;
            const int keys = min(kb_n, len[ri] - kb);
            for (int j = max(0, lo[ri] - kb); j < keys; ++j) {
                const float pj = __shfl_sync(HSX_FULL_MASK, p, j);
#pragma unroll
                for (int c = 0; c < ATTN_DIMS; ++c) {
                    const int d = lane + 32 * c;
                    if (d < hd) acc[ri][c] = fmaf(pj, vs[j * hd + d], acc[ri][c]);
                }
            }
            m[ri] = m_new;
        }
    }
#pragma unroll
    for (int ri = 0; ri < ATTN_ROWS; ++ri) {
        const int r = warp + ri * ATTN_WARPS;
        if (r >= n) continue;
        if (a.sinks != nullptr) {
            const float sink = a.sinks[h];
            const float m_new = fmaxf(m[ri], sink);
            const float alpha = expf(m[ri] - m_new);
            l[ri] = fmaf(l[ri], alpha, expf(sink - m_new));
#pragma unroll
            for (int c = 0; c < ATTN_DIMS; ++c) acc[ri][c] *= alpha;
        }
        const float inv = 1.0f / l[ri];
        OUT* o = out + (size_t)(t0 + r) * a.heads * hd + (size_t)h * hd;
#pragma unroll
        for (int c = 0; c < ATTN_DIMS; ++c) {
            const int d = lane + 32 * c;
            if (d < hd) o[d] = from_f32<OUT>(__fmul_rn(acc[ri][c], inv));
        }
    }
}

#define HSX_ATTN(NAME, C, OUT)                                                               \
    extern "C" __global__ void NAME(const AttnArgs a, const C* kc, const C* vc, OUT* out) {  \
        attention_t<C, OUT>(a, kc, vc, out);                                                 \
    }
HSX_ATTN(attention_f32_f32, float, float)
HSX_ATTN(attention_bf16_bf16, bf16_t, bf16_t)
HSX_ATTN(attention_bf16_f32, bf16_t, float)
HSX_ATTN(attention_f16_f16, f16_t, f16_t)
HSX_ATTN(attention_f16_f32, f16_t, float)
