// Captured rows leave the device (capture.rs): row r of x (f32, `hidden` wide) becomes row r of
// `out` in the file dtype, and in the same pass the guard's flags of the values as written
// (an f16 overflow is an infinity in the file, an underflow a zero):
// flags[r * flag_stride] = 1 (a NaN or an infinity) | 2 (a non-zero value).
// Launch: grid (rows), block (256).

template <typename OUT>
__device__ void capture_rows_t(const float* x, OUT* out, int hidden, unsigned int* flags,
                               long long flag_stride) {
    const long long r = blockIdx.x;
    const float* xr = x + r * (long long)hidden;
    OUT* orow = out + r * (long long)hidden;
    int bad = 0, nonzero = 0;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const OUT o = from_f32<OUT>(xr[i]);
        orow[i] = o;
        const float v = to_f32(o);
        bad |= (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u;
        nonzero |= v != 0.0f;
    }
    bad = __syncthreads_or(bad);
    nonzero = __syncthreads_or(nonzero);
    if (threadIdx.x == 0) flags[r * flag_stride] = (bad ? 1u : 0u) | (nonzero ? 2u : 0u);
}
extern "C" __global__ void capture_rows_f32(const float* x, float* out, int hidden,
                                            unsigned int* flags, long long flag_stride) {
    capture_rows_t<float>(x, out, hidden, flags, flag_stride);
}
extern "C" __global__ void capture_rows_bf16(const float* x, bf16_t* out, int hidden,
                                             unsigned int* flags, long long flag_stride) {
    capture_rows_t<bf16_t>(x, out, hidden, flags, flag_stride);
}
extern "C" __global__ void capture_rows_f16(const float* x, f16_t* out, int hidden,
                                            unsigned int* flags, long long flag_stride) {
    capture_rows_t<f16_t>(x, out, hidden, flags, flag_stride);
}

// fp8 files (speculators' hs_connectors layout, src/kernels/fp8.rs): the K slots of a token are
// staged in f32 by capture_rows_f32 (the guard sees the values before quantization), then this
// kernel turns staged row r (slot k at staged[(k * max_tokens + r) * hidden]) into out row r of
// K * hidden + 4 bytes: the float8_e4m3fn codes of value / scale, then the f32 scale
// max(amax / 448, 1e-12) (NaN if any value is NaN), little-endian.
// Launch: grid (rows), block (256).

// f32 -> float8_e4m3fn as torch's .to(torch.float8_e4m3fn): round to nearest even, overflow
// and infinities saturate to +-448, NaN -> 0x7f with its sign (fp8.rs: e4m3fn_from_f32).
__device__ __forceinline__ unsigned char fp8_e4m3fn_from_f32(float f) {
    const unsigned int bits = __float_as_uint(f);
    const unsigned char sign = (unsigned char)((bits >> 24) & 0x80u);
    const unsigned int a = bits & 0x7fffffffu;
    if (a > 0x7f800000u) return (unsigned char)(0x7fu | sign);
    if (a >= 0x43e80000u) return (unsigned char)(0x7eu | sign);  // >= 464: past 448
    unsigned int code;
    if (a < (121u << 23)) {
        // Below 2^-6: adding 2^14 leaves units of 2^-9 in the low bits, rounded by the add.
        const unsigned int denorm = 141u << 23;
        code = __float_as_uint(__uint_as_float(a) + __uint_as_float(denorm)) - denorm;
    } else {
        const unsigned int mant_odd = (a >> 20) & 1u;
        code = (a - (120u << 23) + 0x7ffffu + mant_odd) >> 20;  // rebias 127 -> 7, round
    }
    return (unsigned char)(code | sign);
}

// Max of one non-negative float per thread over the block (blockDim.x a multiple of 32); max is
// exact, so the order does not matter. `scratch` holds 32 floats of shared memory.
__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float m = 0.0f;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) m = fmaxf(m, scratch[w]);
    return m;
}

extern "C" __global__ void capture_quantize_fp8(const float* staged, unsigned char* out,
                                                int layers, int hidden, long long max_tokens) {
    __shared__ float scratch[32];
    const long long r = blockIdx.x;
    float amax = 0.0f;
    int nan = 0;
    for (int k = 0; k < layers; ++k) {
        const float* xr = staged + ((long long)k * max_tokens + r) * hidden;
        for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
            nan |= xr[i] != xr[i];
            amax = fmaxf(amax, fabsf(xr[i]));
        }
    }
    nan = __syncthreads_or(nan);
    amax = block_max(amax, scratch);
    const float scale = nan ? __int_as_float(0x7fc00000) : fmaxf(amax / 448.0f, 1e-12f);
    unsigned char* orow = out + r * ((long long)layers * hidden + 4);
    for (int k = 0; k < layers; ++k) {
        const float* xr = staged + ((long long)k * max_tokens + r) * hidden;
        for (int i = threadIdx.x; i < hidden; i += blockDim.x)
            orow[(long long)k * hidden + i] = fp8_e4m3fn_from_f32(xr[i] / scale);
    }
    if (threadIdx.x == 0) {
        const unsigned int s = __float_as_uint(scale);
        for (int b = 0; b < 4; ++b) orow[(long long)layers * hidden + b] = (unsigned char)(s >> (8 * b));
    }
}
