// The state passes of chunked.cu on the tensor cores, for bf16 models: the same blocks,
// scratch, inputs and outputs as gdn_chunk_state_f32 and mamba2_chunk_state_f32, with each
// block's products done by mma_bf16_16816 (bf16 operands, f32 accumulation) instead of f32
// FMAs on the CUDA cores. The state stays f32, in the mma accumulators, across all of a
// request's blocks; only the copy of it that a block multiplies with, and the block's rows,
// are rounded to bf16 (as FLA's chunk_gated_delta_rule_fwd_h does). The host picks these
// where the weights are bf16, the key dim (d_state) is a multiple of 16 up to CM_MAXK, and
// the GPU is sm_80 or newer (recurrent_chunked.rs).
//
// Both recurrences are, per block of L <= CM_ROWS rows and with the state seen as a matrix
// X [dk, columns]:
//   P = A X for the block's [L, dk] row operands A         (GDN: W and q; Mamba-2: C)
//   X <- decay X + K^T V, K the block's [L, dk] keys, V [L, columns] coefficients
// GDN: X = S [dk, dv], V_i = e^(G_L - G_i) (U_i - (W S)_i). Mamba-2: X = S^T [d_state,
// head_dim], V_i = e^(A_L - A_i) dt_i x_i.
//
// A CTA (CM_THREADS = 4 warps) owns one request, one head and a slab of CM_COLS columns of X.
// Warp w keeps X rows 16 (w + 4 m) .. + 16 (m < 2) in accumulators acc[m][n][4] (n: tiles of
// 8 columns) and computes rows 16 w .. + 16 of each block's products. Fragment layout of an
// accumulator tile at (rows rm, columns 8 n): [0], [1] = (rm + g, 8 n + 2 q + {0, 1}), [2],
// [3] = the same at row rm + g + 8 (g = lane / 4, q = lane % 4; common.cuh).
//
// Shared memory holds bf16 pairs as 32-bit words (never as 16-bit values, so the host
// emulator's C++ sees one type): row tiles [CM_ROWS][CM_KW] words (a row's dk values), the
// state tile and V transposed, [CM_COLS][CM_KW] and [CM_COLS][CM_LW] (a column's dk / L
// values), the keys transposed [dk][CM_LW]. The +4-word pads put the 8 rows a fragment load
// reads in different banks.
//
// Launch: grid (ceil(columns / CM_COLS), heads, num_seqs), block (CM_THREADS).

#define CM_ROWS 64     // rows per block: chunked.cu's GC
#define CM_THREADS 128
#define CM_COLS 32     // state columns per CTA
#define CM_MAXK 128    // largest key dim (d_state)
#define CM_KW (CM_MAXK / 2 + 4)  // words per staged row of dk values
#define CM_LW (CM_ROWS / 2 + 4)  // words per staged column of L values
// Words of a tile that holds a row tile, then the keys transposed.
#define CM_OPS_WORDS (CM_ROWS * CM_KW > CM_MAXK * CM_LW ? CM_ROWS * CM_KW : CM_MAXK * CM_LW)

typedef float cm_acc[2][CM_COLS / 8][4];

// The staging loops below issue CM_BATCH items' loads per thread before any of their stores,
// so that the loads' latency overlaps (the compiler would not move a load above a store).
#define CM_BATCH 8

// dst[r][c / 2] = (src_r[c], src_r[c + 1]) as bf16 for r < CM_ROWS, c < d (rows >= L zero).
__device__ void cm_stage_rows(const float* src, long long stride, int L, int d, unsigned* dst) {
    const int pairs = d / 2, items = CM_ROWS * pairs;
    for (int e0 = threadIdx.x; e0 < items; e0 += CM_BATCH * CM_THREADS) {
        float lo[CM_BATCH], hi[CM_BATCH];
#pragma unroll
        for (int b = 0; b < CM_BATCH; ++b) {
            const int e = e0 + b * CM_THREADS, r = e / pairs, c = 2 * (e % pairs);
            const bool ok = e < items && r < L;
            lo[b] = ok ? src[r * stride + c] : 0.0f;
            hi[b] = ok ? src[r * stride + c + 1] : 0.0f;
        }
#pragma unroll
        for (int b = 0; b < CM_BATCH; ++b) {
            const int e = e0 + b * CM_THREADS;
            if (e < items) {
                dst[(e / pairs) * CM_KW + e % pairs] = pack_bf16(lo[b], hi[b]);
            }
        }
    }
}

