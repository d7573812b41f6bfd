// The recurrences of the hybrid models in chunked form, f32 on the CUDA cores: Gated DeltaNet
// (the WY form of FLA's chunk_gated_delta_rule and transformers' torch_chunk_gated_delta_rule)
// and the Mamba-2 scan (the SSD form of mamba_chunk_scan_combined). Same inputs, states and
// outputs as the token-serial gated_delta_rule_f32 (gated_delta.cu) and mamba2_scan_f32
// (mamba2.cu), whose layout notes hold here.
//
// Blocks: a request's rows are cut at absolute positions that are multiples of GC; a block is
// the rows of one request inside one such window (L <= GC rows; blk_row / blk_len, and per
// request its first block and count). Cutting at absolute positions keeps a block's arithmetic
// the same wherever the scheduler split the request, as long as the split is at a multiple of
// GC; elsewhere the two partial blocks agree with the whole one within f32 rounding.
//
// Gated DeltaNet, after gdn_qk_l2norm_f32. Per block and value head, with G_i = g_0 + ... + g_i (log-decays within the block) and
// beta, q (scaled), k, v of its rows:
//   T = (I + M)^-1,  M_ij = beta_i (k_i . k_j) e^(G_i - G_j) for j < i, else 0
//   U = T (beta v),  W = T (beta e^G k)                              [gdn_chunk_prep_f32]
//   v_new = U - W S,  out = e^G (q S),  S <- e^(G_L) S + (e^(G_L - G) k)^T v_new
//                                                                    [gdn_chunk_state_f32]
//   out += P v_new,  P_ij = (q_i . k_j) e^(G_i - G_j) for j <= i       [gdn_chunk_out_f32]
// The first and last are parallel over blocks x heads; only the state pass walks a request's
// blocks in order, parallel over heads x value columns, with S in registers as in
// gated_delta_rule_f32 and each block's rows staged in shared memory (the token-serial kernel
// waits on global memory for every token).
//
// Launch: prep grid (blocks, nv), block (GC_THREADS); state grid (ceil(dv / 16), nv,
// num_seqs), block (GC_THREADS); out grid (blocks, nk, ceil((nv / nk) / hpc)), block
// (GC_THREADS). Scratch: w [T, nv * dk], u [T, nv * dv] (U, then v_new),
// g [T, nv].

#define GC 64            // rows per block
#define GC_THREADS 128
#define GC_SLICE 32      // columns staged per pass of the Gram tile
#define GC_PIECE 16      // rows staged at a time by the state pass
#define GC_WIDTH (ST_PARTS * ST_MAX)  // widest state dim the state passes stage

__device__ __forceinline__ float gc_softplus(float v) {
    return v > 20.0f ? v : log1pf(expf(v));
}

// acc[ii][jj] = x_(4 ti + ii) . y_(8 tj + jj) over d columns, thread (ti, tj) = (tid / 8,
// tid % 8); rows at or past L count as zero. Row r of x (y) starts at x + r * stride. The
// sums run over columns in order.
__device__ void gc_gram(const float* x, const float* y, long long stride, int L, int d,
                        float (*xs)[GC_SLICE + 1], float (*ys)[GC_SLICE + 1], float acc[4][8]) {
    const int tid = threadIdx.x, ti = tid >> 3, tj = tid & 7;
#pragma unroll
    for (int ii = 0; ii < 4; ++ii) {
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
            acc[ii][jj] = 0.0f;
        }
    }
    for (int c0 = 0; c0 < d; c0 += GC_SLICE) {
        for (int e = tid; e < GC * GC_SLICE; e += GC_THREADS) {
            const int r = e / GC_SLICE, c = e % GC_SLICE;
            const bool ok = r < L && c0 + c < d;
            xs[r][c] = ok ? x[r * stride + c0 + c] : 0.0f;
            ys[r][c] = ok ? y[r * stride + c0 + c] : 0.0f;
        }
        __syncthreads();
        for (int c = 0; c < GC_SLICE; ++c) {
            float xv[4], yv[8];
#pragma unroll
            for (int ii = 0; ii < 4; ++ii) {
                xv[ii] = xs[4 * ti + ii][c];
            }
#pragma unroll
            for (int jj = 0; jj < 8; ++jj) {
                yv[jj] = ys[8 * tj + jj][c];
            }
#pragma unroll
            for (int ii = 0; ii < 4; ++ii) {
#pragma unroll
                for (int jj = 0; jj < 8; ++jj) {
                    acc[ii][jj] = fmaf(xv[ii], yv[jj], acc[ii][jj]);
                }
            }
        }
        __syncthreads();
    }
}

