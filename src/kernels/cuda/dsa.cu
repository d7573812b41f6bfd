// DeepSeek Sparse Attention (src/kernels/dsa.rs has the rule): the indexer's q / k prepared and
// its keys cached, each token's scores over its sequence's keys, its top-k keys, and attention
// over only those. The indexer's arithmetic is src/kernels/dsa.rs's `Indexer` (which the CPU
// runs) operation for operation, so both pick the same keys: sequential LayerNorm sums, dot
// products as 8 partial sums of plain products, a key's score summed in head order, ties to
// the lower position (scores ordered as Rust's total_cmp).
//
// Positions p of a sequence live in slot table[p / block_size] * block_size + p % block_size,
// the token's table at tables + table_start[seq_of[t]].

#define DSA_MAX_DIM 512       // index_head_dim (checked by the caller)
#define DSA_MAX_ROTATED 8192  // (heads + 1) * rotated dims (checked by the caller)

__device__ __forceinline__ int dsa_source(int c, int rot, int interleave) {
    if (!interleave) return c;
    return c < rot / 2 ? 2 * c : 2 * (c - rot / 2) + 1;
}

__device__ __forceinline__ size_t dsa_slot(const int* table, int block_size, int p) {
    return (size_t)table[p / block_size] * block_size + p % block_size;
}

// Σ a[i] · b[i] as src/kernels/dsa.rs `dot8`: s[i % 8] += a[i] · b[i] over whole chunks of
// 8, the tail summed in order, then ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)) + tail.
template <typename C>
__device__ __forceinline__ float dsa_dot(const float* a, const C* b, int n) {
    float s[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    const int whole = n - n % 8;
    for (int i = 0; i < whole; i += 8) {
        for (int l = 0; l < 8; ++l) s[l] = __fadd_rn(s[l], __fmul_rn(a[i + l], to_f32(b[i + l])));
    }
    float tail = 0.f;
    for (int i = whole; i < n; ++i) tail = __fadd_rn(tail, __fmul_rn(a[i], to_f32(b[i])));
    const float lo = __fadd_rn(__fadd_rn(s[0], s[1]), __fadd_rn(s[2], s[3]));
    const float hi = __fadd_rn(__fadd_rn(s[4], s[5]), __fadd_rn(s[6], s[7]));
    return __fadd_rn(__fadd_rn(lo, hi), tail);
}

// k [T, d] LayerNormed (weight nw, bias nb), then k and the q heads [T, heads * d] rotated on
// their first `rot` dims (de-interleaved first when `interleave`), in place; k into its slot
// of `cache` [slots, d]. Launch: grid (T), block (128).
extern "C" __global__ void dsa_prepare(float* q, float* k, const int* positions,
                                       const long long* slots, float* cache,
                                       const float* inv_freq, float rope_scale, const float* nw,
                                       const float* nb, float eps, int heads, int d, int rot,
                                       int interleave) {
    __shared__ float cs[DSA_MAX_DIM / 2], sn[DSA_MAX_DIM / 2];
    __shared__ float tmp[DSA_MAX_ROTATED];
    __shared__ float stats[2];
    const size_t t = blockIdx.x;
    float* kr = k + t * d;
    float* qr = q + t * (size_t)heads * d;
    if (threadIdx.x == 0) {
        float sum = 0.f;
        for (int i = 0; i < d; ++i) sum = __fadd_rn(sum, kr[i]);
        const float mean = __fdiv_rn(sum, (float)d);
        float var = 0.f;
        for (int i = 0; i < d; ++i) {
            const float x = __fsub_rn(kr[i], mean);
            var = __fadd_rn(var, __fmul_rn(x, x));
        }
        var = __fdiv_rn(var, (float)d);
        stats[0] = mean;
        stats[1] = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, eps)));
    }
    const int half = rot / 2;
    const float pos = (float)positions[t];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        rope_cos_sin(inv_freq, i, pos, rope_scale, cs, sn);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float x = __fmul_rn(__fsub_rn(kr[i], stats[0]), stats[1]);
        kr[i] = __fadd_rn(__fmul_rn(x, nw[i]), nb[i]);
    }
    __syncthreads();
    for (int p = threadIdx.x; p < (heads + 1) * half; p += blockDim.x) {
        const int h = p / half, i = p % half;
        const float* head = h < heads ? qr + (size_t)h * d : kr;
        const float x1 = head[dsa_source(i, rot, interleave)];
        const float x2 = head[dsa_source(i + half, rot, interleave)];
        tmp[h * rot + i] = __fadd_rn(__fmul_rn(x1, cs[i]), __fmul_rn(-x2, sn[i]));
        tmp[h * rot + i + half] = __fadd_rn(__fmul_rn(x2, cs[i]), __fmul_rn(x1, sn[i]));
    }
    __syncthreads();
    for (int p = threadIdx.x; p < (heads + 1) * rot; p += blockDim.x) {
        const int h = p / rot;
        (h < heads ? qr + (size_t)h * d : kr)[p % rot] = tmp[p];
    }
    __syncthreads();
    float* dst = cache + (size_t)slots[t] * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) dst[i] = kr[i];
}