// dst[c][r / 2] = (src_r[c], src_(r+1)[c]) as bf16 for c < d, r < CM_ROWS (rows >= L zero):
// the keys transposed, the A operand of the update.
__device__ void cm_stage_keys(const float* src, long long stride, int L, int d, unsigned* dst) {
    const int items = (CM_ROWS / 2) * d;
    for (int e0 = threadIdx.x; e0 < items; e0 += CM_BATCH * CM_THREADS) {
        float lo[CM_BATCH], hi[CM_BATCH];
#pragma unroll
        for (int b = 0; b < CM_BATCH; ++b) {
            const int e = e0 + b * CM_THREADS, r = 2 * (e / d), c = e % d;
            lo[b] = e < items && r < L ? src[r * stride + c] : 0.0f;
            hi[b] = e < items && r + 1 < L ? src[(r + 1) * stride + c] : 0.0f;
        }
#pragma unroll
        for (int b = 0; b < CM_BATCH; ++b) {
            const int e = e0 + b * CM_THREADS;
            if (e < items) {
                dst[(e % d) * CM_LW + e / d] = pack_bf16(lo[b], hi[b]);
            }
        }
    }
}

// Writes a fragment pair (rows r and r + 1 of one column, held by lanes g and g ^ 1 of the
// same q) into a transposed tile as one word: lane g even writes column c (its own x0 and its
// partner's), g odd writes column c + 1. `tile` is [columns][words]; r is even for g even.
__device__ __forceinline__ void cm_put_transposed(unsigned* tile, int words, int r, int c,
                                                  float x0, float x1) {
    const int g = (threadIdx.x & 31) >> 2;
    const float other = __shfl_xor_sync(HSX_FULL_MASK, (g & 1) ? x0 : x1, 4);
    if ((g & 1) == 0) {
        tile[c * words + r / 2] = pack_bf16(x0, other);
    } else {
        tile[(c + 1) * words + (r - 1) / 2] = pack_bf16(other, x1);
    }
}

// Zeros rows 16 w .. + 16 of every column of V^T (vt [CM_COLS][CM_LW]): a warp whose rows are
// all past the block's end contributes nothing to the update.
__device__ void cm_zero_rows(unsigned* vt) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int e = lane; e < CM_COLS * 8; e += 32) {
        vt[(e >> 3) * CM_LW + 8 * w + (e & 7)] = 0u;
    }
}

// The state tile: st[c][r / 2] = X[r, r + 1][c] as bf16, the B operand of the products.
__device__ void cm_state_to_shared(cm_acc x, int dk, unsigned* st) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int m = 0; m < 2; ++m) {
        const int rm = 16 * (w + 4 * m);
        if (rm < dk) {
#pragma unroll
            for (int n = 0; n < CM_COLS / 8; ++n) {
                cm_put_transposed(st, CM_KW, rm + g, 8 * n + 2 * q, x[m][n][0], x[m][n][1]);
                cm_put_transposed(st, CM_KW, rm + g + 8, 8 * n + 2 * q, x[m][n][2], x[m][n][3]);
            }
        }
    }
}

// p = rows 16 w .. + 16 of A X (A: a row tile; X: the state tile), over dk.
__device__ void cm_rows_times_state(const unsigned* a, const unsigned* st, int dk,
                                    float p[CM_COLS / 8][4]) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int n = 0; n < CM_COLS / 8; ++n) {
        p[n][0] = p[n][1] = p[n][2] = p[n][3] = 0.0f;
    }
    const unsigned* ar = a + (16 * w + g) * CM_KW + q;
    for (int k = 0; k < dk / 16; ++k) {
        const unsigned af[4] = {ar[8 * k], ar[8 * CM_KW + 8 * k], ar[8 * k + 4],
                                ar[8 * CM_KW + 8 * k + 4]};
#pragma unroll
        for (int n = 0; n < CM_COLS / 8; ++n) {
            const unsigned* b = st + (8 * n + g) * CM_KW + 8 * k + q;
            const unsigned bf[2] = {b[0], b[4]};
            mma_bf16_16816(p[n], af, bf);
        }
    }
}

// X = decay X + K^T V over the block's L rows (keys: kt [dk][CM_LW]; V: vt [CM_COLS][CM_LW]).
__device__ void cm_state_update(cm_acc x, const unsigned* kt, const unsigned* vt, int dk,
                                int L, float decay) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int m = 0; m < 2; ++m) {
#pragma unroll
        for (int n = 0; n < CM_COLS / 8; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                x[m][n][e] *= decay;
            }
        }
    }
    for (int k = 0; k < (L + 15) / 16; ++k) {
#pragma unroll
        for (int m = 0; m < 2; ++m) {
            const int rm = 16 * (w + 4 * m);
            if (rm < dk) {
                const unsigned* ar = kt + (rm + g) * CM_LW + 8 * k + q;
                const unsigned af[4] = {ar[0], ar[8 * CM_LW], ar[4], ar[8 * CM_LW + 4]};
#pragma unroll
                for (int n = 0; n < CM_COLS / 8; ++n) {
                    const unsigned* b = vt + (8 * n + g) * CM_LW + 8 * k + q;
                    const unsigned bf[2] = {b[0], b[4]};
                    mma_bf16_16816(x[m][n], af, bf);
                }
            }
        }
    }
}