// dst_i (+)= sum_j tm[i][j] x_j for the block's rows i < L at column c, where
// x_j = src_j * scale[j] * e^(gexp[j]) (scale, gexp optional) and tm is zero past row L and
// above its diagonal. Rows of src / dst start `src_stride` / `dst_stride` apart.
__device__ __forceinline__ void gc_lower_col(const float (*tm)[GC + 1], int L, const float* src,
                                             long long src_stride, const float* scale,
                                             const float* gexp, float* dst,
                                             long long dst_stride, int c, bool accumulate) {
    float x[GC];
#pragma unroll
    for (int j = 0; j < GC; ++j) {
        float v = 0.0f;
        if (j < L) {
            v = src[j * src_stride + c];
            if (scale != nullptr) {
                v *= scale[j];
            }
            if (gexp != nullptr) {
                v *= expf(gexp[j]);
            }
        }
        x[j] = v;
    }
    for (int i = 0; i < L; ++i) {
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < GC; ++j) {
            s = fmaf(tm[i][j], x[j], s);
        }
        float* o = dst + i * dst_stride + c;
        *o = accumulate ? *o + s : s;
    }
}

// gc_lower_col for every column c < d.
__device__ void gc_lower_apply(const float (*tm)[GC + 1], int L, const float* src,
                               long long src_stride, const float* scale, const float* gexp,
                               float* dst, long long dst_stride, int d, bool accumulate) {
    for (int c = threadIdx.x; c < d; c += GC_THREADS) {
        gc_lower_col(tm, L, src, src_stride, scale, gexp, dst, dst_stride, c, accumulate);
    }
}

// Heads per pass of gc_intra: two tm tiles fill the shared memory a block may have (48 KiB).
#define GC_PASS_HEADS 2

// The intra-block part of both recurrences' outputs, for `heads` heads that share x and y (a
// Gated DeltaNet key head's value heads, a Mamba-2 group's heads): per head h,
//   dst_h,i += sum_(j <= i) (x_i . y_j) e^(ld_h,i - ld_h,j) scale_h,j src_h,j
// over `cols` columns, for the block's L rows (x, y: d wide, `stride` apart). Head h's ld and
// scale (optional) of row i are at ld[i * hd_stride + h], scale[i * hd_stride + h]; its src and
// dst columns start h * cols past src and dst. The Gram tile x . y is computed once for all
// the heads (it was computed per head: a Mamba-2 group of 16 heads did 16 times the work),
// and kept in registers; the heads go GC_PASS_HEADS at a time, so that heads of 64 columns
// give every thread a column. A head's arithmetic is the same as computing it alone. Every
// thread of the block calls it.
__device__ void gc_intra(const float* x, const float* y, long long stride, int L, int d,
                         const float* ld, const float* scale, long long hd_stride, int heads,
                         const float* src, long long src_stride, float* dst,
                         long long dst_stride, int cols) {
    // The Gram tile's staging (xs, ys) and the heads' tm tiles are never live at once.
    __shared__ float smem[GC_PASS_HEADS * GC * (GC + 1)];
    __shared__ float lds[GC_PASS_HEADS][GC];
    __shared__ float scs[GC_PASS_HEADS][GC];
    static_assert(2 * GC * (GC_SLICE + 1) <= GC_PASS_HEADS * GC * (GC + 1), "staging fits");
    float (*xs)[GC_SLICE + 1] = reinterpret_cast<float (*)[GC_SLICE + 1]>(smem);
    float (*ys)[GC_SLICE + 1] = xs + GC;
    float (*tms)[GC + 1] = reinterpret_cast<float (*)[GC + 1]>(smem);
    const int tid = threadIdx.x, ti = tid >> 3, tj = tid & 7;
    float acc[4][8];
    gc_gram(x, y, stride, L, d, xs, ys, acc);  // ends with a sync: xs, ys are free
    for (int h0 = 0; h0 < heads; h0 += GC_PASS_HEADS) {
        const int nh = min(GC_PASS_HEADS, heads - h0);
        for (int e = tid; e < nh * GC; e += GC_THREADS) {
            const int k = e / GC, i = e % GC;
            lds[k][i] = i < L ? ld[i * hd_stride + h0 + k] : 0.0f;
            scs[k][i] = (i < L && scale != nullptr) ? scale[i * hd_stride + h0 + k] : 0.0f;
        }
        __syncthreads();
        for (int k = 0; k < nh; ++k) {
            float (*tm)[GC + 1] = tms + k * GC;
#pragma unroll
            for (int ii = 0; ii < 4; ++ii) {
#pragma unroll
                for (int jj = 0; jj < 8; ++jj) {
                    const int i = 4 * ti + ii, j = 8 * tj + jj;
                    tm[i][j] = (j <= i && i < L) ? acc[ii][jj] * expf(lds[k][i] - lds[k][j])
                                                 : 0.0f;
                }
            }
        }
        __syncthreads();
        for (int e = tid; e < nh * cols; e += GC_THREADS) {
            const int k = e / cols, c = e % cols;
            const long long off = (long long)(h0 + k) * cols;
            gc_lower_col(tms + k * GC, L, src + off, src_stride,
                         scale != nullptr ? scs[k] : nullptr, nullptr, dst + off, dst_stride, c,
                         true);
        }
        __syncthreads();  // before the next pass overwrites lds, scs and the tm tiles
    }
}

