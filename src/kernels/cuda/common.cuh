// Prepended to every .cu source of hsx (src/kernels/cuda/nvrtc.rs): NVRTC runs without the
// CUDA toolkit headers, so the half-precision types are plain 16-bit structs here, converted by
// hand (bf16: round-to-nearest-even on the bits; f16: the PTX cvt instructions).
//
// Conventions of every kernel: device pointers arrive as plain pointers (the Rust side passes
// CUdeviceptr values), sizes as int / long long, element offsets are computed in size_t or
// long long so that buffers larger than 2^31 elements index correctly.

struct bf16_t { unsigned short bits; };
struct f16_t { unsigned short bits; };

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16_t x) {
    return __uint_as_float(((unsigned int)x.bits) << 16);
}
__device__ __forceinline__ float to_f32(f16_t x) {
#ifdef HSX_EMU  // the host emulator (emu/cuda_emu.h): the same conversion in C++
    return hsx_emu::f16_to_f32(x.bits);
#else
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
    return f;
#endif
}

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16_t from_f32<bf16_t>(float x) {
    unsigned int u = __float_as_uint(x);
    bf16_t r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        // NaN: keep the sign and make sure a mantissa bit survives the truncation.
        r.bits = (unsigned short)((u >> 16) | 0x40u);
        return r;
    }
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
    r.bits = (unsigned short)(u >> 16);
    return r;
}
template <> __device__ __forceinline__ f16_t from_f32<f16_t>(float x) {
#ifdef HSX_EMU
    const unsigned short h = hsx_emu::f32_to_f16(x);
#else
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
#endif
    f16_t r;
    r.bits = h;
    return r;
}

#define HSX_FULL_MASK 0xffffffffu

// Lane layout of the register-resident recurrent states (gated_delta.cu, mamba2.cu,
// chunked.cu): a warp owns ST_LANES state columns (Gated DeltaNet value columns, Mamba-2
// rows); the ST_PARTS lanes of one column (lanes col + ST_LANES * part) each keep its entries
// part, part + ST_PARTS, ... (at most ST_MAX of them: state dims <= ST_PARTS * ST_MAX = 256,
// limits::MAX_STATE_DIM); a block is ST_WARPS warps.
#define ST_PARTS 8
#define ST_LANES 4
#define ST_MAX 32
#define ST_WARPS 4

// Loads (stores) a lane's entries part, part + ST_PARTS, ... (those below d) of one state
// column whose entry i is at col[i * step]; where `ok` is false, zeros (nothing is stored).
__device__ __forceinline__ void state_load(float s[ST_MAX], const float* col, size_t step,
                                           int part, int d, bool ok) {
#pragma unroll
    for (int r = 0; r < ST_MAX; ++r) {
        const int i = part + ST_PARTS * r;
        s[r] = (ok && i < d) ? col[(size_t)i * step] : 0.0f;
    }
}
__device__ __forceinline__ void state_store(const float s[ST_MAX], float* col, size_t step,
                                            int part, int d, bool ok) {
#pragma unroll
    for (int r = 0; r < ST_MAX; ++r) {
        const int i = part + ST_PARTS * r;
        if (ok && i < d) {
            col[(size_t)i * step] = s[r];
        }
    }
}

// Sum over the ST_PARTS lanes of one column (xor 4, 8, 16): a fixed order.
__device__ __forceinline__ float state_part_sum(float v) {
    v = __fadd_rn(v, __shfl_xor_sync(HSX_FULL_MASK, v, 4));
    v = __fadd_rn(v, __shfl_xor_sync(HSX_FULL_MASK, v, 8));
    v = __fadd_rn(v, __shfl_xor_sync(HSX_FULL_MASK, v, 16));
    return v;
}
#define HSX_INF __int_as_float(0x7f800000)

// RoPE's cos and sin of pair i at position `pos` into cs[i], sn[i], as the CPU's
// Rope::cos_sin: the angle f32(inv_freq * f32(pos)), cos / sin in f64 rounded to f32, times
// `scale`.
__device__ __forceinline__ void rope_cos_sin(const float* inv_freq, int i, float pos, float scale,
                                             float* cs, float* sn) {
    const float angle = __fmul_rn(inv_freq[i], pos);
    cs[i] = __fmul_rn((float)cos((double)angle), scale);
    sn[i] = __fmul_rn((float)sin((double)angle), scale);
}

// Grid-stride loop: `idx` (long long) visits 0..total once across the whole grid, whatever
// its size.
#define HSX_GRID_STRIDE(idx, total)                                                    \
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < (total); \
         idx += (long long)gridDim.x * blockDim.x)

// x * sigmoid(s) * u: the SwiGLU's (s = x) and the GeGLU's gate (src/kernels/cpu/exp.rs's
// sigmoid_gate, with expf).
__device__ __forceinline__ float sigmoid_gate(float x, float s, float u) {
    return __fmul_rn(__fdiv_rn(x, __fadd_rn(1.0f, expf(-s))), u);
}

