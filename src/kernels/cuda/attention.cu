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
// .. len_r only (Llama-4's chunks, `chunk` > 0: lo_r = p - p % chunk for position p): blocks
// (still counted from position 0) wholly before lo_r are skipped for the row, keys before lo_r
// inside a block get p = 0 and are never added; the tile starts at the block of its first
// row's lo. With sinks (`sinks` non-null) the head's sink logit joins the max and the
// denominator once, after the last key block. The query temperature (`temp_floor` > 0:
// Llama-4's, Mistral's) multiplies each query by its position's factor as it is loaded (in
// f32, before the tensor-core kernel rounds it to bf16).

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

// The cache slot of position p of the sequence whose block table is `table` (see the top).
__device__ __forceinline__ size_t cache_slot(const int* table, int block_size, int p) {
    return (size_t)table[p / block_size] * block_size + p % block_size;
}

#define ATTN_WARPS 4
#define ATTN_TILE 16                         // query tokens per tile (one sequence run)
#define ATTN_ROWS (ATTN_TILE / ATTN_WARPS)   // rows per warp
#define ATTN_DIMS 8        // dims per lane: heads up to 256
#define ATTN_WIDE_DIMS 16  // attention_wide_*: heads up to 512 (Gemma 4's full layers)

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
    int chunk;               // Llama-4's chunks of keys, or 0 for none (never with a window)
    float temp_floor;        // the query temperature: floor_scale, or 0 for none
    float temp_scale;        //   attn_scale
    float temp_offset;       //   and offset (QueryTemperature)
    int dense_below;         // only queries at positions below it (DeepSeek Sparse Attention's
                             // index_topk: its sparse pass writes the rest), or 0 for all
    float softcap;           // Gemma-2's attn_logit_softcapping, or 0 for none
};

// The tile's rows this pass computes: its first n, or (dense_below) those at positions below
// dense_below (a tile's positions are consecutive). <= 0: none.
__device__ __forceinline__ int attn_tile_rows(const AttnArgs& a, int t0, int n) {
    return a.dense_below > 0 ? min(n, a.dense_below - a.positions[t0]) : n;
}

// First key a query at position p sees: its window's or its chunk's start (0 for neither).
__device__ __forceinline__ int attn_first_key(const AttnArgs& a, int p) {
    if (a.window > 0) return max(0, p + 1 - a.window);
    if (a.chunk > 0) return p - p % a.chunk;
    return 0;
}

// The temperature factor of the query at position p (f32, as the CPU computes it; 1 for none).
__device__ __forceinline__ float attn_temp(const AttnArgs& a, int p) {
    if (a.temp_floor <= 0.f) return 1.0f;
    return __fadd_rn(
        __fmul_rn(log1pf(floorf(__fdiv_rn(__fadd_rn((float)p, a.temp_offset), a.temp_floor))),
                  a.temp_scale),
        1.0f);
}

// A scaled score soft-capped, cap * tanh(s / cap), as the CPU and transformers compute it (s
// itself without a cap).
__device__ __forceinline__ float attn_cap(const AttnArgs& a, float s) {
    return a.softcap > 0.f ? __fmul_rn(tanhf(__fdiv_rn(s, a.softcap)), a.softcap) : s;
}

// The query at position p times its temperature factor.
__device__ __forceinline__ float attn_query(const AttnArgs& a, float q, int p) {
    return a.temp_floor <= 0.f ? q : __fmul_rn(q, attn_temp(a, p));
}

