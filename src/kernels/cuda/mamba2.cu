// Mamba-2 (Nemotron-H) selective scan over a packed varlen batch with the
// [heads, head_dim, d_state] f32 state of each request in its slot, the grouped gated RMSNorm
// (norm_before_gate = False) and the relu^2 MLP activation.
//
// Launch: mamba2_scan_f32 grid (ceil(head_dim / 16), heads, num_seqs), block (128).
//
// Algorithm: TOKEN-SERIAL (the recurrence of kernels::cpu::mamba::mamba2_scan; chunked.cu
// has the chunked SSD form, the default; HSX_CUDA_RECURRENT=serial runs this one).
// Row p of a head's state (its d_state entries) evolves on its own:
//   dt = max(softplus(dt_raw + dt_bias[h]), dt_min);  dA = exp(dt * A),  A = -exp(A_log)
//   S[p, :] = S[p, :] * dA + (dt * x_p) * B_g;   y_p = C_g . S[p, :] + D[h] * x_p
// Each warp owns 4 rows of one (chunk, head) and walks the chunk's tokens in order, the state
// in registers: lane = row_sub + 4 * part; a lane keeps entries part, part + 8, ... of its row
// (d_state <= 256); the dot product ends with a fixed 3-step xor-shuffle tree. Parallel over
// chunks x heads x rows; results do not depend on the batch or the chunking.
//
// Layout (f32, row-major), after conv1d_f32 (with SiLU):
//   xbc    [T, xbc_stride]: x [heads * head_dim] | B [groups * d_state] | C [groups * d_state]
//   dt     [T, dt_stride] (column h; offset pointer into the in_proj output)
//   neg_a, d, dt_bias [heads]
//   state  [slots, heads, head_dim, d_state]
//   y      [T, heads * head_dim]

__device__ __forceinline__ float m2_softplus(float v) {
    return v > 20.0f ? v : log1pf(expf(v));
}

// grid: (ceil(head_dim / (ST_LANES * ST_WARPS)), heads, num_seqs); block: 32 * ST_WARPS.
extern "C" __global__ void mamba2_scan_f32(
    const float* __restrict__ xbc, int xbc_stride,
    const float* __restrict__ dt, int dt_stride,
    const float* __restrict__ neg_a,
    const float* __restrict__ dskip,
    const float* __restrict__ dt_bias,
    float dt_min,
    float* __restrict__ state,
    const int* __restrict__ seq_start,
    const int* __restrict__ seq_len,
    const int* __restrict__ seq_slot,
    float* __restrict__ y,
    int heads, int head_dim, int d_state, int groups)
{
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int row_sub = lane & (ST_LANES - 1);
    const int part = lane / ST_LANES;
    const int h = blockIdx.y;
    const int s = blockIdx.z;
    const int p = (blockIdx.x * ST_WARPS + warp) * ST_LANES + row_sub;
    const bool row_ok = p < head_dim;
    const int g = h / (heads / groups);
    const int inner = heads * head_dim;
    const int r0 = seq_start[s];
    const int len = seq_len[s];
    float* st = state + (((size_t)seq_slot[s] * heads + h) * head_dim + (row_ok ? p : 0))
                            * (size_t)d_state;

    float S[ST_MAX];
    state_load(S, st, 1, part, d_state, row_ok);
    const float na = neg_a[h];
    const float bias = dt_bias[h];
    const float dh = dskip[h];
    for (int local = 0; local < len; ++local) {
        const size_t row = (size_t)(r0 + local);
        const float* xr = xbc + row * xbc_stride;
        const float* bm = xr + inner + (size_t)g * d_state;
        const float* cm = xr + inner + (size_t)(groups + g) * d_state;
        const float d = fmaxf(m2_softplus(__fadd_rn(dt[row * dt_stride + h], bias)), dt_min);
        const float da = expf(__fmul_rn(d, na));
        const float xp = row_ok ? xr[(size_t)h * head_dim + p] : 0.0f;
        const float xd = __fmul_rn(xp, d);
        float acc = 0.0f;
#pragma unroll
        for (int r = 0; r < ST_MAX; ++r) {
            const int c = part + ST_PARTS * r;
            if (c < d_state) {
                S[r] = __fadd_rn(__fmul_rn(S[r], da), __fmul_rn(xd, bm[c]));
                acc = __fadd_rn(acc, __fmul_rn(cm[c], S[r]));
            }
        }
        acc = state_part_sum(acc);
        if (row_ok && part == 0) {
            y[row * (size_t)inner + (size_t)h * head_dim + p] =
                __fadd_rn(acc, __fmul_rn(dh, xp));
        }
    }
    state_store(S, st, 1, part, d_state, row_ok);
}