// torch's gelu(x, approximate="tanh") * u: 0.5 * x * (1 + tanh(z)), z = sqrt(2/pi) * (x +
// 0.044715 * x^3), computed as the same function x * sigmoid(2z) (no cancellation in 1 + tanh
// below zero), in the CPU's order (src/kernels/cpu/exp.rs::gelu_tanh_times); expf(-2z) may
// overflow to inf, giving -0 as it should.
__device__ __forceinline__ float gelu_tanh_times(float g, float u) {
    const float two_beta = 1.5957691216057308f;  // 2 * sqrt(2 / pi)
    const float cube = __fmul_rn(__fmul_rn(g, g), g);
    const float s = __fmul_rn(two_beta, __fadd_rn(g, __fmul_rn(0.044715f, cube)));
    return sigmoid_gate(g, s, u);
}

// Butterfly reductions: every lane ends with the same value (a + b == b + a bit for bit), and
// the order of additions is fixed by the lane layout, never by the data or the batch.
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(HSX_FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ double warp_sum_f64(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(HSX_FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(HSX_FULL_MASK, v, o));
    return v;
}

// The softmax of a warp's n logits l[lane + 32 r] (r < N) into p (0 past n): the max and the
// sum over the warp by butterfly shuffles, then exp(l - max) / sum (the MoE routers').
template <int N>
__device__ __forceinline__ void warp_softmax(const float* l, int n, int lane, float (&p)[N]) {
    float mx = -HSX_INF;
#pragma unroll
    for (int r = 0; r < N; ++r) {
        const int e = lane + 32 * r;
        p[r] = e < n ? l[e] : -HSX_INF;
        mx = fmaxf(mx, p[r]);
    }
    mx = warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int r = 0; r < N; ++r) {
        const int e = lane + 32 * r;
        p[r] = e < n ? expf(p[r] - mx) : 0.0f;
        sum = __fadd_rn(sum, p[r]);
    }
    for (int o = 16; o > 0; o >>= 1) sum = __fadd_rn(sum, __shfl_xor_sync(HSX_FULL_MASK, sum, o));
#pragma unroll
    for (int r = 0; r < N; ++r) p[r] = p[r] / sum;
}

// Warp arg-max of (value v, index i) carrying a payload p: every lane ends with the largest v,
// the lower i among equal ones (the MoE routers' tie rule on every device), and its payload.
// A lane with i == 0x7fffffff holds nothing and never wins.
__device__ __forceinline__ void warp_argmax(float& v, int& i, float& p) {
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(HSX_FULL_MASK, v, o);
        const float op = __shfl_xor_sync(HSX_FULL_MASK, p, o);
        const int oi = __shfl_xor_sync(HSX_FULL_MASK, i, o);
        if (oi != 0x7fffffff && (i == 0x7fffffff || ov > v || (ov == v && oi < i))) {
            v = ov;
            p = op;
            i = oi;
        }
    }
}