// Launch: grid (num_tiles, heads), block (32 * ATTN_WARPS), dynamic shared memory
// (ATTN_TILE * hd + kb * (hd + 1) + kb * hd) floats; kb <= 32, hd <= 32 * DIMS, hd % 32 == 0
// not required (lanes past hd idle). Heads over 256 take the DIMS 16 build (attention_wide_*):
// its query tile alone is 32 KiB at 512, so its key blocks are 2 keys (kv_cache.rs) — the same
// arithmetic per row, slower.
template <typename C, typename OUT, int DIMS>
__device__ void attention_t(const AttnArgs a, const C* kc, const C* vc, OUT* out) {
    extern __shared__ float smem[];
    const int hd = a.hd, kb_n = a.kb;
    float* qs = smem;                         // [ATTN_TILE][hd]
    float* ks = qs + ATTN_TILE * hd;          // [kb][hd + 1] (padded: no bank conflicts)
    float* vs = ks + kb_n * (hd + 1);         // [kb][hd]
    const int h = blockIdx.y, g = h / (a.heads / a.kv_heads);
    const int t0 = a.tiles[blockIdx.x * 3];
    const int n = attn_tile_rows(a, t0, a.tiles[blockIdx.x * 3 + 1]);
    if (n <= 0) return;  // the whole block: no thread has synchronised yet
    const int* table = a.tables + a.table_start[a.tiles[blockIdx.x * 3 + 2]];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kv_dim = a.kv_heads * hd;
    const int max_len = a.positions[t0 + n - 1] + 1;

    for (int i = threadIdx.x; i < ATTN_TILE * hd; i += blockDim.x) {
        const int r = i / hd, d = i % hd;
        qs[i] = r < n ? attn_query(a, a.q[(size_t)(t0 + r) * a.q_stride + a.q_col + (size_t)h * hd + d],
                                   a.positions[t0 + r])
                      : 0.f;
    }
    float m[ATTN_ROWS], l[ATTN_ROWS], acc[ATTN_ROWS][DIMS];
    int len[ATTN_ROWS], lo[ATTN_ROWS];
#pragma unroll
    for (int ri = 0; ri < ATTN_ROWS; ++ri) {
        const int r = warp + ri * ATTN_WARPS;
        len[ri] = r < n ? a.positions[t0 + r] + 1 : 0;
        lo[ri] = r < n ? attn_first_key(a, len[ri] - 1) : 0;
        m[ri] = -HSX_INF;
        l[ri] = 0.f;
#pragma unroll
        for (int c = 0; c < DIMS; ++c) acc[ri][c] = 0.f;
    }
    const int first = attn_first_key(a, a.positions[t0]);
    for (int kb = first / kb_n * kb_n; kb < max_len; kb += kb_n) {
        __syncthreads();  // the previous block's keys are no longer read (and qs is written)
        for (int i = threadIdx.x; i < kb_n * hd; i += blockDim.x) {
            const int j = i / hd, d = i % hd, p = kb + j;
            float kv = 0.f, vv = 0.f;
            if (p < max_len) {
                const size_t slot = cache_slot(table, a.block_size, p);
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
                s = attn_cap(a, __fmul_rn(dot, a.scale));
            }
            const float m_new = fmaxf(m[ri], warp_max(s));
            const float alpha = expf(m[ri] - m_new);  // exp(-inf) = 0 on the first block
            const float p = valid ? expf(s - m_new) : 0.f;
            l[ri] = fmaf(l[ri], alpha, warp_sum(p));
#pragma unroll
            for (int c = 0; c < DIMS; ++c) acc[ri][c] *= alpha;
            const int keys = min(kb_n, len[ri] - kb);
            for (int j = max(0, lo[ri] - kb); j < keys; ++j) {
                const float pj = __shfl_sync(HSX_FULL_MASK, p, j);
#pragma unroll
                for (int c = 0; c < DIMS; ++c) {
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
            for (int c = 0; c < DIMS; ++c) acc[ri][c] *= alpha;
        }
        const float inv = 1.0f / l[ri];
        OUT* o = out + (size_t)(t0 + r) * a.heads * hd + (size_t)h * hd;
#pragma unroll
        for (int c = 0; c < DIMS; ++c) {
            const int d = lane + 32 * c;
            if (d < hd) o[d] = from_f32<OUT>(__fmul_rn(acc[ri][c], inv));
        }
    }
}

#define HSX_ATTN(NAME, C, OUT, DIMS)                                                         \
    extern "C" __global__ void NAME(const AttnArgs a, const C* kc, const C* vc, OUT* out) {  \
        attention_t<C, OUT, DIMS>(a, kc, vc, out);                                           \
    }
HSX_ATTN(attention_f32_f32, float, float, ATTN_DIMS)
HSX_ATTN(attention_bf16_bf16, bf16_t, bf16_t, ATTN_DIMS)
HSX_ATTN(attention_bf16_f32, bf16_t, float, ATTN_DIMS)
HSX_ATTN(attention_f16_f16, f16_t, f16_t, ATTN_DIMS)
HSX_ATTN(attention_f16_f32, f16_t, float, ATTN_DIMS)
HSX_ATTN(attention_wide_f32_f32, float, float, ATTN_WIDE_DIMS)
HSX_ATTN(attention_wide_bf16_bf16, bf16_t, bf16_t, ATTN_WIDE_DIMS)
HSX_ATTN(attention_wide_bf16_f32, bf16_t, float, ATTN_WIDE_DIMS)
HSX_ATTN(attention_wide_f16_f16, f16_t, f16_t, ATTN_WIDE_DIMS)
HSX_ATTN(attention_wide_f16_f32, f16_t, float, ATTN_WIDE_DIMS)

// ---- Tensor-core attention over a bf16 cache (sm_80+) ----
//
// The same causal GQA attention as attention_t, for a bf16 cache without window or sinks, on
// mma.sync (mma_bf16_16816): a block is 4 warps over MMA_TILE query tokens of one sequence and
// one head, a warp owns 16 query rows. Per block of MMA_KB keys counted from position 0, each
// warp computes S = Q Kᵀ with q rounded to bf16 once (kept in registers as A fragments),
// scales it, masks keys past each row's position, updates its online softmax (block max,
// rescale by exp(m_old - m_new)), rounds P to bf16 and accumulates O += P V in f32; the
// denominator sums the rounded P. As in attention_t, a row's arithmetic depends only on its
// own position (rows of a tile never interact, key blocks are fixed by absolute position), so
// it does not depend on the batch or the chunking.
// K and V blocks reach shared memory by cp.async, row-major as in the cache, and the B
// fragments come out by ldmatrix (V's transposed): the next block's K is in flight while the
// warps take their softmax and P V, the next V while they take the next S, so the block never
// waits a whole global-memory round trip between key blocks (one K and one V buffer, as flash
// attention 2 does).
// Head dim 256 (Qwen3.5 / Qwen3-Next) does not fit a warp's registers that way (O alone would
// be 128 of them): there a block is 8 warps, warps w and w + 4 own the same 16 rows and compute
// the same S and softmax (the same bits), each accumulating O for one half of the head dim,
// over key blocks of 32 (shared memory stays under 48 KiB).
// Launch: grid (tiles of <= MMA_TILE tokens, heads), block (MMA_THREADS(HD)), no dynamic
// shared memory.
#define MMA_TILE 64
#define MMA_SPLIT(HD) ((HD) > 128 ? 2 : 1)
#define MMA_KB(HD) ((HD) > 128 ? 32 : 64)
#define MMA_THREADS(HD) (128 * MMA_SPLIT(HD))

// Where keys kb .. kb + KB of kv group g start in the cache (elements; -1 past max_len), one
// per thread below KB: the block table is read and divided once per key, not once per copy.
template <int HD, int KB>
__device__ __forceinline__ void attn_rows(long long* rows, const AttnArgs& a, const int* table,
                                          int g, int kb, int max_len) {
    static_assert(KB <= MMA_THREADS(HD), "a thread per key");
    const int p = kb + (int)threadIdx.x;
    if (threadIdx.x < KB) {
        rows[threadIdx.x] = p < max_len ? (long long)cache_slot(table, a.block_size, p) *
                                                  (a.kv_heads * HD) +
                                              (long long)g * HD
                                        : -1;
    }
}

// The keys whose cache rows are in `rows` (attn_rows) into `dst` (row j: the j-th key; zeros
// for -1), by cp.async from every thread of the block: 16 bytes each, consecutive threads
// along a key's row so that a warp reads whole sectors. Not unrolled: unrolled, the copies'
// addresses held ~60 more registers across the kernel (a block per SM fewer).
template <int HD, int KB>
__device__ __forceinline__ void attn_fetch(unsigned short (*dst)[HD + 8], const bf16_t* cache,
                                           const long long* rows) {
    constexpr int PER_ROW = HD / 8, N = KB * PER_ROW, NT = MMA_THREADS(HD);
    static_assert(N % NT == 0, "a key block is a whole number of rounds of the block");
#pragma unroll 1
    for (int i = threadIdx.x; i < N; i += NT) {  // blockDim.x == NT
        const int j = i / PER_ROW, c = (i % PER_ROW) * 8;
        const long long r = rows[j];
        cp_async16(&dst[j][c], cache + (r < 0 ? 0 : r + c), r >= 0);
    }
}

template <int HD, typename OUT>
__device__ void attn_mma_t(const AttnArgs a, const bf16_t* kc, const bf16_t* vc, OUT* out) {
    constexpr int KB = MMA_KB(HD), OD = HD / MMA_SPLIT(HD);  // keys per block, O columns
    // +8 halves per row: the 8 row addresses of an ldmatrix phase fall in 32 distinct banks.
    alignas(16) __shared__ unsigned short ks[KB][HD + 8];
    alignas(16) __shared__ unsigned short vs[KB][HD + 8];
    __shared__ long long rows[KB];  // cache rows of the next keys to copy (attn_rows)
    const int h = blockIdx.y, g = h / (a.heads / a.kv_heads);
    const int t0 = a.tiles[blockIdx.x * 3];
    const int n = attn_tile_rows(a, t0, a.tiles[blockIdx.x * 3 + 1]);
    if (n <= 0) return;  // the whole block: no thread has synchronised yet
    const int* table = a.tables + a.table_start[a.tiles[blockIdx.x * 3 + 2]];
    const int lane = threadIdx.x & 31, gr = lane >> 2, qd = lane & 3;
    // The warp's 16 rows, and its O columns from d0.
    const int warp = (threadIdx.x >> 5) & 3, d0 = (threadIdx.x >> 7) * OD;
    // A tile's positions are consecutive: row r sees keys 0 .. p0 + r.
    const int p0 = a.positions[t0], max_len = p0 + n;
    const int r0 = warp * 16 + gr, r1 = r0 + 8;
    const int len0 = r0 < n ? p0 + 1 + r0 : 0, len1 = r1 < n ? p0 + 1 + r1 : 0;
    const int warp_len = warp * 16 < n ? p0 + min(n, warp * 16 + 16) : 0;

    attn_rows<HD, KB>(rows, a, table, g, 0, max_len);
    __syncthreads();
    attn_fetch<HD, KB>(ks, kc, rows);
    cp_async_commit();
    attn_fetch<HD, KB>(vs, vc, rows);
    cp_async_commit();

    unsigned qa[HD / 16][4];
    {
        const size_t col = (size_t)a.q_col + (size_t)h * HD + 2 * qd;
        const float* q0 = a.q + (size_t)(t0 + min(r0, n - 1)) * a.q_stride + col;
        const float* q1 = a.q + (size_t)(t0 + min(r1, n - 1)) * a.q_stride + col;
        // Each row's temperature factor, once (q · 1 is q where there is none).
        const float f0 = attn_temp(a, p0 + r0), f1 = attn_temp(a, p0 + r1);
#pragma unroll
        for (int s = 0; s < HD / 16; ++s) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int c = s * 16 + half * 8;
                qa[s][2 * half] =
                    r0 < n ? pack_bf16(__fmul_rn(q0[c], f0), __fmul_rn(q0[c + 1], f0)) : 0u;
                qa[s][2 * half + 1] =
                    r1 < n ? pack_bf16(__fmul_rn(q1[c], f1), __fmul_rn(q1[c + 1], f1)) : 0u;
            }
        }
    }
    float o[OD / 8][4];
#pragma unroll
    for (int i = 0; i < OD / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m0 = -HSX_INF, m1 = -HSX_INF, l0 = 0.f, l1 = 0.f;

    for (int kb = 0; kb < max_len; kb += KB) {
        // Warp-uniform: whether some row of the warp sees a key of this block, and the key
        // tiles of 8 holding a key some row of the warp sees.
        const bool active = kb < warp_len;
        const int tiles8 = active ? min(KB / 8, (warp_len - kb + 7) / 8) : 0;
        cp_async_wait<1>();  // this thread's part of K (V may still be in flight)
        __syncthreads();     // everyone's part; the last copies that read `rows` are issued
        const bool more = kb + KB < max_len;
        if (more) attn_rows<HD, KB>(rows, a, table, g, kb + KB, max_len);
        float s[KB / 8][4];
#pragma unroll
        for (int nt = 0; nt < KB / 8; ++nt) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
            if (nt >= tiles8) continue;
            const unsigned short* kr = &ks[nt * 8 + (lane & 7)][0];
#pragma unroll
            for (int st = 0; st < HD / 16; st += 2) {
                if (st + 1 < HD / 16) {  // two k-steps of 16 dims: matrices at dims + 0, 8, 16, 24
                    unsigned b[4];
                    ldsm<4, false>(b, kr + st * 16 + (lane >> 3) * 8);
                    mma_bf16_16816(s[nt], qa[st], b);
                    mma_bf16_16816(s[nt], qa[st + 1], b + 2);
                } else {
                    unsigned b[2];
                    ldsm<2, false>(b, kr + st * 16 + ((lane >> 3) & 1) * 8);
                    mma_bf16_16816(s[nt], qa[st], b);
                }
            }
        }
        __syncthreads();  // every warp is done with ks: the next block's keys may land there
        if (more) attn_fetch<HD, KB>(ks, kc, rows);
        cp_async_commit();
        unsigned pa[KB / 8][2];
        if (active) {
            float mx0 = -HSX_INF, mx1 = -HSX_INF;
#pragma unroll
            for (int nt = 0; nt < KB / 8; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int key = kb + nt * 8 + 2 * qd + (e & 1);
                    const bool valid = key < (e < 2 ? len0 : len1);
                    s[nt][e] = valid ? attn_cap(a, __fmul_rn(s[nt][e], a.scale)) : -HSX_INF;
                }
                mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
                mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
            }
            // The 4 lanes of a row group hold its row's keys.
            mx0 = fmaxf(mx0, __shfl_xor_sync(HSX_FULL_MASK, mx0, 1));
            mx0 = fmaxf(mx0, __shfl_xor_sync(HSX_FULL_MASK, mx0, 2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(HSX_FULL_MASK, mx1, 1));
            mx1 = fmaxf(mx1, __shfl_xor_sync(HSX_FULL_MASK, mx1, 2));
            const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
            // A row with no key yet (or none at all) keeps 0 / 0 without forming inf - inf.
            const float b0 = n0 == -HSX_INF ? 0.f : n0, b1 = n1 == -HSX_INF ? 0.f : n1;
            const float al0 = expf(m0 - b0), al1 = expf(m1 - b1);
            float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
            for (int nt = 0; nt < KB / 8; ++nt) {
                const unsigned u0 = pack_bf16(expf(s[nt][0] - b0), expf(s[nt][1] - b0));
                const unsigned u1 = pack_bf16(expf(s[nt][2] - b1), expf(s[nt][3] - b1));
                sum0 += bf16_lo(u0) + bf16_hi(u0);
                sum1 += bf16_lo(u1) + bf16_hi(u1);
                pa[nt][0] = u0;
                pa[nt][1] = u1;
            }
            sum0 += __shfl_xor_sync(HSX_FULL_MASK, sum0, 1);
            sum0 += __shfl_xor_sync(HSX_FULL_MASK, sum0, 2);
            sum1 += __shfl_xor_sync(HSX_FULL_MASK, sum1, 1);
            sum1 += __shfl_xor_sync(HSX_FULL_MASK, sum1, 2);
            l0 = fmaf(l0, al0, sum0);
            l1 = fmaf(l1, al1, sum1);
            m0 = n0;
            m1 = n1;
#pragma unroll
            for (int dt = 0; dt < OD / 8; ++dt) {
                o[dt][0] *= al0;
                o[dt][1] *= al0;
                o[dt][2] *= al1;
                o[dt][3] *= al1;
            }
        }
        cp_async_wait<1>();  // this thread's part of V (the next K may still be in flight)
        __syncthreads();
#pragma unroll
        for (int kt = 0; kt < KB / 16; ++kt) {
            if (2 * kt >= tiles8) continue;
            const unsigned p[4] = {pa[2 * kt][0], pa[2 * kt][1], pa[2 * kt + 1][0],
                                   pa[2 * kt + 1][1]};
            // Keys kt*16 + 0..15 by lanes 0..15 and again by 16..31, at dims + 0 and + 8:
            // the B fragments of two column tiles.
            const unsigned short* vr = &vs[kt * 16 + (lane & 15)][d0 + (lane >> 4) * 8];
#pragma unroll
            for (int dt = 0; dt < OD / 8; dt += 2) {
                unsigned b[4];
                ldsm<4, true>(b, vr + dt * 8);
                mma_bf16_16816(o[dt], p, b);
                mma_bf16_16816(o[dt + 1], p, b + 2);
            }
        }
        __syncthreads();  // every warp is done with vs
        if (more) attn_fetch<HD, KB>(vs, vc, rows);
        cp_async_commit();
    }
    const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
#pragma unroll
    for (int dt = 0; dt < OD / 8; ++dt) {
        const int d = d0 + dt * 8 + 2 * qd;
        if (r0 < n) {
            OUT* w = out + (size_t)(t0 + r0) * a.heads * HD + (size_t)h * HD + d;
            w[0] = from_f32<OUT>(__fmul_rn(o[dt][0], inv0));
            w[1] = from_f32<OUT>(__fmul_rn(o[dt][1], inv0));
        }
        if (r1 < n) {
            OUT* w = out + (size_t)(t0 + r1) * a.heads * HD + (size_t)h * HD + d;
            w[0] = from_f32<OUT>(__fmul_rn(o[dt][2], inv1));
            w[1] = from_f32<OUT>(__fmul_rn(o[dt][3], inv1));
        }
    }
}

#define HSX_ATTN_MMA(NAME, HD, OUT)                                                        \
    extern "C" __global__ void NAME(const AttnArgs a, const bf16_t* kc, const bf16_t* vc,    \
                                    OUT* out) {                                              \
        attn_mma_t<HD, OUT>(a, kc, vc, out);                                                 \
    }
HSX_ATTN_MMA(attn_mma_h16_bf16, 16, bf16_t)
HSX_ATTN_MMA(attn_mma_h16_f32, 16, float)
HSX_ATTN_MMA(attn_mma_h32_bf16, 32, bf16_t)
HSX_ATTN_MMA(attn_mma_h32_f32, 32, float)
HSX_ATTN_MMA(attn_mma_h64_bf16, 64, bf16_t)
HSX_ATTN_MMA(attn_mma_h64_f32, 64, float)
HSX_ATTN_MMA(attn_mma_h128_bf16, 128, bf16_t)
HSX_ATTN_MMA(attn_mma_h128_f32, 128, float)
HSX_ATTN_MMA(attn_mma_h256_bf16, 256, bf16_t)
HSX_ATTN_MMA(attn_mma_h256_f32, 256, float)