// scores [G, max_keys] for the G tokens from t0: key j <= positions[t] of token t's sequence
// scores Σ_h (w[t, h] · weight_scale) · relu(q_h · k_j · score_scale); the rest -inf.
// Launch: grid (G, ceil(max_keys / 128)), block (128): one key per thread.
extern "C" __global__ void dsa_scores(const float* q, const float* w, const float* cache,
                                      const int* positions, const int* seq_of, const int* tables,
                                      const int* table_start, int block_size, int heads, int d,
                                      float score_scale, float weight_scale, float* scores,
                                      int max_keys, int t0) {
    const size_t t = t0 + blockIdx.x;
    const int j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= max_keys) return;
    float* out = scores + (size_t)blockIdx.x * max_keys;
    if (j > positions[t]) {
        out[j] = -HSX_INF;
        return;
    }
    const float* key = cache + dsa_slot(tables + table_start[seq_of[t]], block_size, j) * d;
    const float* qt = q + t * (size_t)heads * d;
    const float* wt = w + t * heads;
    float s = 0.f;
    for (int h = 0; h < heads; ++h) {
        const float dot = __fmul_rn(dsa_dot(qt + (size_t)h * d, key, d), score_scale);
        s = __fadd_rn(s, __fmul_rn(__fmul_rn(wt[h], weight_scale), fmaxf(dot, 0.0f)));
    }
    out[j] = s;
}

// A key's rank: its score in total order (as Rust's f32::total_cmp) above, the lower position
// winning ties below; every key's is distinct.
__device__ __forceinline__ unsigned long long dsa_rank(const float* sc, int j) {
    unsigned u = __float_as_uint(sc[j]);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)u << 32) | (0xffffffffu - (unsigned)j);
}

// The rank of the topk-th best of the n scores `sc` (1 <= topk < n), by radix select (8 bits a
// pass), for every thread of the block. Shared: hist[256], chosen[2], left[2].
__device__ unsigned long long dsa_kth_rank(const float* sc, int n, int topk, unsigned* hist,
                                           unsigned long long* chosen, int* left) {
    if (threadIdx.x == 0) {
        chosen[0] = 0;
        chosen[1] = 0;
        left[0] = topk;
    }
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
        __syncthreads();
        const unsigned long long prefix = chosen[0], mask = chosen[1];
        for (int j = threadIdx.x; j < n; j += blockDim.x) {
            const unsigned long long r = dsa_rank(sc, j);
            if ((r & mask) == prefix) atomicAdd(&hist[(r >> shift) & 255], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int want = left[0], b = 255;
            while (b > 0 && want > (int)hist[b]) want -= hist[b--];
            chosen[0] = prefix | ((unsigned long long)b << shift);
            chosen[1] = mask | (255ull << shift);
            left[0] = want;
        }
        __syncthreads();
    }
    return chosen[0];
}