// Per block and value head: G into g, U into u, W into w.
extern "C" __global__ void gdn_chunk_prep_f32(
    const float* __restrict__ qkv, int qkv_stride,
    const float* __restrict__ b,
    const float* __restrict__ a, int ba_stride,
    const float* __restrict__ neg_a,
    const float* __restrict__ dt_bias,
    const int* __restrict__ blk_row,
    const int* __restrict__ blk_len,
    float* __restrict__ w,
    float* __restrict__ u,
    float* __restrict__ g,
    int nk, int nv, int dk, int dv, float beta_scale)
{
    __shared__ float tm[GC][GC + 1];
    __shared__ float xs[GC][GC_SLICE + 1];
    __shared__ float ys[GC][GC_SLICE + 1];
    __shared__ float gs[GC];
    __shared__ float bs[GC];
    __shared__ float row_buf[GC];
    const int tid = threadIdx.x;
    const int h = blockIdx.y;
    const int kh = h / (nv / nk);
    const int r0 = blk_row[blockIdx.x];
    const int L = blk_len[blockIdx.x];
    if (tid < L) {
        const size_t row = (size_t)(r0 + tid);
        gs[tid] = neg_a[h] * gc_softplus(a[row * ba_stride + h] + dt_bias[h]);
        bs[tid] = __fmul_rn(1.0f / (1.0f + expf(-b[row * ba_stride + h])), beta_scale);
    }
    __syncthreads();
    if (tid == 0) {
        float acc = 0.0f;
        for (int i = 0; i < L; ++i) {
            acc += gs[i];
            gs[i] = acc;
        }
    }
    const float* k0 = qkv + (size_t)r0 * qkv_stride + (size_t)(nk + kh) * dk;
    float acc[4][8];
    gc_gram(k0, k0, qkv_stride, L, dk, xs, ys, acc);  // its syncs also publish gs
    const int ti = tid >> 3, tj = tid & 7;
#pragma unroll
    for (int ii = 0; ii < 4; ++ii) {
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
            const int i = 4 * ti + ii, j = 8 * tj + jj;
            tm[i][j] = (j < i && i < L) ? -(bs[i] * acc[ii][jj] * expf(gs[i] - gs[j])) : 0.0f;
        }
    }
    __syncthreads();
    // T = (I - N)^-1 for the strictly lower N = -M, a row at a time: T_ij = N_ij +
    // sum_{j<m<i} N_im T_mj (rows above i are final; row i is read from a copy).
    for (int i = 1; i < L; ++i) {
        if (tid < i) {
            row_buf[tid] = tm[i][tid];
        }
        __syncthreads();
        if (tid < i) {
            float s = row_buf[tid];
            for (int m = tid + 1; m < i; ++m) {
                s = fmaf(row_buf[m], tm[m][tid], s);
            }
            tm[i][tid] = s;
        }
        __syncthreads();
    }
    if (tid < L) {
        tm[tid][tid] = 1.0f;
        g[(size_t)(r0 + tid) * nv + h] = gs[tid];
    }
    __syncthreads();
    const float* v0 = qkv + (size_t)r0 * qkv_stride + 2 * (size_t)nk * dk + (size_t)h * dv;
    gc_lower_apply(tm, L, v0, qkv_stride, bs, nullptr,
                   u + (size_t)r0 * nv * dv + (size_t)h * dv, (long long)nv * dv, dv, false);
    gc_lower_apply(tm, L, k0, qkv_stride, bs, gs,
                   w + (size_t)r0 * nv * dk + (size_t)h * dk, (long long)nv * dk, dk, false);
}