// Loads (store == false) or stores the slab's state: X[r][c] at st[r * rs + c * cs] for
// r < dk and columns c0 + c < cols (zeros elsewhere on load).
__device__ void cm_state_io(cm_acc x, float* st, size_t rs, size_t cs, int dk, int c0,
                            int cols, bool store) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int m = 0; m < 2; ++m) {
#pragma unroll
        for (int n = 0; n < CM_COLS / 8; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = 16 * (w + 4 * m) + g + 8 * (e >> 1);
                const int c = c0 + 8 * n + 2 * q + (e & 1);
                const bool ok = r < dk && c < cols;
                float* at = st + (size_t)r * rs + (size_t)c * cs;
                if (store) {
                    if (ok) {
                        *at = x[m][n][e];
                    }
                } else {
                    x[m][n][e] = ok ? *at : 0.0f;
                }
            }
        }
    }
}

// The Gated DeltaNet state pass (gdn_chunk_state_f32's contract).
extern "C" __global__ void gdn_chunk_state_mma(
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
    // W | q, then the keys transposed (2 CM_ROWS CM_KW >= CM_MAXK CM_LW); 48,384 bytes in all.
    __shared__ unsigned ops[2 * CM_ROWS * CM_KW];
    __shared__ unsigned st[CM_COLS * CM_KW];
    __shared__ unsigned vt[CM_COLS * CM_LW];
    __shared__ float gs[CM_ROWS];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gl = lane >> 2, q = lane & 3;
    const int h = blockIdx.y, s = blockIdx.z;
    const int c0 = blockIdx.x * CM_COLS;
    const int kh = h / (nv / nk);
    const size_t wide_v = (size_t)nv * dv, wide_k = (size_t)nv * dk;
    float* state_h = state + ((size_t)seq_slot[s] * nv + h) * (size_t)dk * dv;

    cm_acc x;
    cm_state_io(x, state_h, dv, 1, dk, c0, dv, false);
    for (int bi = 0; bi < seq_nblk[s]; ++bi) {
        const int blk = seq_blk0[s] + bi;
        const int r0 = blk_row[blk], L = blk_len[blk];
        __syncthreads();  // the previous block's readers of ops / gs are done
        if (tid < L) {
            gs[tid] = g[(size_t)(r0 + tid) * nv + h];
        }
        cm_stage_rows(w + (size_t)r0 * wide_k + (size_t)h * dk, wide_k, L, dk, ops);
        cm_stage_rows(qkv + (size_t)r0 * qkv_stride + (size_t)kh * dk, qkv_stride, L, dk,
                      ops + CM_ROWS * CM_KW);
        cm_state_to_shared(x, dk, st);
        __syncthreads();
        // v_new = U - W S and out = e^G (q S) for rows 16 warp .. + 16; V^T for the update.
        if (16 * warp < L) {
            float vp[CM_COLS / 8][4], qs[CM_COLS / 8][4], un[CM_COLS / 8][4];
            const int rows[2] = {16 * warp + gl, 16 * warp + gl + 8};
            // U first, all of it: the stores of v_new below go to the same buffer.
#pragma unroll
            for (int n = 0; n < CM_COLS / 8; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = rows[e >> 1], j = c0 + 8 * n + 2 * q + (e & 1);
                    un[n][e] = r < L && j < dv
                                   ? u[(size_t)(r0 + r) * wide_v + (size_t)h * dv + j]
                                   : 0.0f;
                }
            }
            cm_rows_times_state(ops, st, dk, vp);
            cm_rows_times_state(ops + CM_ROWS * CM_KW, st, dk, qs);
            float e_out[2], e_upd[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int r = min(rows[i], L - 1);
                e_out[i] = expf(gs[r]);
                e_upd[i] = expf(gs[L - 1] - gs[r]);
            }
#pragma unroll
            for (int n = 0; n < CM_COLS / 8; ++n) {
                float vn[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = rows[e >> 1], j = c0 + 8 * n + 2 * q + (e & 1);
                    vn[e] = 0.0f;
                    if (r < L && j < dv) {
                        const size_t at = (size_t)(r0 + r) * wide_v + (size_t)h * dv + j;
                        const float v_new = un[n][e] - vp[n][e];
                        u[at] = v_new;
                        out[at] = e_out[e >> 1] * qs[n][e];
                        vn[e] = e_upd[e >> 1] * v_new;
                    }
                }
                cm_put_transposed(vt, CM_LW, rows[0], 8 * n + 2 * q, vn[0], vn[1]);
                cm_put_transposed(vt, CM_LW, rows[1], 8 * n + 2 * q, vn[2], vn[3]);
            }
        } else {
            cm_zero_rows(vt);
        }
        __syncthreads();  // W and q are read; V^T is complete
        cm_stage_keys(qkv + (size_t)r0 * qkv_stride + (size_t)(nk + kh) * dk, qkv_stride, L,
                      dk, ops);
        __syncthreads();
        cm_state_update(x, ops, vt, dk, L, expf(gs[L - 1]));
    }
    cm_state_io(x, state_h, dv, 1, dk, c0, dv, true);
}

