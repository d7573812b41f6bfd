// Kernels that exercise the emulator's scheduler (runtime.cpp) itself, for the tests in
// src/kernels/cuda/emu_scheduler_tests.rs: warp shuffles and block barriers whose results are
// known, and each way a launch must fail instead of hanging (undefined behaviour on a GPU).
#include "cuda_emu.h"

namespace {

// out[global thread] = the block's sum of thread indices (warp shuffles, then a barrier) plus
// the block index.
__global__ void warp_then_block_sum(unsigned* out) {
    unsigned v = threadIdx.x;
    for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
    __shared__ unsigned sums[32];
    if ((threadIdx.x & 31) == 0) sums[threadIdx.x >> 5] = v;
    __syncthreads();
    unsigned total = 0;
    for (unsigned w = 0; w < (blockDim.x + 31) / 32; ++w) total += sums[w];
    out[blockIdx.x * blockDim.x + threadIdx.x] = total + blockIdx.x;
}

// The first warp and the rest wait at two different barriers.
__global__ void divergent_barrier(unsigned* out) {
    if (threadIdx.x < 32) {
        __syncthreads();
    } else {
        __syncthreads();
    }
    out[threadIdx.x] = 1;
}

// Thread 0 waits at a barrier the others never reach: they exit after it arrived.
__global__ void barrier_left_by_exits(unsigned* out) {
    if (threadIdx.x == 0) __syncthreads();
    out[threadIdx.x] = 1;
}

// A shuffle over the whole warp where the warp is short of 32 threads.
__global__ void full_mask_on_short_warp(unsigned* out) {
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, threadIdx.x, 1);
}

}  // namespace

// Launches probe `which` (0..4, in the order above) on `grid` blocks of `block` threads,
// writing to `out`: 0 on success, else runtime.cpp's codes (the message: hsx_emu_last_error).
extern "C" int hsx_emu_scheduler_probe(int which, unsigned grid, unsigned block, unsigned* out) {
    const hsx_emu::Launch l{{grid, 1, 1}, {block, 1, 1}, 0};
    void* params[1] = {&out};
    const unsigned sizes[1] = {sizeof(out)};
    switch (which) {
        case 0:
            return hsx_emu::run(&l, params, 1, sizes, &warp_then_block_sum);
        case 1:
            return hsx_emu::run(&l, params, 1, sizes, &divergent_barrier);
        case 2:
            return hsx_emu::run(&l, params, 1, sizes, &barrier_left_by_exits);
        default:
            return hsx_emu::run(&l, params, 1, sizes, &full_mask_on_short_warp);
    }
}
