// The CUDA built-ins hsx's kernels use, for the host (cargo feature `cuda-emu`, DESIGN.md §5).
// build.rs compiles every src/kernels/cuda/*.cu with this header and common.cuh, as NVRTC
// does, with g++ -ffp-contract=off (so __fmul_rn & co. are single IEEE operations, never fused).
//
// A launch runs its blocks one at a time on the calling thread; the lanes of a block are fibers
// (runtime.cpp) that switch only at __syncthreads, warp shuffles and votes: a barrier is a
// rendezvous of every lane of the block (or warp), and a lane reaching one that cannot complete
// (divergence, a lane that has exited) fails the launch with a message instead of hanging.
#pragma once

#include <math.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

namespace hsx_emu {

struct uint3 {
    unsigned x, y, z;
};

// What a trampoline receives from the Rust side (the cuLaunchKernel configuration).
struct Launch {
    unsigned grid[3];
    unsigned block[3];
    unsigned shared_bytes;
};

struct Lane {
    uint3 tid;
    int lin;  // linear thread index in the block
};
struct BlockIds {
    uint3 bid, bdim, gdim;
};

extern thread_local Lane* tl_lane;
extern thread_local BlockIds* tl_ids;

// Runs `body(arg)` for every lane of every block of `l`. 0 on success; else a message is
// left for `hsx_emu_last_error`.
int launch(const Launch* l, void (*body)(void*), void* arg);
// Fails the running launch with `msg` (never returns to the lane).
[[noreturn]] void fail(const char* msg);
void fail_args(int want, int got);

void sync_block(const char* site);
int sync_block_or(int pred, const char* site);
uint64_t warp_exchange(unsigned mask, uint64_t bits, int src_lane, const char* site);
unsigned warp_ballot(unsigned mask, int pred, const char* site);
void* dyn_shared();
// cp.async (sm_80): the copy is recorded at issue and lands at the issuing lane's
// `async_wait` for its group; until then its destination holds NaN bits (runtime.cpp).
void async_copy(void* dst, const void* src, unsigned src_bytes, unsigned bytes);
void async_commit();
void async_wait(unsigned newest);

template <typename T>
inline uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
    uint64_t b = 0;
    std::memcpy(&b, &v, sizeof(T));
    return b;
}
template <typename T>
inline T from_bits(uint64_t b) {
    T v;
    std::memcpy(&v, &b, sizeof(T));
    return v;
}

// f16 <-> f32 as the PTX cvt instructions (cvt.rn.f16.f32: round to nearest even).
inline float f16_to_f32(unsigned short h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign;
    } else {
        // subnormal: value man * 2^-24
        float f = (float)man * 5.9604644775390625e-8f;
        std::memcpy(&u, &f, 4);
        u |= sign;
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline unsigned short f32_to_f16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return (unsigned short)(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
    if (abs >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);  // rounds to inf
    if (abs < 0x38800000u) {
        // subnormal or zero in f16: round abs * 2^24 to an integer, ties to even
        float a;
        std::memcpy(&a, &abs, 4);
        const float scaled = a * 16777216.0f;  // exact (power of two)
        return (unsigned short)(sign | (uint32_t)std::nearbyint(scaled));
    }
    const uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
    return (unsigned short)(sign | ((rounded - 0x38000000u) >> 13));
}

template <typename... A, std::size_t... I>
inline void call_with(void (*f)(A...), void** p, std::index_sequence<I...>) {
    f(*static_cast<std::remove_cv_t<A>*>(p[I])...);
}

// The trampoline body: unpacks the cuLaunchKernel parameter array by `f`'s signature.
template <typename... A>
inline int run(const Launch* l, void** params, int nparams, const unsigned* sizes,
               void (*f)(A...)) {
    constexpr int n = (int)sizeof...(A);
    if (nparams != n) {
        fail_args(n, nparams);
        return 1;
    }
    const unsigned want[n > 0 ? n : 1] = {(unsigned)sizeof(std::remove_cv_t<A>)...};
    for (int i = 0; i < n; ++i) {
        if (sizes[i] != want[i]) {
            fail_args(-(i + 1), (int)sizes[i]);
            return 1;
        }
    }
    struct Ctx {
        void (*f)(A...);
        void** p;
    } c{f, params};
    return launch(
        l,
        [](void* x) {
            Ctx* c = static_cast<Ctx*>(x);
            call_with(c->f, c->p, std::index_sequence_for<A...>{});
        },
        &c);
}

}  // namespace hsx_emu

#define HSX_EMU 1
#define HSX_EMU_STR2(x) #x
#define HSX_EMU_STR(x) HSX_EMU_STR2(x)
#define HSX_EMU_SITE __FILE__ ":" HSX_EMU_STR(__LINE__)

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static thread_local
#define threadIdx (hsx_emu::tl_lane->tid)
#define blockIdx (hsx_emu::tl_ids->bid)
#define blockDim (hsx_emu::tl_ids->bdim)
#define gridDim (hsx_emu::tl_ids->gdim)
#define __syncthreads() hsx_emu::sync_block(HSX_EMU_SITE)
#define __syncthreads_or(p) hsx_emu::sync_block_or((p) ? 1 : 0, HSX_EMU_SITE)
#define __shfl_xor_sync(mask, v, m) \
    hsx_emu::shfl_xor(mask, v, m, HSX_EMU_SITE)
#define __shfl_sync(mask, v, src) hsx_emu::shfl_idx(mask, v, src, HSX_EMU_SITE)
#define __ballot_sync(mask, p) hsx_emu::warp_ballot(mask, (p) ? 1 : 0, HSX_EMU_SITE)
#define __any_sync(mask, p) (__ballot_sync(mask, p) != 0u)
#define __all_sync(mask, p) (__ballot_sync(mask, p) == (mask))

namespace hsx_emu {
template <typename T>
inline T shfl_xor(unsigned mask, T v, int lane_mask, const char* site) {
    const int src = (tl_lane->lin & 31) ^ (lane_mask & 31);
    return from_bits<T>(warp_exchange(mask, to_bits(v), src, site));
}
template <typename T>
inline T shfl_idx(unsigned mask, T v, int src, const char* site) {
    return from_bits<T>(warp_exchange(mask, to_bits(v), src & 31, site));
}
}  // namespace hsx_emu

// Arithmetic: single IEEE round-to-nearest operations (the build uses -ffp-contract=off).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline unsigned __float_as_uint(float f) { return hsx_emu::from_bits<unsigned>(hsx_emu::to_bits(f)); }
inline int __float_as_int(float f) { return hsx_emu::from_bits<int>(hsx_emu::to_bits(f)); }
inline float __uint_as_float(unsigned u) { return hsx_emu::from_bits<float>(hsx_emu::to_bits(u)); }
inline float __int_as_float(int i) { return hsx_emu::from_bits<float>(hsx_emu::to_bits(i)); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }

// Atomics: lanes never run at the same time, so plain read-modify-writes are atomic here.
template <typename T>
inline T atomicAdd(T* p, T v) {
    T old = *p;
    *p = old + v;
    return old;
}
template <typename T>
inline T atomicMax(T* p, T v) {
    T old = *p;
    *p = old > v ? old : v;
    return old;
}