// Sum of one double per thread over the whole block (blockDim.x a multiple of 32, <= 1024), in
// a fixed order; every thread gets the result. `scratch` holds 32 doubles of shared memory.
__device__ __forceinline__ double block_sum_f64(double v, double* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int warps = blockDim.x >> 5;
    v = warp_sum_f64(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    double t = 0.0;
    for (int w = 0; w < warps; ++w) t += scratch[w];
    return t;
}

// d += A (16 x 16 bf16, row-major) * B (16 x 8 bf16, column-major), f32 accumulation, by one
// warp: PTX `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32` (sm_80+). Fragments, as
// the PTX ISA lays them out, with g = lane / 4 and q = lane % 4; a 32-bit register holds two
// bf16, the lower column (A) or row (B) in its low half:
//   a[0]: A[g][2q, 2q+1]   a[1]: A[g+8][2q, 2q+1]   a[2]: A[g][2q+8, 2q+9]   a[3]: A[g+8][2q+8, 2q+9]
//   b[0]: B[2q, 2q+1][g]   b[1]: B[2q+8, 2q+9][g]
//   d[0], d[1]: D[g][2q, 2q+1]   d[2], d[3]: D[g+8][2q, 2q+1]
// The emulator (and a GPU before sm_80, where hsx never selects a caller) gathers the operands
// from the other lanes with shuffles and accumulates in k order with fmaf (the tensor core's
// summation order differs: results agree to f32 rounding). Blocks must be one-dimensional.
__device__ __forceinline__ float bf16_lo(unsigned v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(unsigned v) { return __uint_as_float(v & 0xffff0000u); }
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    return (unsigned)from_f32<bf16_t>(lo).bits | ((unsigned)from_f32<bf16_t>(hi).bits << 16);
}
__device__ __forceinline__ void mma_bf16_16816(float d[4], const unsigned a[4],
                                               const unsigned b[2]) {
#if defined(HSX_EMU) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800)
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    for (int k = 0; k < 16; ++k) {
        const int hi = k >> 3, src = (k & 7) >> 1;
        const unsigned a0 = __shfl_sync(HSX_FULL_MASK, a[2 * hi], g * 4 + src);
        const unsigned a1 = __shfl_sync(HSX_FULL_MASK, a[2 * hi + 1], g * 4 + src);
        const unsigned b0 = __shfl_sync(HSX_FULL_MASK, b[hi], (2 * q) * 4 + src);
        const unsigned b1 = __shfl_sync(HSX_FULL_MASK, b[hi], (2 * q + 1) * 4 + src);
        const float x0 = (k & 1) ? bf16_hi(a0) : bf16_lo(a0);
        const float x1 = (k & 1) ? bf16_hi(a1) : bf16_lo(a1);
        const float y0 = (k & 1) ? bf16_hi(b0) : bf16_lo(b0);
        const float y1 = (k & 1) ? bf16_hi(b1) : bf16_lo(b1);
        d[0] = fmaf(x0, y0, d[0]);
        d[1] = fmaf(x0, y1, d[1]);
        d[2] = fmaf(x1, y0, d[2]);
        d[3] = fmaf(x1, y1, d[3]);
    }
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// Shared-memory operands for the tensor cores, as the PTX ISA defines them (sm_80+; the
// emulator and a GPU before sm_80, where hsx never selects a caller, do the same by hand).
//
// The shared-window address of a generic pointer to shared memory.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
#ifdef HSX_EMU
    (void)p;
    return 0;
#else
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
#endif
}

// 16 bytes from global `src` to shared `dst` (both 16-byte aligned) without passing through
// registers (`cp.async.cg`, cached in L2 only); zeros instead where `valid` is false (`src` is
// then not read, but must still be a valid address). The copy belongs to the thread's next
// `cp_async_commit` group and is in place once the thread's `cp_async_wait` has let that group
// land; other threads see it after a barrier that follows the wait.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
#if defined(HSX_EMU)
    hsx_emu::async_copy(dst, src, valid ? 16u : 0u, 16u);
#elif __CUDA_ARCH__ < 800
    unsigned* d = reinterpret_cast<unsigned*>(dst);
    const unsigned* s = reinterpret_cast<const unsigned*>(src);
    for (int i = 0; i < 4; ++i) d[i] = valid ? s[i] : 0u;
#else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
                 "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(HSX_EMU)
    hsx_emu::async_commit();
#elif __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most the NEWEST most recently committed groups of this thread are in flight.
template <int NEWEST>
__device__ __forceinline__ void cp_async_wait() {
#if defined(HSX_EMU)
    hsx_emu::async_wait(NEWEST);
#elif __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(NEWEST) : "memory");
#endif
}

// N (2 or 4) 8 x 8 matrices of 16-bit elements from shared memory, by one warp (`ldmatrix`):
// lanes 8i .. 8i + 7 give the addresses of matrix i's 8 rows (16 bytes each, 16-byte aligned)
// in `row`; lane l (g = l / 4, q = l % 4) receives in r[i] matrix i's row g, columns 2q and
// 2q + 1 (the lower in the low half) — or with TRANS its column g, rows 2q and 2q + 1: the B
// fragment of mma_bf16_16816 from a row-major [k][n] tile.
template <int N, bool TRANS>
__device__ __forceinline__ void ldsm(unsigned r[N], const unsigned short* row) {
#if defined(HSX_EMU) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800)
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const unsigned long long mine = (unsigned long long)row;
#pragma unroll
    for (int i = 0; i < N; ++i) {
        if constexpr (TRANS) {
            const unsigned short* r0 =
                (const unsigned short*)__shfl_sync(HSX_FULL_MASK, mine, 8 * i + 2 * q);
            const unsigned short* r1 =
                (const unsigned short*)__shfl_sync(HSX_FULL_MASK, mine, 8 * i + 2 * q + 1);
            r[i] = (unsigned)r0[g] | ((unsigned)r1[g] << 16);
        } else {
            const unsigned short* rg =
                (const unsigned short*)__shfl_sync(HSX_FULL_MASK, mine, 8 * i + g);
            r[i] = (unsigned)rg[2 * q] | ((unsigned)rg[2 * q + 1] << 16);
        }
    }
#else
    const unsigned a = smem_addr(row);
    if constexpr (N == 4 && TRANS) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    } else if constexpr (N == 4) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    } else if constexpr (TRANS) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                     : "=r"(r[0]), "=r"(r[1])
                     : "r"(a));
    } else {
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                     : "=r"(r[0]), "=r"(r[1])
                     : "r"(a));
    }
#endif
}