// Mamba-2's output meeting its gate (kernels::cpu::recurrent's three forms), by `mode`:
//   0 (Nemotron-H, Bamba, Granite 4.0, Falcon-H1R): h = y * silu(z); out = w * (h * r) over
//     groups of group_size channels, r = f32(1 / sqrt(f32(mean(h^2)) + eps));
//   1 (Falcon-H1 with mamba_norm_before_gate): out = (w * (y * r)) * silu(z), r of y;
//   2 (Falcon-H1 without mamba_rms_norm): out = y * silu(z) (w not read).
// The mean of squares is accumulated in f64 (as the CPU). y [T, inner] f32 (not modified),
// z [T, z_stride], out [T, inner] in the out_proj GEMM's input dtype. Launch: grid
// (ceil(T * groups / 4)), block (128): one warp per (token, group).
template <typename OUT>
__device__ void mamba2_gated_norm_t(const float* y, const float* z, int z_stride, const float* w,
                                    OUT* out, int num_tokens, int inner, int group_size,
                                    double eps, int mode) {
    const int lane = threadIdx.x & 31;
    const int ngroups = inner / group_size;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (warp >= (long long)num_tokens * ngroups) {
        return;
    }
    const int t = (int)(warp / ngroups);
    const int grp = (int)(warp - (long long)t * ngroups);
    const size_t off = (size_t)t * inner + (size_t)grp * group_size;
    const float* yr = y + off;
    const float* zr = z + (size_t)t * z_stride + (size_t)grp * group_size;
    if (mode == 2) {
        for (int i = lane; i < group_size; i += 32) {
            const float zi = zr[i];
            out[off + i] = from_f32<OUT>(__fmul_rn(yr[i], zi / (1.0f + expf(-zi))));
        }
        return;
    }
    const float* wr = w + (size_t)grp * group_size;
    double ss = 0.0;
    for (int i = lane; i < group_size; i += 32) {
        const float zi = zr[i];
        const double hv = mode == 0 ? (double)__fmul_rn(yr[i], zi / (1.0f + expf(-zi)))
                                    : (double)yr[i];
        ss += hv * hv;
    }
    ss = warp_sum_f64(ss);
    const float var = (float)(ss / (double)group_size);
    const float r = (float)(1.0 / sqrt((double)var + eps));
    for (int i = lane; i < group_size; i += 32) {
        const float zi = zr[i];
        const float gate = zi / (1.0f + expf(-zi));
        const float v = mode == 0 ? __fmul_rn(wr[i], __fmul_rn(__fmul_rn(yr[i], gate), r))
                                  : __fmul_rn(__fmul_rn(wr[i], __fmul_rn(yr[i], r)), gate);
        out[off + i] = from_f32<OUT>(v);
    }
}
#define HSX_MAMBA2_GATE(NAME, OUT)                                                             \
    extern "C" __global__ void NAME(const float* y, const float* z, int z_stride, const float* w, \
                                    OUT* out, int num_tokens, int inner, int group_size,          \
                                    double eps, int mode) {                                       \
        mamba2_gated_norm_t<OUT>(y, z, z_stride, w, out, num_tokens, inner, group_size, eps,     \
                                 mode);                                                           \
    }
HSX_MAMBA2_GATE(mamba2_gated_norm_f32, float)
HSX_MAMBA2_GATE(mamba2_gated_norm_bf16, bf16_t)
HSX_MAMBA2_GATE(mamba2_gated_norm_f16, f16_t)

// Nemotron-H MLP activation: out = relu(x)^2 (x f32 from the up GEMM, out in the down GEMM's
// input dtype). Launch: grid (ceil(n / 256)), block (256).
template <typename OUT>
__device__ void relu2_t(const float* x, OUT* out, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float r = fmaxf(x[i], 0.0f);
        out[i] = from_f32<OUT>(__fmul_rn(r, r));
    }
}
extern "C" __global__ void relu2_f32(const float* x, float* out, long long n) {
    relu2_t<float>(x, out, n);
}
extern "C" __global__ void relu2_bf16(const float* x, bf16_t* out, long long n) {
    relu2_t<bf16_t>(x, out, n);
}
extern "C" __global__ void relu2_f16(const float* x, f16_t* out, long long n) {
    relu2_t<f16_t>(x, out, n);
}