// out[0..topk]: the j < n whose rank is at or above kth, ascending (ranks are distinct: exactly
// topk of them). Shared: offs[blockDim.x], left[2].
__device__ void dsa_write_top(const float* sc, int n, unsigned long long kth, int topk, int* out,
                              int* offs, int* left) {
    int base = 0;
    for (int start = 0; start < n; start += blockDim.x) {
        const int j = start + threadIdx.x;
        const int keep = j < n && dsa_rank(sc, j) >= kth;
        offs[threadIdx.x] = keep;
        __syncthreads();
        if (threadIdx.x == 0) {
            int run = 0;
            for (int i = 0; i < (int)blockDim.x; ++i) {
                const int f = offs[i];
                offs[i] = run;
                run += f;
            }
            left[1] = run;
        }
        __syncthreads();
        if (keep && base + offs[threadIdx.x] < topk) out[base + offs[threadIdx.x]] = j;
        base += left[1];
        __syncthreads();
    }
}

// sel [T, topk]: the positions of token t's topk best keys (t from t0, its scores in row
// t - t0), ascending, count[t] = topk; a token with at most topk keys keeps them all:
// count[t] = 0. Launch: grid (G), block (256).
extern "C" __global__ void dsa_topk(const float* scores, const int* positions, int max_keys,
                                    int topk, int* sel, int* count, int t0) {
    __shared__ unsigned hist[256];
    __shared__ int offs[256];
    __shared__ unsigned long long chosen[2];  // prefix, mask
    __shared__ int left[2];                   // rank still wanted in the prefix's bin; block total
    const size_t t = t0 + blockIdx.x;
    const int n = positions[t] + 1;
    if (n <= topk) {
        if (threadIdx.x == 0) count[t] = 0;
        return;
    }
    const float* sc = scores + (size_t)blockIdx.x * max_keys;
    const unsigned long long kth = dsa_kth_rank(sc, n, topk, hist, chosen, left);
    dsa_write_top(sc, n, kth, topk, sel + t * topk, offs, left);
    if (threadIdx.x == 0) count[t] = topk;
}

// out[t, h * hd..] for every token with count[t] > 0: attention of its query head (q rows
// `q_stride` apart, rotated) over its selected keys only (cache C, [slots, kv_heads * hd]),
// in out's dtype O; other rows untouched. Launch: grid (T, heads), block (128), dynamic shared
// 4 * (topk rounded up to even) + 8 * topk bytes (the keys' weights, then their slots).
template <typename C, typename O>
__device__ void attn_sparse_t(const float* q, long long q_stride, const C* kc, const C* vc,
                              const int* sel, const int* count, const int* seq_of,
                              const int* tables, const int* table_start, int block_size,
                              int heads, int kv_heads, int hd, float scale, int topk, O* out) {
    extern __shared__ float dsa_smem[];
    __shared__ float inv_sum;
    const size_t t = blockIdx.x;
    const int h = blockIdx.y, n = count[t];
    if (n == 0) return;
    float* e = dsa_smem;
    long long* slot = (long long*)(dsa_smem + 2 * ((topk + 1) / 2));
    const int* table = tables + table_start[seq_of[t]];
    const size_t kv_dim = (size_t)kv_heads * hd, off = (size_t)(h / (heads / kv_heads)) * hd;
    const float* qh = q + t * q_stride + (size_t)h * hd;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        slot[i] = (long long)dsa_slot(table, block_size, sel[t * topk + i]);
        e[i] = __fmul_rn(dsa_dot(qh, kc + slot[i] * kv_dim + off, hd), scale);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float m = -HSX_INF, sum = 0.f;
        for (int i = 0; i < n; ++i) m = fmaxf(m, e[i]);
        for (int i = 0; i < n; ++i) {
            e[i] = expf(e[i] - m);
            sum = __fadd_rn(sum, e[i]);
        }
        inv_sum = __fdiv_rn(1.0f, sum);
    }
    __syncthreads();
    for (int c = threadIdx.x; c < hd; c += blockDim.x) {
        float acc = 0.f;
        for (int i = 0; i < n; ++i) {
            acc = __fadd_rn(acc, __fmul_rn(e[i], to_f32(vc[slot[i] * kv_dim + off + c])));
        }
        out[(t * heads + h) * hd + c] = from_f32<O>(__fmul_rn(acc, inv_sum));
    }
}