// Stages rows p0 .. p0 + n of a block (n <= GC_PIECE) of two [rows, d] operands into xs / ys
// (rows past n as zeros). Row r of x (y) starts at x + r * x_stride.
__device__ void gc_stage(const float* x, long long x_stride, const float* y, long long y_stride,
                         int n, int d, float (*xs)[GC_WIDTH], float (*ys)[GC_WIDTH]) {
    for (int e = threadIdx.x; e < GC_PIECE * d; e += GC_THREADS) {
        const int r = e / d, c = e % d;
        xs[r][c] = r < n ? x[r * x_stride + c] : 0.0f;
        if (y != nullptr) {
            ys[r][c] = r < n ? y[r * y_stride + c] : 0.0f;
        }
    }
}

// Stages the block's state columns c0 .. c0 + 16 (those below d) of rows p0 .. p0 + n (n <=
// GC_PIECE) of a [rows, stride] operand into cs (zeros elsewhere): what the state passes read
// per row, so that no row waits on global memory.
__device__ void gc_stage_cols(const float* x, long long stride, int n, int c0, int d,
                              float (*cs)[ST_LANES * ST_WARPS]) {
    const int cols = ST_LANES * ST_WARPS;
    for (int e = threadIdx.x; e < GC_PIECE * cols; e += GC_THREADS) {
        const int r = e / cols, c = e % cols;
        cs[r][c] = (r < n && c0 + c < d) ? x[r * stride + c0 + c] : 0.0f;
    }
}

// S = decay * S + sum_(i < L) cf[i][col] * row_i over the lane's entries (those below d) of
// the L rows from `rows` (`stride` apart), staged GC_PIECE at a time: the update that closes
// a block in both state passes. Every thread of the block calls it (it syncs).
__device__ void gc_state_update(float S[ST_MAX], const float* rows, long long stride, int L,
                                int d, int part, int col,
                                const float (*cf)[ST_LANES * ST_WARPS],
                                float (*xs)[GC_WIDTH], float decay) {
#pragma unroll
    for (int e = 0; e < ST_MAX; ++e) {
        S[e] *= decay;
    }
    for (int p0 = 0; p0 < L; p0 += GC_PIECE) {
        const int n = min(GC_PIECE, L - p0);
        __syncthreads();  // cf is complete; the previous readers of xs are done
        gc_stage(rows + p0 * stride, stride, nullptr, 0, n, d, xs, xs);
        __syncthreads();
#pragma unroll 4
        for (int r = 0; r < GC_PIECE; ++r) {
            const float coef = r < n ? cf[p0 + r][col] : 0.0f;
#pragma unroll
            for (int e = 0; e < ST_MAX; ++e) {
                const int i = part + ST_PARTS * e;
                if (i < d) {
                    S[e] = fmaf(xs[r][i], coef, S[e]);
                }
            }
        }
    }
}

