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