// Apertus' MLP activation, xIELU (and src/kernels/device_types.rs `Xielu::apply`):
// ap·x·x + beta·x where x > 0, else (expm1(min(x, eps)) - x)·an + beta·x, each product rounded
// (no contraction into fma). Launch: grid (ceil(n / 256)), block (256).
template <typename OUT>
__device__ void xielu_t(const float* x, OUT* out, long long n, float ap, float an, float beta,
                        float eps) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float v = x[i];
        const float lin = __fmul_rn(beta, v);
        const float y = v > 0.0f ? __fadd_rn(__fmul_rn(__fmul_rn(ap, v), v), lin)
                                 : __fadd_rn(__fmul_rn(__fsub_rn(expm1f(fminf(v, eps)), v), an), lin);
        out[i] = from_f32<OUT>(y);
    }
}
extern "C" __global__ void xielu_f32(const float* x, float* out, long long n, float ap, float an,
                                     float beta, float eps) {
    xielu_t<float>(x, out, n, ap, an, beta, eps);
}
extern "C" __global__ void xielu_bf16(const float* x, bf16_t* out, long long n, float ap,
                                      float an, float beta, float eps) {
    xielu_t<bf16_t>(x, out, n, ap, an, beta, eps);
}
extern "C" __global__ void xielu_f16(const float* x, f16_t* out, long long n, float ap, float an,
                                     float beta, float eps) {
    xielu_t<f16_t>(x, out, n, ap, an, beta, eps);
}

// Mamba-1 (Mamba, Falcon-Mamba) selective scan, token-serial (kernels::cpu::mamba1): every
// state entry has its own decay.
//   dt = softplus(dt_raw[c] + dt_bias[c]);  S[c, n] = exp(dt * A[c, n]) * S[c, n] + (dt * B[n]) * x_c
//   y_c = (S[c, :] . C) + D[c] * x_c
// The warps and lanes of mamba2_scan_f32 with a channel in place of a head's row: lane
// row_sub + 4 * part keeps entries part, part + 8, ... of its channel's state and of A.
// Launch: grid (ceil(inner / 16), 1, num_seqs), block (128).
//   x, dt  [T, inner] f32 (the conv output, dt_proj's output without its bias)
//   bc     [T, bc_stride]: B [d_state] | C [d_state] (offset pointer)
//   neg_a  [inner, d_state]; dskip, dt_bias [inner]; bc_w [2 * d_state]: B's and C's weights
//          (Jamba's norm weights, ones elsewhere), times B and C before use
//   state  [slots, inner, d_state]; y [T, inner]
extern "C" __global__ void mamba1_scan_f32(
    const float* __restrict__ x,
    const float* __restrict__ dt,
    const float* __restrict__ bc, int bc_stride,
    const float* __restrict__ neg_a,
    const float* __restrict__ dskip,
    const float* __restrict__ dt_bias,
    const float* __restrict__ bc_w,
    float* __restrict__ state,
    const int* __restrict__ seq_start,
    const int* __restrict__ seq_len,
    const int* __restrict__ seq_slot,
    float* __restrict__ y,
    int inner, int d_state)
{
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int row_sub = lane & (ST_LANES - 1);
    const int part = lane / ST_LANES;
    const int s = blockIdx.z;
    const int c = (blockIdx.x * ST_WARPS + warp) * ST_LANES + row_sub;
    const bool ok = c < inner;
    const int cc = ok ? c : 0;
    const int r0 = seq_start[s];
    const int len = seq_len[s];
    float* st = state + ((size_t)seq_slot[s] * inner + cc) * (size_t)d_state;

    float S[ST_MAX];
    float A[ST_MAX];
    float BW[ST_MAX];
    float CW[ST_MAX];
    state_load(S, st, 1, part, d_state, ok);
    state_load(A, neg_a + (size_t)cc * d_state, 1, part, d_state, ok);
    state_load(BW, bc_w, 1, part, d_state, true);
    state_load(CW, bc_w + d_state, 1, part, d_state, true);
    const float bias = dt_bias[cc];
    const float dh = dskip[cc];
    for (int local = 0; local < len; ++local) {
        const size_t row = (size_t)(r0 + local);
        const float* bm = bc + row * bc_stride;
        const float* cm = bm + d_state;
        const float xc = x[row * inner + cc];
        const float d = m2_softplus(__fadd_rn(dt[row * inner + cc], bias));
        float acc = 0.0f;
#pragma unroll
        for (int r = 0; r < ST_MAX; ++r) {
            const int k = part + ST_PARTS * r;
            if (k < d_state) {
                const float da = expf(__fmul_rn(d, A[r]));
                const float b = __fmul_rn(BW[r], bm[k]);
                S[r] = __fadd_rn(__fmul_rn(da, S[r]), __fmul_rn(__fmul_rn(d, b), xc));
                acc = __fadd_rn(acc, __fmul_rn(S[r], __fmul_rn(CW[r], cm[k])));
            }
        }
        acc = state_part_sum(acc);
        if (ok && part == 0) {
            y[row * (size_t)inner + c] = __fadd_rn(acc, __fmul_rn(dh, xc));
        }
    }
    state_store(S, st, 1, part, d_state, ok);
}