// The state pass; the lane layout (ST_* of common.cuh) and register state of
// gated_delta_rule_f32.
extern "C" __global__ void gdn_chunk_state_f32(
    const float* __restrict__ qkv, int qkv_stride,
    const float* __restrict__ w,
    float* __restrict__ u,
    const float* __restrict__ g,
    float* __restrict__ state,
    const int* __restrict__ seq_slot,
    const int* __restrict__ seq_blk0,
    const int* __restrict__ seq_nblk,
    const int* __restrict__ blk_row,
    const int* __restrict__ blk_len,
    float* __restrict__ out,
    int nk, int nv, int dk, int dv)
{
    __shared__ float xs[GC_PIECE][GC_WIDTH];
    __shared__ float ys[GC_PIECE][GC_WIDTH];
    __shared__ float vn[GC][ST_LANES * ST_WARPS];  // e^(G_L - G_i) v_new_i
    __shared__ float us[GC_PIECE][ST_LANES * ST_WARPS];
    __shared__ float gs[GC];
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int col_sub = lane & (ST_LANES - 1);
    const int part = lane / ST_LANES;
    const int h = blockIdx.y;
    const int s = blockIdx.z;
    const int col = warp * ST_LANES + col_sub;
    const int j0 = blockIdx.x * ST_LANES * ST_WARPS;
    const int j = j0 + col;
    const bool col_ok = j < dv;
    const int kh = h / (nv / nk);
    const size_t wide_v = (size_t)nv * dv, wide_k = (size_t)nv * dk;
    float* st = state + ((size_t)seq_slot[s] * nv + h) * (size_t)dk * dv;

    float S[ST_MAX];
    state_load(S, st + j, dv, part, dk, col_ok);
    for (int bi = 0; bi < seq_nblk[s]; ++bi) {
        const int blk = seq_blk0[s] + bi;
        const int r0 = blk_row[blk], L = blk_len[blk];
        __syncthreads();  // the previous block's readers of gs / vn / xs are done
        if (tid < L) {
            gs[tid] = g[(size_t)(r0 + tid) * nv + h];
        }
        // v_new = U - W S and out = e^G (q S), GC_PIECE rows at a time.
        for (int p0 = 0; p0 < L; p0 += GC_PIECE) {
            const int n = min(GC_PIECE, L - p0);
            const size_t row0 = (size_t)(r0 + p0);
            __syncthreads();
            gc_stage(w + row0 * wide_k + (size_t)h * dk, wide_k,
                     qkv + row0 * qkv_stride + (size_t)kh * dk, qkv_stride, n, dk, xs, ys);
            gc_stage_cols(u + row0 * wide_v + (size_t)h * dv, wide_v, n, j0, dv, us);
            __syncthreads();
            // Rows past n are zeros: computed (independent rows interleave), never written.
#pragma unroll 4
            for (int r = 0; r < GC_PIECE; ++r) {
                float vp = 0.0f, qs = 0.0f;
#pragma unroll
                for (int e = 0; e < ST_MAX; ++e) {
                    const int i = part + ST_PARTS * e;
                    if (i < dk) {
                        vp = fmaf(xs[r][i], S[e], vp);
                        qs = fmaf(ys[r][i], S[e], qs);
                    }
                }
                vp = state_part_sum(vp);
                qs = state_part_sum(qs);
                if (part == 0 && r < n) {
                    const float v_new = us[r][col] - vp;
                    if (col_ok) {
                        const size_t at = (row0 + r) * wide_v + (size_t)h * dv + j;
                        u[at] = v_new;
                        out[at] = expf(gs[p0 + r]) * qs;
                    }
                    vn[p0 + r][col] = expf(gs[L - 1] - gs[p0 + r]) * v_new;
                }
            }
        }
        // S = e^(G_L) S + sum_i (e^(G_L - G_i) v_new_i) k_i.
        gc_state_update(S, qkv + (size_t)r0 * qkv_stride + (size_t)(nk + kh) * dk, qkv_stride,
                        L, dk, part, col, vn, xs, expf(gs[L - 1]));
    }
    state_store(S, st + j, dv, part, dk, col_ok);
}