// The Mamba-2 state pass (mamba2_chunk_state_f32's contract), on X = S^T.
extern "C" __global__ void mamba2_chunk_state_mma(
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
    __shared__ unsigned ops[CM_OPS_WORDS];  // C, then B transposed
    __shared__ unsigned st[CM_COLS * CM_KW];
    __shared__ unsigned vt[CM_COLS * CM_LW];
    __shared__ float as[CM_ROWS];
    __shared__ float ds[CM_ROWS];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gl = lane >> 2, q = lane & 3;
    const int h = blockIdx.y, s = blockIdx.z;
    const int c0 = blockIdx.x * CM_COLS;
    const int grp = h / (heads / groups);
    const int inner = heads * head_dim;
    const float dh = dskip[h];
    float* state_h = state + ((size_t)seq_slot[s] * heads + h) * (size_t)head_dim * d_state;

    cm_acc x;
    cm_state_io(x, state_h, 1, d_state, d_state, c0, head_dim, false);
    for (int bi = 0; bi < seq_nblk[s]; ++bi) {
        const int blk = seq_blk0[s] + bi;
        const int r0 = blk_row[blk], L = blk_len[blk];
        const float* row0 = xbc + (size_t)r0 * xbc_stride;
        __syncthreads();  // the previous block's readers of ops / as are done
        if (tid < L) {
            as[tid] = acum[(size_t)(r0 + tid) * heads + h];
            ds[tid] = dts[(size_t)(r0 + tid) * heads + h];
        }
        cm_stage_rows(row0 + inner + (size_t)(groups + grp) * d_state, xbc_stride, L, d_state,
                      ops);
        cm_state_to_shared(x, d_state, st);
        __syncthreads();
        // y = e^A (C S^T) + D x for rows 16 warp .. + 16; V^T for the update.
        if (16 * warp < L) {
            float cs[CM_COLS / 8][4], xs[CM_COLS / 8][4];
            const int rows[2] = {16 * warp + gl, 16 * warp + gl + 8};
#pragma unroll
            for (int n = 0; n < CM_COLS / 8; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = rows[e >> 1], p = c0 + 8 * n + 2 * q + (e & 1);
                    xs[n][e] = r < L && p < head_dim
                                   ? row0[(size_t)r * xbc_stride + (size_t)h * head_dim + p]
                                   : 0.0f;
                }
            }
            cm_rows_times_state(ops, st, d_state, cs);
            float e_out[2], e_upd[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int r = min(rows[i], L - 1);
                e_out[i] = expf(as[r]);
                e_upd[i] = expf(as[L - 1] - as[r]) * ds[r];
            }
#pragma unroll
            for (int n = 0; n < CM_COLS / 8; ++n) {
                float cf[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = rows[e >> 1], p = c0 + 8 * n + 2 * q + (e & 1);
                    cf[e] = 0.0f;
                    if (r < L && p < head_dim) {
                        y[(size_t)(r0 + r) * inner + (size_t)h * head_dim + p] =
                            fmaf(dh, xs[n][e], e_out[e >> 1] * cs[n][e]);
                        cf[e] = e_upd[e >> 1] * xs[n][e];
                    }
                }
                cm_put_transposed(vt, CM_LW, rows[0], 8 * n + 2 * q, cf[0], cf[1]);
                cm_put_transposed(vt, CM_LW, rows[1], 8 * n + 2 * q, cf[2], cf[3]);
            }
        } else {
            cm_zero_rows(vt);
        }
        __syncthreads();  // C is read; V^T is complete
        cm_stage_keys(row0 + inner + (size_t)grp * d_state, xbc_stride, L, d_state, ops);
        __syncthreads();
        cm_state_update(x, ops, vt, d_state, L, expf(as[L - 1]));
    }
    cm_state_io(x, state_h, 1, d_state, d_state, c0, head_dim, true);
}