#define ATTN_SPARSE(NAME, C, O)                                                                \
    extern "C" __global__ void NAME(const float* q, long long q_stride, const C* kc,          \
                                    const C* vc, const int* sel, const int* count,              \
                                    const int* seq_of, const int* tables,                       \
                                    const int* table_start, int block_size, int heads,          \
                                    int kv_heads, int hd, float scale, int topk, O* out) {      \
        attn_sparse_t<C, O>(q, q_stride, kc, vc, sel, count, seq_of, tables, table_start,      \
                            block_size, heads, kv_heads, hd, scale, topk, out);                 \
    }
ATTN_SPARSE(attn_sparse_f32_f32, float, float)
ATTN_SPARSE(attn_sparse_bf16_f32, bf16_t, float)
ATTN_SPARSE(attn_sparse_bf16_bf16, bf16_t, bf16_t)
ATTN_SPARSE(attn_sparse_f16_f32, f16_t, float)
ATTN_SPARSE(attn_sparse_f16_f16, f16_t, f16_t)

// ---- Qwen4-Exp's QSA (src/kernels/qsa.rs has the rule; its `QsaRule` is the arithmetic) ----

#define QSA_MAX_HEADS 128  // indexer heads (checked by the caller)

// x[i] times (Σ x² / d + eps)^-0.5 then w[i], the sum in order: the factor.
__device__ __forceinline__ float qsa_rms(const float* x, int d, float eps) {
    float ss = 0.f;
    for (int i = 0; i < d; ++i) ss = __fadd_rn(ss, __fmul_rn(x[i], x[i]));
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)d), eps)));
}

// Each `d`-wide head of x (`n` values) rotated in place on its first `rot` dims (rotate_half
// pairs (i, i + rot / 2)) by cos / sin.
__device__ __forceinline__ void qsa_rotate(float* x, int n, int d, int rot, const float* cs,
                                           const float* sn) {
    const int half = rot / 2;
    for (int p = threadIdx.x; p < (n / d) * half; p += blockDim.x) {
        float* head = x + (size_t)(p / half) * d;
        const int i = p % half;
        const float x1 = head[i], x2 = head[i + half];
        head[i] = __fadd_rn(__fmul_rn(x1, cs[i]), __fmul_rn(-x2, sn[i]));
        head[i + half] = __fadd_rn(__fmul_rn(x2, cs[i]), __fmul_rn(x1, sn[i]));
    }
}

// q [T, heads * d]: each head RMSNormed by qw (1 + weight) and rotated at its token's position,
// in place; the raw keys k [T, d] into their slots of `cache` [slots, d].
// Launch: grid (T), block (128).
extern "C" __global__ void qsa_prepare(float* q, const float* k, const int* positions,
                                       const long long* slots, float* cache,
                                       const float* inv_freq, float rope_scale, const float* qw,
                                       float eps, int heads, int d, int rot) {
    __shared__ float cs[DSA_MAX_DIM / 2], sn[DSA_MAX_DIM / 2], r[QSA_MAX_HEADS];
    const size_t t = blockIdx.x;
    float* qr = q + t * (size_t)heads * d;
    for (int h = threadIdx.x; h < heads; h += blockDim.x) r[h] = qsa_rms(qr + (size_t)h * d, d, eps);
    for (int i = threadIdx.x; i < rot / 2; i += blockDim.x) {
        rope_cos_sin(inv_freq, i, (float)positions[t], rope_scale, cs, sn);
    }
    __syncthreads();
    for (int p = threadIdx.x; p < heads * d; p += blockDim.x) {
        qr[p] = __fmul_rn(__fmul_rn(qr[p], r[p / d]), qw[p % d]);
    }
    __syncthreads();
    qsa_rotate(qr, heads * d, d, rot, cs, sn);
    float* dst = cache + (size_t)slots[t] * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) dst[i] = k[t * d + i];
}