// out += P v_new within each block: P_ij = (q_i . k_j) e^(G_i - G_j) for j <= i. A block of
// threads takes `hpc` of a key head's value heads (blockIdx.z picks which), which share q . k.
extern "C" __global__ void gdn_chunk_out_f32(
    const float* __restrict__ qkv, int qkv_stride,
    const float* __restrict__ u,
    const float* __restrict__ g,
    const int* __restrict__ blk_row,
    const int* __restrict__ blk_len,
    float* __restrict__ out,
    int nk, int nv, int dk, int dv, int hpc)
{
    const int kh = blockIdx.y;
    const int h0 = kh * (nv / nk) + blockIdx.z * hpc;
    const int heads = min(hpc, (kh + 1) * (nv / nk) - h0);
    const int r0 = blk_row[blockIdx.x];
    const int L = blk_len[blockIdx.x];
    const float* q0 = qkv + (size_t)r0 * qkv_stride + (size_t)kh * dk;
    const size_t at = (size_t)r0 * nv * dv + (size_t)h0 * dv;
    gc_intra(q0, q0 + (size_t)nk * dk, qkv_stride, L, dk, g + (size_t)r0 * nv + h0, nullptr, nv,
             heads, u + at, (long long)nv * dv, out + at, (long long)nv * dv, dv);
}

// Mamba-2 (SSD). Per block and head, with dt_i = max(softplus(dt_raw_i + dt_bias), dt_min)
// and A_i = (dt_0 + ... + dt_i) * (-exp(A_log)) (log-decays within the block):
//   dt, A into scratch                                              [mamba2_chunk_prep_f32]
//   y_i = e^(A_i) (C_i . S) + D x_i,
//   S <- e^(A_L) S + sum_i e^(A_L - A_i) dt_i x_i B_i^T              [mamba2_chunk_state_f32]
//   y_i += sum_(j <= i) (C_i . B_j) e^(A_i - A_j) dt_j x_j           [mamba2_chunk_out_f32]
// Launch: prep grid (ceil(blocks * heads / GC_THREADS)), block (GC_THREADS); state grid
// (ceil(head_dim / 16), heads, num_seqs), block (GC_THREADS); out grid (blocks, groups,
// ceil((heads / groups) / hpc)), block (GC_THREADS). Scratch: dts, acum [T, heads].

// One thread per (block, head): the serial prefix of the block's log-decays.
extern "C" __global__ void mamba2_chunk_prep_f32(
    const float* __restrict__ dt, int dt_stride,
    const float* __restrict__ neg_a,
    const float* __restrict__ dt_bias,
    float dt_min,
    const int* __restrict__ blk_row,
    const int* __restrict__ blk_len,
    float* __restrict__ dts,
    float* __restrict__ acum,
    int num_blocks, int heads)
{
    const long long item = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (item >= (long long)num_blocks * heads) {
        return;
    }
    const int blk = (int)(item / heads);
    const int h = (int)(item - (long long)blk * heads);
    float acc = 0.0f;
    for (int i = 0; i < blk_len[blk]; ++i) {
        const size_t row = (size_t)(blk_row[blk] + i);
        const float d = fmaxf(gc_softplus(dt[row * dt_stride + h] + dt_bias[h]), dt_min);
        acc += d * neg_a[h];
        dts[row * heads + h] = d;
        acum[row * heads + h] = acc;
    }
}

