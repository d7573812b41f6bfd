//! The f32 vectors of the SIMD attention task: a ymm (AVX2 + FMA, 8 query rows) and a zmm
//! (AVX-512F, 16 rows), each operation one instruction. The methods are `#[inline(always)]`
//! and carry no target features: they are inlined into `task_avx2` / `task_avx512`, whose
//! features reach the intrinsics (the disassembly of those two has no call left).

use std::arch::x86_64::*;

/// One vector of f32 lanes (query rows). Its methods are inlined into the entry points, whose
/// target features the intrinsics need.
pub(super) trait Vector: Copy {
    /// Lanes.
    const W: usize;
    /// The lanes' key bounds (i32).
    type Bound: Copy;
    /// The lanes whose row sees a key.
    type Live: Copy;
    unsafe fn zero() -> Self;
    unsafe fn set(x: f32) -> Self;
    unsafe fn load(p: *const f32) -> Self;
    unsafe fn store(self, p: *mut f32);
    /// `*p` in every lane.
    unsafe fn splat(p: *const f32) -> Self;
    /// `a · b + c`, one rounding.
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self;
    unsafe fn mul(self, b: Self) -> Self;
    unsafe fn bound(p: *const u32) -> Self::Bound;
    /// Lanes with `start <= j < end`.
    unsafe fn live(start: Self::Bound, end: Self::Bound, j: usize) -> Self::Live;
    /// `new` in the live lanes, `old` in the others.
    unsafe fn select(live: Self::Live, new: Self, old: Self) -> Self;
}

/// 8 lanes (AVX2 + FMA).
#[derive(Clone, Copy)]
pub(super) struct Ymm(__m256);

// SAFETY (every method): the caller's target features include AVX2 and FMA; pointers are
// valid for the lanes read or written.
impl Vector for Ymm {
    const W: usize = 8;
    type Bound = __m256i;
    type Live = __m256;
    #[inline(always)]
    unsafe fn zero() -> Self {
        Self(unsafe { _mm256_setzero_ps() })
    }
    #[inline(always)]
    unsafe fn set(x: f32) -> Self {
        Self(unsafe { _mm256_set1_ps(x) })
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        Self(unsafe { _mm256_loadu_ps(p) })
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        unsafe { _mm256_storeu_ps(p, self.0) }
    }
    #[inline(always)]
    unsafe fn splat(p: *const f32) -> Self {
        Self(unsafe { _mm256_broadcast_ss(&*p) })
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        Self(unsafe { _mm256_fmadd_ps(a.0, b.0, c.0) })
    }
    #[inline(always)]
    unsafe fn mul(self, b: Self) -> Self {
        Self(unsafe { _mm256_mul_ps(self.0, b.0) })
    }
    #[inline(always)]
    unsafe fn bound(p: *const u32) -> __m256i {
        unsafe { _mm256_loadu_si256(p.cast()) }
    }
    #[inline(always)]
    unsafe fn live(start: __m256i, end: __m256i, j: usize) -> __m256 {
        unsafe {
            let j = _mm256_set1_epi32(j as i32);
            let before = _mm256_cmpgt_epi32(start, j);
            _mm256_castsi256_ps(_mm256_andnot_si256(before, _mm256_cmpgt_epi32(end, j)))
        }
    }
    #[inline(always)]
    unsafe fn select(live: __m256, new: Self, old: Self) -> Self {
        Self(unsafe { _mm256_blendv_ps(old.0, new.0, live) })
    }
}

/// 16 lanes (AVX-512F).
#[derive(Clone, Copy)]
pub(super) struct Zmm(__m512);

// SAFETY (every method): the caller's target features include AVX-512F; pointers are valid
// for the lanes read or written.
impl Vector for Zmm {
    const W: usize = 16;
    type Bound = __m512i;
    type Live = __mmask16;
    #[inline(always)]
    unsafe fn zero() -> Self {
        Self(unsafe { _mm512_setzero_ps() })
    }
    #[inline(always)]
    unsafe fn set(x: f32) -> Self {
        Self(unsafe { _mm512_set1_ps(x) })
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        Self(unsafe { _mm512_loadu_ps(p) })
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        unsafe { _mm512_storeu_ps(p, self.0) }
    }
    #[inline(always)]
    unsafe fn splat(p: *const f32) -> Self {
        Self(unsafe { _mm512_set1_ps(*p) })
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        Self(unsafe { _mm512_fmadd_ps(a.0, b.0, c.0) })
    }
    #[inline(always)]
    unsafe fn mul(self, b: Self) -> Self {
        Self(unsafe { _mm512_mul_ps(self.0, b.0) })
    }
    #[inline(always)]
    unsafe fn bound(p: *const u32) -> __m512i {
        unsafe { _mm512_loadu_si512(p.cast()) }
    }
    #[inline(always)]
    unsafe fn live(start: __m512i, end: __m512i, j: usize) -> __mmask16 {
        unsafe {
            let j = _mm512_set1_epi32(j as i32);
            _mm512_cmpgt_epi32_mask(end, j) & !_mm512_cmpgt_epi32_mask(start, j)
        }
    }
    #[inline(always)]
    unsafe fn select(live: __mmask16, new: Self, old: Self) -> Self {
        Self(unsafe { _mm512_mask_blend_ps(live, old.0, new.0) })
    }
}