// pooled [chunks, max_blocks, d]: block b of chunk c (when its keys are among the chunk's
// chunk_keys[c]) = the mean of its `ratio` raw keys in `cache`, RMSNormed by kw (1 + weight),
// rotated at b * ratio. Launch: grid (max_blocks, chunks), block (128).
extern "C" __global__ void qsa_pool(const float* cache, const int* chunk_keys, const int* tables,
                                    const int* table_start, int block_size, const float* kw,
                                    float eps, const float* inv_freq, float rope_scale, int d,
                                    int rot, int ratio, int max_blocks, float* pooled) {
    __shared__ float x[DSA_MAX_DIM], cs[DSA_MAX_DIM / 2], sn[DSA_MAX_DIM / 2], r;
    const int b = blockIdx.x, c = blockIdx.y;
    if ((b + 1) * ratio > chunk_keys[c]) return;
    const int* table = tables + table_start[c];
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float s = 0.f;
        for (int j = b * ratio; j < (b + 1) * ratio; ++j) {
            s = __fadd_rn(s, cache[dsa_slot(table, block_size, j) * d + i]);
        }
        x[i] = __fdiv_rn(s, (float)ratio);
    }
    for (int i = threadIdx.x; i < rot / 2; i += blockDim.x) {
        rope_cos_sin(inv_freq, i, (float)(b * ratio), rope_scale, cs, sn);
    }
    __syncthreads();
    if (threadIdx.x == 0) r = qsa_rms(x, d, eps);
    __syncthreads();
    for (int i = threadIdx.x; i < d; i += blockDim.x) x[i] = __fmul_rn(__fmul_rn(x[i], r), kw[i]);
    __syncthreads();
    qsa_rotate(x, d, d, rot, cs, sn);
    __syncthreads();
    float* out = pooled + ((size_t)c * max_blocks + b) * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) out[i] = x[i];
}

// scores [G, max_blocks] for the G tokens from t0: block b < (positions[t] + 1) / ratio of
// token t's chunk scores Σ_h relu(q_h · pooled_b), heads in order; the rest -inf.
// Launch: grid (G, ceil(max_blocks / 128)), block (128): one block key per thread.
extern "C" __global__ void qsa_scores(const float* q, const float* pooled, const int* positions,
                                      const int* seq_of, int heads, int d, int ratio,
                                      int max_blocks, float* scores, int t0) {
    const size_t t = t0 + blockIdx.x;
    const int b = blockIdx.y * blockDim.x + threadIdx.x;
    if (b >= max_blocks) return;
    float* out = scores + (size_t)blockIdx.x * max_blocks;
    if (b >= (positions[t] + 1) / ratio) {
        out[b] = -HSX_INF;
        return;
    }
    const float* key = pooled + ((size_t)seq_of[t] * max_blocks + b) * d;
    const float* qt = q + t * (size_t)heads * d;
    float s = 0.f;
    for (int h = 0; h < heads; ++h) s = __fadd_rn(s, fmaxf(dsa_dot(qt + (size_t)h * d, key, d), 0.f));
    out[b] = s;
}

// sel [T, cap]: token t's keys (t from t0, its block scores in row t - t0): those of its
// `blocks` best blocks (ties to the lower block) then of its incomplete tail, ascending;
// count[t] their number, 0 for a token with at most `blocks` complete blocks (it keeps every
// key). `chosen_blocks` [G, blocks] is scratch. Launch: grid (G), block (256).
extern "C" __global__ void qsa_topk(const float* scores, const int* positions, int max_blocks,
                                    int blocks, int ratio, int cap, int* chosen_blocks, int* sel,
                                    int* count, int t0) {
    __shared__ unsigned hist[256];
    __shared__ int offs[256];
    __shared__ unsigned long long chosen[2];
    __shared__ int left[2];
    const size_t t = t0 + blockIdx.x;
    const int n = positions[t] + 1, nb = n / ratio;
    if (nb <= blocks) {
        if (threadIdx.x == 0) count[t] = 0;
        return;
    }
    const float* sc = scores + (size_t)blockIdx.x * max_blocks;
    int* row = chosen_blocks + (size_t)blockIdx.x * blocks;
    const unsigned long long kth = dsa_kth_rank(sc, nb, blocks, hist, chosen, left);
    dsa_write_top(sc, nb, kth, blocks, row, offs, left);
    __syncthreads();
    int* out = sel + t * cap;
    for (int i = threadIdx.x; i < blocks * ratio; i += blockDim.x) {
        out[i] = row[i / ratio] * ratio + i % ratio;
    }
    const int tail = n - nb * ratio;
    for (int i = threadIdx.x; i < tail; i += blockDim.x) out[blocks * ratio + i] = nb * ratio + i;
    if (threadIdx.x == 0) count[t] = blocks * ratio + tail;
}