// The state pass; the lane layout (ST_* of common.cuh) and register state of mamba2_scan_f32
// (a warp owns 4 rows p of the head's [head_dim, d_state] state).
extern "C" __global__ void mamba2_chunk_state_f32(
    const float* __restrict__ xbc, int xbc_stride,
    const float* __restrict__ dts,
    const float* __restrict__ acum,
    const float* __restrict__ dskip,
    float* __restrict__ state,
    const int* __restrict__ seq_slot,
    const int* __restrict__ seq_blk0,
    const int* __restrict__ seq_nblk,
    const int* __restrict__ blk_row,
    const int* __restrict__ blk_len,
    float* __restrict__ y,
    int heads, int head_dim, int d_state, int groups)
{
    __shared__ float xs[GC_PIECE][GC_WIDTH];
    __shared__ float cf[GC][ST_LANES * ST_WARPS];
    __shared__ float xp_s[GC_PIECE][ST_LANES * ST_WARPS];
    __shared__ float as[GC];
    __shared__ float ds[GC];
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int part = lane / ST_LANES;
    const int h = blockIdx.y;
    const int s = blockIdx.z;
    const int row = warp * ST_LANES + (lane & (ST_LANES - 1));
    const int p0_row = blockIdx.x * ST_LANES * ST_WARPS;
    const int p = p0_row + row;
    const bool row_ok = p < head_dim;
    const int g = h / (heads / groups);
    const int inner = heads * head_dim;
    const float dh = dskip[h];
    float* st = state + (((size_t)seq_slot[s] * heads + h) * head_dim + (row_ok ? p : 0))
                            * (size_t)d_state;

    float S[ST_MAX];
    state_load(S, st, 1, part, d_state, row_ok);
    for (int bi = 0; bi < seq_nblk[s]; ++bi) {
        const int blk = seq_blk0[s] + bi;
        const int r0 = blk_row[blk], L = blk_len[blk];
        __syncthreads();  // the previous block's readers of as / cf / xs are done
        if (tid < L) {
            as[tid] = acum[(size_t)(r0 + tid) * heads + h];
            ds[tid] = dts[(size_t)(r0 + tid) * heads + h];
        }
        // y = e^A (C . S) + D x; each row's coefficient e^(A_L - A_i) dt_i x_i for the update.
        for (int p0 = 0; p0 < L; p0 += GC_PIECE) {
            const int n = min(GC_PIECE, L - p0);
            const size_t row0 = (size_t)(r0 + p0);
            __syncthreads();
            gc_stage(xbc + row0 * xbc_stride + inner + (size_t)(groups + g) * d_state, xbc_stride,
                     nullptr, 0, n, d_state, xs, xs);
            gc_stage_cols(xbc + row0 * xbc_stride + (size_t)h * head_dim, xbc_stride, n, p0_row,
                          head_dim, xp_s);
            __syncthreads();
            // Rows past n are zeros: computed (independent rows interleave), never written.
#pragma unroll 4
            for (int r = 0; r < GC_PIECE; ++r) {
                float acc = 0.0f;
#pragma unroll
                for (int e = 0; e < ST_MAX; ++e) {
                    const int c = part + ST_PARTS * e;
                    if (c < d_state) {
                        acc = fmaf(xs[r][c], S[e], acc);
                    }
                }
                acc = state_part_sum(acc);
                if (part == 0 && r < n) {
                    const float xp = xp_s[r][row];
                    if (row_ok) {
                        y[(row0 + r) * inner + (size_t)h * head_dim + p] =
                            fmaf(dh, xp, expf(as[p0 + r]) * acc);
                    }
                    cf[p0 + r][row] = expf(as[L - 1] - as[p0 + r]) * ds[p0 + r] * xp;
                }
            }
        }
        gc_state_update(S, xbc + (size_t)r0 * xbc_stride + inner + (size_t)g * d_state,
                        xbc_stride, L, d_state, part, row, cf, xs, expf(as[L - 1]));
    }
    state_store(S, st, 1, part, d_state, row_ok);
}

// y += sum_(j <= i) (C_i . B_j) e^(A_i - A_j) dt_j x_j within each block. A block of threads
// takes `hpc` of a group's heads (blockIdx.z picks which), which share C . B.
extern "C" __global__ void mamba2_chunk_out_f32(
    const float* __restrict__ xbc, int xbc_stride,
    const float* __restrict__ dts,
    const float* __restrict__ acum,
    const int* __restrict__ blk_row,
    const int* __restrict__ blk_len,
    float* __restrict__ y,
    int heads, int head_dim, int d_state, int groups, int hpc)
{
    const int g = blockIdx.y;
    const int h0 = g * (heads / groups) + blockIdx.z * hpc;
    const int nh = min(hpc, (g + 1) * (heads / groups) - h0);
    const int inner = heads * head_dim;
    const int r0 = blk_row[blockIdx.x];
    const int L = blk_len[blockIdx.x];
    const float* x0 = xbc + (size_t)r0 * xbc_stride;
    const float* b0 = x0 + inner + (size_t)g * d_state;
    const size_t row_h = (size_t)r0 * heads + h0;
    // (C_i . B_j) dt_j x_j
    gc_intra(b0 + (size_t)groups * d_state, b0, xbc_stride, L, d_state, acum + row_h,
             dts + row_h, heads, nh, x0 + (size_t)h0 * head_dim, xbc_stride,
             y + (size_t)r0 * inner + (size_t)h0 * head_dim, inner, head_dim);
}
